"""``pate.aggregation.budget_registry``: the ledgers that charge one body of private data are
entered under its fingerprint, and a second ledger for the same data is warned of when votes
are first bound to it (docs/design.md, privacy rule 5)."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest

from analysis.mechanisms import GNMax
from pate.aggregation.budget_registry import REGISTRY_FILE, enter_ledger, ledgers_said, state_dir
from pate.aggregation.label_service import open_label_service
from pate.errors import UserError

SAME, OTHER = "a" * 64, "b" * 64


def _votes(folder: Path, private_fingerprint: str) -> Path:
    folder.mkdir()
    votes = np.random.default_rng(0).multinomial(20, [0.8, 0.1, 0.1], size=30)
    np.savez(folder / "votes.npz", votes=votes, private_fingerprint=np.array(private_fingerprint))
    return folder / "votes.npz"


def _open_and_close(votes: Path, ledger: Path | None = None) -> list[str]:
    """The warnings of opening the label service on ``votes`` (their own ledger by default)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        open_label_service(GNMax(sigma=5.0), epsilon_budget=50.0, delta=1e-5,
                           votes_path=votes, ledger=ledger).close()
    return [str(w.message) for w in caught]


def test_a_second_ledger_for_the_same_private_data_is_warned_of(tmp_path: Path) -> None:
    first, second = _votes(tmp_path / "a", SAME), _votes(tmp_path / "b", SAME)
    assert _open_and_close(first) == []
    shared = _votes(tmp_path / "d", SAME)  # pointed at the first ledger: one budget
    assert _open_and_close(shared, tmp_path / "a" / "ledger.db") == []
    said = _open_and_close(second)
    assert len(said) == 1 and "also charged to 1 other ledger(s)" in said[0]
    assert str(tmp_path / "a" / "ledger.db") in said[0]
    assert _open_and_close(second) == []  # said when the votes are bound, not at every open
    assert _open_and_close(first) == []
    assert _open_and_close(_votes(tmp_path / "c", OTHER)) == []  # other data: no warning
    registry = state_dir() / REGISTRY_FILE
    assert stat.S_IMODE(registry.stat().st_mode) == 0o600
    # a ledger that is gone (its run directory moved, say) is no longer named
    (tmp_path / "a" / "ledger.db").unlink()
    said = _open_and_close(_votes(tmp_path / "e", SAME))
    assert len(said) == 1 and "also charged to 1 other ledger(s)" in said[0]
    assert str(tmp_path / "b" / "ledger.db") in said[0]


def test_ledgers_older_versions_entered_under_the_rows_key_are_warned_of(
        tmp_path: Path) -> None:
    """Votes that carry the rows' key beside the data's (``former_private_fingerprint``) warn of
    the ledgers an older version entered under it."""
    old = _votes(tmp_path / "old", OTHER)  # an older version's run: the rows' key only
    assert _open_and_close(old) == []
    new = tmp_path / "new"
    new.mkdir()
    np.savez(new / "votes.npz", votes=np.load(old)["votes"],
             private_fingerprint=np.array(SAME), former_private_fingerprint=np.array(OTHER))
    said = _open_and_close(new / "votes.npz")
    assert len(said) == 1 and str(tmp_path / "old" / "ledger.db") in said[0]


def test_copies_of_one_data_in_other_formats_meet_under_the_rows_key(tmp_path: Path) -> None:
    """Votes of teachers on the same rows read from other files (an ``.npz``, a folder of
    images: other first keys) carry one ``private_rows_fingerprint``, under which each ledger is
    entered too: the second is warned of; a run whose ledger already has the rows key (its
    own votes again) is not."""
    rows = "c" * 64
    votes = np.random.default_rng(0).multinomial(20, [0.8, 0.1, 0.1], size=30)
    for name, first in (("npz", SAME), ("png", OTHER)):
        (tmp_path / name).mkdir()
        np.savez(tmp_path / name / "votes.npz", votes=votes, private_fingerprint=np.array(first),
                 private_rows_fingerprint=np.array(rows))
    assert _open_and_close(tmp_path / "npz" / "votes.npz") == []
    said = _open_and_close(tmp_path / "png" / "votes.npz")
    assert len(said) == 1 and str(tmp_path / "npz" / "ledger.db") in said[0]
    assert _open_and_close(tmp_path / "npz" / "votes.npz") == []
    # an older run's votes without the rows key, on the same first key: found by that key
    assert _open_and_close(_votes(tmp_path / "old", OTHER)) != []


def test_a_ledger_given_the_rows_key_later_is_not_warned_of_again(tmp_path: Path) -> None:
    """A run of a version before the rows' key, warned of its twin then: its votes written
    again with the key enter it, and nothing new is said."""
    first, twin = _votes(tmp_path / "a", SAME), _votes(tmp_path / "b", SAME)
    assert _open_and_close(first) == [] and len(_open_and_close(twin)) == 1
    np.savez(twin, votes=np.load(twin)["votes"], private_fingerprint=np.array(SAME),
             private_rows_fingerprint=np.array("c" * 64))
    assert _open_and_close(twin) == []


def test_the_registry_folder_is_made_private_and_no_home_is_no_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATE_STATE_DIR", str(tmp_path / "new" / "state"))
    assert enter_ledger(SAME, "sqlite:///x") == ([], True)
    assert stat.S_IMODE(state_dir().stat().st_mode) == 0o700
    assert stat.S_IMODE((state_dir() / REGISTRY_FILE).stat().st_mode) == 0o600
    for name in ("PATE_STATE_DIR", "XDG_STATE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(
        RuntimeError("Could not determine home directory."))))
    assert enter_ledger(SAME, "sqlite:///y") == ([], False)  # nowhere to keep it: no failure


@pytest.mark.filterwarnings(  # votes on the teachers' own rows, on purpose
    "ignore:x. some of its rows are rows the teachers were trained on")
def test_the_python_api_enters_its_ledgers_under_the_teachers_data(tmp_path: Path) -> None:
    """``PrivateLabels(teachers=...)``: the teachers' private data, as a run's votes record it;
    a second ledger for it is warned of, the same one is not."""
    from pate.api import PrivateLabels, Teachers

    rng = np.random.default_rng(0)
    x, y = rng.random((60, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 60)
    teachers = Teachers(3, 3, epochs=1).fit(x, y)
    again = Teachers(3, 3, epochs=1, seed=1).fit(x, y)  # other teachers, the same data
    assert teachers.private_fingerprint_ == again.private_fingerprint_
    assert teachers.private_records_ == 60

    def labels(owner: Teachers, ledger: str) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            PrivateLabels(owner.vote(x), GNMax(sigma=5.0), epsilon_budget=50.0, delta=1e-5,
                          ledger=tmp_path / ledger, teachers=owner).close()
        return [str(w.message) for w in caught if "other ledger" in str(w.message)]

    assert labels(teachers, "one.db") == []
    assert labels(again, "one.db") == []  # one budget: nothing to warn of
    said = labels(again, "two.db")
    assert len(said) == 1 and str(tmp_path / "one.db") in said[0]
    # votes of other teachers would file the ledger under the wrong data, and check delta
    # against the wrong number of records
    other = Teachers(2, 3, epochs=1).fit(x[:30], y[:30])
    for votes in (other.vote(x), np.pad(teachers.vote(x), ((0, 0), (0, 1)))):
        with pytest.raises(UserError, match="votes are not those of these teachers: each row "
                                            "must hold 3 classes' counts of their 3 votes"):
            PrivateLabels(votes, GNMax(sigma=5.0), epsilon_budget=50.0, delta=1e-5,
                          ledger=tmp_path / "three.db", teachers=teachers)
    assert not (tmp_path / "three.db").exists()


def test_the_registry_keeps_the_order_and_survives_a_damaged_or_unwritable_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledgers = [f"postgresql://db/{name}" for name in "xyzw"]  # servers: taken to be there
    assert enter_ledger(SAME, ledgers[0]) == ([], True)
    assert enter_ledger(SAME, ledgers[1]) == (ledgers[:1], True)
    assert enter_ledger(SAME, ledgers[2]) == (ledgers[:2], True)
    assert enter_ledger(SAME, ledgers[0]) == (ledgers[1:3], False)
    assert enter_ledger(OTHER, ledgers[0]) == ([], True)
    (state_dir() / REGISTRY_FILE).write_text("{not json")
    assert enter_ledger(SAME, ledgers[0]) == ([], True)  # it only warns: it starts again
    assert enter_ledger(SAME, ledgers[1]) == (ledgers[:1], True)
    if os.geteuid() != 0:  # root writes anywhere
        state_dir().chmod(0o500)
        try:
            assert enter_ledger(SAME, ledgers[3]) == (ledgers[:2], False)
        finally:
            state_dir().chmod(0o700)
    monkeypatch.delenv("PATE_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "pate"


def test_the_command_line_says_it_in_one_warning_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``pate student train --votes``: the second folder's votes, of the same private data,
    are charged to their own ledger with one ``pate: warning:`` line naming the first; ``pate
    status`` of either names the other's ledger."""
    from pate.cli.main import main

    rng = np.random.default_rng(1)
    votes = rng.multinomial(20, np.full(10, 0.1), size=250)  # the digits pool: 250 rows
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        np.savez(tmp_path / folder / "votes.npz", votes=votes,
                 private_fingerprint=np.array(SAME))
    warned = []
    for folder in ("a", "b"):  # each folder the run directory of its votes
        assert main(["--quiet", "student", "train", "--run", str(tmp_path / folder),
                     "--votes", str(tmp_path / folder / "votes.npz"), "--dataset", "digits",
                     "--method", "supervised", "--mechanism", "gnmax", "--sigma", "4",
                     "--delta", "1e-5", "--budget-epsilon", "50", "--queries", "20",
                     "--epochs", "1"]) == 0
        warned.append([line for line in capsys.readouterr().err.splitlines()
                       if "other ledger(s)" in line])
    assert warned[0] == []
    assert len(warned[1]) == 1 and warned[1][0].startswith("pate: warning: the private data")
    assert str(tmp_path / "a" / "ledger.db") in warned[1][0]
    # pate status of either says the other budget
    for folder, other in (("a", "b"), ("b", "a")):
        assert main(["status", "--run", str(tmp_path / folder)]) == 0
        said = [line for line in capsys.readouterr().out.splitlines() if "other ledger" in line]
        assert len(said) == 1 and str(tmp_path / other / "ledger.db") in said[0], said


def test_a_warning_names_three_ledgers_and_counts_the_rest() -> None:
    """However many runs charged the same data, the warning stays one readable line."""
    urls = [f"sqlite:////runs/r{i}/ledger.db" for i in range(16)]
    said = ledgers_said(urls)
    assert said.startswith("sqlite:////runs/r0/ledger.db, ") and said.endswith(", and 13 more")
    assert ledgers_said(urls[:3]) == ", ".join(urls[:3])


@pytest.mark.filterwarnings(  # small tables repeat rows by chance
    "ignore:.*some of its rows are also rows of the private data")
def test_a_csv_with_text_and_the_apis_arrays_of_it_share_the_rows_key(tmp_path: Path) -> None:
    """A CSV with a text column has its rows as encoded for the ledgers' second key: the arrays
    the Python API is given from ``load_task`` (or a ``TableEncoder`` on the same pool), so a
    Python user of the same data is warned of the command line's ledgers, and the reverse."""
    from pate.api import Teachers
    from pate.data.task import DataFiles, load_task

    rng = np.random.default_rng(3)
    for role, n in (("private", 90), ("public", 40)):
        colour = rng.choice(["red", "blue"], n)
        size = rng.normal(size=n).round(3)
        label = np.where(size > 0, "big", "small")
        (tmp_path / f"{role}.csv").write_text("colour,size,label\n" + "".join(
            f"{c},{s},{lab}\n" for c, s, lab in zip(colour, size, label, strict=True)))
    task = load_task(DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                               label="label", classes=("big", "small")))
    teachers = Teachers(2, 2, epochs=1).fit(task.private_x, task.private_y)
    assert task.private_rows_fingerprint is not None
    assert teachers.private_rows_fingerprint_ == task.private_rows_fingerprint


def test_a_csv_of_numbers_and_the_apis_arrays_of_it_share_the_third_key(tmp_path: Path) -> None:
    """A CSV of numbers keys its ledgers by its cells as read (where its ``.npz`` conversion
    meets it) and, third, by its rows as encoded: the arrays the Python API is given from
    ``load_task``. Its votes carry both, so a Python user of the same data is warned of the
    command line's ledger."""
    from pate.aggregation.vote_pool import VotePool
    from pate.aggregation.votes_ledger import note_ledger
    from pate.api import Teachers
    from pate.cli.main import main
    from pate.data.task import DataFiles, load_task

    rng = np.random.default_rng(5)
    for role, n in (("private", 60), ("public", 30)):
        x = rng.normal(size=(n, 2)).round(3)
        (tmp_path / f"{role}.csv").write_text("a,b,label\n" + "".join(
            f"{a},{b},{int(a > 0)}\n" for a, b in x))
    private, public = str(tmp_path / "private.csv"), str(tmp_path / "public.csv")
    task = load_task(DataFiles(private, public, label="label", classes=("0", "1")))
    teachers = Teachers(2, 2, epochs=1).fit(task.private_x, task.private_y)
    assert task.private_encoded_rows_fingerprint not in (None, task.private_rows_fingerprint)
    assert teachers.private_rows_fingerprint_ == task.private_encoded_rows_fingerprint
    run = tmp_path / "run"
    for stage in (["train", "--private", private, "--public", public, "--label", "label",
                   "--classes", "0", "1", "--teachers", "2", "--epochs", "1", "--workers", "1"],
                  ["votes"]):
        assert main(["--quiet", "teachers", stage[0], "--run", str(run), *stage[1:]]) == 0
    pool = VotePool.from_file(run / "votes.npz")
    assert pool.private_encoded_rows_fingerprint == task.private_encoded_rows_fingerprint
    loaded = Teachers.load(run)  # the command line's teachers, asked from Python
    assert loaded.private_encoded_rows_fingerprint_ == task.private_encoded_rows_fingerprint
    ledgers = [tmp_path / "cli.db", tmp_path / "api.db"]
    for ledger in ledgers:
        ledger.write_bytes(b"")  # the registry forgets ledgers whose file is gone
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first: nothing to warn of
        note_ledger(pool.private_fingerprint, f"sqlite:///{ledgers[0]}",
                    pool.former_private_fingerprint,
                    (pool.private_rows_fingerprint, pool.private_encoded_rows_fingerprint))
    with pytest.warns(UserWarning, match=r"also charged to 1 other ledger\(s\) \(sqlite:///"
                                         + str(ledgers[0])):
        note_ledger(teachers.private_fingerprint_, f"sqlite:///{ledgers[1]}",
                    rows_fingerprints=(teachers.private_rows_fingerprint_,))


def test_a_key_new_to_a_ledger_warns_only_of_ledgers_its_other_keys_did_not_find(
        tmp_path: Path) -> None:
    """A ledger reopened by a version with a third key (new to it) is not warned again of a
    ledger its rows' key found before, of which it warned then; a ledger only the new key
    finds is warned of."""
    from pate.aggregation.votes_ledger import note_ledger

    first, rows, encoded = "d" * 64, "r" * 64, "e" * 64
    urls = {}
    for name in ("this", "met", "new"):
        (tmp_path / f"{name}.db").write_bytes(b"")
        urls[name] = f"sqlite:///{tmp_path / name}.db"
    enter_ledger(first, urls["this"])
    enter_ledger(rows, urls["this"])
    enter_ledger(rows, urls["met"])  # warned of when it was entered
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        note_ledger(first, urls["this"], rows_fingerprints=(rows, encoded))
    enter_ledger("g" * 64, urls["new"])  # found by a key new to this ledger only
    with pytest.warns(UserWarning, match=r"also charged to 2 other ledger\(s\)"):
        note_ledger(first, urls["this"], rows_fingerprints=(rows, encoded, "g" * 64))


def test_teachers_served_without_votes_are_one_budget_with_their_votes(tmp_path: Path) -> None:
    """A run directory of teachers only (no votes), served for new inputs, charges the same
    private data as the votes those teachers cast: its ledger is entered under the data's keys
    (the teachers' manifest's) and warned of beside the votes' ledger."""
    import shutil

    from service_harness import write_tokens

    from pate.cli.main import main
    from pate.service.server import open_server

    rng = np.random.default_rng(7)
    for role, n in (("private", 60), ("public", 30)):
        x = rng.normal(size=(n, 2)).round(3)
        (tmp_path / f"{role}.csv").write_text("a,b,label\n" + "".join(
            f"{a},{b},{int(a > 0)}\n" for a, b in x))
    run = tmp_path / "run"
    for stage in (["train", "--private", str(tmp_path / "private.csv"), "--public",
                   str(tmp_path / "public.csv"), "--label", "label", "--classes", "0", "1",
                   "--teachers", "2", "--epochs", "1", "--workers", "1"], ["votes"]):
        assert main(["--quiet", "teachers", stage[0], "--run", str(run), *stage[1:]]) == 0
    assert _open_and_close(run / "votes.npz") == []  # the votes' ledger, the first
    served = tmp_path / "served"
    served.mkdir(mode=0o700)
    shutil.copytree(run / "teachers", served / "teachers")
    shutil.copy2(run / "partition.json", served / "partition.json")
    with pytest.warns(UserWarning, match=r"also charged to 1 other ledger\(s\) \(sqlite:///"
                                         + str(run / "ledger.db")):
        server = open_server(GNMax(sigma=5.0), token_file=write_tokens(tmp_path / "tokens"),
                             epsilon_budget=50.0, delta=1e-5, run_dir=served, port=0)
    server.close()
    with np.load(run / "votes.npz") as f:  # beside votes that record no private data
        votes = f["votes"]
    beside = tmp_path / "beside"
    beside.mkdir(mode=0o700)
    shutil.copytree(run / "teachers", beside / "teachers")
    np.savez(beside / "votes.npz", votes=votes)
    with pytest.warns(UserWarning, match=r"also charged to 2 other ledger\(s\)"):
        open_server(GNMax(sigma=5.0), token_file=tmp_path / "tokens", epsilon_budget=50.0,
                    delta=1e-5, run_dir=beside, port=0).close()

"""The Python API (``pate.api``): the README's example runs as written, and the pieces keep
their contracts (the ledger is charged before labels are returned, the student reloads)."""

from __future__ import annotations

import contextlib
import re
import runpy
import sqlite3
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from student_support import released

from analysis.costs import worst_case_queries
from analysis.mechanisms import ConfidentGNMax, GNMax, InteractiveGNMax, LNMax, mechanism_to_dict
from pate.api import PrivateLabels, Student, load_student
from pate.errors import BudgetExhausted, LedgerError, UserError
from student.rounds import Received
from student.sanitised import former_answers_digest

# The votes made up here stand for no private rows: PrivateLabels' warning that delta goes
# unchecked against their count (test_labels_hold_the_delta_rule_before_the_ledger_exists asserts
# it) is noise in the other tests.
pytestmark = pytest.mark.filterwarnings("ignore:PrivateLabels. delta is not checked:UserWarning")

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python example"
    return blocks[0]


def test_the_readme_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    monkeypatch.chdir(tmp_path)
    scope = runpy.run_path(str(script))
    accuracy = float(capsys.readouterr().out.split()[0])
    assert accuracy > 0.6  # 0.70-0.84 over repeated runs (noisy labels); chance is 0.1
    eps = scope["labels"].epsilon()
    assert eps.smooth_sensitivity > 0 and eps.data_independent > 0 and eps.not_sanitised is None
    assert eps.to_quote == eps.smooth_sensitivity
    # every query charged as answered: at least what the answers were charged
    assert eps.every_answered >= eps.data_independent
    assert eps.ledger_spent == pytest.approx(scope["labels"].ledger.budget().epsilon_spent)
    # one client, one ledger: the publishable data-independent epsilon is what it charged
    assert eps.data_independent == pytest.approx(eps.ledger_spent, rel=1e-9)
    student = scope["student"]
    student.save(tmp_path / "saved")
    again = load_student(tmp_path / "saved")
    np.testing.assert_array_equal(again.predict(scope["x_test"]),
                                  student.predict(scope["x_test"]))


def test_labels_stop_at_the_budget_and_the_ledger_persists(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    votes = rng.multinomial(50, [0.8, 0.1, 0.1], size=300)
    ledger = tmp_path / "ledger.db"
    labels = PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=2.0, delta=1e-5,
                           ledger=ledger)
    with pytest.warns(UserWarning, match=r"the privacy budget covered \d+ of the 300 queries"):
        got = labels.ask(np.arange(300), request_size=64)
    assert 0 < len(got) < 300 and labels.epsilon().ledger_spent <= 2.0
    labels.close()
    again = PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=2.0, delta=1e-5,
                          ledger=ledger)
    assert again.ledger.budget().epsilon_spent == pytest.approx(labels.epsilon().ledger_spent)
    assert len(again.ask(np.arange(300, 300))) == 0
    # rows not yet asked: the budget is spent, and a new ledger is no way out
    with pytest.raises(BudgetExhausted, match=r"does not cover even one more query.*budget is "
                                              r"spent.*a new ledger for it would be a second"):
        again.ask(np.arange(len(got), 300))
    assert again.ledger.budget().epsilon_spent == pytest.approx(labels.epsilon().ledger_spent)
    again.close()


def test_interactive_labels_charge_only_the_teachers_answers(tmp_path: Path) -> None:
    """Interactive-GNMax: where the student is confident and the teachers do not outvote it, the
    answer is the student's own label and runs no answering step; the publishable
    data-independent epsilon counts the teachers' answers only, as the ledger charged."""
    rng = np.random.default_rng(1)
    votes = rng.multinomial(100, [0.9, 0.05, 0.05], size=200)
    probs = np.tile([0.9, 0.05, 0.05], (200, 1))
    probs[100:] = [0.05, 0.05, 0.9]  # wrong and confident: the teachers outvote it
    labels = PrivateLabels(votes, InteractiveGNMax(50.0, 5.0, 5.0, 0.5), epsilon_budget=1e6,
                           delta=1e-5, ledger=tmp_path / "ledger.db")
    got = labels.ask(np.arange(200), student_probs=probs)
    counts = got.counts()
    assert counts["answered_by_student"] > 50 and counts["answered_by_teachers"] > 50
    eps = labels.epsilon()
    assert eps.data_independent == pytest.approx(eps.ledger_spent, rel=1e-9)
    labels.close()


def test_a_sanitised_epsilon_is_drawn_once_per_set_of_answers_whoever_asks(
        tmp_path: Path) -> None:
    """The releases are kept in the ledger, under its write lock: another object on the same
    ledger, at once or later, that asks the same rows (replayed, free) gets the same figure,
    not a fresh draw whose noise could be averaged away; other rows are a new release,
    composed with the first."""
    votes = np.random.default_rng(2).multinomial(250, [0.6, 0.3, 0.1], size=100)
    ledger = tmp_path / "ledger.db"
    mechanism = ConfidentGNMax(150.0, 40.0, 20.0)

    def sanitised(rows: np.ndarray) -> float:
        with PrivateLabels(votes, mechanism, epsilon_budget=1e4, delta=1e-5,
                           ledger=ledger) as labels:
            labels.ask(rows)
            first = labels.epsilon().smooth_sensitivity
            assert labels.epsilon().smooth_sensitivity == first
            return first

    # two objects open at once, each asking before either releases
    both = [PrivateLabels(votes, mechanism, epsilon_budget=1e4, delta=1e-5, ledger=ledger)
            for _ in range(2)]
    for labels in both:
        labels.ask(np.arange(40))
    first = both[0].epsilon().smooth_sensitivity
    assert both[1].epsilon().smooth_sensitivity == first
    for labels in both:
        labels.close()
    assert {sanitised(np.arange(40)[::-1]) for _ in range(3)} == {first}  # the same set
    assert sanitised(np.arange(40, 80)) > 0
    with PrivateLabels(votes, mechanism, epsilon_budget=1e4, delta=1e-5,
                       ledger=ledger) as labels:  # the free figure only: no release
        labels.ask(np.arange(80, 90))
        free = labels.epsilon(sanitise=False)
        assert free.smooth_sensitivity is None and free.data_independent > 0
        assert free.not_sanitised == "not asked for (sanitise=False)"
        # the figure to quote without a release: every query answered, as the report's
        assert free.to_quote == free.every_answered >= free.data_independent
        # what a budget of exactly that figure covers, every query answered: the 10 asked
        orders = labels.ledger.orders
        assert worst_case_queries(mechanism, free.every_answered * (1 + 1e-9), 1e-5,
                                  orders) == 10
        assert worst_case_queries(mechanism, free.every_answered * (1 - 1e-6), 1e-5,
                                  orders) == 9
    with PrivateLabels(votes, LNMax(scale=20.0), epsilon_budget=1e4, delta=1e-5,
                       ledger=tmp_path / "lnmax.db") as labels:
        labels.ask(np.arange(5))
        assert labels.epsilon().not_sanitised.startswith("this mechanism has no smooth-")
    unanimous = np.zeros((20, 3), np.int64)
    unanimous[:, 0] = 50  # sigma 5: the data-dependent analysis does not hold at its order
    with PrivateLabels(unanimous, GNMax(sigma=5.0), epsilon_budget=1e4, delta=1e-5,
                       ledger=tmp_path / "small-sigma.db", private_records=1000) as labels:
        labels.ask(np.arange(20))
        said = labels.epsilon()
        assert said.smooth_sensitivity is None and said.data_independent > 0
        assert said.not_sanitised.startswith("no figure could be released for these answers")
    with sqlite3.connect(ledger) as db:
        assert db.execute("SELECT COUNT(*) FROM ledger_releases").fetchone() == (2,)
    assert not list(tmp_path.glob("*.json"))  # in the ledger, not beside it


def test_the_queries_a_budget_covers_are_said_before_and_while_asking(tmp_path: Path) -> None:
    """``queries_left``: at worst (every query answered) the budget covers that many more, and
    ``ask`` answers at least that many before it stops; it shrinks as the ledger spends."""
    votes = np.random.default_rng(4).multinomial(250, [0.5, 0.3, 0.2], size=400)
    with PrivateLabels(votes, ConfidentGNMax(150.0, 40.0, 20.0), epsilon_budget=3.0,
                       delta=1e-5, ledger=tmp_path / "ledger.db") as labels:
        first = labels.queries_left()
        assert 2 <= first < 400
        labels.ask(np.arange(first // 2))
        assert 0 < labels.queries_left() < first
        with pytest.warns(UserWarning, match="the privacy budget covered"):
            got = labels.ask(np.arange(first // 2, 400))
        assert len(labels.received) >= first and len(got) < 400 - first // 2
        assert labels.queries_left() == 0  # not one more query fits


def small_mlp(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """A user's factory, defined at the top of a module (this one)."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(input_shape)), 8),
                               torch.nn.ReLU(), torch.nn.Linear(8, num_classes))


def test_a_release_an_earlier_version_made_is_found_again(tmp_path: Path) -> None:
    """Releases kept under the digest of versions before 2026-11-27 are the same answers'
    releases still: found, not drawn again."""
    votes = np.random.default_rng(3).multinomial(250, [0.6, 0.3, 0.1], size=60)
    mechanism = ConfidentGNMax(150.0, 40.0, 20.0)
    with PrivateLabels(votes, mechanism, epsilon_budget=1e4, delta=1e-5,
                       ledger=tmp_path / "ledger.db") as labels:
        labels.ask(np.arange(30)[::-1])
        rows = np.arange(30)  # as that version hashed them: sorted
        former = former_answers_digest(mechanism_to_dict(mechanism), labels.pool.digest, rows)
        with labels.ledger.sanitised_releases() as (_, add):
            add({"answers": former, "queries": 30, "epsilon": 1.25, "beta": 0.01,
                 "sigma": 0.5})
        assert labels.epsilon().smooth_sensitivity == 1.25
    assert released(tmp_path / "ledger.db") == [(30, 1.25)]


def test_new_votes_on_a_ledger_are_answered_afresh_not_replayed(tmp_path: Path) -> None:
    """One budget for the private data, teachers trained again: their votes answer a row asked
    before afresh (charged), not with the old teachers' answer; the same votes replay it."""
    votes = np.tile([40, 5, 5], (20, 1))
    ledger = tmp_path / "ledger.db"
    mechanism = GNMax(sigma=1.0)
    with PrivateLabels(votes, mechanism, epsilon_budget=1e6, delta=1e-5, ledger=ledger) as old:
        got = old.ask(np.arange(10))
        assert got.label.tolist() == [0] * 10 and not got.replayed.any()
    retrained = np.tile([5, 5, 40], (20, 1))
    with PrivateLabels(retrained, mechanism, epsilon_budget=1e6, delta=1e-5,
                       ledger=ledger) as new:
        got = new.ask(np.arange(5, 15))
        assert got.label.tolist() == [2] * 10 and not got.replayed.any()
        assert new.ledger.budget().queries == 20
    with PrivateLabels(votes, mechanism, epsilon_budget=1e6, delta=1e-5, ledger=ledger) as same:
        got = same.ask(np.arange(8, 12), request_size=3)  # two requests, both marks kept
        assert got.replayed.tolist() == [True, True, False, False]
        assert same.received.replayed.tolist() == got.replayed.tolist()
        assert same.ask(np.arange(8)).replayed.all()
        assert same.ledger.budget().queries == 22  # 0-9 replayed, free; 10 and 11 charged


def test_labels_hold_the_delta_rule_before_the_ledger_exists(tmp_path: Path) -> None:
    """Given the number of private records n, delta >= 1/n is refused before a ledger is made
    (unless allowed) and delta above 1/(10 n) is warned of, as pate serve does."""
    votes = np.random.default_rng(0).multinomial(50, [0.8, 0.1, 0.1], size=30)
    ledger = tmp_path / "ledger.db"
    with pytest.raises(UserError, match=r"delta 0\.001 is at least 1/n, n the number of private"):
        PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=2.0, delta=1e-3, ledger=ledger,
                      private_records=1000)
    assert not ledger.exists()
    with pytest.warns(UserWarning, match=r"above 1/\(10 n\)"):
        PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=2.0, delta=1e-3, ledger=ledger,
                      private_records=1000, allow_large_delta=True).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # n known: nothing to say
        PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=2.0, delta=1e-5,
                      ledger=tmp_path / "other.db", private_records=1000).close()
    # n unknown (neither teachers nor private_records): said, since nothing can be checked
    with pytest.warns(UserWarning, match="delta is not checked against the size n"):
        PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=2.0, delta=1e-5,
                      ledger=tmp_path / "third.db").close()


def test_bad_input_is_one_user_error_and_costs_nothing(tmp_path: Path) -> None:
    """Votes, indices, rows and labels a user may get wrong: each a UserError before anything
    is charged; a row asked again is refused, not charged and then lost."""
    rng = np.random.default_rng(2)
    votes = rng.multinomial(50, [0.8, 0.1, 0.1], size=40)
    bad_votes = {"1-d": votes[0], "one class": votes[:, :1], "negative": votes - votes.max(),
                 "unequal rows": np.vstack([votes[:-1], votes[-1:] + 1]),
                 "fractional": votes + 0.5}
    for name, bad in bad_votes.items():
        with pytest.raises(UserError, match="votes"):
            PrivateLabels(bad, GNMax(sigma=10.0), epsilon_budget=9.0, delta=1e-5,
                          ledger=tmp_path / f"{name}.db")
    labels = PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=9.0, delta=1e-5,
                           ledger=tmp_path / "ledger.db")
    got = labels.ask(np.arange(10))
    spent = labels.ledger.budget().epsilon_spent
    for indices, message in (([[1, 2], [3, 4]], "1-d sequence of integer"),
                             ([1.5, 2.5], "1-d sequence of integer"),
                             ([12, 12], "must not repeat"),
                             ([3, -1], "pool row numbers, >= 0: got -1"),
                             (np.arange(8, 14), "2 of these pool rows were asked already")):
        with pytest.raises(UserError, match=message):
            labels.ask(indices)
    assert labels.ledger.budget().epsilon_spent == spent and len(labels.received) == 10
    x = rng.normal(size=(40, 4))
    student = Student("supervised", arch="mlp", epochs=1)
    for call, message in ((lambda: student.fit(x, got.label, 3), "what PrivateLabels.ask"),
                          (lambda: student.fit(x[:5], got, 3), "x_public has 5 rows"),
                          # another array than the pool (the test rows, say): its length
                          (lambda: student.fit(np.vstack([x, x]), got, 3),
                           "x_public has 80 rows, the votes these labels answer were cast on "
                           "40"),
                          (lambda: student.fit(np.where(x > 1, np.nan, x), got, 3), "NaN"),
                          (lambda: student.fit(x[:0], got, 3), "n >= 1")):
        with pytest.raises(UserError, match=message):
            call()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    unseen = pytest.warns(UserWarning, match="no answered label is of the class")  # a toy's
    with unseen:
        student.fit(x, got, 3)  # seeded, and the caller's generator left as it was
    assert torch.equal(torch.get_rng_state(), state)
    with unseen:
        again = Student("supervised", arch="mlp", epochs=1).fit(x, got, 3)
    np.testing.assert_array_equal(again.predict_proba(x), student.predict_proba(x))
    for y in ([1], np.array(["a"] * 40), np.zeros((40, 1), int)):  # never a silent 0.0
        with pytest.raises(UserError, match=r"y must be class indices in \[0, 3\), one per"):
            student.score(x, y)
    labels.close()


def test_load_student_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no saved student"):
        load_student(tmp_path)
    with pytest.raises(UserError, match="fit the student first"):
        Student().save(tmp_path)


def test_feature_rows_get_the_tabular_defaults_and_bad_input_is_one_error(
        tmp_path: Path) -> None:
    """Rows of features: the teachers default to the MLP and the VAT student to its MLP (the
    CNN defaults are for images); string labels and rows of another width are one UserError."""
    from pate.api import Teachers

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    teachers = Teachers(3, 2, epochs=2, shard_size=3).fit(x[:200], y[:200])
    assert teachers.config.model == "mlp"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rows the teachers never saw: no warning
        votes = teachers.vote(x[200:])
    assert votes.shape == (100, 2) and set(votes.sum(axis=1)) == {3}
    with pytest.warns(UserWarning, match="some of its rows are rows the teachers were trained "
                                         r"on") as warned:  # a private row among the pool's
        teachers.vote(np.concatenate([x[200:], x[:1]]))
    assert warned[0].filename == __file__ and not re.search(r"\d", str(warned[0].message))
    with pytest.raises(UserError, match=r"^x has rows of shape \[5\]: the teachers learnt "
                                        r"from rows of shape \[6\]$"):
        teachers.vote(x[200:, :5])  # not numpy's error from the private-row check
    with pytest.raises(UserError, match=r"^threshold 4 exceeds the number of teachers"):
        PrivateLabels(votes, ConfidentGNMax(4, 1.0, 1.0), epsilon_budget=1000.0, delta=1e-5,
                      ledger=tmp_path / "refused.db")
    assert not (tmp_path / "refused.db").exists()
    labels = PrivateLabels(votes, GNMax(sigma=1.0), epsilon_budget=1000.0, delta=1e-5,
                           ledger=tmp_path / "ledger.db")
    try:
        got = labels.ask(np.arange(40))
    finally:
        labels.close()
    with pytest.raises(UserError, match=r"^n_classes is 3, the votes these labels answer "
                                        r"hold 2 classes$"):
        Student("vat", epochs=2).fit(x[:100], got, 3)
    student = Student("vat", epochs=2).fit(x[:100], got, 2)
    assert student.spec_ is not None and student.spec_.arch == "mlp"
    assert student.predict(x[:5]).shape == (5,)
    with pytest.raises(UserError, match=r"shape \[4\]: this student learnt from rows of "
                                        r"shape \[6\]"):
        student.predict(x[:5, :4])
    with pytest.raises(UserError, match=r"class indices in \[0, 2\)"):
        student.score(x[:5], np.full(5, 7))  # not a silent 0.0
    with pytest.raises(UserError, match=r"arch cnn-hog-scatter needs images of at least 8x8"):
        Student("supervised", arch="cnn-hog-scatter", epochs=1).fit(  # 2x3 images: too small
            x[:100].reshape(100, 1, 2, 3), got, 2)
    k = int(np.flatnonzero(got.answered)[0])  # one answer, drawn twice per labelled batch
    one = Received(got.pool_index[k:k + 1], got.label[k:k + 1], got.branch[k:k + 1])
    with pytest.warns(UserWarning, match=r"no answered label is of the class\(es\) "
                                         rf"{1 - got.label[k]}, of 2: the student will not "
                                         "predict them") as warned:
        assert Student("supervised", epochs=1).fit(x[:100], one, 2).predict(x[:5]).shape == (5,)
    assert warned[0].filename == __file__  # the caller's line, as the CLI's says its run
    with pytest.warns(UserWarning, match=r"the class\(es\) "  # by the names given
                                         rf"{['no', 'yes'][1 - got.label[k]]}, of 2"):
        Student("supervised", epochs=1).fit(x[:100], one, 2, classes=["no", "yes"])
    with (pytest.raises(UserError, match="cannot train on batches of 1 row"),  # batch norm
          pytest.warns(UserWarning, match="no answered label is of the class")):
        Student("supervised", epochs=1, batch_size=1).fit(x[:100], one, 2)
    with pytest.raises(UserError, match=r"arch must be a name or package\.module:factory, or "
                                        r"such a factory function .*, not a torch\.nn\.Module "
                                        "instance"):
        Student(arch=torch.nn.Linear(6, 2))
    # a factory function given itself is known by its import path, to be imported again
    student = Student("supervised", arch=small_mlp, epochs=1).fit(x[:100], got, 2)
    assert student.spec_ is not None and student.spec_.arch == f"{__name__}:small_mlp"

    def local(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
        return small_mlp(input_shape, num_classes)

    for arch, message in ((local, "defined inside a function"),
                          (lambda shape, n: small_mlp(shape, n), "a lambda")):
        with pytest.raises(UserError, match=message):
            Teachers(3, 2, model=arch)
    # a script's own factory trains here; saved, it loads only where the script runs
    sys.modules["__main__"].pate_test_factory = small_mlp  # as a script defines one
    try:
        scripted = Student("supervised", arch="__main__:pate_test_factory", epochs=1)
        scripted.fit(x[:100], got, 2)
        with pytest.warns(UserWarning, match="factory of the running script: only the same "
                                             "script can load it again"):
            scripted.save(tmp_path / "scripted")
    finally:
        del sys.modules["__main__"].pate_test_factory
    with pytest.raises(UserError, match="no attribute pate_test_factory \\(a factory of a "
                                        "running script: define it in this script too"):
        load_student(tmp_path / "scripted")  # loaded where that script is not running
    for labels, got in ((np.where(y == 1, "yes", "no"), r"<U3 values \(names\?\)"),
                        (y + 1, "an index of 2 or more"), (y - 1, "a negative index"),
                        (y[:, None], r"shape \[n, 1\]"), (y.astype(float), "float64 values")):
        with pytest.raises(UserError, match=f"integer class indices .*: got {got}"):
            Teachers(3, 2).fit(x, labels)
    # nor how many rows (private where the teachers are dealt by record or key)
    with pytest.raises(UserError, match=r"one label per row of x, got fewer labels than rows$"):
        Teachers(3, 2).fit(x, y[:-1])
    with pytest.raises(UserError, match="x must be numbers"):
        Teachers(3, 2).fit([["a"] * 6] * 300, y)


def test_misuse_is_one_user_error_and_leaves_no_ledger(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget that buys nothing, or none at all, is refused before a ledger would keep it for
    good; a folder is no ledger; nonsense settings are refused when given."""
    from pate.api import Teachers

    votes = np.random.default_rng(0).multinomial(50, [0.8, 0.1, 0.1], size=20)
    ledger = tmp_path / "ledger.db"
    for budget, message in ((1e-6, "does not cover even one query"),
                            (float("inf"), "finite number > 0"), (0.0, "finite number > 0")):
        with pytest.raises(UserError, match=message):
            PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=budget, delta=1e-5,
                          ledger=ledger)
        assert not list(tmp_path.iterdir())
    for kwargs, message in ((dict(votes=[[1, 2], [3]]), "votes must be a 2-d array of counts"),
                            (dict(epsilon_budget="1"), "epsilon_budget must be a finite number"),
                            (dict(delta=None), "delta must be a finite number > 0, got None"),
                            (dict(ledger=5), "ledger must be a file path or a URL, got 5")):
        settings = {"votes": votes, "epsilon_budget": 5.0, "delta": 1e-5, "ledger": ledger,
                    **kwargs}
        with pytest.raises(UserError, match=message):
            PrivateLabels(settings.pop("votes"), GNMax(sigma=10.0), **settings)
        assert not list(tmp_path.iterdir())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not first warned of as a large delta
        with pytest.raises(UserError, match=r"delta must be in \(0, 1\), got 1.5"):
            PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=5.0, delta=1.5,
                          ledger=ledger, private_records=1000, allow_large_delta=True)
    with pytest.raises(UserError, match=r"mechanism must be one of .*GNMax, got 'gnmax'"):
        PrivateLabels(votes, "gnmax", epsilon_budget=5.0, delta=1e-5, ledger=ledger)
    with pytest.raises(UserError, match="a folder; the ledger is a file"):
        PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=5.0, delta=1e-5, ledger=tmp_path)
    monkeypatch.chdir(tmp_path)  # SQLite's name of a database in memory: no file ":memory:"
    with pytest.raises(UserError, match="ledger :memory:: a ledger in memory would not outlast"):
        PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=5.0, delta=1e-5, ledger=":memory:")
    assert not list(tmp_path.iterdir())
    (tmp_path / "a-file").write_text("")
    for ledger_url, message in (
            (tmp_path / "a-file" / "ledger.db", "cannot create the ledger file .*Not a directory"),
            ("sqlite:///:memory:", "one in memory would not last"),
            ("foo://bar", r"NoSuchModuleError \(a ledger is an SQLite database file, or a URL")):
        with pytest.raises(LedgerError, match=message):
            PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=5.0, delta=1e-5,
                          ledger=ledger_url)
    (tmp_path / "a-file").unlink()
    with pytest.raises(UserError, match="shard_size"):
        Teachers(2, 10, shard_size=0)
    # the wrong kind of number is one line too, not a TypeError from deep inside
    for kwargs, message in (({"n_teachers": 3.5}, "n_teachers must be an integer >= 1, got 3.5"),
                            ({"n_teachers": True}, "n_teachers must be an integer >= 1"),
                            ({"n_classes": 10.0}, "n_classes must be an integer >= 2"),
                            ({"epochs": 1.5}, "epochs must be an integer >= 1"),
                            ({"lr": "0.1"}, "lr must be a finite number > 0, got '0.1'"),
                            ({"seed": 2**70}, r"seed must be an integer in \[0, ")):
        with pytest.raises(UserError, match=message):
            Teachers(**{"n_teachers": 2, "n_classes": 10, **kwargs})
    with pytest.raises(UserError, match=r"batch_size must be an integer >= 1, got 2\.5"):
        Student(batch_size=2.5)
    with pytest.raises(UserError, match="model cnn needs images"):
        Teachers(2, 2, model="cnn").fit(np.zeros((20, 4)), np.arange(20) % 2)
    with pytest.raises(UserError, match="model scatter needs images of at least 4x4 pixels"):
        Teachers(2, 2, model="scatter").fit(np.zeros((20, 1, 3, 9)), np.arange(20) % 2)
    with pytest.raises(UserError, match=r"private_records must be an integer >= 1, got 600\.5"):
        PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=5.0, delta=1e-5, ledger=ledger,
                      private_records=600.5)
    with pytest.raises(UserError, match="lr must be a finite number > 0"):
        Student(lr=-1.0)
    for call, message in ((lambda: Teachers(2, 2, device="cuda:7"), "device 'cuda:7'"),
                          (lambda: Student(device=0), "device must be a name"),
                          (lambda: Student(augment="rotate"), "augment must be one of"),
                          (lambda: Teachers(2, 2, augment="rotate"), "augment must be one of"),
                          (lambda: Teachers(2, 2, mixup=-1.0), "mixup"),
                          (lambda: PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=5.0,
                                                 delta=1e-5, ledger=ledger,
                                                 teachers=Teachers(2, 3)), "fit the teachers"),
                          (lambda: PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=5.0,
                                                 delta=1e-5, ledger=ledger, teachers="t"),
                           "teachers must be the Teachers"),
                          (lambda: Student(vat_eps=0.0), "vat_eps must be"),
                          (lambda: Teachers(2, 2, augment="shift").fit(
                              np.zeros((20, 4)), np.arange(20) % 2), "feature rows take"),
                          (lambda: Student(augment="shift").fit(
                              np.zeros((20, 4)), Received.empty(), 2), "feature rows take")):
        with pytest.raises(UserError, match=message):
            call()


def test_augmentation_mixup_and_vat_settings_are_used() -> None:
    """The teachers' augmentation and mixup, and the student's augmentation, VAT eps and
    entropy minimisation, change what is learnt (each is used, not only accepted); images laid
    out channels-last are warned of."""
    from pate.api import Teachers

    rng = np.random.default_rng(0)
    images = rng.random((60, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 3, 60)
    plain = Teachers(2, 3, epochs=2).fit(images, labels)
    for changed in (Teachers(2, 3, epochs=2, augment="shift-flip"),
                    Teachers(2, 3, epochs=2, mixup=0.4)):
        changed.fit(images, labels)
        assert changed.config.augment != "none" or changed.config.mixup > 0
        assert not all(np.array_equal(a, b) for a, b in zip(
            plain.ensemble_.shards[0].values(), changed.ensemble_.shards[0].values(),
            strict=True))
    got = Received(np.arange(30), labels[:30], np.zeros(30, np.int8))
    probs = [Student("vat", epochs=1, **kw).fit(images, got, 3).predict_proba(images)
             for kw in ({}, {"augment": "shift"}, {"vat_eps": 6.0}, {"entmin": True})]
    for other in probs[1:]:
        assert not np.allclose(probs[0], other)
    channels_last = images.transpose(0, 2, 3, 1).repeat(3, axis=3)
    student = Student("supervised", epochs=1).fit(images, got, 3)
    for call in (lambda: Teachers(2, 3, epochs=1).fit(channels_last, labels),
                 lambda: student.predict(channels_last), lambda: student.score(channels_last,
                                                                              labels)):
        with pytest.warns(UserWarning, match=r"images of shape \[8, 8, 3\] look channels-last "
                                             r"\[H, W, C\]") as caught, \
                contextlib.suppress(UserError):  # the student then refuses the shape
            call()
        assert caught[0].filename == __file__  # the caller's line, not the library's


@pytest.mark.filterwarnings(  # votes on the teachers' own rows, on purpose
    "ignore:x. some of its rows are rows the teachers were trained on")
def test_8_bit_images_are_scaled_as_image_files_are() -> None:
    """uint8 images are read as [0, 1], as the built-in datasets and image files are: the same
    teachers as on the floats (feature rows are taken as they are)."""
    from pate.api import Teachers

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 1, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 3, 40)
    votes = [Teachers(2, 3, epochs=1).fit(x, labels).vote(x)
             for x in (images, images.astype(np.float32) / 255)]
    np.testing.assert_array_equal(*votes)
    # the same pixels as floats would be read 255 times brighter than as integers: refused,
    # before anything trains, in fit and in vote alike (features are taken as they are)
    fitted = Teachers(2, 3, epochs=1).fit(images, labels)
    for call in (lambda: Teachers(2, 3, epochs=1).fit(images.astype(np.float64), labels),
                 lambda: fitted.vote(images.astype(np.float32))):
        with pytest.raises(UserError, match="whole numbers above 1 stored as floats"):
            call()
    assert fitted.vote(images.astype(np.float32) / 255).shape == (40, 3)
    Teachers(2, 3, epochs=1).fit(images.reshape(40, -1).astype(np.float64), labels)


@pytest.mark.filterwarnings(  # votes on the teachers' own rows, on purpose
    "ignore:x. some of its rows are rows the teachers were trained on")
def test_teachers_saved_and_loaded_vote_the_same_and_stay_private(tmp_path: Path) -> None:
    """``Teachers.save`` writes the weights 0600 in 0700 folders with their digests;
    ``Teachers.load`` gives the same votes, refuses a damaged shard, and reads a ``pate run``
    directory's teachers too."""
    import stat

    from pate.api import Teachers

    rng = np.random.default_rng(0)
    x = rng.random((80, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 80)
    teachers = Teachers(4, 3, epochs=1, shard_size=3).fit(x, y)
    with pytest.raises(UserError, match="fit the teachers first"):
        Teachers(4, 3).save(tmp_path / "none")
    saved = teachers.save(tmp_path / "saved")
    files = sorted((saved / "teachers").iterdir())
    assert [f.name for f in files] == ["manifest.json", "shard-00000.safetensors",
                                       "shard-00001.safetensors"]
    assert stat.S_IMODE((saved / "teachers").stat().st_mode) == 0o700
    assert stat.S_IMODE(saved.stat().st_mode) == 0o700  # the folder save made, too
    (tmp_path / "mine").mkdir(mode=0o755)  # a folder of the user's keeps its permissions
    teachers.save(tmp_path / "mine")
    assert stat.S_IMODE((tmp_path / "mine").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "mine" / "teachers").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    loaded = Teachers.load(saved)
    assert loaded.config == teachers.config and loaded.n_teachers == 4
    np.testing.assert_array_equal(loaded.vote(x), teachers.vote(x))
    with pytest.raises(UserError, match="no saved teachers"):
        Teachers.load(tmp_path / "nothing")
    damaged = saved / "teachers" / "shard-00001.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\0")
    with pytest.raises(UserError, match="missing or corrupt"):
        Teachers.load(saved)


def test_a_users_module_named_as_a_layer_is_one_clear_error(tmp_path: Path) -> None:
    """A ``student.py`` (or a ``teachers`` package) in the folder Python starts from comes
    before this project's packages of those names: ``import pate`` says so in one line, not
    with a failure deep in another import. A folder without ``__init__.py`` shadows nothing."""
    import subprocess

    def imported(folder: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "import pate.api"], cwd=folder,
                              capture_output=True, text=True, timeout=120)

    (tmp_path / "student.py").write_text("raise SystemExit('a user script, run on import')\n")
    proc = imported(tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ImportError: pate: the package 'student' installed beside pate is shadowed by "
        f"{tmp_path / 'student.py'}: rename that, or work from another folder")
    (tmp_path / "student.py").unlink()
    (tmp_path / "analysis").mkdir()  # a plain folder of the user's: no package
    assert imported(tmp_path).returncode == 0


def test_teachers_that_read_a_pool_encoder_fit_it_on_x_public_and_keep_it(
        tmp_path: Path) -> None:
    """``hog-scatter-whitened`` fits its whitening on ``x_public`` (and only those models take
    it); the saved teachers keep it, 0600, and vote the same once loaded and saved again."""
    import stat

    from pate.api import Teachers

    rng = np.random.default_rng(1)
    x = rng.random((120, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 120)
    pool = rng.random((60, 1, 8, 8)).astype(np.float32)
    with pytest.raises(UserError, match=r"x_public= \(the public pool\) goes with"):
        Teachers(3, 3, epochs=1, model="hog-scatter-whitened").fit(x, y)
    with pytest.raises(UserError, match="x_public= "):
        Teachers(3, 3, epochs=1, model="hog").fit(x, y, x_public=pool)
    with pytest.raises(UserError, match="x_public has rows of"):
        Teachers(3, 3, epochs=1, model="hog-scatter-whitened").fit(x, y, x_public=pool[:, :, :4])
    teachers = Teachers(3, 3, epochs=2, model="hog-scatter-whitened").fit(x, y, x_public=pool)
    assert teachers.encoder_ is not None and teachers.encoder_["hog.projection"].shape[1] == 36
    saved = teachers.save(tmp_path / "saved")
    encoder_file = saved / "teachers" / "pool-encoder.safetensors"
    assert stat.S_IMODE(encoder_file.stat().st_mode) == 0o600
    again = Teachers.load(saved).save(tmp_path / "again")
    np.testing.assert_array_equal(Teachers.load(again).vote(pool), teachers.vote(pool))


def test_a_setting_zero_turns_off_is_said_so_when_refused() -> None:
    from pate.api import Teachers

    assert Teachers(3, 2, mixup=0).config.mixup == 0.0
    for bad in (-1, float("nan"), True):
        with pytest.raises(UserError, match=r"mixup must be 0 \(off\) or a finite number > 0"):
            Teachers(3, 2, mixup=bad)

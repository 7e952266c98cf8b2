"""``pate analyze``: the JSON contract (docs/cli.md), agreement between paths, and one-line
errors."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis.mechanisms import ConfidentGNMax
from analysis.votes_analysis import PrivacyAnalysis, analyze_votes
from pate.cli.main import main
from pate.data.synthetic import synthetic_votes

EXAMPLE = Path(__file__).resolve().parents[2] / "pate" / "examples" / "votes-synthetic-640x250.npy"
CONFIDENT = ["--mechanism", "confident", "--threshold", "200", "--sigma1", "150",
             "--sigma2", "40"]


def analyze(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main(["analyze", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_contract(capsys: pytest.CaptureFixture) -> None:
    r = analyze(capsys, "--votes", str(EXAMPLE), "--delta", "1e-5", *CONFIDENT)
    assert set(r) == {"mechanism", "queries", "teachers", "classes", "delta", "conversion",
                      "expected_answered", "data_independent", "data_dependent",
                      "smooth_sensitivity"}
    assert (r["mechanism"], r["queries"], r["teachers"], r["classes"]) == ("confident", 640,
                                                                           250, 10)
    assert r["conversion"] == "improved"
    assert set(r["data_dependent"]) == {"epsilon", "order", "rdp"}
    assert {"order", "beta", "value", "sigma", "rdp_cost", "epsilon"} <= set(
        r["smooth_sensitivity"])
    ss = r["smooth_sensitivity"]
    assert ss["order"] == r["data_dependent"]["order"]
    assert r["data_dependent"]["epsilon"] < ss["epsilon"] < r["data_independent"]["epsilon"]
    assert 0 < r["expected_answered"] < 640


def test_fixed_order_beta_classic_and_queries(capsys: pytest.CaptureFixture,
                                              tmp_path: Path) -> None:
    votes = np.load(EXAMPLE)
    np.savez(tmp_path / "v.npz", votes=votes[:100], pool_index=np.arange(100))
    fixed = ["--order", "17", "--beta", "0.02", "--conversion", "classic", "--delta", "1e-5"]
    a = analyze(capsys, "--votes", str(EXAMPLE), "--queries", "100", *CONFIDENT, *fixed)
    b = analyze(capsys, "--votes", str(tmp_path / "v.npz"), *CONFIDENT, *fixed)
    assert a == b
    assert a["smooth_sensitivity"]["beta"] == 0.02 and a["data_dependent"]["order"] == 17
    rdp = a["data_dependent"]["rdp"]
    assert a["data_dependent"]["epsilon"] == pytest.approx(rdp + np.log(1e5) / 16, rel=1e-12)


def test_asked_rows_are_found_through_the_pool_index(capsys: pytest.CaptureFixture,
                                                      tmp_path: Path) -> None:
    votes = np.load(EXAMPLE)
    pool_index = np.random.default_rng(1).permutation(np.arange(1000, 1000 + len(votes)))
    np.savez(tmp_path / "votes.npz", votes=votes, pool_index=pool_index)
    rows = np.array([7, 300, 2, 511, 64, 99, 123])
    np.savez(tmp_path / "labels.npz", pool_index=pool_index[rows], label=np.zeros(7, np.int64))
    np.save(tmp_path / "v.npy", votes[rows])
    fixed = ["--delta", "1e-5", *CONFIDENT, "--order", "9"]
    expected = analyze(capsys, "--votes", str(tmp_path / "v.npy"), *fixed)
    got = analyze(capsys, "--votes", str(tmp_path / "votes.npz"),
                  "--asked", str(tmp_path / "labels.npz"), *fixed)
    assert got == expected and got["queries"] == 7
    np.save(tmp_path / "asked.npy", rows)  # without a pool_index, indices are row numbers
    assert analyze(capsys, "--votes", str(EXAMPLE), "--asked", str(tmp_path / "asked.npy"),
                   *fixed) == expected
    # an index asked again was replayed by the service, free: it counts once
    np.save(tmp_path / "again.npy", np.concatenate([rows, rows[[1, 0]]]))
    assert analyze(capsys, "--votes", str(EXAMPLE), "--asked", str(tmp_path / "again.npy"),
                   *fixed) == expected


def test_rows_asked_of_another_pool_are_refused(capsys: pytest.CaptureFixture,
                                                tmp_path: Path) -> None:
    """A student's labels.npz and a run's votes.npz record the pool they are about
    (``pool_fingerprint``): another run's labels, whose indices may all exist in these votes,
    are refused; a file that records none (a .npy, an older version's) is taken as it is."""
    votes = np.load(EXAMPLE)
    np.savez(tmp_path / "votes.npz", votes=votes, pool_index=np.arange(len(votes)),
             pool_fingerprint=np.array("pool-a"))
    fixed = ["--votes", str(tmp_path / "votes.npz"), "--delta", "1e-5", *CONFIDENT]
    for pool, ok in (("pool-a", True), ("pool-b", False), (None, True)):
        extra = {} if pool is None else {"pool_fingerprint": np.array(pool)}
        np.savez(tmp_path / "labels.npz", pool_index=np.array([3, 4]), label=np.zeros(2, int),
                 **extra)
        code = main(["analyze", *fixed, "--asked", str(tmp_path / "labels.npz")])
        err = capsys.readouterr().err
        assert code == (0 if ok else 2)
        assert ok or "asked of another public pool than" in err


# ``pate analyze --votes EXAMPLE --delta 1e-5`` + CONFIDENT, as the analysis gave it before it
# returned a typed result: the figures must not move (to 1e-12).
PINNED = {"mechanism": "confident", "queries": 640, "teachers": 250, "classes": 10,
          "delta": 1e-05, "conversion": "improved", "expected_answered": 347.5880223907291,
          "data_independent": {"epsilon": 3.0538203920258367, "order": 7.4},
          "data_dependent": {"epsilon": 1.0679347082882629, "order": 17.0,
                             "rdp": 0.586077322547572},
          "smooth_sensitivity": {"order": 17.0, "beta": 0.028235294117647046,
                                 "value": 0.048875884320765596, "sigma": 7.166268116042371,
                                 "rdp_cost": 0.4808475609784087,
                                 "conditions": {"c5": True, "c6": True},
                                 "epsilon": 1.5487822692666717}}


def test_the_typed_result_is_the_json(capsys: pytest.CaptureFixture) -> None:
    r = analyze_votes(np.load(EXAMPLE), ConfidentGNMax(200, 150, 40), 1e-5)
    assert isinstance(r, PrivacyAnalysis)
    assert main(["analyze", "--json", "--votes", str(EXAMPLE), "--delta", "1e-5",
                 *CONFIDENT]) == 0
    out = capsys.readouterr().out
    assert out == json.dumps(r.to_json()) + "\n"
    got = json.loads(out)

    def close(a: object, b: object) -> None:  # the same keys in the same order, figures to 1e-12
        if isinstance(a, dict):
            assert isinstance(b, dict) and list(a) == list(b)
            for key in a:
                close(a[key], b[key])
        elif isinstance(a, float):
            assert a == pytest.approx(b, rel=1e-12)
        else:
            assert a == b

    close(got, PINNED)
    assert (r.data_dependent.epsilon, r.smooth_sensitivity.epsilon, r.smooth_sensitivity.c5,
            r.smooth_sensitivity.fallback) == (got["data_dependent"]["epsilon"],
                                               got["smooth_sensitivity"]["epsilon"], True, False)


def test_rdp_composes_over_queries() -> None:
    votes = synthetic_votes(300, 250, 10, seed=4)
    mechanism = ConfidentGNMax(threshold=200, sigma1=150, sigma2=40)

    def rdp(v: np.ndarray) -> float:
        return analyze_votes(v, mechanism, 1e-5, order=20.0).data_dependent.rdp

    assert rdp(votes) == pytest.approx(rdp(votes[:120]) + rdp(votes[120:]), rel=1e-12)


def test_data_independent_confident_is_selection_plus_expected_answers() -> None:
    votes = synthetic_votes(200, 250, 10, seed=5)
    r = analyze_votes(votes, ConfidentGNMax(threshold=200, sigma1=150, sigma2=40), 1e-5,
                      order=10.0, conversion="classic")
    rdp = 200 * 10 / (2 * 150**2) + r.expected_answered * 10 / 40**2
    assert r.data_independent.epsilon == pytest.approx(rdp + np.log(1e5) / 9, rel=1e-12)


@pytest.mark.parametrize("mechanism,flags", [
    ("lnmax", ["--scale", "20"]), ("gnmax", ["--sigma", "40"]),
    ("confident", CONFIDENT[2:])])
def test_improved_never_above_classic(capsys: pytest.CaptureFixture, mechanism: str,
                                      flags: list[str]) -> None:
    common = ["--votes", str(EXAMPLE), "--delta", "1e-6", "--mechanism", mechanism, *flags]
    improved = analyze(capsys, *common)
    classic = analyze(capsys, *common, "--conversion", "classic")
    for key in ("data_independent", "data_dependent"):
        assert improved[key]["epsilon"] <= classic[key]["epsilon"]
    assert improved["data_dependent"]["epsilon"] <= improved["data_independent"]["epsilon"]
    if mechanism == "lnmax":
        assert improved["smooth_sensitivity"] is None


def test_interactive_uses_the_baseline(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    votes = np.load(EXAMPLE)
    probs = np.random.default_rng(0).dirichlet(np.ones(10), size=votes.shape[0])
    np.save(tmp_path / "b.npy", 250 * probs)
    r = analyze(capsys, "--votes", str(EXAMPLE), "--delta", "1e-5", "--mechanism", "interactive",
                "--threshold", "200", "--sigma1", "150", "--sigma2", "40",
                "--baseline", str(tmp_path / "b.npy"))
    c = analyze(capsys, "--votes", str(EXAMPLE), "--delta", "1e-5", *CONFIDENT)
    assert r["expected_answered"] < c["expected_answered"]  # votes minus baseline is smaller


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pate", "analyze", *args],
                          capture_output=True, text=True, timeout=120)


def bad_files(tmp: Path) -> dict[str, Path]:
    files = {"shape": np.zeros(5), "negative": np.array([[3, -1], [1, 1]]),
             "fraction": np.array([[1.5, 0.5], [1, 1]]), "sums": np.array([[7, 0], [1, 0]]),
             "huge": np.array([[1e30, 0.0], [1e30, 0.0]]),
             "nan": np.array([[np.nan, 1.0], [1.0, 1.0]]),
             "asked_unknown": np.array([3, 640])}
    out = {}
    for name, arr in files.items():
        out[name] = tmp / f"{name}.npy"
        np.save(out[name], arr)
    np.savez(tmp / "labels-only.npz", labels=np.array([3, 4]))
    out["labels_only"] = tmp / "labels-only.npz"
    np.savez(tmp / "a-votes.npz", votes=np.load(EXAMPLE), pool_index=np.arange(640))
    out["votes_npz"] = tmp / "a-votes.npz"  # a run's votes.npz given as the rows asked
    (tmp / "junk.npy").write_bytes(b"not numpy")
    out["junk"] = tmp / "junk.npy"
    np.save(tmp / "text-baseline.npy", np.full(np.load(EXAMPLE).shape, "abc"))
    out["text_baseline"] = tmp / "text-baseline.npy"  # an internal ValueError before
    return out


def test_bad_input_is_one_line_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    files = bad_files(tmp_path)
    good = str(EXAMPLE)
    cases = [
        (["--votes", str(tmp_path / "missing.npy"), "--mechanism", "gnmax", "--sigma", "4",
          "--delta", "1e-5"], "no such file"),
        (["--votes", str(files["shape"]), "--mechanism", "gnmax", "--sigma", "4",
          "--delta", "1e-5"], "2-d"),
        (["--votes", str(files["negative"]), "--mechanism", "gnmax", "--sigma", "4",
          "--delta", "1e-5"], "non-negative"),
        (["--votes", str(files["fraction"]), "--mechanism", "gnmax", "--sigma", "4",
          "--delta", "1e-5"], "integer"),
        (["--votes", str(files["sums"]), "--mechanism", "gnmax", "--sigma", "4",
          "--delta", "1e-5"], "same number of teachers"),
        (["--votes", str(files["huge"]), "--mechanism", "gnmax", "--sigma", "4",
          "--delta", "1e-5"], "counts of at most 2147483647 teachers"),
        (["--votes", good, "--mechanism", "confident", "--threshold", "-1", "--sigma1", "4",
          "--sigma2", "4", "--delta", "1e-5"], "--threshold must be >= 0, got -1.0"),
        (["--votes", str(files["nan"]), "--mechanism", "gnmax", "--sigma", "4",
          "--delta", "1e-5"], "NaN"),
        (["--votes", str(files["junk"]), "--mechanism", "gnmax", "--sigma", "4",
          "--delta", "1e-5"], "not a readable"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "0", "--delta", "1e-5"],
         "--sigma must be > 0"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1"],
         "--delta must be in (0, 1)"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--order", "1"], "--order must be in (1, 1e+06], got 1"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--order", "inf"], "--order must be in (1, 1e+06]"),  # ZeroDivisionError before
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--order", "1e308"], "--order must be in (1, 1e+06]"),  # Infinity in the JSON
        (["--votes", good, "--mechanism", "interactive", "--threshold", "200", "--sigma1",
          "150", "--sigma2", "40", "--delta", "1e-5", "--baseline", str(files["text_baseline"])],
         "baseline must be real numbers, got dtype <U3"),
        (["--votes", good, "--mechanism", "confident", "--sigma1", "4", "--sigma2", "4",
          "--delta", "1e-5"], "--threshold must be given"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--scale", "2",
          "--delta", "1e-5"], "--scale is not taken by mechanism gnmax"),
        (["--votes", good, "--mechanism", "lnmax", "--scale", "inf", "--delta", "1e-5"],
         "--scale must be finite"),
        (["--votes", good, "--mechanism", "lnmax", "--scale", "20", "--delta", "1e-5",
          "--beta", "0.1"], "--beta is for the smooth-sensitivity analysis, which LNMax has "
                            "none of"),
        (["--votes", good, "--mechanism", "interactive", "--threshold", "1", "--sigma1", "4",
          "--sigma2", "4", "--delta", "1e-5"], "--baseline"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--queries", "100000"], "exceeds"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--queries", "10", "--asked", str(files["asked_unknown"])], "not both"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--asked", str(files["asked_unknown"])], "not in the registered pool: [640]"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--asked", str(files["fraction"])], "pool indices must be a non-empty 1-d array"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--asked", str(files["labels_only"])], "expected an array named 'pool_index'"),
        (["--votes", good, "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
          "--asked", str(files["votes_npz"])], "a-votes.npz: a file of votes (it holds "
                                               "'votes'), not one of pool_index alone"),
    ]
    proc = run_cli(*cases[0][0])  # one in a process of its own, the rest in this one
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.strip().splitlines() == [f"pate: error: {tmp_path / 'missing.npy'}: "
                                                "no such file"]
    for args, message in cases[1:]:
        assert main(["analyze", *args]) == 2, args
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, err)
        assert "Traceback" not in err and out == ""
        if message == "same number of teachers":  # the sums (votes, in a bad file) unquoted
            assert lines[0].endswith(message), lines[0]


def test_a_fallback_is_printed_without_the_release_that_did_not_happen(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Where conditions C5/C6 fail the sanitised epsilon is the data-independent bound of every
    query answered: the text says so, and the JSON gives no beta, SS or sigma of the votes."""
    votes = tmp_path / "votes.npy"
    np.save(votes, np.array([[7, 7, 6]] * 10))
    args = ["--votes", str(votes), "--delta", "1e-5", "--mechanism", "confident",
            "--threshold", "14", "--sigma1", "4", "--sigma2", "2"]
    ss = analyze(capsys, *args)["smooth_sensitivity"]
    assert ss["fallback"] == "data-independent"
    assert (ss["beta"], ss["value"], ss["sigma"], ss["rdp_cost"]) == (None, None, None, None)
    assert main(["analyze", *args]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == (f"  smooth-sensitivity {ss['epsilon']:.4f} (order {ss['order']:g}; "
                    "conditions C5/C6 fail: the data-independent bound of every query answered)")

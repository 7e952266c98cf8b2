"""The Bayesian accountant: the authors' estimator computed naively, the classical bound it must
reproduce, its numerical stability and its error handling."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import binom
from scipy.stats import t as student_t

from analysis.bayesian import BayesianAccountant
from analysis.sampled_gaussian import dpsgd_epsilon
from pate.cli.main import main


def naive_step_cost(d: np.ndarray, sigma: float, q: float, moments: np.ndarray, total: int,
                    gamma: float) -> np.ndarray:
    """Triastcyn & Faltings 2020, eq. 10-12 in linear space, straight from the definitions (moderate
    values only): exp(l_i) = (E_{k ~ Bin(lam+1, q)} exp((k^2 - k) d_i^2 / (2 sigma^2)))^T, then
    c = log(mean + t_{1-gamma, m-1} std / sqrt(m - 1)) / T."""
    out = []
    for lam in moments:
        k = np.arange(lam + 2)
        inner = np.array([np.sum(binom.pmf(k, lam + 1, q)
                                 * np.exp((k * k - k) * di**2 / (2 * sigma**2))) for di in d])
        e = inner**total
        m = len(d)
        out.append(np.log(e.mean() + student_t.ppf(1 - gamma, m - 1) * e.std() / np.sqrt(m - 1))
                   / total)
    return np.array(out)


def test_step_cost_matches_the_naive_estimator() -> None:
    rng = np.random.default_rng(1)
    d = rng.uniform(0.0, 1.0, 50)
    acc = BayesianAccountant((1, 2, 4, 8), total_steps=20, failure_probability=1e-3)
    expected = naive_step_cost(d, 1.5, 0.05, np.array([1, 2, 4, 8]), 20, 1e-3)
    np.testing.assert_allclose(acc.step_cost(d, 1.5, 0.05), expected, rtol=1e-10)


def test_steps_at_once_are_the_steps_one_by_one() -> None:
    """``accumulate_each`` adds what ``accumulate`` row by row does, and counts as many steps
    and estimates."""
    d = np.random.default_rng(2).uniform(0.0, 1.0, (37, 40))
    each, one_by_one = (BayesianAccountant((1, 2, 4), total_steps=40) for _ in range(2))
    each.accumulate_each(d, 1.2, 0.02)
    for row in d:
        one_by_one.accumulate(row, 1.2, 0.02)
    np.testing.assert_allclose(each.cost, one_by_one.cost, rtol=1e-12)
    assert (each.steps, each.estimates) == (one_by_one.steps, one_by_one.estimates) == (37, 37)
    with pytest.raises(ValueError, match="exceed total_steps"):
        each.accumulate_each(d, 1.2, 0.02)
    # a bad row part of the way: nothing of the array is kept
    fresh = BayesianAccountant((1, 2, 4), total_steps=40)
    bad = d[:3].copy()
    bad[2, 0] = np.nan
    with pytest.raises(ValueError):
        fresh.accumulate_each(bad, 1.2, 0.02)
    assert (fresh.steps, fresh.estimates) == (0, 0) and not np.any(fresh.cost)


def test_one_pair_at_the_clipping_bound_is_the_classical_bound() -> None:
    """Every pair at distance C, noise sigma * C: zero variance, c_t = log A_{lam+1}, and the
    accountant's epsilon is the RDP accountant's with the classic conversion at orders lam + 1."""
    q, sigma, clip, steps, delta = 0.03, 1.3, 0.1, 400, 1e-5
    moments = (2, 4, 8, 16, 32)
    acc = BayesianAccountant(moments, total_steps=steps)
    for _ in range(steps):
        acc.accumulate(np.full(3, clip), sigma * clip, q)
    eps, moment = acc.epsilon_and_moment(delta)
    classic, order = dpsgd_epsilon(q, sigma, steps, delta - acc.failure_probability, "classic",
                                   orders=np.array(moments) + 1.0)
    assert eps == pytest.approx(classic, rel=1e-12)
    assert moment == order - 1
    # the same cost in one call for all steps
    once = BayesianAccountant(moments, total_steps=steps)
    once.accumulate(np.full(3, clip), sigma * clip, q, steps=steps)
    np.testing.assert_allclose(once.cost, acc.cost, rtol=1e-12)


def test_smaller_distances_give_a_smaller_epsilon() -> None:
    q, sigma, clip, steps = 2048 / 60_000, 2.0, 0.1, 50
    rng = np.random.default_rng(0)
    bayes = BayesianAccountant(total_steps=steps)
    for _ in range(steps):
        bayes.accumulate(rng.uniform(0.2, 0.6, 64) * clip, sigma * clip, q)
    classical = BayesianAccountant(total_steps=steps)
    classical.accumulate(np.full(3, clip), sigma * clip, q, steps=steps)
    assert bayes.get_epsilon(1e-5) < 0.8 * classical.get_epsilon(1e-5)


@pytest.mark.parametrize(("noise_std", "lowered"), [(1.0, True), (1.7, False)])
def test_default_moments_add_order_two_to_the_authors_grid(noise_std: float,
                                                           lowered: bool) -> None:
    """Half the pairs at 2C (two clipped gradients in opposite directions): with noise 1 x C the
    optimum is moment 1, which the authors' grid (2, 4, ..., 32) lacks, and the default grid's
    epsilon is far lower; with 1.7 x C it is moment 2, now inside the grid: the same epsilon.
    Neither warns that the optimum is at the grid's end: the cost comes from the private
    gradients, so whether it warned would tell something of them."""
    d = np.concatenate([np.full(128, 1.0), np.full(128, 2.0)])
    epsilons = []
    for moments in ((2, 4, 8, 16, 32), None):
        acc = BayesianAccountant(total_steps=100) if moments is None else \
            BayesianAccountant(moments, total_steps=100)
        acc.accumulate(d, noise_std, 0.05, steps=100)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            eps, moment = acc.epsilon_and_moment(1e-5)
        epsilons.append(eps)
    assert moment == (1 if lowered else 2)
    assert (epsilons[1] < 0.5 * epsilons[0]) if lowered else epsilons[1] == epsilons[0]
    assert not caught


def test_log_space_is_stable_where_the_naive_estimator_overflows() -> None:
    """exp(l_i) overflows float64 here (l_i in the thousands); the estimate must stay finite and
    between log(mean) >= max l - log m and max l + log(1 + t / sqrt(m - 1)), over T."""
    d, sigma, q, total, gamma = np.array([0.1, 0.5, 2.0, 3.0, 3.0]), 1.0, 0.5, 1000, 1e-6
    acc = BayesianAccountant((4, 16), total_steps=total, failure_probability=gamma)
    cost = acc.step_cost(d, sigma, q) * total
    ell = np.array([[total * logsumexp(binom.logpmf(np.arange(lam + 2), lam + 1, q)
                                       + (np.arange(lam + 2) ** 2 - np.arange(lam + 2))
                                       * di**2 / (2 * sigma**2)) for lam in (4, 16)]
                    for di in d])
    assert ell.max() > 1000 and np.all(np.isfinite(cost))
    t = student_t.isf(gamma, len(d) - 1)
    assert np.all(cost >= ell.max(axis=0) - np.log(len(d)))
    assert np.all(cost <= ell.max(axis=0) + np.log1p(t / np.sqrt(len(d) - 1)))


def test_delta_and_epsilon_are_inverse_and_include_the_failure_probability() -> None:
    acc = BayesianAccountant(total_steps=100, failure_probability=1e-8)
    for _ in range(100):
        acc.accumulate(np.linspace(0.01, 0.1, 64), 0.2, 0.05)
    assert acc.failure_probability == pytest.approx(1 - (1 - 1e-8) ** 100, rel=1e-9)
    eps = acc.get_epsilon(1e-5)
    assert acc.get_delta(eps) == pytest.approx(1e-5, rel=1e-9)
    # at a huge epsilon only the estimator's failure probability is left in delta
    assert acc.get_delta(1e6) == pytest.approx(acc.failure_probability, rel=1e-9)
    with pytest.raises(ValueError, match="failure probability"):
        acc.get_epsilon(0.5 * acc.failure_probability)


def test_default_confidence_is_one_minus_2_to_the_minus_53() -> None:
    acc = BayesianAccountant()
    assert acc.gamma == 2.0**-53  # 1 - 1e-16 rounds to 1 - 2^-53 in float64
    assert BayesianAccountant(failure_probability=1e-16).gamma == 1e-16


def test_errors() -> None:
    acc = BayesianAccountant(total_steps=2)
    with pytest.raises(ValueError, match="at least 3"):
        acc.accumulate([0.1, 0.2], 1.0, 0.1)
    acc.accumulate([0.1, 0.2, 0.3], 1.0, 0.1, steps=2)
    with pytest.raises(ValueError, match="total_steps"):
        acc.accumulate([0.1, 0.2, 0.3], 1.0, 0.1)
    for bad in ({"moments": (2.5,)}, {"moments": ()}, {"total_steps": 0}, {"confidence": 1.0}):
        with pytest.raises(ValueError):
            BayesianAccountant(**bad)
    with pytest.raises(ValueError):
        acc.step_cost([0.1, -0.2, 0.3], 1.0, 0.1)


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(3)
    d = rng.uniform(0.0, 0.1, (30, 16))
    np.save(tmp_path / "d.npy", d)
    code = main(["epsilon", "bayesian", "--distances", str(tmp_path / "d.npy"),
                 "--noise-std", "0.15", "--sampling-rate", "0.04", "--delta", "1e-5",
                 "--moments", "2,4,8", "--confidence", "0.99999999", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"epsilon", "moment"}
    acc = BayesianAccountant((2, 4, 8), total_steps=30, confidence=0.99999999)
    for row in d:
        acc.accumulate(row, 0.15, 0.04)
    assert out["epsilon"] == pytest.approx(acc.get_epsilon(1e-5))
    assert out["moment"] == acc.epsilon_and_moment(1e-5)[1]


def test_cli_rejects_a_delta_below_the_failure_probability(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "d.npy", np.full((10, 4), 0.05))
    code = main(["epsilon", "bayesian", "--distances", str(tmp_path / "d.npy"),
                 "--noise-std", "0.1", "--sampling-rate", "0.04", "--delta", "1e-6",
                 "--confidence", "0.99"])
    err = capsys.readouterr().err
    assert code == 2 and "fails with probability" in err and err.count("\n") == 1
    # a confidence so low that no delta could be covered: said before any work, no warning
    code = main(["epsilon", "bayesian", "--distances", str(tmp_path / "d.npy"),
                 "--noise-std", "0.1", "--sampling-rate", "0.04", "--delta", "1e-5",
                 "--confidence", "0.5"])
    err = capsys.readouterr().err
    assert code == 2 and err == ("pate: error: at confidence 0.5 per step the estimate of 10 "
                                 "steps fails with probability 0.999, not below delta=1e-05: "
                                 "raise the confidence\n")
    # no noise to speak of: epsilon is infinite, said without numpy's warnings
    assert main(["epsilon", "bayesian", "--distances", str(tmp_path / "d.npy"), "--noise-std",
                 "1e-200", "--sampling-rate", "0.04", "--delta", "1e-5", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["epsilon"] == float("inf") and err == ""


@pytest.mark.parametrize(("write", "message"), [
    (lambda p: np.savez(p / "d.npz", d=np.full((10, 4), 0.05)), "not an .npz archive"),
    (lambda p: np.save(p / "d.npy", np.full((10, 4), -0.05)), "d.npy: distances must be "
                                                              "finite and non-negative"),
    (lambda p: np.save(p / "d.npy", np.full(10, 0.05)), "numeric array [steps >= 1, pairs"),
    (lambda p: np.save(p / "d.npy", np.zeros((0, 10))), "got shape [0, 10]"),
    (lambda p: (p / "d.npy").write_text("hello"), "d.npy: not a readable .npy file of "
                                                  "distances (ValueError)"),
    (lambda p: (p / "d.npy").write_bytes(b""), "d.npy: not a readable .npy file of "
                                               "distances (EOFError)"),  # an internal error
])
def test_cli_refuses_distances_that_are_not_a_plain_array_of_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], write, message: str) -> None:
    write(tmp_path)
    path = next(tmp_path.glob("d.*"))
    code = main(["epsilon", "bayesian", "--distances", str(path), "--noise-std", "1",
                 "--sampling-rate", "0.01", "--delta", "1e-5"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("flags", "message"), [
    (["--delta", "0"], "delta must be in (0, 1), got 0.0"),  # was said as the confidence's
    (["--moments", "2,100000000"], "moments must be at most 1024, got 100000000"),  # 24 GB
])
def test_cli_refuses_a_delta_or_moment_out_of_range(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
        message: str) -> None:
    np.save(tmp_path / "d.npy", np.full((10, 4), 0.05))
    code = main(["epsilon", "bayesian", "--distances", str(tmp_path / "d.npy"),
                 "--noise-std", "1", "--sampling-rate", "0.01", "--delta", "1e-5", *flags])
    err = capsys.readouterr().err
    assert code == 2 and err == f"pate: error: {message}\n"

"""The released smooth-sensitivity-sanitised epsilon (``student.sanitised``,
``analysis.votes_analysis.sanitised_release``): noise is drawn, once per set of answers, kept,
and later releases pay for the earlier ones."""

from __future__ import annotations

import contextlib
import json
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from analysis.costs import realised_rdp_independent
from analysis.mechanisms import ConfidentGNMax, InteractiveGNMax
from analysis.orders import default_orders
from analysis.rdp import epsilon_curve, epsilon_from_rdp
from analysis.smooth_sensitivity import gnss_rdp
from analysis.votes_analysis import (
    RELEASE_MARGIN,
    EarlierRelease,
    PrivacyAnalysis,
    QuerySegment,
    analyze_segments,
    sanitised_release,
)
from pate.aggregation.ledger import Ledger
from pate.data.synthetic import synthetic_votes
from pate.errors import UserError
from student.sanitised import (
    Release,
    Releases,
    answers_digest,
    ledger_releases,
    run_file_releases,
)

MECHANISM = ConfidentGNMax(threshold=200, sigma1=150, sigma2=40)
VOTES = synthetic_votes(300, 250, 10, seed=4)


def analyse(rows: int, earlier: list[EarlierRelease] | None = None) -> PrivacyAnalysis:
    return analyze_segments([QuerySegment(VOTES[:rows], MECHANISM)], 1e-5, earlier=earlier)


def test_the_release_is_the_bound_plus_noise_and_two_deviations() -> None:
    bound = analyse(300).smooth_sensitivity
    assert bound is not None and not bound.fallback and bound.value > 0
    std = bound.value * bound.sigma
    assert sanitised_release(bound, -RELEASE_MARGIN, 1e-5) == pytest.approx(bound.epsilon)
    for z in (-1.0, 0.0, 1.5):
        assert sanitised_release(bound, z, 1e-5) == pytest.approx(float(epsilon_curve(
            bound.rdp + std * (z + RELEASE_MARGIN), bound.order, 1e-5)))
    assert sanitised_release(bound, 0.0, 1e-5) > bound.epsilon


def test_a_release_is_drawn_once_per_set_of_answers_and_kept(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"

    @contextlib.contextmanager
    def kept(also: list[Release] | None = None) -> Iterator[Releases]:
        ledger = Ledger(url, default_orders(), 1e-5, 10.0)
        try:
            with ledger_releases(ledger, also) as releases:
                yield releases
        finally:
            ledger.close()

    with kept() as releases:
        first = releases.release(200, lambda earlier: analyse(200, earlier), answers="a")
    assert first is not None
    with kept() as releases:  # another object, as another run or process would open it
        assert releases.release(200, lambda earlier: pytest.fail("analysed again"),
                                answers="a") == first
    # the noise is drawn afresh for another body of answers (OS entropy: no two draws alike)
    draws = {Releases().release(200, lambda earlier: analyse(200, earlier)) for _ in range(4)}
    assert len(draws) == 4
    # a release for other answers pays for the first: its analysis composes the first's cost,
    # and for those an earlier version recorded in a run's file
    legacy = Release(100, 1.5, 0.01, 3.0)
    seen: list[list[EarlierRelease]] = []
    with kept([legacy]) as releases:
        second = releases.release(300, lambda earlier: seen.append(earlier) or analyse(
            300, earlier), answers="b")
    assert second is not None
    with kept() as releases:
        stored = releases.records
    assert [(r.queries, r.answers) for r in stored] == [(200, "a"), (300, "b")]
    with kept([legacy]) as releases:  # the run's own first 100 answers: released before
        assert releases.release(100, lambda earlier: pytest.fail("drawn again"),
                                answers="c") == 1.5
    assert seen == [[EarlierRelease(0.01, 3.0), EarlierRelease(stored[0].beta,
                                                               stored[0].sigma)]]
    assert stat.S_IMODE((tmp_path / "ledger.db").stat().st_mode) == 0o600


def test_the_digest_of_answers_is_that_of_their_set_however_asked() -> None:
    """One digest for the same rows of the same mechanisms and votes, in any order and any
    split into rounds or requests (``pate run``'s rounds, one ``PrivateLabels``); another row,
    mechanism, votes or probability sent is another set of answers."""
    confident = ConfidentGNMax(150.0, 40.0, 20.0)
    interactive = InteractiveGNMax(100.0, 40.0, 20.0, 0.5)
    rows, probs = np.arange(10), np.random.default_rng(0).dirichlet(np.ones(3), size=6)
    both = answers_digest("v", [(confident, rows[:4], None), (interactive, rows[4:], probs)])
    turn = np.arange(6)[::-1]
    assert answers_digest("v", [(interactive, rows[4:][turn], probs[turn]),
                                (confident, rows[[3, 1]], None),
                                (confident, rows[[0, 2]], None)]) == both
    assert len({both, answers_digest("w", [(confident, rows[:4], None),
                                           (interactive, rows[4:], probs)]),
                answers_digest("v", [(confident, rows[:5], None),
                                     (interactive, rows[5:], probs[1:])]),
                answers_digest("v", [(confident, rows[:4], None),
                                     (interactive, rows[4:], probs[turn])]),
                answers_digest("v", [(ConfidentGNMax(150.0, 40.0, 21.0), rows[:4], None),
                                     (interactive, rows[4:], probs)])}) == 5


def test_earlier_releases_cost_what_theorem_23_says() -> None:
    alone = analyse(300).smooth_sensitivity
    earlier = EarlierRelease(beta=0.3 / alone.order, sigma=5.0)
    after = analyse(300, [earlier]).smooth_sensitivity
    assert after.epsilon > alone.epsilon
    # at the order it settles on, the total is the answers' RDP plus Theorem 23's for the
    # earlier release, plus this release's cost
    at = analyze_segments([QuerySegment(VOTES, MECHANISM)], 1e-5,
                          order=after.order).smooth_sensitivity
    assert after.rdp - after.rdp_cost == pytest.approx(
        at.rdp - at.rdp_cost + gnss_rdp(earlier.beta, earlier.sigma, after.order))
    # an order outside the earlier release's range cannot compose with it
    assert after.order < 1.0 / (2.0 * earlier.beta)


@pytest.mark.parametrize("record", [
    {"queries": "200", "epsilon": 2.0}, {"queries": 200, "epsilon": 2.0, "beta": 0.0,
                                         "sigma": 5.0},
    {"queries": 200, "epsilon": 2.0, "beta": "0.02", "sigma": 5.0},
    {"queries": 200, "epsilon": 2.0, "beta": 0.02, "sigma": None},
    {"queries": 200, "epsilon": 2.0, "beta": 0.02, "sigma": -5.0}, {"queries": 200}])
def test_a_damaged_record_of_releases_is_one_error(tmp_path: Path, record: dict) -> None:
    path = tmp_path / "sanitised-releases.json"
    path.write_text(json.dumps([record]))
    with pytest.raises(UserError, match="not a record of sanitised releases"):
        run_file_releases(path)


def test_no_figure_without_noise_follows_a_noisy_release() -> None:
    """A fallback (or a total of smooth sensitivity 0) has no noise to hide the earlier
    releases' cost, whose sigma_ss was chosen from the votes: nothing is released."""
    releases = Releases()
    assert releases.release(200, lambda earlier: analyse(200, earlier)) is not None
    fallback = analyze_segments([QuerySegment(np.array([[7, 7, 6]] * 10),
                                              ConfidentGNMax(14, 4, 2))], 1e-5)
    assert fallback.smooth_sensitivity.fallback
    assert releases.release(300, lambda earlier: fallback) is None


def test_a_fallback_is_never_released() -> None:
    """Where C5/C6 fail the sanitised bound is the data-independent one of every query
    answered: at least what the ledger charged for the answers (here 3 of 10 answered), so
    publishing it would only weaken the guarantee. Nothing is released, nor kept."""
    mechanism = ConfidentGNMax(14, 4, 2)
    fallback = analyze_segments([QuerySegment(np.array([[7, 7, 6]] * 10), mechanism)], 1e-5)
    orders = default_orders()
    charged, _ = epsilon_from_rdp(realised_rdp_independent(mechanism, 10, 3, orders), orders,
                                  1e-5)
    assert fallback.smooth_sensitivity.epsilon > charged
    releases = Releases()
    assert releases.release(10, lambda earlier: fallback) is None
    assert releases.records == []

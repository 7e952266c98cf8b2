"""``pate audit mechanism``: the audit passes on the real aggregators and fails when their noise
is broken on purpose (sigma halved while the bound assumes sigma; one draw reused across the
queries of a call)."""

import json
from dataclasses import replace

import numpy as np
import pytest

from analysis.costs import steps
from analysis.mechanisms import Mechanism
from pate.aggregation.aggregators import Aggregator
from pate.audit.mechanism import (
    DEFAULT_DRAWS,
    DEFAULT_MECHANISMS,
    MAX_PAIRS,
    PAPER_MECHANISMS,
    POWERED_DRAWS,
    audit_mechanism,
    audit_mechanisms,
    build_aggregator,
    ladder,
)
from pate.cli.main import main

HALVED = {"lnmax": {"scale": 1.0}, "gnmax": {"sigma": 3.0},
          "confident": {"sigma1": 2.5, "sigma2": 5.0},
          "interactive": {"sigma1": 2.5, "sigma2": 5.0}}


class ReusedNoise(Aggregator):
    """A broken aggregator: one noise draw shared by every query of a call."""

    def noise(self, step, shape):
        return np.broadcast_to(super().noise(step, shape[1:]), shape)


@pytest.mark.parametrize("mechanism", [*DEFAULT_MECHANISMS.values(),
                                       *PAPER_MECHANISMS.values()])
def test_ladder_pairs_are_neighbours(mechanism: Mechanism) -> None:
    rungs = ladder(mechanism)
    assert rungs.pairs.shape[0] <= MAX_PAIRS and np.all(rungs.histograms >= 0)
    assert np.array_equal(np.unique(rungs.pairs), np.arange(len(rungs.histograms)))
    pairs = rungs.histograms[rungs.pairs]
    step = pairs[:, 1] - pairs[:, 0]
    assert np.all(np.abs(step[:, :2]).sum(axis=1) == 2) and np.all(step.sum(axis=1) == 0)
    assert np.all(step[:, 2:] == 0)
    assert rungs.pairs[0, 0] == 0
    first = rungs.histograms[0]
    select = steps(mechanism).select
    if select is None:
        assert abs(first[0] - first[1]) <= 1  # rung 0 is a tie
    else:
        assert select.inputs(first[None], None if rungs.baseline() is None
                             else rungs.baseline()[:1])[0] == select.threshold


def test_real_aggregators_pass() -> None:
    audits = audit_mechanisms(draws=100_000)
    assert [a.mechanism.name for a in audits] == list(DEFAULT_MECHANISMS)
    for a in audits:
        assert a.passed, a.failures
        assert 0.0 < a.epsilon_lower <= min(a.epsilon_upper, a.epsilon_upper_dependent)
        assert len(a.noise) >= 3


def test_papers_parameters_and_too_few_draws_are_reported_not_powered() -> None:
    audits = audit_mechanisms(["gnmax"], draws=20_000, paper=True)
    assert [a.mechanism for a in audits] == [DEFAULT_MECHANISMS["gnmax"], PAPER_MECHANISMS["gnmax"]]
    assert all(a.passed for a in audits)  # 20 000 draws: a pass that means little, said so
    assert [a.to_dict()["powered"] for a in audits] == [False, False]
    assert POWERED_DRAWS == DEFAULT_DRAWS == 10**6


@pytest.mark.parametrize("name", list(DEFAULT_MECHANISMS))
def test_halved_sigma_fails(name: str) -> None:
    mechanism = DEFAULT_MECHANISMS[name]
    broken = build_aggregator(replace(mechanism, **HALVED[name]))
    audit = audit_mechanism(mechanism, draws=400_000, aggregator=broken)
    assert not audit.passed
    assert audit.epsilon_lower > audit.epsilon_upper_dependent
    assert any(f.startswith("privacy bug") for f in audit.failures)
    assert any("noise of scale" in t.test and not t.passed for t in audit.noise)


@pytest.mark.parametrize("name", list(DEFAULT_MECHANISMS))
def test_reused_noise_fails(name: str) -> None:
    mechanism = DEFAULT_MECHANISMS[name]
    audit = audit_mechanism(mechanism, draws=20_000, aggregator=ReusedNoise(mechanism))
    assert not audit.passed
    failed = [t.test for t in audit.noise if not t.passed]
    assert any("independent across queries" in t for t in failed)
    assert any("adjacent queries of one call" in t for t in failed)


def test_cli_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["audit", "mechanism", "--mechanism", "gnmax", "lnmax", "--draws", "20000",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True
    rows = out["mechanisms"]
    assert [r["mechanism"] for r in rows] == ["gnmax", "lnmax"]
    for r in rows:
        assert {"mechanism", "epsilon_lower", "epsilon_upper", "delta", "confidence", "draws",
                "pair"} <= set(r)
        assert r["draws"] == 20_000 and r["delta"] == 1e-5 and r["confidence"] == 0.95
        a, b = (np.array(h) for h in r["pair"])
        assert np.abs(a - b).sum() == 2 and a.sum() == b.sum()



def test_cli_text_names_each_mechanism_with_its_parameters(capsys: pytest.CaptureFixture
                                                           ) -> None:
    """With ``--paper`` a mechanism is audited twice: each line says which parameters it ran."""
    assert main(["audit", "mechanism", "--mechanism", "gnmax", "--draws", "20000", "--paper",
                 "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("delta = 1e-05, confidence 0.95, 20000 draws per histogram, improved "
                        "conversion")
    assert [line.split(":")[0] for line in lines[1:]] == [
        f"gnmax (sigma={m.sigma:g})" for m in (DEFAULT_MECHANISMS["gnmax"],
                                               PAPER_MECHANISMS["gnmax"])]
    assert all(line.endswith("(not powered, not relied on: too few draws to tell the noise "
                             "from half of it)") for line in lines[1:])


@pytest.mark.parametrize("args", [["--draws", "10"], ["--draws", str(10**20)], ["--delta", "2"],
                                  ["--confidence", "1"]])
def test_cli_bad_input(capsys: pytest.CaptureFixture, args: list[str]) -> None:
    assert main(["audit", "mechanism", "--mechanism", "gnmax", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pate: error:") and "\n" not in err


@pytest.mark.slow
def test_full_audit() -> None:
    """The default audit (10^6 draws): every mechanism passes in under a minute, and the GNMax
    lower bound is at least half its analytic bound."""
    audits = {a.mechanism.name: a for a in audit_mechanisms()}
    for a in audits.values():
        assert a.passed, a.failures
        assert a.seconds < 60
    gnmax = audits["gnmax"]
    assert gnmax.epsilon_lower >= gnmax.epsilon_upper / 2

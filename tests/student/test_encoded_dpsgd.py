"""DP-SGD with gradient encoding (student.gradient_encoding, student.encoded_dpsgd): the encoder
against a brute force, the noise's goodness of fit, a tiny run, and the CLI flags of ``pate dpsgd
train`` and ``pate epsilon dpsgd``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from analysis.encoding_profiles import sorted_profiles
from analysis.noise_families import noise_family
from analysis.sampled_gaussian import dpsgd_epsilon
from pate.cli.main import main
from student.choices import DEFAULT_CNN_PARAMETERS
from student.dpsgd import secure_generator, tempered_cnn
from student.encoded_dpsgd import EncodingConfig
from student.gradient_encoding import (
    ProfileChooser,
    clip_flat,
    draw_noise,
    encode,
    float32_profiles,
)


def _brute_force(g: np.ndarray, profiles: np.ndarray) -> tuple[np.ndarray, int]:
    """Algorithm 2 one example at a time: the exact sort, every cosine similarity; the encoded
    vector and the index of the chosen profile."""
    order = np.argsort(-np.abs(g), kind="stable")
    m = np.abs(g)[order]
    cosine = [m @ p / (np.linalg.norm(m) * np.linalg.norm(p)) for p in profiles]
    best = int(np.argmax(cosine))
    out = np.zeros_like(g)
    out[order] = np.clip(g[order], -profiles[best], profiles[best])
    return out, best


def test_encoder_matches_brute_force_and_is_dominated() -> None:
    rng = np.random.default_rng(0)
    d, c = 12, 0.1
    # Magnitudes at least 5 % apart, so the radix sort's bfloat16 keys order them exactly.
    grads = np.stack([rng.permutation(rng.choice([1.05, 1.2, 1.5, 2.0]) ** np.arange(d))
                      * rng.choice([-1, 1], d) * rng.uniform(1e-4, 1e-2)
                      for _ in range(40)]).astype(np.float32)
    profiles = np.stack([np.sort(rng.exponential(size=d))[::-1] ** e
                         for e in (0.25, 0.5, 1.0, 2.0, 4.0)])
    profiles /= np.linalg.norm(profiles, axis=1, keepdims=True)
    p32 = (float32_profiles(profiles) * c).numpy()
    ours = encode(torch.from_numpy(grads), torch.from_numpy(p32)).numpy()
    chosen = set()
    for g, e in zip(grads, ours, strict=True):
        expected, best = _brute_force(g, p32)
        chosen.add(best)
        np.testing.assert_array_equal(e, expected)
        assert np.linalg.norm(e) <= c * (1 + 1e-6)
        # dominated by the chosen profile: sorted magnitudes below it coordinate by coordinate
        assert np.all(np.sort(np.abs(e))[::-1] <= p32[best])
        assert np.all(np.sign(e) * np.sign(g) >= 0)
    assert len(chosen) > 1  # several profiles chosen: the choice is really tested


@pytest.mark.parametrize("block", [4, 16, 64])
def test_pruned_choice_is_the_full_products_argmax(block: int) -> None:
    """The block bounds only discard profiles that cannot win: the choice equals the argmax of
    the full product, on heavy-tailed sorted magnitudes, flat ones (whole blocks of ties), zeros,
    and a dimension that is not a multiple of the block."""
    rng = np.random.default_rng(1)
    d = 2003
    profiles = float32_profiles(sorted_profiles(300, d, 5), 0.1)
    rows = np.abs(rng.standard_t(3, size=(64, d))) * rng.uniform(1e-4, 1e-1, size=(64, 1))
    rows[:8] = np.round(rows[:8], 1)  # ties: flat blocks
    rows[8] = 0.0
    rows[9, :100] = 5.0  # a plateau at the head
    m = torch.from_numpy(np.sort(rows.astype(np.float32), axis=1)[:, ::-1].copy())
    chosen = ProfileChooser(profiles, block)(m)
    full = m @ profiles.T
    best = full.max(1).values
    picked = full[torch.arange(len(m)), chosen]
    # the chosen score is the maximum (up to float32 ties between nearly equal profiles)
    torch.testing.assert_close(picked, best, rtol=1e-6, atol=0.0)
    assert (chosen == full.argmax(1)).float().mean() > 0.95
    assert len(set(chosen.tolist())) > 5  # many profiles win: the choice is really tested


def test_float32_profiles_never_exceed_the_accounted_values() -> None:
    p = sorted_profiles(3, 5000, 0)
    assert np.all(float32_profiles(p).numpy().astype(np.float64) <= p)


def test_clip_flat_is_opacus_clipping() -> None:
    g = torch.tensor([[3.0, 4.0], [0.03, 0.04]])
    np.testing.assert_allclose(clip_flat(g, 1.0).norm(dim=1).numpy(), [1.0, 0.05], rtol=1e-5)


@pytest.mark.parametrize("name,dist", [
    ("gaussian", stats.norm(scale=0.3)),
    ("student-t", stats.t(df=9.0, scale=0.3 * np.sqrt(7 / 9))),
    ("laplace", stats.laplace(scale=0.3 / np.sqrt(2))),
])
def test_noise_fits_its_family_and_scale(name: str, dist) -> None:
    gen, _ = secure_generator()
    x = draw_noise(noise_family(name), 0.3, 40_000, gen).numpy().astype(np.float64)
    assert stats.kstest(x, dist.cdf).pvalue > 1e-4
    assert np.std(x) == pytest.approx(0.3, rel=0.03)


def test_config_refuses_unaccounted_settings() -> None:
    with pytest.raises(ValueError, match="encoded gradients only"):
        EncodingConfig(noise="laplace")
    with pytest.raises(ValueError, match="dof > 2"):
        EncodingConfig(noise="student-t", dof=1.5, encode=10)
    with pytest.raises(ValueError, match="denoise"):
        EncodingConfig(denoise="wiener")
    assert EncodingConfig().plain and not EncodingConfig(denoise="ks").plain


def test_default_dimension_is_the_default_cnn() -> None:
    model = tempered_cnn((1, 28, 28), 10, 0.0, 1.0)
    assert sum(p.numel() for p in model.parameters()) == DEFAULT_CNN_PARAMETERS


def _train_cli(run: Path, *flags: str) -> dict:
    assert main(["dpsgd", "train", "--run", str(run), "--dataset", "digits",
                 "--noise-multiplier", "1.5", "--epochs", "1", "--batch-size", "512",
                 *flags, "--json"]) == 0
    metrics = json.loads((run / "dpsgd" / "metrics.json").read_text())
    assert 0 < metrics["epsilon"] < np.inf and "epsilon_bayesian" not in metrics
    return metrics


def test_cli_trains_encoded_gaussian_with_denoising(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    m = _train_cli(tmp_path / "run", "--encode", "20", "--denoise", "ks")
    assert m == json.loads(capsys.readouterr().out)
    assert m["noise"] == "gaussian" and 0 < m["denoise_mean_factor"] < 1
    assert m["encoding"]["encode"] == 20
    # Gaussian noise: the plain DP-SGD epsilon
    assert m["epsilon"] == dpsgd_epsilon(m["sampling_rate"], 1.5, m["steps"], 1e-5)[0]


@pytest.mark.slow
def test_cli_trains_encoded_student_t_as_pate_epsilon_accounts_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = _train_cli(tmp_path / "run", "--noise", "student-t", "--encode", "20")
    capsys.readouterr()
    assert main(["epsilon", "dpsgd", "--sampling-rate", str(m["sampling_rate"]),
                 "--noise-multiplier", "1.5", "--steps", str(m["steps"]), "--delta", "1e-5",
                 "--noise", "student-t", "--encode", "20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] == pytest.approx(m["epsilon"],
                                                                           rel=1e-12)


def test_cli_epsilon_gaussian_is_the_plain_figure(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ([], ["--noise", "gaussian", "--encode", "1000"]):
        assert main(["epsilon", "dpsgd", "--sampling-rate", "0.034", "--noise-multiplier", "1.1",
                     "--steps", "1160", "--delta", "1e-5", "--json", *extra]) == 0
        eps, order = dpsgd_epsilon(0.034, 1.1, 1160, 1e-5)
        assert json.loads(capsys.readouterr().out) == {"epsilon": eps, "order": order,
                                                       "conversion": "improved"}


@pytest.mark.parametrize("args,message", [
    (["--noise", "laplace"], "encoded gradients only"),
    (["--noise", "student-t", "--dof", "2", "--encode", "5"], "dof > 2"),
    (["--noise", "student-t", "--encode", "0"], "at least 1 profile"),
    (["--noise", "laplace", "--encode", "5", "--encode-seed", "-1"],
     "the profiles' seed (encode_seed) must be in [0, 2^63), got -1"),
    (["--noise-multiplier", "inf"], "must be a finite number > 0, got inf"),  # the last one
    # refused before allocating: 1e8 profiles of the default CNN's size would take 19 TiB
    (["--noise", "laplace", "--encode", "100000000"], "Psi is limited to 4 GiB"),
])
def test_cli_epsilon_refuses_in_one_line(args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["epsilon", "dpsgd", "--sampling-rate", "0.03", "--noise-multiplier", "1",
                 "--steps", "10", "--delta", "1e-5", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and message in err


def test_cli_train_refuses_in_one_line(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dpsgd", "train", "--run", str(tmp_path / "r"), "--dataset", "digits",
                 "--noise-multiplier", "1", "--noise", "laplace"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "encoded gradients only" in err
    assert main(["dpsgd", "train", "--run", str(tmp_path / "r"), "--dataset", "digits",
                 "--noise-multiplier", "1", "--noise", "laplace", "--encode", "5",
                 "--encode-seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "encode_seed must be in [0, 2^63)" in err

"""Noise families for DP-SGD with gradient encoding (Nasr, Shokri, Houmansadr 2020, "Improving
Deep Learning with Differential Privacy using Gradient Encoding and Denoising", Algorithm 1):
each family is a scipy distribution at unit standard deviation, so that noise of standard
deviation ``sigma * C`` is ``sigma * C`` times a draw and families compare at equal variance
(docs/privacy-math.md §10).

- ``gaussian``: N(0, 1).
- ``student-t``: the non-standardised Student-t with ``dof`` > 2 and scale sqrt((dof - 2) / dof).
- ``laplace``: Laplace with scale 1 / sqrt(2).

Also the denoiser (``ks_distance``), which needs only the family's public CDF.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

NOISE_FAMILIES = ("gaussian", "student-t", "laplace")
DENOISERS = ("none", "ks")
DEFAULT_DOF = 9.0
# Points (in standard deviations) where a density must equal its mirror image to be symmetric.
_SYMMETRY_PROBE = np.linspace(0.0, 12.0, 241)
_SYMMETRY_RTOL = 1e-9


@dataclass(frozen=True)
class NoiseFamily:
    """A noise density of standard deviation 1: its log-density, CDF and quantile function
    (vectorised), and the scale parameter of the family at that standard deviation."""

    name: str
    logpdf: Callable[[NDArray[np.float64]], NDArray[np.float64]]
    cdf: Callable[[NDArray[np.float64]], NDArray[np.float64]]
    ppf: Callable[[NDArray[np.float64]], NDArray[np.float64]]
    scale: float


def _laplace_logpdf(scale: float) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """-|x| / b - log 2b, exact in the far tails (scipy's takes the log of an underflowed pdf)."""
    return lambda x: -np.abs(x) / scale - np.log(2.0 * scale)


def noise_family(name: str, dof: float = DEFAULT_DOF) -> NoiseFamily:
    """The family ``name`` (one of ``NOISE_FAMILIES``) at unit standard deviation: Student-t of
    ``dof`` degrees of freedom has scale sqrt((dof - 2) / dof), Laplace scale 1 / sqrt(2)
    (the variances dof s^2 / (dof - 2) and 2 b^2 set to 1)."""
    from scipy import stats  # here: the names above are read by the config, which needs no scipy

    if name == "gaussian":
        return NoiseFamily(name, stats.norm.logpdf, stats.norm.cdf, stats.norm.ppf, 1.0)
    if name == "student-t":
        if not dof > 2.0:
            raise ValueError(f"Student-t noise needs dof > 2 (finite variance), got {dof!r}")
        dist = stats.t(df=dof, scale=float(np.sqrt((dof - 2.0) / dof)))
        return NoiseFamily(name, dist.logpdf, dist.cdf, dist.ppf, float(dist.kwds["scale"]))
    if name == "laplace":
        scale = float(np.sqrt(0.5))
        dist = stats.laplace(scale=scale)
        return NoiseFamily(name, _laplace_logpdf(scale), dist.cdf, dist.ppf, scale)
    raise ValueError(f"noise must be one of {', '.join(NOISE_FAMILIES)}, got {name!r}")


def check_symmetric(family: NoiseFamily) -> None:
    """Refuse a density that is not symmetric about 0: the reduction of the paper's eq. 14 (one
    record shifts the noise's centre by at most psi, in either sign) needs z(x) = z(-x)."""
    left = family.logpdf(-_SYMMETRY_PROBE)
    right = family.logpdf(_SYMMETRY_PROBE)
    if not np.allclose(left, right, rtol=_SYMMETRY_RTOL, atol=1e-12):
        raise ValueError(f"noise family {family.name!r} is not symmetric about 0: its RDP "
                         "cannot be bounded by the encoded-gradient analysis")


def ks_distance(noisy: NDArray[np.float64], family: NoiseFamily, std: float) -> float:
    """The denoising factor of Nasr, Shokri, Houmansadr 2020 (§3.2): the Kolmogorov-Smirnov
    distance sup_x |F_n(x) - F(x / std)| between the empirical distribution of the noisy
    vector's coordinates and the noise distribution (public), in [0, 1]. It reads only the noisy
    vector, so scaling by it is post-processing."""
    from scipy import stats

    return float(stats.kstest(np.asarray(noisy, np.float64) / std, family.cdf).statistic)

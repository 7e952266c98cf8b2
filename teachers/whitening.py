"""Fixed features whitened on the public pool: the maps of the ``hog-scatter-whitened`` teachers.

A linear expert on HOG or scattering features learns from a few hundred private rows, and 250 of
them trained on the features as they are make much the same mistakes. Projected on the leading
principal components of the public pool's features, each component rescaled towards unit
variance, every direction the pool's images vary along starts on an equal footing: each teacher
learns its own weights along all of them, so the teachers' errors agree less and their vote is
better. The rescaling is a shrunk PCA whitening: component k is divided by
sqrt(v_k + a * mean(v)), v_k the pool's variance along it and mean(v) the mean over the K kept
components (a = 0: full PCA whitening, A. Kessy, A. Lewin, K. Strimmer, "Optimal Whitening and
Decorrelation", The American Statistician 72, 2018, §3; large a: the plain projection,
rescaled). Adding a multiple of the mean variance to each is in the spirit of shrinking a
covariance towards a multiple of the identity (O. Ledoit, M. Wolf, J. Multivariate Anal. 88,
2004), with a fixed a rather than their estimated one.

Privacy: the map is fitted on the public pool alone (its mean and principal directions), never
on the private split, so it costs no privacy, as the pool encoder (:mod:`teachers.pool_encoder`)
does not; the student sees the same pool.

Measured on Fashion-MNIST (250 teachers of about 240 rows dealt by record, AdamW, batch 32, 20
epochs; docs/reproductions.md): at 128 components and a = 1 the mean teacher rose from 0.771 to
0.784 and the plurality from 0.851 to 0.877 on the evaluation half (0.856 to 0.870 on the
pool), with as many answers expected at the same epsilon; the main job's student rose from
0.820 to 0.831. Fitting the map takes seconds (the pool's scattering and one eigendecomposition
of a 3 969-square covariance).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import scipy.linalg
import torch

from teachers.fixed_maps import FixedMap, feature_table
from teachers.hog import HOG
from teachers.scattering import Scattering

COMPONENTS = 128
SHRINKAGE = 1.0
# The maps whitened, by the prefix of their tensors' names.
MAPS = ("hog", "scatter")


def _inner(name: str, in_shape: tuple[int, int, int]) -> FixedMap:
    return HOG() if name == "hog" else Scattering(in_shape)


def pool_whitening(features: torch.Tensor, components: int, shrinkage: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean [F], projection [F, K])`` of the rows ``features [n, F]``: ``(z - mean) @
    projection`` is a row's coordinates on the K = min(components, F, n - 1) leading principal
    components (at least 1), component k divided by sqrt(v_k + shrinkage * mean(v)), v the
    variances along the K components; components of no variance (below 1e-10 of the first's)
    are dropped. In float64, from the leading eigenvectors alone (LAPACK's
    ``syevr`` on an index range: 4 times faster than a whole SVD for scattering's 3 969
    features) of the covariance ``[F, F]``, or where the rows are fewer than the features of
    their Gram matrix ``[n, n]``, whose eigenvector u_k gives the component X^T u_k / ||X^T u_k||
    (the same, for a smaller matrix: CIFAR-10's scattering has 15 552 features)."""
    rows = features.detach().cpu().double()
    mean = rows.mean(0)
    centred = (rows - mean).numpy()
    n, width = centred.shape
    k = max(1, min(components, width, n - 1))
    by_rows = n < width
    gram = (centred @ centred.T if by_rows else centred.T @ centred) / n
    size = gram.shape[0]
    variance, vectors = scipy.linalg.eigh(gram, subset_by_index=[size - k, size - 1],
                                          driver="evr")
    variance, vectors = np.clip(variance[::-1], 0.0, None), vectors[:, ::-1]  # leading first
    kept = max(1, int((variance > 1e-10 * variance[0]).sum()))
    variance, vectors = variance[:kept], vectors[:, :kept]
    if by_rows:
        vectors = centred.T @ vectors
        vectors /= np.maximum(np.linalg.norm(vectors, axis=0), 1e-300)
    scale = 1.0 / np.sqrt(variance + shrinkage * variance.mean() + 1e-12)
    return (mean.float(),
            torch.as_tensor(np.ascontiguousarray(vectors * scale), dtype=torch.float32))


def fit_whitening(pool_x: np.ndarray, components: int = COMPONENTS,
                  shrinkage: float = SHRINKAGE) -> dict[str, np.ndarray]:
    """The whitening of HOG's and scattering's features of the public pool ``pool_x
    [n, C, H, W]``: ``{"hog.mean", "hog.projection", "scatter.mean", "scatter.projection"}``
    (:func:`pool_whitening`), as CPU arrays for :class:`Whitened`."""
    x = torch.as_tensor(np.ascontiguousarray(pool_x), dtype=torch.float32)
    in_shape = tuple(pool_x.shape[1:])
    out: dict[str, np.ndarray] = {}
    for name in MAPS:
        mean, projection = pool_whitening(feature_table([_inner(name, in_shape)], x),
                                          components, shrinkage)
        out[f"{name}.mean"], out[f"{name}.projection"] = mean.numpy(), projection.numpy()
    return out


class Whitened(FixedMap):
    """``x [n, C, H, W]`` -> ``[n, K]``: map ``name`` (``hog`` or ``scatter``) of ``x``,
    centred and projected by the pool's whitening in ``tensors`` (:func:`fit_whitening`); the
    tensors are buffers, shared by every teacher and never trained."""

    def __init__(self, name: str, in_shape: tuple[int, int, int],
                 tensors: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        super().__init__()
        self.inner = _inner(name, in_shape)
        self.register_buffer("mean", torch.as_tensor(tensors[f"{name}.mean"],
                                                     dtype=torch.float32))
        self.register_buffer("projection", torch.as_tensor(tensors[f"{name}.projection"],
                                                           dtype=torch.float32))

    @property
    def width(self) -> int:
        """K, the number of components."""
        return int(self.projection.shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.inner(x) - self.mean) @ self.projection

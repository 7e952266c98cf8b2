"""scripts/bench_teacher_levers.py's discriminant teachers: the shrunk linear discriminant of the
cited formula, the one scikit-learn fits, for many teachers at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bench_teacher_levers import discriminants
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.7])
def test_each_teacher_is_scikit_learns_shrunk_discriminant(alpha):
    """Teacher t's weights are Sigma^-1 mu_c and its biases -mu_c^T Sigma^-1 mu_c / 2, Sigma the
    within-class covariance of its own rows shrunk by alpha (scikit-learn's
    ``LinearDiscriminantAnalysis(solver="lsqr", shrinkage=alpha)``, whose intercept adds the
    log of the class priors: equal classes here)."""
    rng = np.random.default_rng(0)
    teachers, rows, features, classes = 3, 60, 5, 3
    y = np.stack([rng.permutation(np.repeat(np.arange(classes), rows // classes))
                  for _ in range(teachers)])
    z = rng.normal(size=(teachers, rows, features)) @ rng.normal(size=(features, features))
    z += 2.0 * y[..., None]  # the classes apart
    weights, bias = discriminants(torch.as_tensor(z), torch.as_tensor(y), classes, alpha)
    for t in range(teachers):
        lda = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=alpha).fit(z[t], y[t])
        np.testing.assert_allclose(weights[t].numpy().T, lda.coef_, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(bias[t].numpy(), lda.intercept_ - np.log(lda.priors_),
                                   rtol=1e-8, atol=1e-10)

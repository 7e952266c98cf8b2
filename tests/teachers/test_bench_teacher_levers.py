"""scripts/bench_teacher_levers.py's discriminant teachers: the shrunk linear discriminant of the
cited formula, the one scikit-learn fits, for many teachers at once, and with one covariance
shared by all."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bench_teacher_levers import class_statistics, discriminants
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


def test_a_shared_covariance_replaces_each_teachers_own():
    """Given every teacher's own within-class covariance as the shared one, a teacher is the one
    fitted from its rows alone; given another, its weights are that covariance's, with its own
    class means."""
    rng = np.random.default_rng(1)
    y = torch.as_tensor(np.stack([np.tile(np.arange(3), 10) for _ in range(2)]))
    z = torch.as_tensor(rng.normal(size=(2, 30, 4)) + 1.5 * y.numpy()[..., None])
    means, own = class_statistics(z, y, 3)
    alone = discriminants(z, y, 3, 0.0)
    torch.testing.assert_close(discriminants(z[:1], y[:1], 3, 0.0, own[0])[0], alone[0][:1])
    shared = torch.eye(4, dtype=torch.float64) * 2.0
    weights, bias = discriminants(z, y, 3, 0.0, shared)
    torch.testing.assert_close(weights, means.transpose(1, 2) / 2.0)
    torch.testing.assert_close(bias, -0.25 * (means * means).sum(-1))

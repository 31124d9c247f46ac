"""The exact polish: the 2-norm soft-margin SVM re-solved exactly on a support set with the learned weights."""

from __future__ import annotations

import numpy as np

__all__ = ["POLISH_MAX_POINTS", "POLISH_MAX_EVALUATIONS", "polish_budget_ok", "solve_l2_svm"]


# ----------------------------------------------------------------------------- exact polish

#: ``polish="auto"`` re-solves exactly on all training points when there are at most this many ...
POLISH_MAX_POINTS = 3000
#: ... when their Gram matrix costs at most this many kernel evaluations.
POLISH_MAX_EVALUATIONS = 1e9


def polish_budget_ok(n_points: int, n_kernels: int) -> bool:
    """Whether ``polish="auto"`` polishes ``n_points`` training points with ``n_kernels`` kernels."""
    return 0 < n_points <= POLISH_MAX_POINTS and float(n_points) ** 2 * n_kernels <= POLISH_MAX_EVALUATIONS


def solve_l2_svm(K, y_pm, ridge):
    """The exact 2-norm soft-margin SVM on a Gram matrix: ``(alpha, b)``.

    Solves the problem MWUMKL approximates, ``min alpha' (Y K Y + D) alpha``
    over the two class simplices with ``D = diag(ridge)``, as LIBSVM's
    hard-margin SVM on ``K + D`` (the same optimum up to scale; LIBSVM's bias
    is the optimal one).  ``ridge`` is ``1 / C`` for every point, or an
    ``(n,)`` array of per-point values ``1 / C_j`` (sample or class weights).
    The returned ``alpha >= 0`` (one per row of ``K``) and ``b`` give the
    decision function ``sum_j alpha_j y_j K(x_j, x) + b`` at new points.

    ``K`` is rescaled to unit mean diagonal first, so LIBSVM's absolute
    stopping tolerance means the same for every data size.
    """
    from sklearn.svm import SVC

    K = np.asarray(K, dtype=np.float64)
    y_pm = np.asarray(y_pm, dtype=np.float64)
    n = K.shape[0]
    if np.ndim(ridge) == 0:
        mean_ridge = ridge
    else:
        ridge = np.asarray(ridge, dtype=np.float64)
        if ridge.shape != (n,):
            raise ValueError(f"a per-point ridge must have shape ({n},), got {ridge.shape}")
        if not (np.all(np.isfinite(ridge)) and np.all(ridge >= 0.0)):
            raise ValueError("a per-point ridge must be finite and non-negative everywhere")
        mean_ridge = ridge.mean()
    diag = np.diagonal(K).mean() + mean_ridge
    if not (np.isfinite(diag) and diag > 0):
        raise ValueError("the Gram matrix has no positive diagonal; cannot polish")
    scale = 1.0 / diag
    Q = K * scale
    Q[np.diag_indices(n)] += ridge * scale
    # C far above any dual value: the hard margin on K + D, i.e. the 2-norm soft margin on K.
    svc = SVC(kernel="precomputed", C=1e12, tol=1e-4, cache_size=200).fit(Q, y_pm)
    alpha = np.zeros(n)
    alpha[svc.support_] = np.abs(svc.dual_coef_[0]) * scale
    return alpha, float(svc.intercept_[0])

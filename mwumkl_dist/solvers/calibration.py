"""Platt scaling: class probabilities from decision values, as LIBSVM and ``SVC(probability=True)`` do.

A sigmoid ``P(y = +1 | f) = 1 / (1 + exp(A f + B))`` is fitted to decision
values ``f`` that the classifier did not train on (held-out folds), by
maximum likelihood with Platt's smoothed targets ``(N+ + 1) / (N+ + 2)`` and
``1 / (N- + 2)`` instead of 1 and 0 (Platt 1999), so that separable data
still give a finite slope.  The optimiser is the Newton method with
backtracking line search of Lin, Lin and Weng (2007), "A note on Platt's
probabilistic outputs for support vector machines" (LIBSVM's
``sigmoid_train``): it works on ``log(1 + exp(.))`` in a form that never
overflows.

Multiclass: the estimator is one-vs-rest, so each class gets its own
sigmoid on its own one-vs-rest decision values and the class probabilities
are those sigmoids normalised to sum to 1 (as scikit-learn's
``CalibratedClassifierCV`` does for one-vs-rest).  LIBSVM's pairwise coupling
(Wu, Lin and Weng 2004) needs one-vs-one classifiers, which this estimator
does not train.

Everything here is a pure function of arrays.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = [
    "fit_sigmoid",
    "sigmoid_probability",
    "fit_platt",
    "platt_probabilities",
    "CalibrationWarning",
]

#: Newton iterations at most (LIBSVM's value).
MAX_ITER = 100
#: Smallest line-search step before giving up (LIBSVM's value).
MIN_STEP = 1e-10
#: Added to the Hessian's diagonal so that it stays positive definite (LIBSVM's value).
HESSIAN_RIDGE = 1e-12
#: Stop when both gradient entries are below this (LIBSVM's absolute value, scaled by the mean weight).
GRADIENT_TOL = 1e-5


class CalibrationWarning(UserWarning):
    """The sigmoid fit stopped before its gradient vanished (line search failed or too many iterations)."""


def _log1p_exp(z):
    """``log(1 + exp(z))`` without overflow."""
    return np.logaddexp(0.0, z)


def _objective(A, B, f, t, w):
    """Weighted cross-entropy of the smoothed targets ``t`` under ``p = 1 / (1 + exp(A f + B))``.

    ``-t log p - (1 - t) log(1 - p) = t z + log(1 + exp(-z))`` with ``z = A f + B``.
    """
    z = f * A + B
    return float(np.sum(w * (t * z + _log1p_exp(-z))))


def _check_inputs(decision, y, sample_weight):
    f = np.asarray(decision, dtype=np.float64)
    if f.ndim != 1:
        raise ValueError(f"decision values must be 1-d, got shape {f.shape}")
    if not np.all(np.isfinite(f)):
        raise ValueError("decision values contain NaN or infinity")
    positive = np.asarray(y)
    if positive.shape != f.shape:
        raise ValueError(f"y must have the shape of the decision values {f.shape}, got {positive.shape}")
    positive = positive > 0 if positive.dtype != bool else positive
    if sample_weight is None:
        w = np.ones_like(f)
    else:
        w = np.asarray(sample_weight, dtype=np.float64)
        if w.shape != f.shape:
            raise ValueError(f"sample_weight must have shape {f.shape}, got {w.shape}")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("sample_weight must be finite and non-negative")
    return f, positive, w


def fit_sigmoid(decision, y, sample_weight=None, max_iter: int = MAX_ITER) -> tuple[float, float]:
    """Platt's sigmoid ``P(y = +1 | f) = 1 / (1 + exp(A f + B))`` fitted to decision values: ``(A, B)``.

    Parameters
    ----------
    decision : array-like of shape (n,)
        Decision values of points the classifier did not train on.
    y : array-like of shape (n,)
        Their labels: ``True`` or ``> 0`` for the positive class.
    sample_weight : array-like of shape (n,), optional
        Weights of the points in the likelihood and in Platt's class counts
        (as scikit-learn's sigmoid calibration uses them); None: all 1,
        which is exactly LIBSVM's ``sigmoid_train``.
    max_iter : int, default=100
        Newton iterations at most.

    Returns
    -------
    A, B : float
        ``A < 0`` when larger decision values mean the positive class.

    Notes
    -----
    The targets are ``(N+ + 1) / (N+ + 2)`` for positive points and
    ``1 / (N- + 2)`` for negative ones (``N+``, ``N-``: the class counts,
    weighted), the start ``A = 0``, ``B = log((N- + 1) / (N+ + 1))``; each
    Newton step is halved until the objective decreases sufficiently
    (Armijo, ``1e-4``).
    """
    f, positive, w = _check_inputs(decision, y, sample_weight)
    n_pos, n_neg = float(w[positive].sum()), float(w[~positive].sum())
    t = np.where(positive, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
    A, B = 0.0, float(np.log((n_neg + 1.0) / (n_pos + 1.0)))
    fval = _objective(A, B, f, t, w)
    tol = GRADIENT_TOL * (float(w.mean()) if len(w) else 1.0)
    for _ in range(int(max_iter)):
        z = f * A + B
        p = np.exp(-_log1p_exp(z))  # 1 / (1 + exp(z)), the probability of the positive class
        q = np.exp(-_log1p_exp(-z))  # 1 - p, without the cancellation for p near 1
        d2 = w * p * q
        h11 = HESSIAN_RIDGE + float(np.sum(f * f * d2))
        h22 = HESSIAN_RIDGE + float(np.sum(d2))
        h21 = float(np.sum(f * d2))
        d1 = w * (t - p)
        g1, g2 = float(np.sum(f * d1)), float(np.sum(d1))
        if abs(g1) < tol and abs(g2) < tol:
            return A, B
        det = h11 * h22 - h21 * h21
        dA = -(h22 * g1 - h21 * g2) / det
        dB = -(-h21 * g1 + h11 * g2) / det
        gd = g1 * dA + g2 * dB
        step = 1.0
        while step >= MIN_STEP:
            new_A, new_B = A + step * dA, B + step * dB
            new_f = _objective(new_A, new_B, f, t, w)
            if new_f < fval + 1e-4 * step * gd:
                A, B, fval = new_A, new_B, new_f
                break
            step /= 2.0
        if step < MIN_STEP:
            message = "Platt scaling: the line search failed; the sigmoid may be inaccurate"
            warnings.warn(message, CalibrationWarning, stacklevel=2)
            return A, B
    warnings.warn(f"Platt scaling: no convergence in {max_iter} Newton iterations", CalibrationWarning, stacklevel=2)
    return A, B


def sigmoid_probability(decision, A: float, B: float) -> np.ndarray:
    """``1 / (1 + exp(A f + B))`` for every decision value ``f``, without overflow."""
    with np.errstate(over="ignore"):  # A f + B = +-inf has the right limit, 0 or 1
        z = np.asarray(decision, dtype=np.float64) * A + B
    return np.exp(-_log1p_exp(z))


def fit_platt(decision, y, classes, sample_weight=None) -> tuple[np.ndarray, np.ndarray]:
    """The sigmoids of a binary or one-vs-rest classifier: ``(A, B)``, one entry per binary problem.

    Parameters
    ----------
    decision : array-like of shape (n,) or (n, n_classes)
        Held-out decision values: one column for two classes (positive class
        ``classes[1]``), else one per class (class ``k`` against the rest).
    y : array-like of shape (n,)
        The points' labels.
    classes : array-like of shape (n_classes,)
        All class labels, in the classifier's order.
    sample_weight : array-like of shape (n,), optional
        See :func:`fit_sigmoid`.

    Returns
    -------
    A, B : ndarray of shape (1,) for two classes, else (n_classes,)
    """
    classes = np.asarray(classes)
    y = np.asarray(y)
    if len(classes) < 2:
        raise ValueError(f"Platt scaling needs at least two classes, got {len(classes)}")
    unknown = np.setdiff1d(np.unique(y), classes)
    if len(unknown):
        raise ValueError(f"y holds labels that are not among the classes: {unknown.tolist()}")
    f = np.asarray(decision, dtype=np.float64)
    if len(classes) == 2:
        f = f.reshape(len(f), -1)
        if f.shape[1] != 1:
            raise ValueError(f"two classes need one decision value per point, got shape {np.shape(decision)}")
        targets = [classes[1]]
    else:
        if f.ndim != 2 or f.shape[1] != len(classes):
            raise ValueError(f"{len(classes)} classes need decision values of shape (n, {len(classes)}), got {f.shape}")
        targets = list(classes)
    A, B = np.empty(len(targets)), np.empty(len(targets))
    for k, target in enumerate(targets):
        A[k], B[k] = fit_sigmoid(f[:, k], y == target, sample_weight)
    return A, B


def platt_probabilities(decision, A, B) -> np.ndarray:
    """Class probabilities ``(n, n_classes)`` from decision values and the sigmoids of :func:`fit_platt`.

    Two classes: ``[1 - p, p]`` with ``p`` the sigmoid of the positive class.
    More: each class's sigmoid of its one-vs-rest decision value, the row
    normalised to sum to 1 (uniform where every sigmoid underflows to 0).
    """
    A = np.atleast_1d(np.asarray(A, dtype=np.float64))
    B = np.atleast_1d(np.asarray(B, dtype=np.float64))
    f = np.asarray(decision, dtype=np.float64)
    if len(A) == 1:
        f = f.reshape(-1)
        # Each side from its own sigmoid: a probability near 0 keeps its precision (1 - p would not).
        return np.column_stack([sigmoid_probability(f, -A[0], -B[0]), sigmoid_probability(f, A[0], B[0])])
    if f.ndim != 2 or f.shape[1] != len(A):
        raise ValueError(f"decision values must have shape (n, {len(A)}), got {f.shape}")
    P = sigmoid_probability(f, A[None, :], B[None, :])
    total = P.sum(axis=1, keepdims=True)
    uniform = total[:, 0] <= 0.0
    P[uniform] = 1.0
    total[uniform] = len(A)
    return P / total

"""Sample and class weights as the 2-norm soft margin takes them: a per-point ridge.

With weights ``w_j`` (``sample_weight`` times the class weight of the
point's label) the per-point constant is ``C_j = C_eff * w_j``, as in
LIBSVM and scikit-learn's ``SVC``, and the solver's diagonal term
``D = diag(1 / C_j)`` (see :mod:`mwumkl_dist.solvers.mwu`).  Points of weight 0 are
left out of the fit; negative weights are an error.

One-vs-rest (three or more classes) follows scikit-learn's convention for
one-vs-rest models (``LogisticRegression``): a ``class_weight`` dict gives
every point the weight of its own label in every binary problem, and
``"balanced"`` balances each binary problem, class ``k`` against the rest
(``n / (2 n_k)`` and ``n / (2 (n - n_k))``).  With two classes both readings
are ``compute_class_weight``'s.

What the weights do and do not equal: for a fixed Gram matrix, a point of
integer weight ``k`` is the same 2-norm problem as ``k`` copies of it at
weight 1 (the copies share the dual mass, which minimises
``sum alpha_c^2 / C`` at an even split: ``a^2 / (k C)``), so the exact
solution (:func:`mwumkl_dist.kernels.evaluation.solve_l2_svm`) is the same.  The MWU
iterations and the trace normalisation see rows, not weights, so a fit with
weights is not a fit on repeated rows in general (the kernel weights
differ); with a single kernel of constant diagonal (a Gaussian) and the
exact polish, it is.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = [
    "check_sample_weight",
    "check_class_weight",
    "problem_weights",
    "point_ridge",
    "score_weights",
    "weighted_error",
]


def check_sample_weight(sample_weight, n_samples: int) -> np.ndarray | None:
    """``sample_weight`` as a fresh float64 array of shape ``(n_samples,)`` (a number: every point), or None.

    Raises ``ValueError`` for a wrong shape, NaN or infinite values, negative
    values, and for weights that are all zero.
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, numbers.Number) and not isinstance(sample_weight, bool):
        w = np.full(n_samples, float(sample_weight))
    else:
        try:
            w = np.array(sample_weight, dtype=np.float64)  # a copy: the caller's array is never changed
        except (TypeError, ValueError) as err:
            raise ValueError(f"sample_weight must be an array of numbers: {err}") from None
        if w.shape != (n_samples,):
            raise ValueError(f"sample_weight must have shape ({n_samples},), got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("sample_weight contains NaN or infinity")
    if np.any(w < 0):
        raise ValueError(f"sample_weight must be non-negative, got a minimum of {w.min():g}")
    if not np.any(w > 0):
        raise ValueError("sample_weight is zero everywhere: at least one point needs a non-zero weight")
    return w


def check_class_weight(class_weight, classes) -> dict | str | None:
    """``class_weight`` checked against the training labels: None, ``"balanced"`` or a dict.

    Dict keys must be training labels and values positive finite numbers;
    labels not in the dict weigh 1.
    """
    if class_weight is None or (isinstance(class_weight, str) and class_weight == "balanced"):
        return class_weight
    if not isinstance(class_weight, dict):
        raise ValueError(f"class_weight must be None, 'balanced' or a dict {{label: weight}}, got {class_weight!r}")
    known = set(np.asarray(classes).tolist())
    unknown = [k for k in class_weight if _plain(k) not in known]
    if unknown:
        raise ValueError(
            f"class_weight has labels that are not training labels: {unknown!r} (the labels are {sorted(known)!r})"
        )
    for label, value in class_weight.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (np.isfinite(value) and value > 0):
            raise ValueError(f"class_weight[{label!r}] must be a positive finite number, got {value!r}")
    return class_weight


def _plain(label):
    """A numpy scalar as the Python value a dict key compares equal to (``np.str_("a")`` -> ``"a"``)."""
    return label.item() if isinstance(label, np.generic) else label


def _label_weights(class_weight: dict, labels) -> np.ndarray:
    """The weight of each of ``labels`` in a ``class_weight`` dict (1 for a label not in it)."""
    lookup = {_plain(k): float(v) for k, v in class_weight.items()}
    return np.array([lookup.get(_plain(c), 1.0) for c in labels])


def problem_weights(y, classes, target, class_weight, sample_weight) -> np.ndarray | None:
    """Per-point weights ``w_j`` of the binary problem ``target`` against the rest; None: no weights at all.

    Parameters
    ----------
    y : ndarray of shape (n,)
        Training labels (the points kept for the fit).
    classes : ndarray
        All classes; two classes make one binary problem, more one per class.
    target : label
        The positive class of this binary problem.
    class_weight : None, "balanced" or dict
        From :func:`check_class_weight`.
    sample_weight : ndarray of shape (n,) or None
        From :func:`check_sample_weight`.
    """
    if class_weight is None:
        return None if sample_weight is None else sample_weight.copy()
    positive = y == target
    if isinstance(class_weight, str):  # "balanced" on this binary problem
        n, n_pos = len(y), int(positive.sum())
        if n_pos == 0 or n_pos == n:
            raise ValueError(f"class {target!r} vs the rest: one side has no points to balance")
        cw = np.where(positive, n / (2.0 * n_pos), n / (2.0 * (n - n_pos)))
    else:
        labels, codes = np.unique(y, return_inverse=True)
        cw = _label_weights(class_weight, labels)[codes]
    return cw if sample_weight is None else sample_weight * cw


def point_ridge(ridge: float, weights: np.ndarray | None):
    """The solver's ridge: ``ridge / w_j`` per point, or the float ``ridge`` itself.

    With no weights, or one weight for every point, the result is a float
    (``ridge / w``), so unit weights give the unweighted model bit for bit.
    ``ridge = 0`` (the hard margin) stays 0.
    """
    if weights is None:
        return float(ridge)
    if not np.all(weights > 0):
        raise ValueError("every point left in the fit needs a positive weight")
    if np.all(weights == weights[0]):
        return float(ridge) / float(weights[0])
    return float(ridge) / weights


def score_weights(y, class_weight, sample_weight) -> np.ndarray | None:
    """Weights that score a prediction of each point as the weighted fit values it; None: plain error.

    ``sample_weight`` times the class weight of the point's label over all
    classes (``"balanced"``: scikit-learn's ``n / (n_classes n_k)``, so the
    weighted error is the balanced error).  ``C="auto"`` scores its
    candidates with these, so that it chooses ``C`` for the weighted problem.
    """
    if class_weight is None:
        return None if sample_weight is None else sample_weight
    labels, codes, counts = np.unique(y, return_inverse=True, return_counts=True)
    if isinstance(class_weight, str):
        per_label = len(y) / (len(labels) * counts.astype(np.float64))
    else:
        per_label = _label_weights(class_weight, labels)
    cw = per_label[codes]
    return cw if sample_weight is None else sample_weight * cw


def weighted_error(predicted, y, weights) -> float:
    """The share of wrong predictions, each counted with its weight (the plain error rate for None)."""
    wrong = np.asarray(predicted) != np.asarray(y)
    if weights is None:
        return float(np.mean(wrong))
    return float(np.sum(weights * wrong) / np.sum(weights))

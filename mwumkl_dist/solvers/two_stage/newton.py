"""The 2-norm soft-margin SVM on features by a finite Newton method (L2-SVM-MFN) over shards."""

from __future__ import annotations

import functools
import logging

import numpy as np

from mwumkl_dist.engines.pool import LocalPool
from mwumkl_dist.solvers.two_stage.shards import GivenFeatures, LinearShard

__all__ = [
    "fit_linear",
    "fit_squared_hinge",
    "solve_squared_hinge",
]

logger = logging.getLogger("mwumkl_dist")


def fit_linear(F, y_pm, C: float, sample_weight=None, *, tol: float = 1e-4, max_iter: int = 1000):
    """The 2-norm soft-margin SVM on features ``F``: ``(coef, intercept)``.

    ``min_w,b 1/2 |w|^2 + C/2 sum_j c_j max(0, 1 - y_j (w' f_j + b))^2`` with
    ``c_j`` = ``sample_weight`` (1 by default): the primal of the MWU's problem
    with ridge ``1 / (C c_j)`` on a unit-diagonal kernel.  Solved by LIBLINEAR's
    primal trust-region Newton method (``LinearSVC(loss="squared_hinge",
    dual=False)``, whose ``C`` is half of this one); the bias is an extra
    feature of value 1, regularised like the weights (negligible at large ``n``).
    """
    from sklearn.svm import LinearSVC

    svc = LinearSVC(C=0.5 * float(C), loss="squared_hinge", dual=False, tol=tol, max_iter=max_iter)
    svc.fit(F, y_pm, sample_weight=sample_weight)
    return svc.coef_[0].copy(), float(svc.intercept_[0])


def _line_search(vd, dd, m, q, cw, C) -> float:
    """The exact minimiser ``t >= 0`` of the piecewise quadratic ``f(v + t d)`` (see :func:`fit_squared_hinge`).

    ``f'(t) = vd + t dd - C sum_j cw_j q_j max(0, m_j - t q_j)``: increasing and
    piecewise linear; its pieces change where a point enters or leaves the
    active set (``t_j = m_j / q_j``).  The root is found on the sorted breakpoints.
    """
    active = (m > 0) | ((m == 0) & (q < 0))
    alpha = vd - C * np.sum((cw * q * m)[active])
    beta = dd + C * np.sum((cw * q * q)[active])
    with np.errstate(divide="ignore", invalid="ignore"):
        tj = m / q
    leaving = active & (q > 0)
    entering = ~active & (q < 0)
    events = np.flatnonzero((leaving | entering) & (tj > 0))
    order = events[np.argsort(tj[events], kind="stable")]
    sign = np.where(leaving[order], 1.0, -1.0)  # leaving: alpha += C c q m, beta -= C c q^2
    da = sign * C * (cw * q * m)[order]
    db = -sign * C * (cw * q * q)[order]
    alphas = alpha + np.concatenate(([0.0], np.cumsum(da)))
    betas = beta + np.concatenate(([0.0], np.cumsum(db)))
    nxt = np.concatenate((tj[order], [np.inf]))
    with np.errstate(invalid="ignore", over="ignore"):
        g = np.where(np.isinf(nxt), np.inf, alphas + betas * nxt)
    k = int(np.flatnonzero(g >= 0)[0])
    return float(-alphas[k] / betas[k]) if betas[k] > 0 else 0.0


def solve_squared_hinge(
    shards, rank: int, y_pm, C: float, sample_weight=None, *, tol: float = 1e-10, max_iter: int = 100
):
    """The 2-norm soft-margin SVM on the shards' loaded features by a finite Newton method: ``(coef, intercept)``.

    Minimises ``1/2 (|w|^2 + b^2) + C/2 sum_j c_j max(0, 1 - y_j (w' f_j + b))^2``
    (``c_j`` = ``sample_weight``, 1 by default; the bias regularised as
    LIBLINEAR does it, so this is ``LinearSVC(C=C/2, loss="squared_hinge")``'s
    problem) by L2-SVM-MFN (Keerthi & DeCoste, JMLR 2005): Newton steps on the
    active set ``A = {j : y_j o_j < 1}``, ``(I + C Z_A' D_A Z_A) v = C Z_A' D_A y_A``
    with ``Z = [F, 1]``, each followed by an exact line search.  It ends when the
    active set repeats with a full step (the exact optimum), when the objective
    stops decreasing (relative ``tol``), or after ``max_iter`` steps.  Per step
    the shards add their blocks' Gram parts (one ``n_A x r`` product each) and
    return ``F d`` (``n`` values); the driver keeps the outputs ``o`` (``O(n)``).
    ``shards``: a shard pool (:mod:`mwumkl_dist.engines.pool`) of :class:`LinearShard`, their
    slots their row ranges, their problems loaded with ``cw = C c`` and features of ``rank`` columns.
    """
    y = np.asarray(y_pm, dtype=np.float64)
    n = len(y)
    cw = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    C = float(C)
    r = int(rank)
    v = np.zeros(r + 1)
    o = np.zeros(n)

    def objective(v, o):
        h = np.maximum(0.0, 1.0 - y * o)
        return 0.5 * v @ v + 0.5 * C * np.sum(cw * h * h)

    f_old = objective(v, o)
    previous = None
    for _ in range(max_iter):
        active = y * o < 1.0
        H = np.zeros((r + 1, r + 1))
        rhs = np.zeros(r + 1)
        parts_of = shards.call(
            "active_parts", lambda rows, a=active: (np.packbits(a[rows[0] : rows[1]]),), superstep=True
        )
        for parts in parts_of:
            for p in parts:  # in row order
                if p is not None:
                    H += p[0]
                    rhs += p[1]
        H[np.diag_indices(r + 1)] += 1.0
        target = np.linalg.solve(H, rhs)
        d = target - v
        delta = np.concatenate(shards.call("direction", lambda rows, d=d: (d,), shared=True, superstep=True))
        t = _line_search(v @ d, d @ d, 1.0 - y * o, y * delta, cw, C)
        t = min(max(t, 0.0), 1.0) if np.isfinite(t) else 1.0
        v = v + t * d
        o = o + t * delta
        f_new = objective(v, o)
        A = np.flatnonzero(active)
        same = previous is not None and np.array_equal(A, previous)
        if (t == 1.0 and same) or f_old - f_new <= tol * max(f_old, 1e-300):
            break
        previous, f_old = A, f_new
    return v[:r].copy(), float(v[r])


def fit_squared_hinge(F, y_pm, C: float, sample_weight=None, *, tol: float = 1e-10, max_iter: int = 100):
    """:func:`solve_squared_hinge` on in-memory features ``F`` (``(n, r)``): ``(coef, intercept)``."""
    F = np.asarray(F, dtype=np.float64)
    y = np.asarray(y_pm, dtype=np.float64)
    cw = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    with LocalPool([(0, F.shape[0])], lambda rows: functools.partial(LinearShard, F, *rows, spill=False)) as pool:
        pool.call("load_problem", lambda rows: (GivenFeatures(F.shape[1]), y, float(C) * cw))
        return solve_squared_hinge(pool, F.shape[1], y, C, cw, tol=tol, max_iter=max_iter)

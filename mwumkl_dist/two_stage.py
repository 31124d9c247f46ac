"""Two-stage MKL for large ``n``: the kernel weights from a subsample, the classifier from all rows.

The MWU solver needs ``T ~ n / 5`` iterations for an accurate classifier on
noisy data (``O(m n^2)`` time), but far fewer to find the kernel weights.  The
two-stage fit (``solver="two-stage"``) therefore

1. learns the kernel weights ``mu`` (and ``C``, the selectivity) with the MWU fit
   path on a stratified subsample of 2 % of the rows, 1000 to 3000
   (:func:`weight_points_for`: small enough for the exact polish, so
   ``epsilon = 0.2``; ``C="auto"`` and ``selectivity="auto"`` cross-validate on
   it as usual);
2. maps every row to Nystroem features of the learned combined kernel
   ``K = sum_i mu_i K_i / (r_i / n)`` (unit mean diagonal) on
   :data:`N_COMPONENTS` landmark rows ``L``: ``phi(x) = K(x, L) M`` with
   ``M = U S^{-1/2}`` from ``K(L, L) = U S U'`` (so ``phi(x)' phi(z)`` is the
   Nystroem approximation of ``K(x, z)``, exact when ``L`` holds all rows);
3. solves the same 2-norm soft-margin SVM the MWU approximates (squared hinge,
   ``C`` per point as the MWU's ridge ``1 / C``) on those features with a
   finite Newton method (:func:`fit_squared_hinge`: on cod-rna 1e5 rows 4x
   faster than LIBLINEAR on the same problem, with no copy of the features).

The linear model ``w' phi(x) + b`` is a kernel expansion on the landmarks,
``sum_l beta_l K(x, L_l) + b`` with ``beta = M w``: the fitted model has the
estimator's usual attributes (``support_`` = the landmarks, ``dual_coef_`` =
``beta``, ``raw_kernel_weights_``), so prediction, persistence and inspection
work unchanged.  Cost: ``O(m s^2)`` for the weights (``s`` fixed), ``O(m' n r)``
for the features (``m'`` kernels with non-negligible weight, ``r`` landmarks)
and a linear solve on ``n x r`` features: linear in ``n``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from .kernels import KernelSet
from .polish import kernel_traces

__all__ = [
    "WEIGHT_POINTS",
    "WEIGHT_POINTS_MIN",
    "WEIGHT_FRACTION",
    "weight_points_for",
    "N_COMPONENTS",
    "PRUNE",
    "NystroemMap",
    "nystroem_map",
    "landmark_rows",
    "unit_weights",
    "fit_linear",
    "fit_squared_hinge",
    "weighted_kernel",
    "all_traces",
    "fit_two_stage",
    "SOLVERS",
    "AUTO_TWO_STAGE_POINTS",
    "check_solver",
    "resolve_solver",
]

logger = logging.getLogger("mwumkl_dist")

#: The kernel weights are learnt on ``WEIGHT_FRACTION * n`` rows, at least ``WEIGHT_POINTS_MIN`` and at most
#: ``WEIGHT_POINTS`` (the exact polish's limit: the subsample's fit and C="auto"'s folds are polished, epsilon
#: 0.2).  cod-rna 1e5 rows: 1000 rows give 3.88 % test error, 2000 3.72 %; a9a (32561): 1000 rows 14.81 %.
WEIGHT_FRACTION = 0.02
WEIGHT_POINTS_MIN = 1000
WEIGHT_POINTS = 3000
#: Landmarks of the Nystroem map.
N_COMPONENTS = 500
#: Kernels with ``mu_i < PRUNE * max(mu)`` are left out of the combined kernel (their features cost as much
#: as the others'; on cod-rna / a9a 8 of the 12 paper kernels fall below 1e-3).
PRUNE = 1e-3
#: ``solver="auto"`` uses the two-stage fit from this many training rows (in-memory feature rows, finite C);
#: below, the MWU fit (polished up to 3000 rows).  cod-rna 2e4 rows: MWU 18.7 s CPU, 4.52 %; two-stage 3.9 %.
AUTO_TWO_STAGE_POINTS = 10000
SOLVERS = ("auto", "mwu", "two-stage")
#: Rows per block of kernel evaluations (``block x n_landmarks`` values per kernel at a time).
_ROW_BLOCK = 8192


def weight_points_for(n_samples: int) -> int:
    """Rows the two-stage fit learns the kernel weights on: ``WEIGHT_FRACTION * n`` within the bounds."""
    return int(min(n_samples, max(WEIGHT_POINTS_MIN, min(WEIGHT_POINTS, round(WEIGHT_FRACTION * n_samples)))))


def landmark_rows(n_samples: int, n_components: int, seed: int) -> np.ndarray:
    """``min(n_components, n_samples)`` distinct row indices drawn with ``seed``, sorted."""
    k = min(int(n_components), int(n_samples))
    return np.sort(np.random.default_rng(seed).choice(n_samples, size=k, replace=False))


def unit_weights(kernel_weights, traces, n_samples: int, prune: float = PRUNE) -> np.ndarray:
    """Raw weights ``mu_i / r_i`` with the kernels below ``prune * max(mu)`` set to 0, times ``n_samples``.

    The combined kernel ``sum_i w_i K_i`` of the result has unit mean diagonal on the training rows.
    """
    mu = np.asarray(kernel_weights, dtype=np.float64)
    mu = np.where(mu >= prune * mu.max(), mu, 0.0)
    return mu / np.asarray(traces, dtype=np.float64) * float(n_samples)


@njit(cache=True, error_model="numpy", nogil=True)
def _combine_rows(dot, sqx, sqz, kind, param_a, param_b, square_of, members, w, out, lo, hi):  # pragma: no cover
    """``out[lo:hi] += sum_i w[i] K_i`` over one feature group's ``members`` (chain order), from its dots.

    Every kernel value of an entry is computed in registers, in the order and
    with the operations of :func:`mwumkl_dist.polish.combined_kernel`
    (``exp`` is the platform's, which may differ from numpy's in the last bit).
    Entries are independent: any split of the rows gives the same bits.
    """
    vals = np.empty(kind.shape[0])
    for a in range(lo, hi):
        for b in range(dot.shape[1]):
            dt = dot[a, b]
            d2 = sqx[a] + sqz[b] - 2.0 * dt
            if d2 < 0.0:
                d2 = 0.0
            acc = out[a, b]
            for t in range(members.shape[0]):
                i = members[t]
                src = square_of[i]
                if src >= 0:
                    k = vals[src] * vals[src]
                elif kind[i] == 0:
                    k = dt
                elif kind[i] == 1:
                    base = dt + param_b[i]
                    k = base
                    for _ in range(int(param_a[i]) - 1):
                        k *= base
                else:
                    k = math.exp(-param_a[i] * d2)
                vals[i] = k
                if w[i] != 0.0:
                    acc += w[i] * k
            out[a, b] = acc


@njit(cache=True, error_model="numpy", nogil=True, parallel=True)
def _combine_chunks(dot, sqx, sqz, kind, param_a, param_b, square_of, members, w, out, n_chunks):  # pragma: no cover
    n = dot.shape[0]
    for c in prange(n_chunks):
        _combine_rows(dot, sqx, sqz, kind, param_a, param_b, square_of, members, w, out, c * n // n_chunks,
                      (c + 1) * n // n_chunks)  # fmt: skip


def _combine(dot, sqx, sqz, plan_arrays, members, w, out, parallel: bool = True) -> None:
    """:func:`_combine_rows` on all rows, in row chunks over this thread's numba threads (same bits)."""
    from . import _columns

    work = dot.shape[0] * len(members) * max(1, dot.shape[1] // 64) if parallel else 0
    with _columns._parallel(_columns._threads_for(work)) as n_chunks:
        if n_chunks == 1:
            _combine_rows(dot, sqx, sqz, *plan_arrays, members, w, out, 0, dot.shape[0])
        else:
            _combine_chunks(dot, sqx, sqz, *plan_arrays, members, w, out, n_chunks)


def weighted_kernel(kernel_set: KernelSet, X, Z, weights, parallel: bool = True) -> np.ndarray:
    """``sum_i weights[i] K_i(X, Z)``, dense ``(n_X, n_Z)``, evaluating only the kernels of non-zero weight.

    As :func:`mwumkl_dist.polish.combined_kernel` (the same values, kernel by
    kernel in the plan's chain order), but a kernel of weight 0 is not
    evaluated unless a kernel of non-zero weight is its square (a Gaussian
    squaring chain): after pruning, 2-5 of the 12 paper kernels.
    """
    from .polish import _columns_dense, _group_features, _group_members

    X = X if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    Z = Z if sp.issparse(Z) else np.asarray(Z, dtype=np.float64)
    plan = kernel_set.plan
    w = np.asarray(weights, dtype=np.float64)
    needed = w != 0.0
    for i in plan.order[::-1]:  # sources come before their squares in the chain order
        if needed[i] and plan.square_of[i] >= 0:
            needed[plan.square_of[i]] = True
    out = np.zeros((X.shape[0], Z.shape[0]))
    plan_arrays = (
        np.ascontiguousarray(plan.kind, dtype=np.int64),
        np.ascontiguousarray(plan.param_a, dtype=np.float64),
        np.ascontiguousarray(plan.param_b, dtype=np.float64),
        np.ascontiguousarray(plan.square_of, dtype=np.int64),
    )
    for cols, members in zip(_group_features(kernel_set), _group_members(plan)):
        members = [int(i) for i in members if needed[i]]
        if not members:
            continue
        Xg, Zg = _columns_dense(X, cols), _columns_dense(Z, cols)
        dot = np.ascontiguousarray(Xg @ Zg.T)
        members = np.asarray(members, dtype=np.int64)
        _combine(dot, (Xg**2).sum(axis=1), (Zg**2).sum(axis=1), plan_arrays, members, w, out, parallel)
    return out


def _map_blocks(fn, n_rows: int) -> list:
    """``[fn(lo, hi) for each fixed row block]``, over this thread's threads (``n_jobs``) when there are several.

    The blocks are fixed (:data:`_ROW_BLOCK` rows) and the results come back in
    block order, so whatever is summed from them does not depend on the thread count.
    """
    from concurrent.futures import ThreadPoolExecutor

    from ._columns import get_num_threads

    blocks = [(lo, min(lo + _ROW_BLOCK, n_rows)) for lo in range(0, n_rows, _ROW_BLOCK)]
    n_threads = min(get_num_threads(), len(blocks))
    if n_threads <= 1:
        return [fn(lo, hi) for lo, hi in blocks]
    with ThreadPoolExecutor(n_threads) as pool:
        return list(pool.map(lambda b: fn(*b), blocks))


@dataclass
class NystroemMap:
    """Nystroem features ``phi(x) = K(x, L) M`` of the combined kernel ``K = sum_i weights[i] K_i``."""

    kernel_set: KernelSet
    landmarks: object  # (n_landmarks, n_features) ndarray or CSR
    weights: np.ndarray  # (n_kernels,)
    projection: np.ndarray  # (n_landmarks, rank)

    @property
    def rank(self) -> int:
        return self.projection.shape[1]

    def kernel(self, X) -> np.ndarray:
        """``K(X, L)``, ``(n, n_landmarks)``, in row blocks."""
        n = X.shape[0]
        out = np.empty((n, self.landmarks.shape[0]))
        for a in range(0, n, _ROW_BLOCK):
            out[a : a + _ROW_BLOCK] = weighted_kernel(self.kernel_set, X[a : a + _ROW_BLOCK], self.landmarks,
                                                      self.weights)  # fmt: skip
        return out

    def transform(self, X) -> np.ndarray:
        """The features ``phi(X)``, ``(n, rank)``, in fixed row blocks (over threads when there are several)."""
        out = np.empty((X.shape[0], self.rank))

        def block(lo, hi):
            K = weighted_kernel(self.kernel_set, X[lo:hi], self.landmarks, self.weights, parallel=False)
            out[lo:hi] = K @ self.projection

        _map_blocks(block, X.shape[0])
        return out

    def expansion(self, coef) -> np.ndarray:
        """Kernel-expansion coefficients on the landmarks: ``w' phi(x) = (M w)' K(L, x)``."""
        return self.projection @ np.asarray(coef, dtype=np.float64)


def nystroem_map(kernel_set: KernelSet, landmarks, weights, rcond: float = 1e-12) -> NystroemMap:
    """The Nystroem map of ``sum_i weights[i] K_i`` on ``landmarks``.

    Eigenvalues of ``K(L, L)`` below ``rcond`` times the largest are dropped (a
    rank-deficient combination, e.g. a linear kernel on few features, or repeated landmarks).
    """
    weights = np.asarray(weights, dtype=np.float64)
    K = weighted_kernel(kernel_set, landmarks, landmarks, weights)
    K = 0.5 * (K + K.T)
    s, U = np.linalg.eigh(K)
    if not s.size or s[-1] <= 0:
        raise ValueError("the combined kernel is zero on the landmarks")
    keep = s > rcond * s[-1]
    projection = U[:, keep] / np.sqrt(s[keep])
    return NystroemMap(kernel_set, landmarks, weights, np.ascontiguousarray(projection[:, ::-1]))


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


def _active_system(F, y, cw, A):
    """``(I + Z_A' D Z_A, Z_A' D y_A)`` with ``Z = [F, 1]``, ``D = diag(cw)``, summed over fixed row blocks."""
    r = F.shape[1]
    bounds = np.searchsorted(A, np.arange(0, F.shape[0] + _ROW_BLOCK, _ROW_BLOCK))

    def part(lo, hi):  # the active rows of row block [lo, hi)
        rows = A[bounds[lo // _ROW_BLOCK] : bounds[lo // _ROW_BLOCK + 1]]
        if not len(rows):
            return None
        sw = np.sqrt(cw[rows])
        Z = np.empty((len(rows), r + 1))
        Z[:, :r] = F[rows]
        Z[:, r] = 1.0
        Z *= sw[:, None]
        return Z.T @ Z, Z.T @ (sw * y[rows])

    H = np.zeros((r + 1, r + 1))
    rhs = np.zeros(r + 1)
    for p in _map_blocks(part, F.shape[0]):  # summed in block order
        if p is not None:
            H += p[0]
            rhs += p[1]
    H[np.diag_indices(r + 1)] += 1.0
    return H, rhs


def fit_squared_hinge(F, y_pm, C: float, sample_weight=None, *, tol: float = 1e-10, max_iter: int = 100):
    """The 2-norm soft-margin SVM on features ``F`` by a finite Newton method: ``(coef, intercept)``.

    Minimises ``1/2 (|w|^2 + b^2) + C/2 sum_j c_j max(0, 1 - y_j (w' f_j + b))^2``
    (``c_j`` = ``sample_weight``, 1 by default; the bias regularised as
    LIBLINEAR does it, so this is ``LinearSVC(C=C/2, loss="squared_hinge")``'s
    problem) by L2-SVM-MFN (Keerthi & DeCoste, JMLR 2005): Newton steps on the
    active set ``A = {j : y_j o_j < 1}``, ``(I + C Z_A' D_A Z_A) v = C Z_A' D_A y_A``
    with ``Z = [F, 1]``, each followed by an exact line search.  It ends when the
    active set repeats with a full step (the exact optimum), when the objective
    stops decreasing (relative ``tol``), or after ``max_iter`` steps.  Cost per
    step: one ``n_A x r`` Gram product (BLAS) and two products with ``F``.
    """
    F = np.asarray(F, dtype=np.float64)
    y = np.asarray(y_pm, dtype=np.float64)
    n, r = F.shape
    cw = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    C = float(C)
    v = np.zeros(r + 1)
    o = np.zeros(n)

    def objective(v, o):
        h = np.maximum(0.0, 1.0 - y * o)
        return 0.5 * v @ v + 0.5 * C * np.sum(cw * h * h)

    f_old = objective(v, o)
    previous = None
    for _ in range(max_iter):
        A = np.flatnonzero(y * o < 1.0)
        H, rhs = _active_system(F, y, C * cw, A)
        target = np.linalg.solve(H, rhs)
        d = target - v
        delta = F @ d[:r] + d[r]
        t = _line_search(v @ d, d @ d, 1.0 - y * o, y * delta, cw, C)
        t = min(max(t, 0.0), 1.0) if np.isfinite(t) else 1.0
        v = v + t * d
        o = o + t * delta
        f_new = objective(v, o)
        same = previous is not None and np.array_equal(A, previous)
        if (t == 1.0 and same) or f_old - f_new <= tol * max(f_old, 1e-300):
            break
        previous, f_old = A, f_new
    return v[:r].copy(), float(v[r])


def all_traces(kernel_set: KernelSet, X) -> np.ndarray:
    """Traces of every kernel on the rows of ``X``, in row blocks (exact sums of the block sums)."""
    total = np.zeros(len(kernel_set))
    for a in range(0, X.shape[0], 1 << 16):
        total += kernel_traces(kernel_set, X[a : a + (1 << 16)])
    return total


def check_solver(solver) -> str:
    """``solver`` as the estimator takes it: "auto", "mwu" or "two-stage"."""
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise ValueError(f'solver must be "auto", "mwu" or "two-stage", got {solver!r}')
    return solver


def two_stage_blocker(data, C, estimator=None) -> str | None:
    """Why the two-stage fit cannot run on ``data`` with ``C`` and ``estimator``'s settings (None: it can)."""
    if not hasattr(data, "kernel_set") or not hasattr(data, "X"):
        return "precomputed kernels or a store (it needs in-memory feature rows)"
    if C is not None and np.isinf(C):
        return "the hard margin (C = inf)"
    if estimator is not None and getattr(estimator, "engine", "local") != "local":
        return 'engine="dask" (it runs in this process)'
    if estimator is not None and getattr(estimator, "checkpoint", None) is not None:
        return "checkpoints (they hold the MWU iterations' state)"
    return None


def resolve_solver(solver, data, C, *, estimator=None, resume=None) -> str:
    """The solver a fit runs: "mwu" or "two-stage".

    ``"auto"``: the two-stage fit from :data:`AUTO_TWO_STAGE_POINTS` training
    rows when it can run (in-memory feature rows, finite ``C``, the local
    engine, no checkpoint) and the fit does not resume an MWU checkpoint; else
    the MWU fit.  ``"two-stage"`` where it cannot run is a ValueError.
    """
    solver = check_solver(solver)
    blocker = two_stage_blocker(data, C, estimator)
    if blocker is None and resume is not None:
        blocker = "resuming an MWU checkpoint"
    if solver == "two-stage":
        if blocker is not None:
            raise ValueError(f'solver="two-stage" is not available for {blocker}')
        return solver
    if solver == "auto" and blocker is None and data.n_samples >= AUTO_TWO_STAGE_POINTS:
        return "two-stage"
    return "mwu"


def _weight_params(estimator, C_rel) -> dict:
    """The parameters of the weight stage's fit: ``estimator``'s, size-relative ``C``, local, no extras."""
    params = estimator.get_params()
    params.update(C="auto" if C_rel is None else C_rel, scale_C=True, engine="local", n_shards=1, n_kernel_shards=1,
                  checkpoint=None, probability=False)  # fmt: skip
    if "solver" in params:
        params["solver"] = "mwu"
    return params


def fit_two_stage(
    estimator,
    data,
    *,
    epsilon,
    C,
    rho: float,
    seed: int,
    sample_weight=None,
    weight_points: int | None = None,
    n_components: int = N_COMPONENTS,
    prune: float = PRUNE,
    linear: str = "newton",
) -> dict:
    """The two-stage fit of ``estimator`` on in-memory feature rows ``data``: the fitted attributes by name.

    Same contract as :func:`mwumkl_dist.fitting.fit_model` (whose arguments it
    takes), and the same attributes: the kernel weights, ``C_``, the
    selectivity and ``epsilon_`` come from the MWU fit on a stratified
    subsample of ``weight_points`` rows (None: :func:`weight_points_for`; the estimator's own fit path, with
    ``C="auto"``'s cross-validation); ``support_`` are the landmark rows and
    ``dual_coef_`` the kernel expansion of the linear model on the Nystroem
    features of each binary problem's combined kernel (see the module).
    ``kernel_traces_`` are the traces on all rows; kernels with
    ``mu_i < prune * max(mu)`` get weight 0 (the rest renormalised).  Also sets
    ``solver_`` ("two-stage"), ``weight_points_`` and ``n_components_`` (the
    rank of each problem's map).  ``linear``: "newton" (:func:`fit_squared_hinge`)
    or "liblinear" (:func:`fit_linear`), the same problem.  ``probability=True``
    calibrates on the decision values of polished MWU folds (the exact solution
    of the problem the linear stage approximates), as a polished fit does.
    """
    from . import auto
    from .fitting import drop_zero_weights, fit_model, training_classes
    from .weights import check_class_weight

    blocker = two_stage_blocker(data, C, estimator)
    if blocker is not None:
        raise ValueError(f'solver="two-stage" is not available for {blocker}')
    data, kept, sample_weight = drop_zero_weights(data, sample_weight)
    classes = training_classes(data.y)
    class_weight = check_class_weight(estimator.class_weight, classes)
    n = data.n_samples
    C_rel = None if C is None else (float(C) if estimator.scale_C else float(C) / n)
    # 1. the kernel weights (and C, the selectivity) on a subsample, by the MWU fit path.
    clock = [time.process_time()]
    rows = auto.stratified_rows(data.y, weight_points_for(n) if weight_points is None else weight_points, seed)
    missing = np.setdiff1d(classes, data.y[rows])  # a class too small to stratify: its first row joins
    if len(missing):
        rows = np.union1d(rows, [np.flatnonzero(data.y == c)[0] for c in missing])
    sub = data.subset(rows)
    sub_estimator = type(estimator)(**_weight_params(estimator, C_rel))
    sub_attrs = fit_model(sub_estimator, sub, epsilon=epsilon, C=C_rel, rho=rho, seed=seed,
                          sample_weight=None if sample_weight is None else sample_weight[rows])  # fmt: skip
    if not np.array_equal(sub_attrs["classes_"], classes):
        raise ValueError("the weight subsample misses a class; the two-stage solver needs every class in it")
    C_rel = float(sub_attrs["C_"])
    clock.append(time.process_time())
    # 2. the Nystroem map of each problem's combined kernel on shared landmarks, 3. the linear solve.
    # BLAS and LAPACK on one thread: their results change with the thread count (eigh, products), and
    # the model must not; the kernel evaluations use this thread's numba threads (same bits for any count).
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        attrs = _full_stage(estimator, data, sub_attrs, classes, class_weight, sample_weight, kept, rows, C_rel,
                            n_components=n_components, prune=prune, linear=linear, seed=seed, clock=clock)  # fmt: skip
    return attrs


def _full_stage(estimator, data, sub_attrs, classes, class_weight, sample_weight, kept, rows, C_rel, *,
                n_components, prune, linear, seed, clock) -> dict:  # fmt: skip
    """Stages 2 and 3 of :func:`fit_two_stage` (see there): the fitted attributes."""
    from .fitting import one_vs_rest_targets
    from .weights import problem_weights

    n = data.n_samples
    ks = data.kernel_set
    traces = data.traces if data.traces is not None else all_traces(ks, data.X)
    landmarks = landmark_rows(n, n_components, seed)
    L = data.X[landmarks]
    mus = np.atleast_2d(sub_attrs["kernel_weights_"]).astype(np.float64)
    targets = one_vs_rest_targets(classes)
    kernel_weights = np.zeros_like(mus)
    dual_coef = np.zeros((len(targets), len(landmarks)))
    intercept = np.zeros(len(targets))
    ranks = []
    for k, target in enumerate(targets):
        mu = np.where(mus[k] >= prune * mus[k].max(), mus[k], 0.0)
        kernel_weights[k] = mu / mu.sum()
        w = kernel_weights[k] / traces * n  # unit mean diagonal on the training rows
        fmap = nystroem_map(ks, L, w)
        y_pm = np.where(data.y == target, 1.0, -1.0)
        point_weights = problem_weights(data.y, classes, target, class_weight, sample_weight)
        solve = fit_squared_hinge if linear == "newton" else fit_linear
        features = fmap.transform(data.X)
        clock.append(time.process_time())
        coef, intercept[k] = solve(features, y_pm, C_rel, point_weights)
        del features
        clock.append(time.process_time())
        dual_coef[k] = n * fmap.expansion(coef)  # on the raw kernels: raw weights are mu / r = w / n
        ranks.append(fmap.rank)
    if estimator.probability:  # the same SVM as the exact polish solves: calibrated on polished folds
        from .fitting import platt_scaling, probability_input

        attrs_prob = platt_scaling(
            estimator, probability_input(estimator, data, seed), classes, C=C_rel, polished=True, seed=seed,
            sample_weight=sample_weight, iterations_per_point=None,
        )  # fmt: skip
    stage_seconds = np.diff(clock)
    if estimator.verbose:
        logger.info("two-stage: weights on %d rows %.1f s CPU; per problem, features and linear solve: %s",
                    len(rows), stage_seconds[0], " ".join(f"{t:.1f}" for t in stage_seconds[1:]))  # fmt: skip
    single = len(targets) == 1
    support = landmarks if kept is None else kept[landmarks]
    attrs = {
        key: sub_attrs[key]
        for key in ("epsilon_", "selectivity_", "C_path_", "selectivity_path_", "n_iter_", "interrupted_")
        if key in sub_attrs
    }
    attrs.update(
        classes_=classes,
        kernel_names_=data.kernel_names,
        n_features_in_=data.n_features_in,
        fit_warnings_=list(sub_attrs.get("fit_warnings_", [])),
        C_=C_rel if estimator.scale_C else C_rel * n,
        kernel_traces_=traces,
        kernel_weights_=kernel_weights[0] if single else kernel_weights,
        raw_kernel_weights_=(kernel_weights / traces)[0] if single else kernel_weights / traces,
        support_=support,
        support_vectors_=data.support_vectors(landmarks),
        dual_coef_=dual_coef,
        intercept_=intercept,
        polished_=False,
        solver_="two-stage",
        weight_points_=len(rows),
        n_components_=ranks[0] if single else np.array(ranks),
    )
    if estimator.probability:
        attrs["probA_"], attrs["probB_"] = attrs_prob
    return attrs

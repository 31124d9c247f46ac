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

import contextlib
import functools
import logging
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from mwumkl_dist.core.partition import aligned_ranges
from mwumkl_dist.io.zarr_format import DataStore
from mwumkl_dist.kernels.evaluation import combined_kernel, kernel_traces
from mwumkl_dist.kernels.specs import KernelSet

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
    "solve_squared_hinge",
    "all_traces",
    "row_blocks",
    "FeatureBlocks",
    "feature_memory_budget",
    "LinearShard",
    "LocalShards",
    "LinearStageProblem",
    "linear_row_ranges",
    "linear_shards",
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


def row_blocks(start: int, stop: int, row_block: int = _ROW_BLOCK) -> list[tuple[int, int]]:
    """The fixed row blocks of rows ``[start, stop)``: ``row_block`` rows each, from ``start`` (a multiple of it)."""
    return [(lo, min(lo + row_block, stop)) for lo in range(start, stop, row_block)]


def _map(fn, items) -> list:
    """``[fn(item) for item in items]`` over this thread's threads (``n_jobs``), the results in order.

    Whatever is summed from the results, in their order, does not depend on the thread count.
    """
    from concurrent.futures import ThreadPoolExecutor

    from mwumkl_dist.devices.cpu import get_num_threads

    items = list(items)
    n_threads = min(get_num_threads(), len(items))
    if n_threads <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(n_threads) as pool:
        return list(pool.map(fn, items))


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

    def features(self, X) -> np.ndarray:
        """``phi(X)`` of one block of rows, on this thread."""
        return combined_kernel(self.kernel_set, X, self.landmarks, self.weights, parallel=False) @ self.projection

    def transform(self, X) -> np.ndarray:
        """The features ``phi(X)``, ``(n, rank)``, in fixed row blocks (over threads when there are several)."""
        out = np.empty((X.shape[0], self.rank))

        def block(bounds):
            lo, hi = bounds
            out[lo:hi] = self.features(X[lo:hi])

        _map(block, row_blocks(0, X.shape[0]))
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
    K = combined_kernel(kernel_set, landmarks, landmarks, weights)
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


def feature_memory_budget() -> int:
    """Bytes a shard may hold features in before it spills them to disk (see :class:`LinearShard`).

    ``MWUMKL_FEATURE_MEMORY`` (bytes) when set; else a quarter of a Dask
    worker's ``memory_limit`` on a worker that has one (a warm worker holds
    about 300 MB itself, and Dask pauses it at 80 % of the limit), or half of
    the machine's available memory.  Call it on the worker's task thread
    (:class:`LinearShard` does, when it is built).
    """
    env = os.environ.get("MWUMKL_FEATURE_MEMORY")
    if env:
        return int(float(env))
    limit = getattr(getattr(_dask_worker(), "memory_manager", None), "memory_limit", None)
    if limit:
        return int(limit // 4)
    return int(_available_memory() // 2)


def _available_memory() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _dask_worker():
    """The Dask worker this task runs on, or None (not on a worker's task thread, or no ``distributed``)."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def _scratch_dir() -> str:
    """Where spilled features go: ``MWUMKL_SCRATCH``, a Dask worker's local directory, or the temp directory."""
    return os.environ.get("MWUMKL_SCRATCH") or getattr(_dask_worker(), "local_directory", None) or tempfile.gettempdir()


class FeatureBlocks:
    """A shard's feature blocks, in memory or spilled to an (unlinked) temporary file read back block by block.

    Spilled, the shard's memory holds one block per thread at a time; the file
    vanishes when it is closed, or with the process.
    """

    def __init__(self, sizes, rank: int, spill_dir: str | None = None):
        self.sizes = [int(s) for s in sizes]
        self.rank = int(rank)
        self._blocks: list = [None] * len(self.sizes)
        self._fd = None
        if spill_dir is not None:
            fd, path = tempfile.mkstemp(prefix="mwumkl-features-", suffix=".f64", dir=spill_dir)
            os.unlink(path)
            self._fd = fd
            self._offsets = np.concatenate(([0], np.cumsum(self.sizes))) * self.rank * 8

    @property
    def spilled(self) -> bool:
        return self._fd is not None

    @property
    def nbytes(self) -> int:
        return sum(self.sizes) * self.rank * 8

    def put(self, i: int, F: np.ndarray) -> None:
        if self._fd is None:
            self._blocks[i] = F
            return
        view = memoryview(np.ascontiguousarray(F, dtype=np.float64)).cast("B")
        offset, done = int(self._offsets[i]), 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], offset + done)

    def get(self, i: int) -> np.ndarray:
        if self._fd is None:
            return self._blocks[i]
        out = np.empty((self.sizes[i], self.rank))
        view = memoryview(out).cast("B")
        offset, done = int(self._offsets[i]), 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"spilled features: short read in block {i}")
            done += got
        return out

    def close(self) -> None:
        self._blocks = [None] * len(self.sizes)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _GivenFeatures:
    """The rows are the features themselves (:func:`fit_squared_hinge` on an array)."""

    def __init__(self, rank: int):
        self.rank = rank

    def features(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float64)


def _one_blas_thread():
    """BLAS on one thread: products and solves whose bits would change with its thread count."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


class LinearShard:
    """Rows ``[start, stop)`` of the linear stage: their features of one binary problem's combined kernel.

    ``rows`` are the shard's rows (an array or CSR matrix, its row 0 being row
    ``start``) or a :class:`~mwumkl_dist.stores.DataStore`, read block by block
    and never held whole.  The rows are cut into the fixed blocks of
    :func:`row_blocks` (``start`` is a multiple of ``row_block``), so every
    sharding evaluates the same blocks with the same operations: the driver
    sums their parts in row order and gets the same bits for any sharding.
    Features are held in memory, or spilled to a temporary file when they
    exceed :func:`feature_memory_budget` where the shard is built (``spill="auto"``; True/False force it).
    The shard keeps no iteration state (the active rows come with each call),
    so a lost shard is rebuilt by loading its problem again.
    """

    #: What the Dask engine's shard servers may call.
    REMOTE_METHODS = frozenset({"trace_parts", "load_problem", "active_parts", "direction"})

    def __init__(self, rows, start: int, stop: int, kernel_set=None, row_block: int | None = None, spill="auto"):
        row_block = _ROW_BLOCK if row_block is None else int(row_block)
        if start % row_block:
            raise ValueError(f"a linear-stage shard starts on a row block ({row_block} rows), not at row {start}")
        self.rows, self.start, self.stop = rows, int(start), int(stop)
        self.kernel_set = kernel_set
        self.blocks = row_blocks(self.start, self.stop, row_block)
        self.spill = spill
        # Where it is built: on a Dask worker's task thread (its calls later run on the shard server's thread,
        # which cannot see the worker's memory limit or local directory).
        self._budget, self._scratch = feature_memory_budget(), _scratch_dir()
        self.features_: FeatureBlocks | None = None
        self.y = self.cw = None

    def _read(self, lo: int, hi: int):
        if isinstance(self.rows, DataStore):
            return self.rows.read_rows(lo, hi)
        return self.rows[lo - self.start : hi - self.start]

    def _local(self, i: int) -> slice:
        lo, hi = self.blocks[i]
        return slice(lo - self.start, hi - self.start)

    def trace_parts(self) -> list:
        """Every kernel's trace on each block (summed by the driver in row order)."""
        return _map(lambda b: kernel_traces(self.kernel_set, self._read(*b)), self.blocks)

    def load_problem(self, feature_map, y, cw) -> bool:
        """Compute the rows' features under ``feature_map`` (``.rank``, ``.features(X)``); labels +-1, ``C c_j``.

        Returns whether the features were spilled to disk.
        """
        self.close()
        sizes = [hi - lo for lo, hi in self.blocks]
        nbytes = sum(sizes) * feature_map.rank * 8
        spill = self.spill is True or (self.spill == "auto" and nbytes > self._budget)
        self.features_ = FeatureBlocks(sizes, feature_map.rank, self._scratch if spill else None)
        self.y = np.asarray(y, dtype=np.float64)
        self.cw = np.asarray(cw, dtype=np.float64)

        def build(i):
            self.features_.put(i, feature_map.features(self._read(*self.blocks[i])))

        with _one_blas_thread():
            _map(build, range(len(self.blocks)))
        return self.features_.spilled

    def active_parts(self, active_bits) -> list:
        """Per block, ``(Z_A' D Z_A, Z_A' D y_A)`` over its active rows (``Z = [F, 1]``, ``D = diag(C c)``), or None.

        ``active_bits``: ``np.packbits`` of the shard's active-row mask.
        """
        active = np.unpackbits(active_bits, count=self.stop - self.start).astype(bool)
        r = self.features_.rank

        def part(i):
            rows = np.flatnonzero(active[self._local(i)])
            if not len(rows):
                return None
            F = self.features_.get(i)
            y, cw = self.y[self._local(i)][rows], self.cw[self._local(i)][rows]
            sw = np.sqrt(cw)
            Z = np.empty((len(rows), r + 1))
            Z[:, :r] = F[rows]
            Z[:, r] = 1.0
            Z *= sw[:, None]
            return Z.T @ Z, Z.T @ (sw * y)

        with _one_blas_thread():
            return _map(part, range(len(self.blocks)))

    def direction(self, d) -> np.ndarray:
        """``F d[:r] + d[r]`` on the shard's rows."""
        r = self.features_.rank
        with _one_blas_thread():
            parts = _map(lambda i: self.features_.get(i) @ d[:r] + d[r], range(len(self.blocks)))
        return np.concatenate(parts) if parts else np.zeros(0)

    def close(self) -> None:
        if self.features_ is not None:
            self.features_.close()
            self.features_ = None


class LocalShards:
    """Linear-stage shards in this process, with the Dask engine's ``map`` (the same calls, the same bits)."""

    def __init__(self, shards):
        self.shards = list(shards)
        self.restore = None  # the Dask engine's rebuild hook; nothing is lost here

    def map(self, method: str, args_for=None, shared: bool = False) -> list:
        """``shard.method(*args_for((start, stop)))`` on every shard, the results in row order."""
        return [getattr(s, method)(*(args_for((s.start, s.stop)) if args_for else ())) for s in self.shards]

    def close(self) -> None:
        for s in self.shards:
            s.close()


def linear_row_ranges(n_samples: int, n_shards: int, row_block: int = _ROW_BLOCK) -> list[tuple[int, int]]:
    """Row ranges of the linear stage's shards: on row-block boundaries (at most one shard per block)."""
    return aligned_ranges(n_samples, row_block, min(int(n_shards), -(-n_samples // row_block)))


class LinearStageProblem:
    """The linear stage of a training input as a problem for :class:`~mwumkl_dist.engines.dask.DaskEngine`.

    Its shards are :class:`LinearShard`; a store's shards read their rows on
    their workers, an array's shards are sent their rows.
    """

    n_kernels = 1  # the engine's kernel axis is not used

    def __init__(self, data, row_block: int = _ROW_BLOCK, spill="auto"):
        self.source = data.store if isinstance(getattr(data, "store", None), DataStore) else data.X
        self.n_samples = data.n_samples
        self.kernel_set = data.kernel_set
        self.row_block = row_block
        self.spill = spill

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        return linear_row_ranges(self.n_samples, n_shards, self.row_block)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return [(0, 1)]

    def shard_factory(self, start: int, stop: int, kernels=None):
        rows = self.source if isinstance(self.source, DataStore) else self.source[start:stop]
        return functools.partial(LinearShard, rows, start, stop, self.kernel_set, self.row_block, self.spill)

    def make_shard(self, start: int, stop: int, kernels=None) -> LinearShard:
        return self.shard_factory(start, stop, kernels)()


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
    ``shards``: :class:`LocalShards` or a Dask engine of :class:`LinearShard`,
    their problems loaded with ``cw = C c`` and features of ``rank`` columns.
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
        for parts in shards.map("active_parts", lambda rows, a=active: (np.packbits(a[rows[0] : rows[1]]),)):
            for p in parts:  # in row order
                if p is not None:
                    H += p[0]
                    rhs += p[1]
        H[np.diag_indices(r + 1)] += 1.0
        target = np.linalg.solve(H, rhs)
        d = target - v
        delta = np.concatenate(shards.map("direction", lambda rows, d=d: (d,), shared=True))
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
    shard = LinearShard(F, 0, F.shape[0], spill=False)
    shard.load_problem(_GivenFeatures(F.shape[1]), y, float(C) * cw)
    return solve_squared_hinge(LocalShards([shard]), F.shape[1], y, C, cw, tol=tol, max_iter=max_iter)


def all_traces(kernel_set: KernelSet, X) -> np.ndarray:
    """Traces of every kernel on the rows of ``X``: the block traces of :func:`row_blocks`, summed in order."""
    shard = LinearShard(X, 0, X.shape[0], kernel_set, spill=False)
    return _sum_parts(shard.trace_parts(), len(kernel_set))


def _sum_parts(parts, size: int) -> np.ndarray:
    total = np.zeros(size)
    for p in parts:
        total += p
    return total


def check_solver(solver) -> str:
    """``solver`` as the estimator takes it: "auto", "mwu" or "two-stage"."""
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise ValueError(f'solver must be "auto", "mwu" or "two-stage", got {solver!r}')
    return solver


def two_stage_blocker(data, C, estimator=None) -> str | None:
    """Why the two-stage fit cannot run on ``data`` with ``C`` and ``estimator``'s settings (None: it can)."""
    if not hasattr(data, "kernel_set"):
        return "precomputed kernels (it needs feature rows, in memory or in a data store)"
    if C is not None and np.isinf(C):
        return "the hard margin (C = inf)"
    if estimator is not None and getattr(estimator, "checkpoint", None) is not None:
        return "checkpoints (they hold the MWU iterations' state)"
    if estimator is not None and getattr(estimator, "device", "cpu") != "cpu":
        return f'device="{estimator.device}" (the two-stage fit runs on the CPU)'
    return None


def resolve_solver(solver, data, C, *, estimator=None, resume=None) -> str:
    """The solver a fit runs: "mwu" or "two-stage".

    ``"auto"``: the two-stage fit from :data:`AUTO_TWO_STAGE_POINTS` training
    rows when it can run (feature rows in memory or in a data store, finite
    ``C``, no checkpoint, the CPU; either engine) and the fit does not resume
    an MWU checkpoint; else the MWU fit.  ``"two-stage"`` where it cannot run
    is a ValueError.
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


@contextlib.contextmanager
def linear_shards(estimator, data, client=None, row_block: int | None = None, spill="auto"):
    """The linear stage's shards of ``data`` (``estimator.n_shards`` of them) on the estimator's engine.

    Local: :class:`LocalShards` in this process; ``engine="dask"``: a
    :class:`~mwumkl_dist.engines.dask.DaskEngine` of :class:`LinearShard` on
    ``client``'s workers (each shard reads or is sent its own rows).  Both give
    the same bits for any shard count.
    """
    row_block = _ROW_BLOCK if row_block is None else int(row_block)
    problem = LinearStageProblem(data, row_block, spill)
    if getattr(estimator, "engine", "local") == "dask":
        from mwumkl_dist.engines.dask import DaskEngine
        from mwumkl_dist.solvers.driver import DEFAULT_WORKER_TIMEOUT

        timeout = getattr(estimator, "worker_timeout", DEFAULT_WORKER_TIMEOUT)
        shards = DaskEngine(problem, client, n_shards=estimator.n_shards, n_kernel_shards=1, timeout=timeout)
    else:
        shards = LocalShards(problem.make_shard(*rows) for rows in problem.row_ranges(estimator.n_shards))
    try:
        yield shards
    finally:
        shards.close()


def fit_two_stage(
    estimator,
    data,
    *,
    epsilon,
    C,
    rho: float,
    seed: int,
    sample_weight=None,
    client=None,
    weight_points: int | None = None,
    n_components: int = N_COMPONENTS,
    prune: float = PRUNE,
    row_block: int | None = None,
    spill="auto",
) -> dict:
    """The two-stage fit of ``estimator`` on feature rows ``data``: the fitted attributes by name.

    Same contract as :func:`mwumkl_dist.solvers.driver.fit_model` (whose arguments it
    takes), and the same attributes: the kernel weights, ``C_``, the
    selectivity and ``epsilon_`` come from the MWU fit on a stratified
    subsample of ``weight_points`` rows (None: :func:`weight_points_for`; the
    estimator's own fit path, with ``C="auto"``'s cross-validation, in this
    process); ``support_`` are the landmark rows and ``dual_coef_`` the kernel
    expansion of the linear model on the Nystroem features of each binary
    problem's combined kernel (see the module), solved over the shards of
    :func:`linear_shards` (``engine="dask"``: on ``client``'s workers; a data
    store is read block by block, by the shards).  ``kernel_traces_`` are the
    traces on all rows; kernels with ``mu_i < prune * max(mu)`` get weight 0
    (the rest renormalised).  Also sets ``solver_`` ("two-stage"),
    ``weight_points_``, ``n_components_`` (the rank of each problem's map) and
    ``features_spilled_`` (whether a shard kept its features on disk).
    ``probability=True`` calibrates on the decision values of polished MWU
    folds (the exact solution of the problem the linear stage approximates),
    as a polished fit does.
    """
    from mwumkl_dist.data.weights import check_class_weight
    from mwumkl_dist.solvers import auto
    from mwumkl_dist.solvers.driver import drop_zero_weights, fit_model, training_classes

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
    sub = data.rows_in_memory(rows)
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
    with linear_shards(estimator, data, client, row_block, spill) as shards, _one_blas_thread():
        return _full_stage(estimator, data, shards, sub_attrs, classes, class_weight, sample_weight, kept, rows,
                           C_rel, n_components=n_components, prune=prune, seed=seed, clock=clock)  # fmt: skip


def _full_stage(estimator, data, shards, sub_attrs, classes, class_weight, sample_weight, kept, rows, C_rel, *,
                n_components, prune, seed, clock) -> dict:  # fmt: skip
    """Stages 2 and 3 of :func:`fit_two_stage` (see there) on ``shards``: the fitted attributes."""
    from mwumkl_dist.data.weights import problem_weights
    from mwumkl_dist.solvers.driver import one_vs_rest_targets

    n = data.n_samples
    ks = data.kernel_set
    if data.traces is not None:
        traces = data.traces
    else:  # the blocks' traces, summed in row order
        traces = _sum_parts((p for parts in shards.map("trace_parts") for p in parts), len(ks))
    landmarks = landmark_rows(n, n_components, seed)
    L = data.support_vectors(landmarks)
    mus = np.atleast_2d(sub_attrs["kernel_weights_"]).astype(np.float64)
    targets = one_vs_rest_targets(classes)
    kernel_weights = np.zeros_like(mus)
    dual_coef = np.zeros((len(targets), len(landmarks)))
    intercept = np.zeros(len(targets))
    ranks, spilled = [], False
    for k, target in enumerate(targets):
        mu = np.where(mus[k] >= prune * mus[k].max(), mus[k], 0.0)
        kernel_weights[k] = mu / mu.sum()
        w = kernel_weights[k] / traces * n  # unit mean diagonal on the training rows
        fmap = nystroem_map(ks, L, w)
        y_pm = np.where(data.y == target, 1.0, -1.0)
        point_weights = problem_weights(data.y, classes, target, class_weight, sample_weight)
        cw = np.ones(n) if point_weights is None else np.asarray(point_weights, dtype=np.float64)
        ccw = C_rel * cw

        def load(rows, fmap=fmap, y_pm=y_pm, ccw=ccw):
            return (fmap, y_pm[rows[0] : rows[1]], ccw[rows[0] : rows[1]])

        shards.restore = lambda rows, load=load: [("load_problem", load(rows))]  # a rebuilt Dask shard
        spilled |= any(shards.map("load_problem", load))
        clock.append(time.process_time())
        coef, intercept[k] = solve_squared_hinge(shards, fmap.rank, y_pm, C_rel, cw)
        clock.append(time.process_time())
        dual_coef[k] = n * fmap.expansion(coef)  # on the raw kernels: raw weights are mu / r = w / n
        ranks.append(fmap.rank)
    shards.restore = None
    if estimator.probability:  # the same SVM as the exact polish solves: calibrated on polished folds
        from mwumkl_dist.solvers.driver import platt_scaling, probability_input

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
        support_vectors_=L,
        dual_coef_=dual_coef,
        intercept_=intercept,
        polished_=False,
        solver_="two-stage",
        weight_points_=len(rows),
        n_components_=ranks[0] if single else np.array(ranks),
        features_spilled_=bool(spilled),
    )
    if estimator.probability:
        attrs["probA_"], attrs["probB_"] = attrs_prob
    return attrs

"""Kernel evaluation on data: the values of a kernel set's kernels on given rows.

The one module that evaluates kernels on rows from Python:

* with the numba primitives of :mod:`mwumkl_dist.devices.cpu`, bit for bit
  what a training shard's superstep adds to ``V``: the kernel values of two
  points (:func:`point_kernel_block`), of rows against two points
  (:func:`kernel_columns`), whole columns (:func:`kernel_column_block`, what a
  kernel store holds), the diagonal (:func:`kernel_diagonal`) and the weighted
  sums against support vectors that predict (:func:`support_vector_sums`);
* with numpy, dense blocks: traces, kernel matrices and combined kernels.  The
  solver itself never forms an ``n x n`` matrix; these do, on purpose, for the
  steps that need one: the exact re-solve of the 2-norm soft-margin SVM on a
  support set with the learned kernel weights, and the "Uniform" baseline.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from mwumkl_dist.core.exact import exact_sums_by_column
from mwumkl_dist.devices import cpu as _columns
from mwumkl_dist.kernels.specs import GAUSSIAN, LINEAR, POLYNOMIAL, DataScale, FeatureSums, KernelPlan, KernelSet

__all__ = [
    "as_csr",
    "plan_args",
    "SparsePoint",
    "point_entries",
    "point_kernel_block",
    "row_group_sqnorms",
    "kernel_columns",
    "kernel_column_block",
    "kernel_diagonal",
    "support_vector_sums",
    "kernel_traces",
    "combined_kernel",
    "evaluation_counts",
    "kernel_matrices",
    "data_scale",
    "neighbour_distance",
    "scale_sample_rows",
]

#: Rows per block when the data's scale is summed (bounds the exact sums' temporaries).
_SCALE_ROWS = 1 << 14

#: Entries per temporary block (about 32 MB of float64 each).
_BLOCK_ENTRIES = 1 << 22


# ----------------------------------------------------------------------------- rows and plans


def as_csr(X) -> sp.csr_matrix:
    """Rows as CSR with float64 data, int32/int64 indices and sorted, de-duplicated entries."""
    csr = sp.csr_matrix(X, dtype=np.float64) if not sp.issparse(X) else X.tocsr().astype(np.float64)
    csr.sum_duplicates()
    # One index dtype (int32 unless the matrix needs int64): the numba kernels then compile once.
    index = np.int32 if max(csr.nnz, *csr.shape) < 2**31 else np.int64
    if csr.indices.dtype != index or csr.indptr.dtype != index:
        csr.indices = csr.indices.astype(index)
        csr.indptr = csr.indptr.astype(index)
    return csr


def plan_args(plan: KernelPlan) -> _columns.PlanArrays:
    """The plan's arrays in the order the numba kernels take them (the wrappers' one ``plan`` argument)."""
    return _columns.PlanArrays(
        plan.kind,
        plan.param_a,
        plan.param_b,
        plan.group,
        plan.square_of,
        plan.order,
        plan.feat_ptr,
        plan.feat_groups,
        plan.n_groups,
    )


# ----------------------------------------------------------------------------- the numba primitives


class SparsePoint:
    """A feature vector by its non-zero entries: what a superstep sends for a picked row.

    A picked row travels from its shard to the driver and to every shard each
    iteration; as its entries it costs ``O(non-zeros)`` there and in every use,
    where a dense vector would cost ``O(n_features)`` (a single row with feature
    index 1,000,000 made every iteration ten times slower).  ``np.asarray(point)``
    gives the dense vector.

    Parameters
    ----------
    indices : ndarray of int
        Feature indices, strictly increasing.
    values : ndarray of float
        The non-zero values at ``indices``.
    n_features : int
        The vector's length.
    """

    __slots__ = ("indices", "values", "n_features")

    def __init__(self, indices, values, n_features: int):
        self.indices = np.ascontiguousarray(indices, dtype=np.int64)
        self.values = np.ascontiguousarray(values, dtype=np.float64)
        self.n_features = int(n_features)

    @classmethod
    def from_csr_row(cls, X: sp.csr_matrix, row: int) -> SparsePoint:
        """Row ``row`` of a CSR matrix with sorted, de-duplicated indices (:func:`as_csr`); explicit zeros dropped."""
        a, b = X.indptr[row], X.indptr[row + 1]
        values = X.data[a:b]
        keep = values != 0.0
        return cls(X.indices[a:b][keep], values[keep], X.shape[1])

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, values)``, as the numba kernels take a point."""
        return self.indices, self.values

    def __array__(self, dtype=None, copy=None):
        out = np.zeros(self.n_features, dtype=np.float64)
        out[self.indices] = self.values
        return out if dtype is None else out.astype(dtype, copy=False)

    def __reduce__(self):
        return type(self), (self.indices, self.values, self.n_features)

    def __repr__(self):
        return f"SparsePoint({len(self.indices)} non-zeros of {self.n_features} features)"


def point_entries(p) -> tuple[np.ndarray, np.ndarray]:
    """A point's ``(indices, values)``: a :class:`SparsePoint`'s own, or the non-zeros of a dense vector."""
    if isinstance(p, SparsePoint):
        return p.entries()
    return _columns.point_entries(p)


def point_kernel_block(plan: KernelPlan, p, q):
    """Raw ``K_i(p, p)``, ``K_i(q, q)``, ``K_i(p, q)`` for two points (:class:`SparsePoint` or dense vectors).

    The same numbers the shards' column passes produce for these rows.
    """
    return _columns.point_kernels(point_entries(p), point_entries(q), plan_args(plan))


def row_group_sqnorms(X: sp.csr_matrix, plan: KernelPlan) -> np.ndarray:
    """Each row's squared norm on each feature group of the plan, ``(n_rows, n_groups)``.

    Group-major in memory (the transpose of a C-ordered ``(n_groups, n_rows)``
    array: a group's rows are contiguous), as the column passes read it.
    ``X`` is CSR (:func:`as_csr`).
    """
    row_sq = _columns.group_sqnorms(X.indptr, X.indices, X.data, plan.feat_ptr, plan.feat_groups, plan.n_groups)
    return np.ascontiguousarray(row_sq.T).T


def kernel_columns(X: sp.csr_matrix, plan: KernelPlan, p, q, row_sq=None) -> tuple[np.ndarray, np.ndarray]:
    """Raw kernel values of the CSR rows ``X`` against two points, ``(n_rows, m)`` each.

    The numbers a superstep adds to ``V`` (before the label, trace and ridge
    factors); ``row_sq`` is :func:`row_group_sqnorms` of ``X`` (computed when None).
    """
    return _columns.kernel_columns(X, p, q, plan_args(plan), row_sq=row_sq)


def kernel_column_block(X: sp.csr_matrix, plan: KernelPlan, c0: int, c1: int, row_sq=None) -> np.ndarray:
    """Columns ``c0..c1-1`` of every kernel on the CSR rows ``X``: ``out[i, c - c0, r] = K_i(x_r, x_c)``.

    Two columns at a time with :func:`kernel_columns` (the same numbers as a
    training shard's), ``(m, c1 - c0, n_rows)``; what a kernel store holds.
    """
    if row_sq is None:
        row_sq = row_group_sqnorms(X, plan)
    out = np.empty((plan.n_kernels, c1 - c0, X.shape[0]))
    for j in range(c0, c1, 2):
        p = np.asarray(X[j].toarray()).ravel()
        q = np.asarray(X[min(j + 1, c1 - 1)].toarray()).ravel()
        colp, colq = kernel_columns(X, plan, p, q, row_sq)
        out[:, j - c0, :] = colp.T
        if j + 1 < c1:
            out[:, j + 1 - c0, :] = colq.T
    return out


def kernel_diagonal(X: sp.csr_matrix, plan: KernelPlan) -> np.ndarray:
    """``K_i(x_j, x_j)`` for the CSR rows ``X``, ``(n_rows, m)``."""
    return _columns.kernel_diagonal(X, plan_args(plan))


def support_vector_sums(plan: KernelPlan, X, support_vectors, coef, weights, sums=None) -> np.ndarray:
    """``out[t, k] = sum_j coef[k, j] sum_i weights[k, i] K_i(x_t, sv_j)``: decision values of rows ``X``.

    ``sums`` computes them from CSR arrays (the signature of
    :func:`mwumkl_dist.devices.cpu.weighted_kernel_sums`, the default; a GPU
    twin takes the same arguments).
    """
    Xq = as_csr(X)
    sv = as_csr(support_vectors)
    # (n_sv, n_groups) in Fortran order: the CPU predictor reads it per group without a transposed copy.
    sv_sq = _columns.group_sqnorms_t(sv.indptr, sv.indices, sv.data, plan.feat_ptr, plan.feat_groups, plan.n_groups).T
    sums = _columns.weighted_kernel_sums if sums is None else sums
    return sums(Xq, plan.n_features, sv, sv_sq, np.ascontiguousarray(coef), np.ascontiguousarray(weights),
                plan_args(plan))  # fmt: skip


# ----------------------------------------------------------------------------- dense blocks


def _group_features(ks: KernelSet) -> list[np.ndarray]:
    """Feature indices of each group of the compiled plan (ascending)."""
    plan = ks.plan
    feature = np.repeat(np.arange(plan.n_features, dtype=np.int64), np.diff(plan.feat_ptr))
    by_group = np.argsort(plan.feat_groups, kind="stable")  # features stay ascending within a group
    bounds = np.searchsorted(plan.feat_groups[by_group], np.arange(plan.n_groups + 1))
    feats = feature[by_group]
    return [feats[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _group_members(plan) -> list[np.ndarray]:
    """Each group's kernels in the plan's evaluation order (``order`` restricted to the group)."""
    order = np.asarray(plan.order, dtype=np.int64)
    by_group = order[np.argsort(plan.group[order], kind="stable")]
    bounds = np.searchsorted(plan.group[by_group], np.arange(plan.n_groups + 1))
    return [by_group[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _columns_dense(X, cols: np.ndarray) -> np.ndarray:
    sub = X[:, cols]
    return sub.toarray() if sp.issparse(sub) else np.asarray(sub, dtype=np.float64)


def _stored_columns(cols: np.ndarray, *mats) -> np.ndarray:
    """``cols`` less the features no sparse matrix of ``mats`` stores a value of (all ``cols`` if one is dense).

    Features that are zero in every row add nothing to dot products or norms: leaving them out keeps a
    dense block of sparse rows as wide as the features they use, not as the largest index (one index of
    10^7 in 270 rows would make a (270, 10^7) block).
    """
    if not all(sp.issparse(M) for M in mats):
        return cols
    used = np.zeros(0, dtype=np.int64)
    for M in mats:
        used = np.union1d(used, as_csr(M).indices)
    if len(used) * 2 >= len(cols):  # little to gain: the same block (and bits) as before
        return cols
    return cols[np.isin(cols, used, assume_unique=False)]


def _as_kernel_set(kernels, n_features: int) -> KernelSet:
    return kernels if isinstance(kernels, KernelSet) else KernelSet(kernels, n_features)


def kernel_traces(kernels, X) -> np.ndarray:
    """Traces ``r_i = sum_j K_i(x_j, x_j)`` of every kernel on the rows of ``X``."""
    X = X if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    ks = _as_kernel_set(kernels, X.shape[1])
    plan = ks.plan
    out = np.empty(len(ks))
    for cols, members in zip(_group_features(ks), _group_members(plan)):
        sq = (_columns_dense(X, _stored_columns(cols, X)) ** 2).sum(axis=1)
        for i in np.sort(members):
            if plan.kind[i] == LINEAR:
                out[i] = sq.sum()
            elif plan.kind[i] == POLYNOMIAL:
                out[i] = ((sq + plan.param_b[i]) ** plan.param_a[i]).sum()
            else:
                out[i] = float(X.shape[0])
    return out


def _kernel_blocks(ks: KernelSet, X, Z, wanted: np.ndarray):
    """Yield ``(i, a, K_i(X[a:a+b], Z))`` for the kernels ``i`` with ``wanted[i]``, block by block.

    One feature group at a time (one matrix product per group, one ``exp`` per
    Gaussian squaring chain), in row blocks of ``X``, so the temporary memory
    stays near ``2**22`` entries per kernel of a group.  Within a block the
    kernels come in the plan's chain order.
    """
    plan = ks.plan
    n_x, n_z = X.shape[0], Z.shape[0]
    block = max(1, min(n_x, _BLOCK_ENTRIES // max(n_z, 1)))
    for cols, group_members in zip(_group_features(ks), _group_members(plan)):
        if not wanted[group_members].any():
            continue
        members = [int(i) for i in group_members]
        needed = {int(plan.square_of[i]) for i in members if plan.square_of[i] >= 0}
        cols = _stored_columns(cols, X, Z)
        Zg = _columns_dense(Z, cols)
        sqz = (Zg**2).sum(axis=1)
        for a in range(0, n_x, block):
            Xg = _columns_dense(X[a : a + block], cols)
            dot = Xg @ Zg.T
            d2 = None
            values: dict[int, np.ndarray] = {}
            for i in members:
                kind = plan.kind[i]
                if kind == LINEAR:
                    k = dot
                elif kind == POLYNOMIAL:
                    k = (dot + plan.param_b[i]) ** int(plan.param_a[i])
                elif kind == GAUSSIAN:
                    src = int(plan.square_of[i])
                    if src >= 0:
                        k = values[src] * values[src]
                    else:
                        if d2 is None:
                            d2 = np.maximum((Xg**2).sum(axis=1)[:, None] + sqz[None, :] - 2.0 * dot, 0.0)
                        k = np.exp(-plan.param_a[i] * d2)
                else:  # pragma: no cover - the plan only holds the three kinds
                    raise ValueError(f"unknown kernel kind {kind}")
                if i in needed:
                    values[i] = k
                if wanted[i]:
                    yield i, a, k


def _dense_pair(kernels, X, Z):
    X = X if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    Z = Z if sp.issparse(Z) else np.asarray(Z, dtype=np.float64)
    if X.shape[1] != Z.shape[1]:
        raise ValueError(f"X has {X.shape[1]} features but Z has {Z.shape[1]}")
    return _as_kernel_set(kernels, X.shape[1]), X, Z


@njit(cache=True, error_model="numpy", nogil=True)
def _combine_rows(dot, sqx, sqz, kind, param_a, param_b, source, members, w, out, lo, hi):  # pragma: no cover
    """``out[lo:hi] += sum_i w[i] K_i`` over one feature group's ``members`` (chain order), from its dots.

    Row by row, one kernel at a time over the row's entries (loops the compiler vectorises; 4x faster
    than every kernel of one entry at a time), in the plan's chain order: a Gaussian's square from
    its source's values (``source[t]``: the position in ``members`` of member ``t``'s source, -1 for
    none), with the platform's ``exp``.  Each entry sees the same operations in the same order as
    one entry at a time would (``out`` plus ``w[i] K_i`` in member order), and entries are
    independent: any split of the rows gives the same bits.
    """
    n_b = dot.shape[1]
    vals = np.empty((members.shape[0], n_b))
    d2 = np.empty(n_b)
    for a in range(lo, hi):
        for b in range(n_b):
            t2 = sqx[a] + sqz[b] - 2.0 * dot[a, b]
            d2[b] = t2 if t2 > 0.0 else 0.0
        for t in range(members.shape[0]):
            i = members[t]
            src = source[t]
            if src >= 0:
                for b in range(n_b):
                    vals[t, b] = vals[src, b] * vals[src, b]
            elif kind[i] == 0:
                for b in range(n_b):
                    vals[t, b] = dot[a, b]
            elif kind[i] == 1:
                shift, degree = param_b[i], int(param_a[i])
                for b in range(n_b):
                    base = dot[a, b] + shift
                    k = base
                    for _ in range(degree - 1):
                        k *= base
                    vals[t, b] = k
            else:
                scale = -param_a[i]
                for b in range(n_b):
                    vals[t, b] = math.exp(scale * d2[b])
            wi = w[i]
            if wi != 0.0:
                for b in range(n_b):
                    out[a, b] += wi * vals[t, b]


@njit(cache=True, error_model="numpy", nogil=True, parallel=True)
def _combine_chunks(dot, sqx, sqz, kind, param_a, param_b, source, members, w, out, n_chunks):  # pragma: no cover
    n = dot.shape[0]
    for c in prange(n_chunks):
        _combine_rows(dot, sqx, sqz, kind, param_a, param_b, source, members, w, out, c * n // n_chunks,
                      (c + 1) * n // n_chunks)  # fmt: skip


def _combine(dot, sqx, sqz, plan_arrays, members, w, out, parallel: bool = True) -> None:
    """:func:`_combine_rows` on all rows, in row chunks over this thread's numba threads (same bits)."""
    kind, param_a, param_b, square_of = plan_arrays
    position = {int(i): t for t, i in enumerate(members)}
    source = np.array([position.get(int(square_of[i]), -1) if square_of[i] >= 0 else -1 for i in members],
                      dtype=np.int64)  # fmt: skip
    work = dot.shape[0] * len(members) * max(1, dot.shape[1] // 64) if parallel else 0
    with _columns.parallel(_columns.threads_for(work)) as n_chunks:
        if n_chunks == 1:
            _combine_rows(dot, sqx, sqz, kind, param_a, param_b, source, members, w, out, 0, dot.shape[0])
        else:
            _combine_chunks(dot, sqx, sqz, kind, param_a, param_b, source, members, w, out, n_chunks)


def _needed(plan, weights) -> np.ndarray:
    """Which kernels :func:`combined_kernel` evaluates: those of non-zero weight and the sources of their squares."""
    needed = np.asarray(weights) != 0.0
    for i in plan.order[::-1]:  # sources come before their squares in the chain order
        if needed[i] and plan.square_of[i] >= 0:
            needed[plan.square_of[i]] = True
    return needed


def evaluation_counts(kernels: KernelSet, weights) -> tuple[int, int, int]:
    """What one entry of :func:`combined_kernel` costs: ``(feature groups, exponentials, other kernels)``.

    Each feature group with a kernel to evaluate is one dot product and distance; each Gaussian that is
    not the square of another one ``exp``; the rest (squares, polynomials, linear kernels) a few products.
    """
    plan = kernels.plan
    needed = _needed(plan, np.asarray(weights, dtype=np.float64))
    groups = sum(1 for members in _group_members(plan) if needed[members].any())
    exps = int(np.count_nonzero(needed & (np.asarray(plan.kind) == 2) & (np.asarray(plan.square_of) < 0)))
    return groups, exps, int(np.count_nonzero(needed)) - exps


def combined_kernel(kernels, X, Z, weights, parallel: bool = True, out=None, work=None) -> np.ndarray:
    """``sum_i weights[i] K_i(X, Z)`` as a dense ``(n_X, n_Z)`` array.

    One pass per feature group: one matrix product, then every kernel value of
    an entry in registers (:func:`_combine_rows`), over this thread's numba
    threads when ``parallel`` (the same bits for any thread count).  A kernel
    of weight 0 is not evaluated unless a kernel of non-zero weight is its
    square (a Gaussian squaring chain).

    Parameters
    ----------
    kernels : KernelSet, spec string or list of specs
    X, Z : array-like or sparse matrix with the same number of features
    weights : array-like of shape (n_kernels,)
    parallel : bool, default=True
        Use this thread's numba threads (False: this thread only, e.g. inside a thread pool).
    out : ndarray of shape (n_X, n_Z), float64 and C-contiguous, optional
        Where the result is written (and returned); its contents are overwritten.
    work : ndarray of float64, at least n_X * n_Z entries, optional
        Where each group's products are formed.  With ``out`` the call allocates nothing of the result's size
        (a caller that evaluates block after block reuses the two; :mod:`mwumkl_dist.devices.scratch`).
    """
    ks, X, Z = _dense_pair(kernels, X, Z)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(ks),):
        raise ValueError(f"weights must have shape ({len(ks)},), got {w.shape}")
    plan = ks.plan
    needed = _needed(plan, w)
    if out is None:
        out = np.zeros((X.shape[0], Z.shape[0]))
    else:
        out[...] = 0.0
    plan_arrays = (
        np.ascontiguousarray(plan.kind, dtype=np.int64),
        np.ascontiguousarray(plan.param_a, dtype=np.float64),
        np.ascontiguousarray(plan.param_b, dtype=np.float64),
        np.ascontiguousarray(plan.square_of, dtype=np.int64),
    )
    for cols, members in zip(_group_features(ks), _group_members(plan)):
        members = np.asarray([int(i) for i in members if needed[i]], dtype=np.int64)
        if not len(members):
            continue
        cols = _stored_columns(cols, X, Z)
        Xg, Zg = _columns_dense(X, cols), _columns_dense(Z, cols)
        if work is None:
            dot = np.ascontiguousarray(Xg @ Zg.T)
        else:
            dot = np.matmul(Xg, Zg.T, out=work[: X.shape[0] * Z.shape[0]].reshape(X.shape[0], Z.shape[0]))
        _combine(dot, (Xg**2).sum(axis=1), (Zg**2).sum(axis=1), plan_arrays, members, w, out, parallel)
    return out


def kernel_matrices(kernels, X, Z) -> np.ndarray:
    """Every kernel's values ``K_i(X, Z)`` as a dense ``(n_kernels, n_X, n_Z)`` array (one pass per group)."""
    ks, X, Z = _dense_pair(kernels, X, Z)
    out = np.empty((len(ks), X.shape[0], Z.shape[0]))
    for i, a, k in _kernel_blocks(ks, X, Z, np.ones(len(ks), dtype=bool)):
        out[i, a : a + k.shape[0]] = k
    return out


# ----------------------------------------------------------------------------- the data's scale


def data_scale(blocks, n_features: int, sample=None) -> DataScale:
    """The :class:`~mwumkl_dist.kernels.specs.DataScale` of rows given as blocks (arrays or CSR matrices).

    Exact per-feature sums of ``x`` and ``x^2``: the same for any split into blocks and for dense
    or sparse rows of the same values.  ``sample`` (some of the rows, e.g. :func:`scale_sample_rows`)
    gives the median nearest-neighbour distance.
    """
    sums, squares, n = {}, {}, 0  # by feature: the features used only (FeatureSums)
    for block in blocks:
        for lo in range(0, block.shape[0], _SCALE_ROWS):
            X = as_csr(block[lo : lo + _SCALE_ROWS])
            # Summed over the features the block uses only: O(nnz), not O(n_features) (exact: the same sums).
            used, columns = np.unique(X.indices, return_inverse=True)
            for total, part in ((sums, X.data), (squares, X.data * X.data)):
                for f, value in zip(used.tolist(), exact_sums_by_column(part, columns.ravel(), len(used))):
                    total[f] = total.get(f, 0) + value
            n += X.shape[0]
    nn = None if sample is None else neighbour_distance(sample)
    return DataScale(n, FeatureSums(n_features, sums), FeatureSums(n_features, squares), nn)


#: Rows the nearest-neighbour distance of :func:`data_scale` is measured on.
SCALE_SAMPLE = 500


def scale_sample_rows(n_samples: int) -> np.ndarray:
    """The rows :func:`neighbour_distance` is measured on: evenly spaced, at most :data:`SCALE_SAMPLE`."""
    return np.unique(np.linspace(0, n_samples - 1, min(n_samples, SCALE_SAMPLE)).astype(np.int64))


def neighbour_distance(rows) -> float | None:
    """The median distance from each of ``rows`` to its nearest other row (None for fewer than 2 rows).

    Exact duplicates count as distance 0.
    """
    S = as_csr(rows)
    if S.shape[0] < 2:
        return None
    if S.shape[1] >= 1 << 16:  # wide rows (one far feature index): S.T as CSR would cost O(n_features)
        used = np.unique(S.indices)  # renumbered in order: the same products, summed in the same order
        S = sp.csr_matrix((S.data, np.searchsorted(used, S.indices), S.indptr), shape=(S.shape[0], max(len(used), 1)))
    sq = np.asarray(S.multiply(S).sum(axis=1)).ravel()
    gram = (S @ S.T).toarray()
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0)
    np.fill_diagonal(d2, np.inf)
    return float(np.sqrt(np.median(d2.min(axis=1))))

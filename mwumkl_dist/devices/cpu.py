"""Numba kernels: kernel columns on the fly, fused with the shard's V/g update.

Everything here works row by row, so a row's numbers do not depend on which
shard (or thread, or block of rows) holds it: the sharding invariance of the
engines rests on that.  Data is CSR (``indptr``, ``indices``, ``data``); the
kernel plan comes from :class:`mwumkl_dist.kernels.KernelPlan`.  The MWU rules
themselves (which columns, what weights) live in :mod:`mwumkl_dist.solvers.mwu`; this
module only evaluates kernels and applies ``V += (col_P + col_N) / 2``,
``g = V @ coef``.

How it is fast (a9a, 32561 x 123 sparse, 3 kernels: about 0.6 ms per
superstep on one core, against 3.2 ms for the first, row-at-a-time version;
``benchmarks/bench_a9a.py`` measures it):

* the dot products with the two picked points come from a pass over the
  columns where a point is non-zero (a CSC copy of the shard's rows) when
  that touches fewer entries than a pass over the rows; both passes add a
  row's terms in increasing feature order, so they give identical numbers;
* on dense data (one feature group) a transposed dense copy of the rows
  (:func:`dense_copy`) gives the same dot products in straight loops over
  rows: on cod-rna (8 features, 12 kernels) a 10^4-point fit went from 0.60 s
  to 0.47 s;
* the kernels are cut into tiles of about 64 (:func:`mwumkl_dist.core.partition.kernel_tiles`,
  a function of the plan only).  A row's score ``g_j`` is the sum, in tile
  order, of its tile partials, each a sequential sum over the tile's kernels
  from 0; kernel shards return their tiles' partials and the Dask driver adds
  them in the same order (:func:`mwumkl_dist.data.shards.sum_tile_partials`),
  so every layout gives the same bits, ties included;
* each distinct kernel value (kind, feature group, parameters) is computed
  once per row (:func:`value_plan`): in its tile when only that tile needs
  it, else in a pre-pass per block of rows (a random bank repeats its
  (subset, width) pairs, and its squaring chains join kernels that lie
  anywhere: such a chain once forced one tile of 19280 of 20000 kernels);
  a kernel adds its value's increment ``sp K(., p) + sq K(., q)`` to its
  ``V`` column;
* the work is (row block x tile) tasks, each with tile-local feature groups
  (a plan with 10^5 groups costs per task only its tile's groups and their
  features), rows processed in blocks of ``B`` rows, kernel by kernel inside
  a block, so every inner loop is a straight, vectorisable loop over rows;
  a thread's tasks of one row block run block of rows by block of rows (its
  pre-pass once per block); dense dots add up to four features per pass;
* the blocks' scratch (:func:`superstep_workspace`) is kept by the shard:
  allocated per superstep, megabytes of it with many kernels went back to the
  system and were faulted in again every iteration;
* ``exp`` is :func:`_exp_into`, a branch-free fdlibm-style ``exp`` (error
  below 1 ulp) that the compiler vectorises; the scalar libm call it replaces
  took half of the time; a Gaussian squaring chain still costs one ``exp``;
* ``V`` is best Fortran-ordered (the shards store it so): a block of column
  ``V[:, i]`` is then contiguous (any layout gives the same numbers);
* the rows' squared norms per feature group are computed once per shard
  (``row_sq``) instead of every superstep;
* the two picked points come as their non-zero entries and everything a
  superstep does with them (dense buffers filled and cleared entry by entry,
  their group norms, the choice of pass) costs ``O(non-zeros)``, never
  ``O(n_features)``: 3000 a9a rows plus one row ``+1 1000000:1`` took 28.5 ms
  per iteration (dense points, set up per call), now 0.47 ms, as without that row;
* threads by work (rows x kernels, at least :data:`PARALLEL_MIN_WORK` per
  thread; :func:`get_num_threads`, :func:`thread_limit`): the tasks run in
  contiguous runs per thread (``prange``), then a pass over row chunks adds the
  tile partials; per-chunk maxima are reduced in row order, ties to the lowest
  index, so the result is the same for every thread count.

Floating point: no ``fastmath`` and no FMA contraction, so vectorised and
scalar code paths give bit-identical values for a row.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numba
import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from mwumkl_dist.core.partition import kernel_tiles
from mwumkl_dist.devices import threads
from mwumkl_dist.devices.threads import current_threads as get_num_threads
from mwumkl_dist.devices.threads import limit_threads as thread_limit
from mwumkl_dist.devices.threads import set_num_threads

__all__ = [
    "kernel_columns",
    "kernel_diagonal",
    "superstep_features",
    "superstep_columns",
    "dense_copy",
    "superstep_workspace",
    "SuperstepWorkspace",
    "value_plan",
    "group_sqnorms",
    "group_sqnorms_t",
    "group_features",
    "weighted_kernel_sums",
    "point_kernels",
    "point_entries",
    "exp_block",
    "EXP_CONSTANTS",
    "thread_limit",
    "set_num_threads",
    "get_num_threads",
    "threads_for",
    "parallel",
    "PARALLEL_MIN_WORK",
]

_CACHE = True
# error_model="numpy": no Python zero-division checks in the loops, so they vectorise.
# nogil: shards run by threads (a Dask worker's) compute concurrently.
_OPTS = {"cache": _CACHE, "error_model": "numpy", "nogil": True}

#: A call is split over threads only with at least this much work (rows x kernels) per thread.
PARALLEL_MIN_WORK = 32768

# ----------------------------------------------------------------------------- threads
#
# The thread state and policy (``thread_limit``, ``set_num_threads``, ``get_num_threads``: numba-style
# names of :func:`~mwumkl_dist.devices.threads.limit_threads`, ``set_num_threads`` and
# ``current_threads``) live in :mod:`mwumkl_dist.devices.threads`, which knows numba's pool size
# through the ``register_pool`` below.  Numba's own thread mask is thread-local: :func:`parallel` sets
# it around each parallel call so the cap really holds.
#
# _PARALLEL_LOCK: numba's "workqueue" threading layer (used when neither TBB nor OpenMP is
# available) aborts the process when two Python threads launch parallel regions at once
# (e.g. several shards on the threads of one Dask worker).  Under that layer (and before
# the layer is known) a parallel call first takes this lock without blocking; a busy lock
# means "run on this thread" (same numbers, results never depend on the thread count).
# Under "omp" and "tbb" concurrent launches are safe and no lock is taken.
_PARALLEL_LOCK = threading.Lock()
_LAYER: list = []  # the threading layer once known


def _pool_size() -> int:
    return int(numba.config.NUMBA_NUM_THREADS)


threads.register_pool(_pool_size)


def threads_for(work: int) -> int:
    """Threads for a call of ``work`` units (rows x kernels): at least PARALLEL_MIN_WORK each."""
    return max(1, min(threads.current_threads(), int(work) // max(1, PARALLEL_MIN_WORK)))


def _needs_lock() -> bool:
    if not _LAYER:
        try:
            _LAYER.append(numba.threading_layer())
        except ValueError:  # no parallel region has run yet
            return True
    return _LAYER[0] == "workqueue"


@contextmanager
def parallel(n_threads: int):
    """Yields the tasks' chunk count (1: run serially); numba's thread mask is set for the block.

    The mask gets ``min(n_threads, pool size)`` threads (a chunk count above
    the pool, which only tests ask for, runs several chunks per thread).
    """
    if n_threads <= 1:
        yield 1
        return
    locked = _needs_lock()
    if locked and not _PARALLEL_LOCK.acquire(blocking=False):
        yield 1
        return
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(n_threads, _pool_size()))
        yield n_threads
    finally:
        numba.set_num_threads(before)
        if locked:
            _PARALLEL_LOCK.release()


# ----------------------------------------------------------------------------- exp

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # fdlibm: k * _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_SHIFT = 6755399441055744.0  # 1.5 * 2**52: (x + _SHIFT) - _SHIFT rounds x to an integer
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
#: The constants of :func:`_exp_into`, in the order above (the CUDA kernels' ``exp`` uses the same).
EXP_CONSTANTS = (_LOG2E, _LN2_HI, _LN2_LO, _SHIFT, _P1, _P2, _P3, _P4, _P5)


@njit(**_OPTS)
def _exp_into(x, out, kbits, n):
    """``out[b] = exp(x[b])`` for ``b < n``; ``kbits`` is int64 scratch of length ``>= 2 n``.

    fdlibm's ``e_exp.c`` algorithm without branches: ``x = k ln2 + r`` with
    ``|r| <= ln2 / 2``, a rational approximation of ``exp(r)`` (error below
    1 ulp), then ``2**k`` applied as two exact powers of two so that subnormal
    results round once.  Underflows to 0 below about -745.1, overflows to inf
    above 709.78, NaN stays NaN.
    """
    for b in range(n):
        xb = x[b]
        xb = xb if xb >= -746.0 else -746.0  # also maps NaN to -746 (restored below)
        xb = xb if xb <= 710.0 else 710.0
        kf = (xb * _LOG2E + _SHIFT) - _SHIFT
        hi = xb - kf * _LN2_HI
        lo = kf * _LN2_LO
        r = hi - lo
        t = r * r
        c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
        out[b] = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
        k = np.int64(kf)
        k1 = k >> 1
        kbits[b] = (k1 + 1023) << 52
        kbits[n + b] = (k - k1 + 1023) << 52
    scale = kbits.view(np.float64)
    for b in range(n):
        xb = x[b]
        v = (out[b] * scale[b]) * scale[n + b]
        out[b] = v if xb == xb else xb


@njit(**_OPTS)
def exp_block(x):
    """``exp(x)`` elementwise for a 1-d float64 array, with the solver's ``exp`` (for tests)."""
    n = x.shape[0]
    out = np.empty(n)
    _exp_into(x, out, np.empty(2 * n, np.int64), n)
    return out


# ----------------------------------------------------------------------------- building blocks


@njit(**_OPTS)
def _prepare_points(p, q, feat_ptr, feat_groups, n_groups, csc_ptr):
    """Per-call point data: group norms, masked points and the cost of a column pass.

    With one feature group, ``p`` and ``q`` get the features outside it zeroed:
    a row pass then adds only ``+-0`` terms for those, which leaves every
    partial sum unchanged, so the dot products equal the general path's
    per-group sums exactly.  ``cost`` is the number of stored entries in the
    columns where ``p`` or ``q`` is non-zero (``-1`` without a CSC copy).
    """
    d = p.shape[0]
    ppp = np.empty(n_groups)
    ppq = np.empty(n_groups)
    _point_group_sqnorms(p, feat_ptr, feat_groups, ppp)
    _point_group_sqnorms(q, feat_ptr, feat_groups, ppq)
    if n_groups != 1:
        return p, q, ppp, ppq, -1
    pm = np.empty(d)
    qm = np.empty(d)
    cost = 0
    for f in range(d):
        inside = feat_ptr[f + 1] > feat_ptr[f]
        pm[f] = p[f] if inside else 0.0
        qm[f] = q[f] if inside else 0.0
        if csc_ptr.shape[0] == d + 1 and (pm[f] != 0.0 or qm[f] != 0.0):
            cost += csc_ptr[f + 1] - csc_ptr[f]
    if csc_ptr.shape[0] != d + 1:
        cost = -1
    return pm, qm, ppp, ppq, cost


@njit(inline="always", **_OPTS)
def _column_entries(csc_ptr, csc_rows, f, start, stop):
    """The entries ``[a, e)`` of CSC column ``f`` whose rows lie in ``[start, stop)`` (rows sorted in a column)."""
    a0 = csc_ptr[f]
    e0 = csc_ptr[f + 1]
    return a0 + np.searchsorted(csc_rows[a0:e0], start), a0 + np.searchsorted(csc_rows[a0:e0], stop)


@njit(**_OPTS)
def _csc_dots(start, stop, n_rows, csc_ptr, csc_rows, csc_vals, uf, up, uq, dp, dq):
    """``dp[j - start] = <x_j, p>`` (and ``dq``) for rows ``[start, stop)`` by a pass over columns.

    Only the columns ``uf`` where ``p`` or ``q`` is non-zero are visited (values
    ``up``, ``uq``), in increasing feature order, so each row receives its
    non-zero terms in the same order as a pass over its sorted CSR entries: the
    sums are identical.
    """
    dp[:] = 0.0
    dq[:] = 0.0
    whole = start == 0 and stop == n_rows
    for u in range(uf.shape[0]):
        f = uf[u]
        pf = up[u]
        qf = uq[u]
        if pf == 0.0 and qf == 0.0:
            continue
        if whole:
            a = csc_ptr[f]
            e = csc_ptr[f + 1]
        else:
            a, e = _column_entries(csc_ptr, csc_rows, f, start, stop)
        if pf != 0.0 and qf != 0.0:
            for k in range(a, e):
                r = csc_rows[k] - start
                v = csc_vals[k]
                dp[r] += v * pf
                dq[r] += v * qf
        elif pf != 0.0:
            for k in range(a, e):
                dp[csc_rows[k] - start] += csc_vals[k] * pf
        else:
            for k in range(a, e):
                dq[csc_rows[k] - start] += csc_vals[k] * qf


@njit(**_OPTS)
def _point_group_sqnorms(point, feat_ptr, feat_groups, out):
    out[:] = 0.0
    for f in range(point.shape[0]):
        v = point[f]
        if v != 0.0:
            for t in range(feat_ptr[f], feat_ptr[f + 1]):
                out[feat_groups[t]] += v * v


@njit(inline="always", **_OPTS)
def _scatter_dots(v, pf, qf, groups, w0, w1, b, dp, dq):
    """Entry ``v`` of feature ``f`` in row ``b``: ``dp[g, b] += v p_f`` and ``dq[g, b] += v q_f``.

    For the groups ``g`` in ``groups[w0:w1]`` (those of feature ``f``).
    """
    a = v * pf
    c = v * qf
    for w in range(w0, w1):
        g = groups[w]
        dp[g, b] += a
        dq[g, b] += c


@njit(**_OPTS)
def _block_dots(indptr, indices, data, j0, nb, pm, qm, feat_ptr, feat_groups, single, dp, dq):
    """``dp[g, b] = <x_{j0+b}, p>`` restricted to group ``g`` (likewise ``dq``), sums in CSR order."""
    if single:
        for b in range(nb):
            a = 0.0
            c = 0.0
            for k in range(indptr[j0 + b], indptr[j0 + b + 1]):
                f = indices[k]
                v = data[k]
                a += v * pm[f]
                c += v * qm[f]
            dp[0, b] = a
            dq[0, b] = c
    else:
        dp[:, :nb] = 0.0
        dq[:, :nb] = 0.0
        for b in range(nb):
            for k in range(indptr[j0 + b], indptr[j0 + b + 1]):
                f = indices[k]
                _scatter_dots(data[k], pm[f], qm[f], feat_groups, feat_ptr[f], feat_ptr[f + 1], b, dp, dq)


@njit(**_OPTS)
def _dense_block_dots(dense_t, j0, nb, pm, qm, dp, dq):
    """:func:`_block_dots` (one group) from a dense ``(d, n_rows)`` copy: straight loops over rows.

    A row's terms are added in increasing feature order, as in the CSR pass;
    the extra terms for its zero entries are ``+-0``, which leave every partial
    sum unchanged, so the dot products are identical.
    """
    for b in range(nb):
        dp[0, b] = 0.0
        dq[0, b] = 0.0
    for f in range(dense_t.shape[0]):
        pf = pm[f]
        qf = qm[f]
        if pf == 0.0 and qf == 0.0:
            continue
        col = dense_t[f, j0 : j0 + nb]
        _axpy2(col, pf, qf, dp[0], dq[0], nb)


@njit(**_OPTS)
def _dots4(X, j0, nb, feats, u, e, p, dp, q, dq, both):
    """``dp[b] += X[f, j0 + b] p[f]`` for ``f`` in ``feats[u:e]``, in order (and ``dq`` with ``q`` when ``both``).

    Four, two or one feature per pass over the rows: each sum gets the same
    terms in the same order as one pass per feature (the same bits) with a
    fraction of the loads and stores (a random bank's 5-feature groups spent
    most of a superstep in per-feature passes).
    """
    while e - u >= 4:
        f0, f1, f2, f3 = feats[u], feats[u + 1], feats[u + 2], feats[u + 3]
        x0, x1, x2, x3 = X[f0, j0 : j0 + nb], X[f1, j0 : j0 + nb], X[f2, j0 : j0 + nb], X[f3, j0 : j0 + nb]
        a0, a1, a2, a3 = p[f0], p[f1], p[f2], p[f3]
        for b in range(nb):
            dp[b] = (((dp[b] + x0[b] * a0) + x1[b] * a1) + x2[b] * a2) + x3[b] * a3
        if both:
            c0, c1, c2, c3 = q[f0], q[f1], q[f2], q[f3]
            for b in range(nb):
                dq[b] = (((dq[b] + x0[b] * c0) + x1[b] * c1) + x2[b] * c2) + x3[b] * c3
        u += 4
    if e - u >= 2:
        f0, f1 = feats[u], feats[u + 1]
        x0, x1 = X[f0, j0 : j0 + nb], X[f1, j0 : j0 + nb]
        a0, a1 = p[f0], p[f1]
        for b in range(nb):
            dp[b] = (dp[b] + x0[b] * a0) + x1[b] * a1
        if both:
            c0, c1 = q[f0], q[f1]
            for b in range(nb):
                dq[b] = (dq[b] + x0[b] * c0) + x1[b] * c1
        u += 2
    if e > u:
        f0 = feats[u]
        x0 = X[f0, j0 : j0 + nb]
        a0 = p[f0]
        for b in range(nb):
            dp[b] += x0[b] * a0
        if both:
            c0 = q[f0]
            for b in range(nb):
                dq[b] += x0[b] * c0


@njit(**_OPTS)
def _axpy2(col, pf, qf, dp, dq, nb):
    for b in range(nb):
        v = col[b]
        dp[b] += v * pf
        dq[b] += v * qf


@njit(inline="always", **_OPTS)
def _dist2(sx, sz, dot):
    """``|x - z|^2`` from ``|x|^2``, ``|z|^2`` and ``x . z`` (either norm first: the sum is the same)."""
    return (sx + sz) - 2.0 * dot


@njit(inline="always", **_OPTS)
def _gauss_arg(d2, gamma):
    """The exponent ``-gamma max(d2, 0)`` of a Gaussian kernel value."""
    return -gamma * (0.0 if d2 < 0.0 else d2)


@njit(**_OPTS)
def _block_dist2(row_sq, j0, nb, pp, dot, out):
    """``out[g, b] = (|x_{j0+b}|_g^2 + |p|_g^2) - 2 dot[g, b]``."""
    for g in range(dot.shape[0]):
        sq = row_sq[j0 : j0 + nb, g]
        ppg = pp[g]
        dg = dot[g]
        og = out[g]
        for b in range(nb):
            og[b] = _dist2(sq[b], ppg, dg[b])


@njit(**_OPTS)
def _square_row(src, out, nb):
    for b in range(nb):
        v = src[b]
        out[b] = v * v


@njit(**_OPTS)
def _poly_row(dot, c0, degree, out, nb):
    for b in range(nb):
        out[b] = dot[b] + c0
    for _ in range(degree - 1):
        for b in range(nb):
            out[b] *= dot[b] + c0


@njit(**_OPTS)
def _gauss_row(dist2, gamma, out, xbuf, kbits, nb):
    for b in range(nb):
        xbuf[b] = _gauss_arg(dist2[b], gamma)
    _exp_into(xbuf, out, kbits, nb)


@njit(inline="always", **_OPTS)
def _kernel_values(i, row, src, g, kind, pa, pb, dot, dist2, out, xbuf, kbits, nb):
    """``out[row, :nb]``: kernel ``i`` on a block of rows, from its group ``g``'s ``dot`` and ``dist2`` rows.

    A Gaussian with twice the gamma of the kernel in ``out[src]`` (``src >= 0``) is that row squared.
    """
    if src >= 0:  # K_i = K_src ** 2
        _square_row(out[src], out[row], nb)
    elif kind[i] == 0:  # linear
        out[row, :nb] = dot[g, :nb]
    elif kind[i] == 1:  # polynomial (dot + coef0) ** degree, by repeated multiplication
        _poly_row(dot[g], pb[i], int(pa[i]), out[row], nb)
    else:  # gaussian exp(-gamma max(dist2, 0))
        _gauss_row(dist2[g], pa[i], out[row], xbuf, kbits, nb)


@njit(**_OPTS)
def _block_values(nb, dot, dist2, kind, pa, pb, grp, square_of, order, out, xbuf, kbits):
    """Kernel values ``out[i, b]`` of block rows against one point, from its dots and distances."""
    for t in range(order.shape[0]):
        i = order[t]
        _kernel_values(i, i, square_of[i], grp[i], kind, pa, pb, dot, dist2, out, xbuf, kbits, nb)


def _block_size(m):
    # 256 rows per block, fewer only to keep the (m, B) value blocks of both points within 64 MiB.
    # Small blocks for many kernels were a false economy: on mushrooms (1344 per-feature kernels)
    # 16-row blocks cost 24 ms per iteration at n = 1625 and 256-row blocks 4.7 ms (same model).
    return max(16, min(256, ((1 << 22) // max(m, 1)) // 8 * 8))


@njit(**_OPTS)
def _tile_maps(tile_ptr, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """Tile-local maps: each tile's groups, its kernels' local groups, chains and order, its features.

    Returns ``gptr, gfeat`` (group -> its features, ascending), ``tg_ptr,
    tg_group`` (tile -> its groups, local group ``lg`` of tile ``t`` is
    ``tg_group[tg_ptr[t] + lg]``), ``lgrp`` (kernel -> local group), ``lsq``
    (kernel -> local index of its squaring source or -1), ``torder`` (per
    tile, the local kernel indices in evaluation order), ``tf_ptr, tf_feat``
    (tile -> its distinct features, ascending) and ``tf_gptr, tf_lg`` (such a
    feature -> the tile's local groups containing it).
    """
    m = grp.shape[0]
    n_tiles = tile_ptr.shape[0] - 1
    gptr, gfeat = _group_features(feat_ptr, feat_groups, n_groups)
    tid = np.empty(m, np.int64)
    mark = np.full(n_groups, -1, np.int64)
    lidx = np.zeros(n_groups, np.int64)
    tg_ptr = np.zeros(n_tiles + 1, np.int64)
    tg_tmp = np.empty(m, np.int64)
    lgrp = np.empty(m, np.int64)
    n_lg = 0
    n_pairs = 0
    for t in range(n_tiles):
        for i in range(tile_ptr[t], tile_ptr[t + 1]):
            tid[i] = t
            g = grp[i]
            if mark[g] != t:
                mark[g] = t
                lidx[g] = n_lg - tg_ptr[t]
                tg_tmp[n_lg] = g
                n_lg += 1
                n_pairs += gptr[g + 1] - gptr[g]
            lgrp[i] = lidx[g]
        tg_ptr[t + 1] = n_lg
    tg_group = tg_tmp[:n_lg].copy()
    lsq = np.full(m, -1, np.int64)
    for i in range(m):
        if square_of[i] >= 0:
            lsq[i] = square_of[i] - tile_ptr[tid[i]]
    torder = np.empty(m, np.int64)
    pos = tile_ptr[:n_tiles].copy()
    for k in range(m):
        i = order[k]
        t = tid[i]
        torder[pos[t]] = i - tile_ptr[t]
        pos[t] += 1
    # Each tile's (feature, local group) pairs sorted by feature.
    tf_ptr = np.zeros(n_tiles + 1, np.int64)
    tf_feat = np.empty(n_pairs, np.int64)
    tf_gptr = np.zeros(n_pairs + 1, np.int64)
    tf_lg = np.empty(n_pairs, np.int64)
    n_feat = 0
    n_done = 0
    for t in range(n_tiles):
        a, b = tg_ptr[t], tg_ptr[t + 1]
        cnt = 0
        for lg in range(b - a):
            g = tg_group[a + lg]
            cnt += gptr[g + 1] - gptr[g]
        pf = np.empty(cnt, np.int64)
        pl = np.empty(cnt, np.int64)
        c = 0
        for lg in range(b - a):
            g = tg_group[a + lg]
            for u in range(gptr[g], gptr[g + 1]):
                pf[c] = gfeat[u]
                pl[c] = lg
                c += 1
        # One group: its features are ascending already (a sort of all d features costs more than the rest).
        perm = np.arange(cnt) if b - a == 1 else np.argsort(pf, kind="mergesort")
        for k in range(cnt):
            f = pf[perm[k]]
            if k == 0 or f != pf[perm[k - 1]]:
                tf_feat[n_feat] = f
                tf_gptr[n_feat] = n_done
                n_feat += 1
            tf_lg[n_done] = pl[perm[k]]
            n_done += 1
        tf_ptr[t + 1] = n_feat
    tf_gptr[n_feat] = n_done
    return gptr, gfeat, tg_ptr, tg_group, lgrp, lsq, torder, tf_ptr, tf_feat[:n_feat].copy(), \
        tf_gptr[: n_feat + 1].copy(), tf_lg  # fmt: skip


def _distinct_kernels(kind, pa, pb, grp) -> tuple[np.ndarray, np.ndarray]:
    """``(value_of, first)``: each kernel's distinct evaluation and each evaluation's first kernel.

    Kernels with the same kind, feature group and parameters (bit for bit)
    have the same values (and the same squaring source, which the plan finds
    by group and parameter); the distinct ones are numbered in order of
    first appearance.  A random bank on few features repeats each (subset,
    width) many times (2-feature subsets of 60 features: at most 15930
    distinct kernels however large the bank).
    """
    m = len(kind)
    if m == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cols = (
        np.ascontiguousarray(pb, dtype=np.float64).view(np.int64),
        np.ascontiguousarray(pa, dtype=np.float64).view(np.int64),
        np.asarray(grp, dtype=np.int64),
        np.asarray(kind, dtype=np.int64),
    )
    by_key = np.lexsort(cols)  # stable: each run of equal keys starts with its lowest kernel
    new = np.zeros(m, bool)
    new[0] = True
    for c in cols:
        sc = c[by_key]
        new[1:] |= sc[1:] != sc[:-1]
    run = np.cumsum(new) - 1
    run_first = by_key[new]
    by_first = np.argsort(run_first, kind="stable")
    rank = np.empty(len(run_first), np.int64)
    rank[by_first] = np.arange(len(run_first))
    value_of = np.empty(m, np.int64)
    value_of[by_key] = rank[run]
    return value_of, run_first[by_first]


@njit(**_OPTS)
def _value_layout(tile_ptr, value_of, first, square_of, order):
    """Where each distinct kernel value is evaluated: in one tile, or in the shared pre-pass.

    A value is *private* to a tile when only that tile needs it (its kernels,
    or squares evaluated there) and its squaring source is private too;
    every other value is *shared*.  Returns ``vtile_ptr`` (value tiles: the
    ``n_tiles`` tiles' private values, then the shared ones as tile
    ``n_tiles``), ``perm`` (position -> distinct value), ``vsq`` (position ->
    position of its squaring source, in the same value tile, or -1) and
    ``kslot`` (kernel -> its value's index in its tile's values, or
    ``-1 - index`` among the shared values).  Within each value tile the
    values come in the plan's chain ``order`` (sources first).
    """
    m = value_of.shape[0]
    nv = first.shape[0]
    n_tiles = tile_ptr.shape[0] - 1
    vsrc = np.full(nv, -1, np.int64)
    for u in range(nv):
        s = square_of[first[u]]
        if s >= 0:
            vsrc[u] = value_of[s]
    seq = np.empty(nv, np.int64)  # values in order of first appearance in the chain order
    seen = np.zeros(nv, np.bool_)
    n = 0
    for k in range(m):
        u = value_of[order[k]]
        if not seen[u]:
            seen[u] = True
            seq[n] = u
            n += 1
    lo = np.full(nv, n_tiles, np.int64)
    hi = np.full(nv, -1, np.int64)
    for t in range(n_tiles):
        for i in range(tile_ptr[t], tile_ptr[t + 1]):
            u = value_of[i]
            lo[u] = min(lo[u], t)
            hi[u] = max(hi[u], t)
    for k in range(nv - 1, -1, -1):  # a source is needed wherever its squares are
        u = seq[k]
        s = vsrc[u]
        if s >= 0:
            lo[s] = min(lo[s], lo[u])
            hi[s] = max(hi[s], hi[u])
    tile = np.empty(nv, np.int64)
    for k in range(nv):  # sources first: a square of a shared value is shared
        u = seq[k]
        s = vsrc[u]
        tile[u] = n_tiles if lo[u] != hi[u] or (s >= 0 and tile[s] == n_tiles) else lo[u]
    vtile_ptr = np.zeros(n_tiles + 2, np.int64)
    for u in range(nv):
        vtile_ptr[tile[u] + 1] += 1
    for t in range(n_tiles + 1):
        vtile_ptr[t + 1] += vtile_ptr[t]
    fill = vtile_ptr[:-1].copy()
    pos = np.empty(nv, np.int64)
    perm = np.empty(nv, np.int64)
    for k in range(nv):
        u = seq[k]
        pos[u] = fill[tile[u]]
        perm[pos[u]] = u
        fill[tile[u]] += 1
    vsq = np.full(nv, -1, np.int64)
    for u in range(nv):
        if vsrc[u] >= 0:
            vsq[pos[u]] = pos[vsrc[u]]
    kslot = np.empty(m, np.int64)
    for i in range(m):
        u = value_of[i]
        t = tile[u]
        kslot[i] = pos[u] - vtile_ptr[t] if t < n_tiles else -1 - (pos[u] - vtile_ptr[n_tiles])
    return vtile_ptr, perm, vsq, kslot


def value_plan(tile_ptr, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """How the kernel tiles ``tile_ptr`` of a plan get their values: each distinct value once per row.

    Kernels with the same value (:func:`_distinct_kernels`) share one
    evaluation; a value that only one tile needs is evaluated in that tile,
    every other one (a value of kernels in several tiles, the source of a
    squaring chain that crosses tiles, and the squares of those) once per
    block of rows in a pre-pass, before the tiles (:func:`_value_layout`).
    So a squaring chain may cross tiles: each kernel is still the same
    ``exp`` or the same square of its source, the same bits wherever it is
    evaluated.

    Returns ``(values, maps)``: ``values = (vtile_ptr, vkind, vpa, vpb, kslot)``,
    the values as a plan of their own, tiled by ``vtile_ptr`` (tile
    ``n_tiles`` is the pre-pass), and each kernel's value (``kslot``: its
    index in its tile's values, or ``-1 - index`` in the pre-pass's);
    ``maps``: their tile-local maps (:func:`_tile_maps`).
    """
    value_of, first = _distinct_kernels(kind, pa, pb, grp)
    tile_ptr = np.asarray(tile_ptr, dtype=np.int64)
    vtile_ptr, perm, vsq, kslot = _value_layout(
        tile_ptr, value_of, first, np.asarray(square_of, dtype=np.int64), np.asarray(order, dtype=np.int64)
    )
    rep = first[perm]
    vkind, vpa, vpb, vgrp = (np.ascontiguousarray(np.asarray(a)[rep]) for a in (kind, pa, pb, grp))
    maps = _tile_maps(vtile_ptr, vgrp, vsq, np.arange(len(rep), dtype=np.int64), feat_ptr, feat_groups, int(n_groups))
    return (vtile_ptr, vkind, vpa, vpb, kslot), maps


def _value_sizes(vtile_ptr, maps) -> tuple[int, int, int]:
    """``(T, S, G)``: the most values of a tile, the pre-pass's values, the most feature groups of a value tile."""
    counts = np.diff(vtile_ptr)
    T = int(counts[:-1].max()) if len(counts) > 1 else 0
    return max(T, 1), int(counts[-1]), max(int(np.diff(maps[2]).max()), 1)


class SuperstepWorkspace:
    """What :func:`superstep_features` keeps across supersteps for one block of rows and one plan.

    The plan's tiles (:func:`kernel_tiles`) and how they get their values
    (:func:`value_plan`), per-thread scratch (grown when a call uses more
    threads; never allocated per superstep) and ``partial``: the last
    superstep's score partials per tile, ``(n_tiles, n_rows)``.
    """

    def __init__(self, n_rows, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
        self.n_rows = int(n_rows)
        self.n_groups = int(n_groups)
        self.tile_ptr = kernel_tiles(square_of)
        self.n_tiles = len(self.tile_ptr) - 1
        self.values, self.maps = value_plan(
            self.tile_ptr, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups
        )
        self.max_values, self.shared_values, self.max_groups = _value_sizes(self.values[0], self.maps)
        self.B = min(_block_size(self.max_values + self.shared_values), max(8, -(-self.n_rows // 8) * 8))
        self.partial = np.zeros((self.n_tiles, self.n_rows))
        self.g = np.empty(self.n_rows)
        self.slots = 0
        self.scratch = None
        self._with_rows = False
        self.n_features = int(feat_ptr.shape[0]) - 1
        self._points = None
        self._chunks: dict = {}

    def chunks(self, n_chunks: int, n_rb: int) -> np.ndarray:
        """Task boundaries of ``n_chunks`` contiguous runs of (row block, tile) tasks, row-block major.

        Cut where the rows x kernels done so far cross the even shares (tiles
        hold 64 to 127 kernels); which thread does what changes no number.
        """
        key = (int(n_chunks), int(n_rb))
        if key not in self._chunks:
            rows = np.diff(np.arange(n_rb + 1) * self.n_rows // n_rb)
            cost = np.cumsum(np.outer(rows, np.diff(self.tile_ptr)).ravel())
            targets = cost[-1] * np.arange(1, n_chunks) / n_chunks
            after = np.searchsorted(cost, targets)  # the task during which the work done reaches each share
            before = np.where(after > 0, cost[np.maximum(after - 1, 0)], 0)
            cut = np.where(cost[after] - targets < targets - before, after + 1, after)  # the nearer of its ends
            self._chunks[key] = np.concatenate([[0], cut, [len(cost)]]).astype(np.int64)
        return self._chunks[key]

    def point_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """Two zeroed dense vectors of ``n_features`` for the picked points (made once; the caller re-zeroes them)."""
        if self._points is None:
            self._points = (np.zeros(self.n_features), np.zeros(self.n_features))
        return self._points

    def ensure(self, n_slots: int, with_rows: bool):
        """Scratch for ``n_slots`` concurrent tasks (``with_rows``: column-pass dots for whole row ranges)."""
        if self.scratch is None or n_slots > self.slots or (with_rows and not self._with_rows):
            n_slots = max(n_slots, self.slots)
            with_rows = with_rows or self._with_rows
            B, G, T, S = self.B, self.max_groups, self.max_values, self.shared_values
            self.scratch = (
                np.empty((n_slots, 2, G, B)),  # dots with p and q
                np.empty((n_slots, 2, T, B)),  # a tile's values against p and q (then its V increments)
                np.empty((n_slots, 2, S, B)),  # the pre-pass's values likewise
                np.empty((n_slots, 4, B)),  # exp argument, row factors, tile partial of the block
                np.empty((n_slots, 2 * B), np.int64),  # exp scratch
                np.empty((n_slots, 2, self.n_rows if with_rows else 0)),  # column-pass dots
            )
            self.slots = n_slots
            self._with_rows = with_rows
        return self.scratch


def superstep_workspace(n_rows: int, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """A :class:`SuperstepWorkspace` for ``n_rows`` rows and a plan (:func:`mwumkl_dist.data.shards.plan_args` order).

    Reusing it matters: with many kernels the blocks of kernel values take
    megabytes, and allocating them every superstep let the C allocator give
    the pages back and fault them in again each time (on sonar with 720
    kernels most of the fit went to the kernel's page-fault handling).
    """
    return SuperstepWorkspace(n_rows, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups)


# ----------------------------------------------------------------------------- superstep


@njit(**_OPTS)
def _update_column(Vi, inc, w, c, gb, nb):
    """``V[:, i] += inc * w`` on a block (``inc``: the kernel's value's increment), and ``g += c * V[:, i]``."""
    for b in range(nb):
        v = Vi[b] + inc[b] * w
        Vi[b] = v
        gb[b] += c * v


@njit(**_OPTS)
def _increments(kp, kq, sp, sq, n, nb):
    """``kp[u] = sp * kp[u] + sq * kq[u]``: each value's ``V`` increment before the trace factor.

    ``(sp K(., p) + sq K(., q)) * w`` is then ``inc * w``, the same operations
    as before in the same order, so sharing the increment changes no bit.
    """
    for u in range(n):
        for b in range(nb):
            kp[u, b] = sp[b] * kp[u, b] + sq[b] * kq[u, b]


@njit(**_OPTS)
def _tile_values(nb, k0, mt, dot, sq_t, j0, pp, tg_group, ga, kind, pa, pb, lgrp, lsq, torder, out, xbuf, kbits):
    """:func:`_block_values` for the tile ``[k0, k0 + mt)`` with local groups and indices.

    A Gaussian that is no square takes its squared distances from its local
    group's ``dot`` row, the rows' norms ``sq_t[g, j0:j0 + nb]`` and the
    point's ``pp[g]`` (``g = tg_group[ga + local group]``) in its exponent's
    loop: no pass of its own (a random bank has a group per kernel).
    """
    for u in range(mt):
        li = torder[k0 + u]
        i = k0 + li
        lg = lgrp[i]
        if lsq[i] < 0 and kind[i] == 2:
            g = tg_group[ga + lg]
            sq = sq_t[g, j0 : j0 + nb]
            ppg = pp[g]
            gamma = pa[i]
            for b in range(nb):
                xbuf[b] = _gauss_arg(_dist2(sq[b], ppg, dot[lg, b]), gamma)
            _exp_into(xbuf, out[li], kbits, nb)
        else:  # a square, a linear or a polynomial kernel: no distances (``dot`` stands in for them)
            _kernel_values(i, li, lsq[i], lg, kind, pa, pb, dot, dot, out, xbuf, kbits, nb)


@njit(**_OPTS)
def _dense_group_dots(dense_t, j0, nb, p, q, tg_group, a, ng, gptr, gfeat, dp, dq):
    """Dots of block rows with ``p``/``q`` per local group from the dense copy, features ascending.

    Up to four features per pass over the rows (:func:`_dots4`); the terms of
    features where both points are 0 are ``+-0`` and leave the sums unchanged.
    """
    for lg in range(ng):
        g = tg_group[a + lg]
        dpl = dp[lg]
        dql = dq[lg]
        for b in range(nb):
            dpl[b] = 0.0
            dql[b] = 0.0
        _dots4(dense_t, j0, nb, gfeat, gptr[g], gptr[g + 1], p, dpl, q, dql, True)


@njit(**_OPTS)
def _merge_dots(indptr, indices, data, j0, nb, p, q, fa, fb, tf_feat, tf_gptr, tf_lg, ng, dp, dq):
    """Dots per local group by merging each row's sorted entries with the tile's sorted features.

    A group's terms arrive in increasing feature order, as in a full row pass.
    """
    dp[:ng, :nb] = 0.0
    dq[:ng, :nb] = 0.0
    for b in range(nb):
        k = indptr[j0 + b]
        ke = indptr[j0 + b + 1]
        u = fa
        while k < ke and u < fb:
            f = indices[k]
            h = tf_feat[u]
            if f < h:
                k += 1
            elif f > h:
                u += 1
            else:
                _scatter_dots(data[k], p[f], q[f], tf_lg, tf_gptr[u], tf_gptr[u + 1], b, dp, dq)
                k += 1
                u += 1


@njit(**_OPTS)
def _csc_group_dots(csc_ptr, csc_rows, csc_vals, j0, nb, p, q, fa, fb, tf_feat, tf_gptr, tf_lg, ng, uf, dp, dq):
    """Dots per local group from the CSC copy: the tile's features ascending, each column's entries in the block.

    A group's terms reach each row in increasing feature order, as in a row
    pass; features where both points are zero add only ``+-0`` and are skipped.
    When the points have far fewer non-zeros (``uf``, ascending) than the tile
    has features, each is looked up in the tile's features instead of scanning
    them all (the same features in the same order: the same sums), so the cost
    follows the points' non-zeros, not the number of features.
    """
    dp[:ng, :nb] = 0.0
    dq[:ng, :nb] = 0.0
    if uf.shape[0] * 16 < fb - fa:
        lo = fa
        for k in range(uf.shape[0]):
            f = uf[k]
            u = lo + np.searchsorted(tf_feat[lo:fb], f)
            lo = u
            if u < fb and tf_feat[u] == f:
                _csc_feature_dots(csc_ptr, csc_rows, csc_vals, j0, nb, p[f], q[f], tf_lg, tf_gptr[u],
                                  tf_gptr[u + 1], f, dp, dq)  # fmt: skip
        return
    for u in range(fa, fb):
        f = tf_feat[u]
        _csc_feature_dots(csc_ptr, csc_rows, csc_vals, j0, nb, p[f], q[f], tf_lg, tf_gptr[u], tf_gptr[u + 1], f, dp,
                          dq)  # fmt: skip


@njit(inline="always", **_OPTS)
def _csc_feature_dots(csc_ptr, csc_rows, csc_vals, j0, nb, pf, qf, tf_lg, w0, w1, f, dp, dq):
    """Feature ``f``'s entries in rows ``[j0, j0 + nb)`` into the dots of its local groups ``tf_lg[w0:w1]``."""
    if pf == 0.0 and qf == 0.0:
        return
    a, e = _column_entries(csc_ptr, csc_rows, f, j0, j0 + nb)
    for k in range(a, e):
        _scatter_dots(csc_vals[k], pf, qf, tf_lg, w0, w1, csc_rows[k] - j0, dp, dq)


@njit(**_OPTS)
def _add_ridge_tile(V, lx, diag, coef, gb, j0, nb, k0, k1):
    """``V[lx, k0:k1] += diag`` when local row ``lx`` lies in ``[j0, j0 + nb)``, and its tile partial redone."""
    if j0 <= lx < j0 + nb:
        g = 0.0
        for i in range(k0, k1):
            v = V[lx, i] + diag
            V[lx, i] = v
            g += coef[i] * v
        gb[lx - j0] = g


@njit(inline="always", **_OPTS)
def _class_best(positive, j, g, best_pos, g_pos, best_neg, g_neg):
    """``(best_pos, g_pos, best_neg, g_neg)`` after row ``j`` (score ``g``, class +1 when ``positive``).

    Strict ``>``: among equal scores the row seen first stays; a NaN score never wins.
    """
    if positive:
        if g > g_pos:
            return j, g, best_neg, g_neg
    elif g > g_neg:
        return best_pos, g_pos, j, g
    return best_pos, g_pos, best_neg, g_neg


@njit(**_OPTS)
def _group_dots(t, maps, indptr, indices, data, csc_ptr, csc_rows, csc_vals, dense_t, use_dense, j0, nb, p, q, uf, dp,
                dq):  # fmt: skip
    """Dots of block rows with ``p``/``q`` per local group of value tile ``t`` (several feature groups)."""
    gptr, gfeat, tg_ptr, tg_group, lgrp, lsq, torder, tf_ptr, tf_feat, tf_gptr, tf_lg = maps
    ga = tg_ptr[t]
    ng = tg_ptr[t + 1] - ga
    if use_dense:
        _dense_group_dots(dense_t, j0, nb, p, q, tg_group, ga, ng, gptr, gfeat, dp, dq)
    elif csc_ptr.shape[0] == p.shape[0] + 1:
        _csc_group_dots(csc_ptr, csc_rows, csc_vals, j0, nb, p, q, tf_ptr[t], tf_ptr[t + 1], tf_feat, tf_gptr, tf_lg,
                        ng, uf, dp, dq)  # fmt: skip
    else:
        _merge_dots(indptr, indices, data, j0, nb, p, q, tf_ptr[t], tf_ptr[t + 1], tf_feat, tf_gptr, tf_lg, ng, dp, dq)


@njit(**_OPTS)
def _value_tile(t, single, values, maps, indptr, indices, data, csc_ptr, csc_rows, csc_vals, dense_t, use_dense,
                row_sq_t, j0, nb, p, q, ppp, ppq, uf, sp, sq, dots, kp, kq, xbuf, kbits):  # fmt: skip
    """The values of value tile ``t`` on a block of rows against ``p`` and ``q``, then their increments in ``kp``.

    With several feature groups the tile's groups get their dots first; with
    one, ``dots`` holds group 0's already.
    """
    vtile_ptr, vkind, vpa, vpb, kslot = values
    lgrp, lsq, torder, tg_ptr, tg_group = maps[4], maps[5], maps[6], maps[2], maps[3]
    v0 = vtile_ptr[t]
    nv = vtile_ptr[t + 1] - v0
    if nv == 0:
        return
    dp, dq = dots[0], dots[1]
    if not single:
        _group_dots(t, maps, indptr, indices, data, csc_ptr, csc_rows, csc_vals, dense_t, use_dense, j0, nb, p, q, uf,
                    dp, dq)  # fmt: skip
    ga = tg_ptr[t]
    _tile_values(nb, v0, nv, dp, row_sq_t, j0, ppp, tg_group, ga, vkind, vpa, vpb, lgrp, lsq, torder, kp, xbuf, kbits)
    _tile_values(nb, v0, nv, dq, row_sq_t, j0, ppq, tg_group, ga, vkind, vpa, vpb, lgrp, lsq, torder, kq, xbuf, kbits)
    _increments(kp, kq, sp, sq, nv, nb)


@njit(**_OPTS)
def _segment(
    r0, r1, t0, t1, slot, indptr, indices, data, csc_ptr, csc_rows, csc_vals, use_csc, dense_t, use_dense, y,
    row_offset, V, row_sq_t, p, q, ppp, ppq, uf, up, uq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef, n_groups,
    tile_ptr, values, maps, B, scratch, partial,
):  # fmt: skip
    """Rows ``[r0, r1)`` x tiles ``[t0, t1)``: kernel values, the ``V`` update and the tile partials of the rows.

    Block of rows by block of rows: the pre-pass's values (those several
    tiles need, :func:`value_plan`), then each tile's own values and its
    kernels' ``V`` columns, each from its value's increment.  ``p``, ``q``:
    the two points as dense vectors (one group: the features outside it
    zeroed); ``ppp``, ``ppq``: their squared norms per group; ``uf``, ``up``,
    ``uq``: the features where either is non-zero, ascending, and their
    values (see :func:`_superstep_setup`).  Returns the best row of each
    class by the tile partial (meaningful when the plan has one tile).
    """
    kslot = values[4]
    dots, vals, shared, rowbuf, kbits_all, rows_all = scratch
    dts = dots[slot]
    dp, dq = dts[0], dts[1]
    kp, kq, skp, skq = vals[slot, 0], vals[slot, 1], shared[slot, 0], shared[slot, 1]
    xbuf, sp, sq, gb = rowbuf[slot, 0], rowbuf[slot, 1], rowbuf[slot, 2], rowbuf[slot, 3]
    kbits = kbits_all[slot]
    n_tiles = tile_ptr.shape[0] - 1
    single = n_groups == 1
    all_p, all_q = rows_all[slot, 0], rows_all[slot, 1]
    if single and use_csc:
        _csc_dots(r0, r1, y.shape[0], csc_ptr, csc_rows, csc_vals, uf, up, uq, all_p, all_q)
    best_pos, best_neg = -1, -1
    g_pos, g_neg = -np.inf, -np.inf
    lp = ip - row_offset
    lq = iq - row_offset
    for j0 in range(r0, r1, B):
        nb = min(B, r1 - j0)
        for b in range(nb):
            yj = y[j0 + b]
            sp[b] = 0.5 * yj * yp
            sq[b] = 0.5 * yj * yq
        if single:  # every value tile's local group 0 is group 0: its dots once per block
            if use_dense:
                _dense_block_dots(dense_t, j0, nb, p, q, dp, dq)
            elif use_csc:
                for b in range(nb):
                    dp[0, b] = all_p[j0 - r0 + b]
                    dq[0, b] = all_q[j0 - r0 + b]
            else:
                _block_dots(indptr, indices, data, j0, nb, p, q, tile_ptr, tile_ptr, True, dp, dq)
        _value_tile(n_tiles, single, values, maps, indptr, indices, data, csc_ptr, csc_rows, csc_vals, dense_t,
                    use_dense, row_sq_t, j0, nb, p, q, ppp, ppq, uf, sp, sq, dts, skp, skq, xbuf, kbits)  # fmt: skip
        for t in range(t0, t1):
            _value_tile(t, single, values, maps, indptr, indices, data, csc_ptr, csc_rows, csc_vals, dense_t, use_dense,
                        row_sq_t, j0, nb, p, q, ppp, ppq, uf, sp, sq, dts, kp, kq, xbuf, kbits)  # fmt: skip
            k0 = tile_ptr[t]
            k1 = tile_ptr[t + 1]
            gb[:nb] = 0.0
            for i in range(k0, k1):
                u = kslot[i]
                inc = kp[u] if u >= 0 else skp[-1 - u]
                _update_column(V[j0 : j0 + nb, i], inc, inv_trace[i], coef[i], gb, nb)
            # The ridge on the diagonal: row j gets its own once per picked column j; its partial is redone.
            _add_ridge_tile(V, lp, 0.5 * ridge_p, coef, gb, j0, nb, k0, k1)
            _add_ridge_tile(V, lq, 0.5 * ridge_q, coef, gb, j0, nb, k0, k1)
            for b in range(nb):
                g = gb[b]
                partial[t, j0 + b] = g
                best_pos, g_pos, best_neg, g_neg = _class_best(y[j0 + b] > 0, j0 + b, g, best_pos, g_pos, best_neg,
                                                               g_neg)  # fmt: skip
    return best_pos, g_pos, best_neg, g_neg


@njit(**_OPTS)
def _sum_rows(r0, r1, y, partial, gsum):
    """``g = partial[0] + partial[1] + ...`` (tile order) on rows ``[r0, r1)``, and the best row of each class."""
    n_tiles = partial.shape[0]
    for j in range(r0, r1):
        gsum[j] = partial[0, j]
    for t in range(1, n_tiles):
        for j in range(r0, r1):
            gsum[j] += partial[t, j]
    best_pos, best_neg = -1, -1
    g_pos, g_neg = -np.inf, -np.inf
    for j in range(r0, r1):
        best_pos, g_pos, best_neg, g_neg = _class_best(y[j] > 0, j, gsum[j], best_pos, g_pos, best_neg, g_neg)
    return best_pos, g_pos, best_neg, g_neg


@njit(**_OPTS)
def _superstep_serial(
    indptr, indices, data, csc_ptr, csc_rows, csc_vals, use_csc, dense_t, use_dense, y, row_offset, V, row_sq_t, p,
    q, ppp, ppq, uf, up, uq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef, n_groups, tile_ptr, values, maps,
    B, scratch, partial, gsum,
):  # fmt: skip
    n = y.shape[0]
    n_tiles = tile_ptr.shape[0] - 1
    r = _segment(
        0, n, 0, n_tiles, 0, indptr, indices, data, csc_ptr, csc_rows, csc_vals, use_csc, dense_t, use_dense, y,
        row_offset, V, row_sq_t, p, q, ppp, ppq, uf, up, uq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef,
        n_groups, tile_ptr, values, maps, B, scratch, partial,
    )  # fmt: skip
    if n_tiles == 1:
        return r
    return _sum_rows(0, n, y, partial, gsum)


@njit(parallel=True, **_OPTS)
def _superstep_parallel(
    indptr, indices, data, csc_ptr, csc_rows, csc_vals, use_csc, dense_t, use_dense, y, row_offset, V, row_sq_t, p,
    q, ppp, ppq, uf, up, uq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef, n_groups, tile_ptr, values, maps,
    B, scratch, partial, gsum, bounds, n_rb,
):  # fmt: skip
    """Tasks (row block, tile), row-block major, in contiguous runs ``bounds[c]:bounds[c + 1]`` (one per thread
    and scratch slot; :meth:`SuperstepWorkspace.chunks`).

    A run's tasks of one row block are one :func:`_segment` (its pre-pass
    once per block of rows).  Then, with several tiles, a pass over row
    chunks sums the tile partials in tile order; per-chunk maxima are reduced
    in row order (ties: lowest row).
    """
    n = y.shape[0]
    n_tiles = tile_ptr.shape[0] - 1
    n_tasks = n_rb * n_tiles
    n_chunks = bounds.shape[0] - 1
    tb = np.full((n_tasks, 2), -1, np.int64)
    tg = np.full((n_tasks, 2), -np.inf)
    for c in prange(n_chunks):
        a = bounds[c]
        e = bounds[c + 1]
        while a < e:
            rb = a // n_tiles
            t0 = a - rb * n_tiles
            t1 = min(e - rb * n_tiles, n_tiles)
            bp, gp, bn, gn = _segment(
                (n * rb) // n_rb, (n * (rb + 1)) // n_rb, t0, t1, c, indptr, indices, data, csc_ptr, csc_rows,
                csc_vals, use_csc, dense_t, use_dense, y, row_offset, V, row_sq_t, p, q, ppp, ppq, uf, up, uq, ip, iq,
                yp, yq, inv_trace, ridge_p, ridge_q, coef, n_groups, tile_ptr, values, maps, B, scratch, partial,
            )  # fmt: skip
            tb[a, 0] = bp
            tb[a, 1] = bn
            tg[a, 0] = gp
            tg[a, 1] = gn
            a = rb * n_tiles + t1
    if n_tiles > 1:
        tb = np.empty((n_chunks, 2), np.int64)
        tg = np.empty((n_chunks, 2))
        for c in prange(n_chunks):
            bp, gp, bn, gn = _sum_rows((n * c) // n_chunks, (n * (c + 1)) // n_chunks, y, partial, gsum)
            tb[c, 0] = bp
            tb[c, 1] = bn
            tg[c, 0] = gp
            tg[c, 1] = gn
    return _reduce_chunks(tb[:, 0], tg[:, 0], tb[:, 1], tg[:, 1])


@njit(**_OPTS)
def _reduce_chunks(bp, gp, bn, gn):
    """Chunks in row order, strict ``>``: the first (lowest) row among equal maxima wins."""
    best_pos, best_neg = -1, -1
    g_pos, g_neg = -np.inf, -np.inf
    for c in range(bp.shape[0]):
        if bp[c] >= 0 and gp[c] > g_pos:
            g_pos = gp[c]
            best_pos = bp[c]
        if bn[c] >= 0 and gn[c] > g_neg:
            g_neg = gn[c]
            best_neg = bn[c]
    return best_pos, g_pos, best_neg, g_neg


@njit(**_OPTS)
def _scatter_point(pi, pv, feat_ptr, feat_groups, single, out, norms):
    """Point entries ``(pi, pv)`` into the zeroed dense ``out``, and its squared norm per group into ``norms``.

    With one group (``single``) the features outside it stay zero: a row pass
    then adds only ``+-0`` terms for those, which leaves every partial sum
    unchanged, so the dot products equal the general path's per-group sums
    exactly.  The norms add each group's terms in increasing feature order, as
    a pass over the group's features would: the same sums.
    """
    norms[:] = 0.0
    for k in range(pi.shape[0]):
        f = pi[k]
        v = pv[k]
        if v == 0.0:
            continue
        if not single or feat_ptr[f + 1] > feat_ptr[f]:
            out[f] = v
        for t in range(feat_ptr[f], feat_ptr[f + 1]):
            norms[feat_groups[t]] += v * v


@njit(**_OPTS)
def _point_union(pi, qi, p, q):
    """The features where ``p`` or ``q`` (dense, after :func:`_scatter_point`) is non-zero, ascending, and the values.

    ``pi`` and ``qi`` (ascending) hold every candidate feature; ``O(len(pi) + len(qi))``.
    """
    uf = np.empty(pi.shape[0] + qi.shape[0], np.int64)
    up = np.empty(uf.shape[0])
    uq = np.empty(uf.shape[0])
    a = 0
    b = 0
    n = 0
    while a < pi.shape[0] or b < qi.shape[0]:
        if b >= qi.shape[0] or (a < pi.shape[0] and pi[a] < qi[b]):
            f = pi[a]
            a += 1
        elif a >= pi.shape[0] or qi[b] < pi[a]:
            f = qi[b]
            b += 1
        else:
            f = pi[a]
            a += 1
            b += 1
        if p[f] != 0.0 or q[f] != 0.0:
            uf[n] = f
            up[n] = p[f]
            uq[n] = q[f]
            n += 1
    return uf[:n], up[:n], uq[:n]


@njit(**_OPTS)
def _superstep_setup(pi, pv, qi, qv, p, q, indptr, feat_ptr, feat_groups, n_groups, csc_ptr, dense_t):
    """A superstep's view of its two points, and which dot pass to use: dense copy, column pass or row pass.

    ``(pi, pv)``, ``(qi, qv)``: the points' non-zero entries, features ascending;
    ``p``, ``q``: the shard's zeroed dense buffers, filled here (the caller clears
    them after the superstep).  Everything costs ``O(non-zeros)`` (plus the
    columns' lengths), never ``O(n_features)``: one row with a large feature index
    makes the data wide, not the supersteps slow.
    """
    single = n_groups == 1
    ppp = np.empty(n_groups)
    ppq = np.empty(n_groups)
    _scatter_point(pi, pv, feat_ptr, feat_groups, single, p, ppp)
    _scatter_point(qi, qv, feat_ptr, feat_groups, single, q, ppq)
    uf, up, uq = _point_union(pi, qi, p, q)
    # A dense copy (dense data) beats both sparse passes: contiguous, vectorised loops.
    use_dense = dense_t.shape[0] == p.shape[0] and dense_t.shape[1] == indptr.shape[0] - 1
    # A column pass (one group, a CSC copy) touches the entries of the columns where p or q is non-zero;
    # it pays a scattered update per entry, a row pass a sequential sum: prefer rows near parity.
    use_csc = False
    if single and not use_dense and csc_ptr.shape[0] == p.shape[0] + 1:
        cost = 0
        for u in range(uf.shape[0]):
            cost += csc_ptr[uf[u] + 1] - csc_ptr[uf[u]]
        use_csc = cost < 0.75 * (indptr[indptr.shape[0] - 1] - indptr[0])
    return ppp, ppq, uf, up, uq, use_csc, use_dense


@njit(**_OPTS)
def _clear_point(pi, out):
    for k in range(pi.shape[0]):
        out[pi[k]] = 0.0


def point_entries(p) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, values)``: a point's non-zero entries, features ascending (int64, float64).

    ``p`` is a dense vector, or already ``(indices, values)`` (ascending, as a
    CSR row's); a dense vector costs ``O(n_features)``, entries cost nothing.
    """
    if isinstance(p, tuple):
        idx, val = p
        return np.ascontiguousarray(idx, dtype=np.int64), np.ascontiguousarray(val, dtype=np.float64)
    p = np.ascontiguousarray(p, dtype=np.float64)
    idx = np.flatnonzero(p)
    return idx.astype(np.int64, copy=False), p[idx]


def dense_copy(X) -> np.ndarray | None:
    """A dense ``(n_features, n_rows)`` copy of CSR rows for :func:`superstep_features`, or None.

    Made only when it costs at most twice the CSR arrays' memory (density of
    about a third or more): then it replaces the CSC copy as the faster pass.
    """
    n, d = X.shape
    if n == 0 or d == 0 or 8 * n * d > 2 * (12 * X.nnz + 8 * (n + 1)):
        return None
    return np.ascontiguousarray(X.toarray().T)


def _as_f64(a):
    return np.ascontiguousarray(a, dtype=np.float64)


# No CSC copy; int32 like scipy's index arrays, so no extra numba specialisation is compiled.
_NO_CSC = (np.zeros(1, np.int32), np.zeros(0, np.int32), np.zeros(0))
_NO_DENSE = np.zeros((0, 0))


#: Rows per thread from which a superstep's threads split the rows rather than the kernel tiles.
ROW_SPLIT_ROWS = 256


def _layout(n_rows: int, n_tiles: int, n_kernels: int) -> tuple[int, int]:
    """``(threads, row blocks)`` of a superstep: threads by work (rows x kernels).

    A row block per thread when each gets :data:`ROW_SPLIT_ROWS` rows or
    there are fewer tiles than threads: equal shares with nothing done twice.
    Else one row block, its tiles split between the threads (a thread's share
    of few rows as a block of its own would cost each kernel's per-block work
    for half the rows: a bank on Sonar's 166 rows), each thread with the
    pre-pass of the values its tiles need.
    """
    n_threads = threads_for(n_rows * n_kernels)
    if n_threads == 1:
        return 1, 1
    if n_tiles < n_threads or n_rows >= ROW_SPLIT_ROWS * n_threads:
        return n_threads, max(1, min(n_threads, n_rows // 32))
    return n_threads, 1


def _row_passes(indptr, indices, data, feat_ptr, feat_groups, n_groups, row_sq, csc, dense_t):
    """A superstep's views of its rows: ``(row_sq_t, (csc_ptr, csc_rows, csc_vals), dense_t)``.

    ``row_sq_t`` is the rows' :func:`group_sqnorms`, ``(n_groups, n_rows)`` C order (computed when
    ``row_sq`` is None); a missing CSC or dense copy is replaced by its empty stand-in.
    """
    if row_sq is None:
        row_sq = group_sqnorms(indptr, indices, data, feat_ptr, feat_groups, n_groups)
    row_sq_t = np.ascontiguousarray(np.asarray(row_sq).T)
    return row_sq_t, (_NO_CSC if csc is None else csc), (_NO_DENSE if dense_t is None else dense_t)


def _run_superstep(front, workspace, n_threads, n_rb, use_csc):
    """Runs a superstep's (row block, tile) tasks (``front``: their arguments up to the scratch) on ``n_threads``."""
    with parallel(n_threads) as n_threads:
        args = (*front, workspace.ensure(n_threads, use_csc), workspace.partial, workspace.g)
        if n_threads > 1:
            bp, gp, bn, gn = _superstep_parallel(*args, workspace.chunks(n_threads, n_rb), n_rb)
        else:
            bp, gp, bn, gn = _superstep_serial(*args)
    return int(bp), float(gp), int(bn), float(gn)


def superstep_features(indptr, indices, data, y, row_offset, V, p, q, ip, iq, yp, yq, inv_trace, ridge, coef, kind,
                       pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups, row_sq=None, csc=None,
                       dense_t=None, workspace=None):  # fmt: skip
    """One fused pass: ``V += (G[:, ip] + G[:, iq]) / 2`` then ``g = V @ coef`` and per-class argmax.

    ``G_i[j, k] = y_j y_k K_i(x_j, x_k) * inv_trace[i] + ridge_j * [j == k]`` with
    global indices ``ip``/``iq`` (``row_offset`` is this block's first global
    row), ``p``/``q`` the two points with labels ``yp``/``yq``: each its
    non-zero entries ``(indices, values)`` (features ascending) or a dense
    feature vector.  Given entries, nothing here costs ``O(n_features)`` per
    call (the workspace's dense buffers are filled and cleared entry by entry).
    ``V`` (``(n_rows, m)``, updated in place) may have any memory layout;
    Fortran order is fastest.

    The score is summed per kernel tile (:func:`kernel_tiles`: each tile's
    partial a sequential sum over its kernels from 0), then over the tiles
    in tile order; the partials are left in ``workspace.partial``.  The work
    is split into (row block, tile) tasks over the threads of
    :func:`get_num_threads` when there is enough of it; every row's numbers,
    and so the result, are the same for every thread count.

    Parameters
    ----------
    ridge : float or tuple of two floats
        The diagonal term: one value for every row, or ``(ridge_ip, ridge_iq)``,
        the per-point ridges of the two picked rows (the only rows whose
        diagonal a superstep touches).
    row_sq : ndarray of shape (n_rows, n_groups), optional
        :func:`group_sqnorms` of the rows; computed here when ``None`` (a
        shard passes its cached copy, best as the transpose of a C-ordered
        ``(n_groups, n_rows)`` array: it is used in that layout).
    csc : tuple of (indptr, indices, data), optional
        The same rows in CSC form with sorted row indices.  With one feature
        group the dot products are then computed over the columns where ``p``
        or ``q`` is non-zero when that touches fewer entries than a row pass;
        with several groups each task visits its tile's columns only
        (identical numbers, fewer operations on sparse data).
    dense_t : ndarray of shape (n_features, n_rows), optional
        The same rows as a dense, C-contiguous transposed copy (:func:`dense_copy`).
        The dot products then come from contiguous, vectorised loops over rows
        (identical numbers; on dense low-dimensional data such as cod-rna the
        dots cost about a tenth of a CSR pass).
    workspace : SuperstepWorkspace, optional
        :func:`superstep_workspace` for these rows and this plan, kept by the
        caller across supersteps (made here, for this call only, when ``None``).

    Returns
    -------
    best_pos, g_pos, best_neg, g_neg
        Local row indices of the best row of each class and their scores
        (``-1`` and ``-inf`` when the block has no row of that class); ties go
        to the lowest index.
    """
    n_groups = int(n_groups)
    row_sq_t, (csc_ptr, csc_rows, csc_vals), dense_t = _row_passes(
        indptr, indices, data, feat_ptr, feat_groups, n_groups, row_sq, csc, dense_t
    )
    if workspace is None:
        workspace = superstep_workspace(len(y), kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups)
    ridge_p, ridge_q = (ridge, ridge) if np.ndim(ridge) == 0 else ridge
    pi, pv = point_entries(p)
    qi, qv = point_entries(q)
    pd, qd = workspace.point_buffers()
    try:
        ppp, ppq, uf, up, uq, use_csc, use_dense = _superstep_setup(
            pi, pv, qi, qv, pd, qd, indptr, feat_ptr, feat_groups, n_groups, csc_ptr, dense_t
        )
        front = (
            indptr, indices, data, csc_ptr, csc_rows, csc_vals, bool(use_csc), dense_t, bool(use_dense), y,
            int(row_offset), V, row_sq_t, pd, qd, ppp, ppq, uf, up, uq, int(ip), int(iq), float(yp), float(yq),
            inv_trace, float(ridge_p), float(ridge_q), coef, n_groups, workspace.tile_ptr, workspace.values,
            workspace.maps, workspace.B,
        )  # fmt: skip
        n_threads, n_rb = _layout(len(y), workspace.n_tiles, len(kind))
        return _run_superstep(front, workspace, n_threads, n_rb, bool(use_csc))
    finally:  # the buffers zero again for the next superstep: O(non-zeros), not O(n_features)
        _clear_point(pi, pd)
        _clear_point(qi, qd)


@njit(**_OPTS)
def _superstep_columns(y, row_offset, V, colp, colq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef, tile_ptr,
                       partial):  # fmt: skip
    n = V.shape[0]
    n_tiles = tile_ptr.shape[0] - 1
    best_pos, best_neg = -1, -1
    g_pos, g_neg = -np.inf, -np.inf
    lp = ip - row_offset
    lq = iq - row_offset
    diag_p = 0.5 * ridge_p
    diag_q = 0.5 * ridge_q
    for j in range(n):
        sp = 0.5 * y[j] * yp
        sq = 0.5 * y[j] * yq
        g = 0.0
        for t in range(n_tiles):
            s = 0.0
            for i in range(tile_ptr[t], tile_ptr[t + 1]):
                v = V[j, i] + (sp * colp[j, i] + sq * colq[j, i]) * inv_trace[i]
                # The ridge, as superstep_features adds it: once per picked column through row j.
                if j == lp:
                    v = v + diag_p
                if j == lq:
                    v = v + diag_q
                V[j, i] = v
                s += coef[i] * v
            partial[t, j] = s
            g = s if t == 0 else g + s
        best_pos, g_pos, best_neg, g_neg = _class_best(y[j] > 0, j, g, best_pos, g_pos, best_neg, g_neg)
    return best_pos, g_pos, best_neg, g_neg


def superstep_columns(y, row_offset, V, colp, colq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef, tile_ptr=None,
                      partial=None):  # fmt: skip
    """The same update as :func:`superstep_features` from materialised raw columns ``(n, m)``.

    ``ridge_p`` and ``ridge_q`` are the ridges of the picked rows ``ip`` and
    ``iq``.  Scores are summed per tile (``tile_ptr``, by default
    :func:`kernel_tiles` of ``m`` chain-free kernels) and then over tiles in
    order; ``partial`` ``(n_tiles, n_rows)`` receives the tile partials.
    """
    if tile_ptr is None:
        tile_ptr = kernel_tiles(V.shape[1])
    if partial is None:
        partial = np.empty((len(tile_ptr) - 1, V.shape[0]))
    bp, gp, bn, gn = _superstep_columns(
        y, int(row_offset), V, colp, colq, int(ip), int(iq), float(yp), float(yq), inv_trace, float(ridge_p),
        float(ridge_q), coef, tile_ptr, partial,
    )  # fmt: skip
    return int(bp), float(gp), int(bn), float(gn)


# ----------------------------------------------------------------------------- columns, diagonal, points


@njit(**_OPTS)
def _block_buffers(n_groups, m, B):
    """Scratch for one block of ``B`` rows: dots and distances to both points, kernel values, exp work."""
    return (
        np.empty((n_groups, B)),
        np.empty((n_groups, B)),
        np.empty((n_groups, B)),
        np.empty((n_groups, B)),
        np.empty((m, B)),
        np.empty((m, B)),
        np.empty(B),
        np.empty(2 * B, np.int64),
    )


@njit(**_OPTS)
def _columns_impl(indptr, indices, data, row_sq, p, q, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups,
                  n_groups, B):  # fmt: skip
    n = indptr.shape[0] - 1
    m = kind.shape[0]
    colp = np.empty((n, m))
    colq = np.empty((n, m))
    pm, qm, ppp, ppq, _ = _prepare_points(p, q, feat_ptr, feat_groups, n_groups, np.zeros(1, np.int64))
    single = n_groups == 1
    dp, dq, d2p, d2q, kp, kq, xbuf, kbits = _block_buffers(n_groups, m, B)
    for j0 in range(0, n, B):
        nb = min(B, n - j0)
        _block_dots(indptr, indices, data, j0, nb, pm, qm, feat_ptr, feat_groups, single, dp, dq)
        _block_dist2(row_sq, j0, nb, ppp, dp, d2p)
        _block_dist2(row_sq, j0, nb, ppq, dq, d2q)
        _block_values(nb, dp, d2p, kind, pa, pb, grp, square_of, order, kp, xbuf, kbits)
        _block_values(nb, dq, d2q, kind, pa, pb, grp, square_of, order, kq, xbuf, kbits)
        for b in range(nb):
            for i in range(m):
                colp[j0 + b, i] = kp[i, b]
                colq[j0 + b, i] = kq[i, b]
    return colp, colq


def kernel_columns(
    indptr, indices, data, p, q, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups, row_sq=None
):
    """Raw kernel values ``K_i(x_j, p)`` and ``K_i(x_j, q)`` as two ``(n_rows, m)`` arrays.

    The same numbers :func:`superstep_features` adds to ``V`` (before the
    label, trace and ridge factors).
    """
    n_groups = int(n_groups)
    if row_sq is None:
        row_sq = group_sqnorms(indptr, indices, data, feat_ptr, feat_groups, n_groups)
    return _columns_impl(
        indptr, indices, data, row_sq, _as_f64(p), _as_f64(q), kind, pa, pb, grp, square_of, order, feat_ptr,
        feat_groups, n_groups, _block_size(len(kind)),
    )  # fmt: skip


def point_kernels(p, q, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """Raw ``K_i(p, p)``, ``K_i(q, q)``, ``K_i(p, q)`` for two points (dense, or ``(indices, values)``).

    Bit-identical to the column values a superstep computes for the rows ``p``
    and ``q`` (same sums in the same order), so ``K(p, p)`` of a Gaussian is
    exactly 1.  Costs ``O(non-zeros)`` given entries (:func:`point_entries`).
    """
    pi, pv = point_entries(p)
    qi, qv = point_entries(q)
    return _point_kernels(pi, pv, qi, qv, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups)


@njit(**_OPTS)
def _point_kernels(pi, pv, qi, qv, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """:func:`point_kernels` on the points' entries: the features where either is non-zero, ascending."""
    m = kind.shape[0]
    dot = np.zeros((n_groups, 3))
    sq = np.zeros((n_groups, 2))
    a_ = 0
    b_ = 0
    while a_ < pi.shape[0] or b_ < qi.shape[0]:
        if b_ >= qi.shape[0] or (a_ < pi.shape[0] and pi[a_] < qi[b_]):
            f = pi[a_]
            a = pv[a_]
            c = 0.0
            a_ += 1
        elif a_ >= pi.shape[0] or qi[b_] < pi[a_]:
            f = qi[b_]
            a = 0.0
            c = qv[b_]
            b_ += 1
        else:
            f = pi[a_]
            a = pv[a_]
            c = qv[b_]
            a_ += 1
            b_ += 1
        for t in range(feat_ptr[f], feat_ptr[f + 1]):
            g = feat_groups[t]
            if a != 0.0:
                sq[g, 0] += a * a
                dot[g, 0] += a * a
                dot[g, 2] += a * c
            if c != 0.0:
                sq[g, 1] += c * c
                dot[g, 1] += c * c
    dist2 = np.empty((n_groups, 3))
    for g in range(n_groups):
        dist2[g, 0] = _dist2(sq[g, 0], sq[g, 0], dot[g, 0])
        dist2[g, 1] = _dist2(sq[g, 1], sq[g, 1], dot[g, 1])
        dist2[g, 2] = _dist2(sq[g, 0], sq[g, 1], dot[g, 2])
    # Every Gaussian that is no square in one exp call (per-kernel calls on 3 values cost more than the exp),
    # then the values in chain order: the operations of _kernel_values, the same bits.
    out = np.empty((3, m))
    arg = np.empty(3 * m)
    n_exp = 0
    for i in range(m):
        if kind[i] == 2 and square_of[i] < 0:
            for c in range(3):
                arg[n_exp + c] = _gauss_arg(dist2[grp[i], c], pa[i])
            n_exp += 3
    ex = np.empty(n_exp)
    _exp_into(arg, ex, np.empty(2 * n_exp, np.int64), n_exp)
    n_exp = 0
    for i in range(m):
        if kind[i] == 2 and square_of[i] < 0:
            for c in range(3):
                out[c, i] = ex[n_exp + c]
            n_exp += 3
    for t in range(m):
        i = order[t]
        g = grp[i]
        src = square_of[i]
        for c in range(3):
            if src >= 0:
                v = out[c, src]
                out[c, i] = v * v
            elif kind[i] == 0:
                out[c, i] = dot[g, c]
            elif kind[i] == 1:
                base = dot[g, c] + pb[i]
                v = base
                for _ in range(int(pa[i]) - 1):
                    v *= base
                out[c, i] = v
    return out[0].copy(), out[1].copy(), out[2].copy()


@njit(**_OPTS)
def _diag_rows(r0, r1, out, indptr, indices, data, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups,
               n_groups):  # fmt: skip
    """Rows ``[r0, r1)`` of :func:`kernel_diagonal`."""
    m = kind.shape[0]
    sqx = np.empty((n_groups, 1))
    zero = np.zeros((n_groups, 1))
    vals = np.empty((m, 1))
    xbuf = np.empty(1)
    kbits = np.empty(2, np.int64)
    for j in range(r0, r1):
        sqx[:, 0] = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            f = indices[k]
            c = data[k] * data[k]
            for t in range(feat_ptr[f], feat_ptr[f + 1]):
                sqx[feat_groups[t], 0] += c
        # x . x = |x|^2 and |x - x|^2 = 0 exactly.
        _block_values(1, sqx, zero, kind, pa, pb, grp, square_of, order, vals, xbuf, kbits)
        for i in range(m):
            out[j, i] = vals[i, 0]


@njit(parallel=True, **_OPTS)
def _diag_parallel(out, indptr, indices, data, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups,
                   n_chunks):  # fmt: skip
    n = indptr.shape[0] - 1
    for c in prange(n_chunks):
        _diag_rows((n * c) // n_chunks, (n * (c + 1)) // n_chunks, out, indptr, indices, data, kind, pa, pb, grp,
                   square_of, order, feat_ptr, feat_groups, n_groups)  # fmt: skip


def kernel_diagonal(indptr, indices, data, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """``K_i(x_j, x_j)`` as an ``(n_rows, m)`` array (traces are its column sums); rows over threads by work."""
    n = len(indptr) - 1
    n_groups = int(n_groups)
    out = np.empty((n, len(kind)))
    args = (indptr, indices, data, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups)
    with parallel(min(threads_for(n * (len(kind) + n_groups)), max(1, n // 16))) as n_threads:
        if n_threads > 1:
            _diag_parallel(out, *args, min(n, 4 * n_threads))
        else:
            _diag_rows(0, n, out, *args)
    return out


@njit(**_OPTS)
def _group_features(feat_ptr, feat_groups, n_groups):
    """The inverse of the plan's feature -> groups map: ``gptr, gfeat``, each group's features ascending."""
    d = feat_ptr.shape[0] - 1
    gptr = np.zeros(n_groups + 1, np.int64)
    for f in range(d):
        for u in range(feat_ptr[f], feat_ptr[f + 1]):
            gptr[feat_groups[u] + 1] += 1
    for g in range(n_groups):
        gptr[g + 1] += gptr[g]
    gfeat = np.empty(gptr[n_groups], np.int64)
    fill = gptr[:n_groups].copy()
    for f in range(d):
        for u in range(feat_ptr[f], feat_ptr[f + 1]):
            g = feat_groups[u]
            gfeat[fill[g]] = f
            fill[g] += 1
    return gptr, gfeat


#: ``(gptr, gfeat)`` of a plan's ``feat_ptr``, ``feat_groups`` and group count (the GPU shards' plan arrays too).
group_features = _group_features


@njit(**_OPTS)
def _group_sqnorms_csc(n_rows, csc_ptr, csc_rows, csc_vals, feat_ptr, feat_groups, n_groups):
    gptr, gfeat = _group_features(feat_ptr, feat_groups, n_groups)
    out = np.zeros((n_groups, n_rows))
    for g in range(n_groups):
        o = out[g]
        for u in range(gptr[g], gptr[g + 1]):
            f = gfeat[u]
            for k in range(csc_ptr[f], csc_ptr[f + 1]):
                v = csc_vals[k]
                o[csc_rows[k]] += v * v
    return out


def group_sqnorms_t(indptr, indices, data, feat_ptr, feat_groups, n_groups):
    """:func:`group_sqnorms` as an ``(n_groups, n_rows)`` array (its ``.T`` is Fortran-ordered).

    Computed group by group from a CSC copy: each ``(row, group)`` sum adds
    the row's entries in increasing feature order, as :func:`group_sqnorms`
    does, so the numbers are the same.
    """
    n = len(indptr) - 1
    csc = sp.csr_matrix((data, indices, indptr), shape=(n, len(feat_ptr) - 1)).tocsc()
    csc.sort_indices()
    return _group_sqnorms_csc(n, csc.indptr, csc.indices, csc.data, feat_ptr, feat_groups, int(n_groups))


@njit(**_OPTS)
def group_sqnorms(indptr, indices, data, feat_ptr, feat_groups, n_groups):
    """``|x_j restricted to group g|^2`` as an ``(n_rows, n_groups)`` array."""
    n = indptr.shape[0] - 1
    out = np.zeros((n, n_groups))
    for j in range(n):
        for k in range(indptr[j], indptr[j + 1]):
            f = indices[k]
            c = data[k] * data[k]
            for t in range(feat_ptr[f], feat_ptr[f + 1]):
                out[j, feat_groups[t]] += c
    return out


# ----------------------------------------------------------------------------- decision function


@njit(**_OPTS)
def _wks_tile_dots(tile, maps, x, j0, nb, sv_ptr, sv_rows, sv_vals, sv_dense_t, use_dense, dot):
    """Dots of the row ``x`` with SVs ``[j0, j0 + nb)`` for the local groups of ``tile``."""
    gptr, gfeat, tg_ptr, tg_group, lgrp, lsq, torder, tf_ptr, tf_feat, tf_gptr, tf_lg = maps
    ga = tg_ptr[tile]
    ng = tg_ptr[tile + 1] - ga
    stop_sv = j0 + nb
    if use_dense:  # terms of features where x is 0 are +-0: they leave the sums unchanged
        for lg in range(ng):
            g = tg_group[ga + lg]
            dl = dot[lg]
            dl[:nb] = 0.0
            _dots4(sv_dense_t, j0, nb, gfeat, gptr[g], gptr[g + 1], x, dl, x, dl, False)
    else:
        dot[:ng, :nb] = 0.0
        for u in range(tf_ptr[tile], tf_ptr[tile + 1]):
            f = tf_feat[u]
            xf = x[f]
            if xf == 0.0:
                continue
            a0 = sv_ptr[f]
            e = sv_ptr[f + 1]
            kk = a0 if j0 == 0 else a0 + np.searchsorted(sv_rows[a0:e], j0)
            w0 = tf_gptr[u]
            w1 = tf_gptr[u + 1]
            while kk < e and sv_rows[kk] < stop_sv:
                r = sv_rows[kk] - j0
                a = sv_vals[kk] * xf
                for w in range(w0, w1):
                    dot[tf_lg[w], r] += a
                kk += 1


@njit(**_OPTS)
def _wks_values(t, single, values, maps, x, sqx, j0, nb, sv_ptr, sv_rows, sv_vals, sv_dense_t, use_dense, sv_sq_t, dot,
                out, xbuf, kbits):  # fmt: skip
    """The values of value tile ``t`` (:func:`value_plan`) of the row ``x`` against SVs ``[j0, j0 + nb)``."""
    vtile_ptr, vkind, vpa, vpb, kslot = values
    v0 = vtile_ptr[t]
    nv = vtile_ptr[t + 1] - v0
    if nv == 0:
        return
    if not single:
        _wks_tile_dots(t, maps, x, j0, nb, sv_ptr, sv_rows, sv_vals, sv_dense_t, use_dense, dot)
    _tile_values(nb, v0, nv, dot, sv_sq_t, j0, sqx, maps[3], maps[2][t], vkind, vpa, vpb, maps[4], maps[5], maps[6],
                 out, xbuf, kbits)  # fmt: skip


@njit(**_OPTS)
def _wks_rows(
    start, stop, out, indptr, indices, data, n_features, sv_ptr, sv_rows, sv_vals, sv_dense_t, use_dense, sv_sq_t,
    coef, weights, feat_ptr, feat_groups, n_groups, tile_ptr, values, maps, G, T, S, B,
):  # fmt: skip
    """Rows ``[start, stop)`` of :func:`weighted_kernel_sums`, tile by tile over the kernels.

    Per row and block of support vectors, the values several tiles need come
    first (the pre-pass of :func:`value_plan`), then each kernel tile
    (:func:`kernel_tiles`) gets the dot products and squared distances of
    its own values' feature groups only, then its values; ``acc[o, b]`` adds
    ``weights[o, i] K_i`` over the tiles in order, so each support vector's
    kernel sum is still one sequential sum over the kernels from the first.
    Dot products: with one feature group, from the support vectors' CSC
    columns of the row's non-zero features (once per row); otherwise per tile
    group from a dense transposed copy of the support vectors (``use_dense``)
    or from their CSC columns of the tile's features.  Every path adds a
    group's products ``sv_f x_f`` in increasing feature order (terms with
    ``x_f == 0`` are skipped, other zero products add ``+-0`` to a sum that
    starts at ``+0``, which changes no sum), so all give the numbers of a
    pass over each support vector's sorted entries.
    """
    n_sv = coef.shape[1]
    n_out = weights.shape[0]
    n_tiles = tile_ptr.shape[0] - 1
    kslot = values[4]
    single = n_groups == 1
    x = np.zeros(n_features)
    sqx = np.zeros(n_groups)
    all_dots = np.empty(n_sv if single else 0)
    dot = np.empty((G, B))
    kv = np.empty((T, B))
    sv = np.empty((S, B))
    acc = np.empty((n_out, B))
    xbuf = np.empty(B)
    kbits = np.empty(2 * B, np.int64)
    for t in range(start, stop):
        for k in range(indptr[t], indptr[t + 1]):
            f = indices[k]
            v = data[k]
            x[f] = v
            for u in range(feat_ptr[f], feat_ptr[f + 1]):
                sqx[feat_groups[u]] += v * v
        if single:
            all_dots[:] = 0.0
            for k in range(indptr[t], indptr[t + 1]):
                f = indices[k]
                if feat_ptr[f + 1] == feat_ptr[f]:  # feature outside the (single) group
                    continue
                v = data[k]
                for kk in range(sv_ptr[f], sv_ptr[f + 1]):
                    all_dots[sv_rows[kk]] += sv_vals[kk] * v
        for j0 in range(0, n_sv, B):
            nb = min(B, n_sv - j0)
            if single:  # every value tile's local group 0 is group 0
                for b in range(nb):
                    dot[0, b] = all_dots[j0 + b]
            _wks_values(n_tiles, single, values, maps, x, sqx, j0, nb, sv_ptr, sv_rows, sv_vals, sv_dense_t, use_dense,
                        sv_sq_t, dot, sv, xbuf, kbits)  # fmt: skip
            acc[:, :nb] = 0.0
            for tile in range(n_tiles):
                _wks_values(tile, single, values, maps, x, sqx, j0, nb, sv_ptr, sv_rows, sv_vals, sv_dense_t, use_dense,
                            sv_sq_t, dot, kv, xbuf, kbits)  # fmt: skip
                for o in range(n_out):
                    ao = acc[o]
                    for i in range(tile_ptr[tile], tile_ptr[tile + 1]):
                        u = kslot[i]
                        _axpy(weights[o, i], kv[u] if u >= 0 else sv[-1 - u], ao, nb)
            for o in range(n_out):
                s = out[t, o]
                for b in range(nb):
                    c = coef[o, j0 + b]
                    if c != 0.0:
                        s += c * acc[o, b]
                out[t, o] = s
        for k in range(indptr[t], indptr[t + 1]):
            f = indices[k]
            x[f] = 0.0
            for u in range(feat_ptr[f], feat_ptr[f + 1]):
                sqx[feat_groups[u]] = 0.0


@njit(**_OPTS)
def _axpy(w, x, acc, nb):
    for b in range(nb):
        acc[b] += w * x[b]


@njit(parallel=True, **_OPTS)
def _wks_parallel(
    out, indptr, indices, data, n_features, sv_ptr, sv_rows, sv_vals, sv_dense_t, use_dense, sv_sq_t, coef, weights,
    feat_ptr, feat_groups, n_groups, tile_ptr, values, maps, G, T, S, B, n_chunks,
):  # fmt: skip
    n = indptr.shape[0] - 1
    for c in prange(n_chunks):
        _wks_rows(
            (n * c) // n_chunks, (n * (c + 1)) // n_chunks, out, indptr, indices, data, n_features, sv_ptr, sv_rows,
            sv_vals, sv_dense_t, use_dense, sv_sq_t, coef, weights, feat_ptr, feat_groups, n_groups, tile_ptr, values,
            maps, G, T, S, B,
        )  # fmt: skip


def _predicted_kernels(weights, kind, square_of):
    """Indices of the kernels a prediction evaluates (ascending), or None for all of them.

    A Gaussian whose weight is exactly 0 for every output adds ``0 * K = +-0``
    (``K`` is finite) to sums that start at ``+0``, which changes none of them:
    it is left out unless a kept kernel is its square.  Other kernels are
    kept (their values may overflow, and ``0 * inf`` is NaN).
    """
    square_of = np.asarray(square_of)
    gaussian = (np.asarray(kind) == 2) | (square_of >= 0)
    keep = np.any(weights != 0.0, axis=0) | ~gaussian
    if keep.all():
        return None
    while True:  # a kept square needs its source (chains are short)
        src = square_of[keep & (square_of >= 0)]
        if keep[src].all():
            break
        keep[src] = True
    return np.flatnonzero(keep)


def _used_support_vectors(coef, sv_sq_t, sv_indptr, sv_indices, sv_data, n_features):
    """``(coef, sv_sq_t, sv_indptr, sv_indices, sv_data)`` without the support vectors no output uses."""
    used = np.flatnonzero(np.any(coef != 0.0, axis=0))
    if len(used) < coef.shape[1]:  # support vectors that no output uses are never added
        coef = _as_f64(coef[:, used])
        sv_sq_t = np.ascontiguousarray(sv_sq_t[:, used])
        sv = sp.csr_matrix((sv_data, sv_indices, sv_indptr), shape=(len(sv_indptr) - 1, n_features))[used]
        sv_indptr, sv_indices, sv_data = sv.indptr, sv.indices, sv.data
    return coef, sv_sq_t, sv_indptr, sv_indices, sv_data


def _predicted_plan(weights, kind, pa, pb, grp, square_of, order):
    """``(weights, kind, pa, pb, grp, square_of, order)`` of the kernels a prediction evaluates.

    :func:`_predicted_kernels`, with the chains (``square_of``) and the
    evaluation ``order`` renumbered for the kept kernels.
    """
    keep = _predicted_kernels(weights, kind, square_of)
    if keep is not None:
        index = np.full(len(kind), -1, np.int64)
        index[keep] = np.arange(len(keep))
        src = np.asarray(square_of)[keep]
        square_of = np.where(src >= 0, index[np.maximum(src, 0)], -1).astype(np.asarray(square_of).dtype)
        order = np.asarray(order)
        order = index[order[index[order] >= 0]].astype(order.dtype)
        kind, pa, pb, grp = (np.ascontiguousarray(np.asarray(a)[keep]) for a in (kind, pa, pb, grp))
        weights = _as_f64(weights[:, keep])
    return weights, kind, pa, pb, grp, square_of, order


def _support_vector_passes(sv_indptr, sv_indices, sv_data, n_features, n_groups):
    """``(sv_ptr, sv_rows, sv_vals, sv_dense_t)``: the support vectors as sorted CSC, or as a dense copy.

    The dense transposed copy (:func:`dense_copy`) only with several feature
    groups and dense enough vectors; the unused form is its empty stand-in.
    """
    sv = sp.csr_matrix((sv_data, sv_indices, sv_indptr), shape=(len(sv_indptr) - 1, n_features))
    sv_dense_t = dense_copy(sv) if n_groups > 1 else None
    if sv_dense_t is not None:
        return (*_NO_CSC, sv_dense_t)
    csc = sv.tocsc()
    csc.sort_indices()
    return csc.indptr, csc.indices, csc.data, None


def weighted_kernel_sums(indptr, indices, data, n_features, sv_indptr, sv_indices, sv_data, sv_sq, coef, weights, kind,
                         pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):  # fmt: skip
    """``out[t, k] = sum_j coef[k, j] sum_i weights[k, i] K_i(x_t, sv_j)`` for CSR rows and CSR SVs.

    Kernels are evaluated tile by tile (:func:`kernel_tiles`), each tile
    against a block of support vectors with the dot products and distances of
    its own feature groups only, so the scratch does not grow with the number
    of groups; Gaussians whose weight is 0 for every output, and support
    vectors whose coefficient is 0 for every output, are left out (they add
    nothing).  The sum over kernels for one support vector is sequential in
    kernel order, and every output row is summed over the support vectors in
    order on one thread, so the result does not depend on the thread count
    (:func:`get_num_threads`, :func:`thread_limit`).  ``sv_sq`` is
    :func:`group_sqnorms` of the support vectors, best Fortran-ordered
    (``group_sqnorms_t(...).T``): it is read group by group.
    """
    n = len(indptr) - 1
    n_features = int(n_features)
    n_groups = int(n_groups)
    weights = _as_f64(np.atleast_2d(weights))
    coef = _as_f64(np.atleast_2d(coef))
    out = np.zeros((n, weights.shape[0]))
    # (n_groups, n_sv), C order: a tile's group reads its norms contiguously (no copy for a Fortran-ordered sv_sq).
    sv_sq_t = np.ascontiguousarray(np.asarray(sv_sq, dtype=np.float64).T)
    coef, sv_sq_t, sv_indptr, sv_indices, sv_data = _used_support_vectors(
        coef, sv_sq_t, sv_indptr, sv_indices, sv_data, n_features
    )
    weights, kind, pa, pb, grp, square_of, order = _predicted_plan(weights, kind, pa, pb, grp, square_of, order)
    n_sv = len(sv_indptr) - 1
    m = len(kind)
    if n == 0 or n_sv == 0 or m == 0:
        return out
    sv_ptr, sv_rows, sv_vals, sv_dense_t = _support_vector_passes(sv_indptr, sv_indices, sv_data, n_features, n_groups)
    tile_ptr = kernel_tiles(square_of)
    values, maps = value_plan(tile_ptr, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups)
    T, S, G = _value_sizes(values[0], maps)
    B = min(_block_size(T + S), max(8, -(-n_sv // 8) * 8))
    args = (
        out, indptr, indices, data, n_features, sv_ptr, sv_rows, sv_vals,
        _NO_DENSE if sv_dense_t is None else sv_dense_t, sv_dense_t is not None, sv_sq_t, coef, weights,
        feat_ptr, feat_groups, n_groups, tile_ptr, values, maps, G, T, S, B,
    )  # fmt: skip
    # Threads by work (rows x support vectors x kernels); rows are independent, so any split gives the same numbers.
    with parallel(min(threads_for(n * n_sv * m), max(1, n // 4))) as n_threads:
        if n_threads > 1:
            _wks_parallel(*args, min(n, 4 * n_threads))
        else:
            _wks_rows(0, n, *args)
    return out

"""Numba kernels: kernel columns on the fly, fused with the shard's V/g update.

Everything here works row by row, so a row's numbers do not depend on which
shard (or thread, or block of rows) holds it: the sharding invariance of the
engines rests on that.  Data is CSR (``indptr``, ``indices``, ``data``); the
kernel plan comes from :class:`mwumkl_dist.kernels.KernelPlan`.  The MWU rules
themselves (which columns, what weights) live in :mod:`mwumkl_dist.mwu`; this
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
* rows are then processed in blocks of ``B`` rows, kernel by kernel inside a
  block, so every inner loop is a straight, vectorisable loop over rows;
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
* optionally (:func:`set_num_threads`) the rows are split over threads into
  contiguous chunks (``prange``) whose per-class maxima are reduced in row
  order, ties to the lowest index, so the result is the same as on one thread.

Floating point: no ``fastmath`` and no FMA contraction, so vectorised and
scalar code paths give bit-identical values for a row.
"""

from __future__ import annotations

import os
import threading

import numba
import numpy as np
import scipy.sparse as sp
from numba import njit, prange

__all__ = [
    "kernel_columns",
    "kernel_diagonal",
    "superstep_features",
    "superstep_columns",
    "dense_copy",
    "superstep_workspace",
    "group_sqnorms",
    "weighted_kernel_sums",
    "point_kernels",
    "exp_block",
    "set_num_threads",
    "get_num_threads",
    "parallel_threads",
    "PARALLEL_MIN_ROWS",
]

_CACHE = True
# error_model="numpy": no Python zero-division checks in the loops, so they vectorise.
_OPTS = {"cache": _CACHE, "error_model": "numpy"}

#: A superstep is split over threads only when each thread gets at least this many rows.
PARALLEL_MIN_ROWS = 4096

# One parallel numba region at a time: the "workqueue" threading layer aborts on
# concurrent launches (e.g. Dask threads); a busy lock means "run on this thread".
_PARALLEL_LOCK = threading.Lock()


def _threads_from_env() -> int:
    text = os.environ.get("MWUMKL_NUM_THREADS", "1").strip().lower()
    if text in ("", "auto", "0"):
        return 0
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"MWUMKL_NUM_THREADS must be a non-negative integer or 'auto', got {text!r}") from None
    if value < 0:
        raise ValueError(f"MWUMKL_NUM_THREADS must be a non-negative integer or 'auto', got {text!r}")
    return value


_num_threads = _threads_from_env()


def set_num_threads(n_threads: int) -> None:
    """Threads the supersteps and the decision function may use; 1 (the default) is serial.

    ``0`` means every numba thread (:func:`numba.get_num_threads`).  The
    initial value comes from the ``MWUMKL_NUM_THREADS`` environment variable
    (an integer or ``auto``).  Threads are opt-in because on a machine whose
    cores are busy with other work a parallel region waits for the slowest
    thread and can run several times slower than the serial path.  Results
    do not depend on the thread count.
    """
    global _num_threads
    if isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer)) or n_threads < 0:
        raise ValueError(f"n_threads must be a non-negative integer, got {n_threads!r}")
    _num_threads = int(n_threads)


def get_num_threads() -> int:
    """The thread setting of :func:`set_num_threads` resolved against numba's thread count."""
    available = numba.get_num_threads()
    return available if _num_threads == 0 else min(_num_threads, available)


def parallel_threads(n_rows: int, min_rows: int | None = None) -> int:
    """Threads a call over ``n_rows`` rows uses (1: the serial path)."""
    per_thread = PARALLEL_MIN_ROWS if min_rows is None else min_rows
    return max(1, min(get_num_threads(), int(n_rows) // per_thread))


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


@njit(**_OPTS)
def _csc_dots(start, stop, n_rows, csc_ptr, csc_rows, csc_vals, pm, qm, dp, dq):
    """``dp[j - start] = <x_j, pm>`` (and ``dq``) for rows ``[start, stop)`` by a pass over columns.

    Only the columns where ``pm`` or ``qm`` is non-zero are visited, in
    increasing feature order, so each row receives its non-zero terms in the
    same order as a pass over its sorted CSR entries: the sums are identical.
    """
    dp[:] = 0.0
    dq[:] = 0.0
    whole = start == 0 and stop == n_rows
    for f in range(pm.shape[0]):
        pf = pm[f]
        qf = qm[f]
        if pf == 0.0 and qf == 0.0:
            continue
        a = csc_ptr[f]
        e = csc_ptr[f + 1]
        if not whole:  # rows are sorted within a column
            a0 = a
            a = a0 + np.searchsorted(csc_rows[a0:e], start)
            e = a0 + np.searchsorted(csc_rows[a0:e], stop)
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
                v = data[k]
                a = v * pm[f]
                c = v * qm[f]
                for t in range(feat_ptr[f], feat_ptr[f + 1]):
                    g = feat_groups[t]
                    dp[g, b] += a
                    dq[g, b] += c


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
def _axpy2(col, pf, qf, dp, dq, nb):
    for b in range(nb):
        v = col[b]
        dp[b] += v * pf
        dq[b] += v * qf


@njit(**_OPTS)
def _block_dist2(row_sq, j0, nb, pp, dot, out):
    """``out[g, b] = (|x_{j0+b}|_g^2 + |p|_g^2) - 2 dot[g, b]``."""
    for g in range(dot.shape[0]):
        _dist2_row(row_sq[j0 : j0 + nb, g], pp[g], dot[g], out[g], nb)


@njit(**_OPTS)
def _dist2_row(sq, ppg, dot, out, nb):
    for b in range(nb):
        out[b] = (sq[b] + ppg) - 2.0 * dot[b]


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
        d2 = dist2[b]
        d2 = 0.0 if d2 < 0.0 else d2
        xbuf[b] = -gamma * d2
    _exp_into(xbuf, out, kbits, nb)


@njit(**_OPTS)
def _block_values(nb, dot, dist2, kind, pa, pb, grp, square_of, order, out, xbuf, kbits):
    """Kernel values ``out[i, b]`` of block rows against one point, from its dots and distances."""
    for t in range(order.shape[0]):
        i = order[t]
        src = square_of[i]
        if src >= 0:  # Gaussian with twice the gamma of kernel src: K_i = K_src ** 2
            _square_row(out[src], out[i], nb)
            continue
        g = grp[i]
        kd = kind[i]
        if kd == 0:  # linear
            out[i, :nb] = dot[g, :nb]
        elif kd == 1:  # polynomial (dot + coef0) ** degree, by repeated multiplication
            _poly_row(dot[g], pb[i], int(pa[i]), out[i], nb)
        else:  # gaussian exp(-gamma max(dist2, 0))
            _gauss_row(dist2[g], pa[i], out[i], xbuf, kbits, nb)


def _block_size(m):
    # 256 rows per block, fewer only to keep the (m, B) value blocks of both points within 64 MiB.
    # Small blocks for many kernels were a false economy: on mushrooms (1344 per-feature kernels)
    # 16-row blocks cost 24 ms per iteration at n = 1625 and 256-row blocks 4.7 ms (same model).
    return max(16, min(256, ((1 << 22) // max(m, 1)) // 8 * 8))


# ----------------------------------------------------------------------------- superstep


@njit(**_OPTS)
def _update_column(Vi, kpi, kqi, sp, sq, w, c, gb, nb):
    """``V[:, i] += (sp * K_i(., p) + sq * K_i(., q)) * w`` on a block, and ``g += c * V[:, i]``."""
    for b in range(nb):
        v = Vi[b] + (sp[b] * kpi[b] + sq[b] * kqi[b]) * w
        Vi[b] = v
        gb[b] += c * v


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
def _workspace(n_groups, m, B, n_rows):
    """All scratch of a superstep: :func:`_block_buffers`, per-row factors and scores, column-pass dots."""
    dp, dq, d2p, d2q, kp, kq, xbuf, kbits = _block_buffers(n_groups, m, B)
    return (dp, dq, d2p, d2q, kp, kq, xbuf, kbits, np.empty(B), np.empty(B), np.empty(B), np.empty(n_rows),
            np.empty(n_rows))  # fmt: skip


def superstep_workspace(n_rows: int, n_kernels: int, n_groups: int):
    """Scratch for :func:`superstep_features` on ``n_rows`` rows, to pass to every superstep.

    Reusing it matters: with many kernels the blocks of kernel values take
    megabytes, and allocating them every superstep let the C allocator give
    the pages back and fault them in again each time (on sonar with 720
    kernels most of the fit went to the kernel's page-fault handling).
    """
    B = min(_block_size(n_kernels), max(8, -(-int(n_rows) // 8) * 8))
    return _workspace(int(n_groups), int(n_kernels), B, int(n_rows))


@njit(**_OPTS)
def _superstep_range(
    start, stop, indptr, indices, data, csc_ptr, csc_rows, csc_vals, use_csc, dense_t, use_dense, y, row_offset, V,
    row_sq, pm, qm, ppp, ppq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef, kind, pa, pb, grp, square_of, order,
    feat_ptr, feat_groups, n_groups, B, work,
):  # fmt: skip
    """The fused superstep on local rows ``[start, stop)``; see :func:`superstep_features`.

    ``work`` is a :func:`_workspace` for blocks of ``B`` rows and at least ``stop - start`` rows.
    """
    m = kind.shape[0]
    single = n_groups == 1
    dp, dq, d2p, d2q, kp, kq, xbuf, kbits, sp, sq, gb, all_p, all_q = work
    if use_csc:
        _csc_dots(start, stop, y.shape[0], csc_ptr, csc_rows, csc_vals, pm, qm, all_p, all_q)
    best_pos, best_neg = -1, -1
    g_pos, g_neg = -np.inf, -np.inf
    lp = ip - row_offset
    lq = iq - row_offset
    for j0 in range(start, stop, B):
        nb = min(B, stop - j0)
        if use_dense:
            _dense_block_dots(dense_t, j0, nb, pm, qm, dp, dq)
        elif use_csc:
            for b in range(nb):
                dp[0, b] = all_p[j0 - start + b]
                dq[0, b] = all_q[j0 - start + b]
        else:
            _block_dots(indptr, indices, data, j0, nb, pm, qm, feat_ptr, feat_groups, single, dp, dq)
        _block_dist2(row_sq, j0, nb, ppp, dp, d2p)
        _block_dist2(row_sq, j0, nb, ppq, dq, d2q)
        _block_values(nb, dp, d2p, kind, pa, pb, grp, square_of, order, kp, xbuf, kbits)
        _block_values(nb, dq, d2q, kind, pa, pb, grp, square_of, order, kq, xbuf, kbits)
        for b in range(nb):
            yj = y[j0 + b]
            sp[b] = 0.5 * yj * yp
            sq[b] = 0.5 * yj * yq
            gb[b] = 0.0
        for i in range(m):
            _update_column(V[j0 : j0 + nb, i], kp[i], kq[i], sp, sq, inv_trace[i], coef[i], gb, nb)
        # The ridge on the diagonal: row j gets its own once per picked column j; its score is redone.
        _add_ridge(V, lp, 0.5 * ridge_p, coef, gb, j0, nb)
        _add_ridge(V, lq, 0.5 * ridge_q, coef, gb, j0, nb)
        for b in range(nb):
            g = gb[b]
            if y[j0 + b] > 0:
                if g > g_pos:
                    g_pos = g
                    best_pos = j0 + b
            elif g > g_neg:
                g_neg = g
                best_neg = j0 + b
    return best_pos, g_pos, best_neg, g_neg


@njit(**_OPTS)
def _add_ridge(V, lx, diag, coef, gb, j0, nb):
    """``V[lx, :] += diag`` when local row ``lx`` lies in the block ``[j0, j0 + nb)``, and its score redone."""
    if j0 <= lx < j0 + nb:
        g = 0.0
        for i in range(V.shape[1]):
            v = V[lx, i] + diag
            V[lx, i] = v
            g += coef[i] * v
        gb[lx - j0] = g


@njit(**_OPTS)
def _superstep_setup(p, q, indptr, feat_ptr, feat_groups, n_groups, csc_ptr, dense_t):
    pm, qm, ppp, ppq, cost = _prepare_points(p, q, feat_ptr, feat_groups, n_groups, csc_ptr)
    # A dense copy (dense data, one group) beats both sparse passes: contiguous, vectorised loops.
    use_dense = n_groups == 1 and dense_t.shape[0] == p.shape[0] and dense_t.shape[1] == indptr.shape[0] - 1
    # A column pass pays a scattered update per entry, a row pass a sequential sum: prefer rows near parity.
    use_csc = not use_dense and cost >= 0 and cost < 0.75 * (indptr[indptr.shape[0] - 1] - indptr[0])
    return pm, qm, ppp, ppq, use_csc, use_dense


@njit(**_OPTS)
def _superstep_serial(
    indptr, indices, data, csc_ptr, csc_rows, csc_vals, dense_t, y, row_offset, V, row_sq, p, q, ip, iq, yp, yq,
    inv_trace, ridge_p, ridge_q, coef, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups, B, work,
):  # fmt: skip
    pm, qm, ppp, ppq, use_csc, use_dense = _superstep_setup(
        p, q, indptr, feat_ptr, feat_groups, n_groups, csc_ptr, dense_t
    )
    return _superstep_range(
        0, y.shape[0], indptr, indices, data, csc_ptr, csc_rows, csc_vals, use_csc, dense_t, use_dense, y,
        row_offset, V, row_sq, pm, qm, ppp, ppq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef, kind, pa, pb, grp,
        square_of, order, feat_ptr, feat_groups, n_groups, B, work,
    )  # fmt: skip


@njit(parallel=True, **_OPTS)
def _superstep_parallel(
    indptr, indices, data, csc_ptr, csc_rows, csc_vals, dense_t, y, row_offset, V, row_sq, p, q, ip, iq, yp, yq,
    inv_trace, ridge_p, ridge_q, coef, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups, B, work,
    n_chunks,
):  # fmt: skip
    pm, qm, ppp, ppq, use_csc, use_dense = _superstep_setup(
        p, q, indptr, feat_ptr, feat_groups, n_groups, csc_ptr, dense_t
    )
    n = y.shape[0]
    bp = np.empty(n_chunks, np.int64)
    bn = np.empty(n_chunks, np.int64)
    gp = np.empty(n_chunks)
    gn = np.empty(n_chunks)
    for c in prange(n_chunks):
        start, stop = (n * c) // n_chunks, (n * (c + 1)) // n_chunks
        # Chunk 0 uses the caller's scratch; the others their own (a parallel call has >= 4096 rows per chunk).
        chunk_work = work if c == 0 else _workspace(n_groups, kind.shape[0], B, stop - start)
        bp[c], gp[c], bn[c], gn[c] = _superstep_range(
            start, stop, indptr, indices, data, csc_ptr, csc_rows, csc_vals, use_csc, dense_t, use_dense, y,
            row_offset, V, row_sq, pm, qm, ppp, ppq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef, kind, pa, pb,
            grp, square_of, order, feat_ptr, feat_groups, n_groups, B, chunk_work,
        )  # fmt: skip
    return _reduce_chunks(bp, gp, bn, gn)


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


def superstep_features(
    indptr,
    indices,
    data,
    y,
    row_offset,
    V,
    p,
    q,
    ip,
    iq,
    yp,
    yq,
    inv_trace,
    ridge,
    coef,
    kind,
    pa,
    pb,
    grp,
    square_of,
    order,
    feat_ptr,
    feat_groups,
    n_groups,
    row_sq=None,
    csc=None,
    dense_t=None,
    workspace=None,
):
    """One fused pass: ``V += (G[:, ip] + G[:, iq]) / 2`` then ``g = V @ coef`` and per-class argmax.

    ``G_i[j, k] = y_j y_k K_i(x_j, x_k) * inv_trace[i] + ridge_j * [j == k]`` with
    global indices ``ip``/``iq`` (``row_offset`` is this block's first global
    row), ``p``/``q`` the two points' dense feature vectors with labels
    ``yp``/``yq``.  ``V`` (``(n_rows, m)``, updated in place) may have any
    memory layout; Fortran order is fastest.

    Parameters
    ----------
    ridge : float or tuple of two floats
        The diagonal term: one value for every row, or ``(ridge_ip, ridge_iq)``,
        the per-point ridges of the two picked rows (the only rows whose
        diagonal a superstep touches).
    row_sq : ndarray of shape (n_rows, n_groups), optional
        :func:`group_sqnorms` of the rows; computed here when ``None`` (a
        shard passes its cached copy).
    csc : tuple of (indptr, indices, data), optional
        The same rows in CSC form with sorted row indices.  With one feature
        group the dot products are then computed over the columns where ``p``
        or ``q`` is non-zero when that touches fewer entries than a row pass
        (identical numbers, fewer operations on sparse data).
    dense_t : ndarray of shape (n_features, n_rows), optional
        The same rows as a dense, C-contiguous transposed copy (:func:`dense_copy`).
        With one feature group the dot products then come from contiguous,
        vectorised loops over rows (identical numbers; on dense low-dimensional
        data such as cod-rna the dots cost about a tenth of a CSR pass).
    workspace : tuple, optional
        :func:`superstep_workspace` for these rows, kept by the caller across
        supersteps (allocated here, for this call only, when ``None``).

    Returns
    -------
    best_pos, g_pos, best_neg, g_neg
        Local row indices of the best row of each class and their scores
        (``-1`` and ``-inf`` when the block has no row of that class); ties go
        to the lowest index.
    """
    n_groups = int(n_groups)
    if row_sq is None:
        row_sq = group_sqnorms(indptr, indices, data, feat_ptr, feat_groups, n_groups)
    csc_ptr, csc_rows, csc_vals = _NO_CSC if csc is None else csc
    dense_t = _NO_DENSE if dense_t is None else dense_t
    if workspace is None:
        workspace = superstep_workspace(len(y), len(kind), n_groups)
    ridge_p, ridge_q = (ridge, ridge) if np.ndim(ridge) == 0 else ridge
    args = (
        indptr, indices, data, csc_ptr, csc_rows, csc_vals, dense_t, y, int(row_offset), V, row_sq, _as_f64(p),
        _as_f64(q), int(ip), int(iq), float(yp), float(yq), inv_trace, float(ridge_p), float(ridge_q), coef, kind,
        pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups, workspace[4].shape[1], workspace,
    )  # fmt: skip
    n_threads = parallel_threads(len(y))
    if n_threads > 1 and _PARALLEL_LOCK.acquire(blocking=False):
        try:
            bp, gp, bn, gn = _superstep_parallel(*args, n_threads)
        finally:
            _PARALLEL_LOCK.release()
    else:
        bp, gp, bn, gn = _superstep_serial(*args)
    return int(bp), float(gp), int(bn), float(gn)


@njit(**_OPTS)
def superstep_columns(y, row_offset, V, colp, colq, ip, iq, yp, yq, inv_trace, ridge_p, ridge_q, coef):
    """The same update as :func:`superstep_features` from materialised raw columns ``(n, m)``.

    ``ridge_p`` and ``ridge_q`` are the ridges of the picked rows ``ip`` and ``iq``.
    """
    n = V.shape[0]
    m = V.shape[1]
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
        for i in range(m):
            v = V[j, i] + (sp * colp[j, i] + sq * colq[j, i]) * inv_trace[i]
            # The ridge, as superstep_features adds it: once per picked column through row j.
            if j == lp:
                v = v + diag_p
            if j == lq:
                v = v + diag_q
            V[j, i] = v
            g += coef[i] * v
        if y[j] > 0:
            if g > g_pos:
                g_pos = g
                best_pos = j
        elif g > g_neg:
            g_neg = g
            best_neg = j
    return best_pos, g_pos, best_neg, g_neg


# ----------------------------------------------------------------------------- columns, diagonal, points


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


@njit(**_OPTS)
def point_kernels(p, q, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """Raw ``K_i(p, p)``, ``K_i(q, q)``, ``K_i(p, q)`` for two dense feature vectors.

    Bit-identical to the column values a superstep computes for the rows ``p``
    and ``q`` (same sums in the same order), so ``K(p, p)`` of a Gaussian is
    exactly 1.
    """
    m = kind.shape[0]
    dot = np.zeros((n_groups, 3))
    sq = np.zeros((n_groups, 2))
    for f in range(p.shape[0]):
        a = p[f]
        c = q[f]
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
        dist2[g, 0] = (sq[g, 0] + sq[g, 0]) - 2.0 * dot[g, 0]
        dist2[g, 1] = (sq[g, 1] + sq[g, 1]) - 2.0 * dot[g, 1]
        dist2[g, 2] = (sq[g, 0] + sq[g, 1]) - 2.0 * dot[g, 2]
    out = np.empty((m, 3))
    _block_values(3, dot, dist2, kind, pa, pb, grp, square_of, order, out, np.empty(3), np.empty(6, np.int64))
    return out[:, 0].copy(), out[:, 1].copy(), out[:, 2].copy()


@njit(**_OPTS)
def kernel_diagonal(indptr, indices, data, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """``K_i(x_j, x_j)`` as an ``(n_rows, m)`` array (traces are its column sums)."""
    n = indptr.shape[0] - 1
    m = kind.shape[0]
    out = np.empty((n, m))
    sqx = np.empty((n_groups, 1))
    zero = np.zeros((n_groups, 1))
    vals = np.empty((m, 1))
    xbuf = np.empty(1)
    kbits = np.empty(2, np.int64)
    for j in range(n):
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
    return out


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
def _wks_rows(
    start, stop, out, indptr, indices, data, n_features, sv_indptr, sv_indices, sv_data, sv_ptr, sv_rows, sv_vals,
    sv_sq, coef, weights, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups, B,
):  # fmt: skip
    """Rows ``[start, stop)`` of :func:`weighted_kernel_sums`.

    With one feature group and the support vectors in CSC form (``sv_ptr``,
    ``sv_rows``, ``sv_vals``), a row's dot products with all support vectors
    come from the SV columns of the row's non-zero features, visited in
    increasing feature order; otherwise from a pass over each support vector's
    entries against the row scattered into a dense scratch vector.  Both add
    the same non-zero terms in the same order, so they give the same numbers.
    """
    n_sv = sv_indptr.shape[0] - 1
    n_out, m = weights.shape
    by_column = n_groups == 1 and sv_ptr.shape[0] == n_features + 1
    scratch = np.zeros(n_features)
    all_dots = np.empty(n_sv if by_column else 0)
    sqx = np.empty(n_groups)
    dot = np.empty((n_groups, B))
    dist2 = np.empty((n_groups, B))
    kv = np.empty((m, B))
    acc = np.empty(B)
    xbuf = np.empty(B)
    kbits = np.empty(2 * B, np.int64)
    for t in range(start, stop):
        sqx[:] = 0.0
        for k in range(indptr[t], indptr[t + 1]):
            f = indices[k]
            v = data[k]
            scratch[f] = v
            for u in range(feat_ptr[f], feat_ptr[f + 1]):
                sqx[feat_groups[u]] += v * v
        if by_column:
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
            if by_column:
                dot[0, :nb] = all_dots[j0 : j0 + nb]
            else:
                dot[:, :nb] = 0.0
                for b in range(nb):
                    for k in range(sv_indptr[j0 + b], sv_indptr[j0 + b + 1]):
                        f = sv_indices[k]
                        a = sv_data[k] * scratch[f]
                        if a != 0.0:
                            for u in range(feat_ptr[f], feat_ptr[f + 1]):
                                dot[feat_groups[u], b] += a
            for g in range(n_groups):
                sg = sqx[g]
                for b in range(nb):
                    dist2[g, b] = (sg + sv_sq[j0 + b, g]) - 2.0 * dot[g, b]
            _block_values(nb, dot, dist2, kind, pa, pb, grp, square_of, order, kv, xbuf, kbits)
            for o in range(n_out):
                acc[:nb] = 0.0
                for i in range(m):
                    _axpy(weights[o, i], kv[i], acc, nb)
                s = out[t, o]
                for b in range(nb):
                    c = coef[o, j0 + b]
                    if c != 0.0:
                        s += c * acc[b]
                out[t, o] = s
        for k in range(indptr[t], indptr[t + 1]):
            scratch[indices[k]] = 0.0


@njit(**_OPTS)
def _axpy(w, x, acc, nb):
    for b in range(nb):
        acc[b] += w * x[b]


@njit(parallel=True, **_OPTS)
def _wks_parallel(
    out, indptr, indices, data, n_features, sv_indptr, sv_indices, sv_data, sv_ptr, sv_rows, sv_vals, sv_sq, coef,
    weights, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups, B, n_chunks,
):  # fmt: skip
    n = indptr.shape[0] - 1
    for c in prange(n_chunks):
        _wks_rows(
            (n * c) // n_chunks, (n * (c + 1)) // n_chunks, out, indptr, indices, data, n_features, sv_indptr,
            sv_indices, sv_data, sv_ptr, sv_rows, sv_vals, sv_sq, coef, weights, kind, pa, pb, grp, square_of, order,
            feat_ptr, feat_groups, n_groups, B,
        )  # fmt: skip


def weighted_kernel_sums(
    indptr,
    indices,
    data,
    n_features,
    sv_indptr,
    sv_indices,
    sv_data,
    sv_sq,
    coef,
    weights,
    kind,
    pa,
    pb,
    grp,
    square_of,
    order,
    feat_ptr,
    feat_groups,
    n_groups,
):
    """``out[t, k] = sum_j coef[k, j] sum_i weights[k, i] K_i(x_t, sv_j)`` for CSR rows and CSR SVs.

    Support vectors are taken in blocks whose kernel values are evaluated
    together; with one feature group their dot products with a row come from
    a CSC copy of the support vectors (only the entries on the row's non-zero
    features are visited).  Every output row is summed over the support
    vectors in order, on one thread, so the result does not depend on the
    thread count (see :func:`set_num_threads`).
    """
    n = len(indptr) - 1
    n_features = int(n_features)
    n_groups = int(n_groups)
    weights = _as_f64(np.atleast_2d(weights))
    coef = _as_f64(np.atleast_2d(coef))
    out = np.zeros((n, weights.shape[0]))
    sv_ptr, sv_rows, sv_vals = _NO_CSC
    n_sv = len(sv_indptr) - 1
    if n_groups == 1 and n_sv > 0:
        sv = sp.csr_matrix((sv_data, sv_indices, sv_indptr), shape=(n_sv, n_features)).tocsc()
        sv.sort_indices()
        sv_ptr, sv_rows, sv_vals = sv.indptr, sv.indices, sv.data
    args = (
        out, indptr, indices, data, n_features, sv_indptr, sv_indices, sv_data, sv_ptr, sv_rows, sv_vals,
        _as_f64(sv_sq), coef, weights, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups,
        _block_size(len(kind)),
    )  # fmt: skip
    # Each output row costs a pass over all support vectors: worth threads from a few rows on.
    n_threads = parallel_threads(n, min_rows=64)
    if n_threads > 1 and _PARALLEL_LOCK.acquire(blocking=False):
        try:
            _wks_parallel(*args, 4 * n_threads)
        finally:
            _PARALLEL_LOCK.release()
    else:
        _wks_rows(0, n, *args)
    return out

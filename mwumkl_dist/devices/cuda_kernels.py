"""CUDA kernels of the GPU shards (:mod:`mwumkl_dist.data.cuda_shards`), written with ``numba.cuda``.

Imported only by :mod:`mwumkl_dist.data.cuda_shards` after it checked that CUDA is usable
(or under numba's CUDA simulator, ``NUMBA_ENABLE_CUDASIM=1``, where the same
kernel code runs on the CPU: that is how the tests run them without a GPU).

Every kernel repeats, per row, the floating-point operations of
:mod:`mwumkl_dist.devices.cpu` in the same order, so the numbers are the CPU
engine's bit for bit:

* products that feed an addition go through :func:`_mul` (``__dmul_rn``:
  a multiply with an explicit rounding mode, which NVVM and ptxas never fuse
  into an FMA; NVVM contracts plain ``a * b + c`` by default);
* ``exp`` is :func:`_exp`, the fdlibm-style ``exp`` of ``cpu._exp_into``
  operation by operation (not CUDA's libdevice ``exp``, which may differ by
  an ulp);
* a row's group dot products add the group's terms in increasing feature
  order, as the CPU passes do (a zero term leaves such a sum unchanged);
* scores are summed per kernel tile (``cpu.kernel_tiles``), then over
  the tiles in order; the argmax takes the lowest row among equal maxima.

Layouts: ``V`` is stored transposed, ``(m, n_rows)`` C-order, as are the
per-group arrays ``(n_groups, n_rows)``, so the threads of a warp (consecutive
rows) read consecutive addresses.  Grids are flattened and walked with
grid-stride loops (no 65535 limit on a second grid dimension).
"""

from __future__ import annotations

import math
import os
import warnings

import numba
from numba import cuda

from mwumkl_dist.devices.cpu import EXP_CONSTANTS

__all__ = ["SIMULATED", "TPB", "launch"]

#: True under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).
SIMULATED = bool(numba.config.ENABLE_CUDASIM) or os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"

# Small problems launch small grids; numba's under-utilisation warning at every launch says nothing new.
warnings.filterwarnings("ignore", message="Grid size .* under-utilization", category=Warning)

#: Threads per block (fewer under the simulator, which runs every thread as a Python thread;
#: with 16 the tests' problems span several blocks of the argmax).
TPB = 16 if SIMULATED else 128

_INF = math.inf

# The constants of cpu._exp_into.
_LOG2E, _LN2_HI, _LN2_LO, _SHIFT, _P1, _P2, _P3, _P4, _P5 = EXP_CONSTANTS

if SIMULATED:

    @cuda.jit(device=True)
    def _mul(a, b):
        return a * b

    @cuda.jit(device=True)
    def _pow2(k):
        return math.ldexp(1.0, int(k))

else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _mul(a, b):
        # mul.rn.f64: never contracted with a following add into an FMA.
        return libdevice.dmul_rn(a, b)

    @cuda.jit(device=True)
    def _pow2(k):
        # 2**k for a normal exponent, built from its bits as _exp_into does.
        return libdevice.longlong_as_double((k + 1023) << 52)


def launch(n_work: int) -> tuple[int, int]:
    """``(blocks, threads)`` for ``n_work`` items of a grid-stride kernel."""
    blocks = max(1, min(-(-int(n_work) // TPB), 65535 if SIMULATED else 1 << 20))
    if SIMULATED:  # every simulated thread is a Python thread: few of them, grid-stride loops do the rest
        blocks = max(1, min(blocks, 2))
    return blocks, TPB


@cuda.jit(device=True)
def _exp(x):
    """``cpu._exp_into`` for one value: the same operations, the same bits."""
    xb = x if x >= -746.0 else -746.0
    xb = xb if xb <= 710.0 else 710.0
    kf = (_mul(xb, _LOG2E) + _SHIFT) - _SHIFT
    hi = xb - _mul(kf, _LN2_HI)
    lo = _mul(kf, _LN2_LO)
    r = hi - lo
    t = _mul(r, r)
    c = r - _mul(t, _P1 + _mul(t, _P2 + _mul(t, _P3 + _mul(t, _P4 + _mul(t, _P5)))))
    y = 1.0 - ((lo - _mul(r, c) / (2.0 - c)) - hi)
    k = int(kf)
    k1 = k >> 1
    v = _mul(_mul(y, _pow2(k1)), _pow2(k - k1))
    return v if x == x else x


@cuda.jit(device=True)
def _root_value(kd, a, b, dot, d2):
    """A chain root's kernel value from a dot product and a squared distance (``cpu._block_values``)."""
    if kd == 0:
        return dot
    if kd == 1:
        base = dot + b
        v = base
        for _ in range(int(a) - 1):
            v = v * base
        return v
    d2 = 0.0 if d2 < 0.0 else d2
    return _exp(_mul(-a, d2))


@cuda.jit(device=True)
def _chain_value(kd, a, b, dot, d2, depth):
    """A kernel's value: its chain root's (:func:`_root_value`) squared ``depth`` times."""
    v = _root_value(kd, a, b, dot, d2)
    for _ in range(depth):
        v = v * v
    return v


@cuda.jit(device=True)
def _unflatten(idx, n):
    """``(idx // n, idx % n)``: the (row, column) of a flat index over rows of ``n`` (grid-stride loops)."""
    r = idx // n
    return r, idx - r * n


@cuda.jit
def exp_values(x, out):
    """``out = exp(x)`` with :func:`_exp` (for tests: the CPU's ``exp``, bit for bit)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, x.shape[0], stride):
        out[i] = _exp(x[i])


@cuda.jit
def fill_zero(a):
    """``a[:] = 0`` for a C-contiguous 2-d array."""
    n1 = a.shape[1]
    total = a.shape[0] * n1
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, total, stride):
        r, c = _unflatten(idx, n1)
        a[r, c] = 0.0


@cuda.jit
def point_sqnorms(p, q, gptr, gfeat, ppp, ppq):
    """``|p|_g^2`` and ``|q|_g^2`` per group, the group's features ascending (``cpu._local_sqnorms``)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for g in range(start, ppp.shape[0], stride):
        sp = 0.0
        sq = 0.0
        for u in range(gptr[g], gptr[g + 1]):
            f = gfeat[u]
            v = p[f]
            if v != 0.0:
                sp += _mul(v, v)
            w = q[f]
            if w != 0.0:
                sq += _mul(w, w)
        ppp[g] = sp
        ppq[g] = sq


@cuda.jit(device=True)
def _stored_group(src, g, j):
    """Row ``j``'s dot products with ``p`` and ``q`` over group ``g`` and its squared norm there, as stored.

    ``src`` is ``(dp, dq, row_sq)``, all ``(n_groups, n)`` (the dot kernels' output and the shard's norms).
    """
    dp, dq, row_sq = src
    return dp[g, j], dq[g, j], row_sq[g, j]


@cuda.jit(device=True)
def _dense_group(src, g, j):
    """The same computed from dense rows: ``src`` is ``(Xt, p, q, gptr, gfeat)``, ``Xt`` ``(d, n)``.

    A group's terms are added in increasing feature order, zero entries
    skipped, as ``cpu.group_sqnorms`` and the dot passes add them: the same bits.
    """
    Xt, p, q, gptr, gfeat = src
    dpv = 0.0
    dqv = 0.0
    rs = 0.0
    for u in range(gptr[g], gptr[g + 1]):
        f = gfeat[u]
        x = Xt[f, j]
        if x != 0.0:
            dpv += _mul(x, p[f])
            dqv += _mul(x, q[f])
            rs += _mul(x, x)
    return dpv, dqv, rs


@cuda.jit
def group_dots_dense(Xt, p, q, gptr, gfeat, dp, dq):
    """``dp[g, j] = <x_j, p>`` over group ``g`` (likewise ``dq``) from dense rows ``Xt`` ``(d, n)``."""
    n = Xt.shape[1]
    total = dp.shape[0] * n
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, total, stride):
        g, j = _unflatten(idx, n)
        sp, sq, _ = _dense_group((Xt, p, q, gptr, gfeat), g, j)  # the row's norm is unused here
        dp[g, j] = sp
        dq[g, j] = sq


@cuda.jit
def group_dots_csr(indptr, indices, data, p, q, feat_ptr, feat_groups, dp, dq):
    """The same from CSR rows (``dp``/``dq`` zeroed first): one thread per row, its entries in order."""
    n = indptr.shape[0] - 1
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, n, stride):
        for k in range(indptr[j], indptr[j + 1]):
            f = indices[k]
            v = data[k]
            a = _mul(v, p[f])
            c = _mul(v, q[f])
            for u in range(feat_ptr[f], feat_ptr[f + 1]):
                g = feat_groups[u]
                dp[g, j] += a
                dq[g, j] += c


@cuda.jit(device=True)
def _task_of(idx, n, y, yp, yq):
    """Task ``idx`` of a (tile, row) grid over ``n`` rows: ``(t, j, y_j yp / 2, y_j yq / 2)``."""
    t, j = _unflatten(idx, n)
    yj = y[j]
    return t, j, 0.5 * yj * yp, 0.5 * yj * yq


@cuda.jit(device=True)
def _update(VT, i, j, sp, kp, sq, kq, w, lp, lq, diag_p, diag_q):
    """``V[j, i] += (sp K_p + sq K_q) w``, plus the ridge's half on a picked row; returns the new value.

    ``cpu._task``'s update: ``v = V + (sp K_p + sq K_q) w``, then ``+ ridge / 2`` on each picked row.
    """
    v = VT[i, j] + _mul(_mul(sp, kp) + _mul(sq, kq), w)
    if j == lp:
        v = v + diag_p
    if j == lq:
        v = v + diag_q
    VT[i, j] = v
    return v


def _feature_tile(group):
    """The device function of one (row, tile) task of a superstep, with the group statistics of ``group``.

    ``group(src, g, j) -> (dot_p, dot_q, row_sq)`` (:func:`_stored_group` or
    :func:`_dense_group`), asked once per run of kernels on one group.
    ``cpu._task`` for one row: both kernel values, ``V += ...`` with the
    ridge (:func:`_update`), and the tile partial ``sum_i coef_i v_i`` from 0
    in kernel order, which it returns.  A Gaussian square of the previous
    kernel is its square; other chain members are their root's value squared
    ``depth`` times (the same bits as the CPU's chain of squares).
    """

    @cuda.jit(device=True)
    def tile(src, VT, t, j, sp, sq, ppp, ppq, inv_trace, coef, kind, pa, pb, grp, square_of, root, depth, tile_ptr,
             lp, lq, diag_p, diag_q):  # fmt: skip
        s = 0.0
        prev_p = 0.0
        prev_q = 0.0
        last_g = -1
        dpv = 0.0
        dqv = 0.0
        rs = 0.0
        for i in range(tile_ptr[t], tile_ptr[t + 1]):
            if square_of[i] >= 0 and square_of[i] == i - 1:
                kp = prev_p * prev_p
                kq = prev_q * prev_q
            else:
                r = root[i]
                g = grp[r]
                kd = kind[r]
                if g != last_g:
                    dpv, dqv, rs = group(src, g, j)
                    last_g = g
                d2p = 0.0
                d2q = 0.0
                if kd == 2:
                    d2p = (rs + ppp[g]) - _mul(2.0, dpv)
                    d2q = (rs + ppq[g]) - _mul(2.0, dqv)
                kp = _chain_value(kd, pa[r], pb[r], dpv, d2p, depth[i])
                kq = _chain_value(kd, pa[r], pb[r], dqv, d2q, depth[i])
            prev_p = kp
            prev_q = kq
            s += _mul(coef[i], _update(VT, i, j, sp, kp, sq, kq, inv_trace[i], lp, lq, diag_p, diag_q))
        return s

    return tile


_stored_tile = _feature_tile(_stored_group)
_dense_tile = _feature_tile(_dense_group)


@cuda.jit
def superstep_features(VT, partial, dp, dq, row_sq, ppp, ppq, y, yp, yq, inv_trace, coef, kind, pa, pb, grp,
                       square_of, root, depth, tile_ptr, lp, lq, diag_p, diag_q):  # fmt: skip
    """One (row, tile) per thread (:func:`_feature_tile`), from the group dots ``dp``/``dq`` and norms ``row_sq``."""
    n = VT.shape[1]
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, n * (tile_ptr.shape[0] - 1), stride):
        t, j, sp, sq = _task_of(idx, n, y, yp, yq)
        partial[t, j] = _stored_tile((dp, dq, row_sq), VT, t, j, sp, sq, ppp, ppq, inv_trace, coef, kind, pa, pb,
                                     grp, square_of, root, depth, tile_ptr, lp, lq, diag_p, diag_q)  # fmt: skip


@cuda.jit
def superstep_features_inline(VT, partial, Xt, p, q, gptr, gfeat, ppp, ppq, y, yp, yq, inv_trace, coef, kind, pa, pb,
                              grp, square_of, root, depth, tile_ptr, lp, lq, diag_p, diag_q):  # fmt: skip
    """:func:`superstep_features` with the group dots and norms computed in the thread from dense rows.

    For plans of many small groups (random banks, per-feature kernels): no
    ``(n_groups, n)`` arrays to write and read back (:func:`_dense_group`).
    """
    n = VT.shape[1]
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, n * (tile_ptr.shape[0] - 1), stride):
        t, j, sp, sq = _task_of(idx, n, y, yp, yq)
        partial[t, j] = _dense_tile((Xt, p, q, gptr, gfeat), VT, t, j, sp, sq, ppp, ppq, inv_trace, coef, kind, pa,
                                    pb, grp, square_of, root, depth, tile_ptr, lp, lq, diag_p, diag_q)  # fmt: skip


@cuda.jit
def superstep_columns(VT, partial, Kt, p, q, y, yp, yq, inv_trace, coef, tile_ptr, lp, lq, diag_p, diag_q):
    """The same from precomputed kernels ``Kt[i, k, j] = K_i(x_j, x_k)`` (``cpu._superstep_columns``)."""
    n = VT.shape[1]
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, n * (tile_ptr.shape[0] - 1), stride):
        t, j, sp, sq = _task_of(idx, n, y, yp, yq)
        s = 0.0
        for i in range(tile_ptr[t], tile_ptr[t + 1]):
            s += _mul(coef[i], _update(VT, i, j, sp, Kt[i, p, j], sq, Kt[i, q, j], inv_trace[i], lp, lq, diag_p,
                                       diag_q))  # fmt: skip
        partial[t, j] = s


@cuda.jit
def point_kernels(p, q, gptr, gfeat, kind, pa, pb, grp, root, depth, out):
    """``out[0, i] = K_i(p, p)``, ``out[1, i] = K_i(q, q)``, ``out[2, i] = K_i(p, q)``: one kernel per thread.

    ``cpu.point_kernels``' sums (a group's features ascending; ``p p``
    terms where ``p_f != 0``, ``q q`` where ``q_f != 0``, ``p q`` where
    ``p_f != 0``) and distances, so ``K(p, p)`` of a Gaussian is exactly 1.
    """
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, kind.shape[0], stride):
        r = root[i]
        g = grp[r]
        s0 = 0.0
        s1 = 0.0
        d01 = 0.0
        for u in range(gptr[g], gptr[g + 1]):
            f = gfeat[u]
            a = p[f]
            c = q[f]
            if a != 0.0:
                s0 += _mul(a, a)
                d01 += _mul(a, c)
            if c != 0.0:
                s1 += _mul(c, c)
        kd = kind[r]
        out[0, i] = _chain_value(kd, pa[r], pb[r], s0, (s0 + s0) - _mul(2.0, s0), depth[i])
        out[1, i] = _chain_value(kd, pa[r], pb[r], s1, (s1 + s1) - _mul(2.0, s1), depth[i])
        out[2, i] = _chain_value(kd, pa[r], pb[r], d01, (s0 + s1) - _mul(2.0, d01), depth[i])


@cuda.jit
def scores_argmax(partial, y, gsum, best_idx, best_g):
    """``g`` = the tile partials added in tile order; per block, the best row of each class.

    ``best_idx``/``best_g`` ``(n_blocks, 2)``: class +1 in column 0, -1 in
    column 1; ``-1``/``-inf`` where the block has none.  A row with
    ``g = -inf`` or NaN is never picked (as the CPU's strict ``>`` from
    ``-inf``); equal maxima go to the lowest row.
    """
    sg = cuda.shared.array((2, TPB), numba.float64)
    si = cuda.shared.array((2, TPB), numba.int64)
    tid = cuda.threadIdx.x
    j = cuda.blockIdx.x * cuda.blockDim.x + tid
    n = y.shape[0]
    sg[0, tid] = -_INF
    sg[1, tid] = -_INF
    si[0, tid] = -1
    si[1, tid] = -1
    if j < n:
        g = partial[0, j]
        for t in range(1, partial.shape[0]):
            g += partial[t, j]
        gsum[j] = g
        if g > -_INF:
            c = 0 if y[j] > 0 else 1
            sg[c, tid] = g
            si[c, tid] = j
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            for c in range(2):
                i2 = si[c, tid + s]
                if i2 >= 0:
                    g2 = sg[c, tid + s]
                    i1 = si[c, tid]
                    g1 = sg[c, tid]
                    if i1 < 0 or g2 > g1 or (g2 == g1 and i2 < i1):
                        sg[c, tid] = g2
                        si[c, tid] = i2
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        b = cuda.blockIdx.x
        for c in range(2):
            best_idx[b, c] = si[c, 0]
            best_g[b, c] = sg[c, 0]


@cuda.jit
def gather_rows(VT, rows, out):
    """``out[r, i] = V[rows[r], i]`` (``VT`` is ``V`` transposed)."""
    m = VT.shape[0]
    total = rows.shape[0] * m
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, total, stride):
        r, i = _unflatten(idx, m)
        out[r, i] = VT[i, rows[r]]


@cuda.jit
def weighted_kernel_sums(Xt, sqx, SV, sv_sq, coef, weights, kind, pa, pb, grp, square_of, root, depth, gptr, gfeat,
                         out):  # fmt: skip
    """``out[t, o] = sum_j coef[o, j] sum_i weights[o, i] K_i(x_t, sv_j)``: one (row, output) per thread.

    ``cpu._wks_rows`` for one row: per support vector (in order, those
    with ``coef != 0``) the weighted kernel sum from 0 in kernel order, then
    added to the row's total.  ``Xt`` ``(d, n)`` and ``SV`` ``(n_sv, d)`` are
    dense; ``sqx`` ``(n_groups, n)`` and ``sv_sq`` ``(n_sv, n_groups)`` their
    group norms.  A Gaussian with weight 0 adds ``0 * K = 0`` (``K`` is
    finite) and is skipped; consecutive kernels on one group share its dot product.
    """
    n = Xt.shape[1]
    n_out = weights.shape[0]
    m = weights.shape[1]
    n_sv = SV.shape[0]
    total = n * n_out
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, total, stride):
        o, t = _unflatten(idx, n)
        s = 0.0
        for j in range(n_sv):
            c = coef[o, j]
            if c == 0.0:
                continue
            acc = 0.0
            last_g = -1
            dot = 0.0
            d2 = 0.0
            prev = 0.0
            have_prev = False
            for i in range(m):
                w = weights[o, i]
                r = root[i]
                if w == 0.0 and kind[r] == 2:
                    have_prev = False
                    continue
                if have_prev and square_of[i] >= 0 and square_of[i] == i - 1:
                    kv = prev * prev
                else:
                    g = grp[r]
                    if g != last_g:
                        dot = 0.0
                        for u in range(gptr[g], gptr[g + 1]):
                            f = gfeat[u]
                            a = _mul(SV[j, f], Xt[f, t])
                            if a != 0.0:
                                dot += a
                        d2 = (sqx[g, t] + sv_sq[j, g]) - _mul(2.0, dot)
                        last_g = g
                    kv = _chain_value(kind[r], pa[r], pb[r], dot, d2, depth[i])
                prev = kv
                have_prev = True
                acc += _mul(w, kv)
            s += _mul(c, acc)
        out[t, o] = s


if SIMULATED:
    import threading

    class _Serialized:
        """A simulated kernel whose launches hold one lock: the simulator runs one kernel at a time
        (shards served by several threads, e.g. on a Dask worker, launch concurrently; a GPU queues them)."""

        _lock = threading.RLock()

        def __init__(self, kernel):
            self._kernel = kernel

        def __getitem__(self, config):
            launch_ = self._kernel[config]

            def run(*args):
                with self._lock:
                    return launch_(*args)

            return run

    for _name in ("exp_values", "fill_zero", "point_sqnorms", "group_dots_dense", "group_dots_csr",
                  "superstep_features", "superstep_features_inline", "superstep_columns", "scores_argmax",
                  "point_kernels", "gather_rows", "weighted_kernel_sums"):  # fmt: skip
        globals()[_name] = _Serialized(globals()[_name])

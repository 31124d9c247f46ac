"""CUDA kernels of the GPU shards (:mod:`mwumkl_dist.data.cuda`), written with ``numba.cuda``.

Imported only by :mod:`mwumkl_dist.data.cuda` after it checked that CUDA is usable
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
  the tiles in order; the argmax takes the lowest row among equal maxima;
* the final margins are exact sums (:func:`exact_row_dots`, with
  :func:`mwumkl_dist.core.exact.add_exact` compiled here): integers, so
  the order in which threads add them does not matter.

The MWU rules on ``m``-vectors (``rules_*``) are the functions of
:mod:`mwumkl_dist.core.mwu_rules` themselves, compiled here with their
elementwise operations bound to device functions (:func:`device_rule`):
``product`` is ``__dmul_rn``, ``maximum`` lets a NaN win as numpy's does,
``sqrt`` is correctly rounded on both; ``sinh`` and ``exp`` are CUDA's, which
may differ from numpy's in the last bit (under the simulator they are numpy's
own, so there the rules' numbers are the host's bit for bit).

Layouts: ``V`` is stored transposed, ``(m, n_rows)`` C-order, as are the
per-group arrays ``(n_groups, n_rows)``, so the threads of a warp (consecutive
rows) read consecutive addresses.  Grids are flattened and walked with
grid-stride loops (no 65535 limit on a second grid dimension).
"""

from __future__ import annotations

import math
import os
import threading
import types
import warnings

import numba
import numpy as np
from numba import cuda

from mwumkl_dist.core import exact as _exact
from mwumkl_dist.core import mwu_rules as _rules
from mwumkl_dist.devices.cpu import EXP_CONSTANTS

__all__ = ["SIMULATED", "TPB", "launch", "rule_launch", "device_rule", "check_arguments", "Kernel", "LAUNCH_OBSERVERS"]

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

    # The host rules' sinh and exp (numpy's, on one value: the same bits as on a whole array).
    _SINH, _EXP = np.sinh, np.exp

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

    _SINH, _EXP = math.sinh, math.exp


@cuda.jit(device=True)
def _sinh(x):
    return _SINH(x)


@cuda.jit(device=True)
def _rule_exp(x):
    return _EXP(x)


def launch(n_work: int) -> tuple[int, int]:
    """``(blocks, threads)`` for ``n_work`` items of a grid-stride kernel."""
    blocks = max(1, min(-(-int(n_work) // TPB), 65535 if SIMULATED else 1 << 20))
    if SIMULATED:  # every simulated thread is a Python thread: few of them, grid-stride loops do the rest
        blocks = max(1, min(blocks, 2))
    return blocks, TPB


#: At most this many blocks run a rules pass: every block of the next pass reads all their partial results.
RULE_BLOCKS = 1024

#: Threads per block of the one-block kernels and the rules' (their barriers are what the simulator is
#: slowest at: it polls every thread).
REDUCE_TPB = 4 if SIMULATED else TPB


def rule_launch(m: int) -> tuple[int, int]:
    """``(blocks, threads)`` of the ``rules_*`` kernels over ``m`` kernels (their partial arrays have ``blocks``)."""
    return min(launch(m)[0], RULE_BLOCKS), REDUCE_TPB


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
    """``a[:] = 0`` for a C-contiguous 2-d array (float64, or int64: exact sums' limbs)."""
    n1 = a.shape[1]
    total = a.shape[0] * n1
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, total, stride):
        r, c = _unflatten(idx, n1)
        a[r, c] = 0


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


@cuda.jit(device=True)
def _take_better(si, sg, c, slot, i2, g2):
    """Candidate ``(i2, g2)`` replaces the one of class ``c`` in ``slot`` if better: higher ``g``, equal ``g`` to the
    lower row (``i2 = -1``: none)."""
    if i2 >= 0:
        i1 = si[c, slot]
        g1 = sg[c, slot]
        if i1 < 0 or g2 > g1 or (g2 == g1 and i2 < i1):
            sg[c, slot] = g2
            si[c, slot] = i2


@cuda.jit(device=True)
def _reduce_best(si, sg):
    """Each class's best candidate of the block's slots into slot 0 (shared ``(2, TPB)`` arrays)."""
    tid = cuda.threadIdx.x
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            for c in range(2):
                _take_better(si, sg, c, tid, si[c, tid + s], sg[c, tid + s])
        cuda.syncthreads()
        s //= 2


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
    _reduce_best(si, sg)
    if tid == 0:
        b = cuda.blockIdx.x
        for c in range(2):
            best_idx[b, c] = si[c, 0]
            best_g[b, c] = sg[c, 0]


@cuda.jit
def pick_candidates(best_idx, best_g, bad, record, pick):
    """One block: the shard's best row of each class over :func:`scores_argmax`'s blocks, as its message.

    ``record`` = ``[row +1, g +1, row -1, g -1, finite]`` (rows local, ``-1``: none; as float64,
    exact below 2**53), ``finite`` 1.0 unless :func:`rules_coef` set ``bad[0]``; ``pick`` = both
    rows (0 for none), for :func:`gather_rows`.
    """
    sg = cuda.shared.array((2, TPB), numba.float64)
    si = cuda.shared.array((2, TPB), numba.int64)
    tid = cuda.threadIdx.x
    for c in range(2):
        sg[c, tid] = -_INF
        si[c, tid] = -1
        for b in range(tid, best_idx.shape[0], cuda.blockDim.x):
            _take_better(si, sg, c, tid, best_idx[b, c], best_g[b, c])
    _reduce_best(si, sg)
    if tid == 0:
        for c in range(2):
            record[2 * c] = si[c, 0]
            record[2 * c + 1] = sg[c, 0]
            pick[c] = si[c, 0] if si[c, 0] >= 0 else 0
        record[4] = 1.0 - bad[0]


@cuda.jit
def gather_rows(VT, rows, out):
    """``out[r, i] = V[rows[r], i]`` (``VT`` is ``V`` transposed)."""
    m = VT.shape[0]
    total = rows.shape[0] * m
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, total, stride):
        r, i = _unflatten(idx, m)
        out[r, i] = VT[i, rows[r]]


_add_exact = cuda.jit(device=True)(_exact.add_exact)
_N_LIMBS = _exact.N_LIMBS

#: Kernels per thread of :func:`exact_row_dots` (then one atomic add per limb in use).
EXACT_CHUNK = 32 if SIMULATED else 2048


@cuda.jit
def exact_row_dots(VT, rows, weights, chunk, limbs, bad):
    """``limbs[r] +=`` the exact sum of ``fl(V[rows[r], i] weights[i])`` (``core.exact.exact_row_dots``'s sums).

    One (chunk of ``chunk`` kernels, row) per thread: its own limbs (:func:`mwumkl_dist.core.exact.add_exact`),
    added to ``limbs`` (``(len(rows), N_LIMBS)`` int64, zeroed first) by integer atomics, exact in any order.
    Consecutive threads take consecutive rows of one chunk (neighbouring addresses of ``VT``).
    ``bad[0] = 1.0`` where a product is not finite (it is left out).
    """
    acc = cuda.local.array((1, _N_LIMBS), numba.int64)
    n_rows = rows.shape[0]
    m = VT.shape[0]
    n_chunks = (m + chunk - 1) // chunk
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, n_chunks * n_rows, stride):
        c, r = _unflatten(idx, n_rows)
        for k in range(_N_LIMBS):
            acc[0, k] = 0
        j = rows[r]
        stop = (c + 1) * chunk
        for i in range(c * chunk, stop if stop < m else m):
            x = _mul(VT[i, j], weights[i])
            if x != 0.0:
                if math.isfinite(x):
                    _add_exact(acc, 0, 0, x)
                else:
                    bad[0] = 1.0
        for k in range(_N_LIMBS):
            if acc[0, k] != 0:
                cuda.atomic.add(limbs, (r, k), acc[0, k])


@cuda.jit(device=True)
def _combined_entry(Xt, t, sqx, SV, j, sv_sq, weights, o, kind, pa, pb, grp, square_of, root, depth, gptr, gfeat):
    """``sum_i weights[o, i] K_i(x_t, sv_j)`` from 0 in kernel order (``cpu._wks_rows``'s inner sum).

    A Gaussian with weight 0 adds ``0 * K = 0`` (``K`` is finite) and is skipped; consecutive kernels on
    one group share its dot product.
    """
    m = weights.shape[1]
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
    return acc


@cuda.jit
def weighted_kernel_sums(Xt, sqx, SV, sv_sq, coef, weights, kind, pa, pb, grp, square_of, root, depth, gptr, gfeat,
                         out):  # fmt: skip
    """``out[t, o] = sum_j coef[o, j] sum_i weights[o, i] K_i(x_t, sv_j)``: one (row, output) per thread.

    ``cpu._wks_rows`` for one row: per support vector (in order, those
    with ``coef != 0``) the weighted kernel sum (:func:`_combined_entry`), then
    added to the row's total.  ``Xt`` ``(d, n)`` and ``SV`` ``(n_sv, d)`` are
    dense; ``sqx`` ``(n_groups, n)`` and ``sv_sq`` ``(n_sv, n_groups)`` their
    group norms.
    """
    n = Xt.shape[1]
    n_out = weights.shape[0]
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
            acc = _combined_entry(Xt, t, sqx, SV, j, sv_sq, weights, o, kind, pa, pb, grp, square_of, root, depth,
                                  gptr, gfeat)  # fmt: skip
            s += _mul(c, acc)
        out[t, o] = s


# ----------------------------------------------------------------------------- the linear stage's columns


@cuda.jit
def combined_columns(Xt, sqx, L, l_sq, weights, kind, pa, pb, grp, square_of, root, depth, gptr, gfeat, out):
    """``out[j, t] = sum_i weights[0, i] K_i(x_t, l_j)`` in single precision: a linear-stage shard's kernel
    columns on the landmarks ``L``, stored transposed (``(n_landmarks, n_rows)``: a warp's threads, consecutive
    rows, write and later read consecutive addresses).  One entry per thread."""
    n = Xt.shape[1]
    total = L.shape[0] * n
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for idx in range(start, total, stride):
        j, t = _unflatten(idx, n)
        out[j, t] = _combined_entry(Xt, t, sqx, L, j, l_sq, weights, 0, kind, pa, pb, grp, square_of, root, depth,
                                    gptr, gfeat)  # fmt: skip


@cuda.jit
def columns_times(Ct, beta, bias, out):
    """``out[t] = sum_j Ct[j, t] beta[j] + bias`` (double precision, landmarks in order): one row per thread.

    ``beta`` may be shorter than ``Ct``'s landmarks (a smaller rank level uses the first ones)."""
    width, n = beta.shape[0], Ct.shape[1]
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for t in range(start, n, stride):
        s = 0.0
        for j in range(width):
            s += _mul(float(Ct[j, t]), beta[j])
        out[t] = s + bias


@cuda.jit
def active_weights(Ct, beta, bias, y, c, active, labels, out):
    """``out[t] = c_t (sum_j Ct[j, t] beta[j] + bias - [y_t])`` on active rows, 0 elsewhere: one row per thread
    (the first ``len(beta)`` landmarks)."""
    width, n = beta.shape[0], Ct.shape[1]
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for t in range(start, n, stride):
        if not active[t]:
            out[t] = 0.0
            continue
        s = 0.0
        for j in range(width):
            s += _mul(float(Ct[j, t]), beta[j])
        s += bias
        if labels:
            s -= y[t]
        out[t] = _mul(c[t], s)


#: Rows per block of :func:`columns_transposed_partials` (a multiple of the block size; fewer under the simulator).
PRODUCT_CHUNK = 64 if SIMULATED else 4096


@cuda.jit
def columns_transposed_partials(Ct, u, chunk, partial):
    """``partial[j, c] = sum_{t in chunk c} Ct[j, t] u[t]`` (double precision), and for ``j = len(partial) - 1``
    (one past the landmarks used) the chunk's ``sum u[t]``: one block per (landmark, chunk of rows).

    The block's threads read consecutive rows (coalesced, where one thread per landmark reads rows ``n`` apart
    from its neighbours'), each adds its rows in order, then the block adds its threads' sums in a fixed tree:
    the same bits on every run.  :func:`sum_partials` adds the chunks in order.
    """
    sums = cuda.shared.array(TPB, numba.float64)
    tid, step = cuda.threadIdx.x, cuda.blockDim.x
    rows = u.shape[0]
    width = partial.shape[0] - 1
    n_chunks = partial.shape[1]
    for b in range(cuda.blockIdx.x, partial.shape[0] * n_chunks, cuda.gridDim.x):
        j, c = _unflatten(b, n_chunks)
        stop = (c + 1) * chunk
        s = 0.0
        for t in range(c * chunk + tid, stop if stop < rows else rows, step):
            w = u[t]
            if w != 0.0:
                s += w if j == width else _mul(float(Ct[j, t]), w)
        sums[tid] = s
        cuda.syncthreads()
        half = step // 2
        while half > 0:
            if tid < half:
                sums[tid] += sums[tid + half]
            cuda.syncthreads()
            half //= 2
        if tid == 0:
            partial[j, c] = sums[0]
        cuda.syncthreads()  # sums[0] read before the next block's sums overwrite it


@cuda.jit
def sum_partials(partial, out):
    """``out[j] = sum_c partial[j, c]``, chunks in order: one row per thread."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, partial.shape[0], stride):
        s = 0.0
        for c in range(partial.shape[1]):
            s += partial[j, c]
        out[j] = s


# ----------------------------------------------------------------------------- the MWU rules on m-vectors


@cuda.jit(device=True)
def _maximum(a, b):
    """``np.maximum`` of two values: the larger, and a NaN wins (so a reduction with it is ``np.max``)."""
    return a if (a >= b or a != a) else b


@cuda.jit(device=True)
def _sqrt(x):
    return math.sqrt(x)


@cuda.jit(device=True)
def _where(cond, a, b):
    return a if cond else b


#: The device functions the rules' elementwise operations (``mwu_rules.ELEMENTWISE``) are bound to.
_ELEMENTWISE = {"product": _mul, "sqrt": _sqrt, "maximum": _maximum, "exp": _rule_exp, "sinh": _sinh,
                "where": _where}  # fmt: skip
assert set(_ELEMENTWISE) == set(_rules.ELEMENTWISE)


def device_rule(rule, **bind):
    """A rule of :mod:`mwumkl_dist.core.mwu_rules` as a device function: its own code, on one value per thread.

    The function is rebuilt with the rules' elementwise operations (``product``, ``sqrt``, ...) bound
    to :data:`_ELEMENTWISE` instead of numpy's (or to ``bind``'s device functions, by name), and
    compiled for the GPU.
    """
    scope = {**rule.__globals__, **_ELEMENTWISE, **bind}
    body = types.FunctionType(rule.__code__, scope, rule.__name__, rule.__defaults__, rule.__closure__)
    return cuda.jit(device=True)(body)


_gram_block = device_rule(_rules.gram_block)
_update_s = device_rule(_rules.update_s)
_margins = device_rule(_rules.margins)
_exponents = device_rule(_rules.exponents)
_exponent_weights = device_rule(_rules.exponent_weights)


@cuda.jit(device=True)
def _block_max(shared, value):
    """The maximum of every thread's ``value`` in the block (a NaN wins), returned to every thread.

    ``shared`` is a ``(TPB,)`` float64 shared array; the block size is a power of 2.
    """
    tid = cuda.threadIdx.x
    shared[tid] = value
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            shared[tid] = _maximum(shared[tid], shared[tid + s])
        cuda.syncthreads()
        s //= 2
    out = shared[0]
    cuda.syncthreads()  # every thread has read it before the array is used again
    return out


@cuda.jit(device=True)
def _parts_max(shared, parts):
    """The maximum of the previous pass's per-block results (every block computes it: no grid-wide sync)."""
    v = -_INF
    for b in range(cuda.threadIdx.x, parts.shape[0], cuda.blockDim.x):
        v = _maximum(v, parts[b])
    return _block_max(shared, v)


@cuda.jit
def rules_margins(kb, inv_trace, ridge_p, ridge_n, s, v_pos, v_neg, s_next, u, top_parts, bad):
    """Per kernel the Gram block (``gram_block``), ``s`` updated (``update_s``) and ``u`` (``margins``); per block
    the largest ``u`` (``top_parts``).  ``kb`` is ``(3, m)``: ``K(p, p)``, ``K(q, q)``, ``K(p, q)``.  Clears
    :func:`rules_coef`'s flag ``bad[0]``."""
    shared = cuda.shared.array(TPB, numba.float64)
    start, stride = cuda.grid(1), cuda.gridsize(1)
    if start == 0:
        bad[0] = 0.0
    top = -_INF
    for i in range(start, s.shape[0], stride):
        g_pp, g_nn, g_pn = _gram_block(kb[0, i], kb[1, i], kb[2, i], inv_trace[i], ridge_p, ridge_n)
        si = _update_s(s[i], v_pos[i], v_neg[i], g_pp, g_nn, g_pn)
        s_next[i] = si
        ui = _margins(si)
        u[i] = ui
        top = _maximum(top, ui)
    top = _block_max(shared, top)
    if cuda.threadIdx.x == 0:
        top_parts[cuda.blockIdx.x] = top


@cuda.jit
def rules_coef(u, top_parts, eps_p, rho, relative, selectivity, coef, bad):
    """``(c, q, quashed)`` from the largest ``u`` (``exponents``), then per kernel ``coef`` (``exponent_weights``);
    ``bad[0] = 1.0`` if a value is not finite (every thread that finds one stores the same value).

    ``relative`` False is the paper's scale (``exponents``' ``selectivity=None``; ``selectivity`` unused): a
    launch on a GPU takes no ``None``, so the flag says it and ``exponents`` is compiled for both."""
    shared = cuda.shared.array(TPB, numba.float64)
    top = _parts_max(shared, top_parts)
    if relative:
        c, q, quashed = _exponents(top, eps_p, rho, selectivity)
    else:
        c, q, quashed = _exponents(top, eps_p, rho, None)
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, u.shape[0], stride):
        _, ci = _exponent_weights(u[i], c, q, quashed)
        coef[i] = ci
        if not math.isfinite(ci):
            bad[0] = 1.0


@cuda.jit
def load_points(p, q, old, n_old_p, n_old_q, new, n_p, n_q):
    """Two dense points from their non-zeros: ``p``/``q`` zeroed where the previous ones were, then set.

    One block.  ``new`` is ``[indices of p, indices of q, values of p, values of q]`` (indices as
    float64, exact below 2**53), ``old`` the previous message (``n_old_*`` entries each).
    """
    tid, step = cuda.threadIdx.x, cuda.blockDim.x
    for k in range(tid, n_old_p, step):
        p[int(old[k])] = 0.0
    for k in range(tid, n_old_q, step):
        q[int(old[n_old_p + k])] = 0.0
    cuda.syncthreads()
    n = n_p + n_q
    for k in range(tid, n_p, step):
        p[int(new[k])] = new[n + k]
    for k in range(tid, n_q, step):
        q[int(new[n_p + k])] = new[n + n_p + k]


# ----------------------------------------------------------------------------- launches


if SIMULATED:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as _DeviceArray
else:  # pragma: no cover - needs a GPU
    from numba.cuda.cudadrv.devicearray import DeviceNDArrayBase as _DeviceArray

#: Scalars a kernel takes by value on a GPU (numba-cuda types them; ``None`` and other objects it cannot).
_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def _is_device_array(a) -> bool:
    return isinstance(a, _DeviceArray) or (not SIMULATED and hasattr(a, "__cuda_array_interface__"))


def check_arguments(name: str, args) -> None:
    """Refuse a launch argument that a real GPU would refuse or copy: only device arrays and numbers pass.

    The simulator runs a kernel's Python code and takes anything (``None``, a host array, a list); numba-cuda's
    launch on a GPU fails on ``None`` (``NotImplementedError: (none, None)``) and copies a host array in and
    out at every launch.  Checking here, in the one place every launch goes through, makes the simulator
    catch what hardware would.
    """
    for i, a in enumerate(args):
        if _is_device_array(a) or (isinstance(a, _SCALARS) and not isinstance(a, np.ndarray)):
            continue
        what = type(a).__name__
        if a is None or isinstance(a, np.ndarray):
            what = "None" if a is None else f"a host numpy array {a.shape}"
        raise TypeError(f"CUDA kernel {name}: argument {i} is {what}; a launch takes device arrays "
                        "(cuda.to_device) and numbers only")  # fmt: skip


class Kernel:
    """A compiled kernel whose launches (``kernel[grid, block](*args)``) pass :func:`check_arguments` first.

    Under the simulator a launch also holds one lock: the simulator runs one kernel at a time (shards served by
    several threads, e.g. on a Dask worker, launch concurrently; a GPU queues them).  Attributes other than the
    launch (``py_func``, ...) are the compiled kernel's.
    """

    _lock = threading.RLock()

    def __init__(self, name: str, kernel):
        self.name, self._kernel = name, kernel

    def __getattr__(self, attr):
        return getattr(self._kernel, attr)

    def __getitem__(self, config):
        launch_, name = self._kernel[config], self.name

        def run(*args):
            check_arguments(name, args)
            for observe in LAUNCH_OBSERVERS:
                observe(name, args)
            if not SIMULATED:  # pragma: no cover - needs a GPU
                return launch_(*args)
            with self._lock:
                return launch_(*args)

        return run


#: Callables ``(kernel name, args)`` told of every launch before it runs (tests count transfers with them).
LAUNCH_OBSERVERS: list = []

KERNELS = ("exp_values", "fill_zero", "point_sqnorms", "group_dots_dense", "group_dots_csr", "superstep_features",
           "superstep_features_inline", "superstep_columns", "scores_argmax", "pick_candidates", "point_kernels",
           "gather_rows", "exact_row_dots", "weighted_kernel_sums", "combined_columns", "columns_times",
           "active_weights", "columns_transposed_partials", "sum_partials", "rules_margins", "rules_coef",
           "load_points")  # fmt: skip
for _name in KERNELS:
    globals()[_name] = Kernel(_name, globals()[_name])

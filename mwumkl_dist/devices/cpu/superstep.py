"""The MWU superstep: kernel columns on the fly fused with the shard's ``V``/``g`` update (:func:`superstep_features`,
:func:`superstep_columns`).

Part of :mod:`mwumkl_dist.devices.cpu` (see its docstring for how the kernels are fast and exact).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from mwumkl_dist.core.partition import kernel_tiles
from mwumkl_dist.devices.cpu.blocks import (
    PlanArrays,
    _block_dots,
    _column_entries,
    _csc_dots,
    _dense_block_dots,
    _dist2,
    _dots4,
    _gauss_arg,
    _kernel_values,
    _scatter_dots,
    superstep_workspace,
)
from mwumkl_dist.devices.cpu.exp import _exp_into
from mwumkl_dist.devices.cpu.groups import group_sqnorms
from mwumkl_dist.devices.cpu.options import _OPTS
from mwumkl_dist.devices.cpu.pool import parallel, threads_for

__all__ = ["Pick", "RowBlock", "RowViews", "superstep_features", "superstep_columns", "dense_copy", "point_entries"]


class RowBlock(NamedTuple):
    """The rows a superstep updates: labels ``y``, the first row's global index ``row_offset``, ``V``
    ``(n_rows, m)`` (updated in place; any layout, Fortran order fastest) and each kernel's ``inv_trace``."""

    y: np.ndarray
    row_offset: int
    V: np.ndarray
    inv_trace: np.ndarray


class Pick(NamedTuple):
    """A superstep's two picked rows: global indices ``ip`` and ``iq``, labels ``yp`` and ``yq``, and their ridges
    (the only rows whose diagonal a superstep touches)."""

    ip: int
    iq: int
    yp: float
    yq: float
    ridge_p: float
    ridge_q: float


class RowViews(NamedTuple):
    """Cached views of a block's rows that a shard keeps across supersteps (None: none; see
    :func:`superstep_features`)."""

    row_sq: np.ndarray | None = None
    csc: tuple | None = None
    dense_t: np.ndarray | None = None


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


def superstep_features(X, rows: RowBlock, p, q, pick: Pick, coef, plan: PlanArrays, views: RowViews | None = None,
                       workspace=None):  # fmt: skip
    """One fused pass: ``V += (G[:, ip] + G[:, iq]) / 2`` then ``g = V @ coef`` and per-class argmax.

    ``G_i[j, k] = y_j y_k K_i(x_j, x_k) * inv_trace[i] + ridge_j * [j == k]`` on the CSR rows ``X``
    (``indptr``, ``indices``, ``data``; ``rows``: their labels, ``V``, ... as :class:`RowBlock`) with
    global indices ``ip``/``iq`` of ``pick`` (:class:`Pick`), ``p``/``q`` the two points: each its
    non-zero entries ``(indices, values)`` (features ascending) or a dense
    feature vector.  Given entries, nothing here costs ``O(n_features)`` per
    call (the workspace's dense buffers are filled and cleared entry by entry).
    ``plan``: :class:`PlanArrays`.

    The score is summed per kernel tile (:func:`kernel_tiles`: each tile's
    partial a sequential sum over its kernels from 0), then over the tiles
    in tile order; the partials are left in ``workspace.partial``.  The work
    is split into (row block, tile) tasks over the threads of
    :func:`get_num_threads` when there is enough of it; every row's numbers,
    and so the result, are the same for every thread count.

    Parameters
    ----------
    views : RowViews, optional
        Any of these views of the rows, kept by the caller:

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
    indptr, indices, data = X.indptr, X.indices, X.data
    y, row_offset, V, inv_trace = rows
    ip, iq, yp, yq, ridge_p, ridge_q = pick
    plan = PlanArrays.of(plan)
    feat_ptr, feat_groups, n_groups = plan.feat_ptr, plan.feat_groups, plan.n_groups
    row_sq_t, (csc_ptr, csc_rows, csc_vals), dense_t = _row_passes(
        indptr, indices, data, feat_ptr, feat_groups, n_groups, *(views or RowViews())
    )
    if workspace is None:
        workspace = superstep_workspace(len(y), *plan)
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
        n_threads, n_rb = _layout(len(y), workspace.n_tiles, len(plan.kind))
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


def superstep_columns(rows: RowBlock, colp, colq, pick: Pick, coef, tile_ptr=None, partial=None):
    """The same update as :func:`superstep_features` from materialised raw columns ``(n, m)``.

    Scores are summed per tile (``tile_ptr``, by default
    :func:`kernel_tiles` of ``m`` chain-free kernels) and then over tiles in
    order; ``partial`` ``(n_tiles, n_rows)`` receives the tile partials.
    """
    y, row_offset, V, inv_trace = rows
    ip, iq, yp, yq, ridge_p, ridge_q = pick
    if tile_ptr is None:
        tile_ptr = kernel_tiles(V.shape[1])
    if partial is None:
        partial = np.empty((len(tile_ptr) - 1, V.shape[0]))
    bp, gp, bn, gn = _superstep_columns(
        y, int(row_offset), V, colp, colq, int(ip), int(iq), float(yp), float(yq), inv_trace, float(ridge_p),
        float(ridge_q), coef, tile_ptr, partial,
    )  # fmt: skip
    return int(bp), float(gp), int(bn), float(gn)

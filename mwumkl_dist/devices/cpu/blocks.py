"""The building blocks of a superstep: the picked points' dot products, kernel values by blocks of rows, and the value
plan (:func:`value_plan`, :func:`superstep_workspace`).

Part of :mod:`mwumkl_dist.devices.cpu` (see its docstring for how the kernels are fast and exact).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from mwumkl_dist.core.partition import kernel_tiles
from mwumkl_dist.devices.cpu.exp import _exp_into
from mwumkl_dist.devices.cpu.groups import _group_features
from mwumkl_dist.devices.cpu.options import _OPTS

__all__ = ["PlanArrays", "superstep_workspace", "SuperstepWorkspace", "value_plan"]


class PlanArrays(NamedTuple):
    """A kernel plan's arrays in the order the numba kernels take them (:class:`mwumkl_dist.kernels.KernelPlan`'s
    fields, :func:`mwumkl_dist.kernels.evaluation.plan_args`): one argument of the Python wrappers, which unpack it
    for their kernels."""

    kind: np.ndarray
    pa: np.ndarray
    pb: np.ndarray
    grp: np.ndarray
    square_of: np.ndarray
    order: np.ndarray
    feat_ptr: np.ndarray
    feat_groups: np.ndarray
    n_groups: int

    @classmethod
    def of(cls, arrays) -> PlanArrays:
        """``arrays`` (nine, in this order) as plan arrays, ``n_groups`` an int (the kernels take it as one)."""
        *head, n_groups = arrays
        return cls(*head, int(n_groups))


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

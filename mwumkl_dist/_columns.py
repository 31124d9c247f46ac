"""Numba kernels: kernel columns on the fly, fused with the shard's V/g update.

Everything here works row by row, so a row's numbers do not depend on which
shard holds it (the sharding invariance of the engines rests on that).  Data
is CSR (``indptr``, ``indices``, ``data``); the kernel plan comes from
:class:`mwumkl_dist.kernels.KernelPlan`.  The MWU rules themselves (which
columns, what weights) live in :mod:`mwumkl_dist.mwu`; this module only
evaluates kernels and applies ``V += (col_P + col_N) / 2``, ``g = V @ coef``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_CACHE = True


@njit(cache=_CACHE, inline="always")
def _kernel_value(kind, a, b, dot, dist2):
    if kind == 0:  # linear
        return dot
    if kind == 1:  # polynomial (dot + coef0) ** degree
        base = dot + b
        v = base
        for _ in range(int(a) - 1):
            v *= base
        return v
    # gaussian exp(-gamma |x - z|^2)
    if dist2 < 0.0:
        dist2 = 0.0
    return np.exp(-a * dist2)


@njit(cache=_CACHE, inline="always")
def _eval_row(dot, sqx, pp, kind, pa, pb, grp, square_of, order, out):
    """Kernel values of one row against one point, for every kernel, into ``out``."""
    for t in range(order.shape[0]):
        i = order[t]
        src = square_of[i]
        if src >= 0:
            v = out[src]
            out[i] = v * v
        else:
            g = grp[i]
            out[i] = _kernel_value(kind[i], pa[i], pb[i], dot[g], sqx[g] + pp[g] - 2.0 * dot[g])


@njit(cache=_CACHE, inline="always")
def _update_row(V, j, kp, kq, sp, sq, inv_trace, diag, coef):
    """``V[j] += (sp * kp + sq * kq) * inv_trace + diag``; returns ``g_j = V[j] @ coef``."""
    g = 0.0
    for i in range(V.shape[1]):
        v = V[j, i] + (sp * kp[i] + sq * kq[i]) * inv_trace[i] + diag
        V[j, i] = v
        g += coef[i] * v
    return g


@njit(cache=_CACHE, inline="always")
def _point_group_sqnorms(point, feat_ptr, feat_groups, out):
    out[:] = 0.0
    for f in range(point.shape[0]):
        v = point[f]
        if v != 0.0:
            for t in range(feat_ptr[f], feat_ptr[f + 1]):
                out[feat_groups[t]] += v * v


@njit(cache=_CACHE, inline="always")
def _row_group_dots(indptr, indices, data, j, p, q, feat_ptr, feat_groups, dp, dq, sqx):
    dp[:] = 0.0
    dq[:] = 0.0
    sqx[:] = 0.0
    for k in range(indptr[j], indptr[j + 1]):
        f = indices[k]
        v = data[k]
        a = v * p[f]
        b = v * q[f]
        c = v * v
        for t in range(feat_ptr[f], feat_ptr[f + 1]):
            g = feat_groups[t]
            dp[g] += a
            dq[g] += b
            sqx[g] += c


@njit(cache=_CACHE)
def kernel_columns(
    indptr, indices, data, p, q, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups
):
    """Raw kernel values ``K_i(x_j, p)`` and ``K_i(x_j, q)`` as two ``(n_rows, m)`` arrays."""
    n = indptr.shape[0] - 1
    m = kind.shape[0]
    colp = np.empty((n, m))
    colq = np.empty((n, m))
    dp = np.empty(n_groups)
    dq = np.empty(n_groups)
    sqx = np.empty(n_groups)
    ppp = np.empty(n_groups)
    ppq = np.empty(n_groups)
    _point_group_sqnorms(p, feat_ptr, feat_groups, ppp)
    _point_group_sqnorms(q, feat_ptr, feat_groups, ppq)
    for j in range(n):
        _row_group_dots(indptr, indices, data, j, p, q, feat_ptr, feat_groups, dp, dq, sqx)
        _eval_row(dp, sqx, ppp, kind, pa, pb, grp, square_of, order, colp[j])
        _eval_row(dq, sqx, ppq, kind, pa, pb, grp, square_of, order, colq[j])
    return colp, colq


@njit(cache=_CACHE)
def kernel_diagonal(indptr, indices, data, kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups):
    """``K_i(x_j, x_j)`` as an ``(n_rows, m)`` array (traces are its column sums)."""
    n = indptr.shape[0] - 1
    m = kind.shape[0]
    out = np.empty((n, m))
    sqx = np.empty(n_groups)
    for j in range(n):
        sqx[:] = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            f = indices[k]
            c = data[k] * data[k]
            for t in range(feat_ptr[f], feat_ptr[f + 1]):
                sqx[feat_groups[t]] += c
        # x . x = |x|^2 and |x - x|^2 = 0 (passing pp = -sqx makes sqx + pp - 2 dot = -2 sqx; clamp is
        # not wanted here, so evaluate with dist2 = 0 explicitly).
        for t in range(order.shape[0]):
            i = order[t]
            src = square_of[i]
            if src >= 0:
                out[j, i] = out[j, src] * out[j, src]
            else:
                g = grp[i]
                out[j, i] = _kernel_value(kind[i], pa[i], pb[i], sqx[g], 0.0)
    return out


@njit(cache=_CACHE)
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
):
    """One fused pass: ``V += (G[:, ip] + G[:, iq]) / 2`` then ``g = V @ coef`` and per-class argmax.

    ``G_i[j, k] = y_j y_k K_i(x_j, x_k) * inv_trace[i] + ridge * [j == k]`` with
    global indices ``ip``/``iq`` (``row_offset`` is this block's first global
    row).  Returns ``(best_pos, g_pos, best_neg, g_neg)`` as local row indices
    (``-1`` when the block has no row of that class); ties go to the lowest index.
    """
    n = indptr.shape[0] - 1
    m = kind.shape[0]
    dp = np.empty(n_groups)
    dq = np.empty(n_groups)
    sqx = np.empty(n_groups)
    ppp = np.empty(n_groups)
    ppq = np.empty(n_groups)
    kp = np.empty(m)
    kq = np.empty(m)
    _point_group_sqnorms(p, feat_ptr, feat_groups, ppp)
    _point_group_sqnorms(q, feat_ptr, feat_groups, ppq)
    best_pos, best_neg = -1, -1
    g_pos, g_neg = -np.inf, -np.inf
    for j in range(n):
        _row_group_dots(indptr, indices, data, j, p, q, feat_ptr, feat_groups, dp, dq, sqx)
        _eval_row(dp, sqx, ppp, kind, pa, pb, grp, square_of, order, kp)
        _eval_row(dq, sqx, ppq, kind, pa, pb, grp, square_of, order, kq)
        gj = row_offset + j
        sp = 0.5 * y[j] * yp
        sq = 0.5 * y[j] * yq
        diag = 0.0
        if gj == ip or gj == iq:
            diag = 0.5 * ridge
        g = _update_row(V, j, kp, kq, sp, sq, inv_trace, diag, coef)
        if y[j] > 0:
            if g > g_pos:
                g_pos = g
                best_pos = j
        elif g > g_neg:
            g_neg = g
            best_neg = j
    return best_pos, g_pos, best_neg, g_neg


@njit(cache=_CACHE)
def superstep_columns(y, row_offset, V, colp, colq, ip, iq, yp, yq, inv_trace, ridge, coef):
    """The same update as :func:`superstep_features` from materialised raw columns ``(n, m)``."""
    n = V.shape[0]
    best_pos, best_neg = -1, -1
    g_pos, g_neg = -np.inf, -np.inf
    for j in range(n):
        gj = row_offset + j
        sp = 0.5 * y[j] * yp
        sq = 0.5 * y[j] * yq
        diag = 0.0
        if gj == ip or gj == iq:
            diag = 0.5 * ridge
        g = _update_row(V, j, colp[j], colq[j], sp, sq, inv_trace, diag, coef)
        if y[j] > 0:
            if g > g_pos:
                g_pos = g
                best_pos = j
        elif g > g_neg:
            g_neg = g
            best_neg = j
    return best_pos, g_pos, best_neg, g_neg


@njit(cache=_CACHE)
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


@njit(cache=_CACHE)
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

    Each row is scattered into a dense scratch vector once; each pair then
    costs one pass over the support vector's non-zeros plus ``m`` kernel values.
    """
    n = indptr.shape[0] - 1
    n_sv = sv_indptr.shape[0] - 1
    n_out, m = weights.shape
    out = np.zeros((n, n_out))
    scratch = np.zeros(n_features)
    sqx = np.empty(n_groups)
    dot = np.empty(n_groups)
    kv = np.empty(m)
    for t in range(n):
        sqx[:] = 0.0
        for k in range(indptr[t], indptr[t + 1]):
            f = indices[k]
            v = data[k]
            scratch[f] = v
            for u in range(feat_ptr[f], feat_ptr[f + 1]):
                sqx[feat_groups[u]] += v * v
        for j in range(n_sv):
            dot[:] = 0.0
            for k in range(sv_indptr[j], sv_indptr[j + 1]):
                f = sv_indices[k]
                a = sv_data[k] * scratch[f]
                if a != 0.0:
                    for u in range(feat_ptr[f], feat_ptr[f + 1]):
                        dot[feat_groups[u]] += a
            _eval_row(dot, sqx, sv_sq[j], kind, pa, pb, grp, square_of, order, kv)
            for o in range(n_out):
                c = coef[o, j]
                if c != 0.0:
                    acc = 0.0
                    for i in range(m):
                        acc += weights[o, i] * kv[i]
                    out[t, o] += c * acc
        for k in range(indptr[t], indptr[t + 1]):
            scratch[indices[k]] = 0.0
    return out

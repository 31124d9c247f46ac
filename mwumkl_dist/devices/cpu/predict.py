"""The decision function's weighted kernel sums against the support vectors (:func:`weighted_kernel_sums`).

Part of :mod:`mwumkl_dist.devices.cpu` (see its docstring for how the kernels are fast and exact).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from mwumkl_dist.core.partition import kernel_tiles
from mwumkl_dist.devices.cpu.blocks import PlanArrays, _block_size, _dots4, _value_sizes, value_plan
from mwumkl_dist.devices.cpu.options import _OPTS
from mwumkl_dist.devices.cpu.pool import parallel, threads_for
from mwumkl_dist.devices.cpu.superstep import _NO_CSC, _NO_DENSE, _as_f64, _tile_values, dense_copy

__all__ = ["weighted_kernel_sums"]


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


def weighted_kernel_sums(X, n_features, support_vectors, sv_sq, coef, weights, plan: PlanArrays):
    """``out[t, k] = sum_j coef[k, j] sum_i weights[k, i] K_i(x_t, sv_j)`` for CSR rows and CSR SVs.

    ``X`` and ``support_vectors``: CSR (``indptr``, ``indices``, ``data``) on ``n_features`` features;
    ``plan``: :class:`PlanArrays`.

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
    indptr, indices, data = X.indptr, X.indices, X.data
    sv_indptr, sv_indices, sv_data = support_vectors.indptr, support_vectors.indices, support_vectors.data
    kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups = PlanArrays.of(plan)
    n = len(indptr) - 1
    n_features = int(n_features)
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

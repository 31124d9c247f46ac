"""Kernel columns, the kernels' diagonal and the picked points' kernel block (:func:`kernel_columns`,
:func:`kernel_diagonal`, :func:`point_kernels`).

Part of :mod:`mwumkl_dist.devices.cpu` (see its docstring for how the kernels are fast and exact).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from mwumkl_dist.devices.cpu.blocks import (
    PlanArrays,
    _block_dist2,
    _block_dots,
    _block_size,
    _block_values,
    _dist2,
    _gauss_arg,
    _prepare_points,
)
from mwumkl_dist.devices.cpu.exp import _exp_into
from mwumkl_dist.devices.cpu.groups import group_sqnorms
from mwumkl_dist.devices.cpu.options import _OPTS
from mwumkl_dist.devices.cpu.pool import parallel, threads_for
from mwumkl_dist.devices.cpu.superstep import _as_f64, point_entries

__all__ = ["kernel_columns", "kernel_diagonal", "point_kernels"]


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


def kernel_columns(X, p, q, plan: PlanArrays, row_sq=None):
    """Raw kernel values ``K_i(x_j, p)`` and ``K_i(x_j, q)`` as two ``(n_rows, m)`` arrays.

    ``X``: the rows, CSR (``indptr``, ``indices``, ``data``); ``plan``: :class:`PlanArrays`. The same numbers
    :func:`superstep_features` adds to ``V`` (before the label, trace and ridge factors).
    """
    plan = PlanArrays.of(plan)
    if row_sq is None:
        row_sq = group_sqnorms(X.indptr, X.indices, X.data, plan.feat_ptr, plan.feat_groups, plan.n_groups)
    B = _block_size(len(plan.kind))
    return _columns_impl(X.indptr, X.indices, X.data, row_sq, _as_f64(p), _as_f64(q), *plan, B)


def point_kernels(p, q, plan: PlanArrays):
    """Raw ``K_i(p, p)``, ``K_i(q, q)``, ``K_i(p, q)`` for two points (dense, or ``(indices, values)``).

    Bit-identical to the column values a superstep computes for the rows ``p``
    and ``q`` (same sums in the same order), so ``K(p, p)`` of a Gaussian is
    exactly 1.  Costs ``O(non-zeros)`` given entries (:func:`point_entries`).
    """
    pi, pv = point_entries(p)
    qi, qv = point_entries(q)
    return _point_kernels(pi, pv, qi, qv, *plan)


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


def kernel_diagonal(X, plan: PlanArrays):
    """``K_i(x_j, x_j)`` of the CSR rows ``X`` as an ``(n_rows, m)`` array (traces are its column sums); rows over
    threads by work."""
    n = len(X.indptr) - 1
    plan = PlanArrays.of(plan)
    m = len(plan.kind)
    out = np.empty((n, m))
    args = (X.indptr, X.indices, X.data, *plan)
    with parallel(min(threads_for(n * (m + plan.n_groups)), max(1, n // 16))) as n_threads:
        if n_threads > 1:
            _diag_parallel(out, *args, min(n, 4 * n_threads))
        else:
            _diag_rows(0, n, out, *args)
    return out

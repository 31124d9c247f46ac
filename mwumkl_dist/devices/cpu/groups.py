"""Feature groups: their features (:func:`group_features`) and the rows' squared norms per group
(:func:`group_sqnorms`).

Part of :mod:`mwumkl_dist.devices.cpu` (see its docstring for how the kernels are fast and exact).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numba import njit

from mwumkl_dist.devices.cpu.options import _OPTS

__all__ = ["group_sqnorms", "group_sqnorms_t", "group_features"]


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

"""A kernel plan's arrays for the GPU, and the GPU memory a shard needs (:func:`feature_shard_bytes`,
:func:`precomputed_shard_bytes`).

Part of :mod:`mwumkl_dist.data.cuda` (see its docstring for the numbers and the memory).
"""

from __future__ import annotations

import numpy as np

from mwumkl_dist.core.partition import chain_roots, kernel_tiles
from mwumkl_dist.devices import cpu as _columns

__all__ = ["feature_shard_bytes", "inline_groups", "precomputed_shard_bytes"]


def _plan_host(plan) -> dict:
    root, depth = chain_roots(plan.square_of)
    feat_ptr = np.ascontiguousarray(plan.feat_ptr, dtype=np.int64)
    feat_groups = np.ascontiguousarray(plan.feat_groups, dtype=np.int64)
    gptr, gfeat = _columns.group_features(feat_ptr, feat_groups, int(plan.n_groups))
    return {
        "kind": np.ascontiguousarray(plan.kind, dtype=np.int64),
        "pa": np.ascontiguousarray(plan.param_a, dtype=np.float64),
        "pb": np.ascontiguousarray(plan.param_b, dtype=np.float64),
        "grp": np.ascontiguousarray(plan.group, dtype=np.int64),
        "square_of": np.ascontiguousarray(plan.square_of, dtype=np.int64),
        "root": root,
        "depth": depth,
        "gptr": gptr,
        "gfeat": gfeat,
        "feat_ptr": feat_ptr,
        "feat_groups": feat_groups,
    }


def _nbytes(arrays) -> int:
    return int(sum(a.nbytes for a in arrays))


#: Dense rows and kernels on small groups (random banks, per-feature kernels; at most this many features
#: per kernel on average, several groups): each thread computes its kernels' group dots and norms itself.
INLINE_MAX_GROUP = 16


def inline_groups(plan, dense: bool) -> bool:
    """Whether a :class:`CudaFeatureShard` computes group dots in the superstep kernel (no ``(G, n)`` arrays)."""
    if not dense or int(plan.n_groups) < 2 or plan.n_kernels == 0:
        return False
    group_size = np.bincount(np.asarray(plan.feat_groups), minlength=int(plan.n_groups))
    return float(np.mean(group_size[np.asarray(plan.group)])) <= INLINE_MAX_GROUP


#: Sparse rows are still kept dense on the GPU, up to this size, when the plan's groups are small
#: (:func:`inline_groups`): the superstep kernel then needs no ``(G, n)`` arrays (e.g. mushrooms' 1344
#: per-feature kernels).  The numbers do not depend on the layout.
DENSE_MAX_BYTES = 256 * 2**20


def _dense_rows(X, plan) -> np.ndarray | None:
    """The rows as a dense ``(d, n)`` copy for the GPU, or None (CSR)."""
    dense_t = _columns.dense_copy(X)
    if dense_t is None and 8 * X.shape[0] * X.shape[1] <= DENSE_MAX_BYTES and inline_groups(plan, True):
        dense_t = np.ascontiguousarray(X.toarray().T)
    return dense_t


def feature_shard_bytes(n_rows: int, plan, X=None, dense: bool | None = None) -> int:
    """GPU memory of a :class:`CudaFeatureShard` of ``n_rows`` rows (its peak: everything is kept).

    ``V`` (``8 n m``), the tile partials, the rows (dense ``8 n d``, or CSR),
    unless :func:`inline_groups` the rows' group norms and the two points'
    group dot products (``3 x 8 n G``), the plan and the per-superstep vectors.
    """
    n, m, G, d = int(n_rows), int(plan.n_kernels), int(plan.n_groups), int(plan.n_features)
    n_tiles = len(kernel_tiles(plan.square_of)) - 1
    if dense is None:
        dense = X is None or _columns.dense_copy(X) is not None
    rows = 8 * n * d if dense else X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
    groups = 0 if inline_groups(plan, dense) else 3 * 8 * n * G
    plan_bytes = 8 * (9 * m + 2 * len(plan.feat_groups) + len(plan.feat_ptr) + G + 1)
    per_step = 8 * (2 * d + 3 * m + 2 * G + 2 * n)  # points, coef, inv_trace, gathered rows, norms, y, g
    return int(8 * n * m + 8 * n * n_tiles + groups + rows + plan_bytes + per_step)


def precomputed_shard_bytes(n_rows: int, n_kernels: int, n_samples: int) -> int:
    """GPU memory of a :class:`CudaPrecomputedShard`: the kernel rows, ``V``, tile partials and vectors."""
    n, m = int(n_rows), int(n_kernels)
    n_tiles = len(kernel_tiles(m)) - 1
    return int(8 * m * n * int(n_samples) + 8 * n * m + 8 * n * n_tiles + 8 * (4 * m + 2 * n))

"""A shard: a block of training rows with its block of ``V``, and its superstep.

A shard owns rows ``[row_offset, row_offset + n_rows)`` of the training
problem for all kernels (row shards).  Each superstep it adds the two chosen
kernel columns to its ``V`` rows, scores them with ``g = V @ coef`` and
returns its best row of each class as a :class:`~mwumkl_dist.solvers.mwu.Candidate`.
The local engine runs shards in-process; the Dask engine runs the same shards
on workers, so both give the same numbers by construction.
"""

from __future__ import annotations

import numpy as np

from mwumkl_dist.core.exact import exact_column_sums, exact_row_dots, exact_to_float
from mwumkl_dist.core.mwu_rules import Candidate
from mwumkl_dist.core.partition import kernel_tiles
from mwumkl_dist.devices import cpu as _columns
from mwumkl_dist.kernels.evaluation import (
    SparsePoint,
    as_csr,
    kernel_columns,
    kernel_diagonal,
    plan_args,
    point_entries,
    row_group_sqnorms,
)
from mwumkl_dist.kernels.specs import KernelPlan

__all__ = [
    "MARGIN_CHUNK",
    "ShardBase",
    "FeatureShard",
    "PrecomputedShard",
    "sum_tile_partials",
]


#: Rows whose exact margins :meth:`ShardBase.row_margins` forms at once (``N_LIMBS`` int64 limbs each, ~2 MB).
MARGIN_CHUNK = 4096


def sum_tile_partials(parts) -> np.ndarray:
    """Scores ``g`` of a row range from its kernel blocks' tile partials, given in kernel order.

    ``parts`` are the :meth:`ShardBase.superstep_scores` answers of the
    blocks holding the range, each ``(n_tiles_in_block, n_rows)``.  The tiles
    are added one after the other, as :func:`mwumkl_dist.devices.cpu.superstep_features`
    adds them for a shard of all kernels: any kernel split (on tile
    boundaries) gives the same bits.
    """
    rows = [np.asarray(row, dtype=np.float64) for part in parts for row in np.atleast_2d(part)]
    if not rows:
        raise ValueError("no tile partials to add")
    g = rows[0].copy()
    for row in rows[1:]:
        g += row
    return g


class ShardBase:
    """State common to both shard kinds: labels, ``V`` block and alpha counts."""

    def __init__(self, y: np.ndarray, row_offset: int, n_kernels: int):
        y = np.asarray(y, dtype=np.float64)
        if not np.all(np.abs(y) == 1.0):
            raise ValueError("shard labels must be +1 or -1")
        self.y = np.ascontiguousarray(y)
        self.row_offset = int(row_offset)
        self.n_rows = len(y)
        self.n_kernels = int(n_kernels)
        self.inv_trace: np.ndarray | None = None
        self.ridge: float | np.ndarray = 0.0
        # Fortran order: the superstep walks V kernel by kernel over blocks of rows.
        self.V = np.zeros((self.n_rows, self.n_kernels), order="F")
        self.alpha = np.zeros(self.n_rows)

    def configure(self, inv_trace: np.ndarray, ridge) -> None:
        """Set ``1 / r_i`` and the ridge (after the traces are known) and reset the state.

        ``ridge`` is ``1 / C`` for every row, or an ``(n_rows,)`` array with
        this block's per-point values ``1 / C_j`` (sample or class weights;
        :func:`mwumkl_dist.solvers.mwu.ridge_rows` cuts it from the global one).
        """
        self.inv_trace = np.ascontiguousarray(inv_trace, dtype=np.float64)
        if np.ndim(ridge) == 0:
            self.ridge = float(ridge)
        else:
            ridge = np.ascontiguousarray(ridge, dtype=np.float64)
            if ridge.shape != (self.n_rows,):
                raise ValueError(f"the shard's per-point ridge must have shape ({self.n_rows},), got {ridge.shape}")
            self.ridge = ridge
        self.V[:] = 0.0
        self.alpha[:] = 0.0

    def picked_ridge(self, ip: int, iq: int) -> tuple[float, float]:
        """The ridges of global rows ``ip`` and ``iq`` (0 for a row outside this block: unused there)."""
        if isinstance(self.ridge, float):
            return self.ridge, self.ridge
        out = []
        for i in (ip, iq):
            local = i - self.row_offset
            out.append(float(self.ridge[local]) if 0 <= local < self.n_rows else 0.0)
        return out[0], out[1]

    def _candidate(self, local: int, g: float) -> Candidate:
        if local < 0:
            return Candidate(-1, -np.inf)
        return Candidate(self.row_offset + local, float(g), self.V[local].copy(), self.point(local))

    def trace_parts(self) -> list[int]:
        """This block's share of the traces ``r_i = sum_j K_i(x_j, x_j)``, as exact integers.

        Engines add the parts of all blocks and round once (:mod:`mwumkl_dist.core.exact`),
        so the traces do not depend on the sharding.
        """
        return exact_column_sums(self.diagonal())

    def initial_candidates(self) -> tuple[Candidate, Candidate]:
        """With ``g = 0`` everywhere, the lowest row of each class."""
        pos = np.flatnonzero(self.y > 0)
        neg = np.flatnonzero(self.y < 0)
        return (
            self._candidate(int(pos[0]) if len(pos) else -1, 0.0),
            self._candidate(int(neg[0]) if len(neg) else -1, 0.0),
        )

    def _add_alpha(self, ip: int, iq: int) -> None:
        for i in (ip, iq):
            local = i - self.row_offset
            if 0 <= local < self.n_rows:
                self.alpha[local] += 0.5

    def superstep(self, ip: int, iq: int, p, q, coef: np.ndarray) -> tuple[Candidate, Candidate]:
        """Add columns ``ip`` (class +1) and ``iq`` (class -1) to V, score, return best rows."""
        if self.inv_trace is None:
            raise RuntimeError("shard not configured: call configure(inv_trace, ridge) first")
        self._add_alpha(ip, iq)
        bp, gp, bn, gn = self._step(ip, iq, p, q, np.ascontiguousarray(coef, dtype=np.float64))
        return self._candidate(bp, gp), self._candidate(bn, gn)

    def superstep_scores(self, ip: int, iq: int, p, q, coef: np.ndarray) -> np.ndarray:
        """A superstep, then this block's score partials per kernel tile, ``(n_tiles_in_block, n_rows)``.

        The driver adds the blocks' partials of a row range in kernel order
        (:func:`sum_tile_partials`): the scores are then bit-identical to a
        shard of all kernels (block boundaries fall on tile boundaries).
        """
        self.superstep(ip, iq, p, q, coef)
        return self._tile_partials().copy()

    def _tile_partials(self) -> np.ndarray:
        raise NotImplementedError

    def stats(self) -> dict:
        """Counters a shard kind may keep (e.g. a store shard's column cache); none by default."""
        return {}

    def replay(self, picks, points) -> None:
        """Re-apply logged picks ``[(ip, iq), ...]`` in order: rebuilds ``V`` and alpha bit for bit.

        ``points`` maps a global index to its point (feature vector or index).
        """
        no_scores = np.zeros(self.n_kernels)
        for ip, iq in picks:
            ip, iq = int(ip), int(iq)
            self._add_alpha(ip, iq)
            self._step(ip, iq, points[ip], points[iq], no_scores)

    def support_margins(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """This block's rows with ``alpha_j > 0``: global indices, alpha counts, and
        ``V_j . w`` over the block's kernels as exact integers (see :mod:`mwumkl_dist.core.exact`),
        so that kernel blocks add up to exactly what one block of all kernels gives."""
        local = np.flatnonzero(self.alpha > 0)
        return local + self.row_offset, self.alpha[local], self._row_dots(local, np.asarray(weights, np.float64))

    def row_margins(self, local, weights: np.ndarray, rounded: bool):
        """``V_j . w`` over the block's kernels for its rows ``local`` (local indices), summed exactly.

        ``rounded``: the block holds all the kernels, so each exact sum is rounded here, once
        (float64 array); else the exact integers of :mod:`mwumkl_dist.core.exact`, which the engine
        adds over the kernel blocks of the rows before rounding.  Either way the values do not
        depend on the layout (nor on the thread count).
        """
        local = np.ascontiguousarray(local, dtype=np.int64)
        if len(local) and (local.min() < 0 or local.max() >= self.n_rows):
            raise IndexError(f"rows outside this block's {self.n_rows} rows")
        weights = np.asarray(weights, np.float64)
        parts = []
        for start in range(0, len(local), MARGIN_CHUNK):  # bounded limb arrays, whatever the row count
            sums = self._row_dots(local[start : start + MARGIN_CHUNK], weights)
            parts.append(exact_to_float(sums) if rounded else sums)
        if rounded:
            return np.concatenate(parts) if parts else np.zeros(0)
        return [x for part in parts for x in part]

    def _row_dots(self, local: np.ndarray, weights: np.ndarray) -> list[int]:
        """Exact ``sum_i fl(V[j, i] w_i)`` of the block's rows ``local`` (a GPU shard sums where ``V`` is)."""
        return exact_row_dots(self.V, local, weights)

    def alpha_counts(self) -> np.ndarray:
        return self.alpha.copy()


class FeatureShard(ShardBase):
    """Rows of feature data (CSR); kernel columns computed on the fly."""

    def __init__(self, X, y, row_offset: int, plan: KernelPlan):
        X = as_csr(X)
        if X.shape[0] != len(y):
            raise ValueError(f"shard has {X.shape[0]} rows but {len(y)} labels")
        if X.shape[1] != plan.n_features:
            raise ValueError(f"shard data has {X.shape[1]} features, the kernels expect {plan.n_features}")
        super().__init__(y, row_offset, plan.n_kernels)
        self.X = X
        self.plan = plan
        self._plan_args = plan_args(plan)
        # Per-row group norms, needed by every superstep: computed once, kept group-major.
        self._row_sq = row_group_sqnorms(X, plan)
        # A dense transposed copy (dense data) or a column copy (sparse data: one group visits only the
        # columns where the two points are non-zero, many groups only their tile's) makes the dots cheaper.
        self._csc = None
        self._dense_t = _columns.dense_copy(X)
        if self._dense_t is None:
            C = X.tocsc()
            C.sort_indices()
            self._csc = (C.indptr, C.indices, C.data)
        self._workspace = _columns.superstep_workspace(X.shape[0], *self._plan_args)

    def _tile_partials(self) -> np.ndarray:
        return self._workspace.partial

    def point(self, local: int) -> SparsePoint:
        """Row ``local`` as a :class:`SparsePoint` (its non-zeros: ``O(nnz)``, whatever the feature count)."""
        return SparsePoint.from_csr_row(self.X, local)  # as_csr sorted and summed duplicates

    def diagonal(self) -> np.ndarray:
        """``K_i(x_j, x_j)`` for this block's rows, ``(n_rows, m)``."""
        return kernel_diagonal(self.X, self.plan)

    def _step(self, ip, iq, p, q, coef):
        return _columns.superstep_features(
            self.X,
            _columns.RowBlock(self.y, self.row_offset, self.V, self.inv_trace),
            point_entries(p),
            point_entries(q),
            _columns.Pick(ip, iq, 1.0, -1.0, *self.picked_ridge(ip, iq)),
            coef,
            self._plan_args,
            _columns.RowViews(self._row_sq, self._csc, self._dense_t),
            workspace=self._workspace,
        )

    def raw_columns(self, p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw kernel values of this block's rows against two points, ``(n_rows, m)`` each."""
        return kernel_columns(self.X, self.plan, p, q, self._row_sq)


class PrecomputedShard(ShardBase):
    """Rows ``K[:, rows, :]`` of precomputed kernels, an ``(m, n_rows, n)`` array-like.

    A point is its global index; its column on this block is ``K[:, rows, j]``.
    """

    def __init__(self, K_rows, y, row_offset: int):
        if K_rows.ndim != 3 or K_rows.shape[1] != len(y):
            raise ValueError(f"precomputed shard block must be (m, {len(y)}, n), got {K_rows.shape}")
        super().__init__(y, row_offset, K_rows.shape[0])
        self.K = K_rows

    def _tiles(self) -> tuple[np.ndarray, np.ndarray]:
        # Tiles of the block's kernels (chain-free): the same as the whole set's when the block
        # starts on a tile boundary (problem.kernel_ranges cuts on them).  Made on first use
        # (subclasses such as the kernel store's shard do not run this __init__).
        tiles = getattr(self, "_tile_state", None)
        if tiles is None:
            tile_ptr = kernel_tiles(self.n_kernels)
            tiles = self._tile_state = (tile_ptr, np.zeros((len(tile_ptr) - 1, self.n_rows)))
        return tiles

    def _tile_partials(self) -> np.ndarray:
        return self._tiles()[1]

    def point(self, local: int) -> int:
        return self.row_offset + local

    def diagonal(self) -> np.ndarray:
        rows = np.arange(self.n_rows)
        return np.asarray(self.K[:, rows, rows + self.row_offset]).T

    def _column(self, j: int) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(self.K[:, :, j]).T)

    def _step(self, ip, iq, p, q, coef):
        return _columns.superstep_columns(
            _columns.RowBlock(self.y, self.row_offset, self.V, self.inv_trace),
            self._column(int(p)),
            self._column(int(q)),
            _columns.Pick(ip, iq, 1.0, -1.0, *self.picked_ridge(ip, iq)),
            coef,
            *self._tiles(),
        )

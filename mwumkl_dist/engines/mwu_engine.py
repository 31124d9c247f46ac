"""The MWU engine: a problem's shards in a shard pool, and the MWU iteration's messages over it.

The shards are blocks of rows x kernels (the layouts of docs/architecture.md):

* row shards (one kernel range): each shard holds some rows for all kernels, reduces its rows
  to one candidate per class, and the driver reduces the candidates: no O(n) data moves per
  superstep;
* kernel shards and row x kernel blocks: a block holds some rows for some kernels and returns
  its partial ``g`` for its rows; the driver sums the partials of each row range and takes the
  argmax, then fetches both chosen rows' ``V`` entries and points (a second, small round trip).

A superstep's arguments are the same for every block of a kernel range, so the pool sends them
encoded once per kernel range (once in all for row shards).  Where the shards live in other
processes (:attr:`~mwumkl_dist.engines.pool.ShardPool.remote`), the superstep's message and answers
travel in the fixed binary layouts of :mod:`mwumkl_dist.engines.messages`, and the driver decodes
only the two winning candidates: no Python object is pickled per superstep.  Where the pool can lose a shard,
the engine keeps the log of picks: a rebuilt block is configured and replays the picks in order
(the pool's ``restore``), which gives bit-identical ``V`` blocks, so a fit that lost a worker
ends with the same model.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from mwumkl_dist.core import partition
from mwumkl_dist.core.exact import exact_to_float
from mwumkl_dist.core.mwu_rules import (
    Candidate,
    HostRules,
    check_ridge,
    class_totals,
    reduce_candidates,
    ridge_rows,
)
from mwumkl_dist.data.shards import sum_tile_partials
from mwumkl_dist.engines import messages

__all__ = ["MWUEngine", "Block"]


class Block(NamedTuple):
    """A shard's slot in the pool: rows ``[r0, r1)`` x kernels ``[k0, k1)``."""

    rows: tuple[int, int]
    kernels: tuple[int, int]

    def __str__(self) -> str:
        return f"rows {self.rows} kernels {self.kernels}"


def _reduce(pairs) -> tuple[Candidate, Candidate]:
    return reduce_candidates([p for p, _ in pairs]), reduce_candidates([n for _, n in pairs])


class MWUEngine:
    """A problem's shards in a pool made by ``make_pool(blocks, factory_for, restore=...)``.

    Implements :class:`mwumkl_dist.engines.base.Engine`; ``LocalEngine`` and ``DaskEngine``
    are this engine on a :class:`~mwumkl_dist.engines.pool.LocalPool` and a
    :class:`~mwumkl_dist.engines.dask_pool.DaskPool`.
    """

    def __init__(self, problem, make_pool, n_shards: int = 1, n_kernel_shards: int = 1):
        self.problem = problem
        self.n_samples = problem.n_samples
        self.n_kernels = problem.n_kernels
        self.y = problem.y
        kernel_ranges = problem.kernel_ranges(n_kernel_shards)
        if len(kernel_ranges) < n_kernel_shards:
            warnings.warn(
                f"n_kernel_shards={n_kernel_shards} but {problem.n_kernels} kernels make only "
                f"{len(kernel_ranges)} kernel block(s): blocks hold whole kernel tiles of about "
                f"{partition.TILE_KERNELS} kernels (so that every layout gives the same model); using "
                f"{len(kernel_ranges)}",
                UserWarning,
                stacklevel=3,
            )
        self.partial = len(kernel_ranges) > 1
        self.slots: list[Block] = [Block(r, k) for r in problem.row_ranges(n_shards) for k in kernel_ranges]
        # Each class's rows, for Find-alpha on a full ``g`` (kernel-sharded layouts).
        self._class_rows = [np.flatnonzero(problem.y == cls) for cls in (1.0, -1.0)] if self.partial else []
        # The pick log, for rebuilding a lost block (kept only where the pool can lose one).
        self._picks: list[tuple[int, int]] = []
        self._points: dict[int, object] = {}
        self._replayed = 0
        self._config = None
        self.pool = make_pool(self.slots, self._factory, restore=self._restore)
        self._log = self.pool.rebuilds
        self._packed = self.pool.remote

    def _factory(self, block: Block):
        return self.problem.shard_factory(*block.rows, kernels=block.kernels)

    def _restore(self, block: Block) -> list:
        """A rebuilt block's calls: the configuration, and the picks it had seen (see the module)."""
        if self._config is None:
            return []
        inv_trace, ridge = self._config
        calls = [("configure", (self._kernel_slice(block, inv_trace), ridge_rows(ridge, *block.rows)))]
        done = self._picks[: self._replayed]
        if done:
            calls.append(("replay", (np.asarray(done, dtype=np.int64), self._points)))
        return calls

    @staticmethod
    def _kernel_slice(block: Block, per_kernel):
        k0, k1 = block.kernels
        if k0 == 0 and k1 == len(per_kernel):
            return per_kernel  # a block of all kernels takes the vector itself (rules on a GPU hand over theirs)
        return per_kernel[k0:k1]

    @staticmethod
    def _by_kernels(block: Block):
        return block.kernels

    # ------------------------------------------------------------------ Engine protocol
    def traces(self) -> np.ndarray:
        totals = [0] * self.n_kernels
        for b, parts in zip(self.slots, self.pool.call("trace_parts")):
            for k, part in enumerate(parts, start=b.kernels[0]):
                totals[k] += part
        return exact_to_float(totals)

    def configure(self, inv_trace: np.ndarray, ridge) -> None:
        """``1 / r_i`` and the ridge: a float, or per point (each block gets its rows' values)."""
        ridge = check_ridge(ridge, self.n_samples)
        if self._log:
            self._config = (inv_trace, ridge)
        self._picks, self._points, self._replayed = [], {}, 0
        self.pool.call("configure", lambda b: (self._kernel_slice(b, inv_trace), ridge_rows(ridge, *b.rows)))

    def _select(self, g: np.ndarray) -> tuple[Candidate, Candidate]:
        """Find-alpha on a full ``g`` (kernel-sharded layouts): argmax per class, lowest index on ties.

        Both rows' ``V`` entries (over all kernels) and points come in one call to the blocks holding them.
        """
        picks = [int(rows[np.argmax(g[rows])]) for rows in self._class_rows]

        def local_rows(b: Block) -> tuple:
            return ([j - b.rows[0] if b.rows[0] <= j < b.rows[1] else -1 for j in picks],)

        owners = [i for i, b in enumerate(self.slots) if any(b.rows[0] <= j < b.rows[1] for j in picks)]
        answers = self.pool.call(
            messages.fetch_rows, local_rows, shared=lambda b: b.rows, shards=owners, superstep=True
        )
        v_rows = [np.empty(self.n_kernels) for _ in picks]
        points = [None] * len(picks)
        for i, answer in zip(owners, answers):
            k0, k1 = self.slots[i].kernels
            for c, row in enumerate(messages.unpack_rows(answer, len(picks))):
                if row is not None:
                    v_rows[c][k0:k1], points[c] = row  # every owner holds the same point
        return tuple(Candidate(j, float(g[j]), v, p) for j, v, p in zip(picks, v_rows, points))

    def initial_candidates(self) -> tuple[Candidate, Candidate]:
        if self.partial:
            return self._select(np.zeros(self.n_samples))
        return _reduce(self.pool.call("initial_candidates"))

    def kernel_block(self, pos: Candidate, neg: Candidate):
        return self.problem.kernel_block(pos.point, neg.point)

    def rules(self, s, **settings) -> HostRules:
        """The rules on the driver's host (the shards' candidates bring their ``V`` rows there)."""
        return HostRules(s, self.kernel_block, **settings)

    def superstep(self, pos: Candidate, neg: Candidate, coef) -> tuple[Candidate, Candidate]:
        if self._log:  # the pick log lets a lost block be rebuilt bit for bit (replay before this superstep)
            self._picks.append((pos.index, neg.index))
            self._points.setdefault(pos.index, pos.point)
            self._points.setdefault(neg.index, neg.point)
            self._replayed = len(self._picks) - 1
        # Encoded once per kernel range (once in all for row shards): the same bytes to every block.
        if self._packed:
            method = messages.superstep_scores if self.partial else messages.superstep

            def args_for(b: Block) -> tuple:
                return (messages.pack_step(pos.index, neg.index, pos.point, neg.point, self._kernel_slice(b, coef)),)
        else:
            method = "superstep_scores" if self.partial else "superstep"

            def args_for(b: Block) -> tuple:
                return pos.index, neg.index, pos.point, neg.point, self._kernel_slice(b, coef)

        results = self.pool.call(method, args_for, shared=self._by_kernels, superstep=True)
        self._replayed = len(self._picks)
        if not self.partial:
            return messages.best_candidates(results) if self._packed else _reduce(results)
        # Each row range's blocks' tile partials, added in kernel (tile) order: one block's sums.
        by_rows: dict = {}
        for b, part in zip(self.slots, results):
            by_rows.setdefault(b.rows, []).append((b.kernels[0], part))
        g = np.empty(self.n_samples)
        for (r0, r1), parts in by_rows.items():
            g[r0:r1] = sum_tile_partials([part for _, part in sorted(parts, key=lambda kp: kp[0])])
        return self._select(g)

    def class_sums(self, weights: np.ndarray) -> tuple[float, float]:
        parts = self.pool.call("support_margins", lambda b: (self._kernel_slice(b, weights),), shared=self._by_kernels)
        return class_totals(parts, self.problem.y)

    def row_margins(self, rows, weights: np.ndarray) -> np.ndarray:
        """``h_j = sum_i w_i V_i[j]`` of the global ``rows`` (increasing), each an exact sum rounded once.

        Each block gets its own rows; a block of all kernels rounds its sums, kernel blocks send exact
        integers that are added per row here (see :meth:`ShardBase.row_margins
        <mwumkl_dist.data.shards.ShardBase.row_margins>`): the same bits for any layout.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if (
            rows.ndim != 1
            or np.any(np.diff(rows) <= 0)
            or (len(rows) and not 0 <= rows[0] <= rows[-1] < self.n_samples)
        ):
            raise ValueError(f"rows must be increasing indices in [0, {self.n_samples})")
        spans = [np.searchsorted(rows, b.rows) for b in self.slots]

        def args_for(b: Block) -> tuple:
            lo, hi = np.searchsorted(rows, b.rows)
            return rows[lo:hi] - b.rows[0], self._kernel_slice(b, weights), not self.partial

        parts = self.pool.call("row_margins", args_for)
        if not self.partial:
            out = np.empty(len(rows))
            for (lo, hi), part in zip(spans, parts):
                out[lo:hi] = part
            return out
        totals = [0] * len(rows)
        for (lo, _), part in zip(spans, parts):
            for i, value in enumerate(part, start=lo):
                totals[i] += value
        return exact_to_float(totals)

    def replay(self, picks) -> None:
        """Bring freshly configured blocks to the state after ``picks`` (resume from a checkpoint)."""
        picks = [tuple(p) for p in picks]
        points = {j: self.problem.point(j) for pick in picks for j in pick}
        if self._log:
            self._picks, self._points = picks, points
        picks_arr = np.asarray(picks, dtype=np.int64).reshape(-1, 2)
        self.pool.call("replay", lambda b: (picks_arr, points), shared=True)
        self._replayed = len(self._picks)

    def stats(self) -> list[dict]:
        """Each block's counters (:meth:`shard.stats`, e.g. a kernel store's column cache)."""
        return self.pool.call("stats")

    def alpha_counts(self) -> np.ndarray:
        out = np.zeros(self.n_samples)
        first = [i for i, b in enumerate(self.slots) if b.kernels[0] == 0]
        for i, counts in zip(first, self.pool.call("alpha_counts", shards=first)):
            r0, r1 = self.slots[i].rows
            out[r0:r1] = counts
        return out

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release the shards (and a client the pool started)."""
        self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

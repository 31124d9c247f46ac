"""The linear stage's shards: each holds its rows' kernel columns on the landmarks and answers the Newton solver."""

from __future__ import annotations

import contextlib
import functools
import logging

import numpy as np

from mwumkl_dist.core import partition
from mwumkl_dist.core.partition import dyadic_nodes, linear_row_ranges, row_blocks
from mwumkl_dist.data.backends import backend_named
from mwumkl_dist.devices.scratch import ScratchBuffers
from mwumkl_dist.devices.threads import current_threads, one_blas_thread, ordered_map
from mwumkl_dist.engines.layout import linear_shard_count
from mwumkl_dist.engines.pool import LocalPool
from mwumkl_dist.io.zarr_format import DataStore
from mwumkl_dist.kernels.evaluation import combined_kernel, evaluation_counts, kernel_traces
from mwumkl_dist.kernels.specs import KernelSet
from mwumkl_dist.solvers.two_stage.columns import SUB_ROWS, HostColumns
from mwumkl_dist.solvers.two_stage.margins import ShardSolve, SolveLog, line_sums, row_keys
from mwumkl_dist.solvers.two_stage.nystroem import Basis
from mwumkl_dist.solvers.two_stage.spill import FeatureBlocks, feature_memory_budget, scratch_dir

__all__ = [
    "STORAGES",
    "pass_cost",
    "all_traces",
    "LinearShard",
    "linear_shards",
    "GivenFeatures",
    "sum_parts",
]

logger = logging.getLogger("mwumkl_dist")


class GivenFeatures:
    """The rows are the features themselves (:func:`fit_squared_hinge` on an array)."""

    def __init__(self, rank: int):
        self.rank = rank

    @property
    def basis(self) -> Basis:
        return Basis(self.rank, None)

    def columns(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float64)


#: How a shard keeps its kernel columns (see :class:`LinearShard`).
STORAGES = ("auto", "memory", "spill", "recompute")


class LinearShard:
    """Rows ``[start, stop)`` of the linear stage: their kernel columns of one binary problem's combined kernel.

    ``rows`` are the shard's rows (an array or CSR matrix, its row 0 being row
    ``start``) or a :class:`~mwumkl_dist.stores.DataStore`, read block by block
    and never held whole.  The rows are cut into the fixed blocks of
    :func:`row_blocks` (``start`` is a multiple of ``row_block``), so every
    sharding evaluates the same blocks with the same operations; sums over the
    blocks follow one tree over the global block indices
    (:func:`~mwumkl_dist.core.partition.tree_total`): the same bits for any sharding.
    The shard's rows' kernel columns on the landmarks, ``K(x, L)`` (the map's
    :meth:`~mwumkl_dist.solvers.two_stage.nystroem.NystroemMap.columns`), rounded to
    ``dtype`` (single precision by default), are turned into features of a
    :class:`~mwumkl_dist.solvers.two_stage.nystroem.Basis` (one per rank level) as the
    solver asks.  ``storage`` says where they are between passes: in memory, spilled
    to a temporary file, or computed again block by block at every pass; ``"auto"``
    keeps them in memory within :func:`feature_memory_budget` (``columns_budget``: the shard's share of the
    fit's ``memory_limit``, on Dask its worker's; capped where the shard is built) and otherwise spills them or
    computes them again, whichever the cost model (:func:`pass_cost`) finds cheaper.  Every storage gives the same
    columns, bit for bit.
    ``device="cuda"`` (a name or a back-end, :mod:`mwumkl_dist.data.backends`): the columns live on the shard's
    GPU (its back-end's ``column_store``, :class:`~mwumkl_dist.data.cuda.columns.DeviceColumns`; storage
    ``"device"``) and the passes over them run there; the rows changing sides are copied back for the Hessian.
    A Newton solve's state on the shard's rows (outputs, the direction's outputs, active rows; :mod:`.margins`)
    stays here, the client sending ``r``-vectors and getting sums back (the ``solve_*`` methods); a lost shard is
    rebuilt by loading its problem again and replaying the solve's log (:meth:`solve_begin`).
    """

    def __init__(self, rows, start: int, stop: int, kernel_set=None, row_block: int | None = None, storage="auto",
                 device="cpu", columns_budget: int | None = None):  # fmt: skip
        row_block = partition.ROW_BLOCK if row_block is None else int(row_block)
        if start % row_block:
            raise ValueError(f"a linear-stage shard starts on a row block ({row_block} rows), not at row {start}")
        if storage not in STORAGES:
            raise ValueError(f"storage must be one of {', '.join(STORAGES)}, got {storage!r}")
        self.rows, self.start, self.stop = rows, int(start), int(stop)
        self.kernel_set = kernel_set
        self.row_block = row_block
        self.blocks = row_blocks(self.start, self.stop, row_block)
        self.storage = storage
        self.backend = backend_named(device)
        #: The kernel columns: the back-end's column store (a GPU's) or :class:`HostColumns` (None: none loaded).
        self.store = None
        # Where it is built: on a Dask worker's task thread (its calls later run on the shard server's thread,
        # which cannot see the worker's memory limit or local directory).
        self._budget, self._scratch = feature_memory_budget(columns_budget), scratch_dir()
        self.feature_map = None
        self.width = 0
        self.dtype = np.dtype(np.float32)
        self.bases: list[Basis] = []
        self._landmark_chunks = [0]
        self.y = self.cw = None
        self.solve_: ShardSolve | None = None  # the solve in progress
        self._masks: dict = {}  # the Hessian's active rows of the last explicit solves, by their token
        #: The passes' chunk-sized work arrays (:mod:`~mwumkl_dist.devices.scratch`: no allocation per chunk).
        self.buffers = ScratchBuffers()
        #: Rows done by the call in progress (a Dask shard's heartbeats carry it to the driver).
        self.rows_done = 0

    def _read(self, lo: int, hi: int):
        if isinstance(self.rows, DataStore):
            return self.rows.read_rows(lo, hi)
        return self.rows[lo - self.start : hi - self.start]

    def _local(self, i: int) -> slice:
        lo, hi = self.blocks[i]
        return slice(lo - self.start, hi - self.start)

    def trace_parts(self) -> list:
        """Every kernel's trace on each block (summed by the driver in row order)."""
        self.rows_done = 0

        def block(bounds):
            traces = kernel_traces(self.kernel_set, self._read(*bounds))
            self.rows_done += bounds[1] - bounds[0]  # an estimate for the heartbeats (threads may race on it)
            return traces

        return ordered_map(block, self.blocks)

    def load_problem(self, feature_map, y, cw, bases=None, step=None, dtype="float32", extend: bool = False) -> str:
        """Compute the rows' kernel columns under ``feature_map`` (``.columns(X)``, ``.basis``); labels +-1, ``c_j``.

        ``bases``: the :class:`Basis` of each rank level, the calls' ``level``
        indexes them (default: the map's own).  ``step``: a progress phase advanced by each block's
        rows (:class:`~mwumkl_dist.core.progress.Phase`; sent to a remote shard it is silent).
        ``dtype``: the precision the columns are kept in.  ``extend``: ``feature_map`` is the loaded one's
        kernel on more landmarks (the first ones the same): stored columns are kept and only the new landmarks'
        computed (a shard with none stored computes them all).  Returns the storage used
        (``"memory"``, ``"spill"`` or ``"recompute"``).

        The columns are computed in chunks of landmarks, one per level (``bases``' widths), so that stored,
        extended and recomputed columns have the same bits.
        """
        kept = self.store.kept(dtype) if extend and self.store is not None else None
        kept_width = self.width if kept is not None else 0
        if kept is None:
            self.close()
        self.store = None
        self.bases = list(bases) if bases is not None else [feature_map.basis]
        self.width = max(b.width for b in self.bases)
        self.feature_map = feature_map
        self.dtype = np.dtype(dtype)
        self.y = np.asarray(y, dtype=np.float64)
        self.cw = np.asarray(cw, dtype=np.float64)
        self.solve_, self._masks = None, {}
        sizes = [hi - lo for lo, hi in self.blocks]
        self.rows_done = 0
        self._landmark_chunks = sorted({0, *(b.width for b in self.bases)})
        device = self.backend.column_store(feature_map, self.width, self.dtype)
        storage = "device" if device is not None else self._storage(sum(sizes) * self.width * self.dtype.itemsize)
        if storage in ("memory", "spill"):
            stored = FeatureBlocks(sizes, self.width, self._scratch if storage == "spill" else None, self.dtype)
            self.store = HostColumns(sizes, self._block_rows, self._computed, stored, self.buffers)
        else:  # a GPU's, or computed at every pass (nothing kept now)
            self.store = device if device is not None else HostColumns(sizes, self._block_rows, self._computed,
                                                                       buffers=self.buffers)  # fmt: skip

        def build(i):
            lo, hi = self.blocks[i]
            X = self._read(lo, hi)
            if storage == "device":
                self.store.put(i, X)
            elif storage != "recompute" and kept is None:
                stored.put(i, self._computed(X))
            elif storage != "recompute":  # the kept columns, then the new landmarks' chunks
                block = np.empty((hi - lo, self.width), dtype=self.dtype)
                block[:, :kept_width] = kept.get(i)
                kept.release(i)
                block[:, kept_width:] = self._computed(X, kept_width)
                stored.put(i, block)
            self.rows_done += hi - lo  # an estimate for the heartbeats (threads may race on it)
            if step is not None:
                step.advance(hi - lo)

        if storage == "recompute":
            if step is not None:
                step.advance(sum(sizes))
        else:
            with one_blas_thread():
                self._map(build, range(len(self.blocks)))
            self.buffers.clear()  # a block's kernel values per thread: not held through the passes
        if kept is not None:
            kept.close()
        return storage

    def _block_rows(self, i: int):
        return self._read(*self.blocks[i])

    def _storage(self, nbytes: int) -> str:
        if self.storage != "auto":
            return self.storage
        if nbytes <= self._budget:
            return "memory"
        spill, recompute = pass_cost(self.feature_map.kernel_set, self.feature_map.weights, self.dtype.itemsize)
        return "recompute" if recompute < spill else "spill"

    def _computed(self, X, first: int = 0) -> np.ndarray:
        """The kernel columns of rows ``X`` as the shard keeps them (landmarks ``first`` to ``width``, in ``dtype``),
        in the chunks of landmarks of the levels (the same bits however they were stored)."""
        fmap = self.feature_map
        if not hasattr(fmap, "landmarks"):  # given features: the rows themselves
            return np.ascontiguousarray(fmap.columns(X)[:, first : self.width], dtype=self.dtype)
        out = np.empty((X.shape[0], self.width - first), dtype=self.dtype)
        widest = max(hi - lo for lo, hi in zip(self._landmark_chunks[:-1], self._landmark_chunks[1:]))
        with self.buffers.take(((X.shape[0] * widest,), np.float64), ((X.shape[0] * widest,), np.float64)) as (
            values,
            work,
        ):  # a block's kernel values and products in the same memory block after block
            for lo, hi in zip(self._landmark_chunks[:-1], self._landmark_chunks[1:]):
                if hi > first:
                    part = values[: X.shape[0] * (hi - lo)].reshape(X.shape[0], hi - lo)
                    combined_kernel(fmap.kernel_set, X, fmap.landmarks[lo:hi], fmap.weights, out=part, work=work)
                    out[:, max(lo, first) - first : hi - first] = part[:, max(0, first - lo) :]
        return out

    def columns(self, i: int, rows=None) -> np.ndarray:
        """Block ``i``'s kernel columns (``rows``: only those of its rows, local indices), stored or computed again."""
        return self.store.host(i, rows)

    def gram_parts(self, level: int, entering_bits, leaving_bits, on_columns: bool = False) -> list:
        """The change of ``(Z_A' D Z_A, Z_A' D y_A)`` when rows enter or leave the active set, per tree node.

        ``Z = [F, 1]`` with ``F`` the features of ``bases[level]`` (``on_columns``:
        its stored columns, before the projection), ``D = diag(c)``;
        ``entering_bits`` / ``leaving_bits``: ``np.packbits`` of the shard's
        masks.  Returns ``[((lo, hi), part)]`` for the tree nodes of the global
        row blocks the shard holds whole (:func:`~mwumkl_dist.core.partition.dyadic_nodes`),
        ``part`` a ``(k + 2, k + 1)`` array (the Gram matrix's rows, then the
        vector's; ``k`` the rank or width) summed over the node's blocks in tree order, or None.
        """
        return self._gram_parts(level, self._mask(entering_bits), self._mask(leaving_bits), on_columns)

    def _gram_parts(self, level: int, entering, leaving, on_columns: bool) -> list:
        basis = self.bases[level]
        k = basis.width if on_columns else basis.rank

        def part(i):
            local = self._local(i)
            rows_in, rows_out = np.flatnonzero(entering[local]), np.flatnonzero(leaving[local])
            if not len(rows_in) and not len(rows_out):
                return None
            out = np.zeros((k + 2, k + 1))
            wide_shape = ((SUB_ROWS, basis.width), np.float64)
            with self.buffers.take(((SUB_ROWS, k + 1), np.float64), ((k + 1, k + 1), np.float64), wide_shape) as (
                Z_all,
                gram,
                wide_all,
            ):  # a chunk's Z in memory, not the block's, and the same arrays for every chunk
                for rows, s in ((rows_in, 1.0), (rows_out, -1.0)):
                    for chunk, columns in self.store.chunks(i, rows):
                        m = len(chunk)
                        y, sw = self.y[local][chunk], np.sqrt(self.cw[local][chunk])
                        Z = Z_all[:m]
                        if on_columns:
                            np.copyto(Z[:, :k], columns[:, :k])
                        else:
                            basis.features(columns, out=Z[:, :k], wide=wide_all[:m])
                        Z[:, k] = 1.0
                        Z *= sw[:, None]
                        np.matmul(Z.T, Z, out=gram)
                        if s > 0:
                            out[: k + 1] += gram
                            out[k + 1] += Z.T @ (sw * y)
                        else:
                            out[: k + 1] -= gram
                            out[k + 1] -= Z.T @ (sw * y)
            return out

        with one_blas_thread():
            return self._tree_sums(part)

    def active_sums(self, level: int, active_bits, beta, bias: float, labels: bool) -> list:
        """``sum_{j in A} c_j (k_j' beta + bias - [y_j]) [k_j, 1]`` per tree node, ``k_j`` the columns of a level.

        With ``labels`` (the ``- y_j``) it is the loss's share of the gradient, without it the
        product of the loss's Hessian with a direction whose column-space coefficients are
        ``beta`` (and bias ``bias``): the conjugate gradients' product, one pass over the active rows'
        columns.  Returns ``[((lo, hi), part)]`` as :meth:`gram_parts`, ``part`` a ``(width + 1,)``
        array (None for a node without active rows).
        """
        return self._active_sums(level, self._mask(active_bits), beta, bias, labels)

    def _active_sums(self, level: int, active, beta, bias: float, labels: bool) -> list:
        width = self.bases[level].width
        beta = np.asarray(beta, dtype=np.float64)

        def part(i):
            local = self._local(i)
            rows = np.flatnonzero(active[local])
            if not len(rows):
                return None
            return self.store.active_sums(i, active[local], beta[:width], bias, self.y[local], self.cw[local], labels)

        with one_blas_thread():
            return self._tree_sums(part)

    def selected_columns(self, level: int, selected_bits) -> np.ndarray:
        """The kernel columns of ``bases[level]`` of the selected rows (``np.packbits`` of the shard's mask), in row
        order, ``(selected, width)`` in double precision."""
        return self._selected_columns(level, self._mask(selected_bits))

    def _selected_columns(self, level: int, selected) -> np.ndarray:
        width = self.bases[level].width

        def part(i):
            rows = np.flatnonzero(selected[self._local(i)])
            return np.asarray(self.columns(i, rows)[:, :width], dtype=np.float64) if len(rows) else None

        parts = [p for p in self._map(part, range(len(self.blocks))) if p is not None]
        return np.vstack(parts) if parts else np.zeros((0, width))

    def direction(self, d, level: int = -1) -> np.ndarray:
        """``F d[:r] + d[r]`` on the shard's rows, ``F`` the features of ``bases[level]``."""
        basis = self.bases[level]
        beta = basis.lift(d[: basis.rank])
        with one_blas_thread():  # one chunk's columns in double at a time
            parts = self._map(lambda i: self.store.times(i, beta, d[basis.rank]), range(len(self.blocks)))
        return np.concatenate(parts) if parts else np.zeros(0)

    # ------------------------------------------------------------------ a Newton solve's state (see .margins)
    def solve_begin(self, log: SolveLog):
        """Start the solve of ``log`` (a rebuilt shard: replay it, with the log its Hessian's rows start from):
        :meth:`_status` at its point (None where no problem is loaded: a rebuilt shard replaying a solve of
        the problem before, whose reload follows)."""
        if self.y is None:
            return None
        if log.from_log is not None and log.from_log.token not in self._masks:
            self._replayed(log.from_log)
        self.solve_ = self._replayed(log)
        return self._status()

    def _replayed(self, log: SolveLog) -> ShardSolve:
        """The state after ``log``'s steps: the same operations as when they were taken, so the same bits."""
        n = self.stop - self.start
        fitted = np.ones(n, dtype=bool) if log.fitted is None else self._mask(log.fitted)
        o = np.zeros(n) if log.start is None else self.direction(log.start, log.level)
        state = ShardSolve(log.token, log.level, fitted, o, None, None)
        state.active = state.margins(self.y)
        synced = state.active if log.synced == 0 else None
        for s, (d, t) in enumerate(log.steps, 1):
            state.o += t * self.direction(d, log.level)
            state.active = state.margins(self.y)
            if log.synced == s:
                synced = state.active
        if synced is not None:
            self._keep_mask(log.token, synced)
        elif log.from_log is not None:
            synced = self._masks[log.from_log.token]
        else:
            synced = np.zeros(n, dtype=bool)
        state.was_active = synced
        if log.pending is not None:
            state.delta = self.direction(log.pending, log.level)
        return state

    def _keep_mask(self, token: int, mask) -> None:
        self._masks[token] = mask
        while len(self._masks) > 4:  # the client starts a solve from one of its last ones
            self._masks.pop(next(iter(self._masks)))

    def _status(self) -> list:
        """Per tree node ``[loss, active rows, rows changed since the Hessian's sums]``: ``sum c h^2`` over the
        fitted rows (``h = max(0, 1 - y o)``), the active rows and those not in ``was_active`` or left it."""
        state = self.solve_

        def part(i):
            local = self._local(i)
            fitted = state.fitted[local]
            h = np.maximum(0.0, 1.0 - self.y[local][fitted] * state.o[local][fitted])
            active, was = state.active[local], state.was_active[local]
            return np.array([np.sum(self.cw[local][fitted] * h * h), np.count_nonzero(active),
                             np.count_nonzero(active != was)])  # fmt: skip

        return self._tree_sums(part)

    def solve_direction(self, d) -> list:
        """Keep the outputs of direction ``d`` (``F d[:r] + d[r]``); :meth:`solve_line` at steps 0 and 1."""
        self.solve_.delta = self.direction(d, self.solve_.level)
        return self.solve_line((0.0, 1.0))

    def solve_line(self, ts) -> list:
        """:func:`~.margins.line_sums` of the fitted rows at the steps ``ts`` per tree node."""
        state = self.solve_

        def part(i):
            local = self._local(i)
            fitted = state.fitted[local]
            y = self.y[local][fitted]
            return line_sums(1.0 - y * state.o[local][fitted], y * state.delta[local][fitted],
                             self.cw[local][fitted], ts)  # fmt: skip

        return self._tree_sums(part)

    def solve_step(self, t: float) -> list:
        """Step ``t`` along the direction: ``o += t F d``; :meth:`_status` there."""
        state = self.solve_
        state.o += t * state.delta
        state.active, state.delta = state.margins(self.y), None
        return self._status()

    def solve_gram(self, on_columns: bool) -> list:
        """:meth:`gram_parts` of the rows that entered or left the active set since the Hessian's sums, which
        then hold the active rows (kept under the solve's token for a solve started from them)."""
        state = self.solve_
        entering, leaving = state.active & ~state.was_active, state.was_active & ~state.active
        parts = self._gram_parts(state.level, entering, leaving, on_columns)
        state.was_active = state.active
        self._keep_mask(state.token, state.active)
        return parts

    def solve_products(self, beta, bias: float, labels: bool) -> list:
        """:meth:`active_sums` over the active rows."""
        return self._active_sums(self.solve_.level, self.solve_.active, beta, bias, labels)

    def solve_sample(self, seed: int, size: int) -> tuple:
        """The ``size`` active rows with the smallest :func:`~.margins.row_keys`: ``(keys, rows, columns, c)``, in
        row order (the client keeps the smallest ``size`` of all shards': a random sample of the active rows, the
        same for any sharding)."""
        state = self.solve_
        rows = np.flatnonzero(state.active)
        keys = row_keys(seed, rows + self.start)
        pick = np.sort(rows[np.lexsort((rows, keys))[:size]])
        chosen = np.zeros(len(state.active), dtype=bool)
        chosen[pick] = True
        columns = self._selected_columns(state.level, chosen)
        return row_keys(seed, pick + self.start), pick + self.start, columns, self.cw[pick]

    def solve_outputs(self, selected_bits) -> np.ndarray:
        """The outputs ``o`` of the selected rows (``np.packbits`` of the shard's mask), in row order."""
        return self.solve_.o[self._mask(selected_bits)]

    def _map(self, fn, items) -> list:
        """``ordered_map`` over the blocks; on a GPU shard one block after the other (the GPU is one device)."""
        return ordered_map(fn, items) if self.store is None or self.store.parallel else [fn(i) for i in items]

    def _mask(self, bits) -> np.ndarray:
        return np.unpackbits(bits, count=self.stop - self.start).astype(bool)

    def _tree_sums(self, part) -> list:
        """``[((lo, hi), sum)]``: ``part(i)`` (an array or None) of the shard's blocks summed per tree node.

        Each node's blocks are computed over the threads a few at a time and
        added pairwise as a binary counter does (the node's tree order), so
        at most a few parts are held at once.  ``part`` returns a new array
        (the sums are made in place, into the left one).
        """
        first = self.start // self.row_block
        batch = max(1, 2 * current_threads())
        out = []
        for lo, hi in dyadic_nodes(first, first + len(self.blocks)):
            stack: list = []  # (level, sum) of completed subtrees, left to right
            for b0 in range(lo, hi, batch):
                for value in self._map(part, range(b0 - first, min(b0 + batch, hi) - first)):
                    level = 0
                    while stack and stack[-1][0] == level:
                        value = _plus(stack.pop()[1], value)
                        level += 1
                    stack.append((level, value))
            out.append(((lo, hi), stack[0][1]))
        return out

    def close(self) -> None:
        self.buffers.clear()
        if self.store is not None:
            self.store.close()
            self.store = None


#: The cost model of a pass over kernel columns that are not in memory (seconds per column entry, one core of the
#: 2-core development box): reading a spilled entry costs its bytes over ``SPILL_READ_RATE`` (bytes per second; the
#: disk read 1.1 GB/s with direct I/O and 0.7 GB/s through the page cache, measured with dd, taken lower for a
#: shared disk); computing one costs ``GROUP_COST`` per feature group (its share of the dot products and the
#: distances), ``EXP_COST`` per Gaussian that is no square of another (the squares cost ``OTHER_COST`` as the
#: polynomials do), as :func:`~mwumkl_dist.kernels.evaluation.combined_kernel` evaluates them.  Measured there (20,000
#: x 1000 entries, one thread): one Gaussian on 8 features 14.8 ns per entry, 6 of them without squares 55 ns,
#: E7's structure (two groups, two chains of three widths) 63 ns.
SPILL_READ_RATE = 5e8
GROUP_COST = 4e-9
EXP_COST = 9e-9
OTHER_COST = 1e-9


def pass_cost(kernel_set: KernelSet, weights, itemsize: int = 4) -> tuple[float, float]:
    """``(spilled, recomputed)``: the estimated seconds per column entry of a pass over spilled columns, and of
    one that computes them again (see :data:`SPILL_READ_RATE`)."""
    groups, exps, others = evaluation_counts(kernel_set, weights)
    return itemsize / SPILL_READ_RATE, groups * GROUP_COST + exps * EXP_COST + others * OTHER_COST


def _plus(a, b):
    """``a + b`` of two block sums, into ``a`` (the same bits; a Newton step's parts are (rank + 2)^2 arrays)."""
    if a is None or b is None:
        return b if a is None else a
    a += b
    return a


def all_traces(kernel_set: KernelSet, X) -> np.ndarray:
    """Traces of every kernel on the rows of ``X``: the block traces of :func:`row_blocks`, summed in order."""
    shard = LinearShard(X, 0, X.shape[0], kernel_set, storage="memory")
    return sum_parts(shard.trace_parts(), len(kernel_set))


def sum_parts(parts, size: int) -> np.ndarray:
    total = np.zeros(size)
    for p in parts:
        total += p
    return total


def _linear_factory(source, kernel_set, row_block: int, storage, device="cpu", columns_budget=None):
    """``rows -> factory`` of the linear stage's shard of rows ``[start, stop)`` of ``source``.

    A store's shards read their rows where they are built; an array's shards are given their rows.
    """

    def factory_for(rows):
        start, stop = rows
        part = source if isinstance(source, DataStore) else source[start:stop]
        return functools.partial(LinearShard, part, start, stop, kernel_set, row_block, storage, device, columns_budget)

    return factory_for


@contextlib.contextmanager
def linear_shards(
    data,
    *,
    engine: str,
    n_shards,
    client=None,
    timeout: float = 600.0,
    call_timeout=None,
    row_block=None,
    storage="auto",
    device="cpu",
    plan=None,
):
    """A shard pool of the linear stage's :class:`LinearShard` of ``data``, ``n_shards`` of them (closed after).

    ``n_shards="auto"``: :func:`~mwumkl_dist.engines.layout.linear_shard_count` (one per Dask worker).  The pool's
    ``layout`` says how many and why.

    Each shard's slot is its row range ``(start, stop)`` (:func:`linear_row_ranges`).
    ``engine="local"``: a :class:`~mwumkl_dist.engines.pool.LocalPool` in this process;
    ``"dask"``: a :class:`~mwumkl_dist.engines.dask_pool.DaskPool` on ``client``'s workers
    (``timeout``, ``call_timeout``: the estimator's ``worker_timeout`` and ``superstep_timeout``),
    each shard reading or being sent its own rows.  Both give the same bits for any shard count.
    ``plan``: the fit's :class:`~mwumkl_dist.solvers.two_stage.budget.MemoryPlan`, which gives each shard the bytes
    of kernel columns it may keep in memory (:meth:`~.budget.MemoryPlan.shard_columns`, :func:`feature_memory_budget`).
    """
    row_block = partition.ROW_BLOCK if row_block is None else int(row_block)
    source = data.store if isinstance(getattr(data, "store", None), DataStore) else data.X
    if n_shards == "auto":  # one per Dask worker, or the local engine's count
        layout = linear_shard_count(engine, data.n_samples, client, row_block)
        n_shards, reason = layout.n_shards, layout.reason
    else:
        reason = f"n_shards={n_shards}" + (" on the Dask workers" if engine == "dask" else " in this process")
    slots = linear_row_ranges(data.n_samples, n_shards, row_block)
    share = None if plan is None else plan.shard_columns(len(slots))
    factory_for = _linear_factory(source, data.kernel_set, row_block, storage, device, share)
    if engine == "dask":
        from mwumkl_dist.engines.dask_pool import DaskPool

        pool = DaskPool(slots, factory_for, client=client, timeout=timeout, call_timeout=call_timeout)
    else:
        pool = LocalPool(slots, factory_for)
    pool.layout = reason
    try:
        yield pool
    finally:
        pool.close()

"""The linear stage's shards: each holds its rows' Nystroem features and answers the Newton solver's calls."""

from __future__ import annotations

import contextlib
import functools
import logging

import numpy as np

from mwumkl_dist.core import partition
from mwumkl_dist.core.partition import linear_row_ranges, row_blocks
from mwumkl_dist.devices.threads import ordered_map
from mwumkl_dist.io.zarr_format import DataStore
from mwumkl_dist.kernels.evaluation import kernel_traces
from mwumkl_dist.kernels.specs import KernelSet
from mwumkl_dist.solvers.two_stage.nystroem import one_blas_thread
from mwumkl_dist.solvers.two_stage.spill import FeatureBlocks, feature_memory_budget, scratch_dir

__all__ = [
    "all_traces",
    "LinearShard",
    "LocalShards",
    "LinearStageProblem",
    "linear_shards",
    "GivenFeatures",
    "sum_parts",
]

logger = logging.getLogger("mwumkl_dist")


class GivenFeatures:
    """The rows are the features themselves (:func:`fit_squared_hinge` on an array)."""

    def __init__(self, rank: int):
        self.rank = rank

    def features(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float64)


class LinearShard:
    """Rows ``[start, stop)`` of the linear stage: their features of one binary problem's combined kernel.

    ``rows`` are the shard's rows (an array or CSR matrix, its row 0 being row
    ``start``) or a :class:`~mwumkl_dist.stores.DataStore`, read block by block
    and never held whole.  The rows are cut into the fixed blocks of
    :func:`row_blocks` (``start`` is a multiple of ``row_block``), so every
    sharding evaluates the same blocks with the same operations: the driver
    sums their parts in row order and gets the same bits for any sharding.
    Features are held in memory, or spilled to a temporary file when they
    exceed :func:`feature_memory_budget` where the shard is built (``spill="auto"``; True/False force it).
    The shard keeps no iteration state (the active rows come with each call),
    so a lost shard is rebuilt by loading its problem again.
    """

    #: What the Dask engine's shard servers may call.
    REMOTE_METHODS = frozenset({"trace_parts", "load_problem", "active_parts", "direction"})

    def __init__(self, rows, start: int, stop: int, kernel_set=None, row_block: int | None = None, spill="auto"):
        row_block = partition.ROW_BLOCK if row_block is None else int(row_block)
        if start % row_block:
            raise ValueError(f"a linear-stage shard starts on a row block ({row_block} rows), not at row {start}")
        self.rows, self.start, self.stop = rows, int(start), int(stop)
        self.kernel_set = kernel_set
        self.blocks = row_blocks(self.start, self.stop, row_block)
        self.spill = spill
        # Where it is built: on a Dask worker's task thread (its calls later run on the shard server's thread,
        # which cannot see the worker's memory limit or local directory).
        self._budget, self._scratch = feature_memory_budget(), scratch_dir()
        self.features_: FeatureBlocks | None = None
        self.y = self.cw = None

    def _read(self, lo: int, hi: int):
        if isinstance(self.rows, DataStore):
            return self.rows.read_rows(lo, hi)
        return self.rows[lo - self.start : hi - self.start]

    def _local(self, i: int) -> slice:
        lo, hi = self.blocks[i]
        return slice(lo - self.start, hi - self.start)

    def trace_parts(self) -> list:
        """Every kernel's trace on each block (summed by the driver in row order)."""
        return ordered_map(lambda b: kernel_traces(self.kernel_set, self._read(*b)), self.blocks)

    def load_problem(self, feature_map, y, cw) -> bool:
        """Compute the rows' features under ``feature_map`` (``.rank``, ``.features(X)``); labels +-1, ``C c_j``.

        Returns whether the features were spilled to disk.
        """
        self.close()
        sizes = [hi - lo for lo, hi in self.blocks]
        nbytes = sum(sizes) * feature_map.rank * 8
        spill = self.spill is True or (self.spill == "auto" and nbytes > self._budget)
        self.features_ = FeatureBlocks(sizes, feature_map.rank, self._scratch if spill else None)
        self.y = np.asarray(y, dtype=np.float64)
        self.cw = np.asarray(cw, dtype=np.float64)

        def build(i):
            self.features_.put(i, feature_map.features(self._read(*self.blocks[i])))

        with one_blas_thread():
            ordered_map(build, range(len(self.blocks)))
        return self.features_.spilled

    def active_parts(self, active_bits) -> list:
        """Per block, ``(Z_A' D Z_A, Z_A' D y_A)`` over its active rows (``Z = [F, 1]``, ``D = diag(C c)``), or None.

        ``active_bits``: ``np.packbits`` of the shard's active-row mask.
        """
        active = np.unpackbits(active_bits, count=self.stop - self.start).astype(bool)
        r = self.features_.rank

        def part(i):
            rows = np.flatnonzero(active[self._local(i)])
            if not len(rows):
                return None
            F = self.features_.get(i)
            y, cw = self.y[self._local(i)][rows], self.cw[self._local(i)][rows]
            sw = np.sqrt(cw)
            Z = np.empty((len(rows), r + 1))
            Z[:, :r] = F[rows]
            Z[:, r] = 1.0
            Z *= sw[:, None]
            return Z.T @ Z, Z.T @ (sw * y)

        with one_blas_thread():
            return ordered_map(part, range(len(self.blocks)))

    def direction(self, d) -> np.ndarray:
        """``F d[:r] + d[r]`` on the shard's rows."""
        r = self.features_.rank
        with one_blas_thread():
            parts = ordered_map(lambda i: self.features_.get(i) @ d[:r] + d[r], range(len(self.blocks)))
        return np.concatenate(parts) if parts else np.zeros(0)

    def close(self) -> None:
        if self.features_ is not None:
            self.features_.close()
            self.features_ = None


class LocalShards:
    """Linear-stage shards in this process, with the Dask engine's ``map`` (the same calls, the same bits)."""

    def __init__(self, shards):
        self.shards = list(shards)
        self.restore = None  # the Dask engine's rebuild hook; nothing is lost here

    def map(self, method: str, args_for=None, shared: bool = False) -> list:
        """``shard.method(*args_for((start, stop)))`` on every shard, the results in row order."""
        return [getattr(s, method)(*(args_for((s.start, s.stop)) if args_for else ())) for s in self.shards]

    def close(self) -> None:
        for s in self.shards:
            s.close()


class LinearStageProblem:
    """The linear stage of a training input as a problem for :class:`~mwumkl_dist.engines.dask.DaskEngine`.

    Its shards are :class:`LinearShard`; a store's shards read their rows on
    their workers, an array's shards are sent their rows.
    """

    n_kernels = 1  # the engine's kernel axis is not used

    def __init__(self, data, row_block: int = partition.ROW_BLOCK, spill="auto"):
        self.source = data.store if isinstance(getattr(data, "store", None), DataStore) else data.X
        self.n_samples = data.n_samples
        self.kernel_set = data.kernel_set
        self.row_block = row_block
        self.spill = spill

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        return linear_row_ranges(self.n_samples, n_shards, self.row_block)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return [(0, 1)]

    def shard_factory(self, start: int, stop: int, kernels=None):
        rows = self.source if isinstance(self.source, DataStore) else self.source[start:stop]
        return functools.partial(LinearShard, rows, start, stop, self.kernel_set, self.row_block, self.spill)

    def make_shard(self, start: int, stop: int, kernels=None) -> LinearShard:
        return self.shard_factory(start, stop, kernels)()


def all_traces(kernel_set: KernelSet, X) -> np.ndarray:
    """Traces of every kernel on the rows of ``X``: the block traces of :func:`row_blocks`, summed in order."""
    shard = LinearShard(X, 0, X.shape[0], kernel_set, spill=False)
    return sum_parts(shard.trace_parts(), len(kernel_set))


def sum_parts(parts, size: int) -> np.ndarray:
    total = np.zeros(size)
    for p in parts:
        total += p
    return total


@contextlib.contextmanager
def linear_shards(estimator, data, client=None, row_block: int | None = None, spill="auto"):
    """The linear stage's shards of ``data`` (``estimator.n_shards`` of them) on the estimator's engine.

    Local: :class:`LocalShards` in this process; ``engine="dask"``: a
    :class:`~mwumkl_dist.engines.dask.DaskEngine` of :class:`LinearShard` on
    ``client``'s workers (each shard reads or is sent its own rows).  Both give
    the same bits for any shard count.
    """
    row_block = partition.ROW_BLOCK if row_block is None else int(row_block)
    problem = LinearStageProblem(data, row_block, spill)
    if getattr(estimator, "engine", "local") == "dask":
        from mwumkl_dist.engines.dask import DaskEngine
        from mwumkl_dist.solvers.driver import DEFAULT_WORKER_TIMEOUT

        timeout = getattr(estimator, "worker_timeout", DEFAULT_WORKER_TIMEOUT)
        shards = DaskEngine(problem, client, n_shards=estimator.n_shards, n_kernel_shards=1, timeout=timeout)
    else:
        shards = LocalShards(problem.make_shard(*rows) for rows in problem.row_ranges(estimator.n_shards))
    try:
        yield shards
    finally:
        shards.close()

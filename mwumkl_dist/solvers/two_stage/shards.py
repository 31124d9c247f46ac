"""The linear stage's shards: each holds its rows' Nystroem features and answers the Newton solver's calls."""

from __future__ import annotations

import contextlib
import functools
import logging

import numpy as np

from mwumkl_dist.core import partition
from mwumkl_dist.core.partition import linear_row_ranges, row_blocks
from mwumkl_dist.devices.threads import ordered_map
from mwumkl_dist.engines.pool import LocalPool
from mwumkl_dist.io.zarr_format import DataStore
from mwumkl_dist.kernels.evaluation import kernel_traces
from mwumkl_dist.kernels.specs import KernelSet
from mwumkl_dist.solvers.two_stage.nystroem import one_blas_thread
from mwumkl_dist.solvers.two_stage.spill import FeatureBlocks, feature_memory_budget, scratch_dir

__all__ = [
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


def all_traces(kernel_set: KernelSet, X) -> np.ndarray:
    """Traces of every kernel on the rows of ``X``: the block traces of :func:`row_blocks`, summed in order."""
    shard = LinearShard(X, 0, X.shape[0], kernel_set, spill=False)
    return sum_parts(shard.trace_parts(), len(kernel_set))


def sum_parts(parts, size: int) -> np.ndarray:
    total = np.zeros(size)
    for p in parts:
        total += p
    return total


def _linear_factory(source, kernel_set, row_block: int, spill):
    """``rows -> factory`` of the linear stage's shard of rows ``[start, stop)`` of ``source``.

    A store's shards read their rows where they are built; an array's shards are given their rows.
    """

    def factory_for(rows):
        start, stop = rows
        part = source if isinstance(source, DataStore) else source[start:stop]
        return functools.partial(LinearShard, part, start, stop, kernel_set, row_block, spill)

    return factory_for


@contextlib.contextmanager
def linear_shards(
    data,
    *,
    engine: str,
    n_shards: int,
    client=None,
    timeout: float = 600.0,
    call_timeout=None,
    row_block=None,
    spill="auto",
):
    """A shard pool of the linear stage's :class:`LinearShard` of ``data``, ``n_shards`` of them (closed after).

    Each shard's slot is its row range ``(start, stop)`` (:func:`linear_row_ranges`).
    ``engine="local"``: a :class:`~mwumkl_dist.engines.pool.LocalPool` in this process;
    ``"dask"``: a :class:`~mwumkl_dist.engines.dask_pool.DaskPool` on ``client``'s workers
    (``timeout``, ``call_timeout``: the estimator's ``worker_timeout`` and ``superstep_timeout``),
    each shard reading or being sent its own rows.  Both give the same bits for any shard count.
    """
    row_block = partition.ROW_BLOCK if row_block is None else int(row_block)
    source = data.store if isinstance(getattr(data, "store", None), DataStore) else data.X
    slots = linear_row_ranges(data.n_samples, n_shards, row_block)
    factory_for = _linear_factory(source, data.kernel_set, row_block, spill)
    if engine == "dask":
        from mwumkl_dist.engines.dask_pool import DaskPool

        pool = DaskPool(slots, factory_for, client=client, timeout=timeout, call_timeout=call_timeout)
    else:
        pool = LocalPool(slots, factory_for)
    try:
        yield pool
    finally:
        pool.close()

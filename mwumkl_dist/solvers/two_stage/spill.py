"""Where a linear-stage shard keeps its kernel columns: in memory, or spilled to a temporary file past its budget."""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np

from mwumkl_dist.devices.memory import AUTO_MEMORY, WORKER_SHARE
from mwumkl_dist.devices.threads import dask_worker

__all__ = [
    "FeatureBlocks",
    "feature_memory_budget",
    "scratch_dir",
]

logger = logging.getLogger("mwumkl_dist")


def feature_memory_budget(columns_budget: int | None = None) -> int:
    """Bytes a shard may hold its kernel columns in before it spills them to disk or computes them again (see
    :class:`LinearShard`).

    ``MWUMKL_FEATURE_MEMORY`` (bytes) when set; else ``columns_budget``, the shard's budget in the fit's
    :func:`~mwumkl_dist.solvers.two_stage.budget.memory_plan` (on Dask its worker's, from the worker's memory),
    capped on a Dask worker by :data:`~mwumkl_dist.devices.memory.WORKER_SHARE` of its ``memory_limit`` (Dask
    pauses a worker at 80 % of it).  Never the memory that happens to be free when the shard is built: two fits
    started together would both count it as theirs.  Without a budget (a shard built outside a fit):
    :data:`AUTO_MEMORY`.  Call it on the worker's task thread (:class:`LinearShard` does, when it is built).
    """
    env = os.environ.get("MWUMKL_FEATURE_MEMORY")
    if env:
        return int(float(env))
    budget = AUTO_MEMORY if columns_budget is None else int(columns_budget)
    limit = getattr(getattr(dask_worker(), "memory_manager", None), "memory_limit", None)
    if limit:
        budget = min(budget, int(WORKER_SHARE * limit))
    return budget


def scratch_dir() -> str:
    """Where spilled features go: ``MWUMKL_SCRATCH``, a Dask worker's local directory, or the temp directory."""
    return os.environ.get("MWUMKL_SCRATCH") or getattr(dask_worker(), "local_directory", None) or tempfile.gettempdir()


class FeatureBlocks:
    """A shard's feature blocks (of ``dtype``), in memory or spilled to an (unlinked) temporary file read back
    block by block.

    Spilled, the shard's memory holds one block per thread at a time; the file
    vanishes when it is closed, or with the process.
    """

    def __init__(self, sizes, rank: int, spill_dir: str | None = None, dtype=np.float64):
        self.sizes = [int(s) for s in sizes]
        self.rank = int(rank)
        self.dtype = np.dtype(dtype)
        self._blocks: list = [None] * len(self.sizes)
        self._fd = None
        if spill_dir is not None:
            fd, path = tempfile.mkstemp(prefix="mwumkl-features-", suffix=f".{self.dtype.str[1:]}", dir=spill_dir)
            os.unlink(path)
            self._fd = fd
            self._offsets = np.concatenate(([0], np.cumsum(self.sizes))) * self.rank * self.dtype.itemsize

    @property
    def spilled(self) -> bool:
        return self._fd is not None

    @property
    def nbytes(self) -> int:
        return sum(self.sizes) * self.rank * self.dtype.itemsize

    def put(self, i: int, F: np.ndarray) -> None:
        if self._fd is None:
            self._blocks[i] = np.ascontiguousarray(F, dtype=self.dtype)
            return
        view = memoryview(np.ascontiguousarray(F, dtype=self.dtype)).cast("B")
        offset, done = int(self._offsets[i]), 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], offset + done)

    def get(self, i: int, out=None) -> np.ndarray:
        """Block ``i`` (spilled: read into ``out`` where given, of the block's shape and dtype)."""
        if self._fd is None:
            return self._blocks[i]
        if out is None:
            out = np.empty((self.sizes[i], self.rank), dtype=self.dtype)
        view = memoryview(out).cast("B")
        offset, done = int(self._offsets[i]), 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"spilled features: short read in block {i}")
            done += got
        return out

    def release(self, i: int) -> None:
        """Drop block ``i`` from memory (read for the last time: an extension's copy frees the old columns as it
        goes, so the shard never holds both levels' columns whole)."""
        self._blocks[i] = None

    def close(self) -> None:
        self._blocks = [None] * len(self.sizes)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

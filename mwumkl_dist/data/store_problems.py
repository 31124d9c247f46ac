"""Problems that fit from a store: each shard reads its own rows (or kernel columns) where it runs.

:class:`DataStoreProblem` (features from a :class:`~mwumkl_dist.stores.DataStore`,
with a kernel set, a random bank's included) and :class:`KernelStoreProblem` (precomputed
kernels from a :class:`~mwumkl_dist.stores.KernelStore`) implement
:class:`mwumkl_dist.data.problems.Problem`; their shard factories are small picklable
callables (a store path and a row range), so the data never pass through the
driver.  A :class:`KernelStoreShard` reads the two kernel columns a superstep
needs through a bounded LRU :class:`ColumnCache`.

Fitting from a store (the driver reads only the labels)::

    clf = MWUMKLClassifier(kernels="paper", engine="dask", n_shards=4).fit(DataStore("train.zarr"))
    clf = MWUMKLClassifier(kernels="precomputed").fit(KernelStore("kernels.zarr", cache_bytes=2**28))
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import numpy as np

from mwumkl_dist.core.partition import chain_safe_ranges
from mwumkl_dist.data.shards import FeatureShard, PrecomputedShard, ShardBase
from mwumkl_dist.io.zarr_format import DEFAULT_CACHE_BYTES, DataStore, KernelStore
from mwumkl_dist.kernels.evaluation import SparsePoint, as_csr, point_kernel_block
from mwumkl_dist.kernels.specs import KernelSet

__all__ = [
    "ColumnCache",
    "merge_cache_stats",
    "DataStoreProblem",
    "KernelStoreProblem",
    "KernelStoreShard",
]


class ColumnCache:
    """A bounded LRU cache of kernel columns (by global column index).

    Parameters
    ----------
    max_bytes : int
        Largest total size of the cached columns; at least one column is kept.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES):
        self.max_bytes = int(max_bytes)
        self._data: OrderedDict[int, np.ndarray] = OrderedDict()
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0
        self.bytes_read = 0
        self.peak_bytes = 0

    def get(self, j: int, load) -> np.ndarray:
        col = self._data.get(j)
        if col is not None:
            self.hits += 1
            self._data.move_to_end(j)
            return col
        self.misses += 1
        col = load(j)
        self.bytes_read += col.nbytes
        self._data[j] = col
        self.nbytes += col.nbytes
        while self.nbytes > self.max_bytes and len(self._data) > 1:
            _, old = self._data.popitem(last=False)
            self.nbytes -= old.nbytes
            self.evictions += 1
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        return col

    def stats(self) -> dict:
        total = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "hit_rate": self.hits / total if total else 0.0,
            "bytes_read": self.bytes_read,
            "cache_peak_bytes": self.peak_bytes,
            "cache_max_bytes": self.max_bytes,
        }


def merge_cache_stats(stats) -> dict | None:
    """Add up per-shard cache counters (``None`` when no shard keeps a cache)."""
    stats = [s for s in stats if s and "hits" in s]
    if not stats:
        return None
    out = {k: sum(s[k] for s in stats) for k in ("hits", "misses", "evictions", "bytes_read")}
    total = out["hits"] + out["misses"]
    out["hit_rate"] = out["hits"] / total if total else 0.0
    out["cache_peak_bytes"] = max(s["cache_peak_bytes"] for s in stats)
    out["cache_max_bytes"] = max(s["cache_max_bytes"] for s in stats)
    out["n_shards"] = len(stats)
    return out


def _feature_shard_from_store(store: DataStore, start, stop, y, plan):
    return FeatureShard(store.read_rows(start, stop), y, start, plan)


class DataStoreProblem:
    """A binary problem on a :class:`DataStore`: shards read their own rows (on their worker).

    ``kernels`` is a :class:`KernelSet` (a random bank's plan pickles as the
    bank: each worker rebuilds it).
    """

    def __init__(self, store: DataStore, y, kernels: KernelSet):
        self.store = store
        self.y = np.asarray(y, dtype=np.float64)
        if len(self.y) != store.n_samples:
            raise ValueError(f"{store.path}: {store.n_samples} rows but {len(self.y)} labels")
        self.n_samples = store.n_samples
        self.kernel_set = kernels
        self.n_kernels = len(kernels)

    def _plan(self, kernels):
        if kernels is None:
            return self.kernel_set.plan
        return self.kernel_set.block_plan(kernels[0], kernels[1])

    def shard_factory(self, start: int, stop: int, kernels=None):
        """A picklable zero-argument callable that reads rows ``[start, stop)`` where it runs."""
        y = self.y[start:stop].copy()
        return functools.partial(_feature_shard_from_store, self.store, start, stop, y, self._plan(kernels))

    def make_shard(self, start: int, stop: int, kernels=None):
        return self.shard_factory(start, stop, kernels)()

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        return self.store.row_ranges(n_shards)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return chain_safe_ranges(self.kernel_set.plan.square_of, n_blocks)

    def kernel_block(self, p, q):
        return point_kernel_block(self.kernel_set.plan, p, q)

    def point(self, j: int) -> SparsePoint:
        return SparsePoint.from_csr_row(as_csr(self.store.read_rows(j, j + 1)), 0)


class KernelStoreShard(PrecomputedShard):
    """Rows ``[row_offset, row_offset + n_rows)`` x kernels ``[k0, k1)`` of a :class:`KernelStore`.

    A :class:`~mwumkl_dist.data.shards.PrecomputedShard` (same superstep, same
    numbers) whose columns come from the store through a :class:`ColumnCache`
    instead of from an array in memory; it holds only its ``V`` block, its
    diagonal and the cached columns.
    """

    def __init__(self, store: KernelStore, y, row_offset: int, kernels: tuple[int, int] | None = None):
        k0, k1 = (0, store.n_kernels) if kernels is None else (int(kernels[0]), int(kernels[1]))
        ShardBase.__init__(self, y, row_offset, k1 - k0)
        self.K = None  # nothing in memory: see _column
        self.store = store
        self.rows = (self.row_offset, self.row_offset + self.n_rows)
        self.kernels = (k0, k1)
        self.cache = ColumnCache(store.cache_bytes)
        self._diag = store.read_diag(self.rows, self.kernels)

    def diagonal(self) -> np.ndarray:
        return self._diag

    def _load(self, j: int) -> np.ndarray:
        return self.store.read_columns(j, self.rows, self.kernels)

    def _column(self, j: int) -> np.ndarray:
        return self.cache.get(int(j), self._load)

    def stats(self) -> dict:
        return self.cache.stats()


class KernelStoreProblem:
    """A binary problem on a :class:`KernelStore` (``kernels="precomputed"``)."""

    def __init__(self, store: KernelStore, y):
        self.store = store
        self.y = np.asarray(y, dtype=np.float64)
        if len(self.y) != store.n_samples:
            raise ValueError(f"{store.path}: {store.n_samples} rows but {len(self.y)} labels")
        self.n_samples = store.n_samples
        self.n_kernels = store.n_kernels
        self._diag = None

    def shard_factory(self, start: int, stop: int, kernels=None):
        return functools.partial(KernelStoreShard, self.store, self.y[start:stop].copy(), start, kernels)

    def make_shard(self, start: int, stop: int, kernels=None) -> KernelStoreShard:
        return self.shard_factory(start, stop, kernels)()

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        return self.store.row_ranges(n_shards)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return self.store.kernel_ranges(n_blocks)

    def kernel_block(self, p, q):
        p, q = int(p), int(q)
        if self._diag is None:  # (n, m): small next to K; read once
            self._diag = self.store.read_diag((0, self.n_samples), (0, self.n_kernels))
        kpq = self.store.read_columns(q, (p, p + 1), (0, self.n_kernels))[0]  # K_i[p, q]: column q, row p
        return self._diag[p].copy(), self._diag[q].copy(), kpq

    def point(self, j: int) -> int:
        return int(j)

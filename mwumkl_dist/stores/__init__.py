"""Zarr stores: training data and precomputed kernels larger than memory.

* :mod:`mwumkl_dist.io.zarr_format`: the Zarr layout; writing, opening,
  validating and reading data and kernel stores;
* :mod:`mwumkl_dist.data.store_problems`: the training problems that fit from a
  store (shards read their own rows where they run), and the kernel-column cache.

See :mod:`mwumkl_dist.io.zarr_format` for the layout.
"""

from mwumkl_dist.core.partition import aligned_ranges
from mwumkl_dist.data.store_problems import (
    ColumnCache,
    DataStoreProblem,
    KernelStoreProblem,
    KernelStoreShard,
    merge_cache_stats,
)
from mwumkl_dist.io.zarr_format import (
    DATA_FORMAT,
    DEFAULT_CACHE_BYTES,
    KERNEL_FORMAT,
    STORE_VERSION,
    DataStore,
    KernelStore,
    StoreError,
    as_store,
    open_data_store,
    open_kernel_store,
    open_store,
    write_data_store,
    write_kernel_store,
)

__all__ = [
    "StoreError",
    "DataStore",
    "KernelStore",
    "ColumnCache",
    "open_store",
    "open_data_store",
    "open_kernel_store",
    "write_data_store",
    "write_kernel_store",
    "DataStoreProblem",
    "KernelStoreProblem",
    "KernelStoreShard",
    "as_store",
    "aligned_ranges",
    "merge_cache_stats",
    "DATA_FORMAT",
    "KERNEL_FORMAT",
    "STORE_VERSION",
    "DEFAULT_CACHE_BYTES",
]

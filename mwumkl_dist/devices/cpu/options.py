"""The options every numba kernel of :mod:`mwumkl_dist.devices.cpu` is compiled with.

Part of :mod:`mwumkl_dist.devices.cpu` (see its docstring for how the kernels are fast and exact).
"""

from __future__ import annotations

__all__ = []

_CACHE = True
# error_model="numpy": no Python zero-division checks in the loops, so they vectorise.
# nogil: shards run by threads (a Dask worker's) compute concurrently.
_OPTS = {"cache": _CACHE, "error_model": "numpy", "nogil": True}

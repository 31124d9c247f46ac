"""The GPU itself: whether ``numba.cuda`` is usable here, its free memory, and the device kernels loaded once.

Part of :mod:`mwumkl_dist.data.cuda` (see its docstring for the numbers and the memory).
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["DeviceMemoryError", "check_device", "device_memory", "gpu_available", "numpy_compat"]

_INSTALL = "pip install 'mwumkl_dist[gpu]' (numba-cuda) and an NVIDIA driver"


class DeviceMemoryError(MemoryError):
    """A shard (or a prediction block) does not fit in the GPU's free memory."""


def numpy_compat(numpy=np) -> bool:
    """Give numpy back ``np.row_stack`` (an alias of ``np.vstack``) where it lacks it; True if it did.

    numpy 2.5 removed ``row_stack`` (deprecated since 2.0); numba-cuda releases that predate it still name it
    when ``numba.cuda`` is imported, and the import fails with ``AttributeError``.  The alias is the function
    numpy itself had under that name, so nothing computes differently.  Called before ``numba.cuda`` is first
    imported (:func:`check_device`).
    """
    name = "row_" + "stack"  # spelt out of parts: linters rewrite the name itself into vstack
    if hasattr(numpy, name):
        return False
    setattr(numpy, name, numpy.vstack)
    return True


def check_device():
    """The ``numba.cuda`` module, once CUDA is usable here; else a :class:`RuntimeError` naming what is missing."""
    numpy_compat()
    try:
        from numba import cuda
    except (ImportError, AttributeError) as exc:  # numba without its CUDA target, or an import error in it
        raise RuntimeError(f"device='cuda' needs numba's CUDA support (numba-cuda), which cannot be imported: {exc}; "
                           f"{_INSTALL}") from exc  # fmt: skip
    try:
        available = cuda.is_available()
    except Exception as exc:  # pragma: no cover - driver errors
        raise RuntimeError(f"device='cuda': the CUDA driver failed ({exc}); {_INSTALL}") from exc
    if not available:
        raise RuntimeError(
            "device='cuda' but no usable CUDA GPU: numba.cuda.is_available() is False (no NVIDIA GPU or driver "
            f"here, or the CUDA libraries numba-cuda needs are missing); {_INSTALL}, or use device='cpu'"
        )
    return cuda


def gpu_available() -> bool:
    """Whether :func:`check_device` passes here (a GPU and numba's CUDA support, or the simulator)."""
    try:
        check_device()
    except RuntimeError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _kernels():
    check_device()
    from mwumkl_dist.data.cuda import kernels as _cuda_kernels

    return _cuda_kernels


def device_memory() -> tuple[float, float]:
    """``(free, total)`` bytes of the current GPU (``inf`` where unknown, e.g. under the simulator)."""
    cuda = check_device()
    try:
        free, total = cuda.current_context().get_memory_info()
    except Exception:  # pragma: no cover - a driver without the query
        return math.inf, math.inf
    return float(free), float(total)


def _size(n: float) -> str:
    if not math.isfinite(n):
        return "unknown"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _check_fits(need: int, what: str) -> None:
    free, total = device_memory()
    # Leave a margin for the CUDA context's own allocations and fragmentation.
    if need > 0.95 * free:
        raise DeviceMemoryError(
            f"{what} needs about {_size(need)} of GPU memory but the GPU has {_size(free)} free "
            f"(of {_size(total)}): use more row shards (n_shards) or kernel blocks (n_kernel_shards) "
            "spread over several GPUs (Dask GPU workers), or device='cpu'"
        )

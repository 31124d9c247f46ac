"""The kernels' threads: how many a call gets (:func:`threads_for`) and numba's thread mask around a parallel call
(:func:`parallel`).

Part of :mod:`mwumkl_dist.devices.cpu` (see its docstring for how the kernels are fast and exact).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numba

from mwumkl_dist.devices import threads

__all__ = ["threads_for", "parallel", "PARALLEL_MIN_WORK"]

#: A call is split over threads only with at least this much work (rows x kernels) per thread.
PARALLEL_MIN_WORK = 32768

# The thread state and policy (``thread_limit``, ``set_num_threads``, ``get_num_threads``: numba-style
# names of :func:`~mwumkl_dist.devices.threads.limit_threads`, ``set_num_threads`` and
# ``current_threads``) live in :mod:`mwumkl_dist.devices.threads`, which knows numba's pool size
# through the ``register_pool`` below.  Numba's own thread mask is thread-local: :func:`parallel` sets
# it around each parallel call so the cap really holds.
#
# _PARALLEL_LOCK: numba's "workqueue" threading layer (used when neither TBB nor OpenMP is
# available) aborts the process when two Python threads launch parallel regions at once
# (e.g. several shards on the threads of one Dask worker).  Under that layer (and before
# the layer is known) a parallel call first takes this lock without blocking; a busy lock
# means "run on this thread" (same numbers, results never depend on the thread count).
# Under "omp" and "tbb" concurrent launches are safe and no lock is taken.
_PARALLEL_LOCK = threading.Lock()
_LAYER: list = []  # the threading layer once known


def _pool_size() -> int:
    return int(numba.config.NUMBA_NUM_THREADS)


threads.register_pool(_pool_size)


def threads_for(work: int) -> int:
    """Threads for a call of ``work`` units (rows x kernels): at least PARALLEL_MIN_WORK each."""
    return max(1, min(threads.current_threads(), int(work) // max(1, PARALLEL_MIN_WORK)))


def _needs_lock() -> bool:
    if not _LAYER:
        try:
            _LAYER.append(numba.threading_layer())
        except ValueError:  # no parallel region has run yet
            return True
    return _LAYER[0] == "workqueue"


@contextmanager
def parallel(n_threads: int):
    """Yields the tasks' chunk count (1: run serially); numba's thread mask is set for the block.

    The mask gets ``min(n_threads, pool size)`` threads (a chunk count above
    the pool, which only tests ask for, runs several chunks per thread).
    """
    if n_threads <= 1:
        yield 1
        return
    locked = _needs_lock()
    if locked and not _PARALLEL_LOCK.acquire(blocking=False):
        yield 1
        return
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(n_threads, _pool_size()))
        yield n_threads
    finally:
        numba.set_num_threads(before)
        if locked:
            _PARALLEL_LOCK.release()

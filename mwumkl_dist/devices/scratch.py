"""Work arrays a pass reuses from chunk to chunk and from pass to pass (:class:`ScratchBuffers`).

Why: a pass over a shard's kernel columns widens each chunk of rows to double precision, projects it, forms its
Gram matrix: megabytes of temporaries per chunk, thousands of chunks per fit.  Where the C library returns every
freed block to the system at once, each such temporary is a fresh mapping, its pages zeroed and faulted in again:
Dask's nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (glibc then maps every block over 128 KiB
afresh), and under it a pass over kept columns took ten times as long (0.65 against 0.06 s for 500,000 x 536
single-precision columns on two threads; a Dask fit of 10^6 rows spent 29 of its 84 s there).  Taken from here, a
pass allocates nothing of its rows' size after the first.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

__all__ = ["ScratchBuffers"]

#: Arrays taken together start on this many bytes (a cache line; BLAS reads aligned rows faster).
ALIGN = 64


class ScratchBuffers:
    """A pool of reusable byte buffers: :meth:`take` lends arrays of the asked shapes, given back at the ``with``'s
    end.

    A buffer is lent to one taker at a time (each thread takes its own); a request gets the smallest free buffer it
    fits in, else a new one (and the largest free one too small for it is dropped), so the pool holds about as
    many buffers as were ever lent at once, a few chunks' worth, kept while the owner (a shard's columns) lives.
    The arrays' contents are whatever the last taker left.
    """

    def __init__(self):
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def take(self, *specs):
        """Arrays of ``specs`` (each ``(shape, dtype)``), uninitialised, valid inside the ``with`` only."""
        specs = [(tuple(np.atleast_1d(shape).tolist()), np.dtype(dtype)) for shape, dtype in specs]
        sizes = [-(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // ALIGN) * ALIGN for shape, dtype in specs]
        need = sum(sizes) + ALIGN
        with self._lock:  # the smallest that fits; none: a new one, and the largest too small is dropped
            fits = [k for k, b in enumerate(self._free) if b.nbytes >= need]
            if fits:
                buffer = self._free.pop(min(fits, key=lambda k: self._free[k].nbytes))
            else:
                buffer = None
                if self._free:  # requests grow with the rank: the pool holds one buffer per taker in flight
                    self._free.pop(max(range(len(self._free)), key=lambda k: self._free[k].nbytes))
        if buffer is None:
            buffer = np.empty(need, dtype=np.uint8)
        try:
            offset = -buffer.ctypes.data % ALIGN
            arrays = []
            for (shape, dtype), size in zip(specs, sizes):
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                arrays.append(buffer[offset : offset + nbytes].view(dtype).reshape(shape))
                offset += size
            yield arrays[0] if len(arrays) == 1 else arrays
        finally:
            with self._lock:
                self._free.append(buffer)

    @property
    def nbytes(self) -> int:
        """The bytes the pool holds now (buffers lent out not counted)."""
        with self._lock:
            return sum(b.nbytes for b in self._free)

    def clear(self) -> None:
        """Drop every buffer not lent out."""
        with self._lock:
            self._free.clear()

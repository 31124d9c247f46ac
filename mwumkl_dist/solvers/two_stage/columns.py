"""A CPU linear-stage shard's kernel columns (:class:`HostColumns`): the same interface as a GPU shard's
(:class:`~mwumkl_dist.data.cuda.columns.DeviceColumns`, its back-end's ``column_store``), so the shard's passes do
not ask where its columns are."""

from __future__ import annotations

import contextlib

import numpy as np

from mwumkl_dist.devices.scratch import ScratchBuffers
from mwumkl_dist.solvers.two_stage.spill import FeatureBlocks

__all__ = ["SUB_ROWS", "HostColumns"]

#: Rows of a block a pass widens to double precision at a time (fixed, so the sums' order, hence their bits, do not
#: depend on the sharding): one chunk of columns per thread, not the block's (8192 x 4096 doubles are 268 MB).
SUB_ROWS = 1024


class HostColumns:
    """A CPU shard's kernel columns per row block: kept (``stored``: in memory or spilled to a file,
    :class:`~mwumkl_dist.solvers.two_stage.spill.FeatureBlocks`) or computed again from the rows at every pass
    (``stored`` None).  ``sizes``: the blocks' rows; ``read(i)``: block ``i``'s rows; ``compute(X)``: their
    columns as the shard keeps them.  Every way gives the same bits."""

    #: The blocks' passes may run over the threads (a GPU's run one after the other).
    parallel = True

    def __init__(self, sizes, read, compute, stored: FeatureBlocks | None = None,
                 buffers: ScratchBuffers | None = None):  # fmt: skip
        self.sizes, self.read, self.compute, self.stored = list(sizes), read, compute, stored
        #: The passes' chunk-sized work arrays (:mod:`~mwumkl_dist.devices.scratch`: no allocation per chunk; a
        #: shard's own pool, shared with its other passes).
        self.buffers = ScratchBuffers() if buffers is None else buffers

    def kept(self, dtype) -> FeatureBlocks | None:
        """The stored columns a load of more landmarks in ``dtype`` keeps (None: none)."""
        return self.stored if self.stored is not None and self.stored.dtype == np.dtype(dtype) else None

    def host(self, i: int, rows=None) -> np.ndarray:
        """Block ``i``'s columns (``rows``: only those, local indices)."""
        if self.stored is not None:
            block = self.stored.get(i)
            return block if rows is None else block[rows]
        X = self.read(i)
        return self.compute(X if rows is None else X[rows])

    def chunks(self, i: int, rows):
        """``(chunk, columns)`` of block ``i``'s ``rows`` (local indices) in fixed chunks of :data:`SUB_ROWS` rows:
        a spilled block read once, a recomputed one's rows read once and each chunk's columns computed.  ``rows``
        None: all of them, each chunk a slice (the stored columns' view, not a copy).  A chunk's ``columns`` are
        valid until the next chunk is drawn (gathered rows and a spilled block are read into :attr:`buffers`)."""
        with contextlib.ExitStack() as lent:
            stored = None
            if self.stored is not None:
                shape = (self.sizes[i], self.stored.rank)
                stored = self.stored.get(i, lent.enter_context(self.buffers.take((shape, self.stored.dtype)))
                                         if self.stored.spilled else None)  # fmt: skip
            X = self.read(i) if stored is None else None
            gathered = (lent.enter_context(self.buffers.take(((SUB_ROWS, stored.shape[1]), stored.dtype)))
                        if stored is not None and rows is not None else None)  # fmt: skip
            for lo in range(0, self.sizes[i] if rows is None else len(rows), SUB_ROWS):
                chunk = slice(lo, lo + SUB_ROWS) if rows is None else rows[lo : lo + SUB_ROWS]
                if stored is None:
                    yield chunk, self.compute(X[chunk])
                elif rows is None:
                    yield chunk, stored[chunk]
                else:  # take's mode "raise" would copy through a temporary of out's size
                    taken = np.take(stored, chunk, axis=0, out=gathered[: len(chunk)], mode="clip")
                    yield chunk, taken

    def times(self, i: int, beta, bias: float) -> np.ndarray:
        """``K_i beta + bias`` of block ``i`` on its first ``len(beta)`` columns, one chunk in double at a time."""
        width = len(beta)
        out = np.empty(self.sizes[i])
        with self.buffers.take(((SUB_ROWS, width), np.float64)) as wide:
            for chunk, columns in self.chunks(i, None):
                K = wide[: columns.shape[0]]
                np.copyto(K, columns[:, :width])
                np.matmul(K, beta, out=out[chunk])
        return out + bias

    def active_sums(self, i: int, active, beta, bias: float, y, c, labels: bool) -> np.ndarray:
        """``sum_{t active} c_t (k_t' beta + bias - [y_t]) [k_t, 1]`` of block ``i``, ``k_t`` its first
        ``len(beta)`` columns (``(len(beta) + 1,)``)."""
        width = len(beta)
        out = np.zeros(width + 1)
        with self.buffers.take(((SUB_ROWS, width), np.float64)) as wide:
            for chunk, columns in self.chunks(i, np.flatnonzero(active)):
                K = wide[: columns.shape[0]]
                np.copyto(K, columns[:, :width])
                t = K @ beta + bias
                if labels:
                    t -= y[chunk]
                t *= c[chunk]
                out[:width] += t @ K
                out[width] += np.sum(t)
        return out

    def close(self) -> None:
        if self.stored is not None:
            self.stored.close()
            self.stored = None

"""The two-stage fit's linear stage on a GPU: its kernel columns and the Newton solvers' products there
(:class:`DeviceColumns`).

Part of :mod:`mwumkl_dist.data.cuda` (see its docstring for the numbers and the memory).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.data.cuda.plans import _plan_host
from mwumkl_dist.data.cuda.runtime import _check_fits, _kernels, check_device
from mwumkl_dist.devices import cpu as _columns
from mwumkl_dist.kernels.evaluation import as_csr

__all__ = ["DeviceColumns"]


class DeviceColumns:
    """A linear-stage shard's kernel columns on the GPU (``device="cuda"``): per row block, ``K(X, L)`` of the
    combined kernel in single precision, stored transposed (``(width, rows)``), and the products the Newton
    solvers need, on the device.

    ``kernel_set``, ``landmarks`` (``(width, d)``, dense or CSR) and ``weights`` are the Nystroem map's.  The
    columns are :func:`mwumkl_dist.data.cuda.kernels.combined_columns` (the predictor's kernel sums, one
    landmark at a time); the products accumulate in double precision, landmarks (or rows) in order.  They
    agree with the CPU shard's to rounding (its columns come from BLAS dot products), not bit for bit.
    """

    #: The blocks' passes run one after the other (the GPU is one device); see the CPU shard's store,
    #: :class:`~mwumkl_dist.solvers.two_stage.columns.HostColumns`, the same interface.
    parallel = False

    def __init__(self, kernel_set, landmarks, weights, width: int):
        self._k = _kernels()
        self.cuda = check_device()
        plan = kernel_set.plan
        self.plan = plan
        self.width = int(width)
        L = landmarks.toarray() if sp.issparse(landmarks) else np.asarray(landmarks, dtype=np.float64)
        L = np.ascontiguousarray(L[: self.width], dtype=np.float64)
        csr = as_csr(L)
        l_sq = _columns.group_sqnorms(csr.indptr, csr.indices, csr.data, plan.feat_ptr, plan.feat_groups,
                                      int(plan.n_groups))  # fmt: skip
        host = _plan_host(plan)
        self._P = {key: self.cuda.to_device(a) for key, a in host.items()}
        self._L = self.cuda.to_device(L)
        self._l_sq = self.cuda.to_device(np.ascontiguousarray(l_sq, dtype=np.float64))
        self._w = self.cuda.to_device(np.ascontiguousarray(np.atleast_2d(weights), dtype=np.float64))
        self.blocks: dict = {}
        self._rows_data: dict = {}  # block -> (host key, y and c on the GPU): sent once, not per product

    def put(self, i: int, X) -> None:
        """Compute and keep block ``i``'s columns (rows ``X``)."""
        k, P, plan = self._k, self._P, self.plan
        csr = as_csr(X)
        n = csr.shape[0]
        _check_fits(4 * n * self.width + 8 * n * (csr.shape[1] + int(plan.n_groups)), "the linear stage's columns")
        sqx = _columns.group_sqnorms(csr.indptr, csr.indices, csr.data, plan.feat_ptr, plan.feat_groups,
                                     int(plan.n_groups))  # fmt: skip
        d_xt = self.cuda.to_device(np.ascontiguousarray(csr.toarray().T))
        d_sqx = self.cuda.to_device(np.ascontiguousarray(np.asarray(sqx).T))
        out = self.cuda.device_array((self.width, n), np.float32)
        k.combined_columns[k.launch(n * self.width)](
            d_xt, d_sqx, self._L, self._l_sq, self._w, P["kind"], P["pa"], P["pb"], P["grp"], P["square_of"],
            P["root"], P["depth"], P["gptr"], P["gfeat"], out,
        )  # fmt: skip
        self.blocks[i] = out

    def host(self, i: int, rows=None) -> np.ndarray:
        """Block ``i``'s columns on the host, ``(rows, width)`` single precision (``rows``: only those)."""
        block = self.blocks[i].copy_to_host().T
        return np.ascontiguousarray(block if rows is None else block[rows])

    def kept(self, dtype) -> None:
        """A GPU shard keeps no columns for a load of more landmarks (it computes them all again)."""
        return None

    def chunks(self, i: int, rows, size: int = 1024):
        """``(chunk, columns)`` of block ``i``'s ``rows`` on the host, ``size`` rows at a time."""
        for lo in range(0, len(rows), size):
            chunk = rows[lo : lo + size]
            yield chunk, self.host(i, chunk)

    def times(self, i: int, beta, bias: float) -> np.ndarray:
        """``K_i beta + bias`` of block ``i`` (double precision) on its first ``len(beta)`` columns, on the GPU."""
        Ct = self.blocks[i]
        out = self.cuda.device_array(Ct.shape[1], np.float64)
        d_beta = self.cuda.to_device(np.ascontiguousarray(beta, dtype=np.float64))
        self._k.columns_times[self._k.launch(Ct.shape[1])](Ct, d_beta, float(bias), out)
        return out.copy_to_host()

    def active_sums(self, i: int, active, beta, bias: float, y, c, labels: bool) -> np.ndarray:
        """``sum_{t active} c_t (k_t' beta + bias - [y_t]) [k_t, 1]`` of block ``i``, ``k_t`` its first
        ``len(beta)`` columns (``(len(beta) + 1,)``)."""
        k, cuda = self._k, self.cuda
        Ct = self.blocks[i]
        n, width = Ct.shape[1], len(beta)
        u = cuda.device_array(n, np.float64)
        d_beta = cuda.to_device(np.ascontiguousarray(beta, dtype=np.float64))
        d_y, d_c = self._resident(i, y, c)
        k.active_weights[k.launch(n)](Ct, d_beta, float(bias), d_y, d_c, cuda.to_device(np.asarray(active, np.bool_)),
                                      bool(labels), u)  # fmt: skip
        # K' u and sum(u) in one pass over the columns, a block per (landmark, chunk of rows), read coalesced;
        # the chunks added in order: (width + 1) values come back, not u
        n_chunks = max(1, -(-n // k.PRODUCT_CHUNK))
        partial = cuda.device_array((width + 1, n_chunks), np.float64)
        blocks = min((width + 1) * n_chunks, 65535 if k.SIMULATED else 1 << 20)
        k.columns_transposed_partials[(2 if k.SIMULATED else blocks), k.TPB](Ct, u, k.PRODUCT_CHUNK, partial)
        out = cuda.device_array(width + 1, np.float64)
        k.sum_partials[k.launch(width + 1)](partial, out)
        return out.copy_to_host()

    def _resident(self, i: int, y, c):
        """Block ``i``'s labels and weights on the GPU, sent on first use and kept.

        A shard's labels and weights are fixed while its columns are loaded (``LinearShard.load_problem`` sets
        both and builds a new :class:`DeviceColumns`); the key (the host arrays' addresses and shapes) resends
        them for other arrays.  The host arrays are held with their copies, so no other array can take their
        addresses while the key stands."""
        y, c = np.asarray(y, np.float64), np.asarray(c, np.float64)
        key = tuple((a.__array_interface__["data"][0], a.shape, a.strides) for a in (y, c))
        held = self._rows_data.get(i)
        if held is None or held[0] != key:
            held = self._rows_data[i] = (key, self.cuda.to_device(y), self.cuda.to_device(c), (y, c))
        return held[1], held[2]

    @property
    def nbytes(self) -> int:
        return int(sum(4 * b.shape[0] * b.shape[1] for b in self.blocks.values()))

    def close(self) -> None:
        self.blocks = {}
        self._rows_data = {}

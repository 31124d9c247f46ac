"""GPU shards: the MWU superstep with ``V``, the rows and the plan in GPU memory (:class:`CudaFeatureShard`,
:class:`CudaPrecomputedShard`).

Part of :mod:`mwumkl_dist.data.cuda` (see its docstring for the numbers and the memory).
"""

from __future__ import annotations

import numpy as np

from mwumkl_dist.core import exact
from mwumkl_dist.core.mwu_rules import Candidate
from mwumkl_dist.core.partition import kernel_tiles
from mwumkl_dist.data.cuda.plans import (
    _dense_rows,
    _plan_host,
    feature_shard_bytes,
    inline_groups,
    precomputed_shard_bytes,
)
from mwumkl_dist.data.cuda.runtime import _check_fits, _kernels, check_device
from mwumkl_dist.data.shards import FeatureShard, PrecomputedShard, ShardBase
from mwumkl_dist.kernels.evaluation import as_csr, plan_args, point_entries, row_group_sqnorms

__all__ = ["CudaFeatureShard", "CudaPrecomputedShard", "DeviceCoef"]


class _DevicePoints:
    """Two feature vectors ``p`` and ``q``, dense on the GPU, set from their non-zeros.

    :meth:`load` sends one message of ``2 (nnz(p) + nnz(q))`` values (not ``2 n_features``): the
    indices and values of both, which a kernel writes after zeroing the previous points' entries.
    """

    def __init__(self, cuda, kernels, n_features: int):
        self._cuda, self._k = cuda, kernels
        self.p = cuda.to_device(np.zeros(n_features))
        self.q = cuda.to_device(np.zeros(n_features))
        self._messages = [cuda.device_array(16, np.float64), cuda.device_array(16, np.float64)]
        self._counts = (0, 0)  # the entries of p and q in _messages[0] (the points now loaded)

    def load(self, p, q) -> None:
        (ip, vp), (iq, vq) = point_entries(p), point_entries(q)
        message = np.concatenate([ip, iq, vp, vq]).astype(np.float64)  # indices exact as doubles below 2**53
        old, new = self._messages
        if new.shape[0] < len(message):
            new = self._messages[1] = self._cuda.device_array(max(len(message), 2 * new.shape[0]), np.float64)
        if len(message):
            new[: len(message)].copy_to_device(message)
        self._k.load_points[1, self._k.REDUCE_TPB](self.p, self.q, old, *self._counts, new, len(ip), len(iq))
        self._messages.reverse()
        self._counts = (len(ip), len(iq))


class _DeviceV:
    """``shard.V`` of a GPU shard: rows are copied from the GPU when indexed (``V[j]``, ``V[rows]``)."""

    def __init__(self, shard):
        self._shard = shard

    @property
    def shape(self) -> tuple[int, int]:
        return (self._shard.n_rows, self._shard.n_kernels)

    def __len__(self) -> int:
        return self._shard.n_rows

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            n = self._shard.n_rows
            if not -n <= key < n:
                raise IndexError(f"row {key} outside a shard of {n} rows")
            return self._shard._rows(np.asarray([int(key) % n]))[0]
        rows = np.arange(self._shard.n_rows)[key]
        if np.ndim(rows) != 1:
            raise IndexError("a GPU shard's V takes a row index or an index array")
        return self._shard._rows(rows)

    def __setitem__(self, key, value):
        if key == slice(None) and np.ndim(value) == 0 and float(value) == 0.0:
            self._shard._zero_v()
            return
        raise TypeError("a GPU shard's V can only be reset (V[:] = 0)")

    def __array__(self, dtype=None, copy=None):
        out = self._shard._rows(np.arange(self._shard.n_rows))
        return out if dtype is None else out.astype(dtype)


class _CudaShard(ShardBase):
    """What both GPU shard kinds share: ``V`` (transposed, ``(m, n_rows)``), tile partials, the argmax."""

    def _init_device(self, y, row_offset: int, n_kernels: int, tile_ptr: np.ndarray, need: int, what: str):
        self._k = _kernels()
        cuda = check_device()
        # ShardBase's state without a host V block (V lives on the GPU).
        ShardBase.__init__(self, y, row_offset, 0)
        self.n_kernels = int(n_kernels)
        _check_fits(need, what)
        self.device_bytes = int(need)
        self._cuda = cuda
        self._tile_ptr_host = np.asarray(tile_ptr, dtype=np.int64)
        self._n_tiles = len(self._tile_ptr_host) - 1
        self._d_tile_ptr = cuda.to_device(self._tile_ptr_host)
        self._VT = cuda.device_array((self.n_kernels, self.n_rows), np.float64)
        self._partial = cuda.device_array((max(self._n_tiles, 1), self.n_rows), np.float64)
        self._gsum = cuda.device_array(max(self.n_rows, 1), np.float64)
        self._d_y = cuda.to_device(self.y)
        n_blocks = max(1, -(-self.n_rows // self._k.TPB))
        self._best_idx = cuda.device_array((n_blocks, 2), np.int64)
        self._best_g = cuda.device_array((n_blocks, 2), np.float64)
        # Per-superstep buffers, allocated once: coef in (a host coef), the message out, the candidates' V rows.
        self._d_coef = cuda.device_array(self.n_kernels, np.float64)
        self._no_bad = cuda.to_device(np.zeros(1))  # a host coef's finite check (the host rules made it)
        self._record = cuda.device_array(5, np.float64)
        self._d_pick = cuda.device_array(2, np.int64)
        self._d_pick_rows = cuda.device_array((2, self.n_kernels), np.float64)
        self._inv_host = None
        self._d_inv = None
        self.V = _DeviceV(self)
        self._zero_v()

    # V on the device ------------------------------------------------------------------
    def _zero_v(self) -> None:
        k = self._k
        if self._VT.size:
            k.fill_zero[k.launch(self._VT.size)](self._VT)
        if self._partial.size:
            k.fill_zero[k.launch(self._partial.size)](self._partial)

    def _rows(self, rows) -> np.ndarray:
        """``V[rows]`` copied to the host, ``(len(rows), m)``."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if len(rows) == 0 or self.n_kernels == 0:
            return np.zeros((len(rows), self.n_kernels))
        k = self._k
        out = self._cuda.device_array((len(rows), self.n_kernels), np.float64)
        k.gather_rows[k.launch(out.size)](self._VT, self._cuda.to_device(rows), out)
        return out.copy_to_host()

    def superstep(self, ip: int, iq: int, p, q, coef):
        """:meth:`ShardBase.superstep`; its message to the host is the two candidates (one transfer).

        ``coef`` is a host array (the candidates' ``V`` rows then follow, in a second transfer), or a
        :class:`DeviceCoef` from :class:`DeviceRules` on this GPU: the ``V`` rows stay here (views that
        the next superstep overwrites; the rules read them before) and the message also brings back
        whether ``coef`` was finite (``coef.finite``).
        """
        if self.inv_trace is None:
            raise RuntimeError("shard not configured: call configure(inv_trace, ridge) first")
        self._add_alpha(ip, iq)
        bp, gp, bn, gn, finite = self._step(ip, iq, p, q, coef)
        if isinstance(coef, DeviceCoef):
            coef.finite = finite
            if not finite:  # the scores mean nothing: any candidates do (the rules raise on seeing it)
                return self.initial_candidates()
            rows = (self._d_pick_rows[0], self._d_pick_rows[1])
        else:
            rows = self._d_pick_rows.copy_to_host() if self.n_kernels else np.zeros((2, 0))
        out = []
        for local, g, row in ((bp, gp, rows[0]), (bn, gn, rows[1])):
            if local < 0:
                out.append(Candidate(-1, -np.inf))
            else:
                out.append(Candidate(self.row_offset + local, float(g), row, self.point(local)))
        return out[0], out[1]

    def _row_dots(self, local: np.ndarray, weights: np.ndarray) -> list[int]:
        """:meth:`ShardBase._row_dots` on the GPU (:func:`~mwumkl_dist.data.cuda.kernels.exact_row_dots`).

        The weights go out (``m`` values), and back come the sums' limbs: ``N_LIMBS`` integers per row
        and a finite flag, not the rows' ``V`` (``m`` values per row).
        """
        n_limbs = exact.N_LIMBS
        if len(local) == 0 or self.n_kernels == 0:
            return [0] * len(local)
        k, cuda = self._k, self._cuda
        d_weights = cuda.to_device(np.ascontiguousarray(weights, dtype=np.float64))
        d_rows = cuda.to_device(np.ascontiguousarray(local, dtype=np.int64))
        limbs = cuda.device_array((len(local), n_limbs), np.int64)
        k.fill_zero[k.launch(limbs.size)](limbs)
        bad = cuda.to_device(np.zeros(1))
        chunk = k.EXACT_CHUNK
        k.exact_row_dots[k.launch(len(local) * -(-self.n_kernels // chunk))](self._VT, d_rows, d_weights, chunk, limbs,
                                                                             bad)  # fmt: skip
        if bad.copy_to_host()[0] != 0.0:
            raise ValueError("cannot sum non-finite values exactly")
        return exact.limbs_to_ints(limbs.copy_to_host())

    def _device_inv_trace(self):
        if self._inv_host is not self.inv_trace:
            self._d_inv = self._cuda.to_device(np.ascontiguousarray(self.inv_trace, dtype=np.float64))
            self._inv_host = self.inv_trace
        return self._d_inv

    def _tile_partials(self) -> np.ndarray:
        return self._partial.copy_to_host()[: self._n_tiles]

    def _argmax(self, bad) -> tuple[int, float, int, float, bool]:
        """The best row of each class from the tile partials (ties: lowest row), as the CPU's pass.

        Reduced on the GPU, the two rows' ``V`` gathered there (for :meth:`superstep`), then one
        transfer: ``(row +1, g, row -1, g, whether coef was finite)``, rows local (-1: none);
        ``bad`` is :class:`DeviceCoef`'s (or zeros: a host ``coef`` was checked on the host).
        """
        k = self._k
        n_blocks = self._best_idx.shape[0]
        k.scores_argmax[n_blocks, k.TPB](self._partial, self._d_y, self._gsum, self._best_idx, self._best_g)
        k.pick_candidates[1, k.REDUCE_TPB](self._best_idx, self._best_g, bad, self._record, self._d_pick)
        if self.n_kernels:
            k.gather_rows[k.launch(self._d_pick_rows.size)](self._VT, self._d_pick, self._d_pick_rows)
        rec = self._record.copy_to_host()
        return int(rec[0]), float(rec[1]), int(rec[2]), float(rec[3]), bool(rec[4] == 1.0)

    def scores(self) -> np.ndarray:
        """The last superstep's ``g`` of this block's rows (for tests and inspection)."""
        return self._gsum.copy_to_host()[: self.n_rows]

    def _launch_step(self, ip, iq, coef):
        ridge_p, ridge_q = self.picked_ridge(ip, iq)
        lp, lq = int(ip) - self.row_offset, int(iq) - self.row_offset
        if isinstance(coef, DeviceCoef):  # already here
            d_coef, status = coef.values, coef.bad
        else:
            self._d_coef.copy_to_device(np.ascontiguousarray(coef, dtype=np.float64))
            d_coef, status = self._d_coef, self._no_bad
        return lp, lq, 0.5 * ridge_p, 0.5 * ridge_q, d_coef, self._device_inv_trace(), status

    def stats(self) -> dict:
        return {"device_bytes": self.device_bytes}


class CudaFeatureShard(_CudaShard):
    """:class:`~mwumkl_dist.data.shards.FeatureShard` on the GPU: same arguments, same numbers."""

    point = FeatureShard.point
    diagonal = FeatureShard.diagonal

    def __init__(self, X, y, row_offset: int, plan):
        X = as_csr(X)
        if X.shape[0] != len(y):
            raise ValueError(f"shard has {X.shape[0]} rows but {len(y)} labels")
        if X.shape[1] != plan.n_features:
            raise ValueError(f"shard data has {X.shape[1]} features, the kernels expect {plan.n_features}")
        self.X = X
        self.plan = plan
        self._plan_args = plan_args(plan)
        dense_t = _dense_rows(X, plan)
        n = X.shape[0]
        need = feature_shard_bytes(n, plan, X, dense=dense_t is not None)
        what = f"a GPU shard of {n} rows x {plan.n_kernels} kernels ({plan.n_groups} feature groups)"
        self._init_device(y, row_offset, plan.n_kernels, kernel_tiles(plan.square_of), need, what)
        cuda = self._cuda
        host = _plan_host(plan)
        self._plan_dev = {key: cuda.to_device(a) for key, a in host.items()}
        G = int(plan.n_groups)
        self._dense = dense_t is not None
        self._inline = inline_groups(plan, self._dense)
        if self._dense:
            self._Xt = cuda.to_device(dense_t)  # (d, n)
        else:
            self._csr = tuple(cuda.to_device(np.ascontiguousarray(a)) for a in (X.indptr, X.indices, X.data))
        if not self._inline:
            self._d_row_sq = cuda.to_device(np.ascontiguousarray(row_group_sqnorms(X, plan).T))  # (G, n)
            self._dp = cuda.device_array((G, n), np.float64)
            self._dq = cuda.device_array((G, n), np.float64)
        self._ppp = cuda.device_array(G, np.float64)
        self._ppq = cuda.device_array(G, np.float64)
        self._points = _DevicePoints(cuda, self._k, X.shape[1])

    def _step(self, ip, iq, p, q, coef):
        k, P = self._k, self._plan_dev
        self._points.load(p, q)
        d_p, d_q = self._points.p, self._points.q
        G = self._ppp.shape[0]
        k.point_sqnorms[k.launch(G)](d_p, d_q, P["gptr"], P["gfeat"], self._ppp, self._ppq)
        lp, lq, diag_p, diag_q, d_coef, d_inv, status = self._launch_step(ip, iq, coef)
        if self._inline:
            k.superstep_features_inline[k.launch(self.n_rows * self._n_tiles)](
                self._VT, self._partial, self._Xt, d_p, d_q, P["gptr"], P["gfeat"], self._ppp, self._ppq, self._d_y,
                1.0, -1.0, d_inv, d_coef, P["kind"], P["pa"], P["pb"], P["grp"], P["square_of"], P["root"],
                P["depth"], self._d_tile_ptr, lp, lq, diag_p, diag_q,
            )  # fmt: skip
            return self._argmax(status)
        if self._dense:
            k.group_dots_dense[k.launch(self._dp.size)](self._Xt, d_p, d_q, P["gptr"], P["gfeat"], self._dp, self._dq)
        else:
            k.fill_zero[k.launch(self._dp.size)](self._dp)
            k.fill_zero[k.launch(self._dq.size)](self._dq)
            k.group_dots_csr[k.launch(self.n_rows)](*self._csr, d_p, d_q, P["feat_ptr"], P["feat_groups"], self._dp,
                                                     self._dq)  # fmt: skip
        k.superstep_features[k.launch(self.n_rows * self._n_tiles)](
            self._VT, self._partial, self._dp, self._dq, self._d_row_sq, self._ppp, self._ppq, self._d_y, 1.0, -1.0,
            d_inv, d_coef, P["kind"], P["pa"], P["pb"], P["grp"], P["square_of"], P["root"], P["depth"],
            self._d_tile_ptr, lp, lq, diag_p, diag_q,
        )  # fmt: skip
        return self._argmax(status)


class CudaPrecomputedShard(_CudaShard):
    """:class:`~mwumkl_dist.data.shards.PrecomputedShard` on the GPU: the ``(m, n_rows, n)`` kernel rows kept there."""

    point = PrecomputedShard.point
    diagonal = PrecomputedShard.diagonal

    def __init__(self, K_rows, y, row_offset: int):
        if K_rows.ndim != 3 or K_rows.shape[1] != len(y):
            raise ValueError(f"precomputed shard block must be (m, {len(y)}, n), got {K_rows.shape}")
        self.K = K_rows
        m, n, n_all = K_rows.shape
        need = precomputed_shard_bytes(n, m, n_all)
        self._init_device(y, row_offset, m, kernel_tiles(m), need,
                          f"a GPU shard of {n} rows x {m} precomputed kernels over {n_all} points")  # fmt: skip
        # Kt[i, k, j] = K_i(x_j, x_k): a picked point's column is contiguous over the rows.
        self._Kt = self._cuda.to_device(np.ascontiguousarray(np.asarray(K_rows, dtype=np.float64).transpose(0, 2, 1)))

    def _step(self, ip, iq, p, q, coef):
        k = self._k
        lp, lq, diag_p, diag_q, d_coef, d_inv, status = self._launch_step(ip, iq, coef)
        k.superstep_columns[k.launch(self.n_rows * self._n_tiles)](
            self._VT, self._partial, self._Kt, int(p), int(q), self._d_y, 1.0, -1.0, d_inv, d_coef,
            self._d_tile_ptr, lp, lq, diag_p, diag_q,
        )  # fmt: skip
        return self._argmax(status)


class DeviceCoef:
    """``coef`` on the GPU, as :class:`DeviceRules` hands it to the shards' supersteps.

    ``bad`` (on the GPU, one value, set by the rules) is 0.0 when every value is finite; a shard's
    superstep message brings it back and sets ``finite`` (None until one did).
    """

    def __init__(self, values, bad):
        self.values, self.bad = values, bad
        self.finite: bool | None = None

    def __len__(self) -> int:
        return self.values.shape[0]

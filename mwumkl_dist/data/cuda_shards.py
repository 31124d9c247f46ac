"""GPU shards: the superstep on an NVIDIA GPU with ``numba.cuda`` (``device="cuda"``).

A GPU shard is a :class:`~mwumkl_dist.data.shards.ShardBase` whose ``V`` block,
data and kernel plan live in GPU memory; every engine runs it unchanged (the
local engine in this process, the Dask engine on GPU workers: one worker per
GPU, as dask-cuda starts them, each seeing its GPU as device 0).  Per
superstep a shard gets the two picked points (their non-zeros) and ``coef``,
and sends back one message: the best row of each class.

* :class:`CudaFeatureShard`: feature rows (dense, or CSR when sparse), any
  kernel plan (linear / polynomial / Gaussian kernels on feature groups,
  Gaussian squaring chains, random banks);
* :class:`CudaPrecomputedShard`: rows of precomputed kernels;
* :func:`on_device`: a problem whose shards are GPU shards (the hook for
  ``device="cuda"``);
* :class:`DeviceRules`: the MWU rules on ``m``-vectors on the GPU, beside
  ``V`` (the local engine's; :class:`DeviceCoef` is the ``coef`` they hand
  the shards);
* :func:`weighted_kernel_sums`: decision values on the GPU (same signature
  as :func:`mwumkl_dist.devices.cpu.weighted_kernel_sums`).

Numbers: the kernels (:mod:`mwumkl_dist.devices.cuda_kernels`) repeat the CPU
engine's floating-point operations in the same order (no FMA contraction, the
CPU's ``exp``), so supersteps, kernel weights and decision values equal the
CPU engine's bit for bit on the same problem; the picks then agree too, ties
included (equal scores go to the lowest row on both).  Only a difference in
a GPU's double arithmetic from IEEE 754 (none is known on NVIDIA GPUs), or
the rules' ``sinh`` and ``exp`` on the GPU (below), could make a pick differ,
and only between rows whose scores agree to the last bits.

Traces (``diagonal``) use the CPU code on a host copy of the rows.  The final
margins (``support_margins``: ``h_j = sum_i mu_i V_ji`` of the support rows)
are summed exactly on the GPU (:mod:`mwumkl_dist.core.exact`'s limbs, the
same integers as the CPU's): the weights go out once, and back come about
550 bytes per support row, whatever the kernel count.

The MWU rules where ``V`` lives: with the local engine (the shards in this
process) the rules' ``m``-vectors stay on the GPU too (:class:`DeviceRules`,
the functions of :mod:`mwumkl_dist.core.mwu_rules` compiled for it): the
picked points' kernel block (:class:`DevicePlan`), ``s``, ``coef`` and the
candidates' ``V`` rows never leave it.  An iteration sends the two picked
points' non-zeros (to the kernel block and to each shard) and brings back one
message per shard, its two candidates and whether ``coef`` was finite (40
bytes): nothing of size ``m``.  ``s`` comes to the host for a callback and at
the end, where the kernel weights are computed (numpy's sum).  The Dask
engine keeps the rules on the driver (its shards send their ``V`` rows
there).  The rules' ``sinh`` and ``exp`` are CUDA's on a GPU (within an ulp
or two of numpy's), so ``coef`` and the scores may differ from the CPU's in
the last bits and a pick may differ where two rows' scores agree to that
precision; ``s`` and the kernel weights follow from the picks alone.  Under
the simulator they are numpy's, and every number equals the CPU's.

GPU memory: :func:`feature_shard_bytes` /
:func:`precomputed_shard_bytes` (a shard's ``stats()["device_bytes"]``); a
shard that does not fit raises :class:`DeviceMemoryError` before allocating.

Without a GPU (or without numba's CUDA support) building a GPU shard raises
a :class:`RuntimeError` that says what is missing.  The tests run the same
kernels under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.core import exact
from mwumkl_dist.core.mwu_rules import Candidate, non_finite_scores, ridge_at
from mwumkl_dist.core.partition import chain_roots, kernel_tiles
from mwumkl_dist.data.shards import FeatureShard, PrecomputedShard, ShardBase
from mwumkl_dist.devices import cpu as _columns
from mwumkl_dist.kernels.evaluation import as_csr, plan_args, point_entries, row_group_sqnorms
from mwumkl_dist.kernels.specs import KernelPlan

__all__ = [
    "check_device",
    "gpu_available",
    "numpy_compat",
    "device_memory",
    "DeviceMemoryError",
    "CudaFeatureShard",
    "CudaPrecomputedShard",
    "on_device",
    "DeviceProblem",
    "DevicePlan",
    "DeviceRules",
    "DeviceCoef",
    "feature_shard_bytes",
    "precomputed_shard_bytes",
    "weighted_kernel_sums",
    "DeviceColumns",
]

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
    from mwumkl_dist.devices import cuda_kernels as _cuda_kernels

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


# ----------------------------------------------------------------------------- plans


def _plan_host(plan) -> dict:
    root, depth = chain_roots(plan.square_of)
    feat_ptr = np.ascontiguousarray(plan.feat_ptr, dtype=np.int64)
    feat_groups = np.ascontiguousarray(plan.feat_groups, dtype=np.int64)
    gptr, gfeat = _columns.group_features(feat_ptr, feat_groups, int(plan.n_groups))
    return {
        "kind": np.ascontiguousarray(plan.kind, dtype=np.int64),
        "pa": np.ascontiguousarray(plan.param_a, dtype=np.float64),
        "pb": np.ascontiguousarray(plan.param_b, dtype=np.float64),
        "grp": np.ascontiguousarray(plan.group, dtype=np.int64),
        "square_of": np.ascontiguousarray(plan.square_of, dtype=np.int64),
        "root": root,
        "depth": depth,
        "gptr": gptr,
        "gfeat": gfeat,
        "feat_ptr": feat_ptr,
        "feat_groups": feat_groups,
    }


def _nbytes(arrays) -> int:
    return int(sum(a.nbytes for a in arrays))


#: Dense rows and kernels on small groups (random banks, per-feature kernels; at most this many features
#: per kernel on average, several groups): each thread computes its kernels' group dots and norms itself.
INLINE_MAX_GROUP = 16


def inline_groups(plan, dense: bool) -> bool:
    """Whether a :class:`CudaFeatureShard` computes group dots in the superstep kernel (no ``(G, n)`` arrays)."""
    if not dense or int(plan.n_groups) < 2 or plan.n_kernels == 0:
        return False
    group_size = np.bincount(np.asarray(plan.feat_groups), minlength=int(plan.n_groups))
    return float(np.mean(group_size[np.asarray(plan.group)])) <= INLINE_MAX_GROUP


#: Sparse rows are still kept dense on the GPU, up to this size, when the plan's groups are small
#: (:func:`inline_groups`): the superstep kernel then needs no ``(G, n)`` arrays (e.g. mushrooms' 1344
#: per-feature kernels).  The numbers do not depend on the layout.
DENSE_MAX_BYTES = 256 * 2**20


def _dense_rows(X, plan) -> np.ndarray | None:
    """The rows as a dense ``(d, n)`` copy for the GPU, or None (CSR)."""
    dense_t = _columns.dense_copy(X)
    if dense_t is None and 8 * X.shape[0] * X.shape[1] <= DENSE_MAX_BYTES and inline_groups(plan, True):
        dense_t = np.ascontiguousarray(X.toarray().T)
    return dense_t


def feature_shard_bytes(n_rows: int, plan, X=None, dense: bool | None = None) -> int:
    """GPU memory of a :class:`CudaFeatureShard` of ``n_rows`` rows (its peak: everything is kept).

    ``V`` (``8 n m``), the tile partials, the rows (dense ``8 n d``, or CSR),
    unless :func:`inline_groups` the rows' group norms and the two points'
    group dot products (``3 x 8 n G``), the plan and the per-superstep vectors.
    """
    n, m, G, d = int(n_rows), int(plan.n_kernels), int(plan.n_groups), int(plan.n_features)
    n_tiles = len(kernel_tiles(plan.square_of)) - 1
    if dense is None:
        dense = X is None or _columns.dense_copy(X) is not None
    rows = 8 * n * d if dense else X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
    groups = 0 if inline_groups(plan, dense) else 3 * 8 * n * G
    plan_bytes = 8 * (9 * m + 2 * len(plan.feat_groups) + len(plan.feat_ptr) + G + 1)
    per_step = 8 * (2 * d + 3 * m + 2 * G + 2 * n)  # points, coef, inv_trace, gathered rows, norms, y, g
    return int(8 * n * m + 8 * n * n_tiles + groups + rows + plan_bytes + per_step)


def precomputed_shard_bytes(n_rows: int, n_kernels: int, n_samples: int) -> int:
    """GPU memory of a :class:`CudaPrecomputedShard`: the kernel rows, ``V``, tile partials and vectors."""
    n, m = int(n_rows), int(n_kernels)
    n_tiles = len(kernel_tiles(m)) - 1
    return int(8 * m * n * int(n_samples) + 8 * n * m + 8 * n * n_tiles + 8 * (4 * m + 2 * n))


# ----------------------------------------------------------------------------- shards


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
        """:meth:`ShardBase._row_dots` on the GPU (:func:`~mwumkl_dist.devices.cuda_kernels.exact_row_dots`).

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


# ----------------------------------------------------------------------------- problems


def _device_shard(func, *args):
    """Build a CPU shard kind's arguments into its GPU twin (picklable: Dask workers run it)."""
    shard = func(*args)
    return to_device_shard(shard)


def to_device_shard(shard):
    """The GPU twin of a CPU :class:`FeatureShard` / :class:`PrecomputedShard` (same rows, fresh state)."""
    if isinstance(shard, _CudaShard):
        return shard
    if type(shard) is FeatureShard:
        return CudaFeatureShard(shard.X, shard.y, shard.row_offset, shard.plan)
    if type(shard) is PrecomputedShard:
        return CudaPrecomputedShard(shard.K, shard.y, shard.row_offset)
    raise NotImplementedError(f"device='cuda' does not run {type(shard).__name__} shards (kernel stores)")


def _gpu_factory(factory):
    if isinstance(factory, functools.partial) and not factory.keywords:
        if factory.func is FeatureShard:
            return functools.partial(CudaFeatureShard, *factory.args)
        if factory.func is PrecomputedShard:
            return functools.partial(CudaPrecomputedShard, *factory.args)
    return functools.partial(_device_shard, factory)


class DevicePlan:
    """A kernel plan's arrays on the GPU, and :meth:`point_kernels` there."""

    def __init__(self, plan):
        self._k = _kernels()
        cuda = check_device()
        self.plan = plan
        self.arrays = {key: cuda.to_device(a) for key, a in _plan_host(plan).items()}
        self._points = _DevicePoints(cuda, self._k, int(plan.n_features))
        self._out = cuda.device_array((3, int(plan.n_kernels)), np.float64)

    def point_kernels_device(self, p, q):
        """:meth:`point_kernels` left on the GPU: a ``(3, m)`` device array (the next call overwrites it)."""
        k, P = self._k, self.arrays
        self._points.load(p, q)
        if self.plan.n_kernels:
            k.point_kernels[k.launch(self.plan.n_kernels)](
                self._points.p, self._points.q, P["gptr"], P["gfeat"], P["kind"], P["pa"], P["pb"], P["grp"],
                P["root"], P["depth"], self._out,
            )  # fmt: skip
        return self._out

    def point_kernels(self, p, q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`mwumkl_dist.kernels.evaluation.point_kernel_block` on the GPU (the same bits)."""
        out = self.point_kernels_device(p, q).copy_to_host()
        return out[0], out[1], out[2]


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


class DeviceRules:
    """:class:`~mwumkl_dist.core.mwu_rules.HostRules` on the GPU, beside ``V``: the same rules, the same steps.

    ``s`` (two buffers, swapped by :meth:`commit`), the picked points' kernel block, the margins and
    ``coef`` stay on the GPU: :meth:`step` runs the ``rules_*`` kernels of
    :mod:`mwumkl_dist.devices.cuda_kernels` (the functions of :mod:`mwumkl_dist.core.mwu_rules`
    compiled there) and returns a :class:`DeviceCoef` that the shards use where it is.  Nothing of
    size ``m`` moves per iteration, except a precomputed problem's kernel block (``3 m`` values read
    from ``K`` on the host; such a problem holds ``m n^2`` of them).

    Built by :meth:`DeviceProblem.device_rules` (the local engine's ``rules``); the arguments are
    :class:`~mwumkl_dist.core.mwu_rules.HostRules`' with ``problem`` for ``kernel_block``.
    """

    def __init__(self, problem, s, *, inv_trace, ridge, eps_p: float, rho: float, selectivity=None):
        self._k = _kernels()
        cuda = self._cuda = check_device()
        self._problem = problem
        m = int(problem.n_kernels)
        self.ridge, self.eps_p, self.rho = ridge, float(eps_p), float(rho)
        self.selectivity = None if selectivity is None else float(selectivity)
        self.s = cuda.to_device(np.array(s, dtype=np.float64))
        self._next = cuda.device_array(m, np.float64)
        self._u = cuda.device_array(m, np.float64)
        self._inv = cuda.to_device(np.ascontiguousarray(inv_trace, dtype=np.float64))
        self._grid = self._k.rule_launch(m)
        self._top = cuda.device_array(self._grid[0], np.float64)  # the largest u of each block
        self.coef = DeviceCoef(cuda.device_array(m, np.float64), cuda.to_device(np.zeros(1)))

    def _on_device(self, v_row):
        """A candidate's ``V`` row on the GPU: a shard's device view as it is; a host row (the first
        iteration's candidates, a checkpoint's) is sent, once per fit."""
        if isinstance(v_row, np.ndarray):
            return self._cuda.to_device(np.ascontiguousarray(v_row, dtype=np.float64))
        return v_row

    def step(self, pos: Candidate, neg: Candidate, iteration: int) -> DeviceCoef:
        """:meth:`HostRules.step <mwumkl_dist.core.mwu_rules.HostRules.step>` on the GPU; a non-finite
        ``coef`` is reported by :meth:`commit`."""
        k, grid = self._k, self._grid
        kb = self._problem.device_kernel_block(pos.point, neg.point)
        ridge_p, ridge_n = ridge_at(self.ridge, pos.index), ridge_at(self.ridge, neg.index)
        v_pos, v_neg = self._on_device(pos.v_row), self._on_device(neg.v_row)
        k.rules_margins[grid](kb, self._inv, ridge_p, ridge_n, self.s, v_pos, v_neg, self._next, self._u, self._top,
                              self.coef.bad)  # fmt: skip
        relative = self.selectivity is not None  # a launch takes no None: the paper's scale is a flag
        k.rules_coef[grid](self._u, self._top, self.eps_p, self.rho, relative, self.selectivity if relative else 0.0,
                           self.coef.values, self.coef.bad)  # fmt: skip
        self.coef.finite = None
        return self.coef

    def commit(self, iteration: int) -> None:
        """After the superstep: the iteration's ``s`` becomes the current one, or :func:`non_finite_scores`
        is raised when ``coef`` was not finite (the shards' messages say so)."""
        finite = self.coef.finite
        if finite is None:  # no shard took this coef (not the local engine's GPU shards): ask
            finite = bool(self.coef.bad.copy_to_host()[0] == 0.0)
        if not finite:
            raise non_finite_scores(iteration, self._next.copy_to_host())
        self.s, self._next = self._next, self.s

    def host_s(self) -> np.ndarray:
        """``s`` copied to the host."""
        return self.s.copy_to_host()


class DeviceProblem:
    """A problem whose shards are GPU shards; everything else is the wrapped problem's.

    ``LocalEngine(on_device(problem), n_shards)`` runs the fit on this
    process's GPU; the Dask engine ships ``shard_factory`` results to its
    workers, which build the shards on their own GPU.  The picked points'
    kernel block (``m`` kernels, every iteration on the driver) is computed on
    the driver's GPU when it has one (a feature problem; the same bits), else
    on its CPU.
    """

    def __init__(self, problem, driver_gpu: bool = True):
        self.problem = problem
        self._driver_gpu = driver_gpu
        self._device_plan = None

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.problem, name)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_device_plan"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    #: Kernel blocks on the GPU from this many kernels (fewer: the CPU is quicker than a round trip; same bits).
    kernel_block_min_kernels = 4096

    def _plan(self) -> DevicePlan | None:
        """The kernel set's :class:`DevicePlan` (made on first use), or None (precomputed kernels)."""
        kernel_set = getattr(self.problem, "kernel_set", None)
        if kernel_set is not None and self._device_plan is None:
            self._device_plan = DevicePlan(kernel_set.plan)
        return self._device_plan

    def kernel_block(self, p, q):
        """The picked points' raw kernel values on the host (for host rules; see :meth:`device_kernel_block`)."""
        if self._driver_gpu and self.problem.n_kernels >= self.kernel_block_min_kernels and self._plan() is not None:
            return self._device_plan.point_kernels(p, q)
        return self.problem.kernel_block(p, q)

    def device_kernel_block(self, p, q):
        """The same as one ``(3, m)`` GPU array, for :class:`DeviceRules`: computed there for a kernel set."""
        plan = self._plan()
        if plan is not None:
            return plan.point_kernels_device(p, q)
        return check_device().to_device(np.stack(self.problem.kernel_block(p, q)))  # precomputed: read from K

    def device_rules(self, s, **settings) -> DeviceRules:
        """:class:`DeviceRules` for this problem: the local engine's rules (its GPU shards are in this process)."""
        return DeviceRules(self, s, **settings)

    def shard_factory(self, start: int, stop: int, kernels: tuple[int, int] | None = None):
        return _gpu_factory(self.problem.shard_factory(start, stop, kernels))

    def make_shard(self, start: int, stop: int, kernels: tuple[int, int] | None = None):
        return self.shard_factory(start, stop, kernels)()


def on_device(problem, device: str = "cuda", driver_gpu: bool = True):
    """``problem`` itself for ``device="cpu"``; for ``"cuda"`` a :class:`DeviceProblem`.

    ``driver_gpu=True`` (the local engine) checks the GPU here, at once, and
    computes the picked points' kernel blocks on it; ``False`` (a Dask driver
    that may have no GPU: the shards check theirs when the workers build
    them) computes those on the driver's CPU.
    """
    if device == "cpu":
        return problem
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if driver_gpu:
        check_device()
    if isinstance(problem, DeviceProblem):
        problem = problem.problem
    return DeviceProblem(problem, driver_gpu)


# ----------------------------------------------------------------------------- the two-stage fit's linear stage


class DeviceColumns:
    """A linear-stage shard's kernel columns on the GPU (``device="cuda"``): per row block, ``K(X, L)`` of the
    combined kernel in single precision, stored transposed (``(width, rows)``), and the products the Newton
    solvers need, on the device.

    ``kernel_set``, ``landmarks`` (``(width, d)``, dense or CSR) and ``weights`` are the Nystroem map's.  The
    columns are :func:`mwumkl_dist.devices.cuda_kernels.combined_columns` (the predictor's kernel sums, one
    landmark at a time); the products accumulate in double precision, landmarks (or rows) in order.  They
    agree with the CPU shard's to rounding (its columns come from BLAS dot products), not bit for bit.
    """

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


# ----------------------------------------------------------------------------- prediction


def weighted_kernel_sums(indptr, indices, data, n_features, sv_indptr, sv_indices, sv_data, sv_sq, coef, weights,
                         kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, n_groups, *,
                         max_block_bytes: int | None = None):  # fmt: skip
    """:func:`mwumkl_dist.devices.cpu.weighted_kernel_sums` on the GPU: the same arguments, the same numbers.

    The support vectors go to the GPU dense (``n_sv x n_features``), the rows
    in dense blocks sized to the free memory (at most ``max_block_bytes``).
    """
    k = _kernels()
    cuda = check_device()
    n = len(indptr) - 1
    d = int(n_features)
    G = int(n_groups)
    weights = np.ascontiguousarray(np.atleast_2d(weights), dtype=np.float64)
    coef = np.ascontiguousarray(np.atleast_2d(coef), dtype=np.float64)
    n_out = weights.shape[0]
    out = np.zeros((n, n_out))
    n_sv = len(sv_indptr) - 1
    if n == 0 or n_sv == 0:
        return out
    rows = sp.csr_matrix((data, indices, indptr), shape=(n, d))
    sv = sp.csr_matrix((sv_data, sv_indices, sv_indptr), shape=(n_sv, d)).toarray()
    plan = KernelPlan(kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, G, d)
    host = _plan_host(plan)
    fixed = sv.nbytes + 8 * n_sv * G + coef.nbytes + weights.nbytes + sum(a.nbytes for a in host.values())
    per_row = 8 * (d + G + n_out)
    free, _ = device_memory()
    budget = min(0.5 * free - fixed, max_block_bytes if max_block_bytes is not None else 2**31)
    if budget < per_row:
        raise DeviceMemoryError(
            f"prediction needs about {_size(2 * (fixed + per_row))} of GPU memory (the support vectors "
            f"dense: {n_sv} x {d}) but the GPU has {_size(free)} free: predict on the CPU"
        )
    block = int(max(1, min(n, budget // per_row)))
    P = {key: cuda.to_device(a) for key, a in host.items()}
    d_sv = cuda.to_device(sv)
    d_sv_sq = cuda.to_device(np.ascontiguousarray(sv_sq, dtype=np.float64))
    d_coef = cuda.to_device(coef)
    d_w = cuda.to_device(weights)
    for a in range(0, n, block):
        b = min(n, a + block)
        chunk = rows[a:b]
        sqx = _columns.group_sqnorms(chunk.indptr, chunk.indices, chunk.data, plan.feat_ptr, plan.feat_groups, G)
        d_xt = cuda.to_device(np.ascontiguousarray(chunk.toarray().T))
        d_sqx = cuda.to_device(np.ascontiguousarray(sqx.T))
        d_out = cuda.device_array((b - a, n_out), np.float64)
        k.weighted_kernel_sums[k.launch((b - a) * n_out)](
            d_xt, d_sqx, d_sv, d_sv_sq, d_coef, d_w, P["kind"], P["pa"], P["pb"], P["grp"], P["square_of"],
            P["root"], P["depth"], P["gptr"], P["gfeat"], d_out,
        )  # fmt: skip
        out[a:b] = d_out.copy_to_host()
    return out

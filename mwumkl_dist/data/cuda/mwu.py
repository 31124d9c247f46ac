"""The MWU fit on GPU shards: a problem whose shards are GPU shards (:func:`on_device`), the picked points' kernel block
there (:class:`DevicePlan`) and the MWU rules beside ``V`` (:class:`DeviceRules`).

Part of :mod:`mwumkl_dist.data.cuda` (see its docstring for the numbers and the memory).
"""

from __future__ import annotations

import functools

import numpy as np

from mwumkl_dist.core.mwu_rules import Candidate, non_finite_scores, ridge_at
from mwumkl_dist.data.cuda.plans import _plan_host
from mwumkl_dist.data.cuda.runtime import _kernels, check_device
from mwumkl_dist.data.cuda.shards import CudaFeatureShard, CudaPrecomputedShard, DeviceCoef, _CudaShard, _DevicePoints
from mwumkl_dist.data.shards import FeatureShard, PrecomputedShard

__all__ = ["DevicePlan", "DeviceProblem", "DeviceRules", "on_device", "to_device_shard"]


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


class DeviceRules:
    """:class:`~mwumkl_dist.core.mwu_rules.HostRules` on the GPU, beside ``V``: the same rules, the same steps.

    ``s`` (two buffers, swapped by :meth:`commit`), the picked points' kernel block, the margins and
    ``coef`` stay on the GPU: :meth:`step` runs the ``rules_*`` kernels of
    :mod:`mwumkl_dist.data.cuda.kernels` (the functions of :mod:`mwumkl_dist.core.mwu_rules`
    compiled there) and returns a :class:`DeviceCoef` that the shards use where it is.  Nothing of
    size ``m`` moves per iteration, except a precomputed problem's kernel block (``3 m`` values read
    from ``K`` on the host; such a problem holds ``m n^2`` of them).

    Built by :meth:`mwumkl_dist.data.backends.CUDABackend.mwu_rules` (the local engine's ``rules``); the arguments are
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

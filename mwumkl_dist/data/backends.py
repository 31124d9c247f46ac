"""One back-end object per device: everything a fit asks of the device it runs on, in one place.

A back-end is resolved once per fit (:func:`backend_for`, by the fit driver into
:attr:`mwumkl_dist.solvers.base.FitTask.backend`) and asked, never tested by name:

* :meth:`~CPUBackend.mwu_problem`: the MWU shard factory, a problem whose shards run on this device, and the
  back-end its local engine then runs on (a ``device="cuda"`` fit that
  :func:`mwumkl_dist.devices.routing.mwu_device` finds cheaper on CPU threads runs on the CPU's);
* :meth:`~CPUBackend.mwu_rules`: the MWU rules beside the shards' ``V`` (None: the host's);
* :meth:`~CPUBackend.kernel_sums`: the predictor's weighted kernel sums
  (:func:`mwumkl_dist.devices.cpu.weighted_kernel_sums` or its GPU twin, the same numbers);
* :meth:`~CPUBackend.scoring`: where rows are scored with a model (the cost model's
  :func:`~mwumkl_dist.devices.routing.scoring_device`);
* :meth:`~CPUBackend.column_store`: where the two-stage fit's linear stage keeps its kernel columns (None: the
  host's blocks, in memory or spilled; a GPU's :class:`~mwumkl_dist.data.cuda.columns.DeviceColumns`);
* :meth:`~CPUBackend.pass_costs`: the cost per entry of the linear stage's passes over them.

Adding a device: one module (its shards, rules, sums and columns, as :mod:`mwumkl_dist.data.cuda`) and one class
here, registered in :data:`BACKENDS` (see ``docs/architecture.md``, "Add a device").
"""

from __future__ import annotations

import numpy as np

from mwumkl_dist.devices import routing

__all__ = ["BACKENDS", "CPUBackend", "CUDABackend", "backend_for", "backend_named"]


class CPUBackend:
    """The host: numba kernels on CPU threads (:mod:`mwumkl_dist.devices.cpu`)."""

    name = "cpu"
    #: Whether the shards' ``V`` lives in this process's memory (an MWU fit can then run its supersteps here).
    on_host = True

    def check(self) -> None:
        """Raise where this device cannot be used here (the CPU always can)."""

    def mwu_problem(self, problem, n_threads: int):
        """``(problem, backend)``: ``problem`` with shards on this device, and the back-end its local engine runs on
        for a problem of its size with ``n_threads`` CPU threads."""
        return problem, self

    def mwu_rules(self, problem, s, **settings):
        """The MWU rules where the shards' ``V`` is, or None for the host's
        (:class:`~mwumkl_dist.core.mwu_rules.HostRules`)."""
        return None

    def kernel_sums(self):
        """The predictor's weighted kernel sums; None: the CPU's, the default of
        :func:`~mwumkl_dist.kernels.evaluation.support_vector_sums`."""
        return None

    def scoring(self, n_rows: int, n_support: int, n_kernels: int, n_threads: int):
        """The back-end that scores ``n_rows`` rows with a model of ``n_support`` x ``n_kernels``."""
        return self

    def column_store(self, feature_map, width: int, dtype):
        """The linear stage's kernel columns of a Nystroem ``feature_map`` (its first ``width`` landmarks, kept in
        ``dtype``) on this device, filled by the shard block by block; None: the host's blocks (memory or spill)."""
        return None

    def pass_costs(self, host_pass: float, host_cg_pass: float) -> tuple[float, float, float]:
        """``(output pass, CG product pass, copy to the host)`` seconds per entry of the linear stage's passes,
        given the host's two pass costs."""
        return host_pass, host_cg_pass, 0.0

    @classmethod
    def for_engine(cls, engine: str) -> CPUBackend:
        """This device's back-end for a fit with ``engine`` (``"local"``: the driver has the device; ``"dask"``:
        the workers have it, the driver may not)."""
        return cls()

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


#: The host's back-end (it has no state).
CPU = CPUBackend()


class CUDABackend(CPUBackend):
    """An NVIDIA GPU through ``numba.cuda`` (:mod:`mwumkl_dist.data.cuda`).

    ``driver_gpu``: the fit's driver has this GPU (the local engine: its shards, rules and scoring run there);
    False for a Dask driver, which may have none: its workers' shards check their own GPU, and the driver keeps
    the rules and scoring on its CPU.
    """

    name = "cuda"
    on_host = False

    def __init__(self, driver_gpu: bool = True):
        self.driver_gpu = bool(driver_gpu)

    @classmethod
    def for_engine(cls, engine: str) -> CUDABackend:
        return cls(driver_gpu=engine == "local")

    @staticmethod
    def _cuda():
        from mwumkl_dist.data import cuda

        return cuda

    def check(self) -> None:
        if self.driver_gpu:
            self._cuda().check_device()

    def mwu_problem(self, problem, n_threads: int):
        # The GPU is checked first, whatever the size: a missing one is the same error for every fit.
        self.check()
        device = "cuda"
        if self.driver_gpu:
            device = routing.mwu_device("cuda", problem.n_samples, problem.n_kernels, n_threads)
        problem = self._cuda().on_device(problem, device, driver_gpu=self.driver_gpu)
        return problem, (self if device == "cuda" else CPU)

    def mwu_rules(self, problem, s, **settings):
        return self._cuda().DeviceRules(problem, s, **settings) if self.driver_gpu else None

    def kernel_sums(self):
        return self._cuda().weighted_kernel_sums

    def scoring(self, n_rows: int, n_support: int, n_kernels: int, n_threads: int):
        if not self.driver_gpu:
            return CPU
        return self if routing.scoring_device("cuda", n_rows, n_support, n_kernels, n_threads) == "cuda" else CPU

    def column_store(self, feature_map, width: int, dtype):
        if np.dtype(dtype) != np.float32:
            raise ValueError(f"a GPU shard keeps its kernel columns in single precision, not {np.dtype(dtype)}")
        return self._cuda().DeviceColumns(feature_map.kernel_set, feature_map.landmarks, feature_map.weights, width)

    def pass_costs(self, host_pass: float, host_cg_pass: float) -> tuple[float, float, float]:
        return routing.GPU_PASS_SECONDS, routing.GPU_PASS_SECONDS, routing.COPY_SECONDS


#: The back-end class of each ``device`` name.
BACKENDS = {"cpu": CPUBackend, "cuda": CUDABackend}


def backend_named(device) -> CPUBackend:
    """The back-end of ``device``: a back-end as it is, or a name of :data:`BACKENDS` (whose driver has it)."""
    if isinstance(device, CPUBackend):
        return device
    try:
        return BACKENDS[device]()
    except (KeyError, TypeError):
        raise ValueError(f"device must be one of {sorted(BACKENDS)}, got {device!r}") from None


def backend_for(device: str, engine: str) -> CPUBackend:
    """The back-end of a fit on ``device`` with ``engine``: the one decision of a fit's device, made once."""
    return type(backend_named(device)).for_engine(engine)

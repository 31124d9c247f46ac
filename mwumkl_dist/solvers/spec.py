"""The fit specification: the estimator's parameters, validated once, as frozen dataclasses.

:class:`~mwumkl_dist.estimator.MWUMKLClassifier` turns its parameters into a :class:`FitSpec`
(:meth:`FitSpec.from_params`) at the start of ``fit``; the solvers, the automatic choices, the
calibration and the weight stage take the specification, never the estimator.  A specification is two
parts, as Falkon keeps its hyper-parameters apart from its ``FalkonOptions``:

- :class:`ModelSettings`, what decides the model (kernels, ``C``, ``epsilon``, selectivity, polish, seed,
  ...): two fits with the same settings give the same model;
- :class:`ExecutionOptions`, how the fit runs (engine, device, client, shards, threads, memory, checkpoint,
  timeouts, progress): they change where and how fast a model is fitted, never the model.

A nested fit (a cross-validation fold, the two-stage weight stage) changes a few model settings and runs
locally (:meth:`FitSpec.nested`).

Each part checks its own parameters, one checker each in its ``CONSTRAINTS`` table (scikit-learn's
``_parameter_constraints`` habit: one declarative table, checked in one place), and the few rules that
tie two of its parameters together (:meth:`ModelSettings.checked`, :meth:`ExecutionOptions.checked`).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import ClassVar

import numpy as np

from mwumkl_dist.core.mwu_rules import eps_prime
from mwumkl_dist.data.backends import BACKENDS
from mwumkl_dist.devices.memory import parse_memory_limit
from mwumkl_dist.devices.threads import resolve_n_jobs
from mwumkl_dist.io.atomic import check_output_path
from mwumkl_dist.io.checkpoint import is_checkpoint_file

__all__ = [
    "ExecutionOptions",
    "FitSpec",
    "ModelSettings",
    "PARAMETER_CONSTRAINTS",
    "SOLVER_NAMES",
    "check_selectivity",
    "check_solver",
]

#: The values of the ``solver`` parameter.
SOLVER_NAMES = ("auto", "mwu", "two-stage")


def _real(name: str, value, alternative: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number{alternative}, got {value!r}")
    return float(value)


def _auto_or_real(name: str):
    def check(value):
        if isinstance(value, str) and value == "auto":
            return None  # resolved during the fit
        return _real(name, value, ' or "auto"')

    return check


def _positive_int(name: str):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
        return value

    return check


def _one_of(name: str, options: tuple):
    def check(value):
        if not (isinstance(value, str) and value in options):
            wanted = " or ".join(repr(o) for o in options)
            raise ValueError(f"{name} must be {wanted}, got {value!r}")
        return value

    return check


def _rho(value):
    rho = _real("rho", value)
    if not (np.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be positive and finite, got {value!r}")
    return rho


#: Smallest ``C``: its ridge ``1 / C`` must leave room in a double for the kernel values added to it.
MIN_C = 1e-100
#: Largest finite selectivity: exponents up to it are exact in a double (the exact optimum's is ~10^4).
MAX_SELECTIVITY = 1e12


def _C(value):
    C = _auto_or_real("C")(value)
    if C is not None and not C >= MIN_C:
        raise ValueError(f"C must be positive, at least {MIN_C:g} (np.inf for the hard margin), got {value!r}")
    return C


def _max_iter(value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
        raise ValueError(f"max_iter must be None or a positive integer, got {value!r}")
    return value


def check_selectivity(selectivity):
    """``selectivity`` as the estimator takes it: "auto", "paper", "exact" (also ``np.inf``) or a real ``>= 0``."""
    if isinstance(selectivity, str):
        if selectivity in ("auto", "paper", "exact"):
            return selectivity
        raise ValueError(f'selectivity must be "auto", "paper", "exact" or a number >= 0, got {selectivity!r}')
    if isinstance(selectivity, (bool, np.bool_)) or not isinstance(selectivity, numbers.Real):
        raise TypeError(f'selectivity must be "auto", "paper", "exact" or a number >= 0, got {selectivity!r}')
    value = float(selectivity)
    if np.isnan(value) or value < 0 or MAX_SELECTIVITY < value < np.inf:
        raise ValueError(
            f"selectivity must be in [0, {MAX_SELECTIVITY:g}] (0: uniform weights, np.inf: the exact optimum), "
            f"got {value!r}"
        )
    return "exact" if np.isinf(value) else value


def check_solver(solver) -> str:
    """``solver`` as the estimator takes it: "auto", "mwu" or "two-stage"."""
    if not isinstance(solver, str) or solver not in SOLVER_NAMES:
        raise ValueError(f'solver must be "auto", "mwu" or "two-stage", got {solver!r}')
    return solver


def _n_jobs(value):
    if value is not None:
        resolve_n_jobs(value)  # ValueError naming n_jobs
    return value


def _worker_timeout(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"worker_timeout must be a positive number of seconds, got {value!r}")
    return value


def _scheduler_timeout(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < value < np.inf):
        raise ValueError(f"scheduler_timeout must be a positive finite number of seconds, got {value!r}")
    return value


def _scale_C(value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"scale_C must be True or False, got {value!r}")
    return bool(value)


def _scale_features(value):
    if isinstance(value, str) and value == "auto":
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"scale_features must be 'auto', True or False, got {value!r}")
    return bool(value)


def _checkpoint(value):
    if value is None:
        return None
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"checkpoint must be a path or None, got {type(value).__name__}")
    check_output_path(value, "checkpoint", is_ours=is_checkpoint_file)  # a bad path fails now, not after the fit
    return value


def _superstep_timeout(value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0):
        raise ValueError(f"superstep_timeout must be None or a positive number of seconds, got {value!r}")
    return value


def _n_shards(value):
    if isinstance(value, str) and value == "auto":
        return value  # resolved where the engine is known (see the n_shards parameter)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f'n_shards must be "auto" or a positive integer, got {value!r}')
    return int(value)


def _n_components(value):
    if isinstance(value, str) and value == "auto":
        return None  # the rank follows the data (see the two-stage solver)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f'n_components must be "auto" or a positive integer, got {value!r}')
    return int(value)


def _callback(value):
    if value is not None and not callable(value):
        raise TypeError("callback must be callable or None")
    return value


def _polish(value):
    if not (value is True or value is False or value == "auto"):
        raise ValueError(f"polish must be 'auto', True or False, got {value!r}")
    return value


def _probability(value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"probability must be True or False, got {value!r}")
    return value


def _class_weight(value):
    if not (value is None or (isinstance(value, str) and value == "balanced") or isinstance(value, dict)):
        raise ValueError(f"class_weight must be None, 'balanced' or a dict {{label: weight}}, got {value!r}")
    return value


def _memory_limit(value):
    parse_memory_limit(value)  # ValueError naming memory_limit; resolved in bytes when the fit starts
    return value


def _unchecked(value):
    return value


@dataclass(frozen=True)
class ModelSettings:
    """What decides the model: the estimator's hyper-parameters, validated.

    ``epsilon``, ``C`` and ``n_components`` are numbers, or None for ``"auto"``; ``selectivity`` is
    "auto", "paper", "exact" or a float; everything else is as the estimator documents it.
    """

    #: One checker per parameter: each returns the value the settings hold (``"auto"`` becomes None for
    #: ``epsilon``, ``C`` and ``n_components``) or raises naming the parameter.
    CONSTRAINTS: ClassVar[dict[str, Callable]] = {
        "rho": _rho,
        "selectivity": check_selectivity,
        "solver": check_solver,
        "epsilon": _auto_or_real("epsilon"),
        "C": _C,
        "max_iter": _max_iter,
        "polish": _polish,
        "n_components": _n_components,
        "probability": _probability,
        "class_weight": _class_weight,
        "kernels": _unchecked,  # checked with the data (make_training_input)
        "scale_C": _scale_C,
        "scale_features": _scale_features,
        "random_state": _unchecked,  # checked when a seed is drawn (random_seed)
    }

    kernels: object = "auto"
    epsilon: float | None = None
    C: float | None = None
    rho: float = 0.5
    selectivity: object = "auto"
    max_iter: int | None = None
    scale_C: bool = True
    scale_features: object = "auto"
    polish: object = "auto"
    random_state: object = 0
    class_weight: object = None
    probability: bool = False
    solver: str = "auto"
    n_components: int | None = None
    #: Not a parameter: the search candidate the fit refits at ``C`` (a group selection, a band of widths, a
    #: feature structure: :mod:`mwumkl_dist.solvers.candidates`), chosen by ``C="auto"``'s search or handed to a
    #: nested fit (probabilities' folds); None: a plain fit at ``selectivity``. It needs a given ``C``.
    candidate: object = None
    #: Not a parameter: whether ``selectivity="auto"`` may score bands of Gaussian widths (the two-stage
    #: fit's weight stage turns them off where its sample is far smaller than the data; see its solver).
    width_bands: bool = True

    @classmethod
    def checked(cls, params: dict) -> ModelSettings:
        """The settings of an estimator's parameters (extra keys ignored); raises on any bad one."""
        values = {name: check(params[name]) for name, check in cls.CONSTRAINTS.items()}
        if values["epsilon"] is not None:
            eps_prime(values["epsilon"], values["rho"])  # validates 0 < epsilon < 2 rho
        if (
            values["scale_features"] is True
            and isinstance(params["kernels"], str)
            and params["kernels"] == "precomputed"
        ):
            raise ValueError("scale_features=True needs feature rows; precomputed kernels have none")
        if values["polish"] is True and values["C"] is not None and np.isinf(values["C"]):
            raise ValueError("polish=True is not available for the hard margin (C = inf): the hulls may intersect")
        return cls(**values)

    def scales_features(self) -> bool:
        """Whether the fit learns a factor per feature: ``scale_features=True``, or ``"auto"`` with
        ``kernels="auto"`` (explicit kernels keep their widths in the data's own units)."""
        if self.scale_features == "auto":
            return isinstance(self.kernels, str) and self.kernels.strip().lower() == "auto"
        return self.scale_features

    def C_per_point(self, n_samples: int) -> float | None:
        """The given ``C`` in size-relative units (``scale_C`` or not); None for ``"auto"``."""
        if self.C is None:
            return None
        return float(self.C) if self.scale_C else float(self.C) / n_samples


@dataclass(frozen=True)
class ExecutionOptions:
    """How a fit runs: engine, device, shards, threads, memory, checkpoint, timeouts and progress, validated.

    None of them changes the model (the engines and devices give the same bits); ``n_shards`` may be "auto".
    """

    #: One checker per option: each returns the value the options hold or raises naming the parameter.
    CONSTRAINTS: ClassVar[dict[str, Callable]] = {
        "engine": _one_of("engine", ("local", "dask")),
        "device": _one_of("device", tuple(BACKENDS)),
        "n_shards": _n_shards,
        "n_kernel_shards": _positive_int("n_kernel_shards"),
        "callback_every": _positive_int("callback_every"),
        "checkpoint_every": _positive_int("checkpoint_every"),
        "n_jobs": _n_jobs,
        "worker_timeout": _worker_timeout,
        "superstep_timeout": _superstep_timeout,
        "callback": _callback,
        "memory_limit": _memory_limit,
        "client": _unchecked,
        "checkpoint": _checkpoint,
        "scheduler_timeout": _scheduler_timeout,
        "verbose": _unchecked,
    }

    engine: str = "local"
    device: str = "cpu"
    client: object = None
    n_shards: int | str = "auto"
    n_kernel_shards: int = 1
    n_jobs: int | None = None
    memory_limit: object = "auto"
    checkpoint: object = None
    checkpoint_every: int = 100
    scheduler_timeout: float = 10.0
    worker_timeout: float = 600.0
    superstep_timeout: float | None = None
    callback: Callable | None = None
    callback_every: int = 100
    verbose: int = 0

    @classmethod
    def checked(cls, params: dict) -> ExecutionOptions:
        """The options of an estimator's parameters (extra keys ignored); raises on any bad one."""
        values = {name: check(params[name]) for name, check in cls.CONSTRAINTS.items()}
        if values["engine"] == "local" and values["n_kernel_shards"] != 1:
            raise ValueError("n_kernel_shards needs engine='dask' (the local engine shards rows only)")
        return cls(**values)

    def local(self) -> ExecutionOptions:
        """These options for a nested fit in this process (the two-stage weight stage, a fold): one shard, no
        checkpoint; the fit's own callback and logging."""
        return replace(self, engine="local", n_shards=1, n_kernel_shards=1, checkpoint=None)

    def quiet(self) -> ExecutionOptions:
        """These options for a nested fit that reports nothing and keeps no checkpoint (a fold, a selection)."""
        return replace(self, checkpoint=None, callback=None, verbose=0)


#: Every parameter's checker, the model's then the execution's (:attr:`ModelSettings.CONSTRAINTS`,
#: :attr:`ExecutionOptions.CONSTRAINTS`).
PARAMETER_CONSTRAINTS: dict[str, Callable] = {**ModelSettings.CONSTRAINTS, **ExecutionOptions.CONSTRAINTS}


@dataclass(frozen=True)
class FitSpec:
    """What a fit runs with: the model's settings and the execution's options, validated."""

    model: ModelSettings = field(default_factory=ModelSettings)
    execution: ExecutionOptions = field(default_factory=ExecutionOptions)

    @classmethod
    def from_params(cls, params: dict) -> FitSpec:
        """The specification of an estimator's ``get_params()``; raises on any bad parameter."""
        return cls(ModelSettings.checked(params), ExecutionOptions.checked(params))

    @classmethod
    def of(cls, **params) -> FitSpec:
        """A specification from keyword parameters, unchecked (for tests): each goes to its part."""
        model_names = {f.name for f in fields(ModelSettings)}
        model = {k: v for k, v in params.items() if k in model_names}
        return cls(ModelSettings(**model), ExecutionOptions(**{k: v for k, v in params.items() if k not in model}))

    def with_model(self, **changes) -> FitSpec:
        """This specification with model settings ``changes``, the same execution."""
        return replace(self, model=replace(self.model, **changes))

    def nested(self, **changes) -> FitSpec:
        """The specification of a cross-validation fold's fit: model settings ``changes``, run locally and
        quietly (:meth:`ExecutionOptions.local`, :meth:`ExecutionOptions.quiet`)."""
        return FitSpec(replace(self.model, **changes), self.execution.local().quiet())

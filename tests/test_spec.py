"""The fit specification: the model's settings apart from the execution's options (solvers/spec.py)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import pytest

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.solvers import auto
from mwumkl_dist.solvers.spec import PARAMETER_CONSTRAINTS, ExecutionOptions, FitSpec, ModelSettings


def _names(cls) -> set:
    return {f.name for f in fields(cls)}


def test_every_estimator_parameter_is_in_exactly_one_part():
    params = set(MWUMKLClassifier().get_params())
    model, execution = set(ModelSettings.CONSTRAINTS), set(ExecutionOptions.CONSTRAINTS)
    assert not model & execution
    assert model | execution == params == set(PARAMETER_CONSTRAINTS)
    assert model <= _names(ModelSettings) and execution == _names(ExecutionOptions)
    assert _names(ModelSettings) - model == {"candidate", "width_bands"}  # not parameters (nested fits')


def test_the_parts_are_frozen_and_default_to_the_estimator():
    spec = FitSpec.from_params(MWUMKLClassifier().get_params())
    assert spec == FitSpec()
    with pytest.raises(FrozenInstanceError):
        spec.model.C = 1.0
    with pytest.raises(FrozenInstanceError):
        spec.execution.engine = "dask"


def test_each_part_checks_its_own_rules():
    params = MWUMKLClassifier().get_params()
    with pytest.raises(ValueError, match="n_kernel_shards needs engine='dask'"):
        ExecutionOptions.checked({**params, "n_kernel_shards": 2})
    with pytest.raises(ValueError, match="polish=True is not available for the hard margin"):
        ModelSettings.checked({**params, "polish": True, "C": float("inf")})
    ModelSettings.checked({**params, "n_kernel_shards": 2})  # an execution option: not the model's business


def test_a_fold_keeps_the_model_and_runs_locally_and_quietly():
    spec = FitSpec.of(engine="dask", n_shards=4, n_kernel_shards=2, checkpoint="c.npz", callback=print, verbose=2,
                      n_jobs=3, device="cuda", C=5.0, scale_C=False, rho=0.25, probability=True)  # fmt: skip
    fold = auto.fold_spec(spec, polished=True, C=0.5, selectivity=0.0)
    assert fold.model == ModelSettings(C=0.5, scale_C=True, rho=0.25, selectivity=0.0, polish=True, solver="mwu")
    assert fold.execution == ExecutionOptions(n_jobs=3, device="cuda", n_shards=1)  # local, quiet, same device
    weight_stage = FitSpec(spec.model, spec.execution.local())  # the weight stage reports progress
    assert (weight_stage.execution.callback, weight_stage.execution.verbose) == (print, 2)
    assert weight_stage.execution.engine == "local" and weight_stage.execution.checkpoint is None

"""The device back-ends (mwumkl_dist/data/backends.py): one object per device, resolved once per fit."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from mwumkl_dist.data.backends import BACKENDS, CPU, CPUBackend, CUDABackend, backend_for, backend_named


def test_the_registry_names_every_device_the_estimator_takes():
    from mwumkl_dist.solvers.spec import PARAMETER_CONSTRAINTS

    assert BACKENDS == {"cpu": CPUBackend, "cuda": CUDABackend}
    for name in BACKENDS:
        assert PARAMETER_CONSTRAINTS["device"](name) == name
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda', got 'tpu'"):
        PARAMETER_CONSTRAINTS["device"]("tpu")
    with pytest.raises(ValueError, match=r"device must be one of \['cpu', 'cuda'\], got 'gpu'"):
        backend_named("gpu")


def test_a_fit_resolves_its_back_end_from_device_and_engine():
    assert backend_for("cpu", "local") == CPU and backend_for("cpu", "dask") == CPU
    local, dask = backend_for("cuda", "local"), backend_for("cuda", "dask")
    assert local == CUDABackend(driver_gpu=True) and dask == CUDABackend(driver_gpu=False)
    assert backend_named(local) is local  # a back-end is passed on as it is
    assert pickle.loads(pickle.dumps(dask)) == dask  # Dask workers get it with their shards
    # A Dask driver may have no GPU: it keeps the rules and the scoring on its CPU (nothing imports numba.cuda).
    assert dask.mwu_rules(None, None) is None
    assert dask.scoring(10**6, 10**4, 10**3, 16) == CPU


def test_the_host_back_end_asks_for_nothing_of_a_device():
    problem = object()
    assert CPU.mwu_problem(problem, 4) == (problem, CPU)
    assert CPU.mwu_rules(problem, np.ones(3)) is None
    assert CPU.kernel_sums() is None  # support_vector_sums' default: the CPU's numba kernels
    assert CPU.scoring(10**6, 10**4, 10**3, 16) is CPU
    assert CPU.column_store(None, 10, np.float32) is None
    assert CPU.pass_costs(1.0, 2.0) == (1.0, 2.0, 0.0)


def test_the_linear_stage_weighs_the_back_end_s_pass_costs():
    from mwumkl_dist.devices import routing
    from mwumkl_dist.solvers.two_stage.newton import linear_method

    assert CUDABackend().pass_costs(1.0, 2.0) == (routing.GPU_PASS_SECONDS, routing.GPU_PASS_SECONDS,
                                                  routing.COPY_SECONDS)  # fmt: skip
    for args in [(10**6, 2000, 2000), (6000, 400, 400), (10**5, 800, 100)]:
        assert linear_method(*args, device="cuda") == linear_method(*args, device=CUDABackend(driver_gpu=False))
        assert linear_method(*args, device="cpu") == linear_method(*args, device=CPU)


def test_the_fit_task_carries_the_back_end():
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.data.problems import make_training_input
    from mwumkl_dist.solvers.base import FitTask
    from mwumkl_dist.solvers.spec import FitSpec

    X = np.random.default_rng(0).normal(size=(12, 2))
    y = np.array(["a", "b"] * 6)
    for device, engine, want in [("cpu", "local", CPU), ("cuda", "dask", CUDABackend(driver_gpu=False))]:
        spec = FitSpec.from_params(MWUMKLClassifier(kernels="linear", device=device, engine=engine).get_params())
        data = make_training_input(X, y, spec.model.kernels, estimator=None)
        task = FitTask.prepare(spec, data, sample_weight=None, seed=0, fit=lambda *a, **k: {})
        assert task.backend == want


def test_the_command_line_takes_the_registrys_devices(monkeypatch):
    """``--device`` asks the registry (a new device is one module and one entry in BACKENDS, no CLI change)."""
    from mwumkl_dist.cli import build_parser
    from mwumkl_dist.cli.args import UsageError
    from mwumkl_dist.data import backends

    def device(*option):
        return build_parser().parse_args(["fit", "--data", "x", "--model", "m", *option]).device

    assert device() is None  # the estimator's default
    assert device("--device", "cuda") == "cuda"
    with pytest.raises(UsageError, match=r"--device: invalid choice: 'tpu' \(choose from 'cpu', 'cuda'\)"):
        device("--device", "tpu")
    monkeypatch.setitem(backends.BACKENDS, "tpu", CPUBackend)
    assert device("--device", "tpu") == "tpu"


def test_the_architecture_docs_device_recipe_is_the_real_code():
    """docs/architecture.md, "Add a device": every line its diff adds to data/backends.py is there, in order."""
    from pathlib import Path

    from mwumkl_dist.data import backends

    doc = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    section = doc.split("## Add a device", 1)[1]
    diff = [line.removeprefix("  ") for line in section.split("```diff\n", 1)[1].split("```", 1)[0].splitlines()]
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    source = Path(backends.__file__).read_text().splitlines()
    assert len(added) > 50 and "BACKENDS = " in added[-1]
    at = 0
    for line in added:
        at = source.index(line, at) + 1  # ValueError: the doc shows a line the code does not have

"""The two-stage fit on a GPU (``device="cuda"``): its linear stage's columns and products under numba's CUDA simulator.

``NUMBA_ENABLE_CUDASIM=1`` must be set before ``numba.cuda`` is first imported, so the checks run in a
subprocess (this file run as a script), as in ``test_cuda_sim.py``.  The simulator runs the kernels'
Python code thread by thread: the problems are tiny.  The GPU keeps the columns in single precision as
the CPU does, but computes their double-precision values with its own dot products (the CPU's are BLAS's),
so a column may differ by one unit in the last place of a float; the products over them accumulate in
double precision.
"""

from __future__ import annotations

import os
import subprocess
import sys

import _cudasim
import numpy as np
import pytest

CASES = ["columns", "products", "fit", "routing"]


# Every case in one subprocess, under the simulator and (where there is one) on a GPU.
TESTS = _cudasim.case_tests(__file__, CASES, run_timeout=560, test_timeout=600)
simulator_run, test_two_stage_linear_stage_under_simulator, gpu_run, test_two_stage_linear_stage_on_a_gpu = TESTS


def test_device_cuda_resolves_to_the_two_stage_fit():
    from types import SimpleNamespace

    from mwumkl_dist.solvers.driver import resolve_solver, solver_note
    from mwumkl_dist.solvers.spec import FitSpec
    from mwumkl_dist.solvers.two_stage.solver import AUTO_TWO_STAGE_POINTS

    data = SimpleNamespace(n_samples=AUTO_TWO_STAGE_POINTS + 1, kernel_set=object(), polish_blocker=None)
    from mwumkl_dist import MWUMKLClassifier

    spec = FitSpec.from_params(MWUMKLClassifier(device="cuda").get_params())
    assert resolve_solver(spec, data) == "two-stage"
    assert solver_note(spec, data) is None  # nothing to warn about: the GPU does not rule the two-stage fit out


def test_gpu_cost_model_prefers_the_device_passes():
    from mwumkl_dist.solvers.two_stage.newton import linear_method

    # 10^6 rows on 2000 landmarks at rank 2000, cold: the CPU forms the explicit Hessian (a GEMM beats 310
    # passes over the columns at a CPU's bandwidth); on a GPU the passes are cheap and the copy is not.
    assert linear_method(10**6, 2000, 2000, device="cpu") == "explicit"
    assert linear_method(10**6, 2000, 2000, device="cuda") == "cg"


@pytest.mark.timeout(300)
def test_device_benchmark_script_runs():
    """``benchmarks/device_two_stage.py``: its smoke run on the CPU prints a record per fit and the machine;
    asked for a GPU where there is none, one clear line and status 2 before any fit."""
    import json
    from pathlib import Path

    from mwumkl_dist.data.cuda import gpu_available

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "device_two_stage.py"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(script), "--devices", "cpu", "--smoke"], env=env, capture_output=True,
                          text=True, timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    fit, machine = (json.loads(line) for line in proc.stdout.splitlines())
    assert fit["device"] == "cpu" and fit["n"] == 3200 and fit["solver"] == "two-stage"
    assert fit["fit_s"] > 0 and 0 <= fit["error"] < 0.5 and fit["method"] in ("exact", "explicit", "cg")
    assert fit["rank"] == 3200 if fit["method"] == "exact" else 0 < fit["rank"] < 3200
    assert machine["machine"]["cores"] >= 1
    if not gpu_available():
        proc = subprocess.run([sys.executable, str(script), "--sizes", "4000"], env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
        assert proc.stderr.startswith("device_two_stage.py: no usable GPU") and "device='cuda'" in proc.stderr
    bad = subprocess.run([sys.executable, str(script), "--devices", "tpu"], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--devices" in bad.stderr


# ----------------------------------------------------------------------------- the checks (in the subprocess)


def _within_a_float_ulp(a, b) -> bool:
    """Single-precision values that differ by at most one unit in the last place."""
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return bool(np.all(np.abs(a.astype(np.float64) - b) <= np.spacing(np.maximum(np.abs(a), np.abs(b)))))


def _tree(parts):
    """The sum of a shard's per-node parts (None: a node without rows)."""
    return sum(part for _, part in parts if part is not None)


def case_columns():
    """A GPU shard's columns against the CPU shard's, its products against numpy on its own columns, at two rank
    levels (the smaller uses the first landmarks' columns), over row blocks of a shard that does not start at 0."""
    import scipy.sparse as sp

    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.solvers.two_stage.nystroem import nystroem_map
    from mwumkl_dist.solvers.two_stage.shards import LinearShard

    rng = np.random.default_rng(0)
    dense = rng.normal(size=(53, 5))
    sparse = sp.random(53, 7, density=0.4, random_state=2, format="csr") * 2.0
    specs = [
        (dense, "linear, poly:2, gaussian:1, gaussian:0.7071067811865476, gaussian:2@1-3, poly:3:coef0=0.5"),
        (sparse, "linear@0-3, gaussian:1@2-6, gaussian:0.7071067811865476@2-6, poly:2@5+6, gaussian:2"),
    ]
    for X, kernels in specs:
        ks = KernelSet(kernels, X.shape[1])
        weights = rng.random(len(ks))
        weights[2] = 0.0  # a Gaussian of weight 0 is skipped on the GPU
        landmarks = X[:11]
        small, full = nystroem_map(ks, landmarks[:6], weights), nystroem_map(ks, landmarks, weights)
        bases = [small.basis, full.basis]
        y = np.where(rng.random(53) < 0.5, 1.0, -1.0)
        cw = rng.uniform(0.5, 2.0, 53)
        start, stop = 8, 53  # rows 8..52 in blocks of 8: a last, short block
        shards = {}
        for device in ("cpu", "cuda"):
            shard = LinearShard(X[start:stop], start, stop, ks, row_block=8, device=device)
            storage = shard.load_problem(full, y[start:stop], cw[start:stop], bases)
            assert storage == ("device" if device == "cuda" else "memory"), storage
            shards[device] = shard
        cpu, gpu = shards["cpu"], shards["cuda"]
        assert gpu.store is not None and len(gpu.store.blocks) == len(cpu.blocks) == 6
        host = [np.asarray(gpu.columns(i), dtype=np.float64) for i in range(len(gpu.blocks))]
        for i, block in enumerate(host):
            assert block.shape == (len(range(*gpu.blocks[i])), 11) and gpu.columns(i).dtype == np.float32
            assert _within_a_float_ulp(gpu.columns(i), cpu.columns(i)), i
            assert np.array_equal(gpu.columns(i, [0, 2]), gpu.columns(i)[[0, 2]])
        every = np.vstack(host)
        n = stop - start
        active = rng.random(n) < 0.6
        active[:8] = False  # a block without an active row
        for level, basis in enumerate(bases):
            w = basis.width
            d = rng.normal(size=basis.rank + 1)
            beta = basis.lift(d[:-1])
            want = every[:, :w] @ beta + d[-1]
            np.testing.assert_allclose(gpu.direction(d, level), want, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(gpu.direction(d, level), cpu.direction(d, level), rtol=1e-5, atol=1e-6)
            for i in range(len(gpu.blocks)):  # DeviceColumns itself, block by block
                got = gpu.store.times(i, beta, d[-1])
                np.testing.assert_allclose(got, host[i][:, :w] @ beta + d[-1], rtol=1e-12, atol=1e-12)
            beta = rng.normal(size=w)
            for labels in (False, True):
                t = every[:, :w] @ beta + 0.25 - (y[start:stop] if labels else 0.0)
                t = np.where(active, t * cw[start:stop], 0.0)
                want = np.append(t @ every[:, :w], t.sum())
                args = (level, np.packbits(active), beta, 0.25, labels)
                got = _tree(gpu.active_sums(*args))
                assert got.shape == (w + 1,), got.shape
                np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
                np.testing.assert_allclose(got, _tree(cpu.active_sums(*args)), rtol=1e-5, atol=1e-6)
            chosen = np.packbits(rng.random(n) < 0.3)
            np.testing.assert_array_equal(gpu.selected_columns(level, chosen), every[np.unpackbits(chosen, count=n)
                                                                                      .astype(bool), :w])  # fmt: skip
            np.testing.assert_allclose(gpu.selected_columns(level, chosen), cpu.selected_columns(level, chosen),
                                       rtol=1e-6, atol=1e-7)  # fmt: skip
            entering, leaving = np.packbits(active), np.packbits(~active & (rng.random(n) < 0.5))
            for on_columns in (False, True):
                a = _tree(gpu.gram_parts(level, entering, leaving, on_columns))
                b = _tree(cpu.gram_parts(level, entering, leaving, on_columns))
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
        gpu.close()
        assert gpu.store is None


def case_products():
    """``DeviceColumns.active_sums`` over blocks of several row chunks (the coalesced pass adds a block per
    landmark and chunk, then the chunks in order): against numpy on the GPU's own columns, for chunks that are,
    and are not, a multiple of the block size, a last short chunk, a chunk without an active row; the same
    bits on every run."""
    from mwumkl_dist.data.cuda import DeviceColumns
    from mwumkl_dist.data.cuda import kernels as K
    from mwumkl_dist.kernels import KernelSet

    rng = np.random.default_rng(5)
    X = rng.normal(size=(150, 4))
    ks = KernelSet("linear, gaussian:1, poly:2", 4)
    columns = DeviceColumns(ks, X[:9], rng.random(3), 9)
    columns.put(0, X)
    C = columns.host(0).astype(np.float64)
    y = np.where(rng.random(150) < 0.5, 1.0, -1.0)
    c = rng.uniform(0.5, 2.0, 150)
    active = rng.random(150) < 0.7
    active[40:80] = False  # a whole chunk of 32 rows without an active row
    beta = rng.normal(size=7)  # the first 7 landmarks (a smaller rank level)
    for labels in (False, True):
        t = C[:, :7] @ beta + 0.5 - (y if labels else 0.0)
        t = np.where(active, c * t, 0.0)
        want = np.append(t @ C[:, :7], t.sum())
        runs, default = [], K.PRODUCT_CHUNK
        for chunk in (default, 32, 20, 150, 1000):
            K.PRODUCT_CHUNK = chunk
            try:
                got = columns.active_sums(0, active, beta, 0.5, y, c, labels)
            finally:
                K.PRODUCT_CHUNK = default
            assert got.shape == (8,)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
            runs.append(got)
        again = columns.active_sums(0, active, beta, 0.5, y, c, labels)
        assert np.array_equal(again, runs[0])  # deterministic
    # y and c stay on the GPU between products; other arrays are sent
    assert len(columns._rows_data) == 1
    c2 = c * 2.0
    t = np.where(active, c2 * (C[:, :7] @ beta + 0.5), 0.0)
    got = columns.active_sums(0, active, beta, 0.5, y, c2, False)
    np.testing.assert_allclose(got, np.append(t @ C[:, :7], t.sum()), rtol=1e-12, atol=1e-12 * np.abs(got).max())


def case_fit():
    """Two-stage fits with ``device="cuda"`` (weight stage on the GPU engine, columns and Newton passes on the
    GPU) against ``device="cpu"``: the same kernel weights (the MWU engines agree bit for bit) and landmarks,
    decision functions equal to a tight tolerance; by the explicit Hessian and by conjugate gradients, on one
    and on two shards; and through the estimator, where ``solver="auto"`` would pick it."""
    import dataclasses

    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.data import cuda as cuda_shards
    from mwumkl_dist.data.problems import make_training_input
    from mwumkl_dist.solvers import two_stage
    from mwumkl_dist.solvers.base import FitTask
    from mwumkl_dist.solvers.driver import fit_model
    from mwumkl_dist.solvers.spec import FitSpec

    rng = np.random.default_rng(3)
    X = rng.random((72, 3))
    y = np.where(np.sin(3 * X[:, 0]) + X[:, 1] ** 2 - 0.6 + 0.1 * rng.standard_normal(72) > 0, "a", "b")
    Xt = rng.random((40, 3))
    params = dict(kernels="linear, gaussian:0.5, gaussian:1, poly:2", C=10.0, epsilon=0.5)
    loads = []
    real_put = cuda_shards.DeviceColumns.put

    def counted_put(self, i, X):
        loads.append(X.shape[0])
        return real_put(self, i, X)

    cuda_shards.DeviceColumns.put = counted_put

    def fitted(device, method, n_shards):
        est = MWUMKLClassifier(device=device, n_shards=n_shards, **params)
        spec = FitSpec.from_params(est.get_params())
        data = make_training_input(X, y, est.kernels, estimator=est)
        solver = dataclasses.replace(two_stage.TwoStageSolver(), weight_points=72, n_components=14, row_block=16,
                                     method=method)  # fmt: skip
        task = FitTask.prepare(spec, data, sample_weight=None, seed=0, fit=fit_model)
        attrs = {"classes_": task.classes, "kernel_names_": data.kernel_names, **solver.fit(spec, task).attributes}
        for name, value in attrs.items():
            setattr(est, name, value)
        return est

    for method, n_shards in (("explicit", 1), ("cg", 2)):
        cpu = fitted("cpu", method, n_shards)
        del loads[:]
        gpu = fitted("cuda", method, n_shards)
        assert sum(loads) == 72, loads  # every row's columns computed on the GPU
        assert cpu.solver_ == gpu.solver_ == "two-stage" and gpu.n_components_ == cpu.n_components_
        assert np.array_equal(cpu.kernel_weights_, gpu.kernel_weights_)
        assert np.array_equal(cpu.support_, gpu.support_) and len(gpu.support_) == 14
        np.testing.assert_allclose(gpu.dual_coef_, cpu.dual_coef_, rtol=1e-4, atol=1e-4 * np.abs(cpu.dual_coef_).max())
        want = cpu.decision_function(Xt)
        np.testing.assert_allclose(gpu.decision_function(Xt), want, rtol=0, atol=1e-5 * np.abs(want).max())
        assert np.array_equal(gpu.predict(Xt[np.abs(want) > 1e-3]), cpu.predict(Xt[np.abs(want) > 1e-3]))
        print(
            f"{method}, {n_shards} shard(s): largest difference of the decision function "
            f"{np.abs(gpu.decision_function(Xt) - want).max():.2e} (of values up to {np.abs(want).max():.2f})"
        )
    # the estimator, as a user calls it
    del loads[:]
    a = MWUMKLClassifier(solver="two-stage", n_components=14, **params).fit(X, y)
    b = MWUMKLClassifier(solver="two-stage", n_components=14, device="cuda", **params).fit(X, y)
    assert sum(loads) == 72 and b.solver_ == "two-stage", loads
    assert np.array_equal(a.support_, b.support_)
    want = a.decision_function(Xt)
    np.testing.assert_allclose(b.decision_function(Xt), want, rtol=0, atol=1e-5 * np.abs(want).max())
    cuda_shards.DeviceColumns.put = real_put


def case_routing():
    """The device cost model on (outside these tests it is the default): a small two-stage fit with
    ``device="cuda"`` runs its weight stage's MWU fit on CPU threads (launch-bound on a GPU) and keeps its linear
    stage's columns on the GPU; the model is the one with every MWU fit on the GPU (their numbers are equal)."""
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.data import cuda as cuda_shards
    from mwumkl_dist.devices import routing

    rng = np.random.default_rng(4)
    X = rng.random((72, 3))
    y = np.where(np.sin(3 * X[:, 0]) + X[:, 1] ** 2 - 0.6 + 0.1 * rng.standard_normal(72) > 0, "a", "b")
    Xt = rng.random((30, 3))
    params = dict(kernels="linear, gaussian:0.5, gaussian:1, poly:2", C=10.0, epsilon=0.5, solver="two-stage",
                  n_components=14, device="cuda")  # fmt: skip
    devices, loads = [], []
    real_on_device, real_put = cuda_shards.on_device, cuda_shards.DeviceColumns.put

    def on_device(problem, device="cuda", driver_gpu=True):
        devices.append(device)
        return real_on_device(problem, device, driver_gpu)

    def put(self, i, X):
        loads.append(X.shape[0])
        return real_put(self, i, X)

    cuda_shards.on_device, cuda_shards.DeviceColumns.put = on_device, put
    try:
        os.environ[routing.ROUTING_ENV] = "cost"
        routed = MWUMKLClassifier(**params).fit(X, y)
        assert devices == ["cpu"] and sum(loads) == 72, (devices, loads)
        del devices[:], loads[:]
        os.environ[routing.ROUTING_ENV] = "device"
        everywhere = MWUMKLClassifier(**params).fit(X, y)
        assert devices == ["cuda"] and sum(loads) == 72, (devices, loads)
    finally:
        cuda_shards.on_device, cuda_shards.DeviceColumns.put = real_on_device, real_put
        os.environ[routing.ROUTING_ENV] = "device"
    assert np.array_equal(routed.kernel_weights_, everywhere.kernel_weights_)
    assert np.array_equal(routed.support_, everywhere.support_)
    np.testing.assert_array_equal(routed.decision_function(Xt), everywhere.decision_function(Xt))


if __name__ == "__main__":
    sys.exit(_cudasim.main(globals(), sys.argv[1:]))

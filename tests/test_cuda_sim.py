"""The GPU shards' CUDA kernels, run under numba's CUDA simulator against the CPU shards.

``NUMBA_ENABLE_CUDASIM=1`` must be set before ``numba.cuda`` is first
imported, so every check runs in a subprocess (this file run as a script).
The simulator executes the kernels' Python code thread by thread, so the
problems are tiny.  Equality is exact (bit for bit), which is stronger than
the 1e-12 the GPU engine promises.
"""

from __future__ import annotations

import os
import subprocess
import sys

import _cudasim
import numpy as np
import pytest

from mwumkl_dist.data.backends import CPU, CUDABackend

CASES = ["launches", "dense", "csr_groups", "bank", "precomputed", "tiles", "margins", "fit", "rules", "transfers",
         "estimator", "dask", "predict", "errors"]  # fmt: skip


# Every case in one subprocess, under the simulator and (where there is one) on a GPU.
simulator_run, test_cuda_kernels_under_simulator, gpu_run, test_cuda_kernels_on_a_gpu = _cudasim.case_tests(
    __file__, CASES, run_timeout=1100, test_timeout=1200
)


def test_device_cpu_is_the_problem_and_a_dask_driver_needs_no_gpu():
    import pickle

    from mwumkl_dist.data import cuda

    sentinel = object()
    assert cuda.on_device(sentinel, "cpu") is sentinel
    # a Dask driver without a GPU: nothing checked on the driver; the problem pickles (shards check on workers)
    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.kernels import KernelSet

    X = np.random.default_rng(0).normal(size=(6, 2))
    problem = FeatureProblem(X, np.array([1.0, -1.0] * 3), KernelSet("linear, gaussian:1", 2))
    device_problem = cuda.on_device(problem, "cuda", driver_gpu=False)
    assert device_problem.n_kernels == 2 and device_problem.row_ranges(2) == problem.row_ranges(2)
    p, q = problem.point(0), problem.point(1)
    assert all(np.array_equal(a, b) for a, b in zip(device_problem.kernel_block(p, q), problem.kernel_block(p, q)))
    again = pickle.loads(pickle.dumps(device_problem))
    assert again.problem.n_samples == 6
    factory = pickle.loads(pickle.dumps(device_problem.shard_factory(0, 3)))
    assert factory.func is cuda.CudaFeatureShard
    with pytest.raises(ValueError, match="device"):
        cuda.on_device(sentinel, "tpu")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_real_kernels_compile_for_a_gpu_without_fma():
    """The kernels as a GPU runs them (libdevice ``__dmul_rn``, not the simulator's stand-ins) compile to PTX
    for an H100 (sm_90), and no double-precision FMA appears in it (FMA would change the CPU's bits).

    Needs numba's NVVM (the CUDA compiler library), not a GPU; skipped where it is missing.
    """
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, __file__, "ptx"], env=env, capture_output=True, text=True, timeout=1100)
    if "NO NVVM" in proc.stdout:
        pytest.skip("numba's NVVM (CUDA compiler library) is not available here")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "\nok" in proc.stdout, proc.stdout


def test_without_a_gpu_device_cuda_is_one_clear_error():
    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.kernels import KernelSet

    try:
        cuda.check_device()
    except RuntimeError:
        pass
    else:
        pytest.skip("a CUDA GPU (or the simulator) is available here")
    X = np.random.default_rng(0).normal(size=(6, 2))
    problem = FeatureProblem(X, np.array([1.0, -1.0] * 3), KernelSet("linear", 2))
    with pytest.raises(RuntimeError, match="device='cuda'.*(GPU|numba)"):
        cuda.on_device(problem, "cuda")
    with pytest.raises(RuntimeError, match="device='cuda'"):
        cuda.CudaFeatureShard(X, problem.y, 0, problem.kernel_set.plan)
    # through the estimator: the same single error, raised before any work
    from mwumkl_dist import MWUMKLClassifier

    with pytest.raises(RuntimeError, match="device='cuda'"):
        MWUMKLClassifier(kernels="linear", C=1.0, device="cuda").fit(X, ["a", "b"] * 3)


def test_numpy_without_row_stack_gets_the_alias_numba_cuda_needs():
    """numpy 2.5 has no ``np.row_stack``, which numba-cuda names at import: the package gives the alias back first."""
    import types

    from mwumkl_dist.data import cuda as cuda_shards

    numpy_2_5 = types.SimpleNamespace(vstack=np.vstack)  # numpy's names, row_stack gone
    assert cuda_shards.numpy_compat(numpy_2_5) is True
    assert numpy_2_5.row_stack is np.vstack
    assert cuda_shards.numpy_compat(numpy_2_5) is False  # once is enough
    before = dict(vars(np))
    cuda_shards.numpy_compat()  # the real numpy: changed only where it lacks the name
    assert vars(np).keys() - before.keys() <= {"row_" + "stack"}


def test_device_must_be_cpu_or_cuda():
    from mwumkl_dist import MWUMKLClassifier

    X = np.random.default_rng(0).normal(size=(6, 2))
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        MWUMKLClassifier(kernels="linear", C=1.0, device="gpu").fit(X, ["a", "b"] * 3)


# ----------------------------------------------------------------------------- the checks (in the subprocess)


def _labels(n, rng):
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    y[0], y[1] = 1.0, -1.0
    return y


def _compare_shards(cpu, gpu, problem, n_steps, rng, check_partials=True):
    """Same supersteps on both shards: candidates, V and tile partials must be identical."""
    m = cpu.n_kernels
    inv_trace = 1.0 / np.maximum(np.asarray(cpu.diagonal()).sum(axis=0), 1e-3)
    assert np.array_equal(np.asarray(cpu.diagonal()), np.asarray(gpu.diagonal()))
    ridge = np.linspace(0.01, 0.2, cpu.n_rows)
    for s in (cpu, gpu):
        s.configure(inv_trace, ridge)
    a, b = cpu.initial_candidates(), gpu.initial_candidates()
    assert [(c.index, c.g) for c in a] == [(c.index, c.g) for c in b]
    assert all(np.array_equal(x.v_row, z.v_row) for x, z in zip(a, b))
    pos_idx = np.flatnonzero(problem.y > 0)
    neg_idx = np.flatnonzero(problem.y < 0)
    for step in range(n_steps):
        ip = int(pos_idx[step % len(pos_idx)]) if step % 2 else int(a[0].index)
        iq = int(neg_idx[(3 * step) % len(neg_idx)]) if step % 2 else int(a[1].index)
        coef = -rng.random(m) * (1.0 if step else 0.0)
        coef[rng.random(m) < 0.2] = 0.0
        p, q = problem.point(ip), problem.point(iq)
        a = cpu.superstep(ip, iq, p, q, coef)
        b = gpu.superstep(ip, iq, p, q, coef)
        assert [(c.index, c.g) for c in a] == [(c.index, c.g) for c in b], (step, a, b)
        assert all(np.array_equal(x.v_row, z.v_row) for x, z in zip(a, b))
        if check_partials:
            assert np.array_equal(cpu._tile_partials(), gpu._tile_partials())
    assert np.array_equal(cpu.V, np.asarray(gpu.V))
    assert np.array_equal(cpu.alpha_counts(), gpu.alpha_counts())
    w = rng.random(m)
    ia, ca, ha = cpu.support_margins(w)
    ib, cb, hb = gpu.support_margins(w)
    assert np.array_equal(ia, ib) and np.array_equal(ca, cb) and ha == hb
    rows = np.arange(0, cpu.n_rows, 2)  # any rows, support or not: the training decision values' margins
    for rounded in (True, False):
        ra, rb = cpu.row_margins(rows, w, rounded), gpu.row_margins(rows, w, rounded)
        assert np.array_equal(ra, rb) if rounded else ra == rb
    # superstep_scores: the tile partials a Dask kernel block returns
    ip, iq = int(pos_idx[0]), int(neg_idx[-1])
    coef = -rng.random(m)
    pa = cpu.superstep_scores(ip, iq, problem.point(ip), problem.point(iq), coef)
    pb = gpu.superstep_scores(ip, iq, problem.point(ip), problem.point(iq), coef)
    assert np.array_equal(pa, pb)
    # replay rebuilds V
    gpu.configure(inv_trace, ridge)
    gpu.replay([(ip, iq)], {ip: problem.point(ip), iq: problem.point(iq)})
    cpu.configure(inv_trace, ridge)
    cpu.replay([(ip, iq)], {ip: problem.point(ip), iq: problem.point(iq)})
    assert np.array_equal(cpu.V, np.asarray(gpu.V))


def _feature_case(X, y, kernels, n_steps=3, row_range=None, kernel_range=None):
    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.kernels import KernelSet

    rng = np.random.default_rng(7)
    problem = FeatureProblem(X, y, KernelSet(kernels, X.shape[1]))
    start, stop = row_range or (0, len(y))
    cpu = problem.make_shard(start, stop, kernel_range)
    device_problem = cuda.on_device(problem)
    device_problem.kernel_block_min_kernels = 0  # every kernel block on the GPU
    gpu = device_problem.make_shard(start, stop, kernel_range)
    assert type(gpu).__name__ == "CudaFeatureShard"
    for i, j in ((0, 1), (2, 2), (len(y) - 1, 3)):  # the picked points' kernel block, on the GPU
        want = problem.kernel_block(problem.point(i), problem.point(j))
        got = device_problem.kernel_block(problem.point(i), problem.point(j))
        assert all(np.array_equal(a, b) for a, b in zip(want, got)), (i, j)
    _compare_shards(cpu, gpu, problem, n_steps, rng)
    return gpu


def case_dense():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(26, 4))
    y = _labels(26, rng)
    # every kind, squaring chains (sigma 1, sqrt(2)/2, 1/2: gamma doubling), poly degrees, one group
    kernels = "linear, poly:2, poly:3:coef0=0.5, gaussian:1, gaussian:0.7071067811865476, gaussian:0.5, gaussian:3"
    gpu = _feature_case(X, y, kernels)
    assert gpu._dense and not gpu._inline
    # a row shard that does not start at 0 (global indices, ridge of rows outside)
    _feature_case(X, y, kernels, row_range=(9, 26))


def case_csr_groups():
    import scipy.sparse as sp

    from mwumkl_dist.data import cuda

    rng = np.random.default_rng(1)
    X = sp.random(30, 9, density=0.25, random_state=3, format="csr") * 3.0
    y = _labels(30, rng)
    kernels = "linear@0-3, gaussian:1@2-6, gaussian:0.7071067811865476@2-6, poly:2@5+7+8, gaussian:2, linear"
    gpu = _feature_case(X, y, kernels, n_steps=2)
    assert gpu._dense and gpu._inline  # small groups: the sparse rows are kept dense on the GPU
    cuda.plans.DENSE_MAX_BYTES = 0
    try:
        gpu = _feature_case(X, y, kernels, n_steps=4)
    finally:
        cuda.plans.DENSE_MAX_BYTES = 256 * 2**20
    assert not gpu._dense


def case_bank():
    from mwumkl_dist.kernels import RandomGaussianBank

    rng = np.random.default_rng(2)
    X = rng.normal(size=(14, 7))
    y = _labels(14, rng)
    from mwumkl_dist.data import cuda

    bank = RandomGaussianBank(24, subset_size=3, seed=5)
    assert _feature_case(X, y, bank, n_steps=3)._inline  # group dots in the superstep kernel
    cuda.plans.INLINE_MAX_GROUP = 0
    try:
        gpu = _feature_case(X, y, bank, n_steps=2)  # dense rows, many groups, dots in their own kernel
    finally:
        cuda.plans.INLINE_MAX_GROUP = 16
    assert gpu._dense and not gpu._inline


def case_tiles():
    # more kernels than one tile (64): several tiles, and a kernel block (Dask kernel shards) on a tile boundary
    from mwumkl_dist.devices import cpu as _columns

    rng = np.random.default_rng(3)
    X = rng.normal(size=(10, 3))
    y = _labels(10, rng)
    sigmas = np.geomspace(0.3, 5.0, 70)
    kernels = ", ".join(f"gaussian:{float(s)!r}" for s in sigmas) + ", gaussian:1, gaussian:0.7071067811865476"
    gpu = _feature_case(X, y, kernels, n_steps=2)
    assert gpu._n_tiles == len(_columns.superstep.kernel_tiles(gpu.plan.square_of)) - 1 >= 2
    _feature_case(X, y, kernels, n_steps=2, kernel_range=(64, 72))


def case_precomputed():
    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.problems import PrecomputedProblem

    rng = np.random.default_rng(4)
    n, m = 22, 5
    Z = rng.normal(size=(m, n, 3))
    K = np.einsum("kif,kjf->kij", Z, Z)
    y = _labels(n, rng)
    problem = PrecomputedProblem(K, y)
    for start, stop in ((0, n), (5, 17)):
        cpu = problem.make_shard(start, stop)
        gpu = cuda.on_device(problem).make_shard(start, stop)
        assert type(gpu).__name__ == "CudaPrecomputedShard"
        _compare_shards(cpu, gpu, problem, 4, np.random.default_rng(9))


def case_margins():
    """The class sums' margins summed exactly on the GPU: the CPU's integers (and an exact reference's), whatever
    the chunks the threads take, with weights over 600 binades, cancellation, a kernel block, and a clear error
    for a product that overflows."""
    import warnings
    from fractions import Fraction

    from mwumkl_dist.core.exact import SHIFT
    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.cuda import kernels as K
    from mwumkl_dist.data.problems import PrecomputedProblem

    rng = np.random.default_rng(13)
    n, m = 9, 70
    Z = rng.normal(size=(m, n, 2))
    problem = PrecomputedProblem(np.einsum("kif,kjf->kij", Z, Z) - 0.5, _labels(n, rng))  # V of both signs
    for kernels in (None, (64, 70)):
        cpu, gpu = problem.make_shard(2, n, kernels), cuda.on_device(problem).make_shard(2, n, kernels)
        inv_trace = np.exp2(rng.integers(-40, 40, size=cpu.n_kernels)).astype(float)
        for shard in (cpu, gpu):
            shard.configure(inv_trace, 0.1)
            for ip, iq in ((2, 3), (4, 3), (8, 5)):
                shard.superstep(ip, iq, ip, iq, np.zeros(cpu.n_kernels))
        V = np.asarray(cpu.V)
        assert np.array_equal(V, np.asarray(gpu.V))
        weights = rng.random(cpu.n_kernels) * np.exp2(rng.integers(-600, 5, size=cpu.n_kernels))
        weights[::7] = 0.0
        rows = np.flatnonzero(cpu.alpha > 0)
        exact = [int(sum(Fraction(float(x)) for x in V[j] * weights) * 2**SHIFT) for j in rows]
        want = cpu.support_margins(weights)
        assert want[2] == exact
        for chunk in (1, 5, 64):  # one kernel per thread, a few, all of them
            K.EXACT_CHUNK = chunk
            got = gpu.support_margins(weights)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2], chunk
        K.EXACT_CHUNK = 32
        big = int(np.argmax(np.abs(V[rows[0]])))
        assert abs(V[rows[0], big]) > 1.0
        weights[big] = np.finfo(float).max  # a finite weight whose product overflows
        for shard in (cpu, gpu):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # the simulator's product overflows in numpy
                    shard.support_margins(weights)
            except ValueError as exc:
                assert "non-finite" in str(exc)
            else:
                raise AssertionError("no ValueError for an overflowing product")


def case_fit():
    """Whole fits on the local engine (the rules on the GPU): kernel weights, alpha, bias and ``s`` identical.

    The paper's scale on two row shards, a quashing selectivity with a per-point ridge, precomputed kernels.
    """
    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.problems import FeatureProblem, PrecomputedProblem
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.solvers import mwu

    rng = np.random.default_rng(5)
    X = rng.normal(size=(24, 5))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=24) > 0, 1.0, -1.0)
    kernels = KernelSet("linear, poly:2, gaussian:1, gaussian:0.7071067811865476, gaussian:2@0-1", 5)
    Z = rng.normal(size=(3, 24, 2))
    fits = [
        (FeatureProblem(X, y, kernels), 2, None, 0.05),
        (FeatureProblem(X, y, kernels), 1, 100.0, np.linspace(0.01, 0.1, 24)),
        (PrecomputedProblem(np.einsum("kif,kjf->kij", Z, Z), y), 2, 3.0, 0.05),
    ]
    for problem, shards, selectivity, ridge in fits:
        results = []
        for prob, n, backend in ((problem, 1, CPU), (cuda.on_device(problem), shards, CUDABackend())):
            with LocalEngine(prob, n, backend=backend) as engine:
                inv_trace = 1.0 / engine.traces()
                engine.configure(inv_trace, ridge)
                results.append(mwu.solve(engine, mwu.Iterations(0.3, 0.5, 8), inv_trace=inv_trace, ridge=ridge,
                                         selectivity=selectivity, rows_to_score=np.flatnonzero))  # fmt: skip
        a, b = results
        assert np.array_equal(a.kernel_weights, b.kernel_weights), selectivity
        assert np.array_equal(a.alpha, b.alpha) and a.bias == b.bias and np.array_equal(a.s, b.s), selectivity
        assert np.array_equal(a.scores, b.scores), selectivity  # the support rows' decision values, read off V
    _check_resume(fits[0][0])


def _check_resume(problem):
    """A checkpoint written from the rules' GPU arrays (``s``, the candidates' ``V`` rows) resumes to the same model."""
    import os
    import tempfile

    from mwumkl_dist.data import cuda
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.io.checkpoint import Checkpointer, load_checkpoint
    from mwumkl_dist.solvers import mwu
    from mwumkl_dist.solvers.mwu.one_vs_rest import resume_state

    settings = dict(ridge=0.05, iterations=mwu.Iterations(0.3, 0.5, 7), selectivity=100.0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fit.ckpt.npz")
        with LocalEngine(cuda.on_device(problem), 2, backend=CUDABackend()) as engine:
            inv_trace = 1.0 / engine.traces()
            engine.configure(inv_trace, 0.05)
            whole = mwu.solve(engine, inv_trace=inv_trace, on_state=Checkpointer(path, 4, "fp", 0, []), **settings)
        saved = load_checkpoint(path, "fp")
        assert saved["iteration"] == 4
        with LocalEngine(cuda.on_device(problem), 2, backend=CUDABackend()) as engine:
            engine.configure(inv_trace, 0.05)
            state = resume_state(saved, problem, engine)
            resumed = mwu.solve(engine, inv_trace=inv_trace, state=state, **settings)
    assert np.array_equal(whole.alpha, resumed.alpha) and np.array_equal(whole.s, resumed.s)
    assert np.array_equal(whole.kernel_weights, resumed.kernel_weights) and whole.bias == resumed.bias


def _rules_pair(problem, s, ridge, selectivity):
    """The host rules and :class:`DeviceRules` for ``problem`` from ``s`` (eps 0.3, rho 0.5)."""
    from mwumkl_dist.core.mwu_rules import HostRules, eps_prime
    from mwumkl_dist.data import cuda

    settings = dict(inv_trace=1.0 / np.arange(1.0, problem.n_kernels + 1), ridge=ridge, eps_p=eps_prime(0.3, 0.5),
                    rho=0.5, selectivity=selectivity)  # fmt: skip
    host = HostRules(s, lambda pos, neg: problem.kernel_block(pos.point, neg.point), **settings)
    return host, CUDABackend().mwu_rules(cuda.on_device(problem), s, **settings)


def case_rules():
    """The rules on the GPU (``DeviceRules``) against the host's, step by step: the same ``s`` and ``coef``.

    Every regime of Exponentiate-M (the paper's scale, selectivity 0, a relative scale, the quashed
    one), kernels with ``s = 0``, a per-point ridge, precomputed kernels (the kernel block sent from
    the host); a non-finite ``coef`` raises the same error.
    """
    import warnings

    from mwumkl_dist.core.mwu_rules import Candidate
    from mwumkl_dist.data.problems import FeatureProblem, PrecomputedProblem
    from mwumkl_dist.kernels import KernelSet, RandomGaussianBank

    rng = np.random.default_rng(11)
    X = rng.normal(size=(10, 4))
    y = _labels(10, rng)
    Z = rng.normal(size=(5, 10, 2))
    problems = [FeatureProblem(X, y, KernelSet(RandomGaussianBank(21, subset_size=2, seed=3), 4)),
                PrecomputedProblem(np.einsum("kif,kjf->kij", Z, Z), y)]  # fmt: skip
    for problem in problems:
        m = problem.n_kernels
        for selectivity, ridge in ((None, 0.05), (0.0, 0.05), (3.0, np.linspace(0.01, 0.1, 10)), (200.0, 0.02)):
            s = rng.random(m) * 4.0
            s[::5] = 0.0  # kernels without a margin yet: coef 0
            host, device = _rules_pair(problem, s, ridge, selectivity)
            for it in range(1, 4):
                ip, iq = int(np.flatnonzero(y > 0)[it]), int(np.flatnonzero(y < 0)[it])
                v_p, v_q = rng.normal(size=m), rng.normal(size=m)
                pos, neg = Candidate(ip, 0.0, v_p, problem.point(ip)), Candidate(iq, 0.0, v_q, problem.point(iq))
                want = host.step(pos, neg, it)
                got = device.step(pos, neg, it).values.copy_to_host()
                assert np.array_equal(want, got), (selectivity, it, want - got)
                host.commit(it)
                device.commit(it)
                assert np.array_equal(host.host_s(), device.host_s()), (selectivity, it)
    # an overflow: the same FloatingPointError, raised by commit on the GPU (no shard took the coef here)
    problem = problems[0]
    host, device = _rules_pair(problem, np.full(problem.n_kernels, 1e308), 0.05, None)
    pos, neg = (Candidate(j, 0.0, np.full(problem.n_kernels, 1e308), problem.point(j)) for j in (0, 1))
    with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the simulator's threads: errstate is per thread
        try:
            host.step(pos, neg, 7)
        except FloatingPointError as exc:
            want = str(exc)
        else:
            raise AssertionError("the host rules did not raise")
        device.step(pos, neg, 7)
        try:
            device.commit(7)
        except FloatingPointError as exc:
            assert str(exc) == want, (str(exc), want)
        else:
            raise AssertionError("the device rules did not raise")


class _Transfers:
    """Bytes and copies between host and GPU: what a GPU moves over PCIe (under the simulator, what it would).

    Counts explicit copies (``to_device``, ``copy_to_device``, ``copy_to_host``) and a scalar read from a
    device array on the host, through numba's public device array type (the simulator's or numba-cuda's);
    a copy made inside another counted one (``to_device`` copies with ``copy_to_device``) counts once.  Host
    arrays never reach a kernel: every launch refuses them (``cuda_kernels.check_arguments``).
    """

    def __init__(self):
        import threading

        from numba import cuda

        from mwumkl_dist.data.cuda import kernels as K

        self.h2d = self.d2h = self.d2h_copies = 0
        count = self
        array_type = type(cuda.device_array(1))
        inside = threading.local()
        if K.SIMULATED:  # the simulator runs kernels as Python threads: their reads are the GPU's own
            from numba.cuda.simulator.kernel import BlockThread

            def on_host():
                return not isinstance(threading.current_thread(), BlockThread) and not getattr(inside, "busy", False)
        else:  # pragma: no cover - a GPU's kernels run no Python

            def on_host():
                return not getattr(inside, "busy", False)

        def outermost(fn):
            def wrapper(*args, **kwargs):
                counting = on_host()
                if counting:
                    inside.busy = True
                try:
                    return fn(counting, *args, **kwargs)
                finally:
                    if counting:
                        inside.busy = False

            return wrapper

        def counted(method, attribute):
            @outermost
            def wrapper(counting, self_, *args, **kwargs):
                out = method(self_, *args, **kwargs)
                if counting:
                    nbytes = np.asarray(out if attribute == "d2h" else args[0]).nbytes
                    setattr(count, attribute, getattr(count, attribute) + nbytes)
                    count.d2h_copies += attribute == "d2h"
                return out

            return wrapper

        _get = array_type.__getitem__

        @outermost
        def getitem(counting, self_, key):
            out = _get(self_, key)
            if counting and not isinstance(out, array_type):
                count.d2h += np.asarray(out).nbytes
                count.d2h_copies += 1
            return out

        _to = cuda.to_device

        @outermost
        def to_device(counting, ary, *args, **kwargs):
            if counting and isinstance(ary, np.ndarray):
                count.h2d += ary.nbytes
            return _to(ary, *args, **kwargs)

        array_type.copy_to_host = counted(array_type.copy_to_host, "d2h")
        array_type.copy_to_device = counted(array_type.copy_to_device, "h2d")
        array_type.__getitem__ = getitem
        cuda.to_device = to_device

    def snapshot(self):
        return self.h2d, self.d2h, self.d2h_copies


def _traffic(transfers, n_kernels, host_rules=False, n_iter=4):
    """Per iteration ``(h2d bytes, d2h bytes, d2h copies)`` of a local GPU fit of a random bank of ``n_kernels``,
    then the same for the end of the fit (after the last superstep: ``s``, the weights, the class sums) and the
    number of support rows."""
    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.engines.mwu_engine import MWUEngine
    from mwumkl_dist.kernels import KernelSet, RandomGaussianBank
    from mwumkl_dist.solvers import mwu

    rng = np.random.default_rng(12)
    X = rng.uniform(0.5, 1.5, size=(12, 3))  # no zero entries: every picked point has 3 non-zeros
    problem = FeatureProblem(X, _labels(12, rng), KernelSet(RandomGaussianBank(n_kernels, subset_size=2, seed=4), 3))
    marks = []
    with LocalEngine(cuda.on_device(problem), 1, backend=CUDABackend()) as engine:
        if host_rules:  # the rules on the host, as before they moved to the GPU
            engine.rules = lambda s, **settings: MWUEngine.rules(engine, s, **settings)
        inv_trace = 1.0 / engine.traces()
        engine.configure(inv_trace, 0.05)
        result = mwu.solve(engine, inv_trace=inv_trace, ridge=0.05, iterations=mwu.Iterations(0.3, 0.5, n_iter),
                           selectivity=50.0, on_state=lambda state: marks.append(transfers.snapshot()))  # fmt: skip
        marks.append(transfers.snapshot())
    steps = [tuple(b - a for a, b in zip(first, second)) for first, second in zip(marks, marks[1:])]
    return steps[:-1], steps[-1], int(np.count_nonzero(result.alpha))


def case_transfers():
    """Host <-> GPU traffic per iteration is O(1) in the kernel count: one 40-byte message back, and out the
    picked points' non-zeros.  The end of a fit moves ``s`` and the weights (``m`` values each) and
    ``O(support)`` more, never ``V``'s support rows.

    With the rules on the host the same fit moves O(m) bytes (``coef`` out, the ``V`` rows back): the
    counter sees that, so it would see a regression.
    """
    from mwumkl_dist.core.exact import N_LIMBS

    transfers = _Transfers()
    for n_kernels in (8, 64):
        per_iteration, end, n_support = _traffic(transfers, n_kernels)
        # out: the two picked points' 3 non-zeros (indices and values), to the kernel block and to the shard
        assert set(per_iteration) == {(2 * 2 * (3 + 3) * 8, 40, 1)}, (n_kernels, per_iteration)
        print(f"m = {n_kernels}: per iteration {per_iteration[0][0]} B to the GPU, {per_iteration[0][1]} B back "
              f"in {per_iteration[0][2]} copy")  # fmt: skip
        # The end: s back, then out the weights and the support rows' indices (and a flag), back the class sums'
        # exact limbs (and the flag): nothing of size m x support (V's support rows stay on the GPU).
        assert end == (8 * n_kernels + 8 * n_support + 8, 8 * n_kernels + 8 * N_LIMBS * n_support + 8, 3), end
        print(f"m = {n_kernels}: the end of the fit {end[0]} B to the GPU, {end[1]} B back in {end[2]} copies "
              f"({n_support} support rows)")  # fmt: skip
    small, large = (_traffic(transfers, n_kernels, host_rules=True)[0] for n_kernels in (8, 64))
    print(f"rules on the host: {small[-1][:2]} B at m = 8, {large[-1][:2]} B at m = 64")
    assert all(b[0] - a[0] >= 8 * 56 and b[1] - a[1] >= 16 * 56 for a, b in zip(small, large))


def case_estimator():
    """``MWUMKLClassifier(device="cuda")``: fit and decision function equal to ``device="cpu"``'s.

    The unpolished fit's bias and majority checks read the training rows' decision values off ``V`` on
    the GPU (no kernel sums); the predictor scores rows on the GPU too, or, where the GPU cannot hold
    the support vectors, on the CPU: the same values either way.
    """
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.data import cuda
    from mwumkl_dist.solvers.base import score_rows

    rng = np.random.default_rng(6)
    X = rng.normal(size=(30, 4))
    y = np.where(X[:, 0] - X[:, 1] + 0.3 * rng.normal(size=30) > 0, "yes", "no")
    # epsilon 0.5: 28 iterations (the simulator pays about 0.1 s for each GPU superstep)
    params = dict(kernels="linear, gaussian:1, poly:2", C=10.0, epsilon=0.5, polish=False, selectivity=100)
    cpu = MWUMKLClassifier(**params).fit(X, y)
    real, calls = cuda.weighted_kernel_sums, []

    def counted(*args, **kwargs):
        calls.append(len(args[0]) - 1)  # the rows scored
        return real(*args, **kwargs)

    def full(*args, **kwargs):
        raise cuda.DeviceMemoryError("no room for the support vectors")

    cuda.weighted_kernel_sums = counted
    try:
        gpu = MWUMKLClassifier(device="cuda", **params).fit(X, y)
    finally:
        cuda.weighted_kernel_sums = real
    assert calls == [], calls  # the bias check and the majority check: read off V, no predictor
    for name in ("support_", "dual_coef_", "intercept_", "kernel_weights_"):
        assert np.array_equal(getattr(cpu, name), getattr(gpu, name)), name
    assert np.array_equal(cpu.decision_function(X), gpu.decision_function(X))
    model = (gpu.kernels, gpu.kernel_names_, 4, X, gpu.support_, gpu.support_vectors_, gpu.dual_coef_,
             gpu.raw_kernel_weights_)  # fmt: skip
    cuda.weighted_kernel_sums = full
    try:
        assert np.array_equal(score_rows(*model, "cuda"), score_rows(*model, "cpu"))  # on the CPU after all
    finally:
        cuda.weighted_kernel_sums = real


def case_dask():
    """GPU shards on Dask workers (row shards x kernel blocks), the same model as the CPU's local engine."""
    import warnings

    import distributed

    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.engines.dask import DaskEngine
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.solvers import mwu

    rng = np.random.default_rng(8)
    X = rng.normal(size=(12, 3))
    y = _labels(12, rng)
    kernels = ", ".join(f"gaussian:{float(s)!r}@{i % 3}" for i, s in enumerate(np.geomspace(0.4, 4.0, 66)))
    problem = FeatureProblem(X, y, KernelSet(kernels, 3))
    results = []
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0") as client:
        for prob, engine_of in (
            (problem, lambda p: LocalEngine(p, 1)),
            (cuda.on_device(problem), lambda p: DaskEngine(p, client, n_shards=2, n_kernel_shards=2)),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with engine_of(prob) as engine:
                    assert not isinstance(engine, DaskEngine) or engine.partial
                    inv_trace = 1.0 / engine.traces()
                    engine.configure(inv_trace, 0.05)
                    solved = mwu.solve(engine, inv_trace=inv_trace, ridge=0.05, iterations=mwu.Iterations(0.3, 0.5, 4),
                                       rows_to_score=lambda c: np.arange(1, len(c), 2))  # fmt: skip
                    results.append(solved)
    a, b = results
    assert np.array_equal(a.kernel_weights, b.kernel_weights)
    assert np.array_equal(a.alpha, b.alpha) and a.bias == b.bias
    assert np.array_equal(a.scores, b.scores)  # kernel blocks' exact margins added on the driver


def case_predict():
    import scipy.sparse as sp

    from mwumkl_dist.data import cuda
    from mwumkl_dist.devices import cpu as _columns
    from mwumkl_dist.kernels import KernelSet, RandomGaussianBank
    from mwumkl_dist.kernels.evaluation import as_csr, plan_args

    rng = np.random.default_rng(6)
    specs = [
        ("linear, poly:2, gaussian:1, gaussian:0.7071067811865476, gaussian:0.5, gaussian:2@1-3", False),
        ("linear@0-2, gaussian:1@2-5, gaussian:0.7071067811865476@2-5, poly:3:coef0=0.2@4+5", True),
        (RandomGaussianBank(30, subset_size=2, seed=1), False),
    ]
    for kernels, sparse in specs:
        ks = KernelSet(kernels, 6)
        plan = ks.plan
        Xq = rng.normal(size=(9, 6))
        S = rng.normal(size=(7, 6))
        if sparse:
            Xq[rng.random(Xq.shape) < 0.5] = 0.0
            S[rng.random(S.shape) < 0.5] = 0.0
        Xq, S = as_csr(sp.csr_matrix(Xq)), as_csr(sp.csr_matrix(S))
        sv_sq = _columns.group_sqnorms(S.indptr, S.indices, S.data, plan.feat_ptr, plan.feat_groups, plan.n_groups)
        coef = rng.normal(size=(2, 7))
        coef[0, 3] = 0.0
        weights = rng.random((2, plan.n_kernels))
        weights[1, ::3] = 0.0
        args = (Xq, 6, S, sv_sq, coef, weights, plan_args(plan))
        want = _columns.weighted_kernel_sums(*args)
        got = cuda.weighted_kernel_sums(*args)
        assert np.array_equal(want, got), (kernels, want - got)
        got = cuda.weighted_kernel_sums(*args, max_block_bytes=8 * 3 * (6 + plan.n_groups + 2))  # row blocks
        assert np.array_equal(want, got)


def case_launches():
    """Every launch is checked as a GPU would take it: ``None``, a host array or another object is refused
    with a clear error naming the kernel and the argument (the simulator itself takes them all; numba-cuda on a
    GPU fails on ``None``); whole fits in every regime of the rules (the paper's scale is ``selectivity=None``)
    launch with device arrays and numbers only."""
    from numba import cuda

    from mwumkl_dist.data import cuda as cuda_shards
    from mwumkl_dist.data.cuda import kernels as K
    from mwumkl_dist.data.problems import FeatureProblem, PrecomputedProblem
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.solvers import mwu

    out = cuda.device_array(4)
    for bad, what in ((None, "None"), (np.zeros(4), "a host numpy array (4,)"), ([0.0] * 4, "list")):
        try:
            K.exp_values[1, 4](bad, out)
        except TypeError as exc:
            assert str(exc).startswith(f"CUDA kernel exp_values: argument 0 is {what}"), str(exc)
        else:
            raise AssertionError(f"a launch took {what}")
    K.exp_values[1, 4](cuda.to_device(np.zeros(4)), out)
    assert np.array_equal(out.copy_to_host(), np.ones(4))
    seen = []
    K.LAUNCH_OBSERVERS.append(lambda name, args: seen.append((name, [type(a).__name__ for a in args])))
    try:
        rng = np.random.default_rng(21)
        X = rng.normal(size=(12, 3))
        y = _labels(12, rng)
        Z = rng.normal(size=(2, 12, 2))
        problems = (FeatureProblem(X, y, KernelSet("linear, gaussian:1, poly:2@0-1", 3)),
                    PrecomputedProblem(np.einsum("kif,kjf->kij", Z, Z), y))  # fmt: skip
        for problem in problems:
            for selectivity in (None, 0.0, 50.0):
                with LocalEngine(cuda_shards.on_device(problem), 1, backend=CUDABackend()) as engine:
                    inv_trace = 1.0 / engine.traces()
                    engine.configure(inv_trace, 0.05)
                    mwu.solve(engine, inv_trace=inv_trace, ridge=0.05, iterations=mwu.Iterations(0.3, 0.5, 3),
                              selectivity=selectivity, rows_to_score=np.flatnonzero)  # fmt: skip
    finally:
        K.LAUNCH_OBSERVERS.clear()
    launched = {name for name, _ in seen}
    assert {"rules_margins", "rules_coef", "load_points", "superstep_columns", "exact_row_dots"} <= launched, launched
    assert not any(t in ("NoneType", "ndarray", "list") for _, types in seen for t in types)


def case_errors():
    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.cuda import kernels as _cuda_kernels
    from mwumkl_dist.data.problems import FeatureProblem, PrecomputedProblem
    from mwumkl_dist.kernels import KernelSet

    # the solver's exp, bit for bit (the CPU's fdlibm-style exp), incl. under/overflow and NaN
    x = np.concatenate([np.linspace(-750, 712, 40), [0.0, -0.0, 1e-300, -1e-12, np.nan, np.inf, -np.inf]])
    from numba import cuda as _cuda

    out = _cuda.device_array_like(x)
    _cuda_kernels.exp_values[2, 32](_cuda.to_device(x), out)
    want = _columns_exp(x)
    assert np.array_equal(out.copy_to_host(), want, equal_nan=True)
    # a problem that does not fit: a clear error, nothing allocated
    rng = np.random.default_rng(0)
    X = rng.normal(size=(10, 3))
    y = _labels(10, rng)
    problem = FeatureProblem(X, y, KernelSet("linear, gaussian:1", 3))
    real = cuda.runtime.device_memory
    cuda.runtime.device_memory = lambda: (1000.0, 4000.0)
    try:
        cuda.on_device(problem).make_shard(0, 10)
    except cuda.DeviceMemoryError as exc:
        assert "1000 B free" in str(exc) and "n_shards" in str(exc), str(exc)
    else:
        raise AssertionError("no DeviceMemoryError")
    finally:
        cuda.runtime.device_memory = real
    # the estimate grows with V
    from mwumkl_dist.kernels import RandomGaussianBank

    plan = KernelSet(RandomGaussianBank(1000, subset_size=5), 60).plan
    assert cuda.feature_shard_bytes(166, plan) >= 8 * 166 * 1000
    assert cuda.precomputed_shard_bytes(10, 3, 10) >= 8 * 3 * 10 * 10
    _ = PrecomputedProblem


def case_ptx():
    """Compile every kernel's real (GPU) code to PTX for sm_90 and check that it has no ``fma.rn.f64``."""
    import re

    from numba import cuda
    from numba import types as T

    try:
        from numba.cuda.cudadrv import nvvm

        if not nvvm.is_available():
            raise ImportError
    except Exception:
        print("NO NVVM")
        return
    import numba.cuda.dispatcher as dispatcher

    class _H100:  # device functions ask the current device's compute capability; there is no device
        compute_capability = (9, 0)

    dispatcher.get_current_device = lambda: _H100()
    import types

    from mwumkl_dist.core import mwu_rules
    from mwumkl_dist.data.cuda import kernels as K

    assert not K.SIMULATED
    f8, i8 = T.float64, T.int64
    A1, A2, A3 = (T.Array(f8, d, "C") for d in (1, 2, 3))
    I1, I2, J1 = T.Array(i8, 1, "C"), T.Array(i8, 2, "C"), T.Array(T.int32, 1, "C")
    F2 = T.Array(T.float32, 2, "C")
    plan = (I1, A1, A1, I1, I1, I1, I1)  # kind, pa, pb, grp, square_of, root, depth
    step = (i8, i8, f8, f8)  # lp, lq, diag_p, diag_q
    sigs = {
        "exp_values": (A1, A1),
        "fill_zero": (A2,),
        "point_sqnorms": (A1, A1, I1, I1, A1, A1),
        "group_dots_dense": (A2, A1, A1, I1, I1, A2, A2),
        "group_dots_csr": (J1, J1, A1, A1, A1, I1, I1, A2, A2),
        "superstep_features": (A2, A2, A2, A2, A2, A1, A1, A1, f8, f8, A1, A1, *plan, I1, *step),
        "superstep_features_inline": (A2, A2, A2, A1, A1, I1, I1, A1, A1, A1, f8, f8, A1, A1, *plan, I1, *step),
        "superstep_columns": (A2, A2, A3, i8, i8, A1, f8, f8, A1, A1, I1, *step),
        "point_kernels": (A1, A1, I1, I1, I1, A1, A1, I1, I1, I1, A2),
        "scores_argmax": (A2, A1, A1, I2, A2),
        "pick_candidates": (I2, A2, A1, A1, I1),
        "gather_rows": (A2, I1, A2),
        "exact_row_dots": (A2, I1, A1, i8, I2, A1),
        "fill_zero (limbs)": (I2,),
        "load_points": (A1, A1, A1, i8, i8, A1, i8, i8),
        "rules_margins": (A2, A1, f8, f8, *(A1,) * 7),
        "rules_coef": (A1, A1, f8, f8, T.boolean, f8, A1, A1),
        "weighted_kernel_sums": (A2, A2, A2, A2, A2, A2, *plan, I1, I1, A2),
        # the two-stage fit's linear stage: columns in single precision, products in double
        "combined_columns": (A2, A2, A2, A2, A2, *plan, I1, I1, F2),
        "columns_times": (F2, A1, f8, A1),
        "active_weights": (F2, A1, f8, A1, A1, T.Array(T.boolean, 1, "C"), T.boolean, A1),
        "columns_transposed_partials": (F2, A1, i8, A2),
        "sum_partials": (A2, A1),
    }
    # rules_coef calls CUDA's sinh and exp, whose own code uses FMA (their bits are CUDA's in any case): its
    # arithmetic around them is checked with both replaced by the identity.
    identity = cuda.jit(device=True)(lambda x: x)
    weights = K.device_rule(mwu_rules.exponent_weights, sinh=identity, exp=identity)
    coef_kernel = K.rules_coef.py_func
    coef_kernel = types.FunctionType(coef_kernel.__code__, {**coef_kernel.__globals__, "_exponent_weights": weights})
    for name, sig in sigs.items():
        kernel = coef_kernel if name.startswith("rules_coef") else getattr(K, name.split()[0]).py_func
        ptx, _ = cuda.compile_ptx(kernel, sig, cc=(9, 0))
        assert not re.search(r"\bfma\.rn\.f64", ptx), name
    assert "mul.rn.f64" in cuda.compile_ptx(K.exp_values.py_func, sigs["exp_values"], cc=(9, 0))[0]


def _columns_exp(x):
    from mwumkl_dist.devices import cpu as _columns

    return _columns.exp_block(np.ascontiguousarray(x))


if __name__ == "__main__":
    sys.exit(_cudasim.main(globals(), sys.argv[1:], simulated_only=sys.argv[1:] != ["ptx"]))

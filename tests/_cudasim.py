"""The harness of the tests that run CUDA kernels under numba's simulator, or on a real GPU where there is one
(``test_cuda_sim.py``, ``test_two_stage_cuda.py``).

``NUMBA_ENABLE_CUDASIM=1`` must be set before ``numba.cuda`` is first imported, so a test file runs its checks
in a subprocess, itself run as a script: :func:`run_cases` starts it and splits its output by case,
:func:`main` (the script's entry) runs each ``case_NAME`` function of the file and prints ``ok`` or the
traceback.  ``run_cases(..., simulate=False)`` runs the same cases on the GPU (the ``gpu`` marker:
``python -m pytest -m gpu``; skipped where :func:`real_gpu` is False).  Nothing here reaches into the
simulator's internals: the same harness runs on hardware.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback

#: Set in a real-GPU run's subprocess (``run_cases(simulate=False)``): :func:`main` then runs without the simulator.
REAL_GPU_ENV = "MWUMKL_TEST_REAL_GPU"


def real_gpu() -> bool:
    """Whether this process sees a real CUDA GPU (not the simulator) that numba-cuda can use."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1":
        return False
    from mwumkl_dist.data.cuda import gpu_available

    return gpu_available()


def run_cases(script: str, cases, timeout: float, simulate: bool = True):
    """Run ``script``'s ``cases`` in one subprocess, under the simulator or (``simulate=False``) on the GPU:
    ``(process, {case: its output})``."""
    # Every MWU fit of a device="cuda" case on the GPU engine, however small (the cases' problems are tiny; a
    # case that checks the routing itself sets it back to "cost").
    env = dict(os.environ, MWUMKL_NUM_THREADS="1", MWUMKL_DEVICE_ROUTING="device")
    if simulate:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        env[REAL_GPU_ENV] = "1"
    proc = subprocess.run([sys.executable, script, *cases], env=env, capture_output=True, text=True, timeout=timeout)
    out = {}
    for block in proc.stdout.split("\n=== ")[1:]:
        case, _, text = block.partition("\n")
        out[case.strip()] = text
    return proc, out


def case_tests(script: str, cases, run_timeout: float, test_timeout: float) -> tuple:
    """The fixtures and tests of ``script``'s ``cases``: ``(simulator_run, under_simulator, gpu_run, on_a_gpu)``.

    Each run is one subprocess for all cases (numba and the package imported once), under the simulator (a
    ``slow`` test) or on a real GPU (a ``gpu`` test, skipped where there is none); a test module binds them to
    its own names, which pytest collects.
    """
    import pytest

    @pytest.fixture(scope="module")
    def simulator_run():
        return run_cases(script, cases, timeout=run_timeout)

    @pytest.fixture(scope="module")
    def gpu_run():
        if not real_gpu():
            pytest.skip("no CUDA GPU here (numba.cuda.is_available() is False)")
        return run_cases(script, cases, timeout=run_timeout, simulate=False)

    @pytest.mark.slow
    @pytest.mark.timeout(test_timeout)
    @pytest.mark.parametrize("case", cases)
    def under_simulator(simulator_run, case):
        check_case(simulator_run, case)

    @pytest.mark.gpu
    @pytest.mark.timeout(test_timeout)
    @pytest.mark.parametrize("case", cases)
    def on_a_gpu(gpu_run, case):
        check_case(gpu_run, case)

    return simulator_run, under_simulator, gpu_run, on_a_gpu


def check_case(run, case: str) -> None:
    """Assert that ``case`` of a :func:`run_cases` result ran and printed ``ok``."""
    proc, out = run
    assert case in out, proc.stdout[-3000:] + proc.stderr[-6000:]
    last = out[case].strip().rsplit("\n", 1)[-1]
    if last.startswith("skipped: "):
        import pytest

        pytest.skip(f"case {case}: {last.removeprefix('skipped: ')}")
    assert out[case].strip().endswith("ok"), out[case]


def main(namespace: dict, cases, simulated_only: bool = True) -> int:
    """Run ``namespace["case_" + name]`` for each of ``cases``; 1 if any failed.  ``simulated_only``: refuse to
    run without the simulator (a case that compiles for a real GPU passes ``False``)."""
    import numba

    real = os.environ.get(REAL_GPU_ENV) == "1"
    assert numba.config.ENABLE_CUDASIM or real or not simulated_only, "run with NUMBA_ENABLE_CUDASIM=1"
    if real:
        from mwumkl_dist.data.cuda import check_device

        check_device()  # numba-cuda imported as the package imports it (its numpy guard first)
    # The simulator runs a block's threads as Python threads and a barrier waits for each of them to take
    # the GIL in turn: with the default 5 ms switch interval the checks take about 3 times as long.
    sys.setswitchinterval(5e-4)
    if numba.config.ENABLE_CUDASIM:
        # A module's first warning adds __warningregistry__ to its globals, and every call of a simulated
        # device function iterates its module's globals (numba's swapped_cuda_module): a thread warning
        # then breaks another thread's call ("dictionary changed size during iteration"; an overflow warns in
        # cuda_kernels._mul).  The registries exist before any kernel runs.
        from mwumkl_dist.core import mwu_rules
        from mwumkl_dist.data.cuda import kernels as cuda_kernels

        for module in (cuda_kernels, mwu_rules):
            vars(module).setdefault("__warningregistry__", {})
    failed = 0
    for case in cases:
        print(f"\n=== {case}", flush=True)
        t0 = time.perf_counter()
        try:
            namespace["case_" + case]()
        except ModuleNotFoundError as exc:  # an optional package the case needs (distributed on a bare GPU box)
            print(f"skipped: {exc}", flush=True)
        except Exception:
            traceback.print_exc(file=sys.stdout)
            print("FAILED", flush=True)
            failed += 1
        else:
            print(f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
            print("ok", flush=True)
    return 1 if failed else 0

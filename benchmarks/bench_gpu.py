"""GPU shards against the CPU engine (issue 13): the same fits, timed, in one run.

Cases (``--cases``, all by default):

* ``sonar-1e5`` / ``sonar-1e6``: Sonar's training split (166 x 60, stratified
  80 %, min-max scaled), the bank ``random:M:size=5:seed=0``, eps 0.2, rho 0.5,
  C = 100 (T = 256 iterations);
* ``a9a-12``: a9a's training file (32561 x 123), the paper's 12 kernels,
  1500 iterations;
* ``mushrooms``: 6500 rows x the paper's 12 kernels on each of its 112
  features (1344 kernels), 150 iterations.

Each case runs the solver (:func:`mwumkl_dist.solvers.mwu.solve`) on the local engine
with CPU shards (all cores unless ``--cpu-threads``) and with GPU shards
(:func:`mwumkl_dist.data.cuda.on_device`), end to end (shards built, data sent to
the GPU, traces, iterations, the final model), and reports both wall times, their
parts (``build_s``, ``traces_s``, ``iterations_s`` up to the last superstep, ``model_s``:
the kernel weights and the class sums), the time per iteration, the GPU shards' memory
(the shards' estimate and the drop in free GPU memory) and whether the two models agree
(kernel weights, alpha and the bias; they should be identical).  A random bank's traces are known
(``n`` each) and taken as the fit driver takes them; other kernels' are the shards'.
Before the first case a tiny bank fit on the GPU compiles the CUDA kernels a bank uses
(``gpu_compile_s``; ``--no-warmup`` leaves that to the first case).  ``--skip-cpu`` leaves out the CPU runs (the
10^6 bank takes minutes on a CPU).

Needs an NVIDIA GPU and ``pip install 'mwumkl_dist[gpu]'``; ``--smoke`` runs
a tiny Sonar bank (for checking the script, e.g. under numba's simulator with
``NUMBA_ENABLE_CUDASIM=1``)::

    python benchmarks/bench_gpu.py                       # every case
    python benchmarks/bench_gpu.py --cases sonar-1e6 --skip-cpu
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/bench_gpu.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run as a script: make the benchmarks package importable

from benchmarks.common import run_info  # noqa: E402
from benchmarks.datasets import load_or_standin, random_splits, scale_split  # noqa: E402

CASES = ("sonar-1e5", "sonar-1e6", "a9a-12", "mushrooms")


def _sonar(n_kernels: int, standin: bool):
    from mwumkl_dist.kernels import RandomGaussianBank

    ds = load_or_standin("sonar", allow_standin=standin)
    train, _ = random_splits(ds.y, 1, test_size=0.2, seed=0)[0]
    X, _ = scale_split(ds.X[train], ds.X[train][:1])
    return ds.label, X, ds.y[train], RandomGaussianBank(n_kernels, subset_size=5, seed=0), None


def _case(name: str, standin: bool, smoke: bool):
    """``(label, X, y, kernels, n_iter or None)``."""
    if smoke:
        label, X, y, bank, _ = _sonar(96, standin)
        return label + " smoke", X[:40], y[:40], bank, 3
    if name == "sonar-1e5":
        return _sonar(10**5, standin)
    if name == "sonar-1e6":
        return _sonar(10**6, standin)
    if name == "a9a-12":
        ds = load_or_standin("a9a", allow_standin=standin)
        return ds.label, ds.X, ds.y, "paper", 1500
    if name == "mushrooms":
        ds = load_or_standin("mushrooms", allow_standin=standin)
        return ds.label, ds.X[:6500], ds.y[:6500], "paper-per-feature", 150
    raise ValueError(f"unknown case {name!r} (one of {', '.join(CASES)})")


def _fit(problem, n_iter: int, epsilon: float, rho: float, C: float, traces=None):
    """Solve ``problem`` on the local engine; ``traces`` None: the shards add them up."""
    from mwumkl_dist.data import cuda
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.solvers import mwu

    t0 = time.perf_counter()
    with LocalEngine(problem, 1) as engine:
        t_build = time.perf_counter() - t0
        free_after_build = cuda.device_memory()[0] if isinstance(problem, cuda.DeviceProblem) else None
        traces = engine.traces() if traces is None else traces
        t_traces = time.perf_counter() - t0 - t_build
        inv_trace = 1.0 / traces
        engine.configure(inv_trace, 1.0 / C)
        t1 = time.perf_counter()
        last = [t1]  # when the last superstep returned (on_state sees every iteration's state; s stays where it is)
        result = mwu.solve(engine, mwu.Iterations(epsilon, rho, n_iter), inv_trace=inv_trace, ridge=1.0 / C,
                           on_state=lambda state: last.__setitem__(0, time.perf_counter()))  # fmt: skip
        t_end = time.perf_counter()
        stats = engine.stats()
    total = time.perf_counter() - t0
    t_iter = last[-1] - t1
    return result, {"total_s": total, "build_s": t_build, "traces_s": t_traces, "iterations_s": t_iter,
                    "model_s": t_end - last[-1], "ms_per_iter": 1e3 * t_iter / n_iter, "stats": stats,
                    "free_after_build": free_after_build}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--skip-cpu", action="store_true", help="GPU runs only")
    ap.add_argument("--cpu-threads", type=int, default=None, help="threads of the CPU runs (default: all cores)")
    ap.add_argument("--standin", action="store_true", help="synthetic stand-ins for missing data sets")
    ap.add_argument("--smoke", action="store_true", help="one tiny Sonar bank fit (checks the script)")
    ap.add_argument("--no-warmup", action="store_true", help="compile the CUDA kernels in the first case's fit")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    args = ap.parse_args(argv)

    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.problems import FeatureProblem, _bank_traces
    from mwumkl_dist.devices import cpu as _columns
    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.solvers import mwu

    epsilon, rho, C = 0.2, 0.5, 100.0
    rows = []
    compile_s = None
    if not (args.smoke or args.no_warmup):
        label, X, y, kernels, n_iter = _case("smoke", args.standin, True)
        t0 = time.perf_counter()
        _fit(cuda.on_device(FeatureProblem(X, np.where(y > 0, 1.0, -1.0), KernelSet(kernels, X.shape[1]))), n_iter,
             epsilon, rho, C)  # fmt: skip
        compile_s = time.perf_counter() - t0
    for name in ["smoke"] if args.smoke else args.cases:
        label, X, y, kernels, n_iter = _case(name, args.standin, args.smoke)
        y = np.where(np.asarray(y) > 0, 1.0, -1.0)
        n_iter = n_iter or mwu.iteration_count(epsilon, rho, len(y))
        kernel_set = KernelSet(kernels, X.shape[1])
        problem = FeatureProblem(X, y, kernel_set)
        traces = _bank_traces(kernel_set, len(y))  # as the fit driver takes a bank's (FeatureInput.traces)
        row = {"case": name, "data": label, "n": len(y), "d": X.shape[1], "kernels": len(kernel_set), "T": n_iter,
               "gpu_compile_s": compile_s}  # fmt: skip
        free_before, total = cuda.device_memory()
        gpu_result, gpu = _fit(cuda.on_device(problem), n_iter, epsilon, rho, C, traces)
        row.update({f"gpu_{k}": v for k, v in gpu.items() if k not in ("stats", "free_after_build")})
        row["gpu_shard_bytes"] = sum(s.get("device_bytes", 0) for s in gpu["stats"])  # the shards' estimate
        row["gpu_used_bytes"] = free_before - gpu["free_after_build"]  # measured: free memory before - after
        row["gpu_memory_total"] = total
        row["gpu_free_before"] = free_before
        if not args.skip_cpu:
            threads = args.cpu_threads or _columns.get_num_threads()
            with _columns.thread_limit(threads):
                cpu_result, cpu = _fit(problem, n_iter, epsilon, rho, C, traces)
            row.update({f"cpu_{k}": v for k, v in cpu.items() if k not in ("stats", "free_after_build")})
            row["cpu_threads"] = threads
            row["speedup"] = cpu["total_s"] / gpu["total_s"]
            a, b = cpu_result.kernel_weights, gpu_result.kernel_weights
            row["weights_max_rel_diff"] = float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-300)))
            row["identical_model"] = bool(np.array_equal(a, b) and np.array_equal(cpu_result.alpha, gpu_result.alpha)
                                          and cpu_result.bias == gpu_result.bias)  # fmt: skip
        rows.append(row)
        print(json.dumps(row, default=float), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, "run": run_info()}, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One prepared run on a machine with an NVIDIA GPU (issue 40): its CUDA test cases, then the timings, in JSON lines.

``python benchmarks/device_check.py [--budget 480] [--datasets-dir DIR] [--parts tests,gpu,cpu] [--smoke]``

Three parts, each in its own process, one after the other (none disturbs another's timing), each line printed
as soon as it is known:

* ``tests``: every CUDA case of ``tests/test_cuda_sim.py`` and ``tests/test_two_stage_cuda.py`` on the GPU
  (the cases CI runs under numba's simulator; ``python -m pytest -m gpu`` runs the same): one line per case,
  ``{"part": "tests", "file", "case", "ok", "output"}`` (the output's end where it failed);
* ``gpu``: the 10^5- and 10^6-kernel Sonar banks (``random:M:size=5:seed=0``, eps 0.2, rho 0.5, C = 100,
  T = 256, ``benchmarks/bench_gpu.py``'s fit: the local engine, end to end), then E7's synthetic data
  (``benchmarks/device_two_stage.py``: ``MWUMKLClassifier(device="cuda")`` with its defaults) at 10^5 and
  10^6 rows, scored on 50,000 test rows;
* ``cpu``: the 10^5-kernel bank and E7 at 10^5 and 10^6 rows with ``device="cpu"`` on all cores.

Before the timed fits each process fits once, untimed, on small data (numba compiles its CPU and CUDA
kernels).  A part still running when its share of ``--budget`` seconds is spent is stopped: a line
``{"part", "item", "timed_out": true}`` names the fit it was in.  The last line is the machine (GPU, cores,
versions) and the figures the issue's targets ask for (the GPU's speed-up over the CPU on E7 at 10^6 rows
and 10^5 rows, the error difference, the 10^6-kernel bank's seconds).

Without a GPU (outside ``--smoke``) it prints one line and exits with status 2.  ``--smoke`` runs every part on
tiny sizes (under the simulator, ``NUMBA_ENABLE_CUDASIM=1``, anywhere; its times mean nothing; E7 at 400 rows,
an MWU fit that the cost model sends to the CPU).

Sonar: ``--datasets-dir`` (its ``sonar.svm.gz``), else the default data folder, else a synthetic stand-in
(the bank lines say which: ``"standin"``).  On a device machine the repository travels without
``../shared``: copy ``sonar.svm.gz`` into an ignored folder of the checkout and carry it.

numpy 2.5 removed ``np.row_stack``, which numba-cuda releases of 2026 still name when ``numba.cuda`` is
imported; the package gives it back (:func:`mwumkl_dist.data.cuda.numpy_compat`) before that import,
so this script runs on such a machine as installed (``docs/gpu.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make the benchmarks package importable

PARTS = ("tests", "gpu", "cpu")
#: The share of ``--budget`` each part may take (what one part leaves unspent goes to the next).
SHARES = {"tests": 0.25, "gpu": 0.4, "cpu": 0.35}
BANKS = (10**5, 10**6)
E7_SIZES = (10**5, 10**6)
N_TEST = 50_000
TEST_FILES = ("test_cuda_sim.py", "test_two_stage_cuda.py")


def _emit(record: dict) -> None:
    print(json.dumps(record, default=float), flush=True)


def _plan(smoke: bool) -> dict:
    if smoke:
        e7_params = {"C": 1.0, "kernels": "linear, gaussian:1"}
        return {"banks": (64,), "cpu_banks": (64,), "bank_rows": 24, "bank_iter": 2, "e7": (400,), "n_test": 200,
                "cases": {"test_cuda_sim.py": ["errors"]}, "e7_params": e7_params}  # fmt: skip
    import importlib

    sys.path.insert(0, str(ROOT / "tests"))
    cases = {name: list(importlib.import_module(name[:-3]).CASES) for name in TEST_FILES}
    return {"banks": BANKS, "cpu_banks": BANKS[:1], "bank_rows": None, "bank_iter": None, "e7": E7_SIZES,
            "n_test": N_TEST, "cases": cases, "e7_params": {}}  # fmt: skip


# ----------------------------------------------------------------------------- the parts (each in its process)


def part_tests(plan: dict, deadline: float) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import _cudasim

    for name, cases in plan["cases"].items():
        if not cases:
            continue
        simulate = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
        limit = deadline - time.time()
        try:
            proc, out = _cudasim.run_cases(str(ROOT / "tests" / name), cases, max(10.0, limit), simulate=simulate)
        except subprocess.TimeoutExpired:
            _emit({"part": "tests", "file": name, "timed_out": True, "limit_s": round(limit, 1), "cases": cases})
            continue
        for case in cases:
            text = out.get(case, "")
            ok = text.strip().endswith("ok")
            skipped = text.strip().rsplit("\n", 1)[-1] if "\nskipped: " in "\n" + text.strip() else None
            failure = None if ok or skipped else (text or proc.stdout[-1500:] + proc.stderr[-2500:])[-3000:]
            _emit({"part": "tests", "file": name, "case": case, "ok": None if skipped else ok, "skipped": skipped,
                   "simulated": simulate, "output": failure})  # fmt: skip


def _bank(plan: dict, device: str, n_kernels: int, datasets_dir, warm: bool = False) -> dict:
    import numpy as np

    from benchmarks.bench_gpu import _fit
    from benchmarks.datasets import load_or_standin, random_splits, scale_split
    from mwumkl_dist.core.mwu_rules import iteration_count
    from mwumkl_dist.data import cuda
    from mwumkl_dist.data.problems import FeatureProblem, _bank_traces
    from mwumkl_dist.kernels import KernelSet, RandomGaussianBank

    ds = load_or_standin("sonar", datasets_dir, allow_standin=True, download=False)
    train, _ = random_splits(ds.y, 1, test_size=0.2, seed=0)[0]
    X, _ = scale_split(ds.X[train], ds.X[train][:1])
    y = np.where(ds.y[train] > 0, 1.0, -1.0)
    if plan["bank_rows"]:
        X, y = X[: plan["bank_rows"]], y[: plan["bank_rows"]]
    epsilon, rho, C = 0.2, 0.5, 100.0
    n_iter = 3 if warm else plan["bank_iter"] or iteration_count(epsilon, rho, len(y))
    kernel_set = KernelSet(RandomGaussianBank(n_kernels, subset_size=5, seed=0), X.shape[1])
    problem = FeatureProblem(X, y, kernel_set)
    on = cuda.on_device(problem) if device == "cuda" else problem
    result, times = _fit(on, n_iter, epsilon, rho, C, _bank_traces(kernel_set, len(y)))
    return {"item": f"bank-{n_kernels}", "device": device, "data": ds.label, "standin": ds.source == "synthetic",
            "n": len(y), "kernels": n_kernels,
            "T": n_iter, "fit_s": round(times["total_s"], 3), "iterations_s": round(times["iterations_s"], 3),
            "ms_per_iter": round(times["ms_per_iter"], 3), "build_s": round(times["build_s"], 3),
            "model_s": round(times["model_s"], 3), "support": int(np.count_nonzero(result.alpha)),
            "weights_head": [float(w) for w in np.sort(result.kernel_weights)[::-1][:3]]}  # fmt: skip


def _e7(plan: dict, device: str, n: int, Xt, yt) -> dict:
    from benchmarks.bench_scale_n import SEED, synthetic_rows
    from benchmarks.device_two_stage import fit_once

    X, y = synthetic_rows(n, SEED)
    return {"item": f"e7-{n}", **fit_once(device, X, y, Xt, yt, **plan["e7_params"])}


def part_fits(plan: dict, device: str, datasets_dir) -> None:
    from benchmarks.bench_scale_n import SEED, synthetic_rows
    from benchmarks.device_two_stage import WARMUP_ROWS, fit_once

    Xt, yt = synthetic_rows(plan["n_test"], SEED, part=1)
    current = {"item": "warm-up"}
    _emit({"part": device, "started": current["item"]})
    with warnings.catch_warnings():  # untimed: numba compiles (or loads) its kernels
        warnings.simplefilter("ignore")
        _bank(plan, device, 16 if plan["bank_rows"] else 50, datasets_dir, warm=True)
        if not plan["bank_rows"]:
            warm_X, warm_y = synthetic_rows(WARMUP_ROWS, SEED)
            fit_once(device, warm_X, warm_y, Xt[:100], yt[:100])
    items = [("bank", m) for m in (plan["banks"] if device == "cuda" else plan["cpu_banks"])]
    items += [("e7", n) for n in plan["e7"]]
    for kind, size in items:
        _emit({"part": device, "started": f"{kind}-{size}"})
        t0 = time.perf_counter()
        try:
            record = _bank(plan, device, size, datasets_dir) if kind == "bank" else _e7(plan, device, size, Xt, yt)
        except Exception as exc:  # one failing fit does not hide the others' figures
            record = {"item": f"{kind}-{size}", "device": device, "failed": f"{type(exc).__name__}: {exc}"[:2000],
                      "after_s": round(time.perf_counter() - t0, 3)}  # fmt: skip
        _emit({"part": device, **record})


# ----------------------------------------------------------------------------- the driver


def _run_part(part: str, args, limit: float) -> list[dict]:
    """Run one part in a child process, relaying its lines; stop it at ``limit`` seconds. Its records."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", part, "--budget", str(limit)]
    if args.smoke:
        cmd.append("--smoke")
    if args.datasets_dir:
        cmd += ["--datasets-dir", str(args.datasets_dir)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    records, started = [], None
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    import threading

    timer = threading.Timer(limit, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "started" in record:
                started = record["started"]
                continue
            records.append(record)
            _emit(record)
        proc.wait()
    finally:
        timer.cancel()
    stderr = proc.stderr.read()
    if proc.returncode != 0:
        timed_out = time.time() - t0 >= limit - 1
        _emit({"part": part, "item": started, "timed_out": timed_out, "limit_s": round(limit, 1),
               "returncode": proc.returncode, "stderr": stderr[-2000:]})  # fmt: skip
    return records


def _summary(records: list[dict]) -> dict:
    fits = {(r.get("item"), r.get("device")): r for r in records if "fit_s" in r}
    out = {}
    for n in E7_SIZES:
        gpu, cpu = fits.get((f"e7-{n}", "cuda")), fits.get((f"e7-{n}", "cpu"))
        if gpu and cpu:
            out[f"e7_{n}_speedup"] = round(cpu["fit_s"] / gpu["fit_s"], 3)
            out[f"e7_{n}_error_diff_points"] = round(100 * (gpu["error"] - cpu["error"]), 4)
    for m in BANKS:
        if (f"bank-{m}", "cuda") in fits:
            out[f"bank_{m}_gpu_s"] = fits[(f"bank-{m}", "cuda")]["fit_s"]
    if ("bank-100000", "cpu") in fits:
        out["bank_100000_cpu_s"] = fits[("bank-100000", "cpu")]["fit_s"]
    tests = [r for r in records if r.get("part") == "tests"]
    out["tests_passed"] = f"{sum(r['ok'] is True for r in tests)}/{len(tests)}"
    out["tests_skipped"] = [r["case"] for r in tests if r["ok"] is None]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for everything (default 480)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated: tests, gpu, cpu (default all)")
    parser.add_argument("--datasets-dir", type=Path, default=None, help="a folder with sonar.svm.gz")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script (under the simulator)")
    parser.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or any(p not in PARTS for p in parts):
        parser.error(f"--parts: expected a comma-separated list of {', '.join(PARTS)}, got {args.parts!r}")
    if args.budget <= 0:
        parser.error(f"--budget: expected a positive number of seconds, got {args.budget}")
    plan = _plan(args.smoke)
    if args.child:
        if args.child == "tests":
            part_tests(plan, time.time() + args.budget)
        else:
            part_fits(plan, "cuda" if args.child == "gpu" else "cpu", args.datasets_dir)
        return 0
    from mwumkl_dist.data.cuda import check_device

    try:
        check_device()
    except RuntimeError as exc:  # one line, before anything runs
        _emit({"device_check": "no usable GPU", "error": str(exc)})
        return 2
    from benchmarks.common import run_info
    from benchmarks.device_two_stage import gpu_info

    t0 = time.time()
    records = []
    spent_share = 0.0
    for part in parts:
        spent_share += SHARES[part]
        # this part's share, plus what the parts before it left unspent
        limit = max(30.0, args.budget * spent_share - (time.time() - t0))
        records += _run_part(part, args, limit)
    info = run_info()
    machine = {**gpu_info(), **{k: v for k, v in info.items() if isinstance(v, (str, int, float))}}
    _emit({"machine": machine, "summary": _summary(records), "wall_s": round(time.time() - t0, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

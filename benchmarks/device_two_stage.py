"""The two-stage fit on a GPU against the CPU's (issue 29, item 6): E7's synthetic data, side by side in one run.

``python benchmarks/device_two_stage.py [--sizes 100000,1000000] [--devices cuda,cpu] [--n-test 50000]
[--threads N] [--out FILE]``

Per (size, device), in that order: ``MWUMKLClassifier(device=...)`` with its defaults (from 3,001 rows
``solver="auto"`` is the two-stage fit; on a GPU its weight stage runs on the GPU engine and its linear
stage keeps the kernel columns on the GPU, where the Newton solver's passes run), fitted on the first
``n`` rows of E7's synthetic training stream (``benchmarks/bench_scale_n.py``: 20 features, a checkerboard
plus a radial term, 5 % of labels flipped) and scored on its own 50,000-row test stream.  Before the timed
fits, one untimed fit per device on 4,000 rows compiles numba's kernels (CPU and CUDA), so the times are the
fits', not the JIT's.

Prints one JSON line per fit: ``device``, ``n``, ``fit_s`` (wall, ``time.perf_counter``), ``cpu_s`` (the
process's CPU time), ``error`` (test error), ``rank`` (``n_components_``; ``n`` for the exact solve),
``method`` (``"exact"``, or the linear solves' methods: ``"explicit"`` / ``"cg"``, see
:func:`mwumkl_dist.solvers.two_stage.newton.linear_method`), ``residual`` (``nystroem_residual_``),
``solver``, ``C``; then one line with the machine (GPU name and memory, cores, versions).  ``--out``
also writes them to a file (JSON lines).

Needs an NVIDIA GPU and ``pip install 'mwumkl_dist[gpu]'`` (numba-cuda) whenever ``--devices`` names
``cuda``: without one it exits with status 2 and a one-line message before fitting anything.  ``--devices
cpu --smoke`` runs anywhere in well under a minute (a check of the script: 3,200 rows, ``C=1``; its times mean
nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

from benchmarks.bench_scale_n import SEED, synthetic_rows  # noqa: E402
from benchmarks.common import run_info  # noqa: E402

SIZES = (100_000, 1_000_000)
DEVICES = ("cuda", "cpu")
N_TEST = 50_000
WARMUP_ROWS = 4_000
SMOKE_ROWS = 3_200


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(float(s)) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes: expected comma-separated row counts, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sizes: expected positive row counts, got {text!r}")
    return sizes


def _devices(text: str) -> list[str]:
    devices = [s.strip() for s in text.split(",") if s.strip()]
    if not devices or any(d not in DEVICES for d in devices):
        raise argparse.ArgumentTypeError(f"--devices: expected a comma-separated list of cuda, cpu; got {text!r}")
    return devices


def gpu_info() -> dict:
    """The GPU's name and memory (a RuntimeError naming what is missing where there is none)."""
    from mwumkl_dist.data.cuda import check_device, device_memory

    cuda = check_device()
    free, total = device_memory()
    try:
        name = cuda.get_current_device().name
    except AttributeError:  # numba's CUDA simulator (a script's --smoke run)
        name = "numba CUDA simulator"
    return {"gpu": name.decode() if isinstance(name, bytes) else str(name), "gpu_memory_gib": total / 2**30}


class _Methods:
    """Records the linear solves' methods (:func:`linear_method`'s answers) during a fit."""

    def __init__(self):
        from mwumkl_dist.solvers.two_stage import solver

        self.module, self.real, self.seen = solver, solver.linear_method, []

    def __enter__(self):
        def recorded(*args, **kwargs):
            method = self.real(*args, **kwargs)
            self.seen.append(method)
            return method

        self.module.linear_method = recorded
        return self

    def __exit__(self, *exc):
        self.module.linear_method = self.real


def fit_once(device: str, X, y, Xt, yt, **params) -> dict:
    """One fit on ``device`` (the defaults, or ``params``), timed: the JSON record."""
    import numpy as np

    from mwumkl_dist import MWUMKLClassifier

    est = MWUMKLClassifier(device=device, **params)
    with _Methods() as methods, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # numba-cuda's launch-size hint, once per small launch (the package filters it; "always" would not)
        warnings.filterwarnings("ignore", message="Grid size .* under-utilization")
        wall, cpu = time.perf_counter(), time.process_time()
        est.fit(X, y)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    error = float(np.mean(est.predict(Xt) != yt))
    polished = bool(getattr(est, "polished_", False))
    return {
        "device": device,
        "n": len(y),
        "fit_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "error": error,
        "rank": int(np.max(getattr(est, "n_components_", len(y)))),
        "method": "exact" if polished else "+".join(sorted(set(methods.seen))) or None,
        "residual": float(np.max(getattr(est, "nystroem_residual_", np.nan))),
        "solver": getattr(est, "solver_", None),
        "C": float(est.C_),
        "warnings": sorted({type(w.message).__name__ for w in caught}),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_sizes, default=list(SIZES), help="training rows, comma-separated")
    parser.add_argument("--devices", type=_devices, default=list(DEVICES), help="cuda, cpu (in that order)")
    parser.add_argument("--n-test", type=int, default=N_TEST, help="test rows (default 50000)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of the fits (default: all cores)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON lines to this file")
    parser.add_argument("--smoke", action="store_true",
                        help=f"check the script: {SMOKE_ROWS} rows, C=1 (no cross-validation), no warm-up")  # fmt: skip
    args = parser.parse_args(argv)
    if args.n_test < 1:
        parser.error(f"--n-test: expected a positive row count, got {args.n_test}")
    if args.threads is not None:
        os.environ["MWUMKL_NUM_THREADS"] = str(args.threads)
    machine = {}
    if "cuda" in args.devices:
        try:
            machine.update(gpu_info())
        except RuntimeError as exc:
            print(f"device_two_stage.py: no usable GPU for --devices {','.join(args.devices)}: {exc}", file=sys.stderr)
            return 2
    lines = []

    def emit(record: dict) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        lines.append(line)

    params = {"C": 1.0} if args.smoke else {}
    sizes, n_test = ([SMOKE_ROWS], min(args.n_test, 200)) if args.smoke else (args.sizes, args.n_test)
    Xt, yt = synthetic_rows(n_test, SEED, part=1)
    warm_X, warm_y = synthetic_rows(WARMUP_ROWS, SEED)
    for device in [] if args.smoke else args.devices:  # untimed: numba compiles (or loads) its kernels
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit_once(device, warm_X, warm_y, Xt[:100], yt[:100])
    for n in sizes:
        X, y = synthetic_rows(n, SEED)
        for device in args.devices:
            emit(fit_once(device, X, y, Xt, yt, **params))
        del X, y
    info = run_info()
    emit({"machine": {**machine, **{k: v for k, v in info.items() if isinstance(v, (str, int, float))}}})
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which parts of a fit stay serial: the parallelism profile of one fit per thread count (issue 22, item 2).

A sampler thread reads, every 2 ms, the state and the CPU time of each of the
fit's threads (``/proc/self/task/*/stat`` and ``schedstat``, Linux).  The CPU
of each interval is *serial* when at most one of the fit's threads was
runnable at its end, else *parallel*; on a serial interval the sampler also
records where the fit's Python threads were (their innermost package, NumPy
or SciPy frames).  Per phase of the fit (the C / selectivity cross-validation,
the Nystroem maps, the kernel columns, the Newton solves, the rest) it prints
the wall time, the CPU, the serial and the parallel CPU, and the time the same
work would take on an idle machine with 2 cores, ``serial + parallel / 2``.
That estimate does not depend on the machine's load, unlike the wall time: a
thread waiting for a core it shares with another program is still runnable,
and one waiting for the GIL or a lock is not.  It ignores what two threads
cost each other (memory bandwidth, caches, the GIL's hand-overs), so it is an
upper bound on the speed-up; ``bench_scaling.py`` measures the real one.

Usage::

    python benchmarks/bench_serial.py [--problem a9a-defaults] [--threads 1,2] [--out DIR]

Problems are ``bench_scaling.py``'s (``quick-defaults`` runs in seconds).  Writes
``serial.json`` / ``serial.csv`` into ``--out`` (default ``benchmarks/results/serial/``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

from benchmarks import bench_scaling as B  # noqa: E402
from benchmarks.common import Context, write_outputs  # noqa: E402

#: The phases: (name, owner module or class path, attribute); the rest of the fit is "other".
PHASES = (
    ("cross-validation", "mwumkl_dist.solvers.auto", "choose_C"),
    ("Nystroem maps", "mwumkl_dist.solvers.two_stage.solver:TwoStageSolver", "choose_maps"),
    ("kernel columns", "mwumkl_dist.solvers.two_stage.solver", "_load_problem"),
    ("Newton", "mwumkl_dist.solvers.two_stage.solver", "newton_solve"),
)
#: Frames worth naming where the serial time goes.
_PLACES = ("mwumkl_dist", "sklearn", "numpy/linalg", "scipy/linalg")


class Sampler(threading.Thread):
    """Samples this process's other threads: ``(time, runnable threads, CPU seconds since the last sample)``."""

    def __init__(self, gap: float = 0.002):
        super().__init__(daemon=True)
        self.gap, self.samples, self.places, self._halt = gap, [], [], threading.Event()

    def run(self):
        me, last = threading.get_native_id(), None
        while not self._halt.is_set():
            runnable, now = 0, {}
            for tid in os.listdir("/proc/self/task"):
                if int(tid) == me:
                    continue
                try:
                    with open(f"/proc/self/task/{tid}/stat") as fh:
                        state = fh.read().rpartition(")")[2].split()[0]
                    with open(f"/proc/self/task/{tid}/schedstat") as fh:
                        now[tid] = int(fh.read().split()[0])
                except (OSError, IndexError, ValueError):  # the thread ended
                    continue
                runnable += state == "R"
            # A thread that started since the last sample counts from its start; one that ended is lost.
            cpu = 0.0 if last is None else sum(ns - last.get(tid, 0) for tid, ns in now.items()) / 1e9
            last = now
            self.samples.append((time.perf_counter(), runnable, cpu))
            if runnable <= 1 and cpu > 0:
                self.places.append((cpu, _python_places()))
            self._halt.wait(self.gap)

    def stop(self):
        self._halt.set()
        self.join()


def _python_places() -> tuple:
    """Where the other Python threads are: their three innermost package / NumPy / SciPy frames."""
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        names = []
        while frame is not None and len(names) < 3:
            code = frame.f_code
            if any(p in code.co_filename for p in _PLACES):
                names.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}")
            frame = frame.f_back
        if names:
            out.append(" < ".join(names))
    return tuple(out)


@contextlib.contextmanager
def marked_phases(spans: dict):
    """Record the ``(start, end)`` of every call of each phase's function into ``spans[name]``."""
    import importlib

    patched = []
    for name, where, attr in PHASES:
        module, _, cls = where.partition(":")
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        original = getattr(owner, attr)

        def timed(*args, _original=original, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                spans.setdefault(_name, []).append((start, time.perf_counter()))

        setattr(owner, attr, timed)
        patched.append((owner, attr, original))
    try:
        yield
    finally:
        for owner, attr, original in patched:
            setattr(owner, attr, original)


def profile(X, y, spec: B.Spec, n_jobs: int) -> tuple[list[dict], list, object]:
    """One fit on ``n_jobs`` threads: its phase rows, the serial places and the estimator."""
    B.warm_up(X, y, spec, n_jobs=n_jobs)
    clf = B.make_estimator(spec, max_iter=spec.max_iter, n_jobs=n_jobs)
    spans: dict = {}
    sampler = Sampler()
    with marked_phases(spans):
        sampler.start()
        load = os.getloadavg()[0]
        start, cpu = time.perf_counter(), time.process_time()
        clf.fit(X, y)
        end, cpu = time.perf_counter(), time.process_time() - cpu
        sampler.stop()
    S = np.array(sampler.samples)
    inside = np.zeros(len(S), dtype=bool)
    rows = []

    def row(name, mask, wall):
        serial = float(S[mask & (S[:, 1] <= 1), 2].sum())
        parallel = float(S[mask & (S[:, 1] >= 2), 2].sum())
        rows.append({"n_jobs": n_jobs, "phase": name, "wall_s": wall, "serial_cpu_s": serial,
                     "parallel_cpu_s": parallel, "two_core_s": serial + parallel / 2, "load_1min": load})  # fmt: skip

    for name, _, _ in PHASES:
        mask = np.zeros(len(S), dtype=bool)
        for a, b in spans.get(name, []):
            mask |= (S[:, 0] > a) & (S[:, 0] <= b)
        inside |= mask
        row(name, mask, sum(b - a for a, b in spans.get(name, [])))
    fit = (S[:, 0] > start) & (S[:, 0] <= end)
    row("other", fit & ~inside, (end - start) - sum(r["wall_s"] for r in rows))
    row("fit", fit, end - start)
    rows[-1]["cpu_s"] = cpu  # the process's own count (the sampler misses threads that live under 2 ms)
    return rows, sampler.places, clf


def print_profile(rows: list[dict], places: list, out=sys.stdout) -> None:
    print(f"\nn_jobs={rows[0]['n_jobs']} (load {rows[0]['load_1min']:.2f})", file=out)
    print(f"{'phase':18s} {'wall s':>7s} {'serial CPU s':>12s} {'parallel CPU s':>14s} {'2-core s':>8s}", file=out)
    for r in rows:
        print(f"{r['phase']:18s} {r['wall_s']:7.2f} {r['serial_cpu_s']:12.2f} {r['parallel_cpu_s']:14.2f} "
              f"{r['two_core_s']:8.2f}", file=out)  # fmt: skip
    where = collections.Counter()
    for cpu, names in places:
        for name in names:
            where[name] += cpu / len(names)
    print("serial CPU by place (s):", file=out)
    for name, cpu in where.most_common(10):
        print(f"  {cpu:6.3f}  {name}", file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", default="a9a-defaults", help="a bench_scaling problem (default a9a-defaults)")
    p.add_argument("--threads", type=B._ints, default=[1, 2], help="thread counts (default 1,2)")
    p.add_argument("--datasets-dir", type=Path, default=None, help="data folder (default ../shared/datasets)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "serial", help="output folder")
    args = p.parse_args(argv)
    catalogue = {**B.PROBLEMS, **B.QUICK_PROBLEMS}
    if args.problem not in catalogue:
        p.error(f"unknown problem {args.problem!r}; choose from {', '.join(catalogue)}")
    spec = catalogue[args.problem]
    started = time.time()
    X, y, source = B.load_problem(spec, args.datasets_dir, download=False)
    print(f"{args.problem}: {X.shape[0]} x {X.shape[1]} ({source}); load {os.getloadavg()[0]:.2f}")
    all_rows, models = [], []
    for n in args.threads:
        rows, places, clf = profile(X, y, spec, n)
        print_profile(rows, places)
        all_rows += rows
        models.append(clf)
    same = all(B.same_model(models[0], m) for m in models[1:])
    one = next((r for r in all_rows if r["n_jobs"] == 1 and r["phase"] == "fit"), None)
    summary = {"same_model": same}
    for r in all_rows:
        if r["phase"] == "fit" and one is not None:
            summary[f"two_core_speedup_n_jobs_{r['n_jobs']}"] = round(one["two_core_s"] / r["two_core_s"], 3)
    speedups = ", ".join(f"{k.rsplit('_', 1)[-1]} threads {v}x" for k, v in summary.items() if k != "same_model")
    print(f"\nsame model: {same}; estimated speed-up on 2 idle cores over n_jobs=1: {speedups}")
    ctx = Context(out=args.out, quick=spec.dataset is None, command=" ".join([sys.executable, *sys.argv]))
    settings = {"problem": args.problem, "threads": args.threads, "sample_gap_s": 0.002}
    path = write_outputs(ctx, "serial", "Serial and parallel CPU of one fit", all_rows, summary, settings, [], started)
    print(f"wrote {path}")
    return 0 if same else 3


if __name__ == "__main__":
    sys.exit(main())

"""Per-superstep overhead of the Dask engine, as CPU time per step (issue 22; run on demand, not a test).

On a shared machine wall-clock speed-ups are noise; the CPU time each superstep costs is not.  For
every problem this script runs the MWU iteration (``mwumkl_dist.solvers.mwu.iterate.solve``, the
fit's loop, without the fit's set-up and checks) for ``--iters`` iterations

* on the local engine, one thread: the compute of a step (``local cpu``);
* on a ``LocalCluster`` of worker processes per ``--layouts`` (``WxT``: W workers x T threads,
  one row shard per worker): the driver's CPU per step (``process_time``, the Dask client's
  own threads included) and the workers' (``psutil``, user + system, every thread of the
  worker processes), each less what the same processes burn when idle over the same time
  (heartbeats; measured for 2 s before the run).

``overhead cpu`` = driver + workers - local: what distributing a step costs in CPU.  On the
``empty`` problem (64 rows, 12 kernels: a step computes next to nothing) the wall time per step
is the latency of an empty superstep; its median over the steps (``step p50``) is the figure least
moved by other processes' load.  Every Dask run must give the local engine's model to the bit
(``same``).

``--compare DIR`` measures another checkout of the package too (e.g. ``--compare /work/main``, the
code before a change): rounds alternate between the two (``--rounds``), each in a fresh process, so
drift in the machine's load falls on both alike; every figure is the median over the rounds.

Usage::

    python benchmarks/bench_superstep.py                                   # empty and a9a, 2x1, this code
    python benchmarks/bench_superstep.py --compare /work/main --rounds 3  # before / after, interleaved
    python benchmarks/bench_superstep.py --problems empty,a9a,mushrooms --layouts 1x1,2x1 --iters 2000

Problems: ``empty`` (synthetic 64 x 4, the paper's 12 kernels), ``a9a`` (32561 x 123 CSR, 12
kernels) and ``mushrooms`` (6500 rows, 1344 per-feature kernels; ``--iters`` capped at 150), from
``../shared/datasets`` (``benchmarks/datasets.py``).  Writes ``superstep_overhead.json`` and ``.md``
into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# Run as a script: this checkout's benchmarks package (the data), then mwumkl_dist from PYTHONPATH first
# (each round's package, see _round; the Dask workers, which import this file again, too).
sys.path.insert(0, str(HERE.parent))
from benchmarks.bench_scaling import PROBLEMS as SCALING  # noqa: E402
from benchmarks.bench_scaling import load_problem  # noqa: E402

sys.path[:] = [p for p in sys.path if p != str(HERE.parent)] + [str(HERE.parent)]  # bench_scaling adds it too

PROBLEMS = ("empty", "a9a", "mushrooms")
METRICS = ("local_cpu_ms", "driver_cpu_ms", "workers_cpu_ms", "overhead_cpu_ms", "wall_ms", "step_p50_ms")
RIDGE = 1e-4
IDLE_S = 2.0


def _problem(name: str, datasets_dir):
    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.kernels import KernelSet

    if name == "empty":
        rng = np.random.default_rng(0)
        X = rng.random((64, 4))
        return FeatureProblem(X, np.where(X[:, 0] > 0.5, 1.0, -1.0), KernelSet("paper", 4))
    spec = SCALING[name]
    X, y, _ = load_problem(spec, datasets_dir, False)
    return FeatureProblem(X, y, KernelSet(spec.kernels, X.shape[1]))


def _solve(engine, n_iter: int, times: list | None = None):
    """``(wall s, driver cpu s, result)`` of ``n_iter`` iterations; ``times`` gets each superstep's wall time."""
    from mwumkl_dist.solvers.mwu.iterate import Iterations, solve

    inv_trace = 1.0 / engine.traces()
    engine.configure(inv_trace, RIDGE)
    if times is not None:
        step = type(engine).superstep

        def timed(pos, neg, coef):
            start = time.perf_counter()
            try:
                return step(engine, pos, neg, coef)
            finally:
                times.append(time.perf_counter() - start)

        engine.superstep = timed
    wall, cpu = time.perf_counter(), time.process_time()
    result = solve(engine, Iterations(0.2, 0.5, n_iter), inv_trace=inv_trace, ridge=RIDGE)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def _worker_cpu(client) -> float:
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in client.run(os.getpid).values())


def _idle_rates(client) -> tuple[float, float]:
    """CPU seconds per second the driver and the workers burn while nothing runs."""
    workers, driver = _worker_cpu(client), time.process_time()
    time.sleep(IDLE_S)
    return (time.process_time() - driver) / IDLE_S, (_worker_cpu(client) - workers) / IDLE_S


def measure(problems, layouts, iters: int, datasets_dir) -> list[dict]:
    """One round: every problem on the local engine, then on every layout (this process's package)."""
    from distributed import Client, LocalCluster

    import mwumkl_dist
    from mwumkl_dist.engines.dask import DaskEngine
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.threads import thread_limit

    rows = []
    loaded = {name: _problem(name, datasets_dir) for name in problems}
    refs = {}
    for name, problem in loaded.items():
        n = min(iters, 150) if name == "mushrooms" else iters
        with thread_limit(1), LocalEngine(problem) as engine:
            _solve(engine, 5)  # numba compiles or loads its cache
            wall, cpu, result = _solve(engine, n)
        refs[name] = (n, cpu / n, result)
    for workers, threads in layouts:
        with (
            LocalCluster(
                n_workers=workers, threads_per_worker=threads, processes=True, dashboard_address=":0", memory_limit=0
            ) as cluster,
            Client(cluster) as client,
        ):
            client.wait_for_workers(workers, timeout=120)
            for name, problem in loaded.items():
                n, local_cpu, ref = refs[name]
                with DaskEngine(problem, client, n_shards=workers) as engine:
                    _solve(engine, 5)
                    idle_driver, idle_workers = _idle_rates(client)
                    times: list = []
                    before = _worker_cpu(client)
                    wall, cpu, result = _solve(engine, n, times)
                    workers_cpu = _worker_cpu(client) - before - idle_workers * wall
                    cpu -= idle_driver * wall
                same = all(np.array_equal(getattr(result, k), getattr(ref, k)) for k in ("alpha", "kernel_weights"))
                row = {
                    "problem": name,
                    "layout": f"{workers}x{threads}",
                    "iters": n,
                    "local_cpu_ms": 1e3 * local_cpu,
                    "driver_cpu_ms": 1e3 * cpu / n,
                    "workers_cpu_ms": 1e3 * workers_cpu / n,
                    "wall_ms": 1e3 * wall / n,
                    "step_p50_ms": 1e3 * float(np.median(times)),
                    "same": bool(same),
                    "load": os.getloadavg()[0],
                    "package": str(Path(mwumkl_dist.__file__).parent),
                }
                row["overhead_cpu_ms"] = row["driver_cpu_ms"] + row["workers_cpu_ms"] - row["local_cpu_ms"]
                rows.append(row)
                print(
                    f"  {name} {row['layout']}: " + ", ".join(f"{k} {row[k]:.3f}" for k in METRICS),
                    f"same {same}, load {row['load']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def _layouts(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        w, _, t = item.strip().partition("x")
        out.append((int(w), int(t or 1)))
    return out


def _round(root: Path, args) -> list[dict]:
    """One round in a fresh process whose package (and its workers') is the one under ``root``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", "--problems", ",".join(args.problems)]
    cmd += ["--layouts", ",".join(f"{w}x{t}" for w, t in args.layouts), "--iters", str(args.iters)]
    if args.datasets_dir:
        cmd += ["--datasets-dir", str(args.datasets_dir)]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True, cwd=str(root), text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def summarize(rounds: dict) -> list[dict]:
    """Per code, problem and layout: each metric's median over the rounds."""
    out = []
    for code, per_round in rounds.items():
        keys = sorted({(r["problem"], r["layout"]) for rows in per_round for r in rows}, key=str)
        for problem, layout in keys:
            rows = [r for rows in per_round for r in rows if (r["problem"], r["layout"]) == (problem, layout)]
            row = {"code": code, "problem": problem, "layout": layout, "rounds": len(rows), "iters": rows[0]["iters"]}
            row.update({k: float(np.median([r[k] for r in rows])) for k in METRICS})
            row["same"] = all(r["same"] for r in rows)
            row["load"] = [round(r["load"], 2) for r in rows]
            row["package"] = sorted({r["package"] for r in rows})
            out.append(row)
    return out


def render_md(doc: dict) -> str:
    lines = [
        "# Per-superstep overhead of the Dask engine",
        "",
        "Written by `benchmarks/bench_superstep.py` (see its docstring). Milliseconds per iteration, median over "
        f"{doc['settings']['rounds']} round(s); CPU figures less the processes' idle burn. Command: "
        f"`{doc['command']}`. Load average (1 min) at the start {doc['load_start']:.2f}, at the end "
        f"{doc['load_end']:.2f}; {doc['machine']['cores']} cores, {doc['machine']['cpu']}.",
        "",
        "| code | problem | layout | iters | local cpu | driver cpu | workers cpu | overhead cpu | wall | step p50 "
        "| same | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        cells = " | ".join(f"{r[k]:.3f}" for k in METRICS)
        load = ", ".join(f"{x:.1f}" for x in r["load"])
        lines.append(
            f"| {r['code']} | {r['problem']} | {r['layout']} | {r['iters']} | {cells} | {r['same']} | {load} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", default="empty,a9a", help=f"comma-separated, of {', '.join(PROBLEMS)}")
    p.add_argument("--layouts", type=_layouts, default=[(2, 1)], help="Dask layouts WxT, comma-separated (2x1)")
    p.add_argument("--iters", type=int, default=2000, help="iterations per run (mushrooms: at most 150)")
    p.add_argument("--rounds", type=int, default=1, help="rounds per code, alternating with --compare's")
    p.add_argument("--compare", type=Path, help="another checkout of the repository to measure too (the baseline)")
    p.add_argument("--datasets-dir", type=Path, help="data folder (default ../shared/datasets)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output folder (default benchmarks/results)")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one round, JSON on stdout
    args = p.parse_args(argv)
    args.problems = [n.strip() for n in args.problems.split(",") if n.strip()]
    if any(n not in PROBLEMS for n in args.problems) or args.iters < 10 or args.rounds < 1:
        p.error(f"problems from {', '.join(PROBLEMS)}; --iters >= 10; --rounds >= 1")
    if args.measure:
        print(json.dumps(measure(args.problems, args.layouts, args.iters, args.datasets_dir)))
        return 0
    from benchmarks.common import machine_info

    codes = {"this": HERE.parent}
    if args.compare is not None:
        codes = {"baseline": args.compare.resolve(), **codes}
    load_start = os.getloadavg()[0]
    rounds: dict = {code: [] for code in codes}
    for k in range(args.rounds):
        for code, root in codes.items():
            print(f"round {k + 1}/{args.rounds}: {code} ({root})", file=sys.stderr, flush=True)
            rounds[code].append(_round(root, args))
    doc = {
        "command": " ".join([sys.executable, *sys.argv]),
        "settings": {**{k: v for k, v in vars(args).items() if k in ("problems", "iters", "rounds")},
                     "layouts": [f"{w}x{t}" for w, t in args.layouts], "codes": {c: str(r) for c, r in codes.items()}},
        "machine": machine_info(),
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "rows": summarize(rounds),
        "rounds": rounds,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "superstep_overhead.json"
    path.write_text(json.dumps(doc, indent=1))
    path.with_suffix(".md").write_text(render_md(doc))
    print(render_md(doc))
    return 0 if all(r["same"] for r in doc["rows"]) else 3


if __name__ == "__main__":
    sys.exit(main())

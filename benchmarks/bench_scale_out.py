"""Scale-out (issue 39): the default fit from a data store, local against ``LocalCluster``s of 1, 2, ... k workers.

``python -m benchmarks.bench_scale_out [--preset e7|16core|smoke] [--n N,N] [--layouts local,1x1,2x1]
[--local-threads T] [--memory-limit 4GB] [--store-dir DIR] [--out FILE] [--timeout S] [--kill-in newton|columns]``
``python -m benchmarks.bench_scale_out --local-shards [--n 60000]``: the local engine's linear stage on 1 and 2
shards, side by side (what ``n_shards="auto"`` takes locally).

E7's synthetic rows (``benchmarks/bench_scale_n.py``: 20 features, checkerboard plus radial term, 5 % label noise,
Bayes error 5 %), written once per size to a Zarr data store in ``--store-dir`` (chunk by chunk through a memory map:
10^7 rows never sit in memory) and kept for later runs; 50,000 test rows of their own stream.  Every layout fits
``MWUMKLClassifier()`` with its defaults (``n_shards="auto"``) from the store, each in a fresh Python process (this
script with ``--one``), so peak memory is that layout's alone:

``local``  the local engine in the child, ``n_jobs=--local-threads``;
``KxT``    a process ``LocalCluster`` of K workers with T threads each (``memory_limit`` each), ``engine="dask"``:
           the linear stage's shards (one per worker) read their own rows from the store.

Recorded per layout (one JSON line each): fit wall seconds; CPU seconds of the client process and of the workers
(their process time before and after, by ``client.run``); peak RSS (``VmHWM``) of the client and of each worker;
test error; the client's peak after the fit alone (``client_fit_peak_rss``; ``client_peak_rss`` includes the
test rows' prediction); ``n_components_``, ``linear_method_``, ``shard_layout_``; the longest stretch without a
progress event as a share of the fit (the fit's callback; "progress all the way") and the phases of the events around
it; whether the predictions equal the first layout's (the local fit's); the load average before and after.  Presets:

``e7``      the issue's 2-core measurement: 10^6 and 10^7 rows; local (2 threads), 1x1 and 2x1 workers, 4GB each;
``16core``  for a 16-core machine, at most about 8 minutes: 10^6 rows local (16 threads), 1x2, 2x2, 4x2, 8x2
            workers (the scaling from 1 to 8 workers), then 10^7 rows on 8x2; 6GB per worker (each shard's columns
            in memory at both sizes), 240 s per layout at most (``--timeout``);
``smoke``   4000 rows, local and 1x1 (the test suite runs it).

``--kill-in newton|columns``: a worker lost in the middle of the linear stage (issue 39's recovery at scale).  In
every Dask layout the fit's progress callback SIGKILLs the process of the worker holding the most linear-stage shards
(its ``ShardServer`` actors) when the phase named is first reached: ``newton`` after its first Newton step (``done``
>= 1), ``columns`` with about half of the kernel columns' rows done (``done`` >= ``total`` / 2, before the end; a
remote shard's rows come with its heartbeats, every 2 s, so a short columns phase may pass without a kill).  The
nanny restarts the worker and the pool rebuilds the shard.  The record adds ``kill_in``, ``killed`` (the phase, its
``done`` of ``total``, seconds into the fit, the worker; None when the moment never came) and ``workers_restarted``
counts the restarted worker; ``workers_cpu_s`` then lacks the killed process's CPU.  The layout keeps its name
(``2x1``); the predictions are still compared with the first layout's (the local fit's, run first).
``--params JSON``: estimator parameters instead of the defaults (the test suite's small linear stage).

The load average is recorded: on a shared machine the times are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

PRESETS = {
    "e7": {"sizes": [10**6, 10**7], "layouts": ["local", "1x1", "2x1"], "local_threads": 2, "memory_limit": "4GB"},
    "16core": {
        "runs": [(10**6, ["local", "1x2", "2x2", "4x2", "8x2"]), (10**7, ["8x2"])],
        "local_threads": 16,
        "memory_limit": "6GB",
        "timeout": 240,  # seconds per layout: a stuck one must not take the device machine's 10-minute call
    },
    "smoke": {
        "sizes": [4000],
        "layouts": ["local", "1x1"],
        "local_threads": 1,
        "memory_limit": "2GB",
        "test_rows": 2000,
    },  # fmt: skip
}
TEST_ROWS = 50_000
#: The linear-stage phases ``--kill-in`` can lose a worker in.
KILL_PHASES = ("newton", "columns")
CHUNK_ROWS = 65_536


def _vm_hwm() -> int:
    """This process's peak resident bytes (``VmHWM``; not ``ru_maxrss``, which keeps an exec'd parent's)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu() -> float:
    return time.process_time()


def store_for(n: int, store_dir: Path) -> Path:
    """E7's first ``n`` rows as a data store in ``store_dir`` (written once, never all in memory)."""
    from benchmarks.bench_scale_n import SEED, SYNTH_CHUNK, SYNTH_FEATURES, synthetic_chunk
    from mwumkl_dist.stores import write_data_store

    path = store_dir / f"e7_{n}.zarr"
    if path.exists():
        return path
    store_dir.mkdir(parents=True, exist_ok=True)
    mm = store_dir / f"e7_{n}.X.tmp"
    X = np.lib.format.open_memmap(mm, mode="w+", dtype=np.float64, shape=(n, SYNTH_FEATURES))
    y = np.empty(n)
    for i in range(-(-n // SYNTH_CHUNK)):
        lo = i * SYNTH_CHUNK
        Xi, yi = synthetic_chunk(SEED, 0, i, min(SYNTH_CHUNK, n - lo))
        X[lo : lo + len(yi)], y[lo : lo + len(yi)] = Xi, yi
    X.flush()
    write_data_store(path, X, y, chunk_rows=CHUNK_ROWS)
    del X
    mm.unlink()
    return path


def _due(info, phase: str) -> bool:
    """Whether progress event ``info`` is ``--kill-in phase``'s moment (see the module's docstring)."""
    if info.phase != phase:
        return False
    if phase == "newton":
        return info.done >= 1
    return bool(info.total) and info.total <= 2 * info.done < 2 * info.total


class _Killer:
    """The progress callback of a fit that loses a linear-stage worker at ``phase`` (None: never).

    SIGKILLs the process of the worker holding the most ``ShardServer`` actors (pids taken before the fit, as
    ``client.run(os.getpid)``: a restarted worker's pid is not needed) the first time :func:`_due`; ``killed`` says
    when and where, ``events`` times every progress event (the longest silence)."""

    def __init__(self, client, phase: str | None):
        self.client, self.phase = client, phase
        self.pids = client.run(os.getpid) if client is not None and phase else {}
        self.events: list = []
        self.killed: dict | None = None
        self.t0 = time.perf_counter()

    def __call__(self, info) -> None:
        self.events.append((time.perf_counter(), info.phase))
        if self.killed is not None or not self.pids or not _due(info, self.phase):
            return
        actors = {w: sum("ShardServer" in str(k) for k in keys) for w, keys in self.client.has_what().items()}
        victim = max(actors, key=actors.get, default=None)
        if victim is None or not actors[victim] or victim not in self.pids:
            return  # no shard placed yet: the next event looks again
        os.kill(self.pids[victim], signal.SIGKILL)
        self.killed = {"phase": info.phase, "done": info.done, "total": info.total, "worker": victim,
                       "at_s": time.perf_counter() - self.t0, "shards_on_worker": actors[victim]}  # fmt: skip


def run_one(store: str, layout: str, local_threads: int, memory_limit: str, test_rows: int, predictions: str,
            kill_in: str | None = None, params: dict | None = None) -> dict:  # fmt: skip
    """One fit of the defaults from ``store`` on ``layout`` (in this process): the JSON record.  ``kill_in``: the
    linear-stage phase a Dask layout loses a worker in (the module's ``--kill-in``); ``params``: estimator
    parameters instead of the defaults (the test suite's: a small linear stage)."""
    from benchmarks.bench_scale_n import synthetic_rows
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.stores import open_store

    Xt, yt = synthetic_rows(test_rows, part=7)
    data = open_store(store)
    out = {"n": data.n_samples, "layout": layout, "load_before": list(os.getloadavg())}
    params = dict(params or {})
    if params:
        out["params"] = params
    if layout == "local":
        killer = _Killer(None, None)
        est = MWUMKLClassifier(n_jobs=local_threads, callback=killer, callback_every=1, **params)
        client = cluster = None
    else:
        from distributed import Client, LocalCluster

        workers, threads = (int(x) for x in layout.split("x"))
        cluster = LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True,
                               memory_limit=memory_limit, dashboard_address=":0")  # fmt: skip
        client = Client(cluster)
        client.wait_for_workers(workers, timeout=300)
        killer = _Killer(client, kill_in)
        est = MWUMKLClassifier(engine="dask", client=client, callback=killer, callback_every=1, **params)
        if kill_in:
            out["kill_in"] = kill_in
    try:
        w0 = client.run(_cpu) if client is not None else {}
        c0, t0 = time.process_time(), time.perf_counter()
        killer.t0 = t0
        est.fit(data)
        t1 = time.perf_counter()
        out.update(wall_s=t1 - t0, client_cpu_s=time.process_time() - c0, client_fit_peak_rss=_vm_hwm())
        if client is not None:
            if kill_in:
                out["killed"] = killer.killed
                client.wait_for_workers(workers, timeout=120)  # the nanny's restart: its CPU and peak counted
            w1 = client.run(_cpu)
            # a worker restarted (its nanny, past its memory limit) is a new address: its CPU from its start
            out["workers_cpu_s"] = sum(w1[k] - w0.get(k, 0.0) for k in w1)
            out["workers_restarted"] = len(set(w0) - set(w1))
            out["workers_peak_rss"] = sorted(client.run(_vm_hwm).values())
    finally:
        if client is not None:
            client.close()
            cluster.close()
    marks = [(t0, "start"), *killer.events, (t1, "end")]
    gaps = np.diff([t for t, _ in marks])
    worst = int(np.argmax(gaps))
    out["longest_silence_share"] = float(gaps[worst] / (t1 - t0)) if t1 > t0 else 0.0
    out["longest_silence_between"] = [marks[worst][1], marks[worst + 1][1]]  # the phases of the events around it
    predicted = est.predict(Xt)
    np.save(predictions, predicted)
    out.update(
        client_peak_rss=_vm_hwm(),
        error=float(np.mean(predicted != yt)),
        solver=est.solver_,
        rank=np.asarray(getattr(est, "n_components_", 0)).tolist(),
        linear_method=getattr(est, "linear_method_", None),
        shard_layout=getattr(est, "shard_layout_", None),
        C=float(est.C_),
        load_after=list(os.getloadavg()),
    )
    return out


def run(runs, local_threads: int, memory_limit: str, store_dir: Path, test_rows: int = TEST_ROWS, out=None,
        timeout: float | None = None, kill_in: str | None = None, params: str | None = None) -> list[dict]:  # fmt: skip
    """Every ``(n, layouts)`` of ``runs``, each layout in a child process; the records (also appended to ``out``).
    ``kill_in``: the linear-stage phase every Dask layout loses a worker in (``--kill-in``); ``params``: estimator
    parameters as JSON (``--params``; default: the defaults)."""
    records = []
    for n, layouts in runs:
        store = store_for(n, store_dir)
        first = None
        for layout in layouts:
            kill = kill_in if kill_in and layout != "local" else None
            pred = store_dir / f"pred_{n}_{layout}{f'_kill_{kill}' if kill else ''}.npy"
            extra = [*(["--kill-in", kill] if kill else []), *(["--params", params] if params else [])]
            cmd = [sys.executable, "-m", "benchmarks.bench_scale_out", "--one", str(store), "--layout", layout,
                   "--local-threads", str(local_threads), "--memory-limit", memory_limit, "--test-rows",
                   str(test_rows), "--predictions", str(pred), *extra]  # fmt: skip
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=HERE.parent)
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
                record = json.loads(lines[-1]) if done.returncode == 0 and lines else {
                    "n": n, "layout": layout, "failed": done.stderr[-2000:]}  # fmt: skip
            except subprocess.TimeoutExpired:
                record = {"n": n, "layout": layout, "timeout_s": timeout}
            if kill:
                record.setdefault("kill_in", kill)
            if "error" in record:
                if first is None:
                    first = np.load(pred)
                else:
                    record["same_predictions_as_first"] = bool(np.array_equal(np.load(pred), first))
            records.append(record)
            print(json.dumps(record), flush=True)
            if out is not None:
                with open(out, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
    return records


def local_shards(n: int, store_dir: Path) -> dict:
    """The local engine's linear stage on 1 and 2 shards (``n_jobs`` all cores, ``C=10``), interleaved three times
    after a warm-up: fit seconds (the weight stage is the same work in both)."""
    from benchmarks.bench_scale_n import synthetic_rows
    from mwumkl_dist import MWUMKLClassifier

    X, y = synthetic_rows(n, part=0)
    MWUMKLClassifier(C=10.0).fit(X[:5000], y[:5000])  # a warm-up: numba's cache, the imports
    out: dict = {"n": n, "load_before": list(os.getloadavg()), "wall_s": {1: [], 2: []}}
    for _ in range(3):
        for k in (1, 2):
            t0 = time.perf_counter()
            est = MWUMKLClassifier(n_shards=k, C=10.0).fit(X, y)
            out["wall_s"][k].append(time.perf_counter() - t0)
            out.setdefault("intercepts", {})[k] = float(np.atleast_1d(est.intercept_)[0])
    out["load_after"] = list(os.getloadavg())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="e7")
    p.add_argument("--n", default=None, help="training rows, comma-separated (default: the preset's)")
    p.add_argument("--layouts", default=None, help="e.g. local,1x1,2x1 (default: the preset's)")
    p.add_argument("--local-threads", type=int, default=None)
    p.add_argument("--memory-limit", default=None, help="per worker")
    p.add_argument("--store-dir", default=os.path.join(tempfile.gettempdir(), "mwumkl-scale-out"),
                   help="where the stores are written and kept (default: the temp directory)")  # fmt: skip
    p.add_argument("--test-rows", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None, help="seconds per layout (its child is killed after)")
    p.add_argument("--out", default=None, help="append the JSON lines here")
    p.add_argument("--smoke", action="store_true", help="the smoke preset")
    p.add_argument("--local-shards", action="store_true", help="1 against 2 linear-stage shards, local engine")
    p.add_argument("--kill-in", choices=KILL_PHASES, default=None,
                   help="Dask layouts: SIGKILL a linear-stage shard's worker in this phase of the fit")  # fmt: skip
    p.add_argument("--params", default=None, help="estimator parameters as JSON instead of the defaults (for tests)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--layout", default=None, help=argparse.SUPPRESS)
    p.add_argument("--predictions", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    preset = PRESETS["smoke" if args.smoke else args.preset]
    threads = args.local_threads or preset["local_threads"]
    memory_limit = args.memory_limit or preset["memory_limit"]
    test_rows = args.test_rows or preset.get("test_rows", TEST_ROWS)
    if args.one:
        params = json.loads(args.params) if args.params else None
        print(json.dumps(run_one(args.one, args.layout, threads, memory_limit, test_rows, args.predictions,
                                 args.kill_in, params)))  # fmt: skip
        return 0
    if args.local_shards:
        result = local_shards(int(args.n or 60_000), Path(args.store_dir))
        print(json.dumps(result))
        if args.out:
            with open(args.out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(result) + "\n")
        return 0
    if args.n or args.layouts or "runs" not in preset:
        sizes = [int(float(s)) for s in args.n.split(",")] if args.n else preset.get("sizes", [10**6])
        layouts = args.layouts.split(",") if args.layouts else preset.get("layouts", ["local"])
        runs = [(n, layouts) for n in sizes]
    else:
        runs = preset["runs"]
    timeout = args.timeout or preset.get("timeout")
    records = run(runs, threads, memory_limit, Path(args.store_dir), test_rows, args.out, timeout, args.kill_in,
                  args.params)  # fmt: skip
    return 0 if all("error" in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

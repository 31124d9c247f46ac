"""The default fit on a local Dask cluster against the local fit (issue 29, item 5), and from a data store at scale.

``python -m benchmarks.bench_dask_fit [--n 100000] [--store DIR] [--memory-limit 4GB] [--out FILE]``

E7's synthetic rows (``benchmarks/bench_scale_n.py``), 2 worker processes of one thread each:

* without ``--store``: ``MWUMKLClassifier(n_jobs=2)`` in this process, then ``engine="dask"`` on the cluster, from
  the same rows in memory: the per-fit CPU of each (the driver's and the workers' process time), wall time, test
  error and whether the two models predict the same labels (they must);
* with ``--store DIR``: the rows written once to a data store in ``DIR`` (kept for later runs) and the Dask fit
  from the store (its shards read their own rows): time, CPU, the workers' and driver's peak RSS, the store's
  size on disk, the workers' spill directory, error, rank, residual.

One JSON line on stdout (and in ``--out``).  The load average is recorded: on a shared machine the times are upper
bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable


def _cpu() -> float:
    return time.process_time()


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _disk(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def run(n: int, store_dir=None, memory_limit: str = "4GB", test_rows: int = 50_000, workers: int = 2) -> dict:
    from distributed import Client, LocalCluster

    from benchmarks.bench_scale_n import synthetic_rows
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.stores import open_store, write_data_store

    Xt, yt = synthetic_rows(test_rows, part=7)
    out: dict = {"n": n, "workers": workers, "memory_limit": memory_limit}
    data = None
    if store_dir is None:
        X, y = synthetic_rows(n, part=0)
        c0, t0 = time.process_time(), time.perf_counter()
        local = MWUMKLClassifier(n_jobs=workers).fit(X, y)
        out["local"] = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0,
                        "error": float(np.mean(local.predict(Xt) != yt))}  # fmt: skip
        data = (X, y)
    else:
        path = Path(store_dir) / f"e7_{n}.zarr"
        t0 = time.perf_counter()
        if not path.exists():  # written once: later runs fit from it
            X, y = synthetic_rows(n, part=0)
            write_data_store(path, X, y, chunk_rows=65536)
            del X, y
        out.update(store=str(path), store_write_s=time.perf_counter() - t0, store_bytes=_disk(path))
    spill = Path(store_dir or os.getcwd()) / "dask-worker-space"
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=memory_limit,
            dashboard_address=":0",
            local_directory=str(spill),
        ) as cluster,  # fmt: skip
        Client(cluster) as client,
    ):
        fit_on = data if data is not None else (open_store(out["store"]),)
        w0, c0, t0 = client.run(_cpu), time.process_time(), time.perf_counter()
        remote = MWUMKLClassifier(engine="dask", client=client).fit(*fit_on)
        wall, driver = time.perf_counter() - t0, time.process_time() - c0
        w1 = client.run(_cpu)
        predicted = remote.predict(Xt)
        out["dask"] = {
            "wall_s": wall,
            "driver_cpu_s": driver,
            "workers_cpu_s": sum(w1[k] - w0[k] for k in w0),
            "error": float(np.mean(predicted != yt)),
            "workers_peak_rss": sorted(client.run(_peak_rss).values()),
            "driver_peak_rss": _peak_rss(),
            "spill_dir_bytes": _disk(spill) if spill.is_dir() else 0,
            "C": float(remote.C_),
            "rank": np.asarray(remote.n_components_).tolist(),
            "residual": np.asarray(remote.nystroem_residual_).tolist(),
        }
        out["dask"]["cpu_s"] = out["dask"]["driver_cpu_s"] + out["dask"]["workers_cpu_s"]
        if data is not None:
            out["same_predictions"] = bool(np.array_equal(predicted, local.predict(Xt)))
            out["cpu_ratio"] = out["dask"]["cpu_s"] / out["local"]["cpu_s"]
    out["load"] = list(os.getloadavg())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000, help="training rows (default 100000)")
    p.add_argument("--store", default=None, metavar="DIR", help="fit from a data store written in DIR")
    p.add_argument("--memory-limit", default="4GB", help="per worker (default 4GB)")
    p.add_argument("--test-rows", type=int, default=50_000, help="test rows (default 50000)")
    p.add_argument("--out", default=None, help="also write the JSON line here")
    args = p.parse_args(argv)
    result = run(args.n, args.store, args.memory_limit, args.test_rows)
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

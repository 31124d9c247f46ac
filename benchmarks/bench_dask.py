"""Dask engine: per-superstep overhead and a9a speed-up over the local engine (issue 3).

Run on demand (not a test)::

    python benchmarks/bench_dask.py            # both parts
    python benchmarks/bench_dask.py --quick    # fewer iterations, a9a subsample

Part 1 measures what a superstep costs beyond the shards' own compute, on a
trivial workload (a few rows, one linear kernel) with 2 worker processes (or
``--workers 1,2,4,8``: one shard per worker), and, in the same run, a plain Dask
actor round trip and a pinned submit+gather.
Part 2 fits a9a with the 12-kernel paper family at eps 0.1 on the local engine
(1 thread) and on 2 worker processes (1 thread each), checks that both give
the same model, and reports the speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATASETS = os.path.join(HERE, "..", "..", "shared", "datasets")
sys.path.insert(0, os.path.dirname(HERE))  # run as a script: make the benchmarks package importable

from benchmarks.common import run_info  # noqa: E402


class _Echo:
    def ping(self):
        return 1


def _noop():
    return 1


def overhead(n_iter: int, n_workers: int = 2) -> dict:
    from distributed import Client, LocalCluster

    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.engines.dask import DaskEngine
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.solvers import mwu

    rng = np.random.default_rng(0)
    X = rng.random((8, 2))
    y = np.array([1.0, -1.0] * 4)
    problem = FeatureProblem(X, y, KernelSet("linear", 2))

    def per_iter(engine):
        tr = engine.traces()
        engine.configure(1.0 / tr, 0.01)
        start = time.perf_counter()
        mwu.solve(engine, inv_trace=1.0 / tr, ridge=0.01, iterations=mwu.Iterations(0.5, 0.5, n_iter))
        return (time.perf_counter() - start) / n_iter * 1e3

    local = LocalEngine(problem, 2)
    per_iter(local)
    out = {"local_engine_ms": min(per_iter(local) for _ in range(3))}
    out["workers"] = n_workers
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            workers = sorted(client.nthreads())
            with DaskEngine(problem, client, n_shards=n_workers) as engine:
                per_iter(engine)  # warm-up: numba caches, connections
                out["dask_superstep_ms"] = min(per_iter(engine) for _ in range(3))
            actors = [client.submit(_Echo, actor=True, workers=[w]).result() for w in workers]
            reps = 200
            start = time.perf_counter()
            for _ in range(reps):
                for f in [a.ping() for a in actors]:
                    f.result()
            out["actor_round_trip_ms"] = (time.perf_counter() - start) / reps * 1e3
            start = time.perf_counter()
            for _ in range(reps):
                client.gather([client.submit(_noop, workers=[w], pure=False) for w in workers])
            out["submit_gather_ms"] = (time.perf_counter() - start) / reps * 1e3
    # What the superstep adds beyond the driver's own per-iteration work (same in both engines).
    out["overhead_ms"] = out["dask_superstep_ms"] - out["local_engine_ms"]
    return out


def a9a_speedup(n_iter: int | None, subsample: int | None, kernels: str = "paper") -> dict:
    from distributed import Client, LocalCluster
    from sklearn.datasets import load_svmlight_file

    from mwumkl_dist import MWUMKLClassifier

    X, y = load_svmlight_file(os.path.join(DATASETS, "a9a.svm.gz"), n_features=123)
    X = X.tocsr()
    if subsample:
        idx = np.random.default_rng(0).choice(X.shape[0], subsample, replace=False)
        X, y = X[idx], y[idx]
    params = dict(kernels=kernels, epsilon=0.1, C=100.0, polish=False, max_iter=n_iter)
    out = {"n": X.shape[0], "kernels": kernels}
    try:
        import numba

        numba.set_num_threads(1)
    except (ImportError, ValueError):
        pass
    local = MWUMKLClassifier(**params)
    start = time.perf_counter()
    local.fit(X, y)
    out["local_1thread_s"] = time.perf_counter() - start
    out["n_iter"] = int(local.n_iter_)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            warm = MWUMKLClassifier(**{**params, "max_iter": 5}, engine="dask", client=client, n_shards=2)
            warm.fit(X[:2000], y[:2000])  # compile / load numba caches on the workers
            dist = MWUMKLClassifier(**params, engine="dask", client=client, n_shards=2)
            start = time.perf_counter()
            dist.fit(X, y)
            out["dask_2workers_s"] = time.perf_counter() - start
    out["speedup"] = out["local_1thread_s"] / out["dask_2workers_s"]
    out["same_model"] = bool(
        np.array_equal(local.dual_coef_, dist.dual_coef_) and np.array_equal(local.intercept_, dist.intercept_)
    )
    out["local_ms_per_iter"] = out["local_1thread_s"] / out["n_iter"] * 1e3
    out["dask_ms_per_iter"] = out["dask_2workers_s"] / out["n_iter"] * 1e3
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and an a9a subsample")
    parser.add_argument("--part", choices=["overhead", "a9a", "all"], default="all")
    parser.add_argument("--out", help="write the results as JSON to this file")
    parser.add_argument("--kernels", default="paper", help="kernel spec of the a9a part (default: paper, 12 kernels)")
    parser.add_argument("--max-iter", type=int, default=None, help="a9a part: iterations instead of T")
    parser.add_argument(
        "--workers", default="2", help="overhead part: comma-separated worker counts (one shard each), e.g. 1,2,4,8"
    )
    parser.add_argument("--smoke", action="store_true",
                        help="30 supersteps on 1 worker, a generated 600-row a9a stand-in, 20 iterations: checks the "
                             "script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        import tempfile

        from benchmarks.common import smoke_datasets

        global DATASETS
        DATASETS = str(smoke_datasets(tempfile.mkdtemp(prefix="bench-smoke-"), {"a9a.svm.gz": ("a9a", 600)}))
        args.workers, args.kernels, args.max_iter = "1", "linear, gaussian:1", 20
    results = {"machine": run_info()}
    if args.part in ("overhead", "all"):
        results["overhead"] = []
        for n_workers in [int(w) for w in args.workers.split(",")]:
            o = overhead(30 if args.smoke else 300 if args.quick else 3000, n_workers)
            results["overhead"].append(o)
            print(
                f"superstep, {n_workers} worker processes, trivial shards: {o['dask_superstep_ms']:.3f} ms "
                f"(driver work alone, local engine: {o['local_engine_ms']:.3f} ms; "
                f"overhead {o['overhead_ms']:.3f} ms)\n"
                f"  for comparison: actor round trip to {n_workers} workers {o['actor_round_trip_ms']:.2f} ms, "
                f"pinned submit+gather {o['submit_gather_ms']:.2f} ms",
                flush=True,
            )
    if args.part in ("a9a", "all"):
        if not os.path.isdir(DATASETS):
            print(f"a9a part skipped: {DATASETS} not found")
        else:
            n_iter = 300 if args.quick and not args.smoke else args.max_iter
            r = a9a_speedup(n_iter, 8000 if args.quick and not args.smoke else None, args.kernels)
            results["a9a"] = r
            print(
                f"a9a n={r['n']} kernels {r['kernels']} eps=0.1, {r['n_iter']} iterations: "
                f"local 1 thread {r['local_1thread_s']:.2f} s "
                f"({r['local_ms_per_iter']:.2f} ms/it), 2 Dask workers {r['dask_2workers_s']:.2f} s "
                f"({r['dask_ms_per_iter']:.2f} ms/it): speed-up {r['speedup']:.2f}x, same model: {r['same_model']}"
            )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
    return results


if __name__ == "__main__":
    main()

"""Out of core: fit from a kernel store 4x larger than each worker's memory limit (issue 4).

Builds a precomputed kernel store from the first ``n`` points of a9a (default
12000 points, 4 kernels: 4 * 12000^2 * 8 bytes = 4.3 GiB), computed block by
block (never the whole store in memory), then fits from it on a
``LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB")``:
each of the 2 row shards reads the two kernel columns a superstep needs for
its rows through its column cache.  Reports the store size, write time, fit
time, cache hit rate and the peak resident memory (RSS, sampled every 0.1 s)
of the driver and of each worker; then loads the kernels into memory and
fits with the in-memory precomputed path to check that the model is the same.

Run on demand (not a test)::

    python benchmarks/bench_out_of_core.py                 # 4.3 GiB store, removed afterwards
    python benchmarks/bench_out_of_core.py --cold          # evict the store from the page cache first
    python benchmarks/bench_out_of_core.py --n 3000 --keep # small, keep the store

Needs about 2x the store size of free memory for the in-memory reference fit
(``--no-reference`` skips it) and the store size of free disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_million_kernels import MemorySampler, run_info  # noqa: E402

DATASETS = os.path.join(HERE, "..", "..", "shared", "datasets")
KERNELS = "linear,poly:2,gaussian:2,gaussian:4"


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def evict_from_page_cache(path: str) -> int:
    """Write the store's files to disk and drop them from the page cache (reads then hit the disk)."""
    count = 0
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                count += 1
            finally:
                os.close(fd)
    return count


def run(args) -> dict:
    from distributed import Client, LocalCluster
    from sklearn.datasets import load_svmlight_file

    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.solvers import mwu
    from mwumkl_dist.stores import KernelStore, write_kernel_store

    path = os.path.join(DATASETS, "a9a.svm.gz")
    if not os.path.isfile(path):
        raise SystemExit(f"{path} not found: this benchmark needs the shared a9a data")
    X, y = load_svmlight_file(path, n_features=123)
    X, y = X.tocsr()[: args.n], y[: args.n]
    m = len(KERNELS.split(","))
    store_path = os.path.abspath(args.store)
    out = {
        "machine": run_info(),
        "data": f"a9a, first {args.n} training points, 123 features",
        "kernels": KERNELS,
        "epsilon": args.epsilon,
        "n_iter": mwu.iteration_count(args.epsilon, 0.5, args.n),
        "chunk_rows": args.chunk_rows,
        "worker_memory_limit": args.memory_limit,
    }
    free = shutil.disk_usage(os.path.dirname(store_path)).free
    need = m * args.n**2 * 8
    if free < need * 1.1:
        raise SystemExit(f"not enough disk for the store: {need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free")
    try:
        start = time.perf_counter()
        store = write_kernel_store(
            store_path, y, X=X, kernels=KERNELS, chunk_rows=args.chunk_rows, overwrite=True,
            progress=lambda done, total: print(f"\r  writing: {done}/{total} columns", end="", file=sys.stderr),
        )  # fmt: skip
        print(file=sys.stderr)
        out["write_s"] = time.perf_counter() - start
        out["store_bytes_on_disk"] = du(store_path)
        out["store_GiB"] = out["store_bytes_on_disk"] / 2**30
        if args.cold:
            out["files_evicted_from_page_cache"] = evict_from_page_cache(store_path)
        start = time.perf_counter()
        store = KernelStore(store_path, cache_bytes=args.cache_mib * 2**20)  # validates every chunk file's size
        out["open_and_verify_s"] = time.perf_counter() - start
        with (
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                memory_limit=args.memory_limit,
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
        ):
            pids = {f"worker{i}": pid for i, pid in enumerate(client.run(os.getpid).values())}
            pids["driver"] = os.getpid()
            clf = MWUMKLClassifier(
                kernels="precomputed",
                epsilon=args.epsilon,
                C=100.0,
                polish=False,
                engine="dask",
                client=client,
                n_shards=2,
            )
            with MemorySampler(pids) as mem:
                start = time.perf_counter()
                clf.fit(store)
                out["fit_s"] = time.perf_counter() - start
            out["memory"] = mem.report()
            out["workers_alive_after_fit"] = len(client.scheduler_info()["workers"])
        out["s_per_iteration"] = out["fit_s"] / int(clf.n_iter_)
        out["cache_info"] = clf.cache_info_
        out["n_support"] = len(clf.support_)
        out["store_over_worker_limit"] = out["store_bytes_on_disk"] / _parse_bytes(args.memory_limit)
        if not args.no_reference:
            import zarr

            start = time.perf_counter()
            cols = zarr.open_group(store_path, mode="r")["K"][:]  # K[i, j, r] = K_i(x_r, x_j)
            K = cols.transpose(0, 2, 1)  # K[i, r, j]: the (m, n, n) kernels, as a view
            ref = MWUMKLClassifier(kernels="precomputed", epsilon=args.epsilon, C=100.0, polish=False).fit(K, y)
            out["in_memory_fit_s"] = time.perf_counter() - start
            out["same_model_as_in_memory"] = bool(
                np.array_equal(ref.dual_coef_, clf.dual_coef_)
                and np.array_equal(ref.support_, clf.support_)
                and np.array_equal(ref.kernel_weights_, clf.kernel_weights_)
                and np.array_equal(ref.intercept_, clf.intercept_)
            )
            del cols, K
    finally:
        if not args.keep:
            shutil.rmtree(store_path, ignore_errors=True)
    return out


def _parse_bytes(text: str) -> int:
    from dask.utils import parse_bytes

    return parse_bytes(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=12000, help="training points (default 12000: a 4.3 GiB store)")
    parser.add_argument("--chunk-rows", type=int, default=6000, help="rows per chunk (default 6000: one per shard)")
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--memory-limit", default="1GiB", help="memory limit of each worker (default 1GiB)")
    parser.add_argument("--cache-mib", type=int, default=128, help="column cache per shard, MiB (default 128)")
    parser.add_argument(
        "--store", default=os.path.join(tempfile.gettempdir(), "mwumkl_ooc_kernels.zarr"), help="where to write it"
    )
    parser.add_argument("--keep", action="store_true", help="keep the store afterwards")
    parser.add_argument("--cold", action="store_true", help="evict the store from the page cache before the fit")
    parser.add_argument("--no-reference", action="store_true", help="skip the in-memory reference fit")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--smoke", action="store_true",
                        help="generated a9a stand-in, 200 points, chunks of 100: checks the script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        global DATASETS
        sys.path.insert(0, os.path.dirname(HERE))
        from benchmarks.common import smoke_datasets

        folder = tempfile.mkdtemp(prefix="bench-smoke-")
        DATASETS = str(smoke_datasets(folder, {"a9a.svm.gz": ("a9a", 200)}))
        args.n, args.chunk_rows, args.epsilon, args.store = 200, 100, 0.8, os.path.join(folder, "kernels.zarr")
    out = run(args)
    mem, cache = out["memory"], out["cache_info"]
    workers = ", ".join(f"{mem[k]:.0f}" for k in sorted(mem) if k.startswith("worker"))
    print(
        f"kernel store {out['store_GiB']:.2f} GiB ({out['store_over_worker_limit']:.1f}x the {args.memory_limit} "
        f"worker limit), written in {out['write_s']:.0f} s, opened and verified in {out['open_and_verify_s']:.2f} s\n"
        f"fit on 2 workers x 1 thread, eps {args.epsilon} (T={out['n_iter']}): {out['fit_s']:.1f} s "
        f"({out['s_per_iteration'] * 1e3:.2f} ms/iteration), cache hit rate {cache['hit_rate']:.3f} "
        f"({cache['misses']} column reads, {cache['bytes_read'] / 2**20:.0f} MiB)\n"
        f"  peak RSS MiB: driver {mem['driver_peak_rss_mib']:.0f}, workers {workers}"
        + (
            f"\nin-memory precomputed fit {out['in_memory_fit_s']:.1f} s (incl. loading); "
            f"same model: {out['same_model_as_in_memory']}"
            if "in_memory_fit_s" in out
            else ""
        )
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()

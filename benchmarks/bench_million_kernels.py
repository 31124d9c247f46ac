"""A million kernels: Sonar with a seeded random Gaussian bank, kernel-sharded on 2 Dask workers (issue 4).

The paper (table "MWUMKL with on-the-fly kernel computations") fits Sonar
(208 points) with 1,000,000 kernels in 3.65 hours.  This runs the same fit:
80% of Sonar for training (166 points, stratified split), features min-max
scaled on the training part, eps 0.2, rho 0.5 (T = 256 iterations; the
paper's algorithm, ``polish=False``), the bank ``random:1000000:size=S:seed=K``
on 2 kernel shards, each on its own Dask worker process (1 thread), and
reports the wall time, the peak memory (RSS) of the driver and of each
worker, and the test error.

Run on demand (not a test), when the machine is otherwise quiet::

    python benchmarks/bench_million_kernels.py                         # 1e6 kernels, subsets of 2
    python benchmarks/bench_million_kernels.py --subset-size 5         # (almost) all kernels distinct
    python benchmarks/bench_million_kernels.py --kernels 20000 --check # small: compare with the local engine

The bank runs through the ordinary kernel plan (one feature group per distinct
subset, Gaussian squaring chains within a subset).  With 2-feature subsets of
60 features the bank holds at most 1770 subsets (each kernel's value is still
computed, or squared from its chain source); with ``--subset-size 5`` (5.5
million subsets) nearly every subset is distinct; both runs keep the full
``(166, 10^6)`` ``V``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATASETS = os.path.join(HERE, "..", "..", "shared", "datasets")
sys.path.insert(0, os.path.dirname(HERE))  # run as a script: make the benchmarks package importable

from benchmarks.common import run_info  # noqa: E402


class MemorySampler:
    """Samples the resident set size (RSS) of some processes in a thread; keeps each one's peak."""

    def __init__(self, pids: dict[str, int], interval: float = 0.1):
        import psutil

        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.peak = dict.fromkeys(pids, 0)
        self.peak_total = 0
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            total = 0
            for name, proc in self.procs.items():
                try:
                    rss = proc.memory_info().rss
                except Exception:  # a process that ended
                    continue
                self.peak[name] = max(self.peak[name], rss)
                total += rss
            self.peak_total = max(self.peak_total, total)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def report(self) -> dict:
        out = {f"{k}_peak_rss_mib": v / 2**20 for k, v in self.peak.items()}
        out["total_peak_rss_mib"] = self.peak_total / 2**20
        return out


def load_sonar(seed: int):
    from sklearn.datasets import load_svmlight_file
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import MinMaxScaler

    path = os.path.join(DATASETS, "sonar.svm.gz")
    if not os.path.isfile(path):
        raise SystemExit(f"{path} not found: this benchmark needs the shared Sonar data")
    X, y = load_svmlight_file(path)
    X = X.toarray()
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.2, random_state=seed, stratify=y)
    scaler = MinMaxScaler().fit(X_tr)
    return scaler.transform(X_tr), np.clip(scaler.transform(X_te), 0.0, 1.0), y_tr, y_te


def run(args) -> dict:
    from distributed import Client, LocalCluster

    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.solvers import mwu

    X_tr, X_te, y_tr, y_te = load_sonar(args.seed)
    spec = f"random:{args.kernels}:size={args.subset_size}:seed={args.bank_seed}:widths=paper"
    n_iter = mwu.iteration_count(args.epsilon, 0.5, len(y_tr))
    out = {
        "machine": run_info(),
        "data": {"n_train": len(y_tr), "n_test": len(y_te), "n_features": X_tr.shape[1], "split_seed": args.seed},
        "kernels": spec,
        "epsilon": args.epsilon,
        "rho": 0.5,
        "n_iter": n_iter,
        "layout": f"{args.workers} Dask worker processes x 1 thread, n_shards=1, n_kernel_shards={args.workers}",
    }
    progress = []

    def callback(info):
        progress.append((info.iteration, info.elapsed))
        print(f"  iteration {info.iteration}/{info.n_iter}, {info.elapsed:.1f} s", file=sys.stderr, flush=True)

    with (
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0", memory_limit=0
        ) as cluster,
        Client(cluster) as client,
    ):
        # Load the numba caches on the workers (a tiny fit) so the timing is the fit's.
        warm = MWUMKLClassifier(kernels="random:64:size=2:widths=paper", C=100.0, max_iter=2, polish=False,
                                engine="dask", client=client, n_kernel_shards=args.workers)  # fmt: skip
        warm.fit(X_tr, y_tr)
        pids = {f"worker{i}": pid for i, pid in enumerate(client.run(os.getpid).values())}
        pids["driver"] = os.getpid()
        clf = MWUMKLClassifier(
            kernels=spec, epsilon=args.epsilon, C=100.0, rho=0.5, polish=False, engine="dask", client=client,
            n_shards=1, n_kernel_shards=args.workers, callback=callback, callback_every=32,
        )  # fmt: skip
        with MemorySampler(pids) as mem:
            start = time.perf_counter()
            clf.fit(X_tr, y_tr)
            fit_s = time.perf_counter() - start
            start = time.perf_counter()
            pred = clf.predict(X_te)
            predict_s = time.perf_counter() - start
        out["memory"] = mem.report()
    out["fit_s"] = fit_s
    out["s_per_iteration"] = fit_s / int(clf.n_iter_)
    out["predict_s"] = predict_s
    out["test_error"] = float(np.mean(pred != y_te))
    out["n_support"] = len(clf.support_)
    w = np.sort(clf.kernel_weights_)
    out["kernel_weights"] = {"min": float(w[0]), "max": float(w[-1]), "max_over_uniform": float(w[-1] * len(w))}
    out["paper_hours"] = 3.65
    out["speedup_vs_paper"] = 3.65 * 3600 / fit_s
    if args.check:
        start = time.perf_counter()
        local = MWUMKLClassifier(kernels=spec, epsilon=args.epsilon, C=100.0, rho=0.5, polish=False).fit(X_tr, y_tr)
        out["local_fit_s"] = time.perf_counter() - start
        out["same_model_as_local_engine"] = bool(
            np.array_equal(local.dual_coef_, clf.dual_coef_)
            and np.array_equal(local.kernel_weights_, clf.kernel_weights_)
            and np.array_equal(local.intercept_, clf.intercept_)
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000, help="bank size (default 1000000)")
    parser.add_argument("--subset-size", type=int, default=2, help="features per kernel (default 2)")
    parser.add_argument("--bank-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0, help="train/test split seed")
    parser.add_argument("--epsilon", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=2, help="worker processes = kernel shards (default 2)")
    parser.add_argument("--check", action="store_true", help="also fit with the local engine and compare")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--smoke", action="store_true",
                        help="generated Sonar stand-in, 100 kernels, 1 worker, --check: checks the script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        import tempfile

        from benchmarks.common import smoke_datasets

        global DATASETS
        DATASETS = str(smoke_datasets(tempfile.mkdtemp(prefix="bench-smoke-"), {"sonar.svm.gz": ("sonar", 60)}))
        args.kernels, args.epsilon, args.workers, args.check = 100, 0.8, 1, True
    out = run(args)
    mem = out["memory"]
    workers = ", ".join(f"{mem[k]:.0f}" for k in sorted(mem) if k.startswith("worker"))
    print(
        f"Sonar {out['data']['n_train']} train points, {out['kernels']}, eps {out['epsilon']}, T={out['n_iter']}: "
        f"fit {out['fit_s']:.1f} s ({out['s_per_iteration']:.3f} s/iteration; paper 3.65 h, "
        f"{out['speedup_vs_paper']:.0f}x), predict {out['predict_s']:.2f} s, test error {out['test_error']:.3f}\n"
        f"  peak RSS MiB: driver {mem['driver_peak_rss_mib']:.0f}, workers {workers}, "
        f"total {mem['total_peak_rss_mib']:.0f}"
        + (
            f"\n  local engine {out['local_fit_s']:.1f} s, same model: {out['same_model_as_local_engine']}"
            if "local_fit_s" in out
            else ""
        )  # fmt: skip
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()

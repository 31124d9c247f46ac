"""The default thread count after a process-based ``LocalCluster`` (issue 22, item 1).

Dask's nannies leave ``OMP_NUM_THREADS=1`` in the client process's
``os.environ`` after a ``LocalCluster(processes=True)`` has started, and after it
closed; local fits must not read that as the user's wish.  This script starts and
closes such a cluster, then times a9a with the paper's 12 kernels (MWU solver,
1000 iterations, C = 1, selectivity 100, no polish) with ``n_jobs=1`` and with
the default thread count, best of ``--repeat`` fits each, and prints the
default's speed-up and thread count (``n_threads_``).

Usage::

    python benchmarks/bench_after_cluster.py [--datasets-dir ../shared/datasets] [--repeat 3] [--out FILE.json]

``--quick``: a synthetic stand-in for a9a (2000 rows) and 50 iterations, for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

from benchmarks import datasets as D  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets-dir", default=None, help="where a9a is (default: ../shared/datasets)")
    parser.add_argument("--repeat", type=int, default=3, help="fits per setting; the fastest counts (default 3)")
    parser.add_argument("--quick", action="store_true", help="a synthetic stand-in and 50 iterations")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)

    from distributed import Client, LocalCluster

    from mwumkl_dist import MWUMKLClassifier

    ds = D.load_or_standin("a9a", args.datasets_dir, allow_standin=args.quick, download=False)
    X, y = (ds.X[:2000], ds.y[:2000]) if args.quick else (ds.X, ds.y)
    params = dict(kernels="paper", C=1.0, max_iter=50 if args.quick else 1000, polish=False, selectivity=100.0,
                  random_state=0)  # fmt: skip
    MWUMKLClassifier(**params).fit(X[:500], y[:500])  # numba's kernels loaded before any timing
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster):
            pass
    result = {"omp_num_threads_after_cluster": os.environ.get("OMP_NUM_THREADS"), "source": ds.source}
    for label, n_jobs in (("n_jobs=1", 1), ("default", None)):
        best, clf = np.inf, None
        for _ in range(args.repeat):
            start = time.perf_counter()
            clf = MWUMKLClassifier(n_jobs=n_jobs, **params).fit(X, y)
            best = min(best, time.perf_counter() - start)
        result[label] = {"seconds": best, "threads": int(clf.n_threads_)}
        print(f"{label}: {best:.2f} s on {clf.n_threads_} thread(s)", flush=True)
    result["speedup"] = result["n_jobs=1"]["seconds"] / result["default"]["seconds"]
    print(f"OMP_NUM_THREADS after the cluster: {result['omp_num_threads_after_cluster']}; "
          f"the default's speed-up over n_jobs=1: {result['speedup']:.2f}x")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

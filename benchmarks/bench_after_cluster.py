"""The default thread count after a process-based ``LocalCluster`` (issue 22, item 1).

Dask's nannies leave ``OMP_NUM_THREADS=1`` in the client process's
``os.environ`` after a ``LocalCluster(processes=True)`` has started, and after it
closed; local fits must not read that as the user's wish.  This script starts and
closes such a cluster, then times ``bench_scaling.py``'s a9a problem (the paper's
12 kernels, the MWU solver, C = 1, no polish) at 1000 iterations with ``n_jobs=1``
and with the default thread count (``bench_scaling.timed``: a warm-up fit, then the
best of ``--repeat``), and prints the default's speed-up and thread count
(``n_threads_``).

Usage::

    python benchmarks/bench_after_cluster.py [--datasets-dir ../shared/datasets] [--repeat 3] [--out FILE.json]

``--quick``: ``bench_scaling.py``'s synthetic ``quick-rows`` problem instead, for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

from benchmarks import bench_scaling as B  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets-dir", default=None, help="where a9a is (default: ../shared/datasets)")
    parser.add_argument("--repeat", type=int, default=3, help="fits per setting; the fastest counts (default 3)")
    parser.add_argument("--quick", action="store_true", help="bench_scaling's synthetic quick-rows problem")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)

    from distributed import Client, LocalCluster

    spec = B.QUICK_PROBLEMS["quick-rows"] if args.quick else replace(B.PROBLEMS["a9a"], max_iter=1000)
    X, y, source = B.load_problem(spec, args.datasets_dir, download=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster):
            pass
    omp_after = os.environ.get("OMP_NUM_THREADS")
    result = {"problem": spec.name, "source": source, "omp_num_threads_after_cluster": omp_after}
    for label, n_jobs in (("n_jobs=1", 1), ("default", None)):
        clf, fit_s, _ = B.timed(X, y, spec, args.repeat, n_jobs=n_jobs)
        result[label] = {"seconds": fit_s, "threads": int(clf.n_threads_)}
        print(f"{label}: {fit_s:.2f} s on {clf.n_threads_} thread(s)", flush=True)
    result["speedup"] = result["n_jobs=1"]["seconds"] / result["default"]["seconds"]
    print(f"OMP_NUM_THREADS after the cluster: {result['omp_num_threads_after_cluster']}; "
          f"the default's speed-up over n_jobs=1: {result['speedup']:.2f}x")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sonar with a random Gaussian bank, this tree beside an older checkout, on 1 and more threads (issue 22).

Every fit: 80 % of Sonar (166 rows, stratified split seed 0, min-max scaled on
the training part, as ``bench_million_kernels.py``), the bank
``random:K:size=S:seed=0`` with the paper's widths (1 to 16), ``C=100``,
``epsilon=0.2``, ``rho=0.5`` (T = 256 iterations), ``selectivity="paper"``,
``polish=False``, the local engine.  Each configuration (tree x threads) runs in
a process of its own with ``PYTHONPATH`` set to its tree, after a warm-up fit
of 2 iterations (numba's compile or cache load); the rounds run the
configurations one after the other, so a change of load hits them alike, and
each configuration reports its fastest round (wall-clock time, with that fit's
process CPU time beside it: on a busy machine the 1-thread CPU times still
compare).

Trees written before ``widths=`` existed (a334eb7, the bank code before banks
became kernel plans) read ``random:K:size=S:seed=0`` as the paper's widths:
the same bank, kernel for kernel; the spec each tree read is printed.  A tree
without ``n_jobs`` runs single-threaded (its numba pool held to 1 thread), so it
only has a 1-thread row.  The fits of this tree on every thread count must give
the same model (bit for bit), and the script says so.

Run on demand (not a test), on an otherwise idle machine::

    git -C /work/main worktree add /work/wt/old-a334eb7 a334eb7   # the old bank code, once
    python benchmarks/bench_bank.py --kernels 100000 --threads 1,2 --old /work/wt/old-a334eb7 --repeat 3

Writes ``--out FILE.json`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATASETS = HERE.parent.parent / "shared" / "datasets"

#: The child: one fit in a fresh process (its output: one JSON line).
CHILD = r"""
import inspect, json, sys, time, warnings
import numpy as np
from sklearn.datasets import load_svmlight_file
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import MinMaxScaler

import mwumkl_dist
from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.kernels import parse_kernels

path, n_kernels, size, threads, model_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
X, y = load_svmlight_file(path)
X_tr, X_te, y_tr, y_te = train_test_split(X.toarray(), y, test_size=0.2, random_state=0, stratify=y)
scaler = MinMaxScaler().fit(X_tr)
X_tr, X_te = scaler.transform(X_tr), np.clip(scaler.transform(X_te), 0.0, 1.0)
spec = f"random:{n_kernels}:size={size}:seed=0:widths=paper"
try:
    parse_kernels(spec, X.shape[1])
except ValueError:  # a tree from before widths=: its banks have the paper's widths
    spec = f"random:{n_kernels}:size={size}:seed=0"
params = dict(kernels=spec, C=100.0, epsilon=0.2, rho=0.5, selectivity="paper", polish=False)
if "n_jobs" in inspect.signature(MWUMKLClassifier).parameters:
    params.update(n_jobs=None if threads == "default" else int(threads), solver="mwu")
warnings.simplefilter("ignore")
MWUMKLClassifier(**{**params, "max_iter": 2}).fit(X_tr, y_tr)
start, cpu = time.perf_counter(), time.process_time()
clf = MWUMKLClassifier(**params).fit(X_tr, y_tr)
fit_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
model = ("support_", "dual_coef_", "intercept_", "kernel_weights_")
np.savez(model_file, **{k: np.asarray(getattr(clf, k)) for k in model})
print(json.dumps({"fit_s": fit_s, "cpu_s": cpu_s, "n_iter": int(np.sum(clf.n_iter_)), "spec": spec,
                  "threads_used": getattr(clf, "n_threads_", None), "package": mwumkl_dist.__file__,
                  "test_error": float(np.mean(clf.predict(X_te) != y_te))}))
"""


def _python(code: str, *args, tree: Path, env=None, cwd: str) -> subprocess.CompletedProcess:
    """``python -c code args`` importing ``mwumkl_dist`` from ``tree`` (run in ``cwd``: ``-c`` puts the working
    directory first on ``sys.path``, where a checkout would shadow ``tree``)."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True)


def run_child(tree: Path, n_kernels: int, size: int, threads: str, model_file: str, single: bool, cwd: str) -> dict:
    env = {}
    if single:
        env["NUMBA_NUM_THREADS"] = "1"  # a tree without n_jobs: its parallel loops held to one thread
    data = str(DATASETS / "sonar.svm.gz")
    out = _python(CHILD, data, str(n_kernels), str(size), threads, model_file, tree=tree, env=env, cwd=cwd)
    if out.returncode != 0:
        raise SystemExit(f"the fit with {tree} on {threads} threads failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def has_n_jobs(tree: Path, cwd: str) -> bool:
    """Whether the tree's estimator takes ``n_jobs`` (the bank code before issue 11 did not)."""
    probe = "import inspect, mwumkl_dist; print('n_jobs' in inspect.signature(mwumkl_dist.MWUMKLClassifier).parameters)"
    return _python(probe, tree=tree, cwd=cwd).stdout.strip() == "True"


def _smoke_data() -> Path:
    import tempfile

    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    from benchmarks.common import smoke_datasets

    return smoke_datasets(tempfile.mkdtemp(prefix="bench-smoke-"), {"sonar.svm.gz": ("sonar", 80)})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=100_000, help="bank size (default 100000)")
    parser.add_argument("--subset-size", type=int, default=5, help="features per kernel (default 5)")
    parser.add_argument("--threads", default="1,2", help="thread counts of this tree (n_jobs; 'default' for None)")
    parser.add_argument("--old", type=Path, help="an older checkout to run beside this tree (1 thread)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; each configuration reports its fastest")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--smoke", action="store_true",
                        help="a generated Sonar stand-in, 200 kernels, 1 thread: checks the script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        global DATASETS
        DATASETS = _smoke_data()
        args.kernels, args.threads = 200, "1"
    if not (DATASETS / "sonar.svm.gz").is_file():
        raise SystemExit(f"{DATASETS / 'sonar.svm.gz'} not found: this benchmark needs the shared Sonar data")
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        configs = [("this", HERE.parent, t, False) for t in args.threads.split(",")]
        if args.old is not None:
            with_threads = has_n_jobs(args.old.resolve(), tmp)
            configs += [("old", args.old.resolve(), t, not with_threads)
                        for t in (args.threads.split(",") if with_threads else ["1"])]  # fmt: skip
        for r in range(args.repeat):
            for name, tree, threads, single in configs:
                model_file = os.path.join(tmp, f"{name}-{threads}.npz")
                got = run_child(tree, args.kernels, args.subset_size, threads, model_file, single, tmp)
                print(f"round {r + 1}: {name} tree, {threads} thread(s): {got['fit_s']:.2f} s", file=sys.stderr)
                key = (name, threads)
                if key not in results or got["fit_s"] < results[key]["fit_s"]:
                    results[key] = {**got, "tree": str(tree), "load_average": os.getloadavg()[0]}
        models = {key: dict(np.load(os.path.join(tmp, f"{key[0]}-{key[1]}.npz"))) for key in results}
    mine = [key for key in results if key[0] == "this"]
    same = all(
        all(np.array_equal(models[mine[0]][k], models[key][k]) for k in models[key]) for key in mine[1:]
    )  # fmt: skip
    base = results.get(("old", "1"))
    print(f"\nSonar (166 training rows), bank of {args.kernels} kernels on {args.subset_size}-feature subsets, "
          f"T = {next(iter(results.values()))['n_iter']}, best of {args.repeat}")  # fmt: skip
    print(f"{'tree':6} {'threads':8} {'fit s':>8} {'vs old 1 thread':>16} {'CPU s':>8} {'test error':>11}  spec read")
    for (name, threads), res in results.items():
        ratio = f"{base['fit_s'] / res['fit_s']:.2f}x" if base else "-"
        print(f"{name:6} {threads:8} {res['fit_s']:8.2f} {ratio:>16} {res['cpu_s']:8.2f} {res['test_error']:11.3f}  "
              f"{res['spec']}")  # fmt: skip
    print("(fit s: wall-clock, the fastest round; CPU s: that fit's process CPU time, all threads)")
    print(f"this tree: the same model on every thread count: {same}")
    if args.out:
        rows = [{"tree_name": k[0], "threads": k[1], **v} for k, v in results.items()]
        args.out.write_text(json.dumps({"rows": rows, "same_model_this_tree": same, "argv": sys.argv}, indent=2))
    return 0 if same else 3


if __name__ == "__main__":
    sys.exit(main())

"""Scaling of one fit over threads and Dask layouts (issue 11, item 8; run on demand, not a test).

Every problem is fitted with ``max_iter`` fixed, ``polish=False`` and a fixed
``C`` (no cross-validation), first by the local engine on 1 thread (the
reference), then on more threads (``n_jobs``) and on Dask ``LocalCluster``\\ s
of worker processes (``processes=True``) laid out as *workers x threads per
worker* (one row shard per worker unless ``--shards-per-worker``).  Every row
prints the fit time, the solver loop's time, the speed-up over the 1-thread
fit and whether the model is the *same* (bit-identical ``support_``,
``dual_coef_``, ``intercept_`` and ``kernel_weights_``).

Problems (the issue's table)::

    a9a           a9a's 32561 training rows (CSR), the paper's 12 kernels, 1500 iterations
    cod-rna       cod-rna's 59535 training rows x 8 (dense, min-max scaled), 12 kernels, 1500 iterations
    mushrooms     6500 rows of mushrooms (CSR), 12 kernels per feature (1344), 150 iterations
    sonar-bank    Sonar (208 x 60), random Gaussian bank of 10^5 kernels on 5-feature subsets, 256 iterations
    sonar-bank-20k  the same with 20,000 kernels, 128 iterations (issue 22's thread figure)
    a9a-defaults  a9a (CSR), ``MWUMKLClassifier()``'s defaults (``random_state=0``): the two-stage fit,
                  C and selectivity cross-validated on its weight subsample (issue 22, item 2)

A defaults problem fits with the estimator's defaults instead (no fixed ``C`` or iterations); its
"solver" column times the two-stage fit's stages 2 and 3 (features and linear solve) and its
warm-up is a fit on its first 4000 rows with ``C=1, selectivity=0``.

Data come from ``benchmarks/datasets.py`` (``../shared/datasets`` when
present, else the download cache; ``--download`` fetches a missing set).
``--quick`` runs small synthetic problems of the same three kinds in seconds
(the check that the benchmark works; its timings mean little).

``--busy N`` runs the local rows again beside N CPU-bound processes (the
default thread count adapts to them; the others are held to their count).
Only thread counts and layouts that fit in the cores this process may use
(:func:`mwumkl_dist.threads.available_cpus`) run, unless ``--oversubscribe``.
Run it on an otherwise idle machine; the load average is recorded.

Usage::

    python benchmarks/bench_scaling.py [--quick] [--problems a9a,mushrooms] [--threads 1,2,4,8,16]
        [--layouts 1x16,2x8,4x4,8x1,16x1] [--repeat N] [--out DIR]

Writes ``scaling.json`` / ``scaling.csv`` (``scaling_quick.*`` with ``--quick``)
into ``--out`` (default ``benchmarks/results/scaling/``; ``benchmarks/out/scaling/``
with ``--quick``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

from benchmarks import datasets as D  # noqa: E402
from benchmarks.common import Context, write_outputs  # noqa: E402

DEFAULT_THREADS = (1, 2, 4, 8, 16)
DEFAULT_LAYOUTS = ((1, 16), (2, 8), (4, 4), (8, 1), (16, 1))
QUICK_THREADS = (1, 2)
QUICK_LAYOUTS = ((1, 2), (2, 1))
C_FIXED = 1.0
MODEL_ATTRS = ("support_", "dual_coef_", "intercept_", "kernel_weights_")


@dataclass(frozen=True)
class Spec:
    """One problem of the table: where its data come from and how it is fitted."""

    name: str
    dataset: str | None  # a benchmarks.datasets name, or None for generated data
    kernels: str
    max_iter: int
    rows: int | None = None  # a seeded random subset of the training rows
    sparse: bool = False  # fit from CSR (as the CLI reads an svmlight file)
    scale: bool = False  # min-max scale the features
    description: str = ""
    defaults: bool = False  # the estimator's defaults (kernels, max_iter and the fixed C unused)
    params: tuple = ()  # (name, value) estimator parameters of a defaults problem beyond random_state=0


PROBLEMS = {
    "a9a": Spec("a9a", "a9a", "paper", 1500, sparse=True, description="a9a, 12 paper kernels"),
    "cod-rna": Spec("cod-rna", "cod-rna", "paper", 1500, scale=True, description="cod-rna 59535 x 8, 12 kernels"),
    "mushrooms": Spec(
        "mushrooms",
        "mushrooms",
        "paper-per-feature",
        150,
        rows=6500,
        sparse=True,
        description="mushrooms 6500 rows, 1344 per-feature kernels",
    ),
    "sonar-bank": Spec(
        "sonar-bank",
        "sonar",
        "random:100000:size=5:seed=0:widths=paper",
        256,
        description="Sonar, random bank of 10^5 kernels (5-feature subsets)",
    ),
    "sonar-bank-20k": Spec(
        "sonar-bank-20k",
        "sonar",
        "random:20000:size=5:seed=0:widths=paper",
        128,
        description="Sonar, random bank of 20,000 kernels (5-feature subsets)",
    ),
    "a9a-defaults": Spec(
        "a9a-defaults",
        "a9a",
        "scaled",
        0,
        sparse=True,
        defaults=True,
        description="a9a, MWUMKLClassifier() defaults (two-stage; C and selectivity cross-validated)",
    ),
}

QUICK_PROBLEMS = {
    "quick-rows": Spec("quick-rows", None, "paper", 60, description="synthetic 3000 x 10, 12 kernels"),
    "quick-kernels": Spec(
        "quick-kernels",
        None,
        "paper-per-feature",
        20,
        sparse=True,
        description="synthetic binary 1500 x 16 (CSR), 192 per-feature kernels",
    ),
    "quick-bank": Spec(
        "quick-bank",
        None,
        "random:2000:size=5:seed=0:widths=paper",
        32,
        description="synthetic 208 x 60, random bank of 2000 kernels (5-feature subsets)",
    ),
    "quick-defaults": Spec(
        "quick-defaults",
        None,
        "scaled",
        0,
        defaults=True,
        params=(("solver", "two-stage"),),
        description="synthetic 600 x 10, defaults with the two-stage solver",
    ),
}


# ----------------------------------------------------------------------------- data


def _synthetic(name: str):
    from sklearn.datasets import make_classification

    if name in ("quick-rows", "quick-defaults"):
        n = 3000 if name == "quick-rows" else 600
        X, t = make_classification(n_samples=n, n_features=10, n_informative=5, flip_y=0.05, random_state=0)
        X = (X - X.min(axis=0)) / (X.max(axis=0) - X.min(axis=0))
    elif name == "quick-kernels":
        X, t = make_classification(n_samples=1500, n_features=16, n_informative=6, flip_y=0.05, random_state=1)
        X = (X > 0).astype(np.float64)
        X[::7] = X[1::7][: len(X[::7])]  # duplicated rows: exact ties in g
    else:
        X, t = make_classification(n_samples=208, n_features=60, n_informative=8, flip_y=0.05, random_state=2)
        X = (X - X.min(axis=0)) / (X.max(axis=0) - X.min(axis=0))
    return X, np.where(t == 1, 1.0, -1.0)


def load_problem(spec: Spec, datasets_dir, download: bool):
    """``(X, y, source)`` of a problem, or raises DatasetUnavailableError / ChecksumError."""
    import scipy.sparse as sp

    if spec.dataset is None:
        X, y = _synthetic(spec.name)
        source = "synthetic"
    else:
        ds = D.load_dataset(spec.dataset, datasets_dir, download=download)
        X, y, source = np.asarray(ds.X, dtype=np.float64), np.asarray(ds.y, dtype=np.float64), ds.source
    if spec.rows is not None and spec.rows < len(y):
        rows = np.sort(np.random.default_rng(0).choice(len(y), spec.rows, replace=False))
        X, y = X[rows], y[rows]
    if spec.scale:
        lo, hi = X.min(axis=0), X.max(axis=0)
        X = (X - lo) / np.where(hi > lo, hi - lo, 1.0)
    if spec.sparse:
        X = sp.csr_matrix(X)
    return X, y, source


def count_kernels(spec: Spec, n_features: int, X=None) -> int:
    """Base kernels of the problem (a random bank counts its kernels, without expanding it).

    The scaled families take their widths from the rows ``X`` (as a fit does).
    """
    from mwumkl_dist.kernels import parse_kernels
    from mwumkl_dist.kernels.evaluation import data_scale, scale_sample_rows

    scale = None if X is None else lambda: data_scale([X], X.shape[1], X[scale_sample_rows(X.shape[0])])
    return sum(int(getattr(k, "n_kernels", 1)) for k in parse_kernels(spec.kernels, n_features, scale))


# ----------------------------------------------------------------------------- fits


@contextlib.contextmanager
def timed_solver(record: list, spec: Spec):
    """Record the wall time of every solver loop: ``mwu.solve`` (without setup), or a defaults problem's
    two-stage stages 2 and 3."""
    from mwumkl_dist.solvers.mwu import one_vs_rest as mwu  # where the fit driver looks the solver up
    from mwumkl_dist.solvers.two_stage.solver import TwoStageSolver

    owner, name = (TwoStageSolver, "_full_stage") if spec.defaults else (mwu, "solve")
    original = getattr(owner, name)

    def solve(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - start)

    setattr(owner, name, solve)
    try:
        yield
    finally:
        setattr(owner, name, original)


def make_estimator(spec: Spec, *, max_iter: int, **params):
    """The estimator a problem is fitted with (``params``: ``n_jobs``, the engine's)."""
    from mwumkl_dist import MWUMKLClassifier

    if spec.defaults:
        return MWUMKLClassifier(random_state=0, **dict(spec.params), **params)
    return MWUMKLClassifier(kernels=spec.kernels, C=C_FIXED, max_iter=max_iter, polish=False, solver="mwu", **params)


def fit_once(X, y, spec: Spec, *, max_iter: int, **params) -> tuple[object, float, float]:
    """``(estimator, fit seconds, solver seconds)`` of one fit."""
    clf = make_estimator(spec, max_iter=max_iter, **params)
    record: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FewIterationsWarning / ConvergenceWarning: max_iter is fixed on purpose
        with timed_solver(record, spec):
            start = time.perf_counter()
            clf.fit(X, y)
            fit_s = time.perf_counter() - start
    return clf, fit_s, float(sum(record))


def warm_up(X, y, spec: Spec, **params) -> None:
    """A short fit (numba compile or cache load): 2 iterations, or the defaults on 4000 rows at a given C."""
    if spec.defaults:
        from mwumkl_dist import MWUMKLClassifier

        MWUMKLClassifier(random_state=0, C=1.0, selectivity=0.0, **dict(spec.params), **params).fit(X[:4000], y[:4000])
    else:
        fit_once(X, y, spec, max_iter=2, **params)


def timed(X, y, spec: Spec, repeat: int, **params) -> tuple[object, float, float]:
    """A warm-up fit (:func:`warm_up`), then the best of ``repeat`` fits."""
    warm_up(X, y, spec, **params)
    best = None
    for _ in range(repeat):
        clf, fit_s, solve_s = fit_once(X, y, spec, max_iter=spec.max_iter, **params)
        if best is None or fit_s < best[1]:
            best = (clf, fit_s, solve_s)
    return best


def same_model(a, b) -> bool:
    """Bit-identical support set, dual coefficients, biases and kernel weights."""
    return all(np.array_equal(np.asarray(getattr(a, k)), np.asarray(getattr(b, k))) for k in MODEL_ATTRS)


def _row(problem: str, layout: str, workers, threads, clf, fit_s, solve_s, ref, ref_fit, ref_solve) -> dict:
    return {
        "problem": problem,
        "layout": layout,
        "workers": workers,
        "threads": threads,
        "fit_s": fit_s,
        "solve_s": solve_s,
        "speedup": ref_fit / fit_s if fit_s > 0 else float("nan"),
        "solve_speedup": ref_solve / solve_s if solve_s > 0 else float("nan"),
        "same_model": ref is clf or same_model(ref, clf),
        "n_iter": int(np.sum(clf.n_iter_)),
        "load_1min": round(os.getloadavg()[0], 2),  # the machine's load as the row ends (a shared box's noise)
    }


# ----------------------------------------------------------------------------- report


def print_table(title: str, rows: list[dict], out=sys.stdout) -> None:
    print(f"\n{title}", file=out)
    head = ("layout", "threads", "fit s", "solver s", "speed-up", "solver speed-up", "same model")
    lines = [
        (
            r["layout"],
            str(r["threads"] if r["workers"] is None else f"{r['workers']}x{r['threads']}"),
            f"{r['fit_s']:.2f}",
            f"{r['solve_s']:.2f}",
            f"{r['speedup']:.2f}x",
            f"{r['solve_speedup']:.2f}x",
            "yes" if r["same_model"] else "NO",
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)), file=out)
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)), file=out)
    out.flush()


# ----------------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"thread counts must be positive, got {text!r}")
    return values


def _layouts(text: str) -> list[tuple[int, int]]:
    out = []
    for part in (t.strip().lower() for t in text.split(",")):
        if not part or part == "none":
            continue
        try:
            w, t = (int(v) for v in part.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a layout is WORKERSxTHREADS (e.g. 2x8), got {part!r}") from None
        if w < 1 or t < 1:
            raise argparse.ArgumentTypeError(f"a layout needs positive counts, got {part!r}")
        out.append((w, t))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small synthetic problems (seconds): checks the benchmark")
    p.add_argument(
        "--problems",
        help=f"comma-separated problems (default: all; full: {', '.join(PROBLEMS)}; "
        f"quick: {', '.join(QUICK_PROBLEMS)})",
    )
    p.add_argument("--threads", type=_ints, help="local thread counts (default 1,2,4,8,16; quick 1,2)")
    p.add_argument(
        "--layouts",
        type=_layouts,
        help="Dask layouts WORKERSxTHREADS, comma-separated, or 'none' (default 1x16,2x8,4x4,8x1,16x1; quick 1x2,2x1)",
    )
    p.add_argument(
        "--threaded-cluster",
        action="store_true",
        help="Dask workers as threads of this process (processes=False): a fast check of the Dask rows, "
        "not a measurement",
    )
    p.add_argument("--shards-per-worker", type=int, default=1, help="row shards per Dask worker (default 1)")
    p.add_argument(
        "--auto-shards", action="store_true", help="Dask rows with n_shards='auto' (the estimator's default)"
    )
    p.add_argument("--repeat", type=int, default=1, help="fits per row; the fastest is reported (default 1)")
    p.add_argument("--max-iter", type=int, help="override every problem's iteration count")
    p.add_argument("--oversubscribe", action="store_true", help="also run counts above the available cores")
    p.add_argument("--datasets-dir", type=Path, default=None, help="data folder (default ../shared/datasets)")
    p.add_argument("--download", action="store_true", help="download a data set that is not on disk")
    p.add_argument("--out", type=Path, help="output folder (default benchmarks/results/scaling)")
    p.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="also run the local rows with N competing CPU-bound processes on the machine (busy rows beside idle ones)",
    )
    return p


@contextlib.contextmanager
def competing_processes(n: int):
    """``n`` CPU-bound processes (a Python busy loop each) for the block's duration."""
    import subprocess

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        if procs:
            time.sleep(1.0)  # running, not starting
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from mwumkl_dist.threads import available_cpus

    catalogue = QUICK_PROBLEMS if args.quick else PROBLEMS
    names = list(catalogue) if not args.problems else [n.strip() for n in args.problems.split(",") if n.strip()]
    unknown = [n for n in names if n not in catalogue]
    if unknown:
        parser.error(f"unknown problems {unknown}; choose from {', '.join(catalogue)}")
    if args.repeat < 1 or args.shards_per_worker < 1 or (args.max_iter is not None and args.max_iter < 1):
        parser.error("--repeat, --shards-per-worker and --max-iter must be positive")
    cpus = available_cpus()
    threads = args.threads or list(QUICK_THREADS if args.quick else DEFAULT_THREADS)
    layouts = args.layouts if args.layouts is not None else list(QUICK_LAYOUTS if args.quick else DEFAULT_LAYOUTS)
    if not args.oversubscribe:
        skipped = [t for t in threads if t > cpus] + [f"{w}x{t}" for w, t in layouts if w * t > cpus]
        threads = [t for t in threads if t <= cpus]
        layouts = [(w, t) for w, t in layouts if w * t <= cpus]
        if skipped:
            print(f"{cpus} cores available: skipping {', '.join(map(str, skipped))} (--oversubscribe runs them)")
    threads = sorted(set(threads) | {1})  # the 1-thread fit is the reference
    out_dir = args.out or (HERE / ("out" if args.quick else "results") / "scaling")
    key = "scaling_quick" if args.quick else "scaling"
    started = time.time()
    load_start = os.getloadavg()

    problems = {}
    for name in names:
        spec = catalogue[name]
        if args.max_iter is not None and not spec.defaults:
            spec = Spec(**{**spec.__dict__, "max_iter": args.max_iter})
        try:
            X, y, source = load_problem(spec, args.datasets_dir, args.download)
        except (D.DatasetUnavailableError, D.ChecksumError) as exc:
            print(f"{name}: skipped ({exc})")
            continue
        m = count_kernels(spec, X.shape[1], X)
        problems[name] = (spec, X, y, source, m)
        fitted = "the defaults" if spec.defaults else f"{spec.max_iter} it"
        print(f"{name}: {X.shape[0]} x {X.shape[1]} ({source}), {m} kernels '{spec.kernels}', {fitted}")
    if not problems:
        print("no problem to run")
        return 1

    rows: dict[str, list[dict]] = {name: [] for name in problems}
    refs = {}
    # The local rows: each thread count and the default (n_jobs=None), on the idle machine and, with
    # --busy N, beside N competing processes; speed-ups are over 1 thread under the same load.
    for busy in sorted({0, max(0, args.busy)}):
        with competing_processes(busy):
            for name, (spec, X, y, _, _) in problems.items():
                for t in [*threads, None]:
                    clf, fit_s, solve_s = timed(X, y, spec, args.repeat, n_jobs=t)
                    if t == 1:
                        local_ref = (clf, fit_s, solve_s)
                        refs.setdefault(name, local_ref)
                    label = f"local {'default' if t is None else t}" + (f", busy {busy}" if busy else "")
                    threads_used = getattr(clf, "n_threads_", t)
                    row = _row(name, label, None, threads_used, clf, fit_s, solve_s, *local_ref)
                    row["same_model"] = row["same_model"] and same_model(refs[name][0], clf)
                    row["busy"] = busy
                    rows[name].append(row)
                    print(f"  {name} {label} ({threads_used} threads): {fit_s:.2f} s, same model {row['same_model']}, "
                          f"load {row['load_1min']:.2f}")  # fmt: skip

    if layouts:
        from distributed import Client, LocalCluster

        for w, t in layouts:
            with (
                LocalCluster(
                    n_workers=w,
                    threads_per_worker=t,
                    processes=not args.threaded_cluster,
                    dashboard_address=":0",
                    memory_limit=0,
                ) as cluster,
                Client(cluster) as client,
            ):
                client.wait_for_workers(w, timeout=120)
                for name, (spec, X, y, _, _) in problems.items():
                    clf, fit_s, solve_s = timed(
                        X, y, spec, args.repeat, engine="dask", client=client,
                        n_shards="auto" if args.auto_shards else w * args.shards_per_worker,
                    )  # fmt: skip
                    rows[name].append(_row(name, f"dask {w}x{t}" + (" auto" if args.auto_shards else ""), w, t,
                                           clf, fit_s, solve_s, *refs[name]))  # fmt: skip
                    rows[name][-1]["shard_layout"] = getattr(clf, "shard_layout_", None)
                    print(f"  {name} dask {w}x{t}: {fit_s:.2f} s, same model {rows[name][-1]['same_model']}")

    all_rows = []
    for name, (spec, X, _, source, m) in problems.items():
        label = spec.description + (" [synthetic]" if source == "synthetic" and spec.dataset else "")
        fitted = "defaults" if spec.defaults else f"{spec.max_iter} it"
        title = f"{name}: {label}, {fitted} ({X.shape[0]} x {X.shape[1]}, {m} kernels; {cpus} cores)"
        print_table(title, rows[name])
        for r in rows[name]:
            all_rows.append({**r, "n_samples": X.shape[0], "n_features": X.shape[1], "n_kernels": m, "source": source})
    same = all(r["same_model"] for r in all_rows)
    print(f"\nsame model in every row: {same}")

    ctx = Context(out=out_dir, quick=args.quick, command=" ".join([sys.executable, *sys.argv]))
    settings = {
        "problems": {n: problems[n][0].__dict__ for n in problems},
        "threads": threads,
        "layouts": [f"{w}x{t}" for w, t in layouts],
        "shards_per_worker": args.shards_per_worker,
        "dask_processes": not args.threaded_cluster,
        "repeat": args.repeat,
        "C": C_FIXED,
        "polish": False,
        "available_cpus": cpus,
        "busy_processes": args.busy,
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    summary = {"same_model_every_row": same}
    for name in problems:
        summary[name] = {r["layout"]: round(r["speedup"], 3) for r in rows[name]}
    path = write_outputs(ctx, key, "Scaling over threads and Dask layouts", all_rows, summary, settings, [], started)
    print(f"wrote {path}")
    return 0 if same else 3


if __name__ == "__main__":
    sys.exit(main())

"""E10, structure: does the default find the features and interactions that carry the signal?

``python -m benchmarks.bench_structure [--smoke] [--problems e7,madelon] [--e7-sizes 20000,100000,1000000]
[--madelon-seeds 5] [--methods ...] [--threads 1] [--out DIR]``

The issue's question (issue 28): on data whose signal lives in a few features or in their interactions, does
``MWUMKLClassifier()`` with no arguments learn a kernel that says so, and how close does it come to what a
practitioner would pick instead (gradient-boosted trees, a tuned RBF SVM)?

Problems (each with a known set of relevant features):

* ``e7``: E7's synthetic data (``benchmarks/bench_scale_n.py``): 20 uniform features, labels
  ``sign(sin(2 pi x0) sin(2 pi x1) + 2 ((x2 - 1/2)^2 + (x3 - 1/2)^2 - 1/6))`` with 5 % of them flipped (the
  Bayes error is 5 %); relevant: x0-x3.  Training sizes ``--e7-sizes`` (nested prefixes of one stream), one
  test set of 20,000 rows of its own stream.
* ``madelon``: ``make_classification(n_samples=2600, n_features=500, n_informative=5, n_redundant=15,
  n_clusters_per_class=16, class_sep=2, shuffle=False, random_state=seed)`` with its rows and columns then
  permuted by a generator of the same seed (so the 20 relevant columns, the 5 informative and 15 redundant
  ones, are known), 2000 training / 600 test rows, min-max scaled on the training rows; seeds 0 ...
  ``--madelon-seeds - 1``.

Methods, on the same rows:

MWUMKL        ``MWUMKLClassifier()``, no argument (its cross-validation inside the timed fit).  Recorded: the
              kept features and subsets (``structure_``), the share of ``feature_weights_`` on the relevant
              features, ``C_``, the solver, the kernel count.
SVC-RBF       E8's tuned RBF SVM: ``GridSearchCV(SVC(kernel="rbf"))`` over C = 10^-2 ... 10^4 and gamma =
              2^-4 ... 2^4 times ``1 / (d var X)``, 5-fold, on a stratified sample of at most ``--svc-grid-rows``
              training rows, then the best refitted on at most ``--svc-refit-rows`` of them (the grid on all of
              E7's 20,000+ rows would take hours here); both inside the fit time.
SVC-oracle    the same, on the relevant features only (the structure handed over).
LightGBM      ``lightgbm.LGBMClassifier()`` with its defaults (the bench extra).
EasyMKL       E6's EasyMKL on the scaled family (the default's structure-free kernels), up to
              ``--easymkl-max-train`` rows.

Writes into ``--out`` (default ``benchmarks/results/e10``): ``E10.json`` (settings, machine, every row,
the summary), ``E10.md`` (the tables; ``benchmarks/report.py`` puts it into ``RESULTS.md``) and
``e10_error.png``.  ``--smoke``: tiny sizes on generated data, every code path in about a minute; its numbers
mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

METHODS = ("MWUMKL", "SVC-RBF", "SVC-oracle", "LightGBM", "EasyMKL")
PROBLEMS = ("e7", "madelon")
E7_SIZES = (20_000, 100_000, 1_000_000)
E7_TEST = 20_000
E7_RELEVANT = (0, 1, 2, 3)
MADELON_SEEDS = 5
MADELON_TRAIN, MADELON_TEST = 2000, 600
SVC_GRID_ROWS = 3000
SVC_REFIT_ROWS = 20_000
EASYMKL_MAX_TRAIN = 2000
SMOKE = {"e7_sizes": (600,), "madelon_seeds": 1, "madelon": (300, 100, 60), "svc_grid_rows": 200, "easymkl": 300}


# ----------------------------------------------------------------------------- problems


def madelon(seed: int, n_train: int = MADELON_TRAIN, n_test: int = MADELON_TEST, n_features: int = 500):
    """The madelon-like problem of ``seed``: ``(Xtr, ytr, Xte, yte, relevant)`` (scaled; relevant column indices)."""
    from sklearn.datasets import make_classification
    from sklearn.preprocessing import MinMaxScaler

    X, y = make_classification(
        n_samples=n_train + n_test, n_features=n_features, n_informative=5, n_redundant=15,
        n_clusters_per_class=16, class_sep=2, shuffle=False, random_state=seed,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    columns = rng.permutation(n_features)
    X = X[:, columns]
    rows = rng.permutation(len(y))
    X, y = X[rows], np.where(y[rows] == 1, 1.0, -1.0)
    relevant = np.flatnonzero(columns < 20)
    scaler = MinMaxScaler(clip=True).fit(X[:n_train])
    return scaler.transform(X[:n_train]), y[:n_train], scaler.transform(X[n_train:]), y[n_train:], relevant


def problems(names, e7_sizes, madelon_seeds: int, smoke: bool):
    """Yield ``(problem, n_train, seed, Xtr, ytr, Xte, yte, relevant)``."""
    from benchmarks.bench_scale_n import synthetic_rows

    if "e7" in names:
        Xte, yte = synthetic_rows(200 if smoke else E7_TEST, part=1)
        for n in e7_sizes:
            Xtr, ytr = synthetic_rows(n, part=0)
            yield "e7", n, 0, Xtr, ytr, Xte, yte, np.array(E7_RELEVANT)
    if "madelon" in names:
        for seed in range(madelon_seeds):
            if smoke:
                n_train, n_test, d = SMOKE["madelon"]
                yield ("madelon", n_train, seed, *madelon(seed, n_train, n_test, d))
            else:
                yield ("madelon", MADELON_TRAIN, seed, *madelon(seed))


# ----------------------------------------------------------------------------- methods


def _stratified(y, size: int, seed: int) -> np.ndarray:
    from mwumkl_dist.solvers.auto import stratified_rows

    return stratified_rows(y, size, seed)


def _svc(Xtr, ytr, seed: int, grid_rows: int, refit_rows: int):
    """E8's grid on a stratified sample of ``grid_rows`` rows, the best refitted on ``refit_rows`` of them."""
    from sklearn.svm import SVC

    from benchmarks.bench_e8 import _svc_search, gamma_scale

    rows = _stratified(ytr, grid_rows, seed)
    search = _svc_search(gamma_scale(Xtr)).fit(Xtr[rows], ytr[rows])
    refit = _stratified(ytr, refit_rows, seed)
    model = SVC(kernel="rbf", **search.best_params_).fit(Xtr[refit], ytr[refit])
    return model, {"C": search.best_params_["C"], "gamma": search.best_params_["gamma"], "refit_rows": len(refit)}


def run_method(method: str, Xtr, ytr, Xte, yte, relevant, seed: int, settings: dict) -> dict:
    """One method on one problem: test error, fit time (wall, CPU) and what the method chose."""
    facts: dict = {}
    start, cpu = time.perf_counter(), time.process_time()
    if method == "MWUMKL":
        from mwumkl_dist import MWUMKLClassifier

        model = MWUMKLClassifier().fit(Xtr, ytr)
        weights = np.atleast_2d(model.feature_weights_).mean(axis=0)
        structure = getattr(model, "structure_", None)
        facts = {
            "C": float(model.C_),
            "solver": model.solver_,
            "n_kernels": len(model.kernel_names_),
            "relevant_mass": float(weights[relevant].sum() / weights.sum()),
            "features": None if structure is None else structure["features"],
            "subsets": None if structure is None else structure.get("subsets", []),
        }
        predict = model.predict
    elif method in ("SVC-RBF", "SVC-oracle"):
        cols = relevant if method == "SVC-oracle" else np.arange(Xtr.shape[1])
        model, facts = _svc(Xtr[:, cols], ytr, seed, settings["svc_grid_rows"], settings["svc_refit_rows"])
        predict = lambda X: model.predict(X[:, cols])  # noqa: E731
    elif method == "LightGBM":
        import lightgbm

        model = lightgbm.LGBMClassifier(verbose=-1, n_jobs=settings["threads"]).fit(Xtr, ytr)
        predict = model.predict
    elif method == "EasyMKL":
        from benchmarks.bench_e8 import easymkl_fit, easymkl_predict
        from mwumkl_dist.data.problems import make_training_input

        if len(ytr) > settings["easymkl_max_train"]:
            return {"status": "skipped", "note": f"more than {settings['easymkl_max_train']} training rows"}
        kernels = list(make_training_input(Xtr, ytr, "scaled", estimator=None).kernel_names)
        model = easymkl_fit(kernels, Xtr, ytr, seed)
        predict = lambda X: easymkl_predict(model, X)  # noqa: E731
        facts = {"lambda": model["lambda"], "n_kernels": len(kernels)}
    else:
        raise ValueError(f"unknown method {method!r}")
    fit_s, fit_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    error = float(np.mean(predict(Xte) != yte))
    return {"status": "ok", "error": error, "fit_s": fit_s, "fit_cpu_s": fit_cpu_s, **facts}


# ----------------------------------------------------------------------------- summary and outputs


def summarise(rows: list[dict]) -> list[dict]:
    """Per (problem, n_train, method): mean and standard error of the test error over seeds, mean fit time."""
    out = []
    keys = sorted({(r["problem"], r["n_train"], r["method"]) for r in rows if r["status"] == "ok"},
                  key=lambda k: (k[0], k[1], METHODS.index(k[2])))  # fmt: skip
    for problem, n, method in keys:
        sel = [
            r for r in rows if (r["problem"], r["n_train"], r["method"]) == (problem, n, method) and r["status"] == "ok"
        ]
        errors = np.array([r["error"] for r in sel])
        se = float(errors.std(ddof=1) / np.sqrt(len(errors))) if len(errors) > 1 else None
        mass = [r["relevant_mass"] for r in sel if "relevant_mass" in r]
        out.append(
            {
                "problem": problem,
                "n_train": n,
                "method": method,
                "seeds": len(sel),
                "error": float(errors.mean()),
                "error_se": se,
                "fit_s": float(np.mean([r["fit_s"] for r in sel])),
                "relevant_mass": float(np.mean(mass)) if mass else None,
            }
        )
    return out


def markdown(summary: list[dict], rows: list[dict]) -> str:
    lines = [
        "| problem | training rows | method | seeds | test error % (SE) | fit s | weight on relevant features |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        se = "" if s["error_se"] is None else f" ({100 * s['error_se']:.2f})"
        mass = "-" if s["relevant_mass"] is None else f"{s['relevant_mass']:.2f}"
        lines.append(
            f"| {s['problem']} | {s['n_train']} | {s['method']} | {s['seeds']} | {100 * s['error']:.2f}{se} | "
            f"{s['fit_s']:.1f} | {mass} |"
        )
    found = [r for r in rows if r["method"] == "MWUMKL" and r["status"] == "ok"]
    if found:
        lines += ["", "What MWUMKL kept (per problem, size and seed):", ""]
        for r in found:
            kept = "the scaled family on all features (no structure)" if r["features"] is None else (
                f"features {r['features']}, subsets {r['subsets']}"
            )  # fmt: skip
            lines.append(
                f"- {r['problem']} n={r['n_train']} seed {r['seed']}: {kept}; C {r['C']:g}, {r['solver']}, "
                f"{r['n_kernels']} kernels"
            )
    return "\n".join(lines) + "\n"


def figure(out: Path, summary: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((s["problem"], s["n_train"]) for s in summary))
    methods = [m for m in METHODS if any(s["method"] == m for s in summary)]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 3.6))
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        xs, ys, es = [], [], []
        for g, (problem, n) in enumerate(groups):
            match = [s for s in summary if (s["problem"], s["n_train"], s["method"]) == (problem, n, method)]
            if match:
                xs.append(g + (i - (len(methods) - 1) / 2) * width)
                ys.append(100 * match[0]["error"])
                es.append(100 * (match[0]["error_se"] or 0.0))
        ax.bar(xs, ys, width, yerr=es, label=method, capsize=2)
    ax.set_xticks(range(len(groups)), [f"{p}\nn={n}" for p, n in groups])
    ax.set_ylabel("test error (%)")
    ax.set_title("E10: structure in the data (mean over seeds, standard error bars)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "e10_error.png", dpi=110)
    plt.close(fig)


def screen_cost(sizes, n_rows: int, threads, dask_workers: int = 0, repeat: int = 1) -> list[dict]:
    """How far the screen's kernel count ``m`` can go: the wall time of one screening fit (the structure search's
    settings) on ``n_rows`` of E7's data with ``m`` kernels on feature subsets, per thread count, and on a local
    Dask cluster of ``dask_workers`` single-thread workers with that many kernel shards (0: not measured)."""
    import itertools

    from benchmarks.bench_scale_n import synthetic_rows
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.kernels.evaluation import data_scale, scale_sample_rows
    from mwumkl_dist.kernels.specs import subset_kernels

    # The settings of the MWU screen the structure search used before its relevance fit (E10's measurement).
    SCREEN_C, SCREEN_SELECTIVITY, SCREEN_EPSILON, SCREEN_EXPONENTS = 0.1, 30.0, 0.2, (0.0,)

    X, y = synthetic_rows(n_rows, part=0)
    X = np.hstack([X, synthetic_rows(n_rows, part=1)[0]])  # 40 features: 820 singles and pairs (``kernels``: how many)
    scale = data_scale([X], X.shape[1], X[scale_sample_rows(n_rows)])
    subsets = [(f,) for f in range(X.shape[1])] + list(itertools.combinations(range(X.shape[1]), 2))
    settings = dict(C=SCREEN_C, selectivity=SCREEN_SELECTIVITY, epsilon=SCREEN_EPSILON, polish=False)
    rows = []

    def timed(**params):
        best = None
        for _ in range(repeat):
            start = time.perf_counter()
            MWUMKLClassifier(**settings, **params).fit(X, y)
            best = min(best or np.inf, time.perf_counter() - start)
        return best

    client = None
    if dask_workers:
        from distributed import Client, LocalCluster

        client = Client(LocalCluster(n_workers=dask_workers, threads_per_worker=1, dashboard_address=":0"))
    try:
        for m in sizes:
            kernels = [k for s in subsets[:m] for k in subset_kernels(scale, s, SCREEN_EXPONENTS)]
            for t in threads:
                rows.append({"m": m, "kernels": len(kernels), "n": n_rows, "engine": "local", "threads": t,
                             "seconds": timed(kernels=kernels, n_jobs=t)})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
            if client is not None:
                rows.append({"m": m, "kernels": len(kernels), "n": n_rows, "engine": "dask", "workers": dask_workers,
                             "seconds": timed(kernels=kernels, engine="dask", client=client,
                                              n_kernel_shards=dask_workers)})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if client is not None:
            client.close()
    return rows


def run(args) -> dict:
    from benchmarks.common import run_info
    from mwumkl_dist.threads import thread_limit

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "problems": args.problems,
        "e7_sizes": list(args.e7_sizes),
        "madelon_seeds": args.madelon_seeds,
        "methods": args.methods,
        "threads": args.threads,
        "svc_grid_rows": args.svc_grid_rows,
        "svc_refit_rows": args.svc_refit_rows,
        "easymkl_max_train": args.easymkl_max_train,
        "smoke": args.smoke,
    }
    info = run_info()
    started = time.time()
    rows = []
    from threadpoolctl import threadpool_limits

    with threadpool_limits(args.threads), thread_limit(args.threads), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for problem, n, seed, Xtr, ytr, Xte, yte, relevant in problems(
            args.problems, args.e7_sizes, args.madelon_seeds, args.smoke
        ):
            for method in args.methods:
                row = {"problem": problem, "n_train": n, "seed": seed, "method": method, "n_features": Xtr.shape[1]}
                row.update(run_method(method, Xtr, ytr, Xte, yte, relevant, seed, settings))
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = summarise(rows)
    doc = {"settings": settings, "machine": info, "seconds": time.time() - started, "rows": rows, "summary": summary}
    (out / "E10.json").write_text(json.dumps(doc, indent=1, default=float))
    (out / "E10.md").write_text(markdown(summary, rows))
    if summary:
        figure(out, summary)
    return doc


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_structure", description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny generated sizes: every code path; numbers mean nothing")
    p.add_argument("--problems", default=",".join(PROBLEMS), help=f"default: {','.join(PROBLEMS)}")
    p.add_argument("--e7-sizes", type=_ints, default=None, help="E7 training sizes (default 20000,100000,1000000)")
    p.add_argument("--madelon-seeds", type=int, default=None, help=f"default {MADELON_SEEDS}")
    p.add_argument("--methods", default=",".join(METHODS), help=f"default: {','.join(METHODS)}")
    p.add_argument("--threads", type=int, default=1, help="threads of every fit (default 1)")
    p.add_argument("--svc-grid-rows", type=int, default=None, help=f"SVC grid sample (default {SVC_GRID_ROWS})")
    p.add_argument("--svc-refit-rows", type=int, default=SVC_REFIT_ROWS)
    p.add_argument("--easymkl-max-train", type=int, default=None, help=f"default {EASYMKL_MAX_TRAIN}")
    p.add_argument("--out", default=str(HERE / "results" / "e10"))
    p.add_argument("--screen-cost", default=None, metavar="M,...",
                   help="instead: time a screening fit per kernel count M")  # fmt: skip
    p.add_argument("--screen-rows", type=int, default=2000, help="rows of the --screen-cost fits (default 2000)")
    p.add_argument("--threads-list", type=_ints, default=(1, 2), help="--screen-cost: thread counts (default 1,2)")
    p.add_argument("--dask-workers", type=int, default=0, help="--screen-cost: also on this many Dask workers")
    args = p.parse_args(argv)
    if args.screen_cost:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        from benchmarks.common import run_info

        rows = screen_cost(_ints(args.screen_cost), args.screen_rows, args.threads_list, args.dask_workers)
        (out / "screen_cost.json").write_text(json.dumps({"machine": run_info(), "rows": rows}, indent=1))
        return 0
    args.problems = [v for v in args.problems.split(",") if v]
    args.methods = [v for v in args.methods.split(",") if v]
    for name in args.problems:
        if name not in PROBLEMS:
            p.error(f"unknown problem {name!r}; choose from {', '.join(PROBLEMS)}")
    for name in args.methods:
        if name not in METHODS:
            p.error(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    if args.e7_sizes is None:
        args.e7_sizes = SMOKE["e7_sizes"] if args.smoke else E7_SIZES
    if args.madelon_seeds is None:
        args.madelon_seeds = SMOKE["madelon_seeds"] if args.smoke else MADELON_SEEDS
    if args.svc_grid_rows is None:
        args.svc_grid_rows = SMOKE["svc_grid_rows"] if args.smoke else SVC_GRID_ROWS
    if args.easymkl_max_train is None:
        args.easymkl_max_train = SMOKE["easymkl"] if args.smoke else EASYMKL_MAX_TRAIN
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

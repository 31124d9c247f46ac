"""The structure zoo: does the default find the relevant features whatever the shape of their effect?

``python -m benchmarks.bench_zoo [--smoke] [--families xor,parity3,...] [--d 30,200] [--seeds 0,1,2]
[--methods MWUMKL,LightGBM,SVC-oracle,SVC-RBF] [--n-train 4000] [--n-test 4000] [--rescale] [--out DIR]``

Problems: the 11 families of ``benchmarks/structure_zoo.py`` (issue 38's development bench: linear, additive
waves, xor, 3-way parity, a ball, a checkerboard, axis-aligned rules, an interaction plus an additive term, 20
weak features, a dense all-features problem, redundant noisy copies), ``d`` features with the relevant ones at
random positions per seed, 5 % of the labels flipped (the Bayes error is 5 %), ``--n-train`` / ``--n-test``
rows.  ``--rescale``: every feature multiplied by ``10^u``, ``u`` uniform on [-3, 3] (one draw per seed), to
see whether a method learns each feature's scale.

Methods, on the same rows:

MWUMKL        ``MWUMKLClassifier()``, no argument.  Recorded: the kept features (``structure_``), the share
              of ``feature_weights_`` on the relevant features (``mass``), ``C_``, fit time.
LightGBM      ``lightgbm.LGBMClassifier()`` with its defaults.
SVC-oracle    E8's tuned RBF SVM (``GridSearchCV`` over C and gamma on a stratified sample of at most
              ``--svc-grid-rows`` rows, refitted on all) on the relevant features only.
SVC-RBF       the same on all the features.

Every row is appended to ``rows.jsonl`` in ``--out`` (default ``benchmarks/results/zoo``) as it is measured, so
an interrupted run keeps what it measured; ``ZOO.json`` and ``ZOO.md`` (the table ``benchmarks/report.py`` puts
into ``RESULTS.md``) are written from every row there (``--report-only``: only that).  ``--smoke``: two small
families, tiny sizes, seconds; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks.structure_zoo import FAMILIES, make_problem

__all__ = ["METHODS", "main", "run_method", "summarise", "markdown"]

METHODS = ("MWUMKL", "LightGBM", "SVC-oracle", "SVC-RBF")
SMOKE = {"families": ("xor", "dense"), "d": (8,), "seeds": (0,), "n_train": 200, "n_test": 200, "svc_grid_rows": 100}


def problem(family: str, d: int, seed: int, n_train: int, n_test: int, rescale: bool):
    """``(Xtr, ytr, Xte, yte, relevant)`` of one family, seed and size (``rescale``: features on 10^-3..10^3)."""
    Xtr, ytr, relevant = make_problem(family, n_train, d, seed, part=0)
    Xte, yte, _ = make_problem(family, n_test, d, seed, part=1)
    if rescale:
        factors = 10.0 ** np.random.default_rng([seed, 31337]).uniform(-3, 3, size=d)
        Xtr, Xte = Xtr * factors, Xte * factors
    return Xtr, ytr, Xte, yte, list(relevant)


def _svc(Xtr, ytr, seed: int, grid_rows: int):
    """E8's grid on a stratified sample of ``grid_rows`` rows, the best refitted on all the rows."""
    from sklearn.svm import SVC

    from benchmarks.bench_e8 import _svc_search, gamma_scale
    from mwumkl_dist.solvers.auto import stratified_rows

    rows = stratified_rows(ytr, grid_rows, seed)
    search = _svc_search(gamma_scale(Xtr)).fit(Xtr[rows], ytr[rows])
    model = SVC(kernel="rbf", **search.best_params_).fit(Xtr, ytr)
    return model, {"C": search.best_params_["C"], "gamma": search.best_params_["gamma"]}


def run_method(method: str, Xtr, ytr, Xte, yte, relevant, seed: int, svc_grid_rows: int) -> dict:
    """One method on one problem: test error, fit time (wall, CPU) and what the method chose."""
    facts: dict = {}
    start, cpu = time.perf_counter(), time.process_time()
    if method == "MWUMKL":
        from mwumkl_dist import MWUMKLClassifier

        model = MWUMKLClassifier(n_jobs=1).fit(Xtr, ytr)
        weights = np.atleast_2d(model.feature_weights_).mean(axis=0)
        structure = getattr(model, "structure_", None)
        facts = {
            "C": float(model.C_),
            "n_kernels": len(model.kernel_names_),
            "mass": float(weights[relevant].sum() / weights.sum()),
            "features": None if structure is None else structure["features"],
        }
        predict = model.predict
    elif method in ("SVC-RBF", "SVC-oracle"):
        cols = np.asarray(relevant) if method == "SVC-oracle" else np.arange(Xtr.shape[1])
        model, facts = _svc(Xtr[:, cols], ytr, seed, svc_grid_rows)
        predict = lambda X: model.predict(X[:, cols])  # noqa: E731
    elif method == "LightGBM":
        import lightgbm

        model = lightgbm.LGBMClassifier(verbose=-1, n_jobs=1).fit(Xtr, ytr)
        predict = model.predict
    else:
        raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    fit_s, fit_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"error": float(np.mean(predict(Xte) != yte)), "fit_s": fit_s, "fit_cpu_s": fit_cpu_s, **facts}


def summarise(rows: list[dict]) -> list[dict]:
    """Mean error (and mass, fit time) per (d, rescale, n_train, family, method) over the seeds measured."""
    groups: dict = {}
    for r in rows:
        key = (r["d"], r.get("rescale", False), r["n_train"], r["family"], r["method"])
        groups.setdefault(key, []).append(r)
    out = []
    order = list(FAMILIES)
    for (d, rescale, n_train, family, method), rs in sorted(
        groups.items(), key=lambda kv: (*kv[0][:3], order.index(kv[0][3]))
    ):
        masses = [r["mass"] for r in rs if r.get("mass") is not None]
        out.append({"d": d, "rescale": rescale, "n_train": n_train, "family": family, "method": method,
                    "seeds": len(rs),
                    "error": float(np.mean([r["error"] for r in rs])),
                    "mass": float(np.mean(masses)) if masses else None,
                    "fit_s": float(np.mean([r["fit_s"] for r in rs])),
                    "fit_cpu_s": float(np.mean([r["fit_cpu_s"] for r in rs]))})  # fmt: skip
    return out


def markdown(summary: list[dict]) -> str:
    """The tables, one per (d, rescale, training rows): test error % per family and method (mean over seeds), MWUMKL's
    mass and fit time."""
    lines = []
    for d, rescale, n_train in sorted({(s["d"], s["rescale"], s["n_train"]) for s in summary}):
        part = [s for s in summary if (s["d"], s["rescale"], s["n_train"]) == (d, rescale, n_train)]
        families = [f for f in FAMILIES if any(s["family"] == f for s in part)]
        methods = [m for m in METHODS if any(s["method"] == m for s in part)]
        cell = {(s["family"], s["method"]): s for s in part}
        lines += [f"**d = {d}, {n_train} training rows{', features rescaled by 10^-3..10^3' if rescale else ''}** "
                  "(test error %, mean over the seeds shown)",
                  "", "| method | " + " | ".join(families) + " |", "|---|" + "---|" * len(families)]  # fmt: skip
        for m in methods:
            lines.append(f"| {m} | " + " | ".join(
                f"{100 * cell[f, m]['error']:.1f}" + (f" ({cell[f, m]['seeds']})" if f == families[0] else "")
                if (f, m) in cell else "-" for f in families) + " |")  # fmt: skip
        if "MWUMKL" in methods:
            for label, key, fmt in (
                ("mass", "mass", "{:.2f}"),
                ("fit s", "fit_s", "{:.0f}"),
                ("fit CPU s", "fit_cpu_s", "{:.0f}"),
            ):
                values = [fmt.format(cell[f, "MWUMKL"][key]) if (f, "MWUMKL") in cell else "-" for f in families]
                lines.append(f"| MWUMKL {label} | " + " | ".join(values) + " |")
        lines.append("")
    lines.append("`mass`: the share of `feature_weights_` on the relevant features; (k): seeds measured.")
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, settings: dict | None = None) -> dict:
    """``ZOO.json`` and ``ZOO.md`` from every row of ``rows.jsonl`` in ``out``."""
    from benchmarks.common import run_info

    path = out / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    summary = summarise(rows)
    doc = {"settings": settings or {}, "machine": run_info(), "rows": rows, "summary": summary}
    (out / "ZOO.json").write_text(json.dumps(doc, indent=1, default=float))
    (out / "ZOO.md").write_text(markdown(summary))
    return doc


def run(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    if args.report_only:
        return write_outputs(out, settings)
    from threadpoolctl import threadpool_limits

    from benchmarks.common import _git_commit

    commit = _git_commit()  # each row says which code it measured (a journal outlives commits)
    with threadpool_limits(1), warnings.catch_warnings(), (out / "rows.jsonl").open("a") as journal:
        warnings.simplefilter("ignore")
        for d in args.d:
            for seed in args.seeds:
                for family in args.families:
                    if FAMILIES[family] is not None and FAMILIES[family] > d:
                        continue
                    data = problem(family, d, seed, args.n_train, args.n_test, args.rescale)
                    for method in args.methods:
                        row = {"family": family, "d": d, "seed": seed, "method": method, "n_train": args.n_train,
                               "rescale": args.rescale, "load": os.getloadavg()[0], "commit": commit}  # fmt: skip
                        row.update(run_method(method, *data, seed, args.svc_grid_rows))
                        journal.write(json.dumps(row, default=float) + "\n")
                        journal.flush()
                        print(json.dumps(row, default=float), flush=True)
    return write_outputs(out, settings)


def _list(cast):
    return lambda text: tuple(cast(v) for v in text.split(",") if v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_zoo", description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, two families: every code path in seconds")
    p.add_argument("--families", type=_list(str), default=None, help="comma-separated (default: all 11)")
    p.add_argument("--d", type=_list(int), default=None, help="feature counts (default 30,200)")
    p.add_argument("--seeds", type=_list(int), default=None, help="seeds (default 0,1,2)")
    p.add_argument("--methods", type=_list(str), default=METHODS, help=f"default {','.join(METHODS)}")
    p.add_argument("--n-train", type=int, default=None, help="training rows (default 4000)")
    p.add_argument("--n-test", type=int, default=None, help="test rows (default 4000)")
    p.add_argument("--svc-grid-rows", type=int, default=None, help="rows of the SVC grid search (default 1000)")
    p.add_argument("--rescale", action="store_true", help="multiply each feature by 10^u, u uniform on [-3, 3]")
    p.add_argument("--report-only", action="store_true", help="only rebuild ZOO.json / ZOO.md from rows.jsonl")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "zoo"))
    args = p.parse_args(argv)
    defaults = SMOKE if args.smoke else {"families": tuple(FAMILIES), "d": (30, 200), "seeds": (0, 1, 2),
                                         "n_train": 4000, "n_test": 4000, "svc_grid_rows": 1000}  # fmt: skip
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    unknown = [f for f in args.families if f not in FAMILIES] + [m for m in args.methods if m not in METHODS]
    if unknown:
        p.error(f"unknown families or methods: {', '.join(unknown)}")
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""E35, lean default fits (issue 35): time and peak memory of ``MWUMKLClassifier()`` beside one tuned RBF SVC fit
and LightGBM, and two default fits started together.

``python -m benchmarks.bench_lean [--smoke] [--sets ijcnn1,w8a] [--rows N] [--methods mwumkl,svc,lgbm]
[--concurrent] [--threads 1] [--out DIR]``

The sets are generated stand-ins (the real files are not on the development box), each with its own test rows:

ijcnn1-like  50,000 x 22 dense: 10 coarse features (5 levels) and 12 uniform ones on [-1, 1]; the positive class
             (10 %) is the top decile of a smooth rule on 6 of them (a sine, a product, a ring, a linear term),
             1 % of the labels flipped.
w8a-like     37,000 x 300 sparse binary (about 11 non-zeros a row, feature frequencies falling as a power law);
             the positive class (3 %) the top of a sparse linear score plus one pairwise term, 0.5 % flipped.

Every fit is a fresh Python process (``--child``) that generates its data (untimed), fits, predicts the test rows
and reports: wall and CPU seconds of ``fit``, its peak RSS (``ru_maxrss``: the interpreter, imports, the data and
the fit) and its RSS before the fit, the test error, and for MWUMKL the rank, why it stopped, the residual and
whether the columns were spilled.  Methods: **MWUMKL** = ``MWUMKLClassifier(n_jobs=threads)`` (after an untimed
warm-up fit on 300 rows in the same process, which loads numba's compiled kernels); **SVC** = one
``SVC(kernel="rbf")`` fit on all rows at the ``(C, gamma)`` a 3-fold grid (C 1, 10, 100 x gamma 0.5, 1, 2 times
``1 / (d var X)``) chose on 3000 rows (the grid's time is reported apart, ``tune_s``: the issue compares one
tuned fit); **LightGBM** = ``LGBMClassifier(n_jobs=threads)`` with its defaults.  ``--concurrent``: two MWUMKL
children of the first set started together (each its own figures, and whether both completed).  The load
average is recorded before and after each child; the machine is shared, so the wall seconds are only
comparable within one run.

Writes ``OUT/lean.json`` (settings, machine, rows) and ``OUT/lean.md`` (the table; ``python -m benchmarks report``
puts it in RESULTS.md as E35).  ``--smoke``: a few hundred rows of each set, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
SETS = ("ijcnn1", "w8a")
METHODS = ("mwumkl", "svc", "lgbm")
ROWS = {"ijcnn1": 50_000, "w8a": 37_000}
TEST_ROWS = 10_000
SMOKE_ROWS, SMOKE_TEST = 400, 200


# ----------------------------------------------------------------------------- the stand-ins


def ijcnn1_like(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of the ijcnn1-like stand-in (see the module)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, 22))
    X[:, :10] = np.round(X[:, :10] * 2) / 2
    score = np.sin(3 * X[:, 10]) + 2 * X[:, 11] * X[:, 12] + X[:, 13] ** 2 + X[:, 14] ** 2 - 0.5 * X[:, 0]
    y = np.where(score > np.quantile(score, 0.9), 1.0, -1.0)
    flip = rng.random(n) < 0.01
    y[flip] = -y[flip]
    return X, y


def w8a_like(n: int, seed: int = 0) -> tuple[sp.csr_matrix, np.ndarray]:
    """``n`` rows of the w8a-like stand-in (see the module)."""
    rng = np.random.default_rng(seed)
    d = 300
    frequency = 0.5 / (1 + np.arange(d)) ** 0.6
    X = sp.csr_matrix((rng.random((n, d)) < frequency).astype(np.float64))
    w = rng.normal(size=d) * (np.random.default_rng(seed + 1).random(d) < 0.3)
    score = X @ w + 1.5 * X[:, 0].toarray().ravel() * X[:, 1].toarray().ravel()
    y = np.where(score > np.quantile(score, 0.97), 1.0, -1.0)
    flip = rng.random(n) < 0.005
    y[flip] = -y[flip]
    return X, y


def standin(name: str, n_train: int, n_test: int):
    """``(X_train, y_train, X_test, y_test)`` of stand-in ``name`` (training rows first, one draw)."""
    X, y = {"ijcnn1": ijcnn1_like, "w8a": w8a_like}[name](n_train + n_test)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


# ----------------------------------------------------------------------------- one fit, in its own process


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _tuned_svc(X, y, threads: int):
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.svm import SVC

    Xd = X.toarray() if sp.issparse(X) else X
    g0 = 1.0 / (Xd.shape[1] * Xd.var())
    sub = min(3000, len(y))
    Xs, _, ys, _ = train_test_split(X, y, train_size=sub, stratify=y, random_state=0) if sub < len(y) else (X, 0, y, 0)
    grid = {"C": [1.0, 10.0, 100.0], "gamma": [0.5 * g0, g0, 2 * g0]}
    t = time.perf_counter()
    search = GridSearchCV(SVC(kernel="rbf"), grid, cv=3, n_jobs=threads).fit(Xs, ys)
    tune_s = time.perf_counter() - t
    return SVC(kernel="rbf", **search.best_params_), {"tune_s": tune_s, **search.best_params_}


def child(spec: dict) -> dict:
    """One fit as ``spec`` says (``set``, ``method``, ``rows``, ``test_rows``, ``threads``): its figures."""
    X, y, Xt, yt = standin(spec["set"], spec["rows"], spec["test_rows"])
    threads, extra = int(spec["threads"]), {}
    if spec["method"] == "mwumkl":
        from mwumkl_dist import MWUMKLClassifier

        Xw, yw, _, _ = standin(spec["set"], 300, 0)
        MWUMKLClassifier(n_jobs=threads).fit(Xw, yw)  # warm-up: numba's kernels loaded, untimed
        model = MWUMKLClassifier(n_jobs=threads, **spec.get("params", {}))
    elif spec["method"] == "svc":
        model, extra = _tuned_svc(X, y, threads)
    else:
        from lightgbm import LGBMClassifier

        model = LGBMClassifier(n_jobs=threads, verbose=-1)
    before, load = _rss_mb(), os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(X, y)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out = {**spec, **extra, "fit_s": wall, "cpu_s": cpu, "peak_rss_mb": _peak_mb(), "rss_before_mb": before,
           "load_before": load, "load_after": os.getloadavg()[0],
           "error": float(np.mean(model.predict(Xt) != yt)) if len(yt) else None}  # fmt: skip
    if spec["method"] == "mwumkl":
        out.update({name.rstrip("_"): _plain(getattr(model, name)) for name in (
            "solver_", "n_components_", "rank_stop_reason_", "rank_path_", "nystroem_residual_", "features_spilled_",
            "polished_", "C_") if hasattr(model, name)})  # fmt: skip
    return out


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def run_children(specs: list[dict], timeout: float) -> list[dict]:
    """The specs' fits, each in its own process, all started together: their figures (a failed one says how)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(specs[0]["threads"])
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_lean", "--child", json.dumps(s)],
            cwd=HERE.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for s in specs
    ]
    rows = []
    for spec, proc in zip(specs, procs):
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if proc.returncode == 0 and lines:
            rows.append(json.loads(lines[-1]))
        else:  # killed (the out-of-memory killer: -9), or an error: its last words
            rows.append({**spec, "failed": f"exit {proc.returncode}: {stderr.strip().splitlines()[-1:]}"})
    return rows


# ----------------------------------------------------------------------------- the table


def table(rows: list[dict]) -> list[str]:
    out = [
        "| set | rows | method | fit s | CPU s | peak RSS MB (before fit) | test error | rank (stop), residual "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "failed" in r:
            out.append(f"| {r['set']} | {r['rows']} | {r['method']}{r.get('tag', '')} | failed: {r['failed']} |"
                       " | | | | |")  # fmt: skip
            continue
        name = {"mwumkl": "MWUMKL()", "svc": "SVC (one tuned fit)", "lgbm": "LightGBM"}[r["method"]] + r.get("tag", "")
        if r["method"] == "svc":
            name += f" C={r['C']:g}, grid {r['tune_s']:.1f} s"
        rank = ""
        if r["method"] == "mwumkl":
            if r.get("solver") == "two-stage" and not r.get("polished"):
                rank = f"{r['n_components']} ({r.get('rank_stop_reason', '?')}), {float(r['nystroem_residual']):.3g}"
                rank += ", spilled" if r.get("features_spilled") else ""
            else:
                rank = "exact" if r.get("polished") else r.get("solver", "")
        out.append(
            f"| {r['set']} | {r['rows']} | {name} | {r['fit_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:.0f} "
            f"({r['rss_before_mb']:.0f}) | {100 * r['error']:.2f} % | {rank} | {r['load_before']:.1f}-"
            f"{r['load_after']:.1f} |"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="a few hundred rows per set: seconds")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--rows", type=int, default=None, help="training rows of every set (default: the set's size)")
    ap.add_argument("--concurrent", action="store_true", help="also two MWUMKL fits of the first set together")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a child may take")
    ap.add_argument("--out", default=str(HERE / "results" / "lean"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    sets, methods = args.sets.split(","), args.methods.split(",")
    started, rows = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), []
    for name in sets:
        n = SMOKE_ROWS if args.smoke else (args.rows or ROWS[name])
        test = SMOKE_TEST if args.smoke else TEST_ROWS
        for method in methods:
            spec = {"set": name, "method": method, "rows": n, "test_rows": test, "threads": args.threads}
            rows += run_children([spec], args.timeout)
            print("\n".join(table(rows[-1:])[2:]), flush=True)
    if args.concurrent:
        n = SMOKE_ROWS if args.smoke else (args.rows or ROWS[sets[0]])
        test = SMOKE_TEST if args.smoke else TEST_ROWS
        specs = [{"set": sets[0], "method": "mwumkl", "rows": n, "test_rows": test, "threads": args.threads,
                  "tag": f" (one of two together, #{i + 1})"} for i in range(2)]  # fmt: skip
        rows += run_children(specs, args.timeout)
        print("\n".join(table(rows[-2:])[2:]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": "python -m benchmarks.bench_lean " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": started,
        "settings": {"smoke": args.smoke, "sets": sets, "methods": methods, "threads": args.threads},
        "machine": {"cores": os.cpu_count(), "load_average_end": list(os.getloadavg())},
        "rows": rows,
    }
    (out / "lean.json").write_text(json.dumps(doc, indent=1, default=_plain) + "\n")
    (out / "lean.md").write_text("\n".join(table(rows)) + "\n")
    print(f"wrote {out / 'lean.md'}")
    return 0 if all("failed" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""E7, scale in n: fit time, test error and peak memory versus the training size, against linear baselines.

``python benchmarks/bench_scale_n.py [--smoke] [--datasets cod-rna,synthetic] [--sizes N,N,...]
[--methods ...] [--threads 1] [--timeout S] [--datasets-dir DIR] [--out DIR]``

The issue's question: does the default estimator scale to large ``n``?  "Time and test error versus n
on log-log axes with fitted slopes, against LinearSVC and Nystroem + LinearSVC in the same run; peak
memory per point."  Targets: fit time proportional to ``n^1.2`` or better from 2*10^4 to 3*10^5 rows
(and to 10^6 on the synthetic set); from 10^5 rows, MWUMKL no slower than Nystroem + LinearSVC and its
test error at most 0.3 points above it.

Data (every training size is the first ``n`` rows of one fixed, shuffled training pool, so the sets are
nested; one held-out test set per data set):

cod-rna    LIBSVM's cod-rna, training and test files pooled (331,152 rows, 8 features; read by
           ``benchmarks/datasets.py``, so from ``--datasets-dir`` or the download cache, checked against
           ``benchmarks/MANIFEST.json``), shuffled with seed 0; 30,000 rows are the test set, the other
           301,152 the pool.  Features min-max scaled by a ``MinMaxScaler`` fitted on each point's own
           ``n`` training rows (as ``datasets.scale_split``), outside the timed fit.
           n = 2*10^4, 5*10^4, 10^5, 2*10^5, 3*10^5 (capped at the pool).
synthetic  20 features uniform on [0, 1]; label ``sign(sin(2 pi x0) sin(2 pi x1) + 2 ((x2 - 1/2)^2 +
           (x3 - 1/2)^2 - 1/6))`` (a checkerboard plus a radial term: a linear model is at chance, a Gaussian
           kernel is not), then 5 % of the labels flipped (the Bayes error is 5 %).  Generated
           deterministically in chunks of 100,000 rows (chunk ``i`` from ``default_rng([seed, part, i])``),
           so the first ``n`` rows do not depend on the pool's size; the 50,000 test rows are their own
           stream.  Not rescaled.  n = 2*10^4, 10^5, 3*10^5, 10^6.

Methods, the same at every point:

MWUMKL              ``MWUMKLClassifier()`` with its defaults (the paper's 12 kernels; C, selectivity and
                    epsilon automatic); from 10^4 rows it picks ``solver="two-stage"`` itself (``solver_`` is
                    recorded).  Before the timed fit, a small untimed warm-up fit on the point's first rows
                    (C=1, the solver the defaults will pick) loads numba's compiled kernels (or compiles them on
                    a first run), so the time is the fit's, not the JIT's (``warmup_s`` records it).
LinearSVC           ``LinearSVC(dual="auto")`` (C=1, scikit-learn's defaults).
Nystroem+LinearSVC  ``Pipeline([Nystroem(kernel="rbf", gamma=None, n_components=500, random_state=0),
                    LinearSVC(dual="auto")])``: ``gamma=None`` is scikit-learn's default ``1 / n_features``
                    (0.125 on cod-rna, 0.05 on the synthetic set), not tuned; ``--nystroem-gamma`` sets another.

Every (data set, n, method) point runs in a fresh Python process (this script with ``--worker``), so that
its peak resident memory is that point's alone: the interpreter, the imports, the data of the point (its
``n`` training rows, read from a ``.npy`` cache without mapping the rest of the pool), the scaling, the
fit and the prediction.  ``peak_rss_mib`` is ``VmHWM`` of ``/proc/self/status`` in the child, the
high-water mark of its own address space; ``rss_before_fit_mib`` is the same just before the fit.
``getrusage(RUSAGE_SELF).ru_maxrss`` is recorded too (``ru_maxrss_mib``) but not used: on Linux it keeps
the high-water mark of the address space the child replaced at ``exec``, i.e. the launching process's
resident size (a child of a 2 GiB parent reports 2 GiB before it does anything).

The data are generated or parsed once, by this process, into ``OUT/cache/`` (a self-ignoring folder), and
never timed. The child runs with ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and
``MWUMKL_NUM_THREADS`` set to ``--threads`` (default 1) before numpy is imported. Reported per point: fit
seconds (wall, ``time.perf_counter``, and the process's CPU time, ``time.process_time``; equal on one
thread on an idle machine), prediction seconds on the test set, test error, peak RSS in MiB, warnings
raised by the fit (e.g. LinearSVC's convergence warning), and MWUMKL's ``solver_``, ``C_``,
``selectivity_`` and the rows its weights were learnt on.

``--timeout S`` kills a point after S seconds of its process (recorded as ``timeout``); the larger sizes of
that method on that data set are then skipped (recorded as ``skipped``), since they would take longer.

Slopes: least-squares fit of ``log(fit seconds)`` on ``log(n)`` over the completed points with
``n >= 2*10^4`` (``slope``), and over ``2*10^4 <= n <= 3*10^5`` (``slope_2e4_3e5``, the issue's range).
The slope target is MWUMKL's ``slope`` <= 1.2 (on cod-rna that is the 2*10^4-3*10^5 range; on the
synthetic set it runs to 10^6).  At every ``n >= 10^5``: MWUMKL's wall time <= Nystroem+LinearSVC's, and
its test error <= Nystroem+LinearSVC's + 0.3 points; every check is printed and stored as met / NOT met.

``--smoke``: sizes 4,000 and 6,000 (the defaults' two-stage fit, from 3,001 rows), 1000 test rows, the
synthetic set only unless ``--datasets`` names cod-rna (then the real file when it is on disk, else
``datasets.synthetic_standin("cod-rna")``, labelled so); the slope and target thresholds fall to the
smallest size so that every code path runs.  It needs no data folder and takes well under a minute; its
timings mean nothing.

Writes into ``--out`` (default ``benchmarks/results/e7``): ``E7.json`` (every point, the settings, the
slopes and targets, the machine: CPU, cores, memory, Python, numpy, scikit-learn, numba, commit, load
average), ``E7.csv`` (one line per point), ``E7.md`` (a table per data set and the slopes and targets;
``benchmarks/report.py`` puts it into ``RESULTS.md`` as E7) and the figures ``e7_time.png`` (log-log fit
time, one panel per data set, slope in the legend), ``e7_error.png`` (test error, log n) and
``e7_memory.png`` (peak RSS, log-log).  Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SCRIPT = Path(__file__).resolve()
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

METHODS = ("MWUMKL", "LinearSVC", "Nystroem+LinearSVC")
DATASETS = ("cod-rna", "synthetic")
SIZES = {
    "cod-rna": (20_000, 50_000, 100_000, 200_000, 300_000),
    "synthetic": (20_000, 100_000, 300_000, 1_000_000),
}
N_TEST = {"cod-rna": 30_000, "synthetic": 50_000}
SMOKE_SIZES = (4_000, 6_000)
SMOKE_TEST = 1000
SEED = 0
NYSTROEM_COMPONENTS = 500
#: Slopes are fitted over the points with n >= SLOPE_MIN_N; the issue's range is TARGET_RANGE.
SLOPE_MIN_N = 20_000
TARGET_RANGE = (20_000, 300_000)
TARGET_SLOPE = 1.2
#: From this n on, MWUMKL must be no slower than Nystroem+LinearSVC and at most ERROR_MARGIN worse.
TARGET_MIN_N = 100_000
ERROR_MARGIN = 0.003
SYNTH_FEATURES = 20
SYNTH_NOISE = 0.05
SYNTH_CHUNK = 100_000
#: Bumped whenever the cached data of a recipe would change.
RECIPE_VERSION = 1
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "MWUMKL_NUM_THREADS",
)
WARMUP_ROWS = {"two-stage": 1500, "mwu": 300}


# ----------------------------------------------------------------------------- data


def synthetic_labels(X: np.ndarray) -> np.ndarray:
    """The noiseless synthetic labels (+1/-1): a checkerboard on x0, x1 plus a radial term on x2, x3."""
    f = np.sin(2 * np.pi * X[:, 0]) * np.sin(2 * np.pi * X[:, 1])
    f += 2.0 * ((X[:, 2] - 0.5) ** 2 + (X[:, 3] - 0.5) ** 2 - 1.0 / 6.0)
    return np.where(f > 0, 1.0, -1.0)


def synthetic_chunk(seed: int, part: int, index: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[index * SYNTH_CHUNK, index * SYNTH_CHUNK + rows)`` of stream ``part`` (0 train, 1 test)."""
    rng = np.random.default_rng([seed, part, index])
    X = rng.random((SYNTH_CHUNK, SYNTH_FEATURES))[:rows]
    flip = (rng.random(SYNTH_CHUNK) < SYNTH_NOISE)[:rows]
    y = synthetic_labels(X)
    y[flip] = -y[flip]
    return X, y


def synthetic_rows(n: int, seed: int = SEED, part: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` rows of a synthetic stream (the same rows whatever ``n``)."""
    parts = [synthetic_chunk(seed, part, i, min(SYNTH_CHUNK, n - i * SYNTH_CHUNK)) for i in range(-(-n // SYNTH_CHUNK))]
    if not parts:
        return np.empty((0, SYNTH_FEATURES)), np.empty(0)
    return np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _write_synthetic(path: Path, n: int, seed: int, part: int) -> None:
    """Write ``n`` rows of a synthetic stream chunk by chunk (never all in memory)."""
    X_out = np.lib.format.open_memmap(path / f"X{part}.npy", mode="w+", dtype=np.float64, shape=(n, SYNTH_FEATURES))
    y_out = np.lib.format.open_memmap(path / f"y{part}.npy", mode="w+", dtype=np.float64, shape=(n,))
    for i in range(-(-n // SYNTH_CHUNK)):
        lo = i * SYNTH_CHUNK
        X, y = synthetic_chunk(seed, part, i, min(SYNTH_CHUNK, n - lo))
        X_out[lo : lo + len(y)] = X
        y_out[lo : lo + len(y)] = y
    X_out.flush()
    y_out.flush()
    del X_out, y_out


def _cache_root(out: Path) -> Path:
    root = out / "cache"
    root.mkdir(parents=True, exist_ok=True)
    ignore = root / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# E7's data cache and per-point files (bench_scale_n.py), never committed\n*\n")
    return root


def prepare_data(name: str, out: Path, *, pool: int, n_test: int, smoke: bool, datasets_dir=None) -> dict:
    """Generate or load ``name`` once into ``out/cache/<name>/`` (train pool ``X0/y0``, test ``X1/y1``).

    Returns the data set's description (rows, features, source, whether the points scale it). A cache
    made by the same recipe (and, for the synthetic set, with at least ``pool`` rows) is reused.
    """
    path = _cache_root(out) / name
    recipe = {"name": name, "version": RECIPE_VERSION, "seed": SEED, "n_test": n_test}
    if name == "synthetic":
        recipe.update(features=SYNTH_FEATURES, noise=SYNTH_NOISE, chunk=SYNTH_CHUNK)
    elif name == "cod-rna":
        recipe.update(standin_allowed=smoke, datasets_dir=None if datasets_dir is None else str(datasets_dir))
    else:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    meta_path = path / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("recipe") == recipe and (name != "synthetic" or meta["n_pool"] >= pool):
            return meta
    path.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)
    start = time.perf_counter()
    if name == "synthetic":
        _write_synthetic(path, pool, SEED, 0)
        _write_synthetic(path, n_test, SEED, 1)
        meta = {
            "n_pool": pool,
            "n_features": SYNTH_FEATURES,
            "scale": False,
            "source": "generated",
            "description": "generated: 20 uniform features, checkerboard(x0, x1) + radial(x2, x3), 5 % labels flipped",
        }
    else:
        from benchmarks import datasets as D

        ds = D.load_or_standin("cod-rna", datasets_dir, allow_standin=smoke)
        X, y = ds.combined()
        X, y = np.ascontiguousarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
        perm = np.random.default_rng(SEED).permutation(len(y))
        test, train = perm[:n_test], perm[n_test:]
        np.save(path / "X1.npy", X[test])
        np.save(path / "y1.npy", y[test])
        np.save(path / "X0.npy", X[train])
        np.save(path / "y0.npy", y[train])
        meta = {
            "n_pool": len(train),
            "n_features": X.shape[1],
            "scale": True,
            "source": ds.source,
            "description": (
                f"LIBSVM's training and test files pooled ({len(y)} rows, from {ds.source}), shuffled with seed {SEED}"
                if ds.source != "synthetic"
                else f"SYNTHETIC STAND-IN, not cod-rna ({len(y)} rows; {ds.note})"
            ),
        }
        del X, y
    meta.update(recipe=recipe, n_test=n_test, prepare_s=round(time.perf_counter() - start, 2))
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def read_rows(path: Path, n: int | None = None) -> np.ndarray:
    """The first ``n`` rows of a ``.npy`` file, read into memory without mapping the rest of the file."""
    mm = np.load(path, mmap_mode="r")
    shape, dtype, offset = mm.shape, mm.dtype, mm.offset
    del mm
    n = shape[0] if n is None else min(int(n), shape[0])
    row = int(np.prod(shape[1:], dtype=np.int64))
    data = np.fromfile(path, dtype=dtype, count=n * row, offset=offset)
    return data.reshape((n, *shape[1:]))


# ----------------------------------------------------------------------------- one point (the child)


def _ru_maxrss_mib() -> float:
    """``getrusage(RUSAGE_SELF).ru_maxrss`` in MiB (KiB on Linux, bytes on macOS).

    On Linux it is at least the *launching* process's resident size: the kernel carries the old address
    space's high-water mark over ``exec`` (measured: a child of a 2 GiB parent reports 2 GiB before doing
    anything), so it is recorded, not used.
    """
    import resource

    scale = 1.0 / 2**20 if sys.platform == "darwin" else 1.0 / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _peak_rss_mib() -> float:
    """This process's peak resident memory in MiB: ``VmHWM`` of ``/proc/self/status`` (the high-water mark of
    its own address space since ``exec``), else :func:`_ru_maxrss_mib` where there is no ``/proc``."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return _ru_maxrss_mib()


def make_estimator(method: str, nystroem_gamma=None):
    """The estimator of ``method``, as every point fits it."""
    if method == "MWUMKL":
        from mwumkl_dist import MWUMKLClassifier

        return MWUMKLClassifier()
    from sklearn.svm import LinearSVC

    if method == "LinearSVC":
        return LinearSVC(dual="auto")
    if method == "Nystroem+LinearSVC":
        from sklearn.kernel_approximation import Nystroem
        from sklearn.pipeline import Pipeline

        nys = Nystroem(kernel="rbf", gamma=nystroem_gamma, n_components=NYSTROEM_COMPONENTS, random_state=0)
        return Pipeline([("nystroem", nys), ("svc", LinearSVC(dual="auto"))])
    raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")


def _warm_up(Xtr, ytr, Xte) -> tuple[float, str]:
    """An untimed small MWUMKL fit with the solver the defaults will pick: numba's kernels loaded or compiled."""
    from mwumkl_dist import MWUMKLClassifier

    try:
        from mwumkl_dist.solvers.two_stage import AUTO_TWO_STAGE_POINTS
    except ImportError:  # pragma: no cover - the constant moved
        AUTO_TWO_STAGE_POINTS = 10_000
    solver = "two-stage" if len(ytr) >= AUTO_TWO_STAGE_POINTS else "mwu"
    m = min(len(ytr), WARMUP_ROWS[solver])
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MWUMKLClassifier(C=1.0, solver=solver).fit(Xtr[:m], ytr[:m]).predict(Xte[:100])
    return time.perf_counter() - start, solver


def _threads_seen(method: str) -> dict:
    from threadpoolctl import threadpool_info

    seen = {
        "blas_threads": max(
            (p.get("num_threads", 0) for p in threadpool_info() if p.get("user_api") == "blas"), default=None
        )
    }
    if method == "MWUMKL":
        from mwumkl_dist.devices import threads

        seen["mwumkl_threads"] = threads.current_threads()
    return seen


def run_worker(spec: dict) -> dict:
    """Fit one point in this process (a fresh one: see :func:`run_point`) and return its measurements."""
    t_start = time.perf_counter()
    data = Path(spec["data"])
    n, method = int(spec["n"]), spec["method"]
    Xtr, ytr = read_rows(data / "X0.npy", n), read_rows(data / "y0.npy", n)
    Xte, yte = read_rows(data / "X1.npy"), read_rows(data / "y1.npy")
    if spec["scale"]:
        from sklearn.preprocessing import MinMaxScaler

        scaler = MinMaxScaler().fit(Xtr)
        Xtr, Xte = scaler.transform(Xtr), scaler.transform(Xte)
    row = {"n_rows_read": len(ytr), "load_s": time.perf_counter() - t_start}
    if method == "MWUMKL":
        row["warmup_s"], row["warmup_solver"] = _warm_up(Xtr, ytr, Xte)
    est = make_estimator(method, spec.get("nystroem_gamma"))
    gc.collect()
    row["rss_before_fit_mib"] = _peak_rss_mib()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wall, cpu = time.perf_counter(), time.process_time()
        est.fit(Xtr, ytr)
        row["fit_wall_s"] = time.perf_counter() - wall
        row["fit_cpu_s"] = time.process_time() - cpu
    start = time.perf_counter()
    pred = est.predict(Xte)
    row["predict_s"] = time.perf_counter() - start
    row["error"] = float(np.mean(pred != yte))
    row["peak_rss_mib"] = _peak_rss_mib()
    row["ru_maxrss_mib"] = _ru_maxrss_mib()
    row["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught})
    row.update(_threads_seen(method))
    if method == "MWUMKL":
        row["solver"] = est.solver_
        row["C"] = float(est.C_)
        row["selectivity"] = est.selectivity_ if isinstance(est.selectivity_, str) else float(est.selectivity_)
        row["n_support"] = int(len(est.support_))
        row["weight_points"] = int(getattr(est, "weight_points_", len(ytr)))
    return row


def _worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    row = run_worker(spec)
    Path(spec["result"]).write_text(json.dumps(row))
    return 0


# ----------------------------------------------------------------------------- one point (the parent)


def child_env(threads: int) -> dict:
    """This process's environment with every thread pool of the child set to ``threads``."""
    env = dict(os.environ)
    for var in THREAD_VARS:
        env[var] = str(threads)
    root = str(HERE.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_point(dataset: str, meta: dict, n: int, method: str, out: Path, *, threads: int, timeout, gamma) -> dict:
    """Run one (data set, n, method) point in a fresh process; its row (status ok / timeout / failed)."""
    points = _cache_root(out) / "points"
    points.mkdir(exist_ok=True)
    stem = f"{dataset}_{n}_{method.replace('+', '_')}"
    spec = {
        "data": str(_cache_root(out) / dataset),
        "n": n,
        "method": method,
        "scale": meta["scale"],
        "nystroem_gamma": gamma,
        "result": str(points / f"{stem}.result.json"),
    }
    Path(spec["result"]).unlink(missing_ok=True)
    spec_path = points / f"{stem}.spec.json"
    spec_path.write_text(json.dumps(spec))
    row = {"dataset": dataset, "method": method, "n": n, "n_test": meta["n_test"], "n_features": meta["n_features"]}
    start = time.perf_counter()
    with open(points / f"{stem}.log", "w") as log:
        try:
            proc = subprocess.run(
                [sys.executable, str(SCRIPT), "--worker", str(spec_path)],
                env=child_env(threads),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    row["process_s"] = time.perf_counter() - start
    if rc is None:
        row["status"] = "timeout"
        row["note"] = f"killed after {timeout:g} s"
    elif rc != 0 or not Path(spec["result"]).is_file():
        tail = (points / f"{stem}.log").read_text(errors="replace").strip().splitlines()[-3:]
        row["status"] = "failed"
        row["note"] = f"exit status {rc}" + (" (killed: out of memory?)" if rc == -9 else "") + ": " + " | ".join(tail)
    else:
        row["status"] = "ok"
        row.update(json.loads(Path(spec["result"]).read_text()))
    return row


# ----------------------------------------------------------------------------- summary


def _completed(rows, dataset: str, method: str, key: str) -> list[tuple[int, float]]:
    """``(n, row[key])`` of the completed points of one method on one data set, by n."""
    return sorted((r["n"], r[key]) for r in rows if (r["dataset"], r["method"], r["status"]) == (dataset, method, "ok"))


def fit_slope(points) -> float | None:
    """Least-squares slope of ``log(seconds)`` on ``log(n)``; None with fewer than two distinct sizes."""
    pts = [(n, s) for n, s in points if s is not None and s > 0]
    if len({n for n, _ in pts}) < 2:
        return None
    x = np.log([n for n, _ in pts])
    y = np.log([s for _, s in pts])
    return float(np.polyfit(x, y, 1)[0])


def summarise(rows: list[dict], settings: dict) -> dict:
    """Slopes per (data set, method) and the issue's targets."""
    slope_min, (lo, hi) = settings["slope_min_n"], settings["target_range"]
    slopes, targets = {}, []
    for dataset in settings["datasets"]:
        slopes[dataset] = {}
        for method in settings["methods"]:
            ok = _completed(rows, dataset, method, "fit_wall_s")
            slopes[dataset][method] = {
                "slope": fit_slope([p for p in ok if p[0] >= slope_min]),
                "slope_2e4_3e5": fit_slope([p for p in ok if lo <= p[0] <= hi]),
                "points": len([p for p in ok if p[0] >= slope_min]),
            }
        mw = slopes[dataset].get("MWUMKL", {}).get("slope")
        slopes[dataset]["slope_target_met"] = None if mw is None else bool(mw <= TARGET_SLOPE)
        for n in sorted({r["n"] for r in rows if r["dataset"] == dataset}):
            if n < settings["target_min_n"]:
                continue
            by = {r["method"]: r for r in rows if r["dataset"] == dataset and r["n"] == n}
            m, y = by.get("MWUMKL"), by.get("Nystroem+LinearSVC")
            if m is None or y is None:
                continue
            t = {"dataset": dataset, "n": n, "time_met": None, "error_met": None}
            if m["status"] == "ok":
                t["mwumkl_s"], t["mwumkl_error"] = m["fit_wall_s"], m["error"]
                if y["status"] == "ok":
                    t["nystroem_s"], t["nystroem_error"] = y["fit_wall_s"], y["error"]
                    t["time_met"] = bool(m["fit_wall_s"] <= y["fit_wall_s"])
                    t["error_met"] = bool(m["error"] <= y["error"] + ERROR_MARGIN)
                elif y["status"] == "timeout":
                    t["time_met"] = True  # Nystroem+LinearSVC ran past the timeout MWUMKL stayed within
                    t["note"] = "Nystroem+LinearSVC timed out"
            else:
                t["time_met"] = False if y["status"] == "ok" else None
                t["note"] = f"MWUMKL {m['status']}"
            targets.append(t)
    return {"slopes": slopes, "targets": targets}


# ----------------------------------------------------------------------------- outputs


def _fmt_s(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _fmt_slope(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _yes(v) -> str:
    return "n/a" if v is None else ("met" if v else "NOT met")


def _cell(r) -> str:
    if r is None:
        return "-"
    if r["status"] != "ok":
        return r["status"]
    return f"{_fmt_s(r['fit_wall_s'])} / {100 * r['error']:.2f} / {r['peak_rss_mib']:.0f}"


def markdown(doc: dict) -> str:
    """E7.md: a table per data set (time / error / peak memory per method), its slopes and targets."""
    st, rows, summary = doc["settings"], doc["rows"], doc["summary"]
    methods = st["methods"]
    lines = []
    for dataset in st["datasets"]:
        meta = st["data"][dataset]
        lines += [
            f"**{dataset}**: {meta['description']}; {meta['n_pool']} training rows available, {meta['n_test']} test "
            f"rows, {meta['n_features']} features"
            + (" (min-max scaled on each point's training rows)." if meta["scale"] else "."),
            "",
            "| n | " + " | ".join(f"{m} s / error % / peak MiB" for m in methods) + " | MWUMKL solver |",
            "|---|" + "---|" * (len(methods) + 1),
        ]
        for n in sorted({r["n"] for r in rows if r["dataset"] == dataset}):
            by = {r["method"]: r for r in rows if r["dataset"] == dataset and r["n"] == n}
            solver = by.get("MWUMKL", {}).get("solver", "-")
            lines.append(f"| {n} | " + " | ".join(_cell(by.get(m)) for m in methods) + f" | {solver} |")
        sl = summary["slopes"][dataset]
        lines += [
            "",
            f"Fitted slopes of log(fit time) on log(n), n >= {st['slope_min_n']}: "
            + "; ".join(f"{m} {_fmt_slope(sl[m]['slope'])}" for m in methods)
            + f". From {st['target_range'][0]} to {st['target_range'][1]}: "
            + "; ".join(f"{m} {_fmt_slope(sl[m]['slope_2e4_3e5'])}" for m in methods)
            + ".",
        ]
        if "MWUMKL" in methods:
            lines += ["", f"Target: MWUMKL slope <= {TARGET_SLOPE}: {_yes(sl['slope_target_met'])}."]
        mine = [t for t in summary["targets"] if t["dataset"] == dataset]
        if mine:
            lines += [
                "",
                f"Targets at n >= {st['target_min_n']} (MWUMKL against Nystroem+LinearSVC):",
                "",
                "| n | MWUMKL s | Nystroem+LinearSVC s | time <= | MWUMKL error % | Nystroem error % | "
                f"error <= Nystroem + {100 * ERROR_MARGIN:.1f} |",
                "|---|---|---|---|---|---|---|",
            ]
            for t in mine:
                err = [t.get("mwumkl_error"), t.get("nystroem_error")]
                lines.append(
                    f"| {t['n']} | {_fmt_s(t.get('mwumkl_s'))} | {_fmt_s(t.get('nystroem_s'))} | {_yes(t['time_met'])} "
                    + "".join(f"| {'-' if e is None else f'{100 * e:.2f}'} " for e in err)
                    + f"| {_yes(t['error_met'])}"
                    + (f" ({t['note']})" if t.get("note") else "")
                    + " |"
                )
        lines.append("")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict]) -> None:
    from benchmarks.common import write_csv as write_rows

    write_rows(path, rows, lambda v: "; ".join(v) if isinstance(v, list) else v)


STYLES = {"MWUMKL": "r-o", "LinearSVC": "b-s", "Nystroem+LinearSVC": "g-^"}


def figures(out: Path, doc: dict) -> list[str]:
    """e7_time.png, e7_error.png, e7_memory.png: one panel per data set, a line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st, rows, slopes = doc["settings"], doc["rows"], doc["summary"]["slopes"]
    datasets = st["datasets"]
    names = []
    for key, ylabel, loglog in (
        ("fit_wall_s", "fit time (s)", True),
        ("error", "test error (%)", False),
        ("peak_rss_mib", "peak RSS (MiB)", True),
    ):
        fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 4), squeeze=False)
        for ax, dataset in zip(axes[0], datasets):
            for method in st["methods"]:
                pts = _completed(rows, dataset, method, key)
                if not pts:
                    continue
                label = method
                if key == "fit_wall_s":
                    label += f" (slope {_fmt_slope(slopes[dataset][method]['slope'])})"
                scale = 100.0 if key == "error" else 1.0
                ax.plot([p[0] for p in pts], [scale * p[1] for p in pts], STYLES.get(method, "k-"), ms=4, label=label)
                if key == "fit_wall_s" and method == "MWUMKL":
                    n0, t0 = pts[0]
                    ns = np.array([n0, pts[-1][0]], dtype=float)
                    ax.plot(
                        ns, t0 * (ns / n0) ** TARGET_SLOPE, "k:", lw=1, label=f"n^{TARGET_SLOPE} from MWUMKL's first"
                    )
            ax.set_xscale("log")
            if loglog:
                ax.set_yscale("log")
            ax.set_title(dataset)
            ax.set_xlabel("training rows n")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        fig.tight_layout()
        name = {"fit_wall_s": "e7_time.png", "error": "e7_error.png", "peak_rss_mib": "e7_memory.png"}[key]
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


# ----------------------------------------------------------------------------- driver


def _sizes_for(dataset: str, args_sizes, smoke: bool, pool: int | None = None) -> list[int]:
    sizes = list(args_sizes) if args_sizes else list(SMOKE_SIZES if smoke else SIZES[dataset])
    if pool is not None:
        sizes = [min(n, pool) for n in sizes]
    return sorted(set(sizes))


def run(
    out: Path,
    *,
    datasets=("cod-rna", "synthetic"),
    sizes=None,
    methods=METHODS,
    smoke: bool = False,
    threads: int = 1,
    timeout: float | None = None,
    datasets_dir=None,
    nystroem_gamma: float | None = None,
) -> dict:
    """Run E7 and write its outputs into ``out``; returns the JSON document."""
    from benchmarks.common import run_info

    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    info = run_info()  # now: the results describe the code this run loaded, not a later checkout
    info["load_average_start"] = list(os.getloadavg())
    settings = {
        "smoke": smoke,
        "datasets": list(datasets),
        "methods": list(methods),
        "threads": threads,
        "timeout_s": timeout,
        "seed": SEED,
        "nystroem": {
            "kernel": "rbf",
            "gamma": nystroem_gamma,
            "gamma_note": "None = scikit-learn's default 1 / n_features" if nystroem_gamma is None else "given",
            "n_components": NYSTROEM_COMPONENTS,
            "random_state": 0,
        },
        "linearsvc": {"C": 1.0, "dual": "auto"},
        "mwumkl": "MWUMKLClassifier() (defaults); untimed warm-up fit (C=1, the solver the defaults pick) first",
        "slope_min_n": SLOPE_MIN_N,
        "target_range": list(TARGET_RANGE),
        "target_slope": TARGET_SLOPE,
        "target_min_n": TARGET_MIN_N,
        "error_margin": ERROR_MARGIN,
        "sizes": {},
        "data": {},
    }
    rows = []
    for dataset in datasets:
        wanted = _sizes_for(dataset, sizes, smoke)
        n_test = SMOKE_TEST if smoke else N_TEST[dataset]
        meta = prepare_data(dataset, out, pool=max(wanted), n_test=n_test, smoke=smoke, datasets_dir=datasets_dir)
        settings["data"][dataset] = {k: v for k, v in meta.items() if k != "recipe"}
        if nystroem_gamma is None:
            settings["data"][dataset]["nystroem_gamma"] = 1.0 / meta["n_features"]
        run_sizes = _sizes_for(dataset, sizes, smoke, meta["n_pool"])
        settings["sizes"][dataset] = run_sizes
        print(f"# {dataset}: {meta['description']}; sizes {run_sizes}; methods {', '.join(methods)}", flush=True)
        stopped: dict = {}
        for n in run_sizes:
            for method in methods:
                if method in stopped:
                    row = {"dataset": dataset, "method": method, "n": n, "n_test": meta["n_test"]}
                    row.update(n_features=meta["n_features"], status="skipped", note=stopped[method])
                else:
                    row = run_point(
                        dataset, meta, n, method, out, threads=threads, timeout=timeout, gamma=nystroem_gamma
                    )
                    if row["status"] in ("timeout", "failed"):
                        stopped[method] = f"{row['status']} at n={n}"
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "warnings"}), flush=True)
    if smoke:  # every code path runs at the smoke sizes
        smallest = min(min(s) for s in settings["sizes"].values())
        settings["slope_min_n"] = settings["target_min_n"] = smallest
    info["load_average_end"] = list(os.getloadavg())
    doc = {
        "experiment": "E7",
        "title": "scale in n: time, test error and peak memory versus the training size",
        "command": info.get("command"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 2),
        "machine": info,
        "settings": settings,
        "rows": rows,
    }
    doc["summary"] = summarise(rows, settings)
    doc["figures"] = figures(out, doc)
    (out / "E7.json").write_text(json.dumps(doc, indent=1))
    write_csv(out / "E7.csv", rows)
    (out / "E7.md").write_text(markdown(doc))
    print_summary(doc)
    return doc


def print_summary(doc: dict) -> None:
    st, summary = doc["settings"], doc["summary"]
    for dataset in st["datasets"]:
        sl = summary["slopes"][dataset]
        print(
            f"{dataset}: slopes (n >= {st['slope_min_n']}) "
            + ", ".join(f"{m} {_fmt_slope(sl[m]['slope'])}" for m in st["methods"])
            + (f"; MWUMKL slope <= {TARGET_SLOPE}: {_yes(sl['slope_target_met'])}" if "MWUMKL" in st["methods"] else "")
        )
        for t in summary["targets"]:
            if t["dataset"] == dataset:
                note = f" ({t['note']})" if t.get("note") else ""
                print(
                    f"  n={t['n']}: time <= Nystroem+LinearSVC {_yes(t['time_met'])}; error <= Nystroem + "
                    f"{100 * ERROR_MARGIN:.1f} points {_yes(t['error_met'])}{note}"
                )
    print(f"wrote {', '.join(['E7.json', 'E7.csv', 'E7.md', *doc['figures']])}", flush=True)


def _size(text: str) -> int:
    value = float(text)
    if value < 2 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a training size: {text!r}")
    return int(value)


def _csv_list(known):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in known]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad) or 'empty list'}; known: {', '.join(known)}")
        return items

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python benchmarks/bench_scale_n.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--smoke", action="store_true", help="sizes 4000 and 6000, 1000 test rows, synthetic data: seconds")
    p.add_argument(
        "--datasets",
        type=_csv_list(DATASETS),
        default=None,
        help="comma-separated, from cod-rna, synthetic (default: both; with --smoke: synthetic)",
    )
    p.add_argument(
        "--sizes",
        type=lambda s: [_size(t) for t in s.split(",") if t.strip()],
        default=None,
        help="training sizes for every data set, e.g. 2e4,5e4 (default: the data set's; capped at its pool)",
    )
    p.add_argument("--methods", type=_csv_list(METHODS), default=list(METHODS), help=f"default: {','.join(METHODS)}")
    p.add_argument("--threads", type=int, default=1, help="threads of every fit (BLAS, OpenMP, MWUMKL); default 1")
    p.add_argument("--timeout", type=float, default=None, help="seconds per point; larger sizes of that method skipped")
    p.add_argument("--nystroem-gamma", type=float, default=None, help="default: scikit-learn's 1 / n_features")
    p.add_argument("--datasets-dir", default=None, help="default: the benchmarks' (../shared/datasets if present)")
    p.add_argument("--out", default=str(HERE / "results" / "e7"), help="output folder (default benchmarks/results/e7)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return _worker_main(args.worker)
    if args.threads < 1:
        raise SystemExit("--threads must be at least 1")
    datasets = args.datasets or (["synthetic"] if args.smoke else list(DATASETS))
    run(
        Path(args.out),
        datasets=datasets,
        sizes=args.sizes,
        methods=args.methods,
        smoke=args.smoke,
        threads=args.threads,
        timeout=args.timeout,
        datasets_dir=args.datasets_dir,
        nystroem_gamma=args.nystroem_gamma,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""E8, against a tuned RBF SVM: the default estimator's test error next to a grid-searched ``SVC(kernel="rbf")``.

``python benchmarks/bench_e8.py [--smoke] [--datasets sonar,heart,...] [--methods ...] [--splits K]
[--max-train N | set=N,...] [--max-test N | set=N,...] [--threads 1] [--datasets-dir DIR] [--out DIR]``
(or ``python -m benchmarks.bench_e8 ...``)

The issue's question (issue 20, item 5): how far is ``MWUMKLClassifier()``, with no arguments, from the
baseline every practitioner tries first, an RBF SVM whose ``C`` and ``gamma`` are tuned by cross-validation?

Data sets: every set of the shared data folder (``--datasets-dir``, default ``../shared/datasets``): sonar,
ionosphere, heart, breast_cancer, german.numer, banana, twonorm, ringnorm, svmguide1, magic04, mushrooms,
a9a, cod-rna.  They are read by ``benchmarks/datasets.py`` (checked against the sha256 of the package's
``benchmarks/MANIFEST.json``, or of the data folder's own ``MANIFEST.json`` for the sets the package's
manifest does not list); labels are -1 / +1.

Protocol, the same for every method (all methods see the same training and test rows):

* sets with an official test file (a9a, cod-rna, svmguide1): the official training / test split.  It is
  one split; when ``--max-train`` subsamples its training file, ``--splits`` repetitions each draw their
  own stratified subsample (seed ``seed + i``), so the paired statistics have several splits;
* every other set: ``--splits`` stratified random 75/25 splits (``StratifiedShuffleSplit``, seed ``--seed``);
* ``--max-train N`` (one number for every set, or ``set=N`` per set, e.g. ``banana=1000,a9a=3000``): a
  stratified random subsample of N rows of the training part (seed ``seed + i`` for split ``i``);
  ``--max-test`` likewise for the test part (for the large official test files).  Both are recorded in
  the outputs, per set (``n_train`` / ``n_test`` of every row);
* a ``MinMaxScaler(clip=True)`` fitted on the (subsampled) training part maps every feature to [0, 1]
  (test values outside the training range are clipped to it);
* every fit runs on ``--threads`` threads (default 1: BLAS through threadpoolctl, the library's numba
  threads through ``mwumkl_dist.threads.thread_limit``; scikit-learn's searches with ``n_jobs=None``).

Methods:

MWUMKL                  ``MWUMKLClassifier()`` with the package's defaults, whatever they are when run (no
                        argument is passed: kernels, C, epsilon, selectivity, solver are the defaults' own
                        choices, their cross-validation inside the timed fit).  Recorded per split: the
                        number of kernels (``len(kernel_names_)``) and their names, ``C_``, ``selectivity_``,
                        ``epsilon_``, ``solver_``, ``polished_``, ``fit_warnings_``, the band of widths
                        (``width_band_``) when one was chosen, and any warning raised.
                        An untimed warm-up fit on 100 generated points first loads numba's compiled kernels.
SVC-RBF                 ``GridSearchCV(SVC(kernel="rbf"), {"C": 10^-2 ... 10^4 (7 values), "gamma": 2^-4 ...
                        2^4 (9 values) times g0}, cv=5)`` on the training part, ``g0 = 1 / (d var X)`` of the
                        scaled training part (scikit-learn's ``gamma="scale"``); 315 fits plus the refit, all
                        inside the fit time.  It is the reference of every paired comparison.
EasyMKL                 Aiolli & Donini's EasyMKL as ``benchmarks/bench_selection.py`` (E6) implements it
                        (``easymkl_weights``, lambda from 0.1, 0.3, 0.5 by 3-fold CV, then SVC(C=100) on the
                        combined trace-normalised kernel), on the same kernels the MWUMKL default fit used on
                        that split (its ``kernel_names_``; the defaults' kernels when MWUMKL is not run).
                        It holds ``m`` n x n matrices, so it is skipped above ``--easymkl-max-train`` rows
                        (default 3000).  Predictions are computed in blocks of test rows.
Nystroem500+LinearSVC   ``Nystroem(kernel="rbf", gamma=g0, n_components=500, random_state=0)`` +
Nystroem2000+LinearSVC  ``LinearSVC(dual="auto")`` (C=1, not tuned); 2000 components for the second
                        (at most the training rows: Nystroem then uses them all).
LinearSVC               ``LinearSVC(dual="auto")`` (C=1, scikit-learn's defaults).

Reported per set and method: mean and median test error over the splits; the paired difference to
SVC-RBF on the same splits (method's error minus the SVC's) with its mean and standard error
(sample standard deviation / sqrt(k), none for one split); paired wins / ties / losses against the SVC:
a *tie* is a split where the two test errors differ by at most 0.5 percentage points (``TIE``), a *win*
one where the method's error is lower by more, a *loss* higher by more; on test sets under 200 rows one
misclassified point is more than 0.5 points, so there a tie means the same number of errors.  Fit time =
wall-clock seconds of ``fit`` including the method's own search (MWUMKL's built-in cross-validation,
the SVC's grid search, EasyMKL's lambda search and kernel matrices); CPU seconds and prediction seconds
are recorded too.

Writes into ``--out`` (default ``benchmarks/results/e8``): ``E8.json`` (settings, machine, command, commit,
load average, every row, the summary), ``E8.csv`` (one line per (set, split, method)), ``E8_summary.csv``
(one line per (set, method)), ``E8.md`` (the tables; ``benchmarks/report.py`` puts it into ``RESULTS.md``)
and ``e8_error.png`` (each method's test error minus the SVC's, per set, mean with standard error bars).
Measurements are journalled in ``E8.partial.jsonl`` as they finish; an interrupted run with the same
settings resumes from it.

``--smoke``: generated data (never the data folder), 2 splits on small stand-ins of the chosen sets
(default heart and svmguide1, one of each protocol): every code path in well under a minute; its
numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # run as a script: make the benchmarks package importable

METHODS = (
    "MWUMKL",
    "SVC-RBF",
    "EasyMKL",
    "Nystroem500+LinearSVC",
    "Nystroem2000+LinearSVC",
    "LinearSVC",
)
REFERENCE = "SVC-RBF"
DATASETS = (
    "sonar",
    "ionosphere",
    "heart",
    "breast_cancer",
    "german.numer",
    "banana",
    "twonorm",
    "ringnorm",
    "svmguide1",
    "magic04",
    "mushrooms",
    "a9a",
    "cod-rna",
)
#: Sets with an official test file: their official split is used.
OFFICIAL = ("a9a", "cod-rna", "svmguide1")
SMALL = ("sonar", "ionosphere", "heart", "breast_cancer", "german.numer", "banana")
SPLITS = 10
TEST_SIZE = 0.25
SVC_C_GRID = tuple(10.0**k for k in range(-2, 5))
SVC_GAMMA_FACTORS = tuple(2.0**k for k in range(-4, 5))
SVC_CV = 5
NYSTROEM = {"Nystroem500+LinearSVC": 500, "Nystroem2000+LinearSVC": 2000}
#: A tie: test errors within this much (0.5 percentage points).
TIE = 0.005
EASYMKL_MAX_TRAIN = 3000
#: Kernel values per EasyMKL prediction block (m * rows * n_train doubles).
EASYMKL_BLOCK_VALUES = 20_000_000
SMOKE_DATASETS = ("heart", "svmguide1")
SMOKE_SPLITS = 2
SMOKE_ROWS = 160
SMOKE_TEST_ROWS = 80
SMOKE_MAX_FEATURES = 8
MEASURES = ("error", "fit_s")


# ----------------------------------------------------------------------------- data


def _manifest(datasets_dir) -> dict:
    """The package's manifest, plus the data folder's entries for the sets the package does not list."""
    from benchmarks import datasets as D

    manifest = D.load_manifest()
    folder = Path(datasets_dir) if datasets_dir is not None else D.default_datasets_dir()
    if folder is not None and (folder / "MANIFEST.json").is_file():
        shared = D.load_manifest(folder / "MANIFEST.json")
        manifest = {**shared, **manifest}
    return manifest


def smoke_data(name: str, seed: int = 0):
    """A small generated stand-in of ``name`` (labelled so): a training part and, for OFFICIAL sets, a test part."""
    from sklearn.datasets import make_classification

    from benchmarks import datasets as D

    n = SMOKE_ROWS + (SMOKE_TEST_ROWS if name in OFFICIAL else 0)
    X, t = make_classification(
        n_samples=n,
        n_features=SMOKE_MAX_FEATURES,
        n_informative=3,
        n_redundant=1,
        n_clusters_per_class=2,
        flip_y=0.05,
        random_state=seed + sum(map(ord, name)),
    )
    y = np.where(t == 1, 1.0, -1.0)
    note = "smoke: generated (make_classification), not the real data"
    if name in OFFICIAL:
        return D.Dataset(name, X[:SMOKE_ROWS], y[:SMOKE_ROWS], X[SMOKE_ROWS:], y[SMOKE_ROWS:], "synthetic", note)
    return D.Dataset(name, X, y, source="synthetic", note=note)


def load(name: str, datasets_dir, smoke: bool):
    from benchmarks import datasets as D

    if smoke:
        return smoke_data(name)
    manifest = _manifest(datasets_dir)
    if name not in manifest:
        raise SystemExit(
            f"{name}: not in benchmarks/MANIFEST.json nor in a data folder's MANIFEST.json "
            f"(--datasets-dir {datasets_dir or D.default_datasets_dir()})"
        )
    ds = D.load_dataset(name, datasets_dir, download=False, manifest=manifest)
    X = np.asarray(ds.X.toarray() if hasattr(ds.X, "toarray") else ds.X, dtype=np.float64)
    ds.X = X
    if ds.X_test is not None:
        ds.X_test = np.asarray(ds.X_test.toarray() if hasattr(ds.X_test, "toarray") else ds.X_test, dtype=np.float64)
    return ds


def _subsample(idx: np.ndarray, y: np.ndarray, cap, seed: int) -> np.ndarray:
    """A stratified random subsample of ``cap`` of the rows ``idx`` (all of them when ``cap`` is None or larger)."""
    if cap is None or cap >= len(idx):
        return idx
    from sklearn.model_selection import train_test_split

    keep, _ = train_test_split(idx, train_size=int(cap), random_state=seed, stratify=y[idx])
    return np.sort(keep)


def make_splits(ds, n_splits: int, seed: int, max_train=None, max_test=None) -> list[dict]:
    """The splits of one set: ``{"split", "protocol", "train", "test", "test_file"}`` (index arrays).

    ``test_file`` says whether ``test`` indexes the official test file (``ds.X_test``) or ``ds.X``.
    """
    from sklearn.model_selection import StratifiedShuffleSplit

    out = []
    if ds.X_test is not None:
        tr_all, te_all = np.arange(len(ds.y)), np.arange(len(ds.y_test))
        repeats = n_splits if (max_train is not None and max_train < len(tr_all)) else 1
        repeats = max(repeats, n_splits if (max_test is not None and max_test < len(te_all)) else 1)
        for i in range(repeats):
            out.append(
                {
                    "split": i,
                    "protocol": "official",
                    "train": _subsample(tr_all, ds.y, max_train, seed + i),
                    "test": _subsample(te_all, ds.y_test, max_test, seed + i),
                    "test_file": True,
                }
            )
        return out
    sss = StratifiedShuffleSplit(n_splits=n_splits, test_size=TEST_SIZE, random_state=seed)
    for i, (tr, te) in enumerate(sss.split(np.zeros(len(ds.y)), ds.y)):
        out.append(
            {
                "split": i,
                "protocol": "75/25",
                "train": _subsample(np.sort(tr), ds.y, max_train, seed + i),
                "test": _subsample(np.sort(te), ds.y, max_test, seed + i),
                "test_file": False,
            }
        )
    return out


def split_data(ds, split: dict):
    """Scaled ``Xtr, ytr, Xte, yte`` of one split (MinMaxScaler(clip=True) fitted on the training rows)."""
    from sklearn.preprocessing import MinMaxScaler

    Xtr, ytr = ds.X[split["train"]], ds.y[split["train"]]
    if split["test_file"]:
        Xte, yte = ds.X_test[split["test"]], ds.y_test[split["test"]]
    else:
        Xte, yte = ds.X[split["test"]], ds.y[split["test"]]
    scaler = MinMaxScaler(clip=True).fit(Xtr)
    return scaler.transform(Xtr), ytr, scaler.transform(Xte), yte


def gamma_scale(X: np.ndarray) -> float:
    """``1 / (d var X)`` (scikit-learn's ``gamma="scale"``), 1 for constant data."""
    v = float(X.var()) * X.shape[1]
    return 1.0 / v if v > 0 else 1.0


# ----------------------------------------------------------------------------- methods


def default_kernels(X) -> list[str]:
    """The kernel names of the estimator's default ``kernels`` on the training rows ``X`` (a scaled family
    takes its widths from them)."""
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.data.problems import make_training_input

    return list(make_training_input(X, np.zeros(X.shape[0]), MWUMKLClassifier().kernels, estimator=None).kernel_names)


def easymkl_fit(kernels, Xtr, ytr, seed: int) -> dict:
    """E6's EasyMKL (``bench_selection._easymkl``), its fit half: lambda by 3-fold CV, weights, SVC(C=100)."""
    from sklearn.svm import SVC

    from benchmarks import bench_selection as E6
    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.kernels.evaluation import kernel_traces

    kernels = list(kernels)
    traces = kernel_traces(KernelSet(kernels, Xtr.shape[1]), Xtr) / len(ytr)
    Ktr = E6._normalised(kernels, Xtr, Xtr, traces)

    def err(lam, a, b):
        eta = E6.easymkl_weights(Ktr[:, a][:, :, a], ytr[a], lam)
        K = np.einsum("r,rjk->jk", eta, Ktr)
        svc = SVC(kernel="precomputed", C=E6.EASY_SVC_C).fit(K[np.ix_(a, a)], ytr[a])
        return np.mean(svc.predict(K[np.ix_(b, a)]) != ytr[b])

    lam = E6._cv_pick(err, E6.EASY_LAMBDAS, ytr, seed)
    eta = E6.easymkl_weights(Ktr, ytr, lam)
    svc = SVC(kernel="precomputed", C=E6.EASY_SVC_C).fit(np.einsum("r,rjk->jk", eta, Ktr), ytr)
    return {"kernels": kernels, "traces": traces, "eta": eta, "lambda": lam, "svc": svc, "Xtr": Xtr}


def easymkl_predict(model: dict, Xte: np.ndarray) -> np.ndarray:
    """E6's EasyMKL prediction (``bench_selection._easymkl``), in blocks of test rows."""
    from benchmarks import bench_selection as E6

    m, n = len(model["kernels"]), len(model["Xtr"])
    block = max(1, EASYMKL_BLOCK_VALUES // (m * n))
    out = []
    for lo in range(0, len(Xte), block):
        K = E6._normalised(model["kernels"], Xte[lo : lo + block], model["Xtr"], model["traces"])
        out.append(model["svc"].predict(np.einsum("r,rjk->jk", model["eta"], K)))
    return np.concatenate(out) if out else np.empty(0)


def _svc_search(g0: float):
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    grid = {"C": list(SVC_C_GRID), "gamma": [g0 * f for f in SVC_GAMMA_FACTORS]}
    return GridSearchCV(SVC(kernel="rbf"), grid, cv=SVC_CV)


def _nystroem(n_components: int, g0: float, n_train: int):
    from sklearn.kernel_approximation import Nystroem
    from sklearn.pipeline import Pipeline
    from sklearn.svm import LinearSVC

    k = min(n_components, n_train)
    return Pipeline(
        [
            ("nystroem", Nystroem(kernel="rbf", gamma=g0, n_components=k, random_state=0)),
            ("svc", LinearSVC(dual="auto")),
        ]
    )


def fit_predict(method: str, Xtr, ytr, Xte, *, seed: int, kernels=None, easymkl_max_train=EASYMKL_MAX_TRAIN) -> dict:
    """Fit ``method`` (its search included, timed), predict ``Xte``; returns the measurements and ``pred``."""
    from sklearn.svm import LinearSVC

    from mwumkl_dist import MWUMKLClassifier

    g0 = gamma_scale(Xtr)
    row: dict = {}
    if method == "EasyMKL" and len(ytr) > easymkl_max_train:
        return {"status": "skipped", "note": f"EasyMKL above {easymkl_max_train} training rows (m n^2 memory)"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wall, cpu = time.perf_counter(), time.process_time()
        if method == "MWUMKL":
            est = MWUMKLClassifier().fit(Xtr, ytr)
        elif method == "SVC-RBF":
            est = _svc_search(g0).fit(Xtr, ytr)
        elif method == "EasyMKL":
            kernels = list(kernels) if kernels is not None else default_kernels(Xtr)
            est = easymkl_fit(kernels, Xtr, ytr, seed)
        elif method in NYSTROEM:
            est = _nystroem(NYSTROEM[method], g0, len(ytr)).fit(Xtr, ytr)
        elif method == "LinearSVC":
            est = LinearSVC(dual="auto").fit(Xtr, ytr)
        else:
            raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        row["fit_s"] = time.perf_counter() - wall
        row["fit_cpu_s"] = time.process_time() - cpu
        start = time.perf_counter()
        pred = easymkl_predict(est, Xte) if method == "EasyMKL" else est.predict(Xte)
        row["predict_s"] = time.perf_counter() - start
    row["status"] = "ok"
    row["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught})
    if method == "MWUMKL":
        sel = est.selectivity_
        row.update(
            n_kernels=len(est.kernel_names_),
            kernel_names=list(est.kernel_names_),
            C=float(est.C_),
            selectivity=sel if isinstance(sel, str) else float(sel),
            epsilon=float(est.epsilon_),
            solver=est.solver_,
            polished=bool(getattr(est, "polished_", False)),
            fit_warnings=list(getattr(est, "fit_warnings_", []) or []),
            n_support=int(len(est.support_)),
        )
        band = getattr(est, "width_band_", None)
        if band is not None:  # a band of widths won selectivity="auto"
            row["width_band"] = f"{band['first']}-{band['last']} of {band['widths']}"
    elif method == "SVC-RBF":
        best = est.best_params_
        row.update(
            C=float(best["C"]),
            gamma=float(best["gamma"]),
            gamma_factor=float(best["gamma"] / g0),
            gamma_scale=g0,
            cv_error=float(1.0 - est.best_score_),
            n_support=int(len(est.best_estimator_.support_)),
        )
    elif method == "EasyMKL":
        eta = est["eta"]
        row.update(
            n_kernels=len(est["kernels"]),
            kernels_from="MWUMKL fit" if kernels is not None else "defaults",
            lam=float(est["lambda"]),
            effective_kernels=float(1.0 / np.sum(eta**2)),
        )
    elif method in NYSTROEM:
        row.update(n_components=int(est.named_steps["nystroem"].n_components), gamma=g0)
    row["pred"] = pred
    return row


# ----------------------------------------------------------------------------- summary


def paired(errors: dict, reference: dict) -> dict:
    """Paired statistics of a method's errors against the reference's, over the splits both have."""
    common = sorted(set(errors) & set(reference))
    d = np.array([errors[s] - reference[s] for s in common], dtype=np.float64)
    k = len(d)
    eps = 1e-9
    return {
        "paired_splits": k,
        "mean_diff": float(d.mean()) if k else None,
        "se_diff": float(d.std(ddof=1) / math.sqrt(k)) if k > 1 else None,
        "wins": int(np.sum(d < -TIE - eps)),
        "ties": int(np.sum(np.abs(d) <= TIE + eps)),
        "losses": int(np.sum(d > TIE + eps)),
    }


def summarise(rows: list[dict], datasets, methods) -> list[dict]:
    out = []
    for name in datasets:
        ref = {r["split"]: r["error"] for r in rows if r["dataset"] == name and r["method"] == REFERENCE and _ok(r)}
        for method in methods:
            sel = [r for r in rows if r["dataset"] == name and r["method"] == method]
            ok = [r for r in sel if _ok(r)]
            s = {
                "dataset": name,
                "method": method,
                "splits": len(ok),
                "skipped": len(sel) - len(ok),
                "n_train": sorted({r["n_train"] for r in sel}),
                "n_test": sorted({r["n_test"] for r in sel}),
            }
            if ok:
                err = np.array([r["error"] for r in ok])
                fit = np.array([r["fit_s"] for r in ok])
                s.update(
                    mean_error=float(err.mean()),
                    median_error=float(np.median(err)),
                    mean_fit_s=float(fit.mean()),
                    median_fit_s=float(np.median(fit)),
                    total_fit_s=float(fit.sum()),
                    mean_predict_s=float(np.mean([r["predict_s"] for r in ok])),
                )
                if method != REFERENCE and ref:
                    s.update(paired({r["split"]: r["error"] for r in ok}, ref))
                if method == "MWUMKL":
                    s["n_kernels"] = sorted({r["n_kernels"] for r in ok})
                    s["C"] = sorted({r["C"] for r in ok})
                    s["solver"] = sorted({r["solver"] for r in ok})
                    s["fit_warnings"] = sorted({w for r in ok for w in r.get("fit_warnings", [])})
            out.append(s)
    return out


def _ok(r) -> bool:
    return r.get("status") == "ok"


# ----------------------------------------------------------------------------- outputs


def _pct(v, digits=1) -> str:
    return "-" if v is None else f"{100 * v:.{digits}f}"


def _sec(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _sizes(values) -> str:
    return "/".join(str(v) for v in values) if values else "-"


def markdown(doc: dict) -> str:
    st, summary = doc["settings"], doc["summary"]
    methods = st["methods"]
    lines = []
    if st.get("smoke"):
        lines += ["**Smoke run: generated stand-in data, tiny sizes; the numbers mean nothing.**", ""]
    lines += [
        "Test error in %: mean and median over the splits; Δ = mean paired difference to SVC-RBF in "
        "percentage points (method minus SVC; negative = better) with its standard error; W/T/L = splits "
        f"where the method's error is lower than / within {100 * TIE:.1f} points of / higher than the SVC's; "
        "fit s = mean wall-clock seconds of the fit, search included.",
        "",
        "| data set | splits | n train / test | method | mean error % | median error % | Δ vs SVC (SE) | "
        "W/T/L vs SVC | fit s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        if s["splits"] == 0:
            cells = ["-", "-", "-", "-", "-"]
            if s["skipped"]:
                cells[-1] = f"skipped ({s['skipped']})"
        else:
            delta = "-"
            wtl = "-"
            if "mean_diff" in s and s.get("paired_splits"):
                se = "" if s.get("se_diff") is None else f" ({100 * s['se_diff']:.1f})"
                delta = f"{100 * s['mean_diff']:+.1f}{se}"
                wtl = f"{s['wins']}/{s['ties']}/{s['losses']}"
            elif s["method"] == REFERENCE:
                delta, wtl = "reference", "-"
            cells = [_pct(s["mean_error"]), _pct(s["median_error"]), delta, wtl, _sec(s["mean_fit_s"])]
        lines.append(
            f"| {s['dataset']} | {s['splits']} | {_sizes(s['n_train'])} / {_sizes(s['n_test'])} | {s['method']} | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", "Mean test error in % per set (all methods side by side):", ""]
    lines += ["| data set | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    by = {(s["dataset"], s["method"]): s for s in summary}
    for name in st["datasets"]:
        cells = []
        for m in methods:
            s = by.get((name, m))
            cells.append(_pct(s.get("mean_error")) if s and s["splits"] else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    mw = [s for s in summary if s["method"] == "MWUMKL" and s["splits"]]
    if mw:
        lines += ["", "MWUMKL's own choices (per set, over the splits):", ""]
        lines += ["| data set | kernels | C_ | solver_ | fit_warnings_ |", "|---|---|---|---|---|"]
        for s in mw:
            lines.append(
                f"| {s['dataset']} | {_sizes(s['n_kernels'])} | {', '.join(f'{c:g}' for c in s['C'])} | "
                f"{', '.join(s['solver'])} | {'; '.join(s['fit_warnings']) or 'none'} |"
            )
    svc = [r for r in doc["rows"] if r["method"] == REFERENCE and _ok(r)]
    if svc:
        lines += [
            "",
            "SVC-RBF's grid choices (C, gamma / g0) per set, and how many lie on the grid's edge "
            f"(C = {min(SVC_C_GRID):g} or {max(SVC_C_GRID):g}, gamma / g0 = {min(SVC_GAMMA_FACTORS):g} or "
            f"{max(SVC_GAMMA_FACTORS):g}):",
            "",
        ]
        for name in st["datasets"]:
            sel = [r for r in svc if r["dataset"] == name]
            if sel:
                picks = ", ".join(f"({r['C']:g}, {r['gamma_factor']:g})" for r in sel)
                edge = sum(_on_edge(r) for r in sel)
                lines.append(f"- {name}: {picks}; on the edge: {edge} of {len(sel)}")
    lines += ["", "Run time per set (every method's fits and predictions, in seconds):", ""]
    for name in st["datasets"]:
        sel = [r for r in doc["rows"] if r["dataset"] == name and _ok(r)]
        if sel:
            per = {m: sum(r["fit_s"] + r["predict_s"] for r in sel if r["method"] == m) for m in methods}
            lines.append(
                f"- {name}: {sum(per.values()):.0f} s ("
                + ", ".join(f"{m} {v:.1f}" for m, v in per.items() if any(r["method"] == m for r in sel))
                + ")"
            )
    return "\n".join(lines) + "\n"


def _on_edge(r: dict) -> bool:
    """Whether an SVC-RBF pick lies on the edge of its grid."""
    edges_C, edges_g = (min(SVC_C_GRID), max(SVC_C_GRID)), (min(SVC_GAMMA_FACTORS), max(SVC_GAMMA_FACTORS))
    return any(math.isclose(r["C"], c) for c in edges_C) or any(math.isclose(r["gamma_factor"], g) for g in edges_g)


def figure(out: Path, doc: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st, summary = doc["settings"], doc["summary"]
    others = [m for m in st["methods"] if m != REFERENCE]
    names = [n for n in st["datasets"] if any(s["dataset"] == n and s["splits"] for s in summary)]
    if not names or not others or REFERENCE not in st["methods"]:
        return []
    by = {(s["dataset"], s["method"]): s for s in summary}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(names) + 2), 4.2))
    width = 0.8 / len(others)
    x = np.arange(len(names))
    for j, m in enumerate(others):
        vals, errs = [], []
        for n in names:
            s = by.get((n, m), {})
            vals.append(100 * s["mean_diff"] if s.get("mean_diff") is not None else np.nan)
            errs.append(100 * s["se_diff"] if s.get("se_diff") is not None else 0.0)
        centre = x - 0.4 + width * (j + 0.5)
        bars = ax.bar(centre, vals, width, yerr=errs, capsize=2, label=m)
        ax.plot(centre, vals, "_", ms=8, color=bars.patches[0].get_facecolor())  # a zero difference stays visible
    ax.axhline(0.0, color="k", lw=0.8)
    labels = []
    for n in names:
        ref = by.get((n, REFERENCE), {})
        labels.append(f"{n}\nSVC {_pct(ref.get('mean_error'))} %")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("test error minus SVC-RBF's (points)")
    title = "E8: test error relative to a tuned RBF SVC\n(mean paired difference ± SE; below 0 = better)"
    if st.get("smoke"):
        title += " — SMOKE RUN"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "e8_error.png", dpi=110)
    plt.close(fig)
    return ["e8_error.png"]


# ----------------------------------------------------------------------------- driver


def _warm_up() -> float:
    """An untimed small MWUMKL fit: numba's compiled kernels loaded (or compiled) before any timed fit."""
    from mwumkl_dist import MWUMKLClassifier

    rng = np.random.default_rng(0)
    X = rng.random((100, 3))
    y = np.where(X[:, 0] + 0.2 * rng.standard_normal(100) > 0.5, 1.0, -1.0)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MWUMKLClassifier(C=1.0, selectivity=100.0).fit(X, y).predict(X)
    return time.perf_counter() - start


def _per_set(value, name):
    return value.get(name, value.get("*")) if isinstance(value, dict) else value


def run(
    out: Path,
    *,
    datasets=DATASETS,
    methods=METHODS,
    splits: int = SPLITS,
    max_train=None,
    max_test=None,
    easymkl_max_train: int = EASYMKL_MAX_TRAIN,
    threads: int = 1,
    seed: int = 0,
    datasets_dir=None,
    smoke: bool = False,
    log=print,
) -> dict:
    """Run E8 and write its outputs into ``out``; returns the JSON document."""
    from threadpoolctl import threadpool_limits

    from benchmarks.common import Context, RowJournal, run_info, write_csv
    from mwumkl_dist.threads import thread_limit

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    info = run_info()  # now: the results describe the code this run loaded, not a later checkout
    info["load_average_start"] = list(os.getloadavg())
    methods = [m for m in METHODS if m in methods]
    datasets = list(datasets)
    settings = {
        "smoke": smoke,
        "datasets": datasets,
        "methods": methods,
        "reference": REFERENCE,
        "splits": splits,
        "test_size": TEST_SIZE,
        "official_split_sets": [d for d in datasets if d in OFFICIAL],
        "max_train": max_train,
        "max_test": max_test,
        "easymkl_max_train": easymkl_max_train,
        "threads": threads,
        "seed": seed,
        "scaler": "MinMaxScaler(clip=True) fitted on the training part",
        "svc_grid": {
            "C": list(SVC_C_GRID),
            "gamma_factors": list(SVC_GAMMA_FACTORS),
            "gamma_unit": "1 / (d var X)",
            "cv": SVC_CV,
        },
        "nystroem_components": dict(NYSTROEM),
        "linear_svc": "LinearSVC(dual='auto'), C=1",
        "tie": TIE,
        "datasets_dir": None if datasets_dir is None else str(datasets_dir),
    }
    ctx = Context(out=out, quick=smoke, progress=False)
    journal = RowJournal(ctx, "E8", settings)
    settings["data"] = {}
    rows: list[dict] = []
    with threadpool_limits(threads), thread_limit(threads):
        info["warmup_s"] = _warm_up() if "MWUMKL" in methods else None
        for name in datasets:
            ds = load(name, datasets_dir, smoke)
            cap_tr, cap_te = _per_set(max_train, name), _per_set(max_test, name)
            sp = make_splits(ds, splits, seed, cap_tr, cap_te)
            settings["data"][name] = {
                "label": ds.label,
                "source": ds.source,
                "note": ds.note,
                "rows": int(len(ds.y)),
                "test_file_rows": None if ds.y_test is None else int(len(ds.y_test)),
                "features": int(ds.X.shape[1]),
                "protocol": sp[0]["protocol"],
                "splits": len(sp),
                "max_train": cap_tr,
                "max_test": cap_te,
                "n_train": sorted({len(s["train"]) for s in sp}),
                "n_test": sorted({len(s["test"]) for s in sp}),
            }
            log(f"# {ds.label}: {len(sp)} {sp[0]['protocol']} split(s), n_train {settings['data'][name]['n_train']}")
            for split in sp:
                Xtr, ytr, Xte, yte = split_data(ds, split)
                kernels = None
                for method in methods:
                    ident = f"{name}|{split['split']}|{method}"
                    row = journal.get(ident)
                    if row is None:
                        base = {
                            "dataset": name,
                            "split": split["split"],
                            "protocol": split["protocol"],
                            "method": method,
                            "n_train": int(len(ytr)),
                            "n_test": int(len(yte)),
                            "n_features": int(Xtr.shape[1]),
                        }
                        try:
                            res = fit_predict(
                                method, Xtr, ytr, Xte, seed=seed + split["split"], kernels=kernels,
                                easymkl_max_train=easymkl_max_train,
                            )  # fmt: skip
                        except Exception as exc:  # noqa: BLE001 - a failed fit is a result, not the end of the run
                            res = {"status": "failed", "note": f"{type(exc).__name__}: {str(exc)[:300]}"}
                        pred = res.pop("pred", None)
                        row = {**base, **res}
                        if pred is not None:
                            row["error"] = float(np.mean(pred != yte))
                        journal.add(ident, row)
                    if method == "MWUMKL" and _ok(row):
                        kernels = row["kernel_names"]
                    rows.append(row)
                    log(
                        json.dumps({k: v for k, v in row.items() if k not in ("kernel_names", "warnings")}, default=str)
                    )
    info["load_average_end"] = list(os.getloadavg())
    doc = {
        "experiment": "E8",
        "title": "against a tuned RBF SVM",
        "command": info.get("command"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 2),
        "resumed_measurements": journal.resumed,
        "machine": info,
        "settings": settings,
        "rows": rows,
        "summary": summarise(rows, datasets, methods),
    }
    doc["figures"] = figure(out, doc)
    (out / "E8.json").write_text(json.dumps(doc, indent=1, default=_json_default))
    write_csv(out / "E8.csv", [{k: v for k, v in r.items() if k != "kernel_names"} for r in rows], _cell)
    write_csv(out / "E8_summary.csv", doc["summary"], _cell)
    (out / "E8.md").write_text(markdown(doc))
    journal.finish()
    log(f"wrote {', '.join(['E8.json', 'E8.csv', 'E8_summary.csv', 'E8.md', *doc['figures']])} in {out}")
    return doc


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _cell(v):
    if isinstance(v, (list, tuple)):
        return ";".join(str(x) for x in v)
    if isinstance(v, float) and not math.isfinite(v):
        return ""
    return v


# ----------------------------------------------------------------------------- command line


def _csv_list(known):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in known]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad) or 'empty list'}; known: {', '.join(known)}")
        return items

    return parse


def _caps(text: str):
    """``N`` (every set) or ``set=N,...`` (a bare ``N`` among them is the default for the others)."""
    caps: dict = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, _, value = item.rpartition("=")
        try:
            n = int(float(value))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a row count: {item!r}") from None
        if n < 10:
            raise argparse.ArgumentTypeError(f"too few rows: {item!r}")
        if name and name not in DATASETS:
            raise argparse.ArgumentTypeError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
        caps[name or "*"] = n
    if not caps:
        return None
    return caps["*"] if list(caps) == ["*"] else caps


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python benchmarks/bench_e8.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--smoke", action="store_true", help="generated stand-ins, 2 splits: every code path in seconds")
    p.add_argument(
        "--datasets",
        type=_csv_list(DATASETS),
        default=None,
        help=f"comma-separated (default: all {len(DATASETS)}; 'small' = {','.join(SMALL)}; smoke: heart,svmguide1)",
    )
    p.add_argument("--methods", type=_csv_list(METHODS), default=list(METHODS), help=f"default: {','.join(METHODS)}")
    p.add_argument("--splits", type=int, default=None, help=f"random splits per set (default {SPLITS}; smoke 2)")
    p.add_argument("--max-train", type=_caps, default=None, help="training rows per split: N or set=N,... (stratified)")
    p.add_argument("--max-test", type=_caps, default=None, help="test rows per split: N or set=N,... (stratified)")
    p.add_argument("--easymkl-max-train", type=int, default=EASYMKL_MAX_TRAIN, help="EasyMKL skipped above this n")
    p.add_argument("--threads", type=int, default=1, help="threads of every fit (BLAS and MWUMKL); default 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--datasets-dir", default=None, help="default: ../shared/datasets beside the repository")
    p.add_argument("--out", default=str(HERE / "results" / "e8"), help="output folder (default benchmarks/results/e8)")
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--datasets" in argv:  # "small" names the six small sets
        i = argv.index("--datasets") + 1
        if i < len(argv) and argv[i] == "small":
            argv[i] = ",".join(SMALL)
    args = build_parser().parse_args(argv)
    if args.threads < 1:
        raise SystemExit("--threads must be at least 1")
    datasets = args.datasets or (list(SMOKE_DATASETS) if args.smoke else list(DATASETS))
    splits = args.splits if args.splits is not None else (SMOKE_SPLITS if args.smoke else SPLITS)
    if splits < 1:
        raise SystemExit("--splits must be at least 1")
    run(
        Path(args.out),
        datasets=datasets,
        methods=args.methods,
        splits=splits,
        max_train=args.max_train,
        max_test=args.max_test,
        easymkl_max_train=args.easymkl_max_train,
        threads=args.threads,
        seed=args.seed,
        datasets_dir=args.datasets_dir,
        smoke=args.smoke,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

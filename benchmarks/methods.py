"""The compared methods, each fitted with its hyperparameters chosen on the training part only.

Every ``run_*`` function takes a training part and a test part (already
scaled), selects ``C`` (and nothing else from the test part) by stratified
k-fold cross-validation on the training part, refits on the whole training
part with a timer around that final fit, and returns one result row:
``error`` (test misclassification rate), ``fit_seconds`` (final fit),
``cv_seconds`` (selection), the chosen parameters and a few model facts.

Methods:

``MWUMKL``           the improved variant as a user gets it: ``MWUMKLClassifier()``
                     with no argument but the kernels, i.e. size-relative ``C``
                     chosen by its built-in cross-validation on the training part
                     (``C="auto"``), ``epsilon="auto"``, ``polish="auto"``; its
                     ``fit_seconds`` include that selection.  With ``fixed_C`` (the
                     size curves) the same variant with that ``C``;
``MWUMKL-default``   the size curves only: ``MWUMKLClassifier()`` refitted at
                     every size (built-in selection included in its time);
``MWUMKL-paper``     the algorithm as published: ``scale_C=False`` (``C``
                     chosen by cross-validation on a raw grid), the paper's
                     ``epsilon``, the paper's exponents (``selectivity="paper"``),
                     no polish;
``Uniform``, ``LibLinear+``: the baselines of :mod:`benchmarks.baselines`.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import StratifiedKFold
from sklearn.svm import SVC

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.kernels import KernelSet
from mwumkl_dist.kernels.evaluation import combined_kernel, kernel_traces

from .baselines import LibLinearPlus, UniformMKL

__all__ = ["METHODS", "GRIDS", "run_method", "make_folds"]

METHODS = ("MWUMKL", "MWUMKL-default", "MWUMKL-paper", "Uniform", "LibLinear+")

#: Cross-validation grids (full run, quick run).
GRIDS = {
    # The paper's raw C (ridge 1/C).
    "MWUMKL-paper": ([1e2, 1e3, 1e4, 1e5, 1e6, 1e7], [1e3, 1e5]),
    # LIBSVM's C is C * n (see UniformMKL).
    "Uniform": ([0.01, 0.1, 1.0, 10.0, 100.0, 1000.0], [1.0, 100.0]),
    "LibLinear+": ([1e-4, 1e-3, 1e-2, 1e-1, 1.0], [1e-2, 1.0]),
}


def make_folds(y, n_folds: int, seed: int):
    """Stratified folds of a training part."""
    return list(StratifiedKFold(n_folds, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))


def _err(pred, y) -> float:
    return float(np.mean(pred != y))


def _scored(est, Xte, yte, C, cv_seconds, **extra) -> dict:
    """A fitted baseline's result row: test error, fit / CV / predict times, the chosen C and extras."""
    t0 = time.perf_counter()
    pred = est.predict(Xte)
    return {
        "error": _err(pred, yte),
        "fit_seconds": est.fit_seconds_,
        "cv_seconds": cv_seconds,
        "predict_seconds": time.perf_counter() - t0,
        "C": C,
        **extra,
    }


def _pick(grid, scores):
    """The grid value with the lowest CV error; ties go to the smaller (more regularised) C."""
    scores = np.asarray(scores)
    return grid[int(np.flatnonzero(scores <= scores.min() + 1e-12)[0])], scores


def _parallel(jobs, tasks):
    if jobs <= 1 or len(tasks) <= 1:
        return [fn(*args) for fn, args in tasks]
    from joblib import Parallel, delayed

    return Parallel(n_jobs=jobs)(delayed(fn)(*args) for fn, args in tasks)


# ----------------------------------------------------------------------------- MWUMKL


def _mwumkl_params(method: str, kernels, C, epsilon) -> dict:
    if method == "MWUMKL-paper":
        return {
            "kernels": kernels, "C": C, "scale_C": False, "polish": False, "epsilon": epsilon or 0.2,
            "selectivity": "paper",
        }  # fmt: skip
    if method == "MWUMKL" and C is not None:
        return {"kernels": kernels, "C": C}
    return {"kernels": kernels}


def _mwumkl_fold_error(params, Xa, ya, Xb, yb):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _err(MWUMKLClassifier(**params).fit(Xa, ya).predict(Xb), yb)


def _run_mwumkl(method, kernels, Xtr, ytr, Xte, yte, folds, grid, epsilon, jobs):
    t0 = time.perf_counter()
    C, scores = (grid[0] if grid else None), []
    if method == "MWUMKL-paper" and folds:
        tasks = [
            (_mwumkl_fold_error, (_mwumkl_params(method, kernels, C, epsilon), Xtr[a], ytr[a], Xtr[b], ytr[b]))
            for C in grid
            for a, b in folds
        ]
        errs = np.asarray(_parallel(jobs, tasks)).reshape(len(grid), len(folds)).mean(axis=1)
        C, scores = _pick(grid, errs)
    cv_seconds = time.perf_counter() - t0
    params = _mwumkl_params(method, kernels, C, epsilon)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        est = MWUMKLClassifier(**params).fit(Xtr, ytr)
        fit_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        pred = est.predict(Xte)
        predict_seconds = time.perf_counter() - t0
    w = np.asarray(est.kernel_weights_)
    path = getattr(est, "C_path_", None)
    return {
        "error": _err(pred, yte),
        "fit_seconds": fit_seconds,
        "cv_seconds": cv_seconds,
        "predict_seconds": predict_seconds,
        "C": float(est.C_),
        "C_selected": "built-in" if path is not None else ("cv" if len(scores) else "fixed"),
        "epsilon": float(est.epsilon_),
        "n_iter": int(np.max(est.n_iter_)),
        "n_support": int(len(est.support_)),
        "polished": bool(getattr(est, "polished_", False)),
        # 1 = uniform weights; near 0 = one kernel.
        "weight_entropy": float(-(w[w > 0] * np.log(w[w > 0])).sum() / np.log(len(w))) if len(w) > 1 else 1.0,
        "cv_scores": list(map(float, scores)) if len(scores) else list((path or {}).values()),
    }


# ----------------------------------------------------------------------------- Uniform


def _run_uniform(kernels, Xtr, ytr, Xte, yte, folds, grid, jobs):
    t0 = time.perf_counter()
    ks = KernelSet(kernels, Xtr.shape[1])
    n = Xtr.shape[0]
    # One Gram matrix of the training part serves every fold (the traces are the
    # training part's: an unsupervised normalisation, no test data involved).
    K = combined_kernel(ks, Xtr, Xtr, n / (len(ks) * kernel_traces(ks, Xtr)))
    errs = []
    for C in grid:
        e = []
        for a, b in folds:
            svc = SVC(kernel="precomputed", C=C).fit(K[np.ix_(a, a)], ytr[a])
            e.append(_err(svc.predict(K[np.ix_(b, a)]), ytr[b]))
        errs.append(np.mean(e))
    del K
    C, scores = _pick(grid, errs)
    cv_seconds = time.perf_counter() - t0
    est = UniformMKL(kernels, C=C).fit(Xtr, ytr)
    return _scored(
        est,
        Xte,
        yte,
        C,
        cv_seconds,
        n_support=int(len(est.svc_.support_)),
        cv_scores=list(map(float, scores)),
    )


# ----------------------------------------------------------------------------- LibLinear+


def _linear_fold_error(C, G, a, b, y):
    """One fold of LibLinear+ from the Gram matrix ``F F'`` of the training part's features."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = LibLinearPlus(C=C).fit_gram(G[np.ix_(a, a)], y[a])
        return _err(est.classes_[(est.decision_from_gram(G[np.ix_(b, a)]) > 0).astype(int)], y[b])


def _run_liblinear(kernels, Xtr, ytr, Xte, yte, folds, grid, jobs, memory_bytes, n_components=150):
    t0 = time.perf_counter()
    # The Nystroem maps are fit once on the training part (unsupervised) and shared by the folds.
    F = LibLinearPlus(kernels, n_components=n_components, memory_bytes=memory_bytes).transform_fit(Xtr)
    # Every fold is fitted from the Gram matrix of the features (see LibLinearPlus.fit_gram):
    # the same LIBLINEAR solution at a fraction of the cost when features outnumber points.
    G = F @ F.T
    del F
    tasks = [(_linear_fold_error, (C, G, a, b, ytr)) for C in grid for a, b in folds]
    errs = np.asarray(_parallel(jobs, tasks)).reshape(len(grid), len(folds)).mean(axis=1)
    del G
    C, scores = _pick(grid, errs)
    cv_seconds = time.perf_counter() - t0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = LibLinearPlus(kernels, C=C, n_components=n_components, memory_bytes=memory_bytes)
        est.fit(Xtr, ytr)
    return _scored(
        est,
        Xte,
        yte,
        C,
        cv_seconds,
        n_components=est.n_components_,
        converged=bool(est.svm_.n_iter_ < est.max_iter),
        cv_scores=list(map(float, scores)),
    )


# ----------------------------------------------------------------------------- dispatch


def run_method(
    method,
    kernels,
    Xtr,
    ytr,
    Xte,
    yte,
    *,
    quick=False,
    folds=None,
    n_folds=3,
    seed=0,
    epsilon=None,
    grid=None,
    jobs=1,
    memory_bytes=4e9,
    fixed_C=None,
    n_components=None,
) -> dict:
    """Select, fit and score one method; returns a result row (see the module docstring).

    ``fixed_C`` skips the selection (for timing runs whose ``C`` was chosen
    once on a subsample); ``epsilon`` is MWUMKL's (None: the default 0.2);
    ``n_components`` LibLinear+'s Nystroem components per kernel (None: 150, 30 in quick runs).
    """
    if n_components is None:
        n_components = 30 if quick else 150
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    if grid is None and method in GRIDS:
        grid = GRIDS[method][1 if quick else 0]
    if fixed_C is not None:
        grid = [fixed_C]
    if folds is None:
        folds = make_folds(ytr, n_folds, seed) if len(grid or []) > 1 else []
    if len(grid or []) <= 1:
        folds = []
    if method.startswith("MWUMKL"):
        row = _run_mwumkl(method, kernels, Xtr, ytr, Xte, yte, folds, grid or [None], epsilon, jobs)
    elif method == "Uniform":
        row = (
            _run_uniform(kernels, Xtr, ytr, Xte, yte, folds, grid, jobs)
            if folds
            else _fit_uniform(kernels, Xtr, ytr, Xte, yte, grid[0])
        )
    else:
        row = (
            _run_liblinear(kernels, Xtr, ytr, Xte, yte, folds, grid, jobs, memory_bytes, n_components)
            if folds
            else (_fit_liblinear(kernels, Xtr, ytr, Xte, yte, grid[0], memory_bytes, n_components))
        )
    row["method"] = method
    return row


def _fit_uniform(kernels, Xtr, ytr, Xte, yte, C):
    est = UniformMKL(kernels, C=C).fit(Xtr, ytr)
    return _scored(
        est,
        Xte,
        yte,
        C,
        0.0,
        n_support=int(len(est.svc_.support_)),
    )


def _fit_liblinear(kernels, Xtr, ytr, Xte, yte, C, memory_bytes, n_components=150):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = LibLinearPlus(kernels, C=C, n_components=n_components, memory_bytes=memory_bytes).fit(Xtr, ytr)
    return _scored(
        est,
        Xte,
        yte,
        C,
        0.0,
        n_components=est.n_components_,
        converged=bool(est.svm_.n_iter_ < est.max_iter),
    )

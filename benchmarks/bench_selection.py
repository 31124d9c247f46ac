"""E6, kernel selection: does MWUMKL put its weight on the kernels that matter?

``python -m benchmarks.bench_selection [--quick] [--out DIR]``

Three families of problems, each with a known set of relevant kernels:

(a) synthetic: ``make_classification`` with ``k`` informative of ``d`` features (columns shuffled,
    so the informative ones are not first), per-feature kernels (the paper's 12 on every feature);
    relevant = the kernels on the informative features;
(b) bandwidth recovery: labels from the sign of a sum of 30 Gaussian bumps of one width ``sigma*``
    on 2 features spanning [0, 10] (not rescaled, so that the paper's widths 1-16 range from wiggly to
    almost polynomial), the paper's family (12 kernels); relevant = ``sigma*`` and its two neighbours;
(c) real sets (ionosphere, sonar, breast cancer) with 30 appended uniform-noise features,
    per-feature kernels; relevant = the kernels on the original features.

Methods, in the same run and on the same splits: ``MWUMKLClassifier()`` with no arguments
(MWUMKL), the literal paper rule (MWUMKL-paper: ``selectivity="paper"``, C and epsilon as the
default chooses them), Uniform (SVC on the average kernel, C by 3-fold CV), EasyMKL (Aiolli &
Donini 2015, written from the paper as MKLpy implements it: the QP over the two class simplices on
the sum of the normalised kernels, weights ``gamma' Y K_r Y gamma``, then SVC(C=100) on the
combination; lambda by 3-fold CV from 0.1, 0.3, 0.5) and the Oracle (Uniform on the relevant
kernels only).  MKLpy itself needs the torch wheel, which is not installable here; the
implementation below follows its ``EasyMKL._combine_kernels``.

Reported per problem (medians over splits): weight mass on the relevant kernels, effective number
of kernels ``1 / sum mu^2``, test error, fit time.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.model_selection import StratifiedKFold, train_test_split
from sklearn.preprocessing import MinMaxScaler
from sklearn.svm import SVC

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.inspection import feature_weights
from mwumkl_dist.kernels import PAPER_SIGMAS, KernelSet
from mwumkl_dist.kernels.evaluation import combined_kernel, kernel_matrices, kernel_traces

from . import datasets as D
from .common import run_info

METHODS = ("MWUMKL", "MWUMKL-auto", "MWUMKL-paper", "Uniform", "EasyMKL", "Oracle")
UNIFORM_C_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0)
EASY_LAMBDAS = (0.1, 0.3, 0.5)
EASY_SVC_C = 100.0
N_NOISE = 30
MEASURES = ("mass", "effective_kernels", "error", "seconds")


# ----------------------------------------------------------------------------- problems


def _synthetic(k, d, seed, n=800):
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=n, n_features=d, n_informative=k, n_redundant=0, shuffle=False, flip_y=0.02, random_state=seed
    )
    perm = np.random.default_rng(seed).permutation(d)
    X = X[:, perm]
    informative = np.flatnonzero(perm < k)
    return X, y, informative


def _bandwidth(sigma, seed, n=800, d=2, n_bumps=30, extent=10.0):
    """Points in ``[0, extent]^d`` (not rescaled, so the family's widths 1-16 span smooth to wiggly)."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, d)) * extent
    centers = rng.random((n_bumps, d)) * extent
    coef = rng.standard_normal(n_bumps)
    d2 = ((X[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    f = np.exp(-d2 / (2 * sigma * sigma)) @ coef
    y = (f > np.median(f)).astype(int)
    flip = rng.random(n) < 0.02
    y[flip] = 1 - y[flip]
    return X, y


def _with_noise(X, seed):
    rng = np.random.default_rng(seed + 1000)
    return np.hstack([X, rng.random((X.shape[0], N_NOISE))])


def problems(quick: bool, datasets_dir=None):
    """Yield ``(family, name, seed, X, y, kernels, relevant_mask)``; X is scaled per split later."""
    seeds = range(2) if quick else range(3)
    for k, d in [(2, 10)] if quick else [(2, 10), (4, 30), (5, 50)]:
        for seed in seeds:
            X, y, informative = _synthetic(k, d, seed, n=400 if quick else 800)
            ks = KernelSet("paper-per-feature", d)
            rel = np.array([spec.features[0] in set(informative.tolist()) for spec in ks])
            yield "a", f"k={k} d={d}", seed, X, y, ks.names(), rel
    sig_idx = [2] if quick else [2, 4]  # sigma* = 2, 4 (their two neighbours are in the family)
    for i in sig_idx:
        for seed in seeds:
            X, y = _bandwidth(PAPER_SIGMAS[i], seed, n=400 if quick else 800)
            ks = KernelSet("paper", X.shape[1])
            near = {str(KernelSet([f"gaussian:{PAPER_SIGMAS[j]!r}"], 1).specs[0]) for j in (i - 1, i, i + 1)}
            rel = np.array([str(spec) in near for spec in ks])
            yield "b", f"sigma*={ks.names()[3 + i]}", seed, X, y, ks.names(), rel
    for name in ("ionosphere", "sonar", "breast_cancer"):
        ds = D.load_or_standin(name, datasets_dir, allow_standin=quick, download=False)
        X0, y0 = ds.combined() if hasattr(ds, "combined") else (ds.X, ds.y)
        X0 = np.asarray(X0.toarray() if hasattr(X0, "toarray") else X0, dtype=np.float64)
        for seed in seeds:
            X = _with_noise(X0, seed)
            ks = KernelSet("paper-per-feature", X.shape[1])
            rel = np.array([spec.features[0] < X0.shape[1] for spec in ks])
            yield "c", f"{name}+{N_NOISE} noise", seed, X, np.asarray(y0), ks.names(), rel


# ----------------------------------------------------------------------------- methods


def _cv_pick(fit_error, grid, y, seed):
    folds = list(StratifiedKFold(3, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))
    errors = [np.mean([fit_error(value, a, b) for a, b in folds]) for value in grid]
    return grid[int(np.argmin(errors))]


def _normalised(kernels, X, Z, n_train_traces):
    """Trace-normalised kernel values scaled by n (unit mean diagonal), one matrix per kernel."""
    K = kernel_matrices(KernelSet(kernels, X.shape[1]), X, Z)
    K /= n_train_traces[:, None, None]
    return K


def _uniform(kernels, Xtr, ytr, Xte, seed):
    ks = KernelSet(kernels, Xtr.shape[1])
    w = 1.0 / (len(ks) * kernel_traces(ks, Xtr)) * len(ytr)
    Ktr = combined_kernel(ks, Xtr, Xtr, w)

    def err(C, a, b):
        svc = SVC(kernel="precomputed", C=C).fit(Ktr[np.ix_(a, a)], ytr[a])
        return np.mean(svc.predict(Ktr[np.ix_(b, a)]) != ytr[b])

    C = _cv_pick(err, UNIFORM_C_GRID, ytr, seed)
    svc = SVC(kernel="precomputed", C=C).fit(Ktr, ytr)
    return svc.predict(combined_kernel(ks, Xte, Xtr, w)), np.full(len(ks), 1.0 / len(ks))


def easymkl_weights(Ks, y, lam):
    """EasyMKL's kernel weights (Aiolli & Donini 2015; MKLpy's ``EasyMKL._combine_kernels``).

    ``gamma = argmin (1 - lam) gamma' Y (sum_r K_r) Y gamma + lam |gamma|^2`` over the two class
    simplices, then ``eta_r = gamma' Y K_r Y gamma``, normalised to sum 1.
    """
    import cvxpy as cp

    ypm = np.where(y == y.max(), 1.0, -1.0)
    Q = Ks.sum(axis=0) * np.outer(ypm, ypm)
    vals, vecs = np.linalg.eigh(Q)
    keep = vals > vals.max() * 1e-10
    L = vecs[:, keep] * np.sqrt(vals[keep])
    gamma = cp.Variable(len(y), nonneg=True)
    objective = (1 - lam) * cp.sum_squares(L.T @ gamma) + lam * cp.sum_squares(gamma)
    cons = [cp.sum(gamma[ypm > 0]) == 1, cp.sum(gamma[ypm < 0]) == 1]
    cp.Problem(cp.Minimize(objective), cons).solve(solver=cp.CLARABEL)
    g = np.maximum(gamma.value, 0.0) * ypm
    eta = np.maximum(np.einsum("j,rjk,k->r", g, Ks, g), 0.0)
    return eta / eta.sum()


def _easymkl(kernels, Xtr, ytr, Xte, seed):
    traces = kernel_traces(KernelSet(kernels, Xtr.shape[1]), Xtr) / len(ytr)
    Ktr = _normalised(kernels, Xtr, Xtr, traces)

    def err(lam, a, b):
        eta = easymkl_weights(Ktr[:, a][:, :, a], ytr[a], lam)
        K = np.einsum("r,rjk->jk", eta, Ktr)
        svc = SVC(kernel="precomputed", C=EASY_SVC_C).fit(K[np.ix_(a, a)], ytr[a])
        return np.mean(svc.predict(K[np.ix_(b, a)]) != ytr[b])

    lam = _cv_pick(err, EASY_LAMBDAS, ytr, seed)
    eta = easymkl_weights(Ktr, ytr, lam)
    svc = SVC(kernel="precomputed", C=EASY_SVC_C).fit(np.einsum("r,rjk->jk", eta, Ktr), ytr)
    Kte = np.einsum("r,rjk->jk", eta, _normalised(kernels, Xte, Xtr, traces))
    return svc.predict(Kte), eta


def run_one(method, kernels, rel, Xtr, ytr, Xte, seed):
    """Predictions on ``Xte`` and the kernel weights (over all kernels) of one method.

    ``MWUMKL-auto`` (the estimator with no argument at all, its own kernels) returns its feature weights
    instead: its kernels are not the problem's.
    """
    kernels = list(kernels)
    if method == "MWUMKL":
        clf = MWUMKLClassifier(kernels=kernels).fit(Xtr, ytr)
        return clf.predict(Xte), clf.kernel_weights_
    if method == "MWUMKL-auto":
        clf = MWUMKLClassifier().fit(Xtr, ytr)
        return clf.predict(Xte), clf.feature_weights_
    if method == "MWUMKL-paper":
        clf = MWUMKLClassifier(kernels=kernels, selectivity="paper").fit(Xtr, ytr)
        return clf.predict(Xte), clf.kernel_weights_
    if method == "Uniform":
        return _uniform(kernels, Xtr, ytr, Xte, seed)
    if method == "EasyMKL":
        return _easymkl(kernels, Xtr, ytr, Xte, seed)
    if method == "Oracle":
        pred, w = _uniform([k for k, r in zip(kernels, rel) if r], Xtr, ytr, Xte, seed)
        full = np.zeros(len(kernels))
        full[rel] = w
        return pred, full
    raise ValueError(method)


# ----------------------------------------------------------------------------- driver


def _mass(method, family, weights, kernels, rel, n_features):
    """The weight on the relevant kernels; for MWUMKL-auto (feature weights) the weight on the relevant kernels'
    features, and None on the bandwidth problems (its widths are its own, not the problem's)."""
    if method != "MWUMKL-auto":
        return float(weights[rel].sum())
    if family == "b":
        return None
    relevant = feature_weights(kernels, rel / rel.sum(), n_features) > 0
    return float(weights[relevant].sum())


def run(quick: bool, out: Path, datasets_dir=None, methods=METHODS) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    info = run_info()  # now: the results describe the code this run loaded, not a later checkout
    rows, examples = [], {}
    for family, name, seed, X, y, kernels, rel in problems(quick, datasets_dir):
        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=seed, stratify=y)
        if family != "b":  # (b) keeps its [0, 10] extent: the widths are the question
            scaler = MinMaxScaler().fit(Xtr)
            Xtr, Xte = np.clip(scaler.transform(Xtr), 0, None), np.clip(scaler.transform(Xte), 0, None)
        for method in methods:
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pred, w = run_one(method, kernels, rel, Xtr, ytr, Xte, seed)
            seconds = time.perf_counter() - start
            row = {
                "family": family,
                "problem": name,
                "seed": seed,
                "method": method,
                "n_train": len(ytr),
                "n_kernels": len(kernels),
                "relevant_kernels": int(rel.sum()),
                "mass": _mass(method, family, w, kernels, rel, X.shape[1]),
                "effective_kernels": float(1.0 / np.sum(w**2)),
                "error": float(np.mean(pred != yte)),
                "seconds": seconds,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if seed == 0 and family in ("a", "c"):
                per_feature = w if method == "MWUMKL-auto" else feature_weights(kernels, w, X.shape[1])
                examples.setdefault(name, {})[method] = np.asarray(per_feature).tolist()
                examples[name]["truth"] = feature_weights(kernels, rel / rel.sum(), X.shape[1]).tolist()
    summary = summarise(rows)
    doc = {"info": info, "quick": quick, "rows": rows, "summary": summary, "feature_weights": examples}
    (out / "e6.json").write_text(json.dumps(doc, indent=1))
    figure(out, examples)
    (out / "E6.md").write_text(markdown(summary))
    return doc


def summarise(rows) -> list[dict]:
    keys = sorted({(r["family"], r["problem"]) for r in rows}, key=lambda k: (k[0], k[1]))
    out = []
    for family, problem in keys:
        for method in METHODS:
            sel = [r for r in rows if r["family"] == family and r["problem"] == problem and r["method"] == method]
            if not sel:
                continue
            out.append(
                {
                    "family": family,
                    "problem": problem,
                    "method": method,
                    "splits": len(sel),
                    "n_kernels": sel[0]["n_kernels"],
                    "relevant_kernels": sel[0]["relevant_kernels"],
                    **{k: _median([r[k] for r in sel]) for k in MEASURES},
                }
            )
    return out


def _median(values):
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def markdown(summary) -> str:
    lines = [
        "| family | problem | kernels (relevant) | method | weight on relevant | effective kernels "
        "| test error | fit s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['family']} | {s['problem']} | {s['n_kernels']} ({s['relevant_kernels']}) | {s['method']} | "
            f"{'-' if s['mass'] is None else format(s['mass'], '.2f')} | {s['effective_kernels']:.1f} | "
            f"{100 * s['error']:.1f} % | {s['seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def figure(out: Path, examples: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not examples:
        return
    fig, axes = plt.subplots(len(examples), 1, figsize=(10, 2.6 * len(examples)), squeeze=False)
    for ax, (name, by_method) in zip(axes[:, 0], examples.items()):
        d = len(by_method["truth"])
        x = np.arange(d)
        ax.bar(x, by_method["truth"], color="lightgray", label="relevant (truth, uniform over them)")
        for method, style in (("MWUMKL", "r-o"), ("MWUMKL-auto", "b--s"), ("EasyMKL", "g-^"), ("MWUMKL-paper", "m:")):
            if method in by_method:
                ax.plot(x, by_method[method], style, ms=3, lw=1, label=method)
        ax.set_title(f"{name}: learned weight per feature (seed 0)")
        ax.set_xlabel("feature")
        ax.set_ylabel("weight")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "e6_feature_weights.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_selection", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small problems, 2 seeds, synthetic stand-ins allowed")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "e6"))
    p.add_argument("--datasets-dir", default=None)
    p.add_argument("--methods", default=",".join(METHODS))
    args = p.parse_args(argv)
    run(args.quick, Path(args.out), args.datasets_dir, tuple(args.methods.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

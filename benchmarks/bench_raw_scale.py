"""Raw features against min-max scaled ones (issue 38, ``scale_features``): the default fit on each.

``python -m benchmarks.bench_raw_scale [--sets wine,heart,svmguide1] [--splits 5] [--max-train 2000] [--smoke]``

For each set, stratified 75/25 splits (a set with its own test file: that file, the training rows
subsampled to ``--max-train``); on each split ``MWUMKLClassifier(n_jobs=1)`` on the raw features
(``scale_features="auto"``: the fit scales them itself), the same on the input scaled min-max on the
training part, and on the raw features with ``scale_features=False`` (the fit before issue 38's scale).
Test errors in per cent, one JSON row per split and set, then the means.  Sets: scikit-learn's wine
(bundled, three classes) and any set of the shared data folder (``--datasets-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from sklearn.datasets import load_svmlight_file, load_wine
from sklearn.model_selection import StratifiedShuffleSplit
from sklearn.preprocessing import MinMaxScaler

from mwumkl_dist import MWUMKLClassifier

CONDITIONS = ("raw", "min-max", "raw, scale_features=False")


def _load(name: str, datasets_dir):
    if name == "wine":
        X, y = load_wine(return_X_y=True)
        return X, y, None, None
    from benchmarks import datasets as D

    if name in D.load_manifest():
        data = D.load_dataset(name, datasets_dir, download=False)
        X, y, Xt, yt = data.X, data.y, data.X_test, data.y_test
    else:  # another file of the shared folder (svmguide1, german.numer): NAME.svm.gz, a test file NAME.t.svm.gz
        folder = Path(datasets_dir) if datasets_dir is not None else D.default_datasets_dir()
        X, y = load_svmlight_file(str(folder / f"{name}.svm.gz"))
        test = folder / f"{name}.t.svm.gz"
        Xt, yt = load_svmlight_file(str(test), n_features=X.shape[1]) if test.exists() else (None, None)
    dense = [None if A is None else (A.toarray() if hasattr(A, "toarray") else np.asarray(A)) for A in (X, Xt)]
    return dense[0], y, dense[1], yt


def _splits(X, y, Xt, yt, n_splits: int, max_train: int):
    if Xt is not None:
        for seed in range(n_splits):
            rows = np.random.default_rng(seed).permutation(len(y))[:max_train]
            yield seed, X[rows], y[rows], Xt, yt
        return
    sss = StratifiedShuffleSplit(n_splits=n_splits, test_size=0.25, random_state=0)
    for seed, (tr, te) in enumerate(sss.split(X, y)):
        tr = tr[:max_train]
        yield seed, X[tr], y[tr], X[te], y[te]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_raw_scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="wine", help="comma-separated (default wine)")
    p.add_argument("--splits", type=int, default=5)
    p.add_argument("--max-train", type=int, default=2000)
    p.add_argument("--datasets-dir", default=None)
    p.add_argument("--smoke", action="store_true", help="wine, one split of 60 training rows")
    args = p.parse_args(argv)
    sets = ["wine"] if args.smoke else args.sets.split(",")
    n_splits, max_train = (1, 60) if args.smoke else (args.splits, args.max_train)
    for name in sets:
        X, y, Xt, yt = _load(name, args.datasets_dir)
        errors = {c: [] for c in CONDITIONS}
        for seed, A, ya, B, yb in _splits(X, y, Xt, yt, n_splits, max_train):
            scaler = MinMaxScaler().fit(A)
            inputs = {
                "raw": (A, B, {}),
                "min-max": (scaler.transform(A), scaler.transform(B), {}),
                "raw, scale_features=False": (A, B, {"scale_features": False}),
            }
            row = {"set": name, "split": seed, "n_train": len(ya), "n_test": len(yb)}
            for c, (train, test, params) in inputs.items():
                clf = MWUMKLClassifier(n_jobs=1, **params).fit(train, ya)
                errors[c].append(100.0 * float(np.mean(clf.predict(test) != yb)))
                row[c] = round(errors[c][-1], 2)
            row["load"] = round(os.getloadavg()[0], 2)
            print(json.dumps(row), flush=True)
        means = {c: round(float(np.mean(v)), 2) for c, v in errors.items()}
        print(json.dumps({"set": name, "splits": n_splits, "mean": means}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

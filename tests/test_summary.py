"""The summary of a fitted model (issue 31): built from the fitted attributes, for every kind of model."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.inspection import kernel_family_weights, short_kernel_name
from mwumkl_dist.stores import write_data_store
from mwumkl_dist.summary import CHOICES, chosen_lines


def _problem(n=120, d=3, classes=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.digitize(X[:, 0] + 0.1 * rng.standard_normal(n), np.linspace(0, 1, classes + 1)[1:-1])
    return X, y


def test_rounded_names_and_families():
    assert short_kernel_name("gaussian:1.2402252173943313") == "gaussian:1.24"
    assert short_kernel_name("gaussian:0.16797377152534523@0-4+7") == "gaussian:0.168@0-4+7"
    assert short_kernel_name("gaussian:2^0.5") == "gaussian:2^0.5" and short_kernel_name("poly:3") == "poly:3"
    names = ["poly:1", "gaussian:0.5", "gaussian:1@0", "gaussian:1@1", "linear"]
    families = kernel_family_weights(names, np.array([0.1, 0.2, 0.3, 0.3, 0.1]), 2)
    assert list(families) == ["gaussian", "poly:1", "linear"] and families["gaussian"] == pytest.approx((0.8, 2))


def test_a_one_vs_rest_model_with_string_labels():
    X, y = _problem(classes=3)
    labels = np.array(["low", "mid", "high"])[y]
    clf = MWUMKLClassifier(kernels="linear,gaussian:0.5", C=10.0).fit(X, labels)
    text = clf.summary(X, labels)
    assert re.search(r"^bias {13}\S+, \S+, \S+$", text, re.M)  # one per class
    assert re.search(r"^majority class {3}[\d.]+ % error \(always predicting (low|mid|high)\)$", text, re.M)
    assert "cv error" not in text  # nothing was cross-validated
    assert "C                10 (size-relative, ridge 1/(C n)): given" in text


def test_precomputed_kernels_sampled_for_the_training_error(monkeypatch):
    from mwumkl_dist import summary
    from mwumkl_dist.solvers.auto import stratified_rows

    X, y = _problem(n=90)
    K = np.stack([X @ X.T, np.exp(-((X[:, None] - X[None]) ** 2).sum(axis=2))])
    clf = MWUMKLClassifier(kernels="precomputed", C=10.0).fit(K, y)
    assert "kernels          precomputed: 2 kernels" in clf.summary(K, y) and "per kernel type" not in clf.summary()
    monkeypatch.setattr(summary, "TRAINING_ERROR_POINTS", 40)
    text = clf.summary(K, y)
    rows = stratified_rows(y, 40, 0)  # the rows' kernels against every training point
    error = np.mean(clf.predict(K[:, rows, :]) != y[rows])
    assert f"training error   {100 * error:.2f} % (a stratified sample of 40 of the 90 training rows)" in text


def test_a_data_store_is_not_read_again(tmp_path):
    X, y = _problem(n=80)
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=32)
    clf = MWUMKLClassifier(kernels="linear,gaussian:0.5", C=10.0).fit(store)
    text = clf.summary(store, store.y)
    assert "training error" not in text and "majority class" in text


def test_every_choice_has_a_line_and_a_new_one_is_one_entry(monkeypatch):
    X, y = _problem()
    clf = MWUMKLClassifier(kernels="linear,gaussian:0.5", C=1.0, selectivity=0.0).fit(X, y)
    labels = [line.split("  ")[0] for line in chosen_lines(clf)]
    assert labels == ["solver", "C", "selectivity", "epsilon"]
    clf.found_structure_ = {"kept": 2}  # a new fitted attribute: one entry in CHOICES
    monkeypatch.setattr(
        "mwumkl_dist.summary.CHOICES",
        [*CHOICES, ("structure", "found_structure_", lambda m: f"kept {m.found_structure_['kept']}")],
    )
    assert chosen_lines(clf)[-1] == "structure        kept 2"


def test_a_structure_search_that_keeps_every_feature_says_so():
    # Uniform noise in every feature, the label on all of them: no few features carry the signal.
    rng = np.random.default_rng(3)
    X = rng.random((150, 4))
    y = (X.sum(axis=1) + 0.2 * rng.standard_normal(150) > 2).astype(int)
    clf = MWUMKLClassifier().fit(X, y)
    assert getattr(clf, "structure_", None) is None and clf.structure_path_
    (line,) = [line for line in chosen_lines(clf) if line.startswith("structure")]
    tops = {key[0].top for key in clf.structure_path_}
    best = min(clf.structure_path_.values())
    assert line.startswith("structure        none: all 4 features")
    assert f"the best of {len(tops)} feature structures" in line and f"{100 * best:.2f} %" in line
    del clf.structure_path_  # a model saved before the path was kept: no line rather than a wrong one
    assert not [line for line in chosen_lines(clf) if line.startswith("structure")]

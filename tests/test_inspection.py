"""What the learned weights say: per feature, per kernel type, largest first (estimator and CLI)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file, make_classification

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.inspection import feature_weights, kernel_type_weights, top_kernels
from mwumkl_dist.kernels import KernelSet, RandomGaussianBank


def test_feature_weights_share_each_kernels_weight_among_its_features():
    names = ["linear@0", "gaussian:2@1-2", "poly:2", "gaussian:2^0.5@3"]
    w = np.array([0.1, 0.4, 0.2, 0.3])
    out = feature_weights(names, w, 4)
    np.testing.assert_allclose(out, [0.1 + 0.05, 0.2 + 0.05, 0.2 + 0.05, 0.3 + 0.05], rtol=1e-15)
    assert out.sum() == pytest.approx(1.0, abs=1e-15)
    # kernels on all features only: every feature gets the same
    paper = KernelSet("paper", 5).names()
    np.testing.assert_allclose(feature_weights(paper, np.full(12, 1 / 12), 5), 0.2, rtol=1e-14)


def test_kernel_type_weights_add_up_over_features():
    names = KernelSet("paper-per-feature", 3).names()
    w = np.zeros(len(names))
    w[names.index("gaussian:2^0.5@0")] = 0.5
    w[names.index("gaussian:2^0.5@2")] = 0.25
    w[names.index("poly:1@1")] = 0.25
    by_type = kernel_type_weights(names, w, 3)
    assert list(by_type)[:2] == ["gaussian:2^0.5", "poly:1"]
    assert by_type["gaussian:2^0.5"] == 0.75 and by_type["poly:1"] == 0.25
    assert len(by_type) == 12 and sum(by_type.values()) == pytest.approx(1.0)
    assert top_kernels(names, w, 2) == [("gaussian:2^0.5@0", 0.5), ("poly:1@1", 0.25)]  # ties: lower index


def test_a_bank_aggregates_as_its_expanded_kernels():
    X, y = make_classification(n_samples=60, n_features=6, random_state=0)
    X = (X - X.min(0)) / (X.max(0) - X.min(0))
    bank = RandomGaussianBank(300, subset_size=2, seed=4)
    clf = MWUMKLClassifier(kernels=bank, C=10.0, polish=False, selectivity=30.0, max_iter=40).fit(X, y)
    expanded = [str(s) for s in bank.specs(6)]
    w = clf.kernel_weights_
    np.testing.assert_allclose(clf.feature_weights_, feature_weights(expanded, w, 6), rtol=1e-12)
    by_type, ref = clf.kernel_type_weights_, kernel_type_weights(expanded, w, 6)
    assert set(by_type) == set(ref) and all(by_type[k] == pytest.approx(ref[k], rel=1e-12) for k in ref)


def test_estimator_weights_per_feature_find_the_informative_features():
    X, y = make_classification(
        n_samples=300, n_features=8, n_informative=2, n_redundant=0, shuffle=False, flip_y=0.0, random_state=1
    )
    X = (X - X.min(0)) / (X.max(0) - X.min(0))
    clf = MWUMKLClassifier(kernels="paper-per-feature", C=1.0, selectivity=100.0).fit(X, y)
    per_feature = clf.feature_weights_
    assert per_feature.shape == (8,) and per_feature.sum() == pytest.approx(1.0)
    assert per_feature[:2].sum() > 0.7  # the two informative features carry the weight (0.79)
    paper = MWUMKLClassifier(kernels="paper-per-feature", C=1.0, selectivity="paper").fit(X, y)
    assert paper.feature_weights_[:2].sum() < 0.3  # the published rule: about 2 / 8


def test_weights_per_feature_of_a_multiclass_fit_and_precomputed_kernels():
    X, y = make_classification(n_samples=90, n_features=4, n_informative=3, n_redundant=0, n_classes=3, random_state=0)
    X = (X - X.min(0)) / (X.max(0) - X.min(0))
    clf = MWUMKLClassifier(kernels="paper-per-feature", C=10.0, polish=False, max_iter=30).fit(X, y)
    assert clf.feature_weights_.shape == (3, 4)
    np.testing.assert_allclose(clf.feature_weights_.sum(axis=1), 1.0, rtol=1e-12)
    assert isinstance(clf.kernel_type_weights_, list) and len(clf.kernel_type_weights_) == 3
    K = np.stack([X @ X.T, (X @ X.T + 1) ** 2])
    pre = MWUMKLClassifier(kernels="precomputed", C=10.0, polish=False, max_iter=30).fit(K, y)
    with pytest.raises(AttributeError, match="precomputed"):
        pre.feature_weights_  # noqa: B018


def test_bad_weights_shape_is_refused():
    with pytest.raises(ValueError, match="one value per kernel"):
        feature_weights(["linear", "poly:2"], np.ones(3), 2)


def test_cli_fit_prints_selectivity_and_the_weight_summaries(tmp_path, capsys):
    """In process (``main``): test_cli.py runs the command line's ``fit`` end to end in subprocesses."""
    from mwumkl_dist.cli import main

    X, y = make_classification(
        n_samples=200, n_features=6, n_informative=2, n_redundant=0, shuffle=False, flip_y=0.0, random_state=2
    )
    dump_svmlight_file(X, y, str(tmp_path / "train.svm"))
    args = ["fit", "--data", str(tmp_path / "train.svm"), "--model", str(tmp_path / "m.npz")]
    args += ["--kernels", "paper-per-feature"]
    assert main([*args, "--C", "1", "--selectivity", "100"]) == 0
    out = capsys.readouterr().out
    assert "selectivity      100: given" in out
    effective = float(re.search(r"kernels used     ([\d.]+) effective of 72", out).group(1))
    assert effective < 10
    per_feature = re.search(r"per feature      (\d) ([\d.]+), (\d) ([\d.]+)", out)
    assert {per_feature.group(1), per_feature.group(3)} == {"0", "1"}  # the informative features first
    assert re.search(r"per kernel type  .*gaussian [\d.]+ \(9 widths\)", out)  # paper: 9 widths of 1 to 16
    assert main([*args, "--C", "1", "--selectivity", "0"]) == 0
    assert "kernels used     72.0 effective of 72" in capsys.readouterr().out
    assert main([*args, "--selectivity", "-1"]) == 2
    assert "--selectivity" in capsys.readouterr().err

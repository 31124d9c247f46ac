"""What a new user trips over (issue 41): a regression target fitted as hundreds of classes, a store
fitted unlike the same rows in a file, a slow start, ``predict_proba`` without ``probability=True``,
a zero-based svmlight file read silently, a saved structured model's summary.

In process (``main``) with short relative paths, as a user types them, except the start-up checks,
which run ``python -m mwumkl_dist`` as a user does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file, load_diabetes

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.cli import main

REPO = Path(__file__).resolve().parents[1]
FAST = ["--C", "10", "--epsilon", "0.4", "--polish", "no"]


def one_line_error(capsys, argv, code: int = 1) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("mwumkl-dist: error: ") and len(err) <= 200, (len(err), err)
    return err


# ----------------------------------------------------------------------------- labels that are not classes


def test_a_regression_target_is_refused_naming_the_classes_and_rows():
    X, y = load_diabetes(return_X_y=True)  # 442 rows, whole-number targets: 214 "classes"
    with pytest.raises(ValueError, match=r"214 classes among 442 rows .*labels must be classes"):
        MWUMKLClassifier(C=10, epsilon=0.4, polish=False).fit(X, y.astype(int))


def test_many_classes_with_enough_rows_each_are_fitted():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(12), 4)  # 12 classes of 4 rows: a small but real many-class problem
    X = rng.random((len(y), 3)) + y[:, None]
    clf = MWUMKLClassifier(kernels="linear", C=10, epsilon=0.4, polish=False, selectivity=0).fit(X, y)
    assert len(clf.classes_) == 12


def test_the_cli_refuses_a_regression_target_and_float_labels_naming_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    X, y = load_diabetes(return_X_y=True)
    dump_svmlight_file(X, y.astype(int), "diabetes.svm")
    err = one_line_error(capsys, ["fit", "--data", "diabetes.svm", "--model", "m.npz", *FAST])
    assert "diabetes.svm: 214 classes among 442 rows" in err and "a classifier: labels must be classes" in err
    dump_svmlight_file(X[:50], y[:50] + 0.25, "floats.svm")
    err = one_line_error(capsys, ["fit", "--data", "floats.svm", "--model", "m.npz", *FAST])
    assert "floats.svm: the labels are not classes" in err and "a classifier: labels must be classes" in err
    assert not os.path.exists("m.npz")

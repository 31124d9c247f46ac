"""An unpolished fit's bias is checked on training points: never worse than the majority class."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core.mwu_rules import guarded_bias, training_errors
from mwumkl_dist.solvers.auto import FewIterationsWarning


@pytest.mark.parametrize("seed", range(5))
def test_training_errors_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    s = np.round(rng.standard_normal(40), 1)  # ties included
    y = np.where(rng.random(40) < 0.4, 1.0, -1.0)
    w = rng.uniform(0.1, 3.0, 40)
    b, err = training_errors(s, y, w)
    for bb, ee in zip(b, err):
        assert ee == pytest.approx(w[(s + bb > 0) != (y > 0)].sum() / w.sum(), abs=1e-12)
    grid = np.concatenate([-s, [-s.max() - 5, -s.min() + 5]])  # every other threshold does no better
    brute = min(w[(s + g > 0) != (y > 0)].sum() / w.sum() for g in grid)
    assert err.min() == pytest.approx(brute, abs=1e-12)
    assert err[0] == pytest.approx(w[y < 0].sum() / w.sum()) and err[-1] == pytest.approx(w[y > 0].sum() / w.sum())


def test_guarded_bias_keeps_a_good_bias_and_replaces_a_bad_one():
    s = np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])
    y = np.array([-1, -1, -1, 1, 1, 1.0])
    assert guarded_bias(s, y, 0.5) == (0.5, 0.0, 0.0, 0.5)  # perfect already
    bias, err, own, majority = guarded_bias(s, y, 10.0)  # everything positive: as bad as the majority... worse
    assert own == 0.5 and err == 0.0 and -1.0 < bias < 1.0
    y2 = np.array([-1, -1, -1, -1, -1, 1.0])  # majority error 1/6; a bias of 1.5 errs on 2 of 6
    bias, err, own, majority = guarded_bias(s, y2, 0.0)
    assert own == pytest.approx(2 / 6) and majority == pytest.approx(1 / 6) and err == 0.0 and -3 < bias < -2


@pytest.mark.timeout(120)
def test_few_iterations_never_worse_than_the_majority_class():
    rng = np.random.default_rng(0)
    n = 4000
    X = rng.random((n, 6))
    y = np.where(np.sin(4 * X[:, 0]) + X[:, 1] + 0.8 * rng.standard_normal(n) > 1.3, "rare", "common")
    majority = np.mean(y == "rare")
    assert 0.15 < majority < 0.4
    replaced = 0
    for epsilon in (0.5, 0.8):  # without the check: 37.7 % and 54.2 % training error
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            clf = MWUMKLClassifier("paper", epsilon=epsilon, C=1000.0, polish=False, n_jobs=1, solver="mwu").fit(X, y)
        assert clf.solver_ == "mwu" and not clf.polished_
        assert np.mean(clf.predict(X) != y) <= majority + 0.01
        warned = [w for w in caught if issubclass(w.category, FewIterationsWarning) and "bias" in str(w.message)]
        assert len(warned) == sum("bias" in m for m in clf.fit_warnings_)
        replaced += len(warned)
    assert replaced == 2


def test_a_polished_fit_is_left_alone():
    rng = np.random.default_rng(1)
    X = rng.random((200, 3))
    y = np.where(X[:, 0] > 0.5, 1, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FewIterationsWarning)
        clf = MWUMKLClassifier(C=10.0).fit(X, y)
    assert clf.polished_ and not any("bias" in m for m in clf.fit_warnings_)

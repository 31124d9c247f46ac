"""E6's pieces (benchmarks/bench_selection.py): the relevant-kernel masks, EasyMKL, the summary."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_selection as E6
from mwumkl_dist.kernels import KernelSet


def test_synthetic_relevant_kernels_are_the_informative_features():
    X, y, informative = E6._synthetic(2, 10, seed=3, n=200)
    assert X.shape == (200, 10) and len(informative) == 2
    assert not np.array_equal(informative, [0, 1])  # shuffled: not first
    from sklearn.datasets import make_classification

    X0, y0 = make_classification(
        n_samples=200, n_features=10, n_informative=2, n_redundant=0, shuffle=False, flip_y=0.02, random_state=3
    )
    np.testing.assert_array_equal(y, y0)
    assert {tuple(X[:, f]) for f in informative} == {tuple(X0[:, 0]), tuple(X0[:, 1])}


def test_bandwidth_problem_labels_come_from_one_width():
    X, y = E6._bandwidth(2.0, seed=0, n=300)
    assert X.shape == (300, 2) and X.min() >= 0 and X.max() <= 10
    assert 0.4 < y.mean() < 0.6


def test_easymkl_weights_favour_the_kernel_that_separates():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 30)
    signal = (y * 2.0 - 1.0)[:, None] + 0.3 * rng.standard_normal((60, 1))
    noise = rng.standard_normal((60, 1))
    Ks = np.stack([signal @ signal.T, noise @ noise.T])
    Ks /= np.einsum("ijj->i", Ks)[:, None, None] / 60
    for lam in (0.1, 0.5):
        eta = E6.easymkl_weights(Ks, y, lam)
        assert eta.sum() == pytest.approx(1.0) and np.all(eta >= 0)
        assert eta[0] > 0.8


def test_summary_and_markdown_report_medians():
    rows = [
        {"family": "a", "problem": "p", "method": "MWUMKL", "n_kernels": 12, "relevant_kernels": 3,
         "mass": m, "effective_kernels": 2.0, "error": e, "seconds": 1.0}
        for m, e in [(0.9, 0.1), (0.5, 0.3), (0.7, 0.2)]
    ]  # fmt: skip
    (summary,) = E6.summarise(rows)
    assert summary["mass"] == 0.7 and summary["error"] == 0.2 and summary["splits"] == 3
    text = E6.markdown([summary])
    assert "| a | p | 12 (3) | MWUMKL | 0.70 | 2.0 | 20.0 % | 1.00 |" in text


def test_real_problems_mark_the_original_features_relevant():
    gen = E6.problems(quick=True)
    for family, _name, _seed, X, _y, kernels, rel in gen:
        if family == "c":
            d0 = X.shape[1] - E6.N_NOISE
            specs = KernelSet(kernels, X.shape[1]).specs
            assert all(r == (s.features[0] < d0) for s, r in zip(specs, rel))
            assert np.all((X[:, d0:] >= 0) & (X[:, d0:] <= 1))
            break

"""Shared by the two-stage solver's tests: a small problem with a smooth boundary, and ranks small enough that a
few hundred rows take several levels and row blocks."""

from __future__ import annotations

import numpy as np

from mwumkl_dist.core import partition
from mwumkl_dist.solvers.two_stage import nystroem
from mwumkl_dist.solvers.two_stage import solver as two_stage_solver


def smooth_rows(n: int, d: int = 3, seed: int = 0):
    """``n`` uniform rows of ``d`` features, labels from a wave in ``x0`` plus ``x1``, with noise."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(np.sin(6 * X[:, 0]) + X[:, 1] - 0.5 + 0.2 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def use_small_ranks(monkeypatch) -> None:
    """Ranks that start at 16 landmarks and may grow to 60, rows in blocks of 64."""
    monkeypatch.setattr(nystroem, "N_COMPONENTS", 16)
    monkeypatch.setattr(two_stage_solver, "N_COMPONENTS", 16)
    monkeypatch.setattr(nystroem, "RANK_MAX", 60)
    monkeypatch.setattr(partition, "ROW_BLOCK", 64)

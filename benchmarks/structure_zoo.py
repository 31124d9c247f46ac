"""A zoo of classification problems whose signal lives in a few features, in many different shapes.

A structure search that is right in general finds the relevant features in every family below, for any
seed (the relevant features sit at random positions among the d features), and does not hurt where every
feature matters.  Each problem: features uniform on [0, 1] (except where a family says otherwise), labels
+1/-1 from a deterministic rule of the relevant features, then a fraction ``noise`` of labels flipped, so
the Bayes error is ``noise``.

    from benchmarks.structure_zoo import FAMILIES, make_problem
    X, y, relevant = make_problem("xor", n=4000, d=30, seed=0)          # one draw
    Xtr, ytr, rel = make_problem("xor", n=4000, d=30, seed=0, part=0)   # train part of a seed
    Xte, yte, _ = make_problem("xor", n=4000, d=30, seed=0, part=1)     # its test part (same rule, new rows)

A copy of ``../shared/structure_zoo.py`` (the development bench of issue 38), so that the benchmark and its test
run without the shared folder.  Run as a script for a table of the families (``python -m benchmarks.structure_zoo``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["FAMILIES", "make_problem"]


def _rule(family: str, Z: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """The noiseless score of ``family`` on the relevant columns ``Z`` (n x k); label = sign(score)."""
    c = Z - 0.5
    if family == "linear":  # additive, linear: a tilted hyperplane through the centre
        return c @ coef[: Z.shape[1]]
    if family == "additive":  # additive, nonlinear: a sum of one-feature waves
        return np.sum(np.sin(2 * np.pi * Z + coef[: Z.shape[1]]), axis=1)
    if family == "xor":  # a pure interaction of two features: neither has a marginal effect
        return c[:, 0] * c[:, 1]
    if family == "parity3":  # a three-way interaction, no marginal or pairwise effect
        return c[:, 0] * c[:, 1] * c[:, 2]
    if family == "ball":  # a ball in three features
        return 0.35**2 - np.sum(c[:, :3] ** 2, axis=1)
    if family == "checker":  # a 3 x 3 checkerboard on two features
        return np.cos(3 * np.pi * Z[:, 0]) * np.cos(3 * np.pi * Z[:, 1])
    if family == "rules":  # axis-aligned rules, as a shallow tree would write them
        return np.where(((Z[:, 0] > 0.6) & (Z[:, 1] < 0.7)) | (Z[:, 2] > 0.8), 1.0, -1.0)
    if family == "mixed":  # an interaction plus an additive term in other features
        return 2.0 * c[:, 0] * np.cos(2 * np.pi * Z[:, 1]) + (c[:, 2] ** 2 - 1.0 / 12.0) * 6.0 + 0.5 * c[:, 3]
    if family == "many":  # many weak additive features (20 relevant)
        return c @ coef[: Z.shape[1]]
    raise ValueError(f"unknown family {family!r}")


#: family -> number of relevant features
FAMILIES = {"linear": 3, "additive": 3, "xor": 2, "parity3": 3, "ball": 3, "checker": 2, "rules": 3, "mixed": 4,
            "many": 20, "dense": None, "redundant": 5}  # fmt: skip


def make_problem(family: str, n: int, d: int, seed: int, noise: float = 0.05, part: int | None = None):
    """``(X, y, relevant)`` for ``family``: ``n`` rows, ``d`` features, relevant feature indices.

    The seed fixes the rule (which features are relevant, any coefficients); ``part`` (0, 1, ...) draws
    independent rows of the same rule (train / test); ``part=None`` is the same as 0.
    ``dense``: two Gaussian classes that differ in every feature (no structure to find: a search must not hurt).
    ``redundant``: the ``ball`` rule on 5 features plus 10 noisy linear mixtures of them, among noise features.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {sorted(FAMILIES)}")
    tag = list(FAMILIES).index(family)
    rule_rng = np.random.default_rng([seed, 7919, tag])
    rows_rng = np.random.default_rng([seed, 104729, tag, 0 if part is None else part + 1])
    if family == "dense":
        y = np.where(rows_rng.random(n) < 0.5, 1.0, -1.0)
        shift = rule_rng.normal(size=d)
        shift *= 3.0 / np.linalg.norm(shift)  # class means 3 apart: Bayes error about 6.7 % before flips
        X = rows_rng.normal(size=(n, d)) + 0.5 * y[:, None] * shift[None, :]
        relevant = np.arange(d)
    elif family == "redundant":
        k = 5
        relevant = np.sort(rule_rng.choice(d, size=k + 10, replace=False))
        base, copies = relevant[:k], relevant[k:]
        X = rows_rng.random((n, d))
        mix = rule_rng.normal(size=(k, 10))
        X[:, copies] = (X[:, base] - 0.5) @ mix / np.sqrt(k) + 0.5 + 0.05 * rows_rng.normal(size=(n, 10))
        y = np.where(_rule("ball", X[:, base[:3]], np.ones(3)) > 0, 1.0, -1.0)
        relevant = np.sort(np.concatenate([base[:3], copies]))
    else:
        k = FAMILIES[family]
        if k > d:
            raise ValueError(f"family {family!r} needs d >= {k}")
        relevant = np.sort(rule_rng.choice(d, size=k, replace=False))
        coef = rule_rng.normal(size=max(k, 4))
        X = rows_rng.random((n, d))
        score = _rule(family, X[:, relevant], coef)
        y = np.where(score > 0, 1.0, -1.0)
    flip = rows_rng.random(n) < noise
    y = np.where(flip, -y, y)
    return X, y, [int(i) for i in relevant]


if __name__ == "__main__":
    for fam in FAMILIES:
        X, y, rel = make_problem(fam, 2000, 30, 0)
        print(f"{fam:10s} relevant {list(rel)}  +1 share {np.mean(y > 0):.2f}")

"""What the learned kernel weights say: weight per feature, per kernel type, the largest weights.

Works on any kernel list the estimator accepts (spec strings, kernel objects, a random bank's
``kernel_names_``) without building a million spec objects: a bank is read block by block.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from mwumkl_dist.kernels.specs import Gaussian, KernelSet, KernelSpec

__all__ = ["feature_weights", "kernel_family_weights", "kernel_type_weights", "short_kernel_name", "top_kernels"]

#: Kernels of a random bank read per block when aggregating.
_BANK_BLOCK = 65536


def _type_name(spec: KernelSpec) -> str:
    """The kernel without its feature subset: ``gaussian:2^0.5@3`` -> ``gaussian:2^0.5``."""
    return str(spec).split("@", 1)[0]


def _bank(kernel_names):
    return getattr(kernel_names, "bank", None)


def _check(kernel_names, weights) -> np.ndarray:
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1 or len(weights) != len(kernel_names):
        raise ValueError(
            f"weights must be one value per kernel ({len(kernel_names)}), got shape {weights.shape}; "
            "for a one-vs-rest model pass one row of kernel_weights_"
        )
    return weights


def feature_weights(kernel_names: Sequence, weights, n_features: int) -> np.ndarray:
    """Weight per input feature: each kernel's weight shared equally by the features it reads.

    A kernel on all features spreads its weight over all of them, so with the paper's family on
    all features every feature gets ``1 / n_features``; with per-feature kernels it is the weight
    of that feature's kernels.  The result sums to ``weights.sum()``.

    Parameters
    ----------
    kernel_names : sequence of kernel specs (strings or objects), or a bank's ``kernel_names_``
    weights : ndarray of shape (n_kernels,)
    n_features : int

    Returns
    -------
    ndarray of shape (n_features,)
    """
    weights = _check(kernel_names, weights)
    out = np.zeros(int(n_features))
    bank = _bank(kernel_names)
    if bank is not None:
        for a in range(0, len(weights), _BANK_BLOCK):
            b = min(len(weights), a + _BANK_BLOCK)
            subsets, _ = bank.block(a, b, n_features)
            np.add.at(out, subsets.ravel(), np.repeat(weights[a:b] / subsets.shape[1], subsets.shape[1]))
        return out
    for spec, w in zip(KernelSet(list(kernel_names), n_features), weights):
        if spec.features is None:
            out += w / n_features
        else:
            out[list(spec.features)] += w / len(spec.features)
    return out


def kernel_type_weights(kernel_names: Sequence, weights, n_features: int) -> dict[str, float]:
    """Weight per kernel type (the kernel without its feature subset), largest first.

    ``{"gaussian:2": 0.61, "poly:1": 0.30, ...}``: which bandwidths and degrees the data chose,
    added up over the features.
    """
    weights = _check(kernel_names, weights)
    totals: dict[str, float] = {}
    bank = _bank(kernel_names)
    if bank is not None:
        sigmas = np.asarray(bank.sigmas, dtype=np.float64)
        names = [_type_name(Gaussian(sigma=float(s))) for s in sigmas]
        for a in range(0, len(weights), _BANK_BLOCK):
            b = min(len(weights), a + _BANK_BLOCK)
            _, sig = bank.block(a, b, n_features)
            for s, name in zip(sigmas, names):
                totals[name] = totals.get(name, 0.0) + float(weights[a:b][sig == s].sum())
    else:
        for spec, w in zip(KernelSet(list(kernel_names), n_features), weights):
            name = _type_name(spec)
            totals[name] = totals.get(name, 0.0) + float(w)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def kernel_family_weights(kernel_names: Sequence, weights, n_features: int) -> dict[str, tuple[float, int]]:
    """Weight per kernel family, largest first: ``{"gaussian": (0.77, 10), "poly:1": (0.08, 1), ...}``.

    A family is a kernel type (:func:`kernel_type_weights`) without its width: every Gaussian is
    ``"gaussian"``, whatever its sigma; a polynomial keeps its degree.  The second number counts the
    family's types (for ``"gaussian"``, its distinct widths).
    """
    totals: dict[str, list] = {}
    for name, w in kernel_type_weights(kernel_names, weights, n_features).items():
        family = "gaussian" if name.startswith("gaussian:") else name
        entry = totals.setdefault(family, [0.0, 0])
        entry[0] += w
        entry[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(totals.items(), key=lambda kv: -kv[1][0])}


#: A decimal number with a fraction (``1.2402252173943313``, ``3.5e-05``), not part of a word or a power.
_DECIMAL = re.compile(r"(?<![\w.^])\d+\.\d+(?:e[+-]?\d+)?")


def short_kernel_name(name: str, digits: int = 3) -> str:
    """A kernel name for people: its decimals to ``digits`` significant digits.

    ``gaussian:1.2402252173943313@0-4`` -> ``gaussian:1.24@0-4``; ``gaussian:2^0.5`` and feature lists stay.
    The result may not parse back to the same kernel: ``kernel_names_`` keep the exact ones.
    """
    return _DECIMAL.sub(lambda m: f"{float(m.group()):.{digits}g}", str(name))


def top_kernels(kernel_names: Sequence, weights, k: int = 10) -> list[tuple[str, float]]:
    """The ``k`` largest weights with their kernels' names, largest first (ties: lower index)."""
    weights = _check(kernel_names, weights)
    k = min(int(k), len(weights))
    idx = np.argsort(-weights, kind="stable")[:k]
    return [(str(kernel_names[int(i)]), float(weights[i])) for i in idx]

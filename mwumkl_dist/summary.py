"""What a fitted model says, in lines a person reads: what was chosen and why, its errors, its weights.

:func:`fit_summary` builds the lines from the fitted attributes only (and, when given, the
training data for the training and majority-class errors); the command line's ``fit`` and ``demo``
print them, :meth:`MWUMKLClassifier.summary <mwumkl_dist.MWUMKLClassifier.summary>` returns them.
Each choice a fit makes is one entry of :data:`CHOICES`: a fitted attribute and the function that
says what it is and why.  A new automatic choice is one more entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from mwumkl_dist.data.problems import is_precomputed
from mwumkl_dist.inspection import feature_weights, kernel_family_weights, kernel_type_weights, short_kernel_name
from mwumkl_dist.io.files import format_label
from mwumkl_dist.io.zarr_format import DataStore, KernelStore
from mwumkl_dist.solvers.auto import stratified_rows
from mwumkl_dist.solvers.candidates import CANDIDATE_KINDS, describe_structure, refitted_kinds

__all__ = [
    "CHOICES",
    "LABEL_WIDTH",
    "chosen_lines",
    "describe_structure",
    "error_lines",
    "fit_summary",
    "weight_lines",
    "weights_table",
]

#: Width of the label column (``"cv error         2.6 % ..."``).
LABEL_WIDTH = 17
#: Training rows the training error is measured on (a stratified sample of larger data).
TRAINING_ERROR_POINTS = 4000


def _line(label: str, text: str) -> str:
    return f"{label:<{LABEL_WIDTH}}{text}"


def _percent(x: float) -> str:
    return f"{100 * x:.2f} %"


def _auto(model, name: str) -> bool:
    """Whether parameter ``name`` was left to the fit (``"auto"``)."""
    value = model.get_params().get(name)
    return isinstance(value, str) and value == "auto"


# ----------------------------------------------------------------------------- the choices, one line each


def _solver(model) -> str:
    solver = getattr(model, "solver_", "mwu")
    why = " (solver='auto')" if _auto(model, "solver") else ""
    if solver == "two-stage":
        residual = np.max(np.atleast_1d(getattr(model, "nystroem_residual_", np.nan)))
        rank = np.max(np.atleast_1d(model.n_components_))
        if model.polished_:
            how = "polish=True" if model.polish is True else "auto: its Gram matrix fits in memory"
            return (
                f"two-stage{why}: kernel weights on {model.weight_points_} rows, then the exact SVM on all "
                f"{rank} rows ({how}; LIBSVM on the combined kernel)"
            )
        return (
            f"two-stage{why}: kernel weights on {model.weight_points_} rows, then a linear SVM on Nystroem features "
            f"of rank {rank} (residual {residual:.3g}{_rank_stop(model)})"
        )
    if model.polished_:
        how = "auto: small enough" if _auto(model, "polish") else "polish=True"
        return f"mwu{why}, then the exact polish ({how}: LIBSVM on the combined kernel)"
    how = getattr(model, "polish_skipped_", None)  # None: a model saved before it was recorded
    how = how or ("auto: too large for it" if _auto(model, "polish") else "polish=False")
    return f"mwu{why}, no exact polish ({how}; the MWU solution is the model)"


#: Why the rank stopped (``rank_stop_reason_``), in words.
_RANK_STOPS = {
    "gain": "the held-out error of the last doubling improved by less than its standard error",
    "residual": "the features reproduce the kernel to the residual target",
    "budget": "the most landmarks the rows afford",
    "memory_limit": "the most landmarks memory_limit affords",
    "given": "n_components given",
}


def _rank_stop(model) -> str:
    reason = getattr(model, "rank_stop_reason_", None)
    if reason not in _RANK_STOPS:
        return ""
    path = getattr(model, "rank_path_", None)
    tried = f"; held-out error {', '.join(f'{_percent(e)} at {r}' for r, e in path.items())}" if path else ""
    return f"; the rank stopped: {_RANK_STOPS[reason]}{tried}"


def _C(model) -> str:
    C = model.C_
    if math.isinf(C):
        return "inf (hard margin, given)"
    unit = "size-relative, ridge 1/(C n)" if model.scale_C else "ridge 1/C, as in the paper"
    text = f"{C:g} ({unit})"
    if not _auto(model, "C"):
        return text + ": given"
    final = getattr(model, "final_C_path_", None)
    checked = ""
    if final:
        errors = ", ".join(f"{float(c):g}: {100 * e:.2f} %" for c, e in sorted(final.items()))
        checked = f"; then checked on all rows (size-relative C: held-out error {errors})"
    for kind in refitted_kinds():
        if getattr(model, kind.choice_attribute, None) is not None:
            return text + f": the C of the chosen {kind.chosen_words} (below){checked}"
    path = getattr(model, "C_path_", None)
    if not path:
        return text + ": auto without cross-validation (a kernel store, or a class too small for two folds)" + checked
    grid = sorted(float(c) for c in path)
    text += f": the lowest cross-validated error of {len(grid)} candidates ({grid[0]:g} to {grid[-1]:g})"
    return text + checked


def _epsilon(model) -> str:
    eps = f"{model.epsilon_:g}"
    if not _auto(model, "epsilon"):
        return f"{eps}: given"
    if getattr(model, "solver_", "mwu") == "two-stage" or model.polished_:
        return f"{eps} (auto: the MWU iterations only find the kernel weights, the polish solves the SVM)"
    return f"{eps} (auto: at most 0.1 and T >= n / 5 iterations, which an unpolished fit needs)"


#: The summary's choices: ``(label, fitted attribute, line)``; an entry shows when the model has the attribute
#: (None: always) and its line is not None.  Each kind of search candidate says its own
#: (:mod:`mwumkl_dist.solvers.candidates`).
CHOICES: list[tuple[str, str | None, Callable]] = [
    ("solver", "solver_", _solver),
    ("C", "C_", _C),
    *((kind.label, None, kind.summary_line) for kind in CANDIDATE_KINDS.values()),
    ("epsilon", "epsilon_", _epsilon),
    ("shards", "shard_layout_", lambda model: str(model.shard_layout_)),
]


def chosen_lines(model) -> list[str]:
    """What the fit used, one line each, with why (:data:`CHOICES`)."""
    said = [
        (label, say(model)) for label, name, say in CHOICES if name is None or getattr(model, name, None) is not None
    ]
    return [_line(label, text) for label, text in said if text is not None]


# ----------------------------------------------------------------------------- errors


def _training_error(model, X, y, seed: int) -> tuple[float, str] | None:
    """The training error on at most :data:`TRAINING_ERROR_POINTS` stratified rows, and where; None for a store
    (its rows are not read again)."""
    if isinstance(X, (DataStore, KernelStore)):
        return None
    rows = stratified_rows(y, TRAINING_ERROR_POINTS, seed)
    where = f"all {len(y)} training rows"
    if len(rows) < len(y):
        where = f"a stratified sample of {len(rows)} of the {len(y)} training rows"
        X = X[:, rows, :] if is_precomputed(model.kernels) else X[rows]  # precomputed: (m, n, n)
        y = y[rows]
    return float(np.mean(model.predict(X) != y)), where


def error_lines(model, X=None, y=None, *, seed: int = 0) -> list[str]:
    """The cross-validated error of the chosen settings with its standard error, the training error and the
    majority-class error (the last two need the training data ``X``, ``y``; ``X`` may be None for the latter)."""
    lines = []
    cv = getattr(model, "cross_validation_", None)
    if cv:
        where = "the weight stage's " if getattr(model, "solver_", "mwu") == "two-stage" else ""
        lines.append(_line(
            "cv error",
            f"{_percent(cv['error'])} +- {_percent(cv['standard_error'])} (the chosen settings; {cv['folds']}-fold "
            f"cross-validation on {where}{cv['rows']} rows)",
        ))  # fmt: skip
    measured = None if X is None or y is None else _training_error(model, X, np.asarray(y), seed)
    if measured is not None:
        lines.append(_line("training error", f"{_percent(measured[0])} ({measured[1]})"))
    if y is not None:
        labels, counts = np.unique(np.asarray(y), return_counts=True)
        top = int(np.argmax(counts))
        majority = 1.0 - counts[top] / counts.sum()
        lines.append(
            _line("majority class", f"{_percent(majority)} error (always predicting {format_label(labels[top])})")
        )
    return lines


# ----------------------------------------------------------------------------- weights


def _largest(items: list[str], limit: int) -> str:
    """``"a, b, c"``, or the ``limit`` first with ``" (largest N of M)"`` in front."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"(largest {limit} of {len(items)}) " + ", ".join(items[:limit])


def weight_lines(model, limit: int = 10) -> list[str]:
    """Effective number of kernels, the weight per kernel type, per Gaussian width and per feature."""
    weights = np.atleast_2d(model.kernel_weights_).mean(axis=0)  # one-vs-rest: averaged over the problems
    m = len(weights)
    lines = [_line("kernels used", f"{1.0 / np.sum(weights**2):.1f} effective of {m} (1 / sum mu_i^2)")]
    if isinstance(model.kernels, str) and model.kernels == "precomputed":
        return lines
    names, d = model.kernel_names_, model.n_features_in_
    families = kernel_family_weights(names, weights, d)
    if len(families) > 1:
        items = [f"{k} {w:.3f}" + (f" ({count} widths)" if count > 1 else "") for k, (w, count) in families.items()]
        lines.append(_line("per kernel type", _largest(items, limit)))
    gaussians = {k: w for k, w in kernel_type_weights(names, weights, d).items() if k.startswith("gaussian:")}
    if len(gaussians) > 1:
        items = [f"{short_kernel_name(k).split(':', 1)[1]} {w:.3f}" for k, w in gaussians.items()]
        lines.append(_line("per width", _largest(items, limit)))
    per_feature = feature_weights(names, weights, d)
    if not np.allclose(per_feature, per_feature.mean(), rtol=1e-9, atol=0):  # kernels on all features: uniform
        feature_names = getattr(model, "feature_names_in_", None)
        order = np.argsort(-per_feature, kind="stable")
        items = [f"{feature_names[i] if feature_names is not None else i} {per_feature[i]:.3f}" for i in order]
        lines.append(_line("per feature", _largest(items, limit)))
    return lines


def weights_table(names, weights, raw_weights, limit: int | None = None) -> list[str]:
    """The kernel weights as aligned lines (names rounded); the ``limit`` largest when there are more."""
    order = np.arange(len(names))
    if limit is not None and len(names) > limit:
        order = np.argsort(-np.asarray(weights), kind="stable")[:limit]
    rows = [(short_kernel_name(names[i]), f"{weights[i]:.6f}", f"{raw_weights[i]:.4e}") for i in order]
    head = ("kernel", "weight mu_i", "raw weight mu_i/r_i")
    widths = [max(len(head[k]), *(len(r[k]) for r in rows)) for k in range(3)]
    lines = [f"  {head[0]:<{widths[0]}}  {head[1]:>{widths[1]}}  {head[2]:>{widths[2]}}"]
    lines += [f"  {a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows]
    if len(order) < len(names):
        lines.append(f"  ... and {len(names) - len(order)} more kernels (the {len(order)} largest weights shown)")
    return lines


# ----------------------------------------------------------------------------- the whole summary


def kernels_line(model) -> str:
    """``scaled: 13 kernels (...)``: the spec and the kernels it became on this data."""
    spec = model.kernels if isinstance(model.kernels, str) else "kernel objects"
    m = len(model.kernel_names_)
    text = f"{spec}: {m} kernel{'s' * (m != 1)}"
    if spec != "precomputed":
        counts = {
            k: c for k, (_, c) in kernel_family_weights(model.kernel_names_, np.ones(m), model.n_features_in_).items()
        }
        n_gaussian = counts.pop("gaussian", 0)
        parts = sorted(counts) + ([f"{n_gaussian} Gaussian width{'s' * (n_gaussian != 1)}"] if n_gaussian else [])
        text += " (" + ", ".join(parts) + ")"
    scale = getattr(model, "kernel_scale_", None)
    if scale is not None:
        text += f"; Gaussian widths in units of the data's scale sigma_0 = {scale:.4g}"
    return text


def feature_scale_lines(model) -> list[str]:
    """``feature scale: ...``: the per-feature factors the fit learned (none when it did not scale)."""
    factors = getattr(model, "feature_scale_", None)
    if factors is None:
        return []
    offsets = getattr(model, "feature_offset_", np.zeros_like(factors))
    kind = "min-max to [0, 1]" if np.any(offsets != 0.0) else "times 1 / (max - min), no shift"
    changed = int(np.count_nonzero((factors != 1.0) | (offsets != 0.0)))
    text = f"{kind} on the training rows: {changed} of {len(factors)} features changed"
    if changed:
        text += f", factors {factors.min():.3g} to {factors.max():.3g}"
    return [_line("feature scale", text)]


def fit_summary(model, X=None, y=None, *, limit: int = 10, seed: int = 0, iterations: str | None = None) -> list[str]:
    """The summary of a fitted model, as lines: kernels, choices, errors, model size, weights, warnings.

    ``X``, ``y``: the training data (optional): the training error (on a stratified sample of at most
    :data:`TRAINING_ERROR_POINTS` rows) and the majority-class error; ``y`` alone gives the latter.
    ``iterations``: the text of the iterations line (the command line's says T and the time).
    """
    lines = [_line("kernels", kernels_line(model)), *feature_scale_lines(model), *chosen_lines(model)]
    lines += error_lines(model, X, y, seed=seed)
    n_iter = np.atleast_1d(model.n_iter_)
    stopped = " (stopped early: interrupted)" if model.interrupted_ else ""
    lines.append(_line("iterations", iterations or ", ".join(str(int(t)) for t in n_iter) + stopped))
    of = f" of {len(y)}" if y is not None and getattr(model, "solver_", "mwu") == "mwu" else ""
    landmarks = getattr(model, "solver_", "mwu") == "two-stage" and not model.polished_
    what = " (the Nystroem landmarks)" if landmarks else ""
    lines.append(_line("support vectors", f"{len(model.support_)}{of}{what}"))
    biases = np.atleast_1d(model.intercept_)
    more = ", ..." if len(biases) > limit else ""
    lines.append(_line("bias", ", ".join(f"{b:.6g}" for b in biases[:limit]) + more))
    lines += weight_lines(model, limit)
    for warning in getattr(model, "fit_warnings_", []):
        lines.append(_line("warning", warning))
    return lines

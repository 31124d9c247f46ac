"""Pictures of a fitted model: its kernel weights, its cross-validation path, its feature weights.

Each function draws on a matplotlib ``Axes`` (a new figure when none is given) and returns it;
:func:`plot_model` puts the panels that apply side by side.  matplotlib is an optional dependency
(``pip install 'mwumkl-dist[plot]'``); without it every function raises one ``ImportError`` that
says so.  :meth:`MWUMKLClassifier.plot <mwumkl_dist.MWUMKLClassifier.plot>` and the command line's
``mwumkl-dist plot MODEL -o FILE.png`` call these functions.

The error bars of the cross-validation path are one binomial standard error,
``sqrt(e (1 - e) / rows)`` on the rows cross-validated (the one-standard-error rule's).
"""

from __future__ import annotations

import math
import re

import numpy as np

from mwumkl_dist.inspection import feature_weights, kernel_type_weights, short_kernel_name
from mwumkl_dist.kernels.specs import Gaussian, KernelSet

__all__ = [
    "MATPLOTLIB_MISSING",
    "PLOT_KINDS",
    "plot_cv_path",
    "plot_feature_weights",
    "plot_kernel_weights",
    "plot_model",
    "plot_panel",
    "pyplot",
]

#: What ``kind`` a plot may be: the panels of :func:`plot_model`.
PLOT_KINDS = ("weights", "path", "features")
#: Rows (feature groups) of the weight map, and bars of the feature weights, at most.
MAX_ROWS = 30


#: The error without matplotlib.
MATPLOTLIB_MISSING = "plotting needs matplotlib, which is not installed: pip install 'mwumkl-dist[plot]'"


def pyplot():
    """``matplotlib.pyplot``, or an ``ImportError`` saying how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(MATPLOTLIB_MISSING) from None
    return plt


def _axes(ax, size=(6.4, 4.0)):
    if ax is not None:
        return ax
    return pyplot().subplots(figsize=size)[1]


def _mean_weights(model) -> np.ndarray:
    return np.atleast_2d(model.kernel_weights_).mean(axis=0)  # one-vs-rest: averaged over the problems


def _is_precomputed(model) -> bool:
    return isinstance(model.kernels, str) and model.kernels == "precomputed"


def _groups(model):
    """``(group names, column names, weights[group, column])`` of kernels in several feature groups, or None.

    Columns are the kernels of a group in a fixed order: the non-Gaussians by name, then the
    Gaussians by width rank (narrowest first), so per-feature families of different widths line up.
    """
    names = model.kernel_names_
    if _is_precomputed(model) or getattr(names, "bank", None) is not None:
        return None
    specs = list(KernelSet(list(names), model.n_features_in_))
    groups = list(dict.fromkeys(s.features for s in specs))
    if len(groups) < 2:
        return None
    weights = _mean_weights(model)
    cells: dict = {}
    for g in groups:
        members = [(s, w) for s, w in zip(specs, weights) if s.features == g]
        plain = sorted((str(s).split("@")[0], w) for s, w in members if not isinstance(s, Gaussian))
        gaussians = sorted(((s.sigma, w) for s, w in members if isinstance(s, Gaussian)), key=lambda t: t[0])
        cells[g] = [*plain, *((f"width {i}", w) for i, (_, w) in enumerate(gaussians))]
    columns = list(dict.fromkeys(name for row in cells.values() for name, _ in row))
    table = np.zeros((len(groups), len(columns)))
    for r, g in enumerate(groups):
        for name, w in cells[g]:
            table[r, columns.index(name)] += w
    labels = ["all" if g is None else _feature_label(model, g) for g in groups]
    return labels, columns, table


def _feature_label(model, features) -> str:
    names = getattr(model, "feature_names_in_", None)
    if len(features) == 1:
        return str(names[features[0]]) if names is not None else f"feature {features[0]}"
    return "features " + short_kernel_name("x@" + "+".join(map(str, features))).split("@", 1)[1]


def plot_kernel_weights(model, ax=None, *, limit: int = MAX_ROWS):
    """The kernel weights: a bar per kernel (by width for Gaussians), or a map of feature groups x kernels.

    Kernels on one feature group (the ``scaled`` and ``paper`` families): bars, Gaussians by width.
    Several groups (per-feature kernels): a colour map, one row per group (the ``limit`` heaviest),
    one column per kernel of the group, Gaussians by width rank (0 = narrowest).  A random bank: the
    weight per width.
    """
    ax = _axes(ax)
    weights = _mean_weights(model)
    groups = None if _is_precomputed(model) else _groups(model)
    if groups is not None:
        labels, columns, table = groups
        order = np.argsort(-table.sum(axis=1), kind="stable")[:limit]
        image = ax.imshow(table[order], aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_yticks(range(len(order)), [labels[i] for i in order])
        ax.set_xticks(range(len(columns)), columns, rotation=60, ha="right")
        ax.figure.colorbar(image, ax=ax, label="weight mu_i")
        shown = f" (the {len(order)} heaviest of {len(labels)} groups)" if len(order) < len(labels) else ""
        ax.set_title(f"kernel weights by feature group{shown}")
        return ax
    if _is_precomputed(model):
        names, values = [str(n) for n in model.kernel_names_], weights
    elif getattr(model.kernel_names_, "bank", None) is not None:
        by_type = kernel_type_weights(model.kernel_names_, weights, model.n_features_in_)
        names, values = list(by_type), np.array(list(by_type.values()))
    else:
        specs = list(KernelSet(list(model.kernel_names_), model.n_features_in_))
        order = sorted(range(len(specs)), key=lambda i: (isinstance(specs[i], Gaussian), _width(specs[i]), i))
        names = [str(model.kernel_names_[i]) for i in order]
        values = weights[order]
    labels = [short_kernel_name(n) for n in names]
    ax.bar(range(len(values)), values, color="tab:blue")
    ax.set_xticks(range(len(values)), labels, rotation=60, ha="right")
    ax.axhline(1.0 / len(weights), color="grey", linestyle=":", linewidth=1, label="uniform")
    ax.set_ylabel("weight mu_i")
    ax.set_title(f"kernel weights ({len(weights)} kernels)", loc="left")
    # Above the axes, right of the title: inside, it would cover the bars (uniform weights reach every corner).
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.2, frameon=False, fontsize="small")
    return ax


def _width(spec) -> float:
    return spec.sigma if isinstance(spec, Gaussian) else 0.0


def _standard_error(error: float, rows: int | None) -> float:
    if not rows:
        return 0.0
    return math.sqrt(max(error * (1.0 - error), 0.0) / rows)


def _has_path(model) -> bool:
    return any(getattr(model, name, None) for name in _PATHS)


#: The cross-validation paths a model may have, in the order they were searched.
_PATHS = ("C_path_", "selectivity_path_", "group_selection_path_", "width_band_path_", "structure_path_")
#: The series of the candidates keyed by ``(candidate, C)``, by path.
_CANDIDATE_SERIES = {
    "group_selection_path_": "group selection",
    "width_band_path_": "width band",
    "structure_path_": "structure",
}


def _natural_key(label: str) -> tuple:
    """The numbers in ``label``, in order: ``widths(2-4) C=10`` before ``widths(10-12) C=1``."""
    return tuple(float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", label))


def _candidate_label(what) -> str:
    """A short label of a candidate (its name after a load): ``top 3`` for ``structure(top 3 feature(s))``,
    ``relevant``, ``relevant+residual`` and ``relevant-additive`` for the relevance search's own rungs."""
    text = str(what)
    top = re.fullmatch(r"structure\(top (\d+) features?(?:\(s\))?\)", text)
    if top:
        return f"top {top.group(1)}"
    if text.startswith("structure(relevant"):
        return "relevant+residual" if "residual" in text else "relevant-additive" if "each" in text else "relevant"
    return text


def plot_cv_path(model, ax=None):
    """The cross-validated error of each candidate, with one standard error bars, the chosen one marked.

    Left of the axis the ``C`` candidates (log scale labels), then the selectivities tried at the
    chosen ``C``, then group selections, bands of widths and feature structures (``kernels="auto"``), each at
    its ``C`` and in its natural order.
    """
    ax = _axes(ax, (7.0, 4.0))
    cv = getattr(model, "cross_validation_", None) or {}
    rows = cv.get("rows")
    chosen_error = cv.get("error")
    entries = []  # (label, error, series)
    for C, error in (getattr(model, "C_path_", None) or {}).items():
        entries.append((f"C={float(C):g}", error, "C"))
    for s, error in (getattr(model, "selectivity_path_", None) or {}).items():
        entries.append((f"sel={s if isinstance(s, str) else format(float(s), 'g')}", error, "selectivity"))
    for name, series in _CANDIDATE_SERIES.items():  # each series in its natural order (not the search's)
        candidates = [(f"{_candidate_label(what)} C={float(C):g}", error, series)
                      for (what, C), error in (getattr(model, name, None) or {}).items()]  # fmt: skip
        entries.extend(sorted(candidates, key=lambda e: _natural_key(e[0])))
    if not entries:
        ax.text(0.5, 0.5, "nothing was cross-validated\n(C and selectivity given)", ha="center", va="center")
        ax.set_axis_off()
        return ax
    colours = {"C": "tab:blue", "selectivity": "tab:orange", "group selection": "tab:green", "width band": "tab:red",
               "structure": "tab:purple"}  # fmt: skip
    seen = set()
    for x, (_, error, series) in enumerate(entries):
        ax.errorbar(x, 100 * error, yerr=100 * _standard_error(error, rows), fmt="o", color=colours[series],
                    capsize=3, label=None if series in seen else series)  # fmt: skip
        seen.add(series)
    if chosen_error is not None:
        ax.axhline(100 * chosen_error, color="black", linestyle="--", linewidth=1, label="chosen")
    ax.set_xticks(range(len(entries)), [e[0] for e in entries], rotation=60, ha="right")
    ax.set_ylabel("cross-validated error (%)")
    where = f" ({cv['folds']}-fold, {rows} rows)" if rows else ""
    ax.set_title(f"cross-validation path{where}")
    ax.legend(loc="best", fontsize="small")
    return ax


def plot_feature_weights(model, ax=None, *, limit: int = MAX_ROWS):
    """The kernel weight per input feature (each kernel's weight shared by the features it reads), largest first."""
    ax = _axes(ax)
    if _is_precomputed(model):
        ax.text(0.5, 0.5, "precomputed kernels: no features", ha="center", va="center")
        ax.set_axis_off()
        return ax
    per_feature = feature_weights(model.kernel_names_, _mean_weights(model), model.n_features_in_)
    order = np.argsort(-per_feature, kind="stable")[:limit]
    names = getattr(model, "feature_names_in_", None)
    labels = [str(names[i]) if names is not None else str(i) for i in order]
    ax.barh(range(len(order)), per_feature[order], color="tab:green")
    ax.set_yticks(range(len(order)), labels)
    ax.invert_yaxis()  # the largest on top
    ax.set_xlabel("weight")
    shown = f"largest {len(order)} of {len(per_feature)}" if len(order) < len(per_feature) else "all"
    ax.set_title(f"weight per feature ({shown})")
    return ax


_PANELS = {"weights": plot_kernel_weights, "path": plot_cv_path, "features": plot_feature_weights}


def plot_panel(model, kind: str, ax=None):
    """The ``kind`` panel (``"weights"``, ``"path"`` or ``"features"``) on ``ax`` (a new figure when None)."""
    if kind not in _PANELS:
        raise ValueError(f"kind must be one of {', '.join(PLOT_KINDS)}, got {kind!r}")
    return _PANELS[kind](model, ax)


def plot_model(model, kind: str = "all", path=None, *, dpi: int = 100):
    """A figure of the ``kind`` panel (``"weights"``, ``"path"``, ``"features"``) or of all that apply.

    ``"all"`` leaves out the path of a fit that cross-validated nothing and the feature weights where
    they are all alike (kernels on all the features) or there are none (precomputed kernels).
    ``path``: also save the figure there (the format from its extension).  Returns the figure.
    """
    if kind != "all" and kind not in _PANELS:
        raise ValueError(f"kind must be 'all' or one of {', '.join(PLOT_KINDS)}, got {kind!r}")
    kinds = [kind] if kind != "all" else [k for k in PLOT_KINDS if _applies(model, k)]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.4 * len(kinds), 4.8), squeeze=False)
    for ax, k in zip(axes[0], kinds):
        _PANELS[k](model, ax)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def _applies(model, kind: str) -> bool:
    if kind == "path":
        return _has_path(model)
    if kind == "features":  # kernels on all the features weigh them all alike: nothing to see
        if _is_precomputed(model):
            return False
        per_feature = feature_weights(model.kernel_names_, _mean_weights(model), model.n_features_in_)
        return not np.allclose(per_feature, per_feature.mean(), rtol=1e-9, atol=0)
    return True

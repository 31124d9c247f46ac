"""The MWU solver: the paper's algorithm on all training rows, then the exact polish where it fits.

:class:`MWUSolver` implements the :class:`~mwumkl_dist.solvers.base.Solver` protocol: it plans the
iterations (``epsilon="auto"``), chooses ``C`` and the selectivity by cross-validation when they are
``"auto"`` (:func:`mwumkl_dist.solvers.auto.choose_C`, each fold a nested fit), solves every
one-vs-rest problem (:mod:`mwumkl_dist.solvers.mwu.one_vs_rest`), then polishes the model exactly or
checks its biases (:mod:`mwumkl_dist.solvers.mwu.model`).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from mwumkl_dist.core import progress
from mwumkl_dist.core.mwu_rules import FewIterationsWarning
from mwumkl_dist.data.problems import TrainingInput
from mwumkl_dist.data.store_problems import merge_cache_stats
from mwumkl_dist.data.weights import point_ridge, problem_weights
from mwumkl_dist.solvers import auto
from mwumkl_dist.solvers.base import Calibration, FitTask, FittedModel
from mwumkl_dist.solvers.groups import GroupSelection, WidthBand, n_groups, selected_mask
from mwumkl_dist.solvers.mwu.model import guard_biases, model_attributes, polish_model, polishes, rows_to_score
from mwumkl_dist.solvers.mwu.one_vs_rest import SolveSettings, base_ridge, check_shard_count, solve_one_vs_rest
from mwumkl_dist.solvers.spec import FitSpec
from mwumkl_dist.solvers.structure import FeatureStructure, Screen, kernels_of, structured_kernels

__all__ = ["MWUSolver"]


class MWUSolver:
    """MWUMKL on every training row (``solver="mwu"``); runs on any input, engine and device."""

    name = "mwu"

    def blocker(self, spec: FitSpec, data: TrainingInput, *, resume=None) -> str | None:
        return None

    def fit(self, spec: FitSpec, task: FitTask) -> FittedModel:
        data = task.data
        if spec.n_shards != "auto":
            check_shard_count(spec.n_shards, data.n_samples)
        n, m = data.n_samples, len(data.kernel_names)
        if spec.polish is True and data.polish_blocker is not None:
            raise ValueError(f"polish=True is not available for {data.polish_blocker}")
        plan = auto.plan_iterations(
            epsilon="auto" if spec.epsilon is None else spec.epsilon, max_iter=spec.max_iter, rho=spec.rho,
            polish=spec.polish, C=spec.C, n_samples=n, n_kernels=m, in_memory=data.polish_blocker is None,
        )  # fmt: skip
        if plan.n_iter == 0 and not (plan.polished and polishes(spec.polish, data, 1.0, m)):
            raise ValueError("max_iter=0 leaves the model to the exact polish, which this fit does not run")
        attrs = {"classes_": task.classes, "solver_": "mwu", "epsilon_": plan.epsilon, "fit_warnings_": []}
        if plan.warning is not None:  # before any fitting, C="auto"'s included
            warnings.warn(plan.warning, FewIterationsWarning, stacklevel=4)
            attrs["fit_warnings_"].append(plan.warning)
        point_weights = [
            problem_weights(data.y, task.classes, t, task.class_weight, task.sample_weight) for t in task.targets
        ]
        ridge, selectivity = self._choose_ridge(spec, task, plan, point_weights, attrs)
        if isinstance(selectivity, FeatureStructure):
            return self._fit_structure(spec, task, selectivity, attrs)
        if isinstance(selectivity, (GroupSelection, WidthBand)):
            return self._fit_kernel_subset(spec, task, selectivity, attrs)
        attrs["selectivity_"] = selectivity
        ridges = [point_ridge(ridge, w) for w in point_weights]
        settings = SolveSettings(
            plan.epsilon, spec.rho, plan.n_iter, ridges, auto.solver_selectivity(selectivity, plan.epsilon, m)
        )
        # An unpolished model's bias check scores training rows: the solves read them off V (see guard_biases).
        to_score = (
            None if polishes(spec.polish, data, attrs["C_"], m) else rows_to_score(data.y, len(task.targets), task.seed)
        )
        results, traces, stats = solve_one_vs_rest(spec, data, task.classes, settings, task.client, task.resume,
                                                   rows_to_score=to_score, backend=task.backend)  # fmt: skip
        attrs.update(model_attributes(results, data, task.targets, traces))
        layouts = [s["layout"] for s in stats if "layout" in s]
        if layouts:  # the first problem's (the others' are alike)
            attrs["shard_layout_"] = f"MWU iterations: {layouts[0].reason}"
        cache_info = merge_cache_stats(stats)
        if cache_info is not None:
            attrs["cache_info_"] = cache_info
        attrs.update(polish_model(attrs, data, task.targets, ridges, spec.polish))
        train_scores = None
        if not attrs["polished_"]:
            train_scores = guard_biases(
                spec, attrs, data, task.targets, task.class_weight, task.sample_weight, task.seed,
                few_iterations=plan.warning is not None, results=results,
            )  # fmt: skip
        relative_C = attrs["C_"] if spec.scale_C else attrs["C_"] / n  # the folds scale C to their size
        per_point = None if plan.polished else plan.n_iter / n
        return FittedModel(attrs, Calibration(relative_C, plan.polished, per_point, selectivity), train_scores)

    def _fit_kernel_subset(self, spec: FitSpec, task: FitTask, selection, attrs: dict):
        """A group selection or a band of widths (see :mod:`mwumkl_dist.solvers.groups`): the model on the
        kept kernels with selectivity 0 at the chosen ``C``; the other kernels get weight 0.  A group
        selection first runs its selection fit, which says which groups stay.  A band of ``kernels="auto"``
        (its own Gaussians, not a part of the kernel set) is a model on its own kernels."""
        data, n = task.data, task.data.n_samples
        relative_C = attrs["C_"] if spec.scale_C else attrs["C_"] / n
        kernels = list(data.kernels)
        if isinstance(selection, WidthBand) and selection.sigmas:
            described = {"width_band_": selection.describe(kernels)}
            return self._fit_own_kernels(spec, task, selection.kernels(kernels), described, selection, attrs)
        if isinstance(selection, WidthBand):
            mask = selection.mask(kernels)
            traces = data.kernel_traces()
            described = {"width_band_": selection.describe(kernels)}
        else:
            chooser = replace(spec, C=selection.C, scale_C=True, selectivity=selection.selectivity, solver="mwu",
                              probability=False, checkpoint=None, callback=None, verbose=0)  # fmt: skip
            with progress.stage("group selection fit"):
                chosen = task.fit(chooser, data, seed=task.seed, sample_weight=task.sample_weight)
            mask = selected_mask(kernels, chosen["kernel_weights_"], selection.keep, selection.top)
            traces = chosen["kernel_traces_"]
        kept = [k for k, keep in zip(kernels, mask) if keep]
        if isinstance(selection, GroupSelection):
            described = {"group_selection_": selection.describe(n_groups(kept), n_groups(kernels))}
        model = self.fit(
            replace(spec, C=relative_C, scale_C=True, selectivity=0.0), replace(task, data=data.with_kernels(kept))
        )
        out = model.attributes
        for name in ("kernel_weights_", "raw_kernel_weights_"):
            out[name] = _on_all_kernels(out[name], mask)
        if isinstance(selection, WidthBand):  # the fit's own traces, the others' from the rows
            traces[mask] = out["kernel_traces_"]
        out["kernel_traces_"] = traces
        out.update(C_=attrs["C_"], selectivity_=0.0, **described, **_kept_from_search(attrs, out))
        calibration = replace(model.calibration, selectivity=selection)
        return FittedModel(out, calibration, model.train_scores)  # the same rows, and decision values

    def _fit_own_kernels(self, spec: FitSpec, task: FitTask, kernels, described: dict, selection, attrs: dict):
        """The model on ``kernels`` (not the input's) with selectivity 0 at the chosen ``C``: a structured model or
        a band of ``kernels="auto"``.  Its kernels are the model's (``kernel_names_``); ``described`` records the
        choice, and ``selection`` is what probabilities' folds refit."""
        data, n = task.data, task.data.n_samples
        relative_C = attrs["C_"] if spec.scale_C else attrs["C_"] / n
        own = data.with_kernels(kernels)
        model = self.fit(replace(spec, C=relative_C, scale_C=True, selectivity=0.0), replace(task, data=own))
        out = model.attributes
        out.update(kernel_names_=own.kernel_names, C_=attrs["C_"], selectivity_=0.0, **described,
                   **_kept_from_search(attrs, out))  # fmt: skip
        return FittedModel(out, replace(model.calibration, selectivity=selection), model.train_scores)

    def _fit_structure(self, spec: FitSpec, task: FitTask, structure: FeatureStructure, attrs: dict):
        """The structured candidate (see :mod:`mwumkl_dist.solvers.structure`): the model on the kernels of the
        features the screen (cross-validation's, or one of this fit's rows) ranks first, or the features and
        widths ``structure.kept``, with selectivity 0 at the chosen ``C``.  Its kernels are the model's
        (``kernel_names_``)."""
        scale = task.data.data_scale()
        screen = None
        if structure.kept is not None:
            features, sigmas, groups = structure.kept
            kernels = kernels_of(scale, features, sigmas, groups)
            sigmas = [k.sigma for k in kernels[: len(kernels) - sum(len(g[1]) for g in groups)]]
        else:
            screen = structure.screen if structure.screen is not None else self._screen(task)
            kernels, features, sigmas, groups = structured_kernels(scale, screen, structure.top)
        described = {
            "structure_": {
                "top": int(structure.top),
                "features": [int(f) for f in features],
                "sigmas": [float(s) for s in sigmas],
            }
        }
        if groups:  # bands of their own beside the joint band (structure.structured_kernels)
            described["structure_"]["groups"] = [{"features": [int(f) for f in g], "sigmas": [float(s) for s in w]}
                                                 for g, w in groups]  # fmt: skip
        if screen is not None:
            described["structure_"].update(screened_rows=int(screen.rows),
                                           feature_weights=[float(w) for w in screen.feature_weights])  # fmt: skip
        # Probabilities' folds refit the same features and widths (as they refit the chosen C), each on its rows.
        chosen = FeatureStructure.of_model(described["structure_"])
        return self._fit_own_kernels(spec, task, kernels, described, chosen, attrs)

    @staticmethod
    def _screen(task: FitTask) -> Screen:
        """The structure screen of (a stratified sample of) the fit's rows."""
        cv = task.data.cross_validation_input(auto.AUTO_C_POINTS, task.seed)
        if cv is None:
            raise ValueError("a structured model needs feature rows to screen (not a kernel store)")
        return Screen.of_rows(*auto.screen_rows(cv, np.arange(len(cv.y)), task.seed))

    @staticmethod
    def _choose_ridge(spec: FitSpec, task: FitTask, plan, point_weights, attrs: dict):
        """``(1 / C_eff, selectivity)``, cross-validated when ``"auto"``; records ``C_`` and the paths in ``attrs``."""
        n = task.data.n_samples
        selectivity = spec.selectivity
        if spec.C is not None:
            if selectivity == "auto":  # a given C: no cross-validation behind the user's back
                selectivity = auto.AUTO_SELECTIVITY_START
            attrs["C_"] = spec.C
            return base_ridge(spec.C, n, spec.scale_C), selectivity
        # Unpolished and weighted: folds at the final fit's T / n (see auto.fold_spec).
        unequal = any(np.ndim(point_ridge(1.0, w)) for w in point_weights)
        per_point = plan.n_iter / n if unequal and not plan.polished else None
        C, selectivity, attrs["C_path_"], selectivity_path, group_path, band_path, structure_path, chosen = (
            auto.choose_C(spec, task.data, fit=task.fit, polished=plan.polished, seed=task.seed,
                          sample_weight=task.sample_weight, iterations_per_point=per_point,
                          choose_selectivity=selectivity == "auto")
        )  # fmt: skip
        if spec.selectivity == "auto":
            attrs["selectivity_path_"] = selectivity_path
        if group_path:
            attrs["group_selection_path_"] = group_path
        if band_path:
            attrs["width_band_path_"] = band_path
        if structure_path:
            attrs["structure_path_"] = structure_path
        if chosen:
            attrs["cross_validation_"] = chosen
        attrs["C_"] = C if spec.scale_C else C * n
        return base_ridge(C, n, scale_C=True), selectivity


#: The cross-validation paths a model on some of the kernels keeps from the search that chose it.
_PATHS = (
    "C_path_",
    "selectivity_path_",
    "group_selection_path_",
    "width_band_path_",
    "structure_path_",
    "cross_validation_",
)


def _kept_from_search(attrs: dict, refit: dict) -> dict:
    """The search's paths, and its warnings before the refit's (each said once)."""
    warnings_ = list(dict.fromkeys([*attrs["fit_warnings_"], *refit.get("fit_warnings_", [])]))
    return {"fit_warnings_": warnings_, **{k: attrs[k] for k in _PATHS if k in attrs}}


def _on_all_kernels(values, mask: np.ndarray) -> np.ndarray:
    """Per-kernel ``values`` of the kept kernels (last axis) spread over all kernels, 0 where ``mask`` is False."""
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros(values.shape[:-1] + (len(mask),))
    out[..., mask] = values
    return out

"""The MWU solver: the paper's algorithm on all training rows, then the exact polish where it fits.

:class:`MWUSolver` implements the :class:`~mwumkl_dist.solvers.base.Solver` protocol: it plans the
iterations (``epsilon="auto"``), chooses ``C`` and the selectivity by cross-validation when they are
``"auto"`` (:func:`mwumkl_dist.solvers.auto.choose_C`, each fold a nested fit), solves every
one-vs-rest problem (:mod:`mwumkl_dist.solvers.mwu.one_vs_rest`), then polishes the model exactly or
checks its biases (:mod:`mwumkl_dist.solvers.mwu.model`).
"""

from __future__ import annotations

import warnings

import numpy as np

from mwumkl_dist.core.mwu_rules import FewIterationsWarning
from mwumkl_dist.data.problems import TrainingInput
from mwumkl_dist.data.store_problems import merge_cache_stats
from mwumkl_dist.data.weights import point_ridge, problem_weights
from mwumkl_dist.solvers import auto
from mwumkl_dist.solvers.base import Calibration, FitTask, FittedModel
from mwumkl_dist.solvers.candidates import kind_of
from mwumkl_dist.solvers.mwu.model import guard_biases, model_attributes, polish_model, polishes, rows_to_score
from mwumkl_dist.solvers.mwu.one_vs_rest import SolveSettings, base_ridge, check_shard_count, solve_one_vs_rest
from mwumkl_dist.solvers.spec import FitSpec

__all__ = ["MWUSolver"]


class MWUSolver:
    """MWUMKL on every training row (``solver="mwu"``); runs on any input, engine and device."""

    name = "mwu"

    def blocker(self, spec: FitSpec, data: TrainingInput, *, resume=None) -> str | None:
        return None

    def fit(self, spec: FitSpec, task: FitTask) -> FittedModel:
        data = task.data
        if spec.execution.n_shards != "auto":
            check_shard_count(spec.execution.n_shards, data.n_samples)
        n, m = data.n_samples, len(data.kernel_names)
        if spec.model.polish is True and data.polish_blocker is not None:
            raise ValueError(f"polish=True is not available for {data.polish_blocker}")
        plan = auto.plan_iterations(
            epsilon="auto" if spec.model.epsilon is None else spec.model.epsilon, max_iter=spec.model.max_iter,
            rho=spec.model.rho, polish=spec.model.polish, C=spec.model.C, n_samples=n, n_kernels=m,
            in_memory=data.polish_blocker is None,
        )  # fmt: skip
        if plan.n_iter == 0 and not (plan.polished and polishes(spec.model.polish, data, 1.0, m)):
            raise ValueError("max_iter=0 leaves the model to the exact polish, which this fit does not run")
        attrs = {"classes_": task.classes, "solver_": "mwu", "epsilon_": plan.epsilon, "fit_warnings_": []}
        if plan.warning is not None:  # before any fitting, C="auto"'s included
            warnings.warn(plan.warning, FewIterationsWarning, stacklevel=4)
            attrs["fit_warnings_"].append(plan.warning)
        point_weights = [
            problem_weights(data.y, task.classes, t, task.class_weight, task.sample_weight) for t in task.targets
        ]
        ridge, selectivity, candidate = self._choose_ridge(spec, task, plan, point_weights, attrs)
        if candidate is not None:  # a group selection, a band of widths, a structure: the model on its kernels
            return kind_of(candidate).refit(self, spec, task, candidate, attrs)
        attrs["selectivity_"] = selectivity
        ridges = [point_ridge(ridge, w) for w in point_weights]
        settings = SolveSettings(
            plan.epsilon, spec.model.rho, plan.n_iter, ridges, auto.solver_selectivity(selectivity, plan.epsilon, m)
        )
        # An unpolished model's bias check scores training rows: the solves read them off V (see guard_biases).
        polished = polishes(spec.model.polish, data, attrs["C_"], m)
        to_score = None if polished else rows_to_score(data.y, len(task.targets), task.seed)
        results, traces, stats = solve_one_vs_rest(spec, data, task.classes, settings, task.client, task.resume,
                                                   rows_to_score=to_score, backend=task.backend)  # fmt: skip
        attrs.update(model_attributes(results, data, task.targets, traces))
        layouts = [s["layout"] for s in stats if "layout" in s]
        if layouts:  # the first problem's (the others' are alike)
            attrs["shard_layout_"] = f"MWU iterations: {layouts[0].reason}"
        cache_info = merge_cache_stats(stats)
        if cache_info is not None:
            attrs["cache_info_"] = cache_info
        attrs.update(polish_model(attrs, data, task.targets, ridges, spec.model.polish))
        train_scores = None
        if not attrs["polished_"]:
            train_scores = guard_biases(
                spec, attrs, data, task.targets, task.class_weight, task.sample_weight, task.seed,
                few_iterations=plan.warning is not None, results=results,
            )  # fmt: skip
        relative_C = attrs["C_"] if spec.model.scale_C else attrs["C_"] / n  # the folds scale C to their size
        per_point = None if plan.polished else plan.n_iter / n
        return FittedModel(attrs, Calibration(relative_C, plan.polished, per_point, selectivity), train_scores)

    @staticmethod
    def _choose_ridge(spec: FitSpec, task: FitTask, plan, point_weights, attrs: dict):
        """``(1 / C_eff, selectivity, candidate)``, cross-validated when ``"auto"``; records ``C_`` and the search's
        paths in ``attrs``."""
        n = task.data.n_samples
        selectivity = spec.model.selectivity
        if spec.model.C is not None:
            if selectivity == "auto":  # a given C: no cross-validation behind the user's back
                selectivity = auto.AUTO_SELECTIVITY_START
            attrs["C_"] = spec.model.C
            return base_ridge(spec.model.C, n, spec.model.scale_C), selectivity, spec.model.candidate
        if spec.model.candidate is not None:
            raise ValueError("ModelSettings.candidate needs a given C (it is the refit of a candidate C='auto' chose)")
        # Unpolished and weighted: folds at the final fit's T / n (see auto.fold_spec).
        unequal = any(np.ndim(point_ridge(1.0, w)) for w in point_weights)
        per_point = plan.n_iter / n if unequal and not plan.polished else None
        found = auto.choose_C(spec, task.data, fit=task.fit, polished=plan.polished, seed=task.seed,
                              sample_weight=task.sample_weight, iterations_per_point=per_point,
                              choose_selectivity=selectivity == "auto")  # fmt: skip
        attrs.update(found.paths)
        if found.chosen:
            attrs["cross_validation_"] = found.chosen
        attrs["C_"] = found.C if spec.model.scale_C else found.C * n
        return base_ridge(found.C, n, scale_C=True), found.selectivity, found.candidate

"""The search candidates of ``selectivity="auto"`` and ``kernels="auto"``: one class per kind, one registry.

:func:`mwumkl_dist.solvers.auto.choose_C` scores, beside the size-relative ``C``, candidates of several
kinds: plain selectivities (:class:`Selectivity`), group selections (:class:`GroupSelectionKind`,
:mod:`mwumkl_dist.solvers.groups`), bands of Gaussian widths (:class:`WidthBandKind`) and feature
structures (:class:`FeatureStructureKind`, :mod:`mwumkl_dist.solvers.structure`).  Each kind is one
class of :class:`CandidateKind`'s protocol: how the search scores it (:meth:`~CandidateKind.search`, the fits its
candidates share, a fold fit's selectivity and kernels), how the final fit refits the chosen one, its
fitted attributes (the choice and the path of cross-validated errors), its summary line, its plot entries
and how its candidates are saved in a model file.  Every consumer (the search, the MWU solver, the
two-stage fit, the model files, the summary, the plots) loops over :data:`CANDIDATE_KINDS`; a new kind is
one class here (its candidates' dataclass beside its search, as ``groups`` and ``structure`` are) and one line in that
registry.

A non-plain candidate travels in :attr:`ModelSettings.candidate <mwumkl_dist.solvers.spec.ModelSettings.candidate>`
(with the refit's ``C`` as ``C``); :func:`kind_of` is the one place that tells the kinds' values apart.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from dataclasses import replace

import numpy as np

from mwumkl_dist.core import progress
from mwumkl_dist.solvers.base import FitTask, FittedModel, stratified_rows
from mwumkl_dist.solvers.groups import (
    AUTO_BAND_C_FACTORS,
    AUTO_GROUP_C_GRID,
    AUTO_GROUP_SELECTIONS,
    GroupSelection,
    WidthBand,
    auto_width_bands,
    group_ladder,
    more_bands,
    n_groups,
    selected_kernels,
    selected_mask,
    width_bands,
)
from mwumkl_dist.solvers.spec import FitSpec
from mwumkl_dist.solvers.structure import (
    ARD_POINTS,
    MAX_WIDEN,
    STRUCTURE_C_GRID,
    FeatureStructure,
    Screen,
    kernels_of,
    structure_rungs,
    structured_kernels,
)

__all__ = [
    "AUTO_C_POINTS",
    "AUTO_SELECTIVITY_GRID",
    "CANDIDATE_KINDS",
    "CandidateKind",
    "FeatureStructureKind",
    "GroupSelectionKind",
    "Selectivity",
    "WidthBandKind",
    "choice_attributes",
    "chosen_candidate",
    "describe_structure",
    "kind_of",
    "path_attributes",
    "refitted_kinds",
    "screen_of",
    "screen_rows",
    "search_attributes",
    "search_from_json",
    "search_to_json",
    "SAVED_PATHS",
]

#: ``C="auto"`` and the candidates are cross-validated on a stratified subsample of at most this many training rows.
AUTO_C_POINTS = 4000
#: ``selectivity="auto"`` tries these (0: uniform weights; 300: about the sparsity of the exact MKL optimum
#: for hundreds of kernels at epsilon 0.2) at the C that cross-validation chose.
AUTO_SELECTIVITY_GRID = (0.0, 30.0, 100.0, 300.0)


class CandidateKind:
    """The protocol of a kind of search candidate (class attributes and class methods; never instantiated).

    ``name`` is its key in :data:`CANDIDATE_KINDS` and in saved files; ``label`` its summary line's label
    and its plot series; ``chosen_words`` what the ``C`` line calls it; ``choice_attribute`` and
    ``path_attribute`` its fitted attributes (what was chosen, the cross-validated error of each
    candidate); ``uniform_weights``: its model has uniform kernel weights whatever the MWU iterations do.
    """

    name: str = ""
    label: str = ""
    chosen_words: str = ""
    choice_attribute: str = ""
    path_attribute: str = ""
    colour: str = "tab:gray"
    uniform_weights: bool = False
    #: The value of the choice attribute of a model saved before the kind existed.
    missing_choice: object = None
    #: The candidates' class (a frozen dataclass), for a path's keys in a model file.
    value_type: type | None = None
    #: The fits the candidates share in one cross-validation (:meth:`shared_jobs`), in words.
    shared_noun: str = ""
    shared_doing: str = "choosing C by cross-validation"

    @classmethod
    def matches(cls, value) -> bool:
        """Whether ``value`` is a candidate of this kind."""
        return cls.value_type is not None and isinstance(value, cls.value_type)

    # -- the search

    @classmethod
    def search(cls, state) -> None:
        """Score this kind's candidates and choose one when it wins (:class:`mwumkl_dist.solvers.auto.Search`)."""

    @classmethod
    def scored(cls, path: dict, state) -> dict:
        """This kind's ``path`` keyed as the search compares candidates: ``(C, candidate)``."""
        return {(c, what): e for (what, c), e in path.items()}

    @classmethod
    def shared_jobs(cls, scorer, candidates) -> list:
        """The fits ``candidates`` (this kind's) share, not yet run (run first, side by side)."""
        return []

    @classmethod
    def run_shared(cls, scorer, job):
        """One shared fit."""
        raise NotImplementedError

    @classmethod
    def keep_shared(cls, scorer, jobs, results, candidates) -> None:
        """Record the shared fits' ``results`` in ``scorer.shared[cls.name]``."""

    @classmethod
    def fold_fit(cls, scorer, candidate, k: int) -> tuple:
        """``(selectivity, kernels)`` of fold ``k``'s fit of ``candidate`` (kernels None: the fold's own)."""
        return 0.0, None

    # -- the final fit

    @classmethod
    def refit(cls, solver, spec: FitSpec, task: FitTask, candidate, attrs: dict) -> FittedModel:
        """The model of the chosen ``candidate`` at ``attrs["C_"]``: ``solver``'s fit on the candidate's kernels."""
        raise NotImplementedError

    @classmethod
    def from_attributes(cls, attributes: dict):
        """The candidate a fitted model's ``attributes`` chose (what probabilities' folds refit), or None."""
        return None

    # -- what a person reads

    @classmethod
    def summary_line(cls, model) -> str | None:
        """The summary's line on this kind's choice (None: nothing to say)."""
        return None

    @classmethod
    def plot_entries(cls, model) -> list:
        """``(label, error)`` of each candidate of the model's path, in the order the plot shows them."""
        entries = [(f"{cls.plot_label(what)} C={float(C):g}", error)
                   for (what, C), error in (getattr(model, cls.path_attribute, None) or {}).items()]  # fmt: skip
        return sorted(entries, key=lambda entry: _natural_key(entry[0]))

    @classmethod
    def plot_label(cls, candidate) -> str:
        return str(candidate)

    # -- model files

    @classmethod
    def choice_to_json(cls, value):
        return value

    @classmethod
    def choice_from_json(cls, value):
        return dict(value)

    @classmethod
    def to_json(cls, candidate) -> dict:
        """A candidate as JSON: its dataclass fields that take part in comparisons (what identifies it)."""
        return {f.name: _jsonable(getattr(candidate, f.name)) for f in dataclasses.fields(candidate) if f.compare}

    @classmethod
    def from_json(cls, value: dict):
        """The candidate of :meth:`to_json` (lists back to tuples: candidates are hashable)."""
        return cls.value_type(**{name: _hashable(v) for name, v in value.items()})


class Selectivity(CandidateKind):
    """A plain selectivity (a number, ``"paper"``, ``"exact"``): the fit itself, no refit."""

    name = "selectivity"
    label = "selectivity"
    choice_attribute = "selectivity_"
    path_attribute = "selectivity_path_"
    colour = "tab:orange"
    missing_choice = "paper"  # models saved before the selectivity existed used the paper's rule

    @classmethod
    def matches(cls, value) -> bool:
        return isinstance(value, (str, numbers.Real)) and not isinstance(value, (bool, np.bool_))

    @classmethod
    def search(cls, state) -> None:
        """The least selective of :data:`AUTO_SELECTIVITY_GRID` within one standard error of the best, at ``C``."""
        C, C_path, start = state.C, state.C_path, state.start
        todo = [s for s in AUTO_SELECTIVITY_GRID if not (s == start and C in C_path)]
        found = dict(zip(todo, state.scorer.errors([(C, s) for s in todo], "choosing the selectivity")))
        path = {s: found[s] if s in found else C_path[C] for s in AUTO_SELECTIVITY_GRID}
        state.paths[cls.path_attribute] = path
        state.selectivity = state.least_selective_within_one_standard_error(path)

    @classmethod
    def scored(cls, path: dict, state) -> dict:
        return {(state.base_C, s): e for s, e in path.items()}

    @classmethod
    def fold_fit(cls, scorer, candidate, k: int) -> tuple:
        return candidate, None

    @classmethod
    def refit(cls, solver, spec, task, candidate, attrs):
        raise TypeError("a plain selectivity is no refit: it travels in ModelSettings.selectivity")

    @classmethod
    def summary_line(cls, model) -> str | None:
        value = getattr(model, cls.choice_attribute, None)
        if value is None:
            return None
        text = value if isinstance(value, str) else f"{value:g}"
        if any(getattr(model, kind.choice_attribute, None) is not None for kind in refitted_kinds()):
            return f"{text}: uniform weights on the kept kernels"
        if model.get_params().get("selectivity") != "auto":
            return f"{text}: given"
        path = getattr(model, cls.path_attribute, None)
        if not path:
            return f"{text}: auto with a given C (nothing cross-validated)"
        return f"{text}: the least selective of {len(path)} candidates within one standard error of the best"

    @classmethod
    def plot_entries(cls, model) -> list:
        path = getattr(model, cls.path_attribute, None) or {}
        return [(f"sel={s if isinstance(s, str) else format(float(s), 'g')}", error) for s, error in path.items()]

    @classmethod
    def choice_from_json(cls, value):
        return value


class GroupSelectionKind(CandidateKind):
    """A group selection (:class:`~mwumkl_dist.solvers.groups.GroupSelection`): a selection fit chooses the
    feature groups, the model is refitted on their kernels with uniform weights."""

    name = "group_selection"
    label = "group selection"
    chosen_words = "group selection"
    choice_attribute = "group_selection_"
    path_attribute = "group_selection_path_"
    colour = "tab:green"
    value_type = GroupSelection
    shared_noun = "selection fits"

    @classmethod
    def search(cls, state) -> None:
        """Kernels in two or more feature groups: the selections of :data:`AUTO_GROUP_SELECTIONS` and the ladder;
        the fewest groups within one paired standard error of the best, when within one standard error of the
        best plain selectivity."""
        scorer = state.scorer
        kernel_set = scorer.cv.kernel_set  # kernels in two or more feature groups (no random bank)
        if kernel_set is None or kernel_set.bank is not None or n_groups(kernel_set.specs) < 2:
            return
        candidates = [(c, g) for g in AUTO_GROUP_SELECTIONS for c in AUTO_GROUP_C_GRID]
        ladder = group_ladder(n_groups(scorer.cv.kernel_set.specs))
        candidates += [(state.C * f, g) for g in ladder for f in AUTO_BAND_C_FACTORS]
        path = {(g, c): e for (c, g), e in zip(candidates, scorer.errors(candidates, "group selections"))}
        state.paths[cls.path_attribute] = path
        # The fewest groups within one paired standard error of the best selection (the one-standard-error
        # rule on the model's size: a selection that keeps more groups must be measurably better).  Paired:
        # the binomial standard error of ~400 rows (2 points) let selections of too few groups through.
        best = state.first_best(path)
        close = [key for key, e in path.items()
                 if e - path[best] <= scorer.paired_standard_error(key[::-1], best[::-1])]  # fmt: skip
        pick = min(close, key=lambda key: (cls.groups_kept(scorer, key[0]), path[key]))
        plain = state.paths.get(Selectivity.path_attribute, {})
        if state.within_one_standard_error(path[pick], [*plain.values(), path[pick]]):
            state.choose(pick[1], pick[0])

    @staticmethod
    def groups_kept(scorer, selection: GroupSelection) -> float:
        """How many feature groups ``selection`` kept, on average over the folds (after it was scored)."""
        selected = scorer.shared["group_selection"]["selected"]
        return float(np.mean([n_groups(selected[selection, f]) for f in range(len(scorer.folds))]))

    @classmethod
    def shared_jobs(cls, scorer, candidates) -> list:
        """One selection fit per (C, selectivity) and fold, shared by the selections that keep groups differently."""
        weights = scorer.shared.setdefault(cls.name, {"weights": {}, "selected": {}})["weights"]
        return list(dict.fromkeys((s.C, s.selectivity, f) for s in candidates for f in range(len(scorer.folds))
                                  if (s.C, s.selectivity, f) not in weights))  # fmt: skip

    @classmethod
    def run_shared(cls, scorer, job):
        return scorer.selection_fit(*job)

    @classmethod
    def keep_shared(cls, scorer, jobs, results, candidates) -> None:
        shared = scorer.shared[cls.name]
        shared["weights"].update(zip(jobs, results))
        for selection in dict.fromkeys(candidates):
            for f in range(len(scorer.folds)):
                weights = shared["weights"][selection.C, selection.selectivity, f]
                shared["selected"][selection, f] = selected_kernels(scorer.fold_kernels[f], weights, selection.keep,
                                                                    selection.top)  # fmt: skip

    @classmethod
    def fold_fit(cls, scorer, candidate, k: int) -> tuple:
        return 0.0, scorer.shared[cls.name]["selected"][candidate, k]

    @classmethod
    def refit(cls, solver, spec, task, candidate, attrs):
        """The selection fit, then the model on the kept groups' kernels (the others get weight 0)."""
        data = task.data
        kernels = list(data.kernels)
        chooser = FitSpec(replace(spec.model, C=candidate.C, scale_C=True, selectivity=candidate.selectivity,
                                  candidate=None, solver="mwu", probability=False), spec.execution.quiet())  # fmt: skip
        with progress.stage("group selection fit"):
            chosen = task.fit(chooser, data, seed=task.seed, sample_weight=task.sample_weight)
        mask = selected_mask(kernels, chosen["kernel_weights_"], candidate.keep, candidate.top)
        kept = [k for k, keep in zip(kernels, mask) if keep]
        described = {cls.choice_attribute: candidate.describe(n_groups(kept), n_groups(kernels))}
        return _refit_on_some_kernels(solver, spec, task, candidate, attrs, mask, chosen["kernel_traces_"],
                                      described, own_traces=False)  # fmt: skip

    @classmethod
    def from_attributes(cls, attributes: dict):
        chosen = attributes.get(cls.choice_attribute)
        if chosen is None:
            return None
        return GroupSelection(chosen["C"], chosen["selectivity"], chosen["keep"], chosen.get("top"))

    @classmethod
    def summary_line(cls, model) -> str | None:
        g = getattr(model, cls.choice_attribute, None)
        if g is None:
            return None
        return (
            f"kept {g['groups_kept']} of {g['groups']} feature groups (a fit at C {g['C']:g}, selectivity "
            f"{g['selectivity']:g}): within one standard error of the best candidate, with fewer inputs"
        )


class WidthBandKind(CandidateKind):
    """A band of Gaussian widths (:class:`~mwumkl_dist.solvers.groups.WidthBand`) with uniform weights."""

    name = "width_band"
    label = "width band"
    chosen_words = "band of widths"
    choice_attribute = "width_band_"
    path_attribute = "width_band_path_"
    colour = "tab:red"
    uniform_weights = True
    value_type = WidthBand

    @classmethod
    def search(cls, state) -> None:
        """Bands at ``C`` and :data:`AUTO_BAND_C_FACTORS` times it (``kernels="auto"``: then their neighbours); the
        best wins when better than the best other candidate by more than their paired standard error."""
        scorer = state.scorer
        bands = cls._bands(scorer) if scorer.spec.model.width_bands else []
        if not bands:
            return
        others = state.scored()  # groups and bands never both apply: one feature group against several
        rival = state.first_best(others)

        def score(bands) -> dict:
            candidates = [(state.C * f, b) for b in bands for f in AUTO_BAND_C_FACTORS]
            return {(b, c): e for (c, b), e in zip(candidates, scorer.errors(candidates, "bands of widths"))}

        path = score(bands)
        band, band_C = state.first_best(path)
        for _ in range(2):  # kernels="auto": the neighbours of the best band, then one beyond an edge
            more = cls._more_bands(scorer, band, {b for b, _ in path})
            if not more:
                break
            path.update(score(more))
            band, band_C = state.first_best(path)
        state.paths[cls.path_attribute] = path
        if others[rival] - path[band, band_C] > scorer.paired_standard_error((band_C, band), rival):
            state.choose(band_C, band)

    @staticmethod
    def _bands(scorer) -> list:
        """The bands of Gaussian widths scored as candidates (:func:`~mwumkl_dist.solvers.groups.width_bands`;
        with ``kernels="auto"`` :func:`~mwumkl_dist.solvers.groups.auto_width_bands`, on the ladder that goes
        beyond the scaled family's widths, memorising ones included: the cross-validation decides)."""
        kernel_set = scorer.cv.kernel_set
        if kernel_set is None or kernel_set.bank is not None:
            return []
        if scorer.searches_structure:
            return auto_width_bands(scorer.cv.data_scale().sigma())
        return width_bands(kernel_set.specs)

    @staticmethod
    def _more_bands(scorer, band, scored) -> list:
        """The bands to score next after ``scored`` (``kernels="auto"`` only, see
        :func:`~mwumkl_dist.solvers.groups.more_bands`)."""
        if not (scorer.searches_structure and band.sigmas):
            return []
        return more_bands(band, scorer.cv.data_scale().sigma(), scored)

    @classmethod
    def fold_fit(cls, scorer, candidate, k: int) -> tuple:
        return 0.0, candidate.kernels(scorer.fold_kernels[k])

    @classmethod
    def refit(cls, solver, spec, task, candidate, attrs):
        """The band's kernels of the kernel set (the others get weight 0), or its own Gaussians (``kernels="auto"``)."""
        kernels = list(task.data.kernels)
        described = {cls.choice_attribute: candidate.describe(kernels)}
        if candidate.sigmas:
            return _refit_on_own_kernels(solver, spec, task, candidate.kernels(kernels), described, candidate, attrs)
        return _refit_on_some_kernels(solver, spec, task, candidate, attrs, candidate.mask(kernels),
                                      task.data.kernel_traces(), described, own_traces=True)  # fmt: skip

    @classmethod
    def from_attributes(cls, attributes: dict):
        band = attributes.get(cls.choice_attribute)
        if band is None:
            return None
        return WidthBand(band["first"], band["last"], tuple(band["sigmas"]) if band.get("own_kernels") else ())

    @classmethod
    def summary_line(cls, model) -> str | None:
        band = getattr(model, cls.choice_attribute, None)
        if band is None:
            return None
        sigmas = ", ".join(f"{s:.3g}" for s in band["sigmas"])
        return (
            f"Gaussians of widths {sigmas} (ranks {band['first']}-{band['last']} of {band['widths']}): better than "
            "the best other candidate by more than the standard error of their difference"
        )


class FeatureStructureKind(CandidateKind):
    """A feature structure (:class:`~mwumkl_dist.solvers.structure.FeatureStructure`, ``kernels="auto"``): a joint
    band of Gaussians on the features a relevance screen ranks first."""

    name = "structure"
    label = "structure"
    chosen_words = "structure"
    choice_attribute = "structure_"
    path_attribute = "structure_path_"
    colour = "tab:purple"
    uniform_weights = True
    value_type = FeatureStructure
    shared_noun = "screens"
    shared_doing = "screening feature subsets"

    @classmethod
    def search(cls, state) -> None:
        """Every rung of :func:`~mwumkl_dist.solvers.structure.structure_rungs`, against the best of every candidate
        scored so far by the paired rule (as for bands)."""
        scorer = state.scorer
        if not scorer.searches_structure:
            return
        others = state.scored()
        rival = state.first_best(others)
        path, rung = cls._score_rungs(state)
        state.paths[cls.path_attribute] = path
        rung, rung_C = state.first_best({key: e for key, e in path.items() if key[0] == rung})
        if others[rival] - path[rung, rung_C] > scorer.paired_standard_error((rung_C, rung), rival):
            screen = Screen.mean(scorer.shared[cls.name][k] for k in range(len(scorer.folds)))
            state.choose(rung_C, FeatureStructure(rung.top, screen, widen=rung.widen))

    @classmethod
    def _score_rungs(cls, state) -> tuple[dict, FeatureStructure]:
        """The path: the relevant features' rung at its own ``C`` (the all-features family's C is the smallest of the
        grid where that family is at chance, a ridge that leaves a fine checkerboard at chance too: the zoo's checker,
        every rung 49-51 % at C 0.1), every other rung at that C, then the fewest features within a paired standard
        error of the best rung (the simpler model) also at its neighbours in the grid; and that rung."""
        scorer = state.scorer
        rungs = structure_rungs(scorer.n_features)
        grid = STRUCTURE_C_GRID if state.given_C is None else (state.base_C,)
        scored = scorer.errors([(c, rungs[0]) for c in grid], "feature structures")
        path = {(rungs[0], c): e for c, e in zip(grid, scored)}
        rung_C = state.first_best({c: path[rungs[0], c] for c in grid})
        scored = scorer.errors([(rung_C, r) for r in rungs[1:]], "feature structures")
        path.update({(r, rung_C): e for r, e in zip(rungs[1:], scored)})
        at_C = {(r, rung_C): path[r, rung_C] for r in rungs}
        best = state.first_best(at_C)
        rung = next(r for r in rungs if at_C[r, rung_C] - at_C[best]
                    <= scorer.paired_standard_error((rung_C, r), best[::-1]))  # fmt: skip
        if state.given_C is None:
            i = state.C_grid.index(rung_C)
            near = [c for c in state.C_grid[max(i - 1, 0) : i + 2] if (rung, c) not in path]
            scored = scorer.errors([(c, rung) for c in near], "feature structures")
            path.update({(rung, c): e for c, e in zip(near, scored)})
        return path, cls._widened(state, path, rung)

    @classmethod
    def _widened(cls, state, path: dict, rung: FeatureStructure) -> FeatureStructure:
        """``rung`` with its widths one octave wider at a time (at most :data:`MAX_WIDEN`), each at its narrower's best
        ``C`` and the next larger of the grid (a smoother kernel wants a weaker ridge), kept while its error is at
        most the narrower's (the alignment's optimum is narrower than the classifier's; a smoother kernel needs fewer
        Nystroem landmarks on many rows).  No slack of a standard error: the best width shrinks as the rows grow, so
        a width the subsample finds merely as good is too smooth for the final fit (E7's rows, 10^6: with the slack
        two octaves, 6.87 % test error; the strict rule one octave)."""
        scorer = state.scorer
        for widen in range(rung.widen + 1, MAX_WIDEN + 1):
            best = state.first_best({key: e for key, e in path.items() if key[0] == rung})
            grid = state.C_grid if state.given_C is None else (state.base_C,)
            i = grid.index(best[1])
            wider = replace(rung, widen=widen)
            Cs = list(grid[i : i + 2])
            scored = scorer.errors([(c, wider) for c in Cs], "feature structures, wider")
            path.update({(wider, c): e for c, e in zip(Cs, scored)})
            candidate = state.first_best({(wider, c): path[wider, c] for c in Cs})
            if path[candidate] > path[best] + 1e-12:
                break
            rung = wider
        return rung

    @classmethod
    def shared_jobs(cls, scorer, candidates) -> list:
        """Each fold's screen (the relevance fit on its training rows), once."""
        screens = scorer.shared.setdefault(cls.name, {})
        return [f for f in range(len(scorer.folds)) if f not in screens] if candidates else []

    @classmethod
    def run_shared(cls, scorer, job):
        return screen_of(scorer.cv, scorer.rows[scorer.folds[job][0]], scorer.seed + job)

    @classmethod
    def keep_shared(cls, scorer, jobs, results, candidates) -> None:
        scorer.shared[cls.name].update(zip(jobs, results))

    @classmethod
    def fold_fit(cls, scorer, candidate, k: int) -> tuple:
        scale = scorer.cv.data_scale()
        return 0.0, structured_kernels(scale, scorer.shared[cls.name][k], candidate.top, candidate.widen)[0]

    @classmethod
    def refit(cls, solver, spec, task, candidate, attrs):
        """The model on the kernels of the features the screen (cross-validation's, or one of this fit's rows) ranks
        first, or the features and widths ``candidate.kept``; its kernels are the model's (``kernel_names_``)."""
        scale = task.data.data_scale()
        screen = None
        if candidate.kept is not None:
            features, sigmas, groups = candidate.kept
            kernels = kernels_of(scale, features, sigmas, groups)
            sigmas = [k.sigma for k in kernels[: len(kernels) - sum(len(g[1]) for g in groups)]]
        else:
            screen = candidate.screen
            if screen is None:
                cv = task.data.cross_validation_input(AUTO_C_POINTS, task.seed)
                if cv is None:
                    raise ValueError("a structured model needs feature rows to screen (not a kernel store)")
                screen = screen_of(cv, np.arange(len(cv.y)), task.seed)
            kernels, features, sigmas, groups = structured_kernels(scale, screen, candidate.top, candidate.widen)
        described = {"top": int(candidate.top), "features": [int(f) for f in features],
                     "sigmas": [float(s) for s in sigmas]}  # fmt: skip
        if candidate.widen:
            described["widen"] = int(candidate.widen)
        if groups:  # bands of their own beside the joint band (structure.structured_kernels)
            described["groups"] = [{"features": [int(f) for f in g], "sigmas": [float(s) for s in w]}
                                   for g, w in groups]  # fmt: skip
        if screen is not None:
            described.update(screened_rows=int(screen.rows), feature_weights=[float(w) for w in screen.feature_weights])
        # Probabilities' folds refit the same features and widths (as they refit the chosen C), each on its rows.
        chosen = FeatureStructure.of_model(described)
        return _refit_on_own_kernels(solver, spec, task, kernels, {cls.choice_attribute: described}, chosen, attrs)

    @classmethod
    def from_attributes(cls, attributes: dict):
        structure = attributes.get(cls.choice_attribute)
        return None if structure is None else FeatureStructure.of_model(structure)

    @classmethod
    def summary_line(cls, model) -> str | None:
        """The structured model's features and the subsets with kernels of their own, or that no structure beat the
        kernels on all the features."""
        structure = getattr(model, cls.choice_attribute, None)
        if structure is not None:
            return describe_structure(structure, getattr(model, "feature_names_in_", None)) + (
                ": better than the all-features candidates by more than the standard error of their difference"
            )
        path = getattr(model, cls.path_attribute, None)
        if not path:
            return None
        (best, _), error = min(path.items(), key=lambda item: (item[1], _top(item[0][0])))
        tops = sorted({_top(key[0]) for key in path})
        return (
            f"none: all {model.n_features_in_} features (the best of {len(tops)} feature structures, "
            f"{_label(best)} at {100 * error:.2f} % cross-validated error, was not better by more than the "
            "standard error of their difference)"
        )

    @classmethod
    def plot_label(cls, candidate) -> str:
        """``top 3`` for ``structure(top 3 feature(s))``, ``relevant``, ``relevant+residual`` and ``relevant-additive``
        for the relevance search's own rungs (also from a candidate's name in a model saved before candidates were
        saved whole)."""
        text = str(candidate)
        wider = re.search(r", widths (x\d+)\)$", text)
        suffix = f" {wider.group(1)}" if wider else ""  # one octave wider: "relevant+residual x2"
        top = re.fullmatch(r"structure\(top (\d+) features?(?:\(s\))?(?:, widths x\d+)?\)", text)
        if top:
            return f"top {top.group(1)}{suffix}"
        if text.startswith("structure(relevant"):
            name = "relevant+residual" if "residual" in text else "relevant-additive" if "each" in text else "relevant"
            return name + suffix
        return text


#: Every kind of search candidate, by name, in the order the search scores them (a new kind: one line here).
CANDIDATE_KINDS: dict[str, type[CandidateKind]] = {
    Selectivity.name: Selectivity,
    GroupSelectionKind.name: GroupSelectionKind,
    WidthBandKind.name: WidthBandKind,
    FeatureStructureKind.name: FeatureStructureKind,
}


def kind_of(value) -> type[CandidateKind]:
    """The kind of a candidate (or of a plain selectivity)."""
    for kind in CANDIDATE_KINDS.values():
        if kind.matches(value):
            return kind
    raise TypeError(f"not a search candidate: {value!r}")


def refitted_kinds() -> list:
    """The kinds whose chosen candidate is refitted (all but the plain selectivity)."""
    return [kind for kind in CANDIDATE_KINDS.values() if kind is not Selectivity]


def path_attributes() -> tuple:
    """The fitted attributes of the search's cross-validated errors: ``C_path_``, then each kind's path."""
    return ("C_path_", *(kind.path_attribute for kind in CANDIDATE_KINDS.values()))


def choice_attributes() -> tuple:
    """The fitted attributes that say which candidate a model is (``selectivity_``, ``group_selection_``, ...)."""
    return tuple(kind.choice_attribute for kind in CANDIDATE_KINDS.values())


def search_attributes() -> tuple:
    """Every fitted attribute of the search: the choices, the paths and the chosen one's ``cross_validation_``."""
    return (*choice_attributes(), *path_attributes(), "cross_validation_")


def chosen_candidate(attributes: dict) -> tuple:
    """``(selectivity, candidate)`` of a fitted model's ``attributes``: its ``selectivity_`` and the candidate it
    refitted (None: a plain fit), as probabilities' folds refit it."""
    for kind in refitted_kinds():
        candidate = kind.from_attributes(attributes)
        if candidate is not None:
            return attributes.get(Selectivity.choice_attribute), candidate
    return attributes.get(Selectivity.choice_attribute), None


def screen_rows(cv, rows: np.ndarray, seed: int):
    """The feature rows and labels a structure screen reads: a stratified sample of at most
    :data:`~mwumkl_dist.solvers.structure.ARD_POINTS` of ``rows`` of ``cv``."""
    rows = np.asarray(rows)[stratified_rows(cv.y[rows], ARD_POINTS, seed)]
    return cv.X[rows], cv.y[rows]


def screen_of(cv, rows: np.ndarray, seed: int) -> Screen:
    """The structure screen (the relevance fit) of ``rows`` of ``cv``: the one place a screen is fitted."""
    return Screen.of_rows(*screen_rows(cv, rows, seed))


def describe_structure(structure: dict, names=None, limit: int = 10) -> str:
    """The kept features of ``structure_`` and the subsets that keep kernels of their own, in a few words."""

    def label(f):
        return str(names[f]) if names is not None else f"x{f}"

    features = structure["features"]
    more = f" (first {limit} of {len(features)})" if len(features) > limit else ""
    text = f"a model on {len(features)} of the features: {', '.join(label(f) for f in features[:limit])}{more}"
    subsets = structure.get("subsets") or [g["features"] for g in structure.get("groups", [])]
    if subsets:
        text += "; kernels of their own on " + ", ".join("(" + ", ".join(label(f) for f in s) + ")" for s in subsets)
    if structure.get("widen"):
        text += f"; widths {2 ** int(structure['widen'])} times the learned ones"
    return text


# ----------------------------------------------------------------------------- refits and helpers


def _refit_on_some_kernels(solver, spec, task, candidate, attrs, mask, traces, described, *, own_traces: bool):
    """The model on the kernels of ``mask`` with selectivity 0 at the chosen ``C``; the other kernels get weight 0
    (``traces``: every kernel's; ``own_traces``: the refit's replace the kept kernels')."""
    data = task.data
    kernels = list(data.kernels)
    kept = [k for k, keep in zip(kernels, mask) if keep]
    model = solver.fit(_refit_spec(spec, attrs, data.n_samples), replace(task, data=data.with_kernels(kept)))
    out = model.attributes
    for name in ("kernel_weights_", "raw_kernel_weights_"):
        out[name] = _on_all_kernels(out[name], mask)
    if own_traces:  # the fit's own traces, the others' from the rows
        traces[mask] = out["kernel_traces_"]
    out["kernel_traces_"] = traces
    out.update(C_=attrs["C_"], selectivity_=0.0, **described, **_kept_from_search(attrs, out))
    return FittedModel(out, replace(model.calibration, candidate=candidate), model.train_scores)


def _refit_on_own_kernels(solver, spec, task, kernels, described: dict, candidate, attrs: dict):
    """The model on ``kernels`` (not the input's) with selectivity 0 at the chosen ``C``: its kernels are the model's
    (``kernel_names_``); ``described`` records the choice, ``candidate`` is what probabilities' folds refit."""
    own = task.data.with_kernels(kernels)
    model = solver.fit(_refit_spec(spec, attrs, task.data.n_samples), replace(task, data=own))
    out = model.attributes
    out.update(kernel_names_=own.kernel_names, C_=attrs["C_"], selectivity_=0.0, **described,
               **_kept_from_search(attrs, out))  # fmt: skip
    return FittedModel(out, replace(model.calibration, candidate=candidate), model.train_scores)


def _refit_spec(spec: FitSpec, attrs: dict, n: int) -> FitSpec:
    """A refit's specification: the chosen ``C`` (size-relative), selectivity 0, no candidate."""
    relative_C = attrs["C_"] if spec.model.scale_C else attrs["C_"] / n
    return spec.with_model(C=relative_C, scale_C=True, selectivity=0.0, candidate=None)


def _kept_from_search(attrs: dict, refit: dict) -> dict:
    """The search's paths, and its warnings before the refit's (each said once)."""
    warnings_ = list(dict.fromkeys([*attrs["fit_warnings_"], *refit.get("fit_warnings_", [])]))
    kept = (*path_attributes(), "cross_validation_")
    return {"fit_warnings_": warnings_, **{k: attrs[k] for k in kept if k in attrs}}


def _on_all_kernels(values, mask: np.ndarray) -> np.ndarray:
    """Per-kernel ``values`` of the kept kernels (last axis) spread over all kernels, 0 where ``mask`` is False."""
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros(values.shape[:-1] + (len(mask),))
    out[..., mask] = values
    return out


def _natural_key(label: str) -> tuple:
    """The numbers in ``label``, in order: ``widths(2-4) C=10`` before ``widths(10-12) C=1``."""
    return tuple(float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", label))


def _top(candidate) -> int:
    """A structure candidate's ``top``: a ``FeatureStructure``, or its name in a path loaded from a model saved
    before candidates were saved whole (``"structure(relevant features)"``, ``"structure(top 4 feature(s))"``)."""
    top = getattr(candidate, "top", None)
    if top is not None:
        return int(top)
    text = str(candidate)
    if "relevant" in text:
        return -1 if "residual" in text else -2 if "each" in text else 0
    return int(re.search(r"top (\d+)", text).group(1))


def _label(candidate) -> str:
    """A structure candidate in words (``FeatureStructure.label``), also from its name in an older model's path."""
    label = getattr(candidate, "label", None)
    return label if label is not None else "the " + str(candidate).removeprefix("structure(").removesuffix(")")


def _jsonable(value):
    if isinstance(value, (tuple, list, np.ndarray)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _hashable(value):
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


# ----------------------------------------------------------------------------- model files

#: The paths a model file keeps (for the summary and the pictures): the search's, and the two-stage fit's check of
#: ``C`` at the final size.
SAVED_PATHS = (*path_attributes(), "final_C_path_")


def search_to_json(model) -> dict:
    """The search's fitted attributes of ``model`` as a model file's JSON entries: each kind's choice under its
    attribute name, and ``cv_paths``: each path as ``[[key, error], ...]``, a ``(candidate, C)`` key as
    ``[kind name, candidate's fields, C]`` (:meth:`CandidateKind.to_json`)."""
    out = {kind.choice_attribute: kind.choice_to_json(getattr(model, kind.choice_attribute, kind.missing_choice))
           for kind in CANDIDATE_KINDS.values()}  # fmt: skip
    out["cross_validation_"] = getattr(model, "cross_validation_", None)
    out["cv_paths"] = {name: [[_key_to_json(key), float(error)] for key, error in getattr(model, name).items()]
                       for name in SAVED_PATHS if hasattr(model, name)}  # fmt: skip
    return out


def search_from_json(meta: dict) -> dict:
    """The fitted attributes of :func:`search_to_json`'s entries in ``meta``, by name (an older file's paths keep
    their candidates' names as keys; entries a file lacks are left out)."""
    out = {}
    for kind in CANDIDATE_KINDS.values():
        value = meta.get(kind.choice_attribute, kind.missing_choice)
        if value is not None:
            out[kind.choice_attribute] = kind.choice_from_json(value)
    if meta.get("cross_validation_"):
        out["cross_validation_"] = dict(meta["cross_validation_"])
    for name, items in (meta.get("cv_paths") or {}).items():
        if name in SAVED_PATHS:
            out[name] = {_key_from_json(key): float(error) for key, error in items}
    return out


def _key_to_json(key):
    if isinstance(key, tuple):  # (candidate, C)
        kind = kind_of(key[0])
        return [kind.name, kind.to_json(key[0]), float(key[1])]
    return key if isinstance(key, str) else float(key)


def _key_from_json(key):
    if isinstance(key, list) and len(key) == 3 and key[0] in CANDIDATE_KINDS:
        return CANDIDATE_KINDS[key[0]].from_json(key[1]), float(key[2])
    return tuple(key) if isinstance(key, list) else key  # [name, C]: a file from before candidates were saved whole

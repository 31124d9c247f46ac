"""The registry of search candidates (mwumkl_dist.solvers.candidates): every kind is registered, every consumer
loops over the registry, and a model that chose any kind round-trips through a model file unchanged."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import mwumkl_dist
from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.solvers import auto, candidates
from mwumkl_dist.solvers.candidates import CANDIDATE_KINDS, CandidateKind, kind_of
from mwumkl_dist.solvers.groups import GroupSelection, WidthBand
from mwumkl_dist.solvers.structure import FeatureStructure

PACKAGE = Path(mwumkl_dist.__file__).parent
N_FEATURES = 4


def _checkerboard(n=240, seed=0):
    """A checkerboard on features 0 and 1 of four (the others are noise)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, N_FEATURES))
    return X, np.where(np.sin(2 * np.pi * X[:, 0]) * np.sin(2 * np.pi * X[:, 1]) > 0, 1, -1)


#: Kernels by name (kernel objects are saved by name: a loaded model's summary would name them).
PER_FEATURE = ",".join(f"gaussian:{s}@{f}" for f in range(N_FEATURES) for s in (0.3, 1.0))
WIDTHS = ",".join(f"gaussian:{s}" for s in (0.1, 0.2, 0.4, 0.8, 1.6))


#: One model per kind, as the search would hand it to the final fit: ``(kernels, chosen candidate, C)``.  A plain
#: selectivity is no refit: its model is the fit at that selectivity.
CHOSEN = {
    "selectivity": (WIDTHS, None, 10.0),
    "group_selection": (PER_FEATURE, GroupSelection(0.1, 30.0, top=2), 10.0),
    "width_band": (WIDTHS, WidthBand(1, 3), 10.0),
    "structure": ("auto", FeatureStructure(-1), 1.0),
}


def _chosen(monkeypatch, name):
    """A fit whose search (C="auto") chose ``CHOSEN[name]``: choose_C answers without cross-validating, with a path
    for every kind (as if each had scored two candidates) so that every summary line and plot series shows."""
    kernels, candidate, C = CHOSEN[name]
    other = {"selectivity": 30.0, "group_selection": GroupSelection(1.0, 100.0),
             "width_band": WidthBand(2, 4, (0.5, 1.0, 2.0)), "structure": FeatureStructure(2)}  # fmt: skip
    paths = {"C_path_": {1.0: 0.3, 10.0: 0.25}, "selectivity_path_": {0.0: 0.25, 30.0: 0.26}}
    for kind in list(CANDIDATE_KINDS.values())[1:]:
        mine = candidate if kind.matches(candidate) else other[kind.name]
        paths[kind.path_attribute] = {(mine, C): 0.2, (other[kind.name], 10.0 * C): 0.22}
    found = auto.SearchResult(C, 0.0, candidate, paths, {"error": 0.2, "standard_error": 0.02, "rows": 240, "folds": 3})
    monkeypatch.setattr(auto, "choose_C", lambda *args, **kwargs: found)
    X, y = _checkerboard()
    return X, MWUMKLClassifier(kernels, random_state=0).fit(X, y)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CANDIDATE_KINDS))
def test_a_model_of_every_kind_round_trips_through_a_model_file(monkeypatch, tmp_path, name):
    X, clf = _chosen(monkeypatch, name)
    kind = CANDIDATE_KINDS[name]
    if name != "selectivity":
        assert getattr(clf, kind.choice_attribute) is not None
        assert candidates.chosen_candidate(vars(clf))[1] == CHOSEN[name][1]
    clf.save(tmp_path / "m.npz")
    back = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert back.summary() == clf.summary()
    np.testing.assert_array_equal(back.decision_function(X), clf.decision_function(X))
    np.testing.assert_array_equal(back.predict(X), clf.predict(X))
    for attribute in candidates.search_attributes():
        assert getattr(back, attribute, None) == getattr(clf, attribute, None), attribute
    lines = {line.split()[0] for line in clf.summary().splitlines()}
    assert "structure" in lines  # the structure line shows from the path alone (chosen or not)
    assert candidates.chosen_candidate(vars(back)) == candidates.chosen_candidate(vars(clf))


@pytest.mark.timeout(300)
def test_a_searched_structure_round_trips_with_its_summary_and_path(tmp_path):
    X, y = _checkerboard(300)
    clf = MWUMKLClassifier(random_state=0).fit(X, y)  # kernels="auto": the search scores every kind
    assert clf.structure_["features"] == [0, 1] and clf.structure_path_
    clf.save(tmp_path / "m.npz")
    back = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert back.structure_path_ == clf.structure_path_ and back.width_band_path_ == clf.width_band_path_
    assert back.summary() == clf.summary() and "structure        a model on 2 of the features" in back.summary()
    np.testing.assert_array_equal(back.decision_function(X), clf.decision_function(X))


def test_the_registry_covers_every_kind():
    assert list(CANDIDATE_KINDS) == ["selectivity", "group_selection", "width_band", "structure"]
    defined = {cls for cls in vars(candidates).values() if isinstance(cls, type) and issubclass(cls, CandidateKind)}
    assert defined - {CandidateKind} == set(CANDIDATE_KINDS.values())
    assert all(kind.name == name for name, kind in CANDIDATE_KINDS.items())
    for attribute in ("label", "choice_attribute", "path_attribute"):
        values = [getattr(kind, attribute) for kind in CANDIDATE_KINDS.values()]
        assert all(values) and len(set(values)) == len(values), attribute
    for value, name in [(0.0, "selectivity"), ("paper", "selectivity"), (GroupSelection(1.0, 100.0), "group_selection"),
                        (WidthBand(0, 2), "width_band"), (FeatureStructure(3), "structure")]:  # fmt: skip
        assert kind_of(value) is CANDIDATE_KINDS[name]
        if name != "selectivity":  # candidates are frozen dataclasses, saved by their fields
            assert dataclasses.is_dataclass(value) and kind_of(value).from_json(kind_of(value).to_json(value)) == value
    with pytest.raises(TypeError, match="not a search candidate"):
        kind_of(object())


def test_every_consumer_names_every_kind():
    from mwumkl_dist import plotting, summary
    from mwumkl_dist.solvers.two_stage import solver as two_stage

    labels = [label for label, _, _ in summary.CHOICES]
    for kind in CANDIDATE_KINDS.values():
        assert kind.label in labels
        assert kind.path_attribute in candidates.SAVED_PATHS and kind.path_attribute in plotting.path_attributes()
        assert {kind.choice_attribute, kind.path_attribute} <= set(two_stage._FROM_WEIGHT_STAGE)


#: The classes of candidates and of their kinds: told apart in candidates.py only.
CANDIDATE_CLASSES = {"GroupSelection", "WidthBand", "FeatureStructure", "CandidateKind",
                     *(kind.__name__ for kind in CANDIDATE_KINDS.values())}  # fmt: skip


def _named(node) -> set:
    if isinstance(node, ast.Tuple):
        return set().union(*map(_named, node.elts))
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return {node.id} if isinstance(node, ast.Name) else set()


def test_no_isinstance_on_candidate_classes_outside_the_registry():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "solvers" / "candidates.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
                if len(node.args) == 2 and _named(node.args[1]) & CANDIDATE_CLASSES:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, f"isinstance on a search candidate's class outside solvers/candidates.py: {found}"


def test_the_architecture_doc_shows_the_band_kind_as_the_code_has_it():
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    block = doc[doc.index("The band of\n  widths is exactly that diff") :]
    block = block[block.index("```diff") : block.index("  ```\n", block.index("```diff") + 7)]
    added = [line[3:] for line in block.splitlines() if line.startswith("  +") and not line.startswith("  +++")]
    code = (PACKAGE / "solvers" / "candidates.py").read_text()
    assert "class WidthBandKind(CandidateKind):" in added[0] and "WidthBandKind.name: WidthBandKind," in added[-1]
    body = "\n".join(added[:-1])
    assert body in code, "docs/architecture.md's 'A search candidate' diff is not the code: regenerate it"

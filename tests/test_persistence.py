"""Model files (mwumkl_dist.io.model_files): the caller's extra arrays and metadata, format versions."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import literal

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.io.model_files import FORMAT_VERSION, load_model, load_model_with_extra, save_model


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(50, 3))
    y = np.where(X[:, 0] + 0.2 * rng.normal(size=50) > 0.5, "a", "b")
    return MWUMKLClassifier("linear,gaussian:1", **literal(epsilon=0.3)).fit(X, y), X


def _meta(path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data["__meta__"]))


def test_extra_arrays_and_meta_round_trip(fitted, tmp_path):
    clf, X = fitted
    path = tmp_path / "m.npz"
    extra = {"scale_min": np.array([0.0, -1.5, 2.0]), "scale_max": np.arange(3.0), "names": np.array(["u", "v"])}
    clf.save(path, extra_arrays=extra, extra_meta={"scaling": "minmax", "clip": False})
    loaded, arrays, meta = MWUMKLClassifier.load_with_extra(path)
    assert set(arrays) == set(extra)
    for name, value in extra.items():
        np.testing.assert_array_equal(arrays[name], value)
        assert arrays[name].dtype == value.dtype
    assert meta == {"scaling": "minmax", "clip": False}
    np.testing.assert_array_equal(loaded.decision_function(X), clf.decision_function(X))
    # the plain loaders read the same file (and leave the extras out)
    np.testing.assert_array_equal(MWUMKLClassifier.load(path).decision_function(X), clf.decision_function(X))
    np.testing.assert_array_equal(load_model(path, MWUMKLClassifier).predict(X), clf.predict(X))
    # an older reader would ignore the extras: the file says it needs a newer one
    assert _meta(path)["format_version"] == 2 == FORMAT_VERSION


def test_a_model_without_extras_keeps_format_1(fitted, tmp_path):
    clf, X = fitted
    save_model(clf, tmp_path / "m.npz")
    assert _meta(tmp_path / "m.npz")["format_version"] == 1
    loaded, arrays, meta = load_model_with_extra(tmp_path / "m.npz", MWUMKLClassifier)
    assert arrays == {} and meta == {}
    assert loaded.fit_warnings_ == [] and loaded.random_state == 0


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"extra_arrays": {"bad-name": np.zeros(2)}}, ValueError, "identifiers"),
        ({"extra_arrays": {"": np.zeros(2)}}, ValueError, "identifiers"),
        ({"extra_arrays": {3: np.zeros(2)}}, ValueError, "identifiers"),
        ({"extra_arrays": {"objs": np.array([{}, None], dtype=object)}}, TypeError, "numbers or strings"),
        ({"extra_meta": {"f": object()}}, TypeError, "JSON-serialisable"),
        ({"extra_meta": ["not", "a", "dict"]}, TypeError, "extra_meta must be a dict"),
    ],
)
def test_bad_extras_are_refused(fitted, tmp_path, kwargs, exc, match):
    clf, _ = fitted
    path = tmp_path / "m.npz"
    with pytest.raises(exc, match=match):
        clf.save(path, **kwargs)


def test_a_random_state_object_is_saved_as_none(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(40, 2))
    y = np.where(X[:, 0] > 0.5, 1, -1)
    clf = MWUMKLClassifier("linear", **literal(), random_state=np.random.RandomState(3)).fit(X, y)
    clf.save(tmp_path / "m.npz")
    assert MWUMKLClassifier.load(tmp_path / "m.npz").random_state is None
    clf.set_params(random_state=11).fit(X, y).save(tmp_path / "m.npz")
    assert MWUMKLClassifier.load(tmp_path / "m.npz").random_state == 11

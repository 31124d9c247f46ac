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


# ----------------------------------------------------------------------------- failed writes, damaged files


class _FillingDisk:
    """A file object whose writes fail, as on a full disk, once ``limit`` bytes are written."""

    def __init__(self, fh, limit):
        self.fh, self.limit, self.written = fh, limit, 0

    def write(self, data):
        if self.written + len(data) > self.limit:
            raise OSError(27, "File too large")
        self.written += len(data)
        return self.fh.write(data)

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.fh.__exit__(*exc)


def _fill_disk_after(monkeypatch, limit):
    import mwumkl_dist.io.atomic as atomic

    real = atomic.os.fdopen
    monkeypatch.setattr(atomic.os, "fdopen", lambda fd, mode: _FillingDisk(real(fd, mode), limit))


def test_a_failed_save_keeps_the_previous_model(fitted, tmp_path, monkeypatch):
    clf, X = fitted
    path = tmp_path / "model.npz"
    clf.save(path)
    before = path.read_bytes()
    _fill_disk_after(monkeypatch, len(before) // 2)
    with pytest.raises(OSError, match=rf"^could not write model file {path}: \[Errno 27\] File too large$") as info:
        clf.save(path, extra_meta={"changed": True})
    assert info.value.errno == 27
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["model.npz"]
    np.testing.assert_array_equal(MWUMKLClassifier.load(path).decision_function(X), clf.decision_function(X))
    monkeypatch.undo()
    path.chmod(0o640)
    clf.save(path, extra_meta={"changed": True})  # the file replaced, its permissions kept
    assert path.stat().st_mode & 0o777 == 0o640 and MWUMKLClassifier.load_with_extra(path)[2] == {"changed": True}


def test_a_failed_fsync_keeps_the_previous_model(fitted, tmp_path, monkeypatch):
    import mwumkl_dist.io.atomic as atomic

    clf, _ = fitted
    path = tmp_path / "model.npz"
    clf.save(path)
    before = path.read_bytes()

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match=rf"could not write model file {path}: \[Errno 5\] Input/output error"):
        clf.save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["model.npz"]


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(60, 3))
    y = np.where(X[:, 0] > 0.5, 1, -1)
    path = tmp_path / "fit.ckpt"
    params = literal(epsilon=0.3, max_iter=30, checkpoint=str(path), checkpoint_every=10)
    MWUMKLClassifier("linear,gaussian:1", **params).fit(X, y)
    before = path.read_bytes()
    _fill_disk_after(monkeypatch, 200)
    with pytest.raises(OSError, match=rf"could not write checkpoint {path}: \[Errno 27\] File too large"):
        MWUMKLClassifier("linear,gaussian:1", **{**params, "max_iter": 40}).fit(X, y)
    monkeypatch.undo()
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["fit.ckpt"]
    resumed = MWUMKLClassifier("linear,gaussian:1", **{**params, "checkpoint": None}).fit(X, y, resume=str(path))
    assert resumed.n_iter_ == 30


def test_a_truncated_model_file_names_the_file(fitted, tmp_path):
    clf, _ = fitted
    path = tmp_path / "model.npz"
    clf.save(path)
    raw = path.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=rf"^{cut}: not a mwumkl_dist model file, or a truncated or damaged one"):
        MWUMKLClassifier.load(cut)


def test_a_model_file_missing_an_array_names_the_file_and_the_array(fitted, tmp_path):
    # What a write cut short in place left behind before writes were atomic: a valid archive without
    # its last members (the "KeyError: 'sv_indptr is not a file in the archive'").
    clf, _ = fitted
    path = tmp_path / "model.npz"
    clf.save(path)
    with np.load(path, allow_pickle=False) as data:
        members = {k: data[k] for k in data.files if k not in ("sv_dense", "sv_indptr")}
    partial = tmp_path / "partial.npz"
    np.savez(partial, **members)
    with pytest.raises(ValueError, match=rf"^{partial}: damaged or incomplete mwumkl_dist model file \(entry 'sv_"):
        MWUMKLClassifier.load(partial)
    # A member whose bytes are damaged (CRC): found when the file is read, not later.  The byte flipped is
    # in the last array's data (past its .npy header), not in a zip header field that readers may ignore.
    raw = bytearray(path.read_bytes())
    raw[raw.rfind(b"\x93NUMPY") + 160] ^= 0xFF
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=rf"^{damaged}: "):
        MWUMKLClassifier.load(damaged)

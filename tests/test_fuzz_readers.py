"""Property-based fuzzing of every reader of outside bytes (issue 30), with Hypothesis.

Readers: svmlight, CSV, NumPy ``.npy`` / ``.npz`` data files, model files, checkpoints, store metadata
and store chunks.  Each property feeds a reader damaged or crafted input (valid files mutated byte by
byte, truncated, members replaced by arbitrary arrays, metadata values replaced by arbitrary JSON) and
asserts what the package promises of every input:

* it is read, or refused with a ``ValueError`` / ``OSError`` whose message is one line naming the file
  (never another exception, a traceback, a crash or a hang);
* refusing it allocates at most twice its size plus 200 MB (``tracemalloc``'s peak);
* a store read that succeeds returns exactly the data written (a chunk cannot change unnoticed).

The default suite runs ``MWUMKL_FUZZ_EXAMPLES`` (default 30) inputs per reader; the long run is
``MWUMKL_FUZZ_EXAMPLES=10000 python -m pytest -q tests/test_fuzz_readers.py --hypothesis-show-statistics``
(see docs/reliability.md).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import string
import tracemalloc
import uuid

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import literal
from sklearn.datasets import dump_svmlight_file, make_classification

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mwumkl_dist import MWUMKLClassifier  # noqa: E402
from mwumkl_dist.io import checkpoint as checkpoint_module  # noqa: E402
from mwumkl_dist.io import zarr_format  # noqa: E402
from mwumkl_dist.io.files import load_data  # noqa: E402
from mwumkl_dist.stores import DataStore, write_data_store  # noqa: E402

#: Inputs per reader: a bounded number in the default suite, 10,000 in the long run.
EXAMPLES = int(os.environ.get("MWUMKL_FUZZ_EXAMPLES", "30"))
#: What a refusal may allocate beyond twice the input's size.
MEMORY_SLACK = 200 * 2**20

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a busy machine: no per-example time limit (the suite's timeout catches a hang)
    database=None,  # nothing written into the work tree
    derandomize=EXAMPLES <= 100,  # the default suite: the same inputs on every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
pytestmark = pytest.mark.timeout(600 if EXAMPLES <= 100 else 36000)


#: The content of a file a hostile store links its chunks to: a refusal must never quote it.
SECRET = b"TOPSECRET " * 64


def _refused_cleanly(exc: BaseException, path) -> None:
    """A refusal: a ValueError or OSError, one line, naming the file (and quoting no other file's bytes)."""
    assert isinstance(exc, (ValueError, OSError)), f"{type(exc).__name__}: {exc}"
    text = str(exc)
    assert "TOPSECRET" not in text and "SECRET " not in text, text
    assert "\n" not in text.strip(), text
    assert os.path.basename(str(path)) in text, text


def _read(reader, path, size: int):
    """``reader(path)``, or the refusal checked (one line, the file named, memory bounded); the value or None."""
    tracemalloc.start()
    try:
        return reader(path)
    except Exception as exc:
        peak = tracemalloc.get_traced_memory()[1]
        _refused_cleanly(exc, path)
        assert peak <= 2 * size + MEMORY_SLACK, f"refusing {size} bytes allocated {peak}"
        return None
    finally:
        tracemalloc.stop()


@st.composite
def mutated(draw, seed: bytes):
    """``seed`` with a few bytes changed, some inserted or removed, and maybe cut short."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(0, 8))):
        if not data:
            break
        kind = draw(st.sampled_from(["set", "insert", "delete", "flip"]))
        i = draw(st.integers(0, len(data) - 1))
        if kind == "set":
            data[i] = draw(st.integers(0, 255))
        elif kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[i : i + draw(st.integers(1, 16))]
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


def _write(folder, name: str, content: bytes):
    path = folder / f"{uuid.uuid4().hex[:8]}-{name}"
    path.write_bytes(content)
    return path


# ----------------------------------------------------------------------------- data files

_X, _Y = make_classification(30, 5, n_informative=3, random_state=0)


def _svm_seed() -> bytes:
    buf = io.BytesIO()
    dump_svmlight_file(_X, _Y, buf)
    return buf.getvalue()


def _csv_seed() -> bytes:
    buf = io.StringIO()
    np.savetxt(buf, np.column_stack([_X, _Y]), delimiter=",", fmt="%.6g")
    return buf.getvalue().encode()


def _npy_seed() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.column_stack([_X, _Y]))
    return buf.getvalue()


def _npz_seed() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, X=_X, y=_Y)
    return buf.getvalue()


#: Tokens an svmlight line is built from: the usual, and what a hostile or careless file holds.
_TOKENS = st.one_of(
    st.builds(lambda i, v: f"{i}:{v}", st.integers(-3, 40), st.floats(allow_nan=True, allow_infinity=True)),
    st.sampled_from(
        [
            "99999999999999999999:1",
            "2000000000:1",
            "0:1",
            "1:nan",
            "1:1e999",
            "qid:3",
            "1:",
            ":1",
            "a:b",
            "1:1:1",
            "\ufeff+1",
            "-1",
            "+1",
            "1.5",
            "# comment",
            "\x00",
            "1:0x10",
            "１:1",
        ]
    ),  # fmt: skip
    st.text(string.printable + "\u00e9\ufeff", max_size=8),
)


@st.composite
def svmlight_text(draw) -> bytes:
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        label = draw(st.sampled_from(["1", "-1", "+1", "0", "2", "1e308", "nan", "x", ""]))
        lines.append(" ".join([label, *draw(st.lists(_TOKENS, max_size=6))]))
    text = "\n".join(lines)
    return (b"\xef\xbb\xbf" if draw(st.booleans()) else b"") + text.encode("utf-8", "surrogatepass")


def _check_loaded(result) -> None:
    if result is None:
        return
    X, y = result
    values = X.data if sp.issparse(X) else np.asarray(X)
    assert np.all(np.isfinite(values)) and X.shape[0] == len(y) > 0


@FUZZ
@given(content=st.one_of(mutated(_svm_seed()), svmlight_text()))
def test_fuzz_svmlight(tmp_path, content):
    path = _write(tmp_path, "data.svm", content)
    _check_loaded(_read(load_data, path, len(content)))


@FUZZ
@given(content=st.one_of(mutated(_csv_seed()), st.binary(max_size=400)))
def test_fuzz_csv(tmp_path, content):
    path = _write(tmp_path, "data.csv", content)
    _check_loaded(_read(load_data, path, len(content)))


@FUZZ
@given(content=st.one_of(mutated(_npy_seed()), mutated(_npz_seed())), npz=st.booleans())
def test_fuzz_numpy_files(tmp_path, content, npz):
    path = _write(tmp_path, "data.npz" if npz else "data.npy", content)
    _check_loaded(_read(load_data, path, len(content)))


# ----------------------------------------------------------------------------- model files and checkpoints


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz-model") / "m.npz"
    MWUMKLClassifier(kernels="linear,gaussian:1", **literal(epsilon=0.5), probability=False).fit(
        sp.csr_matrix(_X), _Y
    ).save(path)
    return path


def _members(path) -> dict:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


#: Arbitrary small arrays: what a crafted member may hold.
_ARRAYS = st.one_of(
    st.builds(
        lambda shape, dtype, fill: np.full(shape, fill).astype(dtype),
        st.lists(st.integers(0, 5), max_size=3).map(tuple),
        st.sampled_from(["<f8", "<i8", "<i4", "<u1", "<U3", "?"]),
        st.sampled_from([0, 1, -1, 7, 10**6, -(10**6), np.nan, np.inf, 0.5, 2**40]),
    ),
    st.just(np.array(b"x" * 10)),
)
#: Arbitrary JSON values: what a crafted metadata entry may hold.
_JSON = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False), st.text(max_size=8)
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)


@st.composite
def crafted_archive(draw, members: dict, meta_key: str = "__meta__") -> dict:
    """``members`` with some arrays replaced, dropped or added, and some metadata entries replaced."""
    out = dict(members)
    names = sorted(out)
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([*names, "junk"]))
        if draw(st.integers(0, 4)) == 0:
            out.pop(name, None)
        else:
            out[name] = draw(_ARRAYS)
    if meta_key in members and draw(st.booleans()):
        meta = json.loads(str(members[meta_key]))
        for _ in range(draw(st.integers(1, 3))):
            key = draw(st.sampled_from(sorted(meta) + ["extra"]))
            meta[key] = draw(_JSON)
        out[meta_key] = np.array(json.dumps(meta))
    return out


def _save_members(folder, name: str, members: dict):
    path = folder / f"{uuid.uuid4().hex[:8]}-{name}"
    with open(path, "wb") as fh:
        np.savez(fh, **members)
    return path


def _load_model(path):
    model = MWUMKLClassifier.load(path)
    if model.support_vectors_ is not None:  # what predict does next: it must not crash either
        X = np.zeros((2, model.n_features_in_))
        try:
            scores = model.decision_function(X)
        except (ValueError, OSError) as exc:  # a refusal of the points is fine, one line naming no file
            assert "\n" not in str(exc).strip()
            return model
        assert np.all(np.isfinite(scores))
    return model


@FUZZ
@given(data=st.data())
def test_fuzz_model_files(tmp_path, model_file, data):
    if data.draw(st.booleans()):
        path = _save_members(tmp_path, "m.npz", data.draw(crafted_archive(_members(model_file))))
    else:
        path = _write(tmp_path, "m.npz", data.draw(mutated(model_file.read_bytes())))
    _read(_load_model, path, os.path.getsize(path))


@pytest.fixture(scope="module")
def checkpoint_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-checkpoint")
    path = folder / "c.npz"
    params = dict(kernels="linear,gaussian:1", **literal(epsilon=0.5), max_iter=12, checkpoint=path, checkpoint_every=4)
    MWUMKLClassifier(**params).fit(_X, _Y)
    return path, params


@FUZZ
@given(data=st.data())
def test_fuzz_checkpoints(tmp_path, checkpoint_file, data):
    original, params = checkpoint_file
    if data.draw(st.booleans()):
        members = data.draw(crafted_archive(_members(original)))
        if "__meta__" in members and data.draw(st.booleans()):  # resealed: the state checks must hold alone
            try:
                meta = json.loads(str(members["__meta__"]))
                arrays = {k: v for k, v in members.items() if k != "__meta__"}
                meta["state_sha256"] = checkpoint_module._state_digest(meta, arrays)
                members["__meta__"] = np.array(json.dumps(meta))
            except (TypeError, ValueError, AttributeError):
                pass
        path = _save_members(tmp_path, "c.npz", members)
    else:
        path = _write(tmp_path, "c.npz", data.draw(mutated(original.read_bytes())))

    def resume(p):
        return MWUMKLClassifier(**{**params, "checkpoint": None}).fit(_X, _Y, resume=p)

    model = _read(resume, path, os.path.getsize(path))
    if model is not None:
        assert np.all(np.isfinite(model.dual_coef_)) and np.all(np.isfinite(model.intercept_))


# ----------------------------------------------------------------------------- stores


@pytest.fixture(scope="module")
def store_seed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-store")
    dense = write_data_store(folder / "dense.zarr", _X, _Y, chunk_rows=8, compress=False)
    sparse = write_data_store(folder / "sparse.zarr", sp.csr_matrix(_X), _Y, chunk_rows=8, compress=True)
    return {"dense": dense.path, "sparse": sparse.path}


def _copy_store(seed: str, folder) -> str:
    path = str(folder / f"{uuid.uuid4().hex[:8]}.zarr")
    shutil.copytree(seed, path)
    return path


def _read_store(path):
    store = DataStore(path)
    rows = store.read_rows(0, store.n_samples)
    store.check_chunks()
    return store, rows


def _same_as_written(result, resealed: bool = False) -> None:
    """Read back: exactly what was written, or refused.  Metadata whose record was recomputed (a deliberate
    forger's) may change what the rows mean (docs/reliability.md): then the store read is only consistent."""
    if result is None:
        return
    store, rows = result
    X = rows.toarray() if sp.issparse(rows) else rows
    if resealed:
        assert X.shape == (store.n_samples, store.n_features) and np.all(np.isfinite(X))
        assert store.y.shape == (store.n_samples,) and len(np.unique(store.classes)) == len(store.classes)
        return
    np.testing.assert_array_equal(X, _X)
    np.testing.assert_array_equal(store.y, _Y)


@FUZZ
@given(data=st.data(), kind=st.sampled_from(["dense", "sparse"]))
def test_fuzz_store_metadata(tmp_path, store_seed, data, kind):
    path = _copy_store(store_seed[kind], tmp_path)
    file = os.path.join(path, "zarr.json")
    with open(file, "rb") as fh:
        raw = fh.read()
    resealed = False
    if data.draw(st.booleans()):
        doc = json.loads(raw)
        meta = doc["attributes"]["mwumkl_dist"]
        for _ in range(data.draw(st.integers(1, 3))):
            meta[data.draw(st.sampled_from(sorted(meta)))] = data.draw(_JSON)
        if data.draw(st.booleans()):  # resealed, as a deliberate forger would: the checks behind it must hold
            try:
                meta["integrity"] = zarr_format._metadata_record(uuid.UUID(hex=str(meta["store_id"])).bytes, meta)
                resealed = True
            except (TypeError, ValueError, AttributeError):
                pass
        raw = json.dumps(doc).encode()
    else:
        raw = data.draw(mutated(raw))
    with open(file, "wb") as fh:
        fh.write(raw)
    _same_as_written(_read(_read_store, path, len(raw)), resealed)


@FUZZ
@given(data=st.data(), kind=st.sampled_from(["dense", "sparse"]))
def test_fuzz_store_chunks(tmp_path, store_seed, data, kind):
    path = _copy_store(store_seed[kind], tmp_path)
    chunks = sorted(
        os.path.relpath(os.path.join(root, f), path)
        for root, _, files in os.walk(path)
        for f in files
        if f"{os.sep}c{os.sep}" in os.path.join(root, f) or f == "chunk_digests.npy"
    )
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    for _ in range(data.draw(st.integers(1, 3))):
        chunk = os.path.join(path, data.draw(st.sampled_from(chunks)))
        # Besides damage, what a hostile writer of the folder can plant: a FIFO (a reader would hang), a link
        # to a device (read without end) or to another file, a hard link to another file (its bytes).
        action = data.draw(st.sampled_from(["mutate", "swap", "delete", "fifo", "symlink", "hardlink"]))
        if action in ("fifo", "symlink", "hardlink"):
            if os.path.lexists(chunk):
                os.remove(chunk)
            if action == "fifo":
                os.mkfifo(chunk)
            elif action == "symlink":
                os.symlink(data.draw(st.sampled_from(["/dev/zero", str(secret), "/nonexistent"])), chunk)
            else:
                os.link(secret, chunk)
        elif action == "swap":
            other = os.path.join(path, data.draw(st.sampled_from(chunks)))
            if all(os.path.isfile(f) and not os.path.islink(f) and os.stat(f).st_nlink == 1 for f in (chunk, other)):
                a, b = open(chunk, "rb").read(), open(other, "rb").read()
                open(chunk, "wb").write(b)
                open(other, "wb").write(a)
        elif action == "delete":
            if os.path.lexists(chunk):
                os.remove(chunk)
        elif os.path.isfile(chunk) and not os.path.islink(chunk) and os.stat(chunk).st_nlink == 1:
            content = open(chunk, "rb").read()
            open(chunk, "wb").write(data.draw(mutated(content)))
    size = sum(os.lstat(os.path.join(r, f)).st_size for r, _, fs in os.walk(path) for f in fs)
    _same_as_written(_read(_read_store, path, size))


# ----------------------------------------------------------------------------- output paths (issue 36)


def _snapshot(folder) -> dict:
    """Every entry under ``folder``: its kind, its link target and its bytes (regular files)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            full = os.path.join(root, name)
            st_ = os.lstat(full)
            if os.path.islink(full):
                out[full] = ("link", os.readlink(full))
            elif os.path.isfile(full):
                out[full] = ("file", st_.st_ino, open(full, "rb").read())
            else:
                out[full] = ("other", st_.st_mode)
    return out


@FUZZ
@given(
    kind=st.sampled_from(["missing", "notes", "model", "checkpoint", "link-file", "link-dangling", "link-model",
                          "fifo", "directory", "hardlink-notes"]),
    overwrite=st.booleans(),
    api=st.booleans(),
)  # fmt: skip
def test_fuzz_output_paths(tmp_path_factory, model_file, checkpoint_file, kind, overwrite, api):
    """Whatever is at an output path, a save writes a model file there or refuses in one line; nothing else
    (a file a link points to, a hard link's other name, a FIFO, a device) is ever modified."""
    folder = tmp_path_factory.mktemp("out")
    outside = tmp_path_factory.mktemp("outside")
    victim = outside / "victim.txt"
    victim.write_bytes(b"precious\n")
    path = folder / "out.npz"
    if kind == "notes":
        path.write_bytes(b"my notes\n")
    elif kind == "model":
        shutil.copy(model_file, path)
    elif kind == "checkpoint":
        shutil.copy(checkpoint_file[0], path)
    elif kind == "link-file":
        path.symlink_to(victim)
    elif kind == "link-model":
        shutil.copy(model_file, outside / "m.npz")
        path.symlink_to(outside / "m.npz")
    elif kind == "link-dangling":
        path.symlink_to(outside / "nothing.npz")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "hardlink-notes":
        os.link(victim, path)
    before_outside = _snapshot(outside)
    before = _snapshot(folder)
    model = MWUMKLClassifier.load(model_file)
    try:
        if api:
            model.save(path, overwrite=overwrite)
        else:
            from mwumkl_dist.io.atomic import atomic_file
            from mwumkl_dist.io.model_files import is_model_file

            with atomic_file(path, "model file", is_ours=is_model_file, overwrite=overwrite) as fh:
                fh.write(open(model_file, "rb").read())
    except OSError as exc:
        _refused_cleanly(exc, path)
        assert _snapshot(folder) == before  # refused: nothing written, no temporary or lock left
        refused = True
    else:
        refused = False
        assert os.path.isfile(path) and not os.path.islink(path)
        assert MWUMKLClassifier.load(path).n_features_in_ == model.n_features_in_
        assert sorted(os.listdir(folder)) == ["out.npz"]  # no temporary or lock left
    assert _snapshot(outside) == before_outside  # a link's target, a hard link's other name: untouched
    # Written: where nothing was, over an older model, or over another regular file when asked to.
    allowed = kind in ("missing", "model") or (kind in ("notes", "hardlink-notes", "checkpoint") and overwrite)
    assert refused == (not allowed), kind

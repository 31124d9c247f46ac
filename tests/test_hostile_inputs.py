"""Hostile files and careless hands (issue 30): no crash, no silent wrong model, no lost file.

One section per finding of the audit, each case as the audit reproduced it: a crafted model, an
unbounded kernel parameter, edited store metadata, a forged chunk, a tampered checkpoint, a careless
path, the svmlight index convention, memory blow-ups, dying Dask workers, the messages, leftovers and
races.  The command line runs in-process (``main``) unless a crash must be seen from outside.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import tracemalloc
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import literal
from sklearn.datasets import dump_svmlight_file, make_classification

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.cli import main
from mwumkl_dist.cli.scaling import read_model_file
from mwumkl_dist.io import checkpoint as checkpoint_module
from mwumkl_dist.io import zarr_format
from mwumkl_dist.io.atomic import FileBusyError, exclusive_writer
from mwumkl_dist.io.files import load_data, read_data
from mwumkl_dist.stores import DataStore, KernelStore, StoreError, open_store, write_data_store, write_kernel_store

REPO = Path(__file__).resolve().parents[1]


def _one_line_error(capsys, code_expected, argv, pattern) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mwumkl-dist: error:")]
    assert code == code_expected, err
    assert len(lines) == 1 and "Traceback" not in err and "unexpected" not in err, err
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(120, 6, n_informative=4, random_state=3)
    return X, np.where(y == 1, 1.0, -1.0)


@pytest.fixture(scope="module")
def sparse_model(data, tmp_path_factory):
    """A model fitted on sparse rows (its support vectors stored as CSR arrays), saved."""
    X, y = data
    path = tmp_path_factory.mktemp("model") / "m.npz"
    clf = MWUMKLClassifier(kernels="linear,gaussian:1", **literal(epsilon=0.4)).fit(sp.csr_matrix(X), y)
    clf.save(path)
    return path, clf


@pytest.fixture(scope="module")
def cli_model(data, tmp_path_factory):
    """A model written by ``fit`` (with the feature scaling), its training file, and a test file."""
    X, y = data
    folder = tmp_path_factory.mktemp("cli")
    train, model = folder / "train.csv", folder / "model.npz"
    np.savetxt(train, np.column_stack([X, y]), delimiter=",")
    assert main(["fit", "--data", str(train), "--model", str(model), "--C", "1", "--epsilon", "0.4", "-q"]) == 0
    return train, model


def _members(path) -> dict:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _rewrite(path, out, meta_changes=None, drop=(), **arrays):
    """A copy of the model file ``path`` at ``out`` with members replaced, dropped or added."""
    members = _members(path)
    for name in drop:
        members.pop(name)
    if meta_changes:
        meta = json.loads(str(members["__meta__"]))
        meta.update(meta_changes)
        members["__meta__"] = np.array(json.dumps(meta))
    members.update(arrays)
    np.savez(out, **members)
    return out


# ----------------------------------------------------------------------------- 1. crafted support vectors


@pytest.mark.parametrize("index", [10**6, -7])
def test_a_model_whose_support_vector_indices_are_out_of_range_is_refused_not_a_segfault(sparse_model, tmp_path, index):
    path, _ = sparse_model
    members = _members(path)
    indices = members["sv_indices"].copy()
    indices[3] = index
    bad = _rewrite(path, tmp_path / "bad.npz", sv_indices=indices)
    with pytest.raises(ValueError, match=rf"^{bad}: not a valid mwumkl_dist model file \('sv_indices' holds"):
        MWUMKLClassifier.load(bad)
    # In a child process: a segmentation fault (exit -11) would not be caught in this one.
    test = tmp_path / "test.csv"
    np.savetxt(test, np.random.default_rng(0).random((5, 6)), delimiter=",")
    proc = subprocess.run(
        [sys.executable, "-m", "mwumkl_dist", "predict", "--model", str(bad), "--data", str(test)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().startswith(f"mwumkl-dist: error: {bad}: not a valid"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- 2. unbounded work from one number


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [("poly:100000000", "degree must be a positive integer, at most 100"), ("gaussian:1e-300", "sigma must be"),
     ("gaussian:1e300", "sigma must be"), ("gaussian:2^-2000", "sigma must be")],
)  # fmt: skip
@pytest.mark.timeout(300)
def test_unbounded_kernel_parameters_are_refused_at_once(capsys, tmp_path, spec, pattern):
    # At once: a usage error (status 2) before the data file is opened (it does not even exist), not 40 s of work.
    _one_line_error(capsys, 2, ["fit", "--data", tmp_path / "x.csv", "--model", tmp_path / "m.npz",
                                "--kernels", spec], pattern)  # fmt: skip


def test_a_model_naming_an_unbounded_kernel_is_refused_at_load(cli_model, tmp_path):
    _, model = cli_model
    meta = json.loads(str(_members(model)["__meta__"]))
    names = ["poly:100000000"] + meta["kernel_names"][1:]
    bad = _rewrite(model, tmp_path / "bad.npz", {"kernel_names": names})
    with pytest.raises(ValueError, match="degree must be a positive integer, at most 100"):
        read_model_file(bad)


# ----------------------------------------------------------------------------- 3. store metadata under the record


@pytest.fixture
def stores(data, tmp_path):
    X, y = data
    d = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=32, compress=False)
    k = write_kernel_store(tmp_path / "k.zarr", y, X=X, kernels="linear,gaussian:1,gaussian:2", chunk_rows=32)
    return d.path, k.path


def _edit_meta(path, **changes):
    """Edit a store's metadata as a careless hand would: the JSON, nothing else."""
    file = os.path.join(path, "zarr.json")
    with open(file) as fh:
        doc = json.load(fh)
    doc["attributes"]["mwumkl_dist"].update(changes)
    with open(file, "w") as fh:
        json.dump(doc, fh)


@pytest.mark.parametrize("change", [{"classes": [1.0, -1.0]}, {"n_features": 20}])
def test_edited_data_store_metadata_is_refused(stores, capsys, change):
    data_store, _ = stores
    _edit_meta(data_store, **change)
    with pytest.raises(StoreError, match="does not match its integrity record"):
        DataStore(data_store)
    _one_line_error(capsys, 1, ["store", "info", data_store], "integrity record")


def test_reversed_kernel_names_of_a_kernel_store_are_refused(stores):
    _, kernel_store = stores
    names = KernelStore(kernel_store).kernel_names
    _edit_meta(kernel_store, kernel_names=names[::-1])
    with pytest.raises(StoreError, match="does not match its integrity record"):
        open_store(kernel_store)


def test_edited_zarr_array_metadata_is_refused(stores):
    data_store, _ = stores
    file = os.path.join(data_store, "y", "zarr.json")
    with open(file) as fh:
        doc = json.load(fh)
    doc["attributes"]["note"] = "edited"
    with open(file, "w") as fh:
        json.dump(doc, fh)
    with pytest.raises(StoreError, match="Zarr metadata of array 'y'"):
        DataStore(data_store)


def test_store_data_and_store_info_print_the_same_integrity_record(tmp_path, capsys, data):
    X, y = data
    csv = tmp_path / "d.csv"
    np.savetxt(csv, np.column_stack([X, y]), delimiter=",")
    assert main(["store", "data", "--input", str(csv), "--output", str(tmp_path / "d.zarr")]) == 0
    written = [line for line in capsys.readouterr().out.splitlines() if line.startswith("integrity: ")]
    assert main(["store", "info", str(tmp_path / "d.zarr")]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("integrity: ")]
    assert len(written) == 1 and written == shown
    assert written[0].split()[1] == DataStore(tmp_path / "d.zarr").meta["integrity"]


# ----------------------------------------------------------------------------- 4. forged chunks


def _crc_preserving_patch(raw: bytes, flip_at: list[int], patch_at: int, crc) -> bytes:
    """``raw`` (chunk bytes, CRC-32C last) with bytes at ``flip_at`` inverted and 4 bytes at ``patch_at`` chosen so
    that the content's CRC-32C is unchanged (CRC is affine over GF(2): solve 32 linear equations)."""
    body = bytearray(raw[:-4])
    n = len(body)
    zero = crc(bytes(n))

    def linear(delta: bytes) -> int:  # the linear part of crc(body ^ delta) ^ crc(body)
        return crc(delta) ^ zero

    target_delta = bytearray(n)
    for i in flip_at:
        target_delta[i] ^= 0xFF
    need = linear(bytes(target_delta))
    columns = []
    for bit in range(32):
        delta = bytearray(n)
        delta[patch_at + bit // 8] = 1 << (bit % 8)
        columns.append(linear(bytes(delta)))
    # Gaussian elimination: find x (32 bits) with XOR of columns[b] for x's bits == need.
    rows = [(columns[b], 1 << b) for b in range(32)]
    basis: dict[int, tuple[int, int]] = {}
    for value, combo in rows:
        for pivot in sorted(basis, reverse=True):
            if value >> pivot & 1:
                value ^= basis[pivot][0]
                combo ^= basis[pivot][1]
        if value:
            basis[value.bit_length() - 1] = (value, combo)
    value, combo = need, 0
    for pivot in sorted(basis, reverse=True):
        if value >> pivot & 1:
            value ^= basis[pivot][0]
            combo ^= basis[pivot][1]
    assert value == 0, "the 32 patch bits do not span the CRC space"
    for bit in range(32):
        if combo >> bit & 1:
            target_delta[patch_at + bit // 8] ^= 1 << (bit % 8)
    forged = bytes(b ^ d for b, d in zip(body, target_delta))
    assert crc(forged) == crc(bytes(body))
    return forged + raw[-4:]


def test_a_chunk_altered_with_its_crc_kept_is_refused(stores, capsys):
    crc = zarr_format._crc32c_function()
    if crc is None:  # pragma: no cover - zarr's codec brings one
        pytest.skip("no CRC-32C library")
    data_store, _ = stores
    chunk = os.path.join(data_store, "X", "c", "0", "0")
    raw = Path(chunk).read_bytes()
    # Flip the low mantissa bytes of 100 values (finite numbers still), patch 4 low bytes of another value.
    flips = [8 * v + b for v in range(1, 101) for b in range(3)]
    Path(chunk).write_bytes(_crc_preserving_patch(raw, flips, patch_at=8 * 120, crc=crc))
    store = DataStore(data_store)
    with pytest.raises(StoreError, match="not the chunk written at this position"):
        store.read_rows(0, 32)
    _one_line_error(capsys, 1, ["store", "info", data_store], "not the chunk written at this position")


def test_a_format_2_store_is_still_read_with_a_warning(stores):
    """A store of the previous format (CRC-bound records, no metadata record): read, with a warning saying why not
    to trust it as much."""
    data_store, _ = stores
    zarr = pytest.importorskip("zarr")
    group = zarr.open_group(data_store, mode="r+")
    meta = dict(group.attrs["mwumkl_dist"])
    store_id = uuid.UUID(hex=meta["store_id"]).bytes
    for name in ("X", "y"):
        grid = np.load(os.path.join(data_store, name, "chunk_digests.npy")).shape[:-1]
        table = np.empty(grid, dtype="<u8")
        for position in np.ndindex(*grid):
            key = zarr_format._chunk_key(name, position)
            tail = Path(data_store, *key.split("/")).read_bytes()[-4:]
            table[position] = zarr_format._chunk_digest(store_id, key, tail)
        file = os.path.join(data_store, name, "chunk_digests.npy")
        np.save(file, table)
        meta["chunk_digests"][name] = zarr_format._sha256_file(file)
    for key in ("integrity", "array_metadata"):
        meta.pop(key)
    group.attrs["mwumkl_dist"] = {**meta, "format_version": 2}
    with pytest.warns(UserWarning, match="store format 2 checks each chunk by its CRC-32C only"):
        store = DataStore(data_store)
    assert store.read_rows(0, 5).shape == (5, 6)


# ----------------------------------------------------------------------------- 5. tampered checkpoints


@pytest.fixture
def checkpointed(data, tmp_path):
    X, y = data
    ckpt = tmp_path / "fit.ckpt.npz"
    params = dict(kernels="linear,gaussian:1", **literal(epsilon=0.4), checkpoint=ckpt, checkpoint_every=5,
                  max_iter=23)  # fmt: skip
    MWUMKLClassifier(**params).fit(X, y)
    return X, y, ckpt, params


def _tamper_checkpoint(path, reseal: bool, meta_changes=None, **arrays):
    members = _members(path)
    meta = json.loads(str(members.pop("__meta__")))
    meta.update(meta_changes or {})
    members.update(arrays)
    if reseal:  # as a deliberate forger would: the digest recomputed, so the state checks are reached
        meta["state_sha256"] = checkpoint_module._state_digest(meta, members)
    np.savez(path, __meta__=np.array(json.dumps(meta)), **members)


def _picks(path):
    return _members(path)["picks"]


@pytest.mark.parametrize("reseal", [False, True])
@pytest.mark.parametrize(
    "tamper",
    ["negative pick", "swapped picks", "truncated picks", "iteration 10**6", "iteration -3", "NaN in s",
     "pick out of range"],
)  # fmt: skip
def test_a_tampered_checkpoint_is_refused(checkpointed, tamper, reseal):
    X, y, ckpt, params = checkpointed
    picks = _picks(ckpt)
    changes = {
        "negative pick": dict(picks=np.where(np.arange(picks.size).reshape(picks.shape) == 0, -1, picks)),
        "swapped picks": dict(picks=picks[:, ::-1].copy()),
        "truncated picks": dict(picks=picks[:-3]),
        "iteration 10**6": dict(meta_changes={"iteration": 10**6}),
        "iteration -3": dict(meta_changes={"iteration": -3}),
        "NaN in s": dict(s=np.full_like(_members(ckpt)["s"], np.nan)),
        "pick out of range": dict(picks=np.where(picks == picks[0, 0], 10**6, picks)),
    }[tamper]
    _tamper_checkpoint(ckpt, reseal, **changes)
    pattern = "not one of this fit" if reseal else "does not match its digest"
    with pytest.raises(ValueError, match=rf"{ckpt}: .*{pattern}"):
        MWUMKLClassifier(**params).fit(X, y, resume=ckpt)


def test_an_untampered_checkpoint_still_resumes(checkpointed):
    X, y, ckpt, params = checkpointed
    resumed = MWUMKLClassifier(**{**params, "checkpoint": None}).fit(X, y, resume=ckpt)
    whole = MWUMKLClassifier(**{**params, "checkpoint": None}).fit(X, y)
    np.testing.assert_array_equal(resumed.dual_coef_, whole.dual_coef_)


# ----------------------------------------------------------------------------- 6. crafted model arrays


def _tampered(model, tmp_path, what):
    m = _members(model)
    k = m["dual_coef_"].shape[1]
    return _rewrite(model, tmp_path / "bad.npz", **{
        "NaN intercept": dict(intercept_=np.array([np.nan])),
        "NaN weights": dict(raw_kernel_weights_=np.full_like(m["raw_kernel_weights_"], np.nan)),
        "inf dual coefficients": dict(dual_coef_=np.full_like(m["dual_coef_"], np.inf)),
        "truncated dual_coef_": dict(dual_coef_=m["dual_coef_"][:, : k // 2]),
        "classes_ of the wrong length": dict(classes_=np.array([-1.0, 1.0, 2.0])),
        "one class": dict(classes_=np.array([1.0])),
        "a scaling factor of 0": dict(extra__cli_feature_scaling_scale=np.zeros(6)),
        "short support_": dict(support_=m["support_"][:-2]),
        "negative support_": dict(support_=-m["support_"] - 1),
        "negative weights": dict(kernel_weights_=-m["kernel_weights_"]),
    }[what])  # fmt: skip


@pytest.mark.parametrize(
    "what",
    ["NaN intercept", "NaN weights", "inf dual coefficients", "truncated dual_coef_", "classes_ of the wrong length",
     "one class", "a scaling factor of 0", "short support_", "negative support_", "negative weights"],
)  # fmt: skip
def test_a_crafted_model_array_is_refused_at_load(cli_model, tmp_path, capsys, what):
    train, model = cli_model
    bad = _tampered(model, tmp_path, what)
    with pytest.raises(ValueError, match=rf"^{bad}: not a valid"):
        read_model_file(bad)
    _one_line_error(capsys, 1, ["predict", "--model", bad, "--data", train], rf"{bad}: not a valid")


def test_truncated_sv_indptr_is_refused(sparse_model, tmp_path):
    path, _ = sparse_model
    bad = _rewrite(path, tmp_path / "bad.npz", sv_indptr=_members(path)["sv_indptr"][:-5])
    with pytest.raises(ValueError, match="'sv_indptr' has shape"):
        MWUMKLClassifier.load(bad)


def test_deeply_nested_metadata_is_one_clear_error(cli_model, tmp_path, capsys):
    _, model = cli_model
    members = _members(model)
    members["__meta__"] = np.array("[" * 100000 + "]" * 100000)
    bad = tmp_path / "deep.npz"
    np.savez(bad, **members)
    with pytest.raises(ValueError, match=rf"^{bad}: damaged or incomplete .*RecursionError"):
        MWUMKLClassifier.load(bad)


# ----------------------------------------------------------------------------- 7. careless paths


def test_fit_refuses_to_write_its_model_or_checkpoint_over_the_training_data(tmp_path, capsys, data):
    X, y = data
    svm = tmp_path / "h.svm"
    dump_svmlight_file(X, y, str(svm))
    before = svm.read_bytes()
    _one_line_error(capsys, 2, ["fit", "--data", svm, "--model", svm], r"--model .*h\.svm is also the --data file")
    _one_line_error(capsys, 2, ["fit", "--data", svm, "--model", tmp_path / "m.npz", "--checkpoint", svm],
                    "--checkpoint .* is also the --data file")  # fmt: skip
    link = tmp_path / "link.svm"
    link.symlink_to(svm)
    _one_line_error(capsys, 2, ["fit", "--data", svm, "--model", link], "is also the --data file")
    assert svm.read_bytes() == before


def test_predict_refuses_to_write_over_its_model_or_its_data(cli_model, tmp_path, capsys):
    train, model = cli_model
    before = model.read_bytes()
    _one_line_error(capsys, 2, ["predict", "--model", model, "--data", train, "-o", model],
                    "--output-file .* is also the --model file")  # fmt: skip
    _one_line_error(capsys, 2, ["predict", "--model", model, "--data", train, "-o", train],
                    "--output-file .* is also the --data file")  # fmt: skip
    assert model.read_bytes() == before
    assert read_model_file(model).model.n_features_in_ == 6


# ----------------------------------------------------------------------------- 8. the index convention


def test_evaluate_reads_a_test_file_with_the_training_files_index_convention(tmp_path, capsys):
    X, y = make_classification(300, 8, n_informative=6, random_state=1)
    X[:, 0] = np.where(np.arange(300) < 150, X[:, 0], 0.0)  # the test half never uses feature 0
    train, test = tmp_path / "train.svm", tmp_path / "test.svm"
    dump_svmlight_file(X[:150], y[:150], str(train), zero_based=True)
    dump_svmlight_file(X[150:], y[150:], str(test), zero_based=True)
    model = tmp_path / "m.npz"
    assert main(["fit", "--data", str(train), "--model", str(model), "--C", "1", "-q"]) == 0
    assert read_model_file(model).zero_based is True
    capsys.readouterr()
    assert main(["evaluate", "--model", str(model), "--data", str(test)]) == 0
    recorded = capsys.readouterr().out
    assert main(["evaluate", "--model", str(model), "--data", str(test), "--zero-based", "yes"]) == 0
    explicit = capsys.readouterr().out
    assert recorded == explicit  # read as the training file was, not shifted by one


def test_read_data_says_which_convention_it_used(tmp_path):
    f = tmp_path / "a.svm"
    f.write_text("1 1:0.5 3:1\n-1 2:1\n")
    assert read_data(f).zero_based is False and read_data(f).X.shape == (2, 3)
    f.write_text("1 0:0.5 3:1\n-1 2:1\n")
    assert read_data(f).zero_based is True and read_data(f).X.shape == (2, 4)
    with pytest.raises(ValueError, match=r"line 1 uses feature index 0, but the file is read as one-based"):
        read_data(f, zero_based=False)


# ----------------------------------------------------------------------------- 9. memory


#: One feature index this far out in 270 rows (the audit's was 10^7: a 20 GiB block; here the old code's block
#: is 430 MB).
WIDE = 2 * 10**5


def test_one_far_feature_index_does_not_make_a_dense_block_of_that_width(tmp_path):
    from mwumkl_dist.kernels.evaluation import combined_kernel, kernel_traces

    rng = np.random.default_rng(0)
    X = sp.random(270, 5, density=0.8, random_state=1, format="csr")
    X = sp.hstack([X, sp.csr_matrix((270, WIDE - 5))]).tocsr()
    X[5, WIDE - 1] = 1.0
    weights = rng.random(2)
    tracemalloc.start()
    try:
        K = combined_kernel("linear,gaussian:1", X, X, weights)
        traces = kernel_traces("linear,gaussian:1", X)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The plan's per-feature arrays are O(n_features) (about 50 bytes a feature); a (270, WIDE) block is 430 MB.
    assert peak < 150 * 2**20, f"{peak / 2**20:.0f} MiB"
    used = np.column_stack([X[:, :5].toarray(), X[:, WIDE - 1].toarray()])  # the same values, the used features
    np.testing.assert_allclose(K, combined_kernel("linear,gaussian:1", used, used, weights), rtol=1e-12)
    np.testing.assert_allclose(traces, kernel_traces("linear,gaussian:1", used), rtol=1e-12)


def test_a_feature_index_far_beyond_the_data_is_refused_with_its_line(tmp_path, capsys):
    f = tmp_path / "far.svm"
    f.write_text("1 1:0.5\n-1 2000000000:1\n")
    msg = _one_line_error(capsys, 1, ["fit", "--data", f, "--model", tmp_path / "m.npz"], "line 2 uses feature index")
    assert "2000000000" in msg


def test_running_out_of_memory_is_said_not_an_empty_error(tmp_path, capsys, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError()  # what (0,) * 2_000_000_000 raised, with an empty message

    monkeypatch.setattr("mwumkl_dist.cli.model.read_data", no_memory)
    (tmp_path / "d.svm").write_text("1 1:0.5\n-1 1:0.25\n")  # it exists: the reader runs out of memory
    _one_line_error(capsys, 1, ["fit", "--data", tmp_path / "d.svm", "--model", tmp_path / "m.npz"],
                    r"error: out of memory; the input is too large")  # fmt: skip


def test_an_unknown_model_member_is_refused_unread(cli_model, tmp_path):
    _, model = cli_model
    bad = tmp_path / "padded.npz"
    with zipfile.ZipFile(model) as src, zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        with dst.open("junk.npy", "w") as fh:  # 200 MB of zeros, about 200 kB compressed
            np.lib.format.write_array_header_1_0(fh, {"descr": "<f8", "fortran_order": False, "shape": (25 * 2**20,)})
            block = bytes(2**20)
            for _ in range(200):
                fh.write(block)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="unexpected archive member 'junk'"):
            read_model_file(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB"


# ----------------------------------------------------------------------------- 10. workers over their memory limit


def test_workers_dying_on_one_shard_end_in_a_message_about_memory(monkeypatch):
    from distributed.comm.core import CommClosedError

    from mwumkl_dist.engines import dask_pool
    from mwumkl_dist.engines.dask_pool import DaskPool, ShardLostError, _Block

    class Client:
        def scheduler_info(self):
            return {"workers": {"tcp://w:1": {"memory_limit": 400 * 2**20}}}

    pool = DaskPool.__new__(DaskPool)
    pool.timeout, pool.client = 600.0, Client()
    pool._departed, pool._threads = set(), {}
    restarts = []

    def start(block, worker):  # the nanny restarts the worker: a new address each time, gone when asked
        restarts.append(worker)
        block.worker = worker
        raise CommClosedError("Stream is closed")

    pool._place = lambda block, avoid=(): f"tcp://w:{len(restarts) + 1}"
    pool._start = start
    pool._discard = lambda block: None
    pool._scheduler_alive = lambda: True
    pool._live_workers = dict
    monkeypatch.setattr(dask_pool, "PLACEMENT_RECHECK", 0.0)
    monkeypatch.setattr(dask_pool.time, "sleep", lambda s: None)
    with pytest.raises(ShardLostError, match="most often ran out of memory") as info:
        pool._start_somewhere(_Block(((0, 10), (0, 1))))
    assert len(restarts) == dask_pool.MAX_PLACEMENT_LOSSES  # not ~10 minutes of restarts
    assert "400 MiB" in str(info.value) and "--memory-limit" in str(info.value)


# ----------------------------------------------------------------------------- 11. messages


def test_svmlight_with_a_byte_order_mark_is_read(tmp_path):
    f = tmp_path / "bom.svm"
    f.write_bytes(b"\xef\xbb\xbf+1 1:0.5\n-1 1:0.25\n")
    X, y = load_data(f)
    assert y.tolist() == [1.0, -1.0] and X.toarray().tolist() == [[0.5], [0.25]]


@pytest.mark.parametrize(
    ("line", "pattern"),
    [("1 3:1 2:1", "feature index 2 is not in increasing order"), ("1 2:1 2:1", "feature index 2 is repeated"),
     ("1 99999999999999999999:1", "feature index 99999999999999999999 is too large")],
)  # fmt: skip
def test_svmlight_index_problems_name_the_line(tmp_path, capsys, line, pattern):
    f = tmp_path / "bad.svm"
    f.write_text(f"-1 1:1\n{line}\n")
    _one_line_error(capsys, 1, ["fit", "--data", f, "--model", tmp_path / "m.npz"], rf"{f}: line 2: {pattern}")


def test_labels_that_differ_only_in_spelling_are_warned_about(tmp_path):
    f = tmp_path / "labels.csv"
    f.write_text("0.1,1\n0.2,+1\n0.3,1.0\n0.4,x\n")
    with pytest.warns(UserWarning, match=r"labels '\+1', '1', '1.0' differ only in spelling"):
        load_data(f)


def test_a_one_class_model_is_refused_at_load_not_an_index_error(cli_model, tmp_path, capsys):
    train, model = cli_model
    bad = _tampered(model, tmp_path, "one class")
    _one_line_error(capsys, 1, ["evaluate", "--model", bad, "--data", train], "two classes or more")


def test_a_plaintext_address_of_a_tls_scheduler_says_tls():
    from mwumkl_dist.engines.dask_pool import _probe_failure

    class CommClosedError(OSError):
        pass

    text = _probe_failure("tcp://h:1", "tcp", CommClosedError("Stream is closed"), 10.0)
    assert "closed the connection" in text and "tls://" in text and "within" not in text
    text = _probe_failure("tls://h:1", "tls", TypeError("TLS expects a `ssl_context` argument"), 10.0)
    assert "no TLS certificates configured" in text


# ----------------------------------------------------------------------------- 12. leftovers and races


def test_leftovers_of_a_killed_store_write_are_removed_and_said(tmp_path, data):
    X, y = data
    leftover = tmp_path / ".d.zarr.0123456789ab.partial"
    (leftover / "X").mkdir(parents=True)
    (leftover / "X" / "junk").write_bytes(b"x" * 100)
    with pytest.warns(UserWarning, match=r"removed what interrupted earlier writes of it left behind"):
        write_data_store(tmp_path / "d.zarr", X, y)
    assert not leftover.exists()
    assert sorted(os.listdir(tmp_path)) == ["d.zarr"]  # no lock file left either


def test_a_model_file_temporary_left_by_a_killed_fit_is_removed(tmp_path, capsys, cli_model):
    train, _ = cli_model
    leftover = tmp_path / ".m.npz.0123456789ab.tmp"
    leftover.write_bytes(b"half a model")
    assert main(["fit", "--data", str(train), "--model", str(tmp_path / "m.npz"), "--C", "1", "-q"]) == 0
    err = capsys.readouterr().err
    assert "removed what interrupted earlier writes of it left behind: .m.npz.0123456789ab.tmp" in err
    assert sorted(os.listdir(tmp_path)) == ["m.npz"]


def _hold_lock_in_child(path, seconds=300):
    code = (
        "import sys, time\nfrom mwumkl_dist.io.atomic import exclusive_writer\n"
        f"with exclusive_writer({str(path)!r}, 'model file'):\n"
        f"    print('held', flush=True)\n    time.sleep({seconds})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_of_one_model_file_fails_at_once(tmp_path, capsys, cli_model):
    train, _ = cli_model
    model = tmp_path / "m.npz"
    proc = _hold_lock_in_child(model)
    try:
        with pytest.raises(FileBusyError, match=rf"another process \(pid {proc.pid}\) is writing this model file"):
            with exclusive_writer(model, "model file"):
                pass
        _one_line_error(capsys, 1, ["fit", "--data", train, "--model", model, "-q"], "another process")
        assert not model.exists()
    finally:
        proc.kill()
        proc.wait(timeout=60)
    with exclusive_writer(model, "model file"):  # a killed holder's lock is free
        pass


def test_a_second_fit_writing_one_checkpoint_fails_at_once(tmp_path, data):
    X, y = data
    ckpt = tmp_path / "c.npz"
    proc = _hold_lock_in_child(ckpt)
    try:
        with pytest.raises(FileBusyError, match="is writing this checkpoint"):
            MWUMKLClassifier(**literal(epsilon=0.4), checkpoint=ckpt).fit(X, y)
    finally:
        proc.kill()
        proc.wait(timeout=60)


# ----------------------------------------------------------------------------- 13. one Ctrl-C stops the tests


def test_one_ctrl_c_interrupts_a_fit_under_pytest(data):
    """The suite's fits do not keep the first Ctrl-C to themselves (pytest needed three to stop)."""
    X, y = data

    def callback(info):
        if info.iteration == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        MWUMKLClassifier(**literal(epsilon=0.2), callback=callback, callback_every=1).fit(X, y)


# ============================================================================= issue 36: paths and resources
# Each case as the audit of issue 36 reproduced it: outputs never written through a link, a device or a FIFO,
# nor over a file that is not a model; no input that buys minutes and gigabytes; one line for each refusal.
# The suite runs as root in CI: every case runs as the current user, whoever that is.

FIT = ["--C", "1", "--epsilon", "0.4", "-q"]


def _fit_argv(train, model, *extra):
    return ["fit", "--data", train, "--model", model, *FIT, *extra]


# ----------------------------------------------------------------------------- 36.1 a planted lock file


def test_a_symlink_planted_at_the_lock_path_leaves_its_target_alone(tmp_path, capsys, cli_model):
    train, _ = cli_model
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / ".m.npz.lock").symlink_to(victim)
    _one_line_error(capsys, 1, _fit_argv(train, tmp_path / "m.npz"), r"lock file .*\.m\.npz\.lock is a symbolic link")
    assert victim.read_text() == "precious\n" and (tmp_path / ".m.npz.lock").is_symlink()
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize("kind", ["hard link", "big file", "fifo"])
def test_a_lock_path_that_is_no_lock_file_is_refused_untouched(tmp_path, kind):
    lock = tmp_path / ".m.npz.lock"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n" * (20 if kind == "big file" else 1))
    if kind == "hard link":
        os.link(victim, lock)
    elif kind == "big file":
        os.rename(victim, lock)
        victim = lock
    else:
        os.mkfifo(lock)
    before = victim.read_bytes() if kind != "fifo" else None
    with pytest.raises(OSError, match="not a lock file of this package"):
        with exclusive_writer(tmp_path / "m.npz", "model file"):
            pass
    if before is not None:
        assert victim.read_bytes() == before


def test_a_checkpoint_lock_path_planted_as_a_symlink_is_refused(tmp_path, data):
    X, y = data
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / ".c.npz.lock").symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        MWUMKLClassifier(**literal(epsilon=0.4), checkpoint=tmp_path / "c.npz").fit(X, y)
    assert victim.read_text() == "precious\n"


# ----------------------------------------------------------------------------- 36.2 links, devices, FIFOs


@pytest.mark.parametrize("target", ["file", "dangling"])
def test_a_model_path_that_is_a_link_is_refused_and_its_target_kept(tmp_path, capsys, cli_model, target):
    train, _ = cli_model
    victim = tmp_path / "victim.txt"
    if target == "file":
        victim.write_text("precious\n")
    link = tmp_path / "link.npz"
    link.symlink_to(victim)
    _one_line_error(capsys, 1, _fit_argv(train, link), r"--model .*link\.npz: it is a symbolic link")
    assert link.is_symlink() and (victim.read_text() == "precious\n" if target == "file" else not victim.exists())


def test_predict_output_that_is_a_link_is_refused_and_stdout_by_name_works(tmp_path, capsys, cli_model):
    train, model = cli_model
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "out.txt").symlink_to(victim)
    argv = ["predict", "--model", model, "--data", train, "-o"]
    _one_line_error(capsys, 1, [*argv, tmp_path / "out.txt"], "it is a symbolic link")
    assert victim.read_text() == "precious\n"
    for name in ("-", "/dev/stdout"):  # stdout as a stream, whatever it is (a pipe here)
        assert main([str(a) for a in [*argv, name]]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 120


def test_plot_output_that_is_a_link_is_refused(tmp_path, capsys, cli_model):
    _, model = cli_model
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"precious")
    (tmp_path / "w.png").symlink_to(victim)
    _one_line_error(capsys, 1, ["plot", model, "-o", tmp_path / "w.png", "--kind", "weights"], "symbolic link")
    assert victim.read_bytes() == b"precious"
    assert main(["plot", str(model), "-o", str(tmp_path / "ok.png"), "--kind", "weights"]) == 0
    assert (tmp_path / "ok.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_node_at_the_output_path_stays_what_it_is(tmp_path, capsys, cli_model, kind):
    train, _ = cli_model
    if kind == "fifo":
        path = tmp_path / "pipe.npz"
        os.mkfifo(path)
    elif os.geteuid() == 0:  # a node of our own: a regression must not replace the machine's /dev/null
        path = tmp_path / "null.npz"
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    else:  # without root the folder /dev is not ours to write: /dev/null itself cannot be replaced
        path = Path(os.devnull)
    _one_line_error(capsys, 1, _fit_argv(train, path), "FIFO|device node")
    mode = os.lstat(path).st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)
    with pytest.raises(ValueError, match="not a regular file"):
        MWUMKLClassifier.load(path) if kind == "fifo" else read_model_file(path)


# ----------------------------------------------------------------------------- 36.3 files that are not models


def test_fit_does_not_overwrite_a_file_that_is_no_model_unless_asked(tmp_path, capsys, cli_model, data):
    train, model = cli_model
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    _one_line_error(capsys, 1, _fit_argv(train, notes), r"--model .*notes\.txt: it exists and is not a model file")
    _one_line_error(capsys, 1, _fit_argv(train, tmp_path / "m.npz", "--checkpoint", notes), "is not a checkpoint")
    assert notes.read_text() == "my notes\n"
    assert main([str(a) for a in _fit_argv(train, notes, "--overwrite")]) == 0
    assert read_model_file(notes).model.n_features_in_ == 6
    copy = tmp_path / "older.npz"  # an older model is replaced without --overwrite, as before
    copy.write_bytes(Path(model).read_bytes())
    assert main([str(a) for a in _fit_argv(train, copy)]) == 0


def test_save_refuses_to_clobber_a_file_that_is_no_model(tmp_path, sparse_model):
    _, clf = sparse_model
    other = tmp_path / "data.svm"
    other.write_text("1 1:0.5\n")
    with pytest.raises(OSError, match="not a model file; refusing to overwrite it"):
        clf.save(other)
    assert other.read_text() == "1 1:0.5\n"
    clf.save(other, overwrite=True)
    assert MWUMKLClassifier.load(other).n_features_in_ == clf.n_features_in_
    clf.save(other)  # now a model: replaced as before
    with pytest.raises(OSError, match="not a checkpoint"):
        MWUMKLClassifier(**literal(epsilon=0.4), checkpoint=tmp_path / "data.svm").fit(*_xy(60))


def _xy(n, d=4, seed=0):
    X, y = make_classification(n, d, n_informative=2, n_redundant=0, random_state=seed)
    return X, np.where(y == 1, 1.0, -1.0)


# ----------------------------------------------------------------------------- 36.4 huge but finite inputs


def test_huge_finite_inputs_are_refused_not_nan_scores(data, cli_model, tmp_path, capsys):
    X, y = data
    clf = MWUMKLClassifier(kernels="poly:2,gaussian:1", **literal(epsilon=0.4)).fit(X, y)
    with pytest.raises(ValueError, match="decision values of 120 of 120 rows .* not finite"):
        clf.predict(X * 1e300)
    train, model = cli_model
    big = tmp_path / "big.csv"
    raw = np.loadtxt(train, delimiter=",")
    raw[:, :-1] *= 1e300
    np.savetxt(big, raw, delimiter=",")
    _one_line_error(capsys, 1, ["predict", "--model", model, "--data", big, "--output", "scores"], "not finite")


# ----------------------------------------------------------------------------- 36.5 one far feature index


def _far_index_file(path, index, n=60):
    X, y = _xy(n, 5, seed=1)
    lines = []
    for i, (row, label) in enumerate(zip(X, y)):
        pairs = [f"{j + 1}:{v:.5f}" for j, v in enumerate(row)] + ([f"{index}:1.0"] if i == 7 else [])
        lines.append(f"{int(label)} " + " ".join(pairs))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.timeout(600)
def test_one_far_feature_index_costs_what_the_features_used_cost(tmp_path, monkeypatch, capsys):
    """The 60-line file with one index 10^7: no kernel plan (O(features)) as wide as that index is built."""
    from mwumkl_dist.kernels import specs

    widths = []
    compile_plan = specs.KernelSet._compile
    monkeypatch.setattr(specs.KernelSet, "_compile", lambda self: widths.append(self.n_features) or compile_plan(self))
    train = _far_index_file(tmp_path / "far.svm", 10**7)
    assert main(["fit", "--data", str(train), "--model", str(tmp_path / "m.npz"), "-q"]) == 0, capsys.readouterr()
    assert widths and max(widths) <= 6, max(widths)
    saved = read_model_file(tmp_path / "m.npz")
    assert saved.model.n_features_in_ == 10**7
    assert main(["predict", "--model", str(tmp_path / "m.npz"), "--data", str(train)]) == 0
    assert max(widths) <= 6
    assert sorted(set(capsys.readouterr().out.split())) == ["-1", "1"]


def test_compact_rows_give_the_same_model_and_scores(tmp_path, monkeypatch):
    from mwumkl_dist.data import problems

    X, y = _xy(80, 5, seed=2)
    wide = sp.csr_matrix((X.ravel(), np.tile([0, 3, 70000, 90000, 131071], 80), np.arange(0, 401, 5)),
                         shape=(80, 1 << 17))  # fmt: skip
    kernels = "linear,poly:2,gaussian:1,gaussian:2@70000+90000"
    compact = MWUMKLClassifier(kernels=kernels, **literal(epsilon=0.3)).fit(wide, y)
    monkeypatch.setattr(problems, "COMPACT_MIN_FEATURES", 1 << 40)
    full = MWUMKLClassifier(kernels=kernels, **literal(epsilon=0.3)).fit(wide, y)
    np.testing.assert_allclose(compact.kernel_weights_, full.kernel_weights_, rtol=1e-12)
    scores = full.decision_function(wide)
    monkeypatch.setattr(problems, "COMPACT_MIN_FEATURES", 1 << 16)
    np.testing.assert_allclose(compact.decision_function(wide), scores, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- 36.6 a model claiming many features


def test_a_small_model_claiming_fifty_million_features_is_refused_at_load(sparse_model, tmp_path):
    path, _ = sparse_model
    bad = _rewrite(path, tmp_path / "bad.npz", meta_changes={"n_features_in": 5 * 10**7})
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"n_features_in 50000000 is far beyond its \d+ stored values"):
            MWUMKLClassifier.load(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, peak


# ----------------------------------------------------------------------------- 36.7 stores


def _store_chunk(store, array="X"):
    root = Path(store) / array / "c"
    return next(p for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "other-file"])
def test_a_chunk_that_is_a_fifo_a_device_or_another_file_is_refused_unread(tmp_path, data, capsys, kind):
    X, y = data
    store = tmp_path / "d.zarr"
    write_data_store(store, X, y, chunk_rows=40)
    chunk = _store_chunk(store)
    chunk.unlink()
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET " * 40)
    if kind == "fifo":
        os.mkfifo(chunk)
    elif kind == "dev-zero":
        chunk.symlink_to("/dev/zero")
    else:
        os.link(secret, chunk)
    for argv in (["store", "info", store], ["fit", "--store", store, "--model", tmp_path / "m.npz", *FIT]):
        line = _one_line_error(capsys, 1, argv, "chunk")
        assert "TOPSECRET" not in line and "SECRET" not in line


def test_deeply_nested_array_metadata_of_a_store_is_one_line(stores, capsys):
    data_store, _ = stores
    (Path(data_store) / "X" / "zarr.json").write_text("[" * 100000 + "]" * 100000)
    _one_line_error(capsys, 1, ["store", "info", data_store], "malformed")
    with pytest.raises(StoreError, match="malformed"):
        open_store(data_store)


def test_an_array_shape_edited_to_a_hundred_million_rows_is_refused_before_any_scan(stores, capsys, monkeypatch):
    data_store, _ = stores
    meta_file = Path(data_store) / "X" / "zarr.json"
    meta = json.loads(meta_file.read_text())
    meta["shape"] = [10**8, meta["shape"][1]]
    meta_file.write_text(json.dumps(meta))
    scanned = []
    chunk_problem = DataStore._chunk_problem
    monkeypatch.setattr(DataStore, "_chunk_problem", lambda self, *a: scanned.append(a[0]) or chunk_problem(self, *a))
    _one_line_error(capsys, 1, ["store", "info", data_store], "edited|shape")
    assert len(scanned) < 100


def test_chunk_rows_beyond_the_data_are_capped(tmp_path, data):
    X, y = data
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=10**8)
    assert store.chunk_rows == len(y)
    assert open_store(tmp_path / "d.zarr").read_rows(0, 5).shape == (5, 6)


# ----------------------------------------------------------------------------- 36.8 unbounded specs and counts


@pytest.mark.parametrize(
    "argv, code, pattern",
    [
        (["--kernels", "gaussian:2@0-100000000000"], 1, "uses feature 100000000000 but the data has 6 features"),
        (["--kernels", "gaussian:2@0-10000000"], 1, "uses feature 10000000 but the data has 6 features"),
        (["--kernels", "random:1000000000000"], 2, "n_kernels must be .* at most"),
        (["--kernels", "random:10:seed=-1"], 2, "seed must be an integer"),
        (["--epsilon", "1e-300"], 1, "epsilon=1e-300 .* iterations"),
        (["--epsilon", "1e-6"], 1, "epsilon=1e-06 .* asks for [0-9.]+e\\+12 iterations"),
        (["--rho", "1e200"], 1, "rho=1e\\+200 asks for"),
        (["--selectivity", "1e308"], 1, "selectivity must be in"),
        (["--C", "1e-308"], 1, "C must be positive, at least 1e-100"),
    ],
)
def test_unbounded_values_are_refused_in_one_line(cli_model, tmp_path, capsys, argv, code, pattern):
    train, _ = cli_model
    tracemalloc.start()
    try:
        _one_line_error(capsys, code, ["fit", "--data", train, "--model", tmp_path / "m.npz", "-q", *argv], pattern)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, peak
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize(
    "argv, pattern",
    [
        (["--workers", "1000000"], "1000000 workers on a machine of"),
        (["--threads-per-worker", "1000000"], "threads per worker"),
        (["--memory-limit=-5GiB"], "--memory-limit: must be 'auto'"),
        (["--memory-limit", "lots"], "--memory-limit: must be 'auto'"),
    ],
)
def test_cluster_counts_and_memory_limits_are_checked_before_starting(capsys, argv, pattern):
    _one_line_error(capsys, 2, ["cluster", *argv], pattern)


def test_api_parameters_are_checked_before_the_fit(data):
    X, y = data
    for params, error, pattern in [
        ({"scheduler_timeout": -1}, ValueError, "scheduler_timeout"),
        ({"scheduler_timeout": float("nan")}, ValueError, "scheduler_timeout"),
        ({"scale_C": "no"}, ValueError, "scale_C must be True or False"),
        ({"epsilon": 1e-6}, ValueError, "iterations"),
        ({"checkpoint": 3.5}, TypeError, "checkpoint must be a path"),
    ]:
        with pytest.raises(error, match=pattern):
            MWUMKLClassifier(**{**literal(epsilon=0.4), **params}).fit(X, y)


# ----------------------------------------------------------------------------- 36.9 types and lines


def test_a_random_bank_wider_than_the_data_is_said_not_cut_silently(data, cli_model, tmp_path, capsys):
    X, y = data
    with pytest.warns(UserWarning, match="subset size 1000000 is more than the data's 6 features"):
        MWUMKLClassifier(kernels="random:3:size=1000000", **literal(epsilon=0.4)).fit(X, y)
    train, _ = cli_model
    argv = ["fit", "--data", str(train), "--model", str(tmp_path / "m.npz"), "--kernels", "random:3:size=1000000"]
    assert main([*argv, *FIT]) == 0
    assert "warning: random bank random:3:size=1000000" in capsys.readouterr().err


def test_load_of_a_directory_says_so(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory, not a model file"):
        MWUMKLClassifier.load(tmp_path)


def test_cr_only_line_endings_are_read(tmp_path):
    path = tmp_path / "mac.svm"
    path.write_bytes(b"-1 1:0.5 2:0.3\r1 1:0.9 2:0.1\r-1 1:0.2 2:0.7\r1 1:0.8 2:0.2\r")
    X, y = load_data(path)
    assert X.shape == (4, 2) and list(y) == [-1, 1, -1, 1]


def test_an_index_past_two_to_the_31_names_its_line(tmp_path, capsys):
    path = tmp_path / "big.svm"
    path.write_text("-1 1:0.5 2:0.3\n1 1:0.9 3000000000:0.1\n")
    _one_line_error(capsys, 1, ["fit", "--data", path, "--model", tmp_path / "m.npz", "-q"],
                    r"line 2: feature index 3000000000 is too large")  # fmt: skip


def test_cuda_without_a_gpu_is_one_line_before_the_data_is_read(cli_model, tmp_path, capsys):
    from mwumkl_dist.data.cuda import gpu_available

    if gpu_available():
        pytest.skip("a GPU is here")
    _one_line_error(capsys, 1, ["fit", "--data", tmp_path / "missing.csv", "--model", tmp_path / "m.npz",
                                "--device", "cuda"], "--device cuda: .*no usable CUDA GPU")  # fmt: skip


@pytest.mark.timeout(600)  # generous: a busy machine, never a bound on the answer
def test_a_server_that_is_no_dask_scheduler_is_said_not_a_memory_error():
    import socket
    import threading

    from mwumkl_dist.engines.dask_pool import _probe_scheduler

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer():
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nBad Request")
            conn.recv(1)

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(ConnectionError, match="not in Dask's protocol") as info:
            _probe_scheduler(f"tcp://127.0.0.1:{server.getsockname()[1]}", 10.0)
        assert "EiB" not in str(info.value)
    finally:
        server.close()


# ----------------------------------------------------------------------------- 36.10 checks before the work


@pytest.mark.parametrize(
    "name, pattern",
    [("x" * 250, None), ("x" * 256, "file name is 256 bytes long"), ("", "the path is empty"),
     ("newdir/", "ends with a slash")],
)  # fmt: skip
def test_output_names_are_checked_before_the_fit(cli_model, tmp_path, capsys, monkeypatch, name, pattern):
    train, _ = cli_model
    model = f"{tmp_path}{os.sep}{name}" if name else ""
    if pattern is None:  # 250 characters: the temporary name used to be too long, after the whole fit
        assert main(["fit", "--data", str(train), "--model", model, *FIT]) == 0
        assert os.path.isfile(model) and sorted(os.listdir(tmp_path)) == [name]
        return
    fitted = []
    monkeypatch.setattr(MWUMKLClassifier, "fit", lambda *a, **k: fitted.append(1))
    _one_line_error(capsys, 1, ["fit", "--data", train, "--model", model, *FIT], pattern)
    assert not fitted and os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- 36.11 SIGTERM and SIGHUP


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_a_fit_as_ctrl_c_does(tmp_path, sig):
    X, y = _xy(300, 5, seed=3)
    train = tmp_path / "train.csv"
    np.savetxt(train, np.column_stack([X, y]), delimiter=",")
    model, ckpt = tmp_path / "m.npz", tmp_path / "c.npz"
    argv = [sys.executable, "-m", "mwumkl_dist", "fit", "--data", str(train), "--model", str(model), "--C", "1",
            "--polish", "no", "--solver", "mwu", "--max-iter", "100000000", "--checkpoint", str(ckpt),
            "--checkpoint-every", "20", "-q"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # The signal's default disposition in the fit, as in a terminal, even where this suite runs under nohup (which
    # leaves SIGHUP ignored in every child, and an ignored signal stays ignored by design).
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))  # fmt: skip
    try:
        while not ckpt.exists():  # iterating: the first checkpoint is written
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"fit interrupted ({name}) after" in lines[0] and "checkpoint" in lines[0], err
    done = int(re.search(r"after (\d+) of", lines[0]).group(1))
    with np.load(ckpt, allow_pickle=False) as f:
        assert json.loads(str(f["__meta__"]))["iteration"] == done  # the checkpoint holds every iteration done
    assert read_model_file(model).model.interrupted_

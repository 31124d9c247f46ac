"""Zarr data and kernel stores: round trips, fits equal to the in-memory path, column cache, bad stores, CLI."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import uuid

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import literal

zarr = pytest.importorskip("zarr")

from mwumkl_dist import MWUMKLClassifier, __version__  # noqa: E402
from mwumkl_dist.cli import commands  # noqa: E402
from mwumkl_dist.cli.args import CommandError  # noqa: E402
from mwumkl_dist.cli.parser import add_store_commands  # noqa: E402
from mwumkl_dist.core import partition  # noqa: E402
from mwumkl_dist.core.mwu_rules import FewIterationsWarning  # noqa: E402
from mwumkl_dist.data.shards import FeatureShard  # noqa: E402
from mwumkl_dist.io import zarr_format  # noqa: E402
from mwumkl_dist.kernels import KernelSet  # noqa: E402
from mwumkl_dist.stores import (  # noqa: E402
    ColumnCache,
    DataStore,
    DataStoreProblem,
    KernelStore,
    StoreError,
    aligned_ranges,
    open_store,
    write_data_store,
    write_kernel_store,
)

KERNELS = "linear,gaussian:1,gaussian:2"


def _data(n=120, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, "yes", "no")
    return X, y


def _kernels_in_memory(X, spec=KERNELS):
    """(m, n, n) with K[i, :, j] the library's raw column j: what a kernel store built from X holds."""
    shard = FeatureShard(X, np.ones(len(X)), 0, KernelSet(spec, X.shape[1]).plan)
    return np.stack([shard.raw_columns(x, x)[0].T for x in X], axis=2)


def _same_model(a, b):
    np.testing.assert_array_equal(a.support_, b.support_)
    np.testing.assert_array_equal(a.dual_coef_, b.dual_coef_)
    np.testing.assert_array_equal(a.kernel_weights_, b.kernel_weights_)
    np.testing.assert_array_equal(a.intercept_, b.intercept_)
    np.testing.assert_array_equal(a.classes_, b.classes_)


def _set_meta(path, *, reseal=True, **changes):
    """Edit a store's metadata; ``reseal`` recomputes its integrity record (as a deliberate forger would), so the
    checks behind it are reached."""
    group = zarr.open_group(path, mode="r+")
    meta = dict(group.attrs["mwumkl_dist"])
    meta.update(changes)
    if reseal and "integrity" in meta:
        meta["integrity"] = zarr_format._metadata_record(uuid.UUID(hex=meta["store_id"]).bytes, meta)
    group.attrs["mwumkl_dist"] = meta


@pytest.fixture(scope="module")
def threaded_client():
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        yield client


@pytest.fixture(scope="module")
def kernel_case(tmp_path_factory):
    X, y = _data(n=100)
    path = str(tmp_path_factory.mktemp("k") / "k.zarr")
    write_kernel_store(path, y, X=X, kernels=KERNELS, chunk_rows=32)
    ref = MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3)).fit(_kernels_in_memory(X), y)
    return path, X, y, ref


# ----------------------------------------------------------------------------- data store


def test_data_store_round_trip_and_metadata(tmp_path):
    X, y = _data(n=70)
    src = tmp_path / "train.npy"
    np.save(src, np.column_stack([X, y == "yes"]))
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=16, source=src)
    again = open_store(tmp_path / "d.zarr")
    assert isinstance(again, DataStore) and not again.sparse
    np.testing.assert_array_equal(again.read_rows(0, 70), X)
    np.testing.assert_array_equal(again.read_rows(15, 33), X[15:33])
    np.testing.assert_array_equal(again.y, y)
    np.testing.assert_array_equal(again.take_rows([40, 3, 17, 3]), X[[40, 3, 17, 3]])
    meta = again.meta
    assert meta["format_version"] == 3 and meta["package_version"] == __version__
    assert (meta["n_samples"], meta["n_features"], meta["chunk_rows"]) == (70, 4, 16)
    assert meta["classes"] == ["no", "yes"]
    import hashlib

    assert meta["source_sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert zarr.open_group(store.path, mode="r")["X"].chunks == (16, 4)


def test_sparse_store_and_numeric_labels(tmp_path):
    X, _ = _data(n=50, d=6)
    X[X < 0.6] = 0.0
    Xs = sp.csr_matrix(X)
    y = np.where(X[:, 0] > 0.3, 2, -7)
    store = write_data_store(tmp_path / "s.zarr", Xs, y, chunk_rows=8)
    assert store.sparse and store.meta["nnz"] == Xs.nnz
    got = store.read_rows(5, 29)
    assert sp.issparse(got)
    np.testing.assert_array_equal(got.toarray(), X[5:29])
    assert store.y.dtype == y.dtype
    np.testing.assert_array_equal(store.y, y)
    np.testing.assert_array_equal(store.take_rows([9, 1]).toarray(), X[[9, 1]])


def test_row_shards_follow_chunks():
    assert aligned_ranges(100, 32, 2) == [(0, 64), (64, 100)]
    assert aligned_ranges(100, 32, 3) == [(0, 32), (32, 64), (64, 100)]
    assert aligned_ranges(100, 32, 4) == [(0, 32), (32, 64), (64, 96), (96, 100)]
    assert len(aligned_ranges(100, 32, 7)) == 7  # more shards than chunks: split inside chunks


@pytest.mark.parametrize("sparse", [False, True])
def test_fit_from_data_store_equals_in_memory(tmp_path, sparse, threaded_client):
    X, y = _data(n=120)
    if sparse:
        X = sp.csr_matrix(np.where(X > 0.4, X, 0.0))
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=32)
    ref = MWUMKLClassifier(kernels="paper", **literal(epsilon=0.3)).fit(X, y)
    for clf in (
        MWUMKLClassifier(kernels="paper", **literal(epsilon=0.3), n_shards=3),
        MWUMKLClassifier(kernels="paper", **literal(epsilon=0.3), engine="dask", client=threaded_client, n_shards=2),
    ):
        clf.fit(DataStore(store.path))
        _same_model(clf, ref)
        sv, ref_sv = clf.support_vectors_, ref.support_vectors_
        if sparse:
            sv, ref_sv = sv.toarray(), ref_sv.toarray()
        np.testing.assert_array_equal(sv, ref_sv)
        np.testing.assert_array_equal(clf.predict(X), ref.predict(X))
    np.testing.assert_array_equal(ref.decision_function(store), ref.decision_function(X))  # chunk by chunk


def test_shard_factory_reads_rows_where_it_runs(tmp_path):
    # The factory carries the store's path, not its rows: pickling it does not grow with the data.
    X, y = _data(n=400)
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=100)
    problem = DataStoreProblem(store, np.where(y == "yes", 1.0, -1.0), KernelSet("paper", 4))
    factory = problem.shard_factory(100, 200)
    blob = pickle.dumps(factory)
    assert len(blob) < 12_000 + 16 * 100  # plan + 100 labels; the rows alone would be 3200 bytes more
    shard = pickle.loads(blob)()
    np.testing.assert_array_equal(shard.X.toarray(), X[100:200])
    assert shard.row_offset == 100


# ----------------------------------------------------------------------------- kernel store


def test_kernel_store_layout_and_metadata(kernel_case):
    path, X, y, _ = kernel_case
    store = KernelStore(path)
    K = _kernels_in_memory(X)
    assert store.meta["kernel_names"] == KernelSet(KERNELS, 4).names()
    arr = zarr.open_group(path, mode="r")["K"]
    assert arr.chunks == (3, 1, 32)  # one chunk per kernel column and row block
    np.testing.assert_array_equal(store.read_columns(7, (32, 64), (0, 3)), K[:, 32:64, 7].T)
    np.testing.assert_array_equal(store.traces, [np.sum(np.diagonal(K[i])) for i in range(3)])
    np.testing.assert_array_equal(store.y, y)


def test_fit_from_kernel_store_equals_in_memory(kernel_case, threaded_client, monkeypatch):
    path, X, y, ref = kernel_case
    # Kernel blocks hold whole kernel tiles: tiles of one kernel (this process only, where the threaded
    # client's shards live) let n_kernel_shards=3 cut the 3 kernels into 3 blocks.  Without squaring
    # chains, tiles of one kernel add the scores exactly as one tile does: the reference still holds.
    monkeypatch.setattr(partition, "TILE_KERNELS", 1)
    layouts = [dict(n_shards=1), dict(n_shards=3), dict(engine="dask", client=threaded_client, n_shards=2)]
    layouts.append(dict(engine="dask", client=threaded_client, n_shards=2, n_kernel_shards=3))
    for extra in layouts:
        clf = MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3), **extra).fit(
            KernelStore(path, cache_bytes=4096)
        )
        _same_model(clf, ref)
        info = clf.cache_info_
        blocks = extra.get("n_shards", 1) * extra.get("n_kernel_shards", 1)
        # Every superstep reads two columns in every block: each read is a hit or a miss.
        assert info["hits"] + info["misses"] == 2 * clf.n_iter_ * blocks
        assert 0.0 <= info["hit_rate"] <= 1.0 and info["cache_peak_bytes"] <= 4096
    K_test = _kernels_in_memory(X)[:, :10, :]
    np.testing.assert_array_equal(clf.decision_function(K_test), ref.decision_function(K_test))


def test_column_cache_hits_when_large_enough(kernel_case):
    path, *_ = kernel_case
    big = MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3)).fit(KernelStore(path, cache_bytes=2**24))
    small = MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3)).fit(KernelStore(path, cache_bytes=0))
    # The solver keeps returning to a few support vectors: a cache of all columns only misses once per column.
    assert big.cache_info_["misses"] == len(np.unique(big.support_))
    assert big.cache_info_["hit_rate"] > 0.5 and big.cache_info_["evictions"] == 0
    assert small.cache_info_["hits"] == 0


def test_column_cache_is_bounded_lru():
    cache = ColumnCache(max_bytes=3 * 80)
    loads = []

    def load(j):
        loads.append(j)
        return np.full(10, float(j))

    for j in [1, 2, 3, 1, 4, 2, 1]:
        assert cache.get(j, load)[0] == j
    # 1,2,3 fill it; 1 hits; 4 evicts 2 (least recent); 2 reloads and evicts 3; 1 hits.
    assert loads == [1, 2, 3, 4, 2]
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["evictions"]) == (2, 5, 2)
    assert cache.nbytes <= 240


def test_kernel_store_from_npy_files(tmp_path):
    # User kernels need not be symmetric: the store keeps columns, exactly what the in-memory path uses.
    rng = np.random.default_rng(3)
    n = 60
    A = rng.random((n, 5))
    K0 = A @ A.T
    K1 = np.exp(-((A[:, None, :2] - A[None, :, :2]) ** 2).sum(-1)) + 1e-3 * rng.random((n, n))
    y = np.where(A[:, 0] > A[:, 1], 1, 0)
    for i, k in enumerate((K0, K1)):
        np.save(tmp_path / f"k{i}.npy", k)
    mats = [np.load(tmp_path / f"k{i}.npy", mmap_mode="r") for i in range(2)]
    store = write_kernel_store(tmp_path / "k.zarr", y, K=dict(zip(["lin", "rbf"], mats)), chunk_rows=16)
    ref = MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3)).fit(np.stack([K0, K1]), y)
    clf = MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3), n_shards=2).fit(store)
    _same_model(clf, ref)
    assert clf.kernel_names_ == ["lin", "rbf"]


def test_a_kernel_store_fit_checks_its_bias_as_the_kernels_in_memory(tmp_path):
    """The unpolished bias check reads the training rows' decision values off V: a store's scattered
    kernel rows are never read, and the model is the in-memory kernels' one (the bias re-chosen too)."""
    rng = np.random.default_rng(0)
    X = rng.random((300, 4))
    y = np.where(np.sin(4 * X[:, 0]) + X[:, 1] + 0.8 * rng.standard_normal(300) > 1.3, "rare", "common")
    store = write_kernel_store(tmp_path / "k.zarr", y, X=X, kernels="paper", chunk_rows=64)
    params = dict(kernels="precomputed", epsilon=0.5, C=1000.0, polish=False, selectivity="paper")
    with pytest.warns(FewIterationsWarning, match="re-chosen"):
        ref = MWUMKLClassifier(**params).fit(_kernels_in_memory(X, "paper"), y)
    with pytest.warns(FewIterationsWarning, match="re-chosen"):
        clf = MWUMKLClassifier(**params, n_shards=2).fit(KernelStore(store.path))
    _same_model(clf, ref)
    assert clf.fit_warnings_ == ref.fit_warnings_


# ----------------------------------------------------------------------------- bad stores


@pytest.fixture
def small_stores(tmp_path):
    X, y = _data(n=40)
    data = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=16).path
    kern = write_kernel_store(tmp_path / "k.zarr", y, X=X, kernels=KERNELS, chunk_rows=16).path
    return data, kern


def _raises(match, fn, *args, **kwargs):
    with pytest.raises(StoreError, match=match) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_missing_or_foreign_store(tmp_path, small_stores):
    data, kern = small_stores
    assert str(tmp_path / "nope.zarr") in _raises("no such store", DataStore, tmp_path / "nope.zarr")
    (tmp_path / "plain").mkdir()
    _raises("not a Zarr group", DataStore, tmp_path / "plain")
    _raises("this is a data store, not a kernel store", KernelStore, data)
    _raises("this is a kernel store, not a data store", DataStore, kern)
    zarr.open_group(tmp_path / "bare.zarr", mode="w")
    _raises("no mwumkl_dist metadata", DataStore, tmp_path / "bare.zarr")


def test_incompatible_version_and_missing_metadata(small_stores):
    data, kern = small_stores
    _set_meta(data, format_version=99, package_version="9.0")
    msg = _raises("incompatible version", DataStore, data)
    assert data in msg and "store format 99" in msg and "9.0" in msg
    _set_meta(kern, traces=None)
    group = zarr.open_group(kern, mode="r+")
    meta = dict(group.attrs["mwumkl_dist"])
    del meta["traces"]
    group.attrs["mwumkl_dist"] = meta
    _raises("metadata lacks 'traces'", KernelStore, kern)


def test_missing_array_and_shape_mismatch(small_stores):
    data, kern = small_stores
    shutil.rmtree(os.path.join(kern, "diag"))
    _raises("missing array 'diag'", KernelStore, kern)
    _set_meta(data, n_features=5)
    _raises(r"array 'X' has shape \(40, 4\), the metadata implies \(40, 5\)", DataStore, data)


def test_label_count_mismatch(small_stores):
    data, kern = small_stores
    _set_meta(data, classes=["no"])
    _raises("label count mismatch", DataStore, data)
    _set_meta(kern, n_samples=39)
    _raises("array 'K' has shape", KernelStore, kern)


def test_trace_metadata_must_match_diagonal(small_stores):
    _, kern = small_stores
    traces = KernelStore(kern).meta["traces"]
    _set_meta(kern, traces=[traces[0] * 2, *traces[1:]])
    _raises("trace of kernel 0", KernelStore, kern)


def test_deleted_chunk_is_found_on_open(small_stores):
    data, kern = small_stores
    os.remove(os.path.join(kern, "K", "c", "0", "5", "1"))
    msg = _raises(r"array 'K' is missing 1 of its 120 chunk files", KernelStore, kern)
    assert kern in msg
    os.remove(os.path.join(data, "X", "c", "1", "0"))
    _raises("array 'X' is missing 1 of its 3 chunk files", DataStore, data)


def test_truncated_kernel_chunk_is_found_on_open(small_stores):
    _, kern = small_stores
    chunk = os.path.join(kern, "K", "c", "0", "7", "2")
    with open(chunk, "r+b") as fh:
        fh.truncate(100)
    msg = _raises(r"chunk K/c/0/7/2 has 100 bytes, expected 388 \(truncated or corrupt\)", KernelStore, kern)
    assert msg.startswith(kern)


def test_corrupt_kernel_chunk_fails_when_read(small_stores):
    _, kern = small_stores
    store = KernelStore(kern)  # sizes are right: only the checksum can tell
    chunk = os.path.join(kern, "K", "c", "0", "3", "0")
    raw = bytearray(open(chunk, "rb").read())
    raw[20] ^= 0xFF
    open(chunk, "wb").write(bytes(raw))
    msg = _raises("cannot read column 3", store.read_columns, 3, (0, 16), (0, 3))
    assert msg.startswith(kern) and "K/c/0/3/0" in msg and "checksum" in msg
    with pytest.raises(StoreError, match="K/c/0/3/0"):  # also from a fit that needs the column
        MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3), max_iter=40).fit(store)


def test_truncated_data_chunk_fails_before_solving(small_stores):
    data, _ = small_stores
    chunk = os.path.join(data, "X", "c", "1", "0")
    with open(chunk, "r+b") as fh:
        fh.truncate(30)
    store = DataStore(data)  # compressed chunks vary in size: found when the shard reads its rows
    calls = []
    clf = MWUMKLClassifier(kernels="paper", **literal(epsilon=0.3), n_shards=2, callback=calls.append, callback_every=1)
    with pytest.raises(StoreError, match=r"cannot read rows 16\.\.39 .*chunk X/c/1/0") as info:
        clf.fit(store)
    assert str(info.value).startswith(data)
    assert calls == []  # no iteration ran


def test_chunk_deleted_after_open_reads_as_missing(small_stores):
    _, kern = small_stores
    store = KernelStore(kern)
    os.remove(os.path.join(kern, "K", "c", "0", "9", "0"))
    _raises(r"missing chunk in column 9 \(chunk K/c/0/9/0\)", store.read_columns, 9, (0, 16), (0, 3))


def test_store_misuse_in_fit(small_stores):
    data, kern = small_stores
    with pytest.raises(ValueError, match="labels come from the store"):
        MWUMKLClassifier().fit(DataStore(data), np.zeros(40))
    with pytest.raises(ValueError, match="needs kernels='precomputed'"):
        MWUMKLClassifier(kernels="paper").fit(KernelStore(kern))
    with pytest.raises(ValueError, match="needs a kernel store"):
        MWUMKLClassifier(kernels="precomputed").fit(DataStore(data))
    X, y = _data(n=40)
    _raises("already exists", write_data_store, data, X, y)


# ----------------------------------------------------------------------------- chunk identity


def _swap(a, b):
    ra, rb = open(a, "rb").read(), open(b, "rb").read()
    open(a, "wb").write(rb)
    open(b, "wb").write(ra)


def _sparse_data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, 30, density=0.2, random_state=rng, format="csr")
    y = np.where(np.asarray(X.sum(axis=1)).ravel() > 0.9, 1, -1)
    return X, y


def test_swapped_label_chunks_fail_the_fit_and_store_info(tmp_path, capsys):
    X, y = _data(n=60)
    path = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=16).path
    assert _run(["store", "info", path]) == 0  # an intact store passes
    assert "chunks: 8 checked" in capsys.readouterr().out
    _swap(os.path.join(path, "y", "c", "1"), os.path.join(path, "y", "c", "2"))  # both CRC-32C still valid
    msg = _raises(r"chunk y/c/1 \(array 'y', chunk position \(1,\)\) is not the chunk written", DataStore, path)
    assert msg.startswith(path) and "re-create the store" in msg
    with pytest.raises(StoreError, match="y/c/1"):
        MWUMKLClassifier(kernels="paper", **literal(epsilon=0.3)).fit(DataStore(path, verify=False))
    n_checked, problems = DataStore(path, verify=False).verify_chunks()
    assert n_checked == 8 and [p.split()[1] for p in problems] == ["y/c/1", "y/c/2"]
    with pytest.raises(StoreError, match=r"2 of its 8 chunks are bad: chunk y/c/1 .*y/c/2"):
        _run(["store", "info", path])


@pytest.mark.parametrize("sparse", [False, True])
def test_swapped_feature_chunks_fail_when_read(tmp_path, sparse):
    X, y = _sparse_data() if sparse else _data(n=60)
    path = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=16, compress=False).path
    name, a, b = ("indptr", "1", "2") if sparse else ("X", "1/0", "2/0")
    _swap(os.path.join(path, name, "c", *a.split("/")), os.path.join(path, name, "c", *b.split("/")))
    store = DataStore(path)  # the labels are intact: found when the rows are read
    with pytest.raises(StoreError, match=rf"chunk {name}/c/{a} \(array '{name}'") as info:
        MWUMKLClassifier(kernels="paper", **literal(epsilon=0.3), n_shards=2).fit(store)
    assert str(info.value).startswith(path)
    assert len(store.verify_chunks()[1]) == 2


def test_chunk_copied_from_another_store_of_the_same_shape(tmp_path):
    X, y = _data(n=40)
    X2, y2 = _data(n=40, seed=1)
    a = write_data_store(tmp_path / "a.zarr", X, y, chunk_rows=16).path
    b = write_data_store(tmp_path / "b.zarr", X2, y2, chunk_rows=16).path
    shutil.copyfile(os.path.join(b, "X", "c", "1", "0"), os.path.join(a, "X", "c", "1", "0"))
    store = DataStore(a)
    _raises(r"chunk X/c/1/0 \(array 'X', chunk position \(1, 0\)\) is not the chunk written", store.read_rows, 0, 40)
    # Even a copy of identical content: the records are keyed by the store id.
    kern_a = write_kernel_store(tmp_path / "ka.zarr", y, X=X, kernels=KERNELS, chunk_rows=16).path
    kern_b = write_kernel_store(tmp_path / "kb.zarr", y, X=X, kernels=KERNELS, chunk_rows=16).path
    for name in ("K", "diag", "y"):  # same data: every chunk file is byte-identical, only the records differ
        shutil.rmtree(os.path.join(kern_a, name, "c"))
        shutil.copytree(os.path.join(kern_b, name, "c"), os.path.join(kern_a, name, "c"))
    assert KernelStore(kern_a).read_columns(3, (0, 16), (0, 3)).shape == (16, 3)  # identical bytes: same data
    shutil.copyfile(os.path.join(kern_b, "K", "chunk_digests.npy"), os.path.join(kern_a, "K", "chunk_digests.npy"))
    _raises("chunk identity records of array 'K' .* are not the ones written with this store", KernelStore, kern_a)


def test_swapped_kernel_columns_fail_when_read(small_stores):
    _, kern = small_stores
    _swap(os.path.join(kern, "K", "c", "0", "3", "0"), os.path.join(kern, "K", "c", "0", "4", "0"))
    store = KernelStore(kern)
    _raises(r"chunk K/c/0/3/0 \(array 'K', chunk position \(0, 3, 0\)\)", store.read_columns, 3, (0, 16), (0, 3))
    with pytest.raises(StoreError, match="K/c/0/[34]/0"):
        MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3), max_iter=40).fit(store)


def test_format_1_store_is_read_without_identity_checks(small_stores, capsys):
    data, _ = small_stores
    ref = DataStore(data).read_rows(0, 40)
    group = zarr.open_group(data, mode="r+")
    meta = dict(group.attrs["mwumkl_dist"])
    for key in ("store_id", "chunk_digests"):
        del meta[key]
    group.attrs["mwumkl_dist"] = {**meta, "format_version": 1}
    for name in ("X", "y"):
        os.remove(os.path.join(data, name, "chunk_digests.npy"))
    with pytest.warns(UserWarning, match="keeps no chunk identity records"):
        store = DataStore(data)
    np.testing.assert_array_equal(store.read_rows(0, 40), ref)
    with pytest.warns(UserWarning):
        assert _run(["store", "info", data]) == 0
    assert "chunk positions cannot be checked" in capsys.readouterr().out


def test_store_info_finds_a_corrupt_chunk(small_stores):
    data, _ = small_stores
    chunk = os.path.join(data, "X", "c", "1", "0")
    raw = bytearray(open(chunk, "rb").read())
    raw[5] ^= 0xFF
    open(chunk, "wb").write(bytes(raw))
    with pytest.raises(StoreError, match=r"1 of its 6 chunks are bad: chunk X/c/1/0: its content does not match"):
        _run(["store", "info", data])


# ----------------------------------------------------------------------------- failed writes


def _fail_writes_after(monkeypatch, n_ok):
    """Make every chunk write after the first ``n_ok`` fail as a full file system would."""
    from zarr.storage import LocalStore

    real = LocalStore.set
    count = [0]

    async def failing(self, key, value):
        if "/c/" in key:
            count[0] += 1
            if count[0] > n_ok:
                raise OSError(27, "File too large")
        await real(self, key, value)

    monkeypatch.setattr(LocalStore, "set", failing)


@pytest.mark.parametrize("kind", ["data", "kernels"])
def test_failed_store_write_leaves_no_store(tmp_path, monkeypatch, kind):
    X, y = _data(n=40)
    path = str(tmp_path / "s.zarr")
    _fail_writes_after(monkeypatch, 3)
    with pytest.raises(OSError, match=rf"could not write {'data' if kind == 'data' else 'kernel'} store {path}: "
                       r"\[Errno 27\] File too large") as info:  # fmt: skip
        if kind == "data":
            write_data_store(path, X, y, chunk_rows=16)
        else:
            write_kernel_store(path, y, X=X, kernels=KERNELS, chunk_rows=16)
    assert info.value.errno == 27
    assert os.listdir(tmp_path) == []  # neither a store nor a temporary directory


def test_failed_overwrite_keeps_the_older_store(tmp_path, monkeypatch):
    X, y = _data(n=40)
    path = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=16).path
    _fail_writes_after(monkeypatch, 2)
    with pytest.raises(OSError, match="could not write data store"):
        write_data_store(path, X[::-1], y[::-1], chunk_rows=16, overwrite=True)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["d.zarr"]
    store = DataStore(path)
    np.testing.assert_array_equal(store.read_rows(0, 40), X)
    assert store.verify_chunks() == (6, [])
    again = write_data_store(path, X[::-1], y[::-1], chunk_rows=16, overwrite=True)  # a write that succeeds
    np.testing.assert_array_equal(again.read_rows(0, 40), X[::-1])
    assert os.listdir(tmp_path) == ["d.zarr"]


# ----------------------------------------------------------------------------- command line


def _run(argv):
    parser = argparse.ArgumentParser(prog="mwumkl-dist")
    add_store_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return commands.run(args)


def test_store_commands(tmp_path, capsys):
    X, y = _data(n=50)
    feats = [" ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(row)) for row in X]
    lines = [f"{1 if c == 'yes' else -1} {f}" for f, c in zip(feats, y)]
    src = tmp_path / "train.svm"
    src.write_text("\n".join(lines) + "\n")
    assert _run(["store", "data", "--input", str(src), "--output", str(tmp_path / "d.zarr"), "--chunk-rows", "16"]) == 0
    assert "50 points, 4 features, CSR" in capsys.readouterr().out
    out = str(tmp_path / "k.zarr")
    assert _run(["store", "kernels", "--input", str(src), "--kernels", "paper", "--output", out]) == 0
    kern = KernelStore(tmp_path / "k.zarr")
    assert kern.n_kernels == 12 and kern.meta["n_features"] == 4
    assert _run(["store", "info", str(tmp_path / "k.zarr")]) == 0
    out = capsys.readouterr().out
    assert "12 kernels" in out and "source_sha256" in out
    np.save(tmp_path / "K.npy", np.stack([np.eye(50), np.ones((50, 50)) + np.eye(50)]))
    np.save(tmp_path / "y.npy", np.where(y == "yes", 1, -1))
    argv = ["store", "kernels", "--npy", str(tmp_path / "K.npy"), "--labels", str(tmp_path / "y.npy")]
    assert _run([*argv, "--output", str(tmp_path / "n.zarr")]) == 0
    assert KernelStore(tmp_path / "n.zarr").kernel_names == ["K.npy[0]", "K.npy[1]"]
    with pytest.raises(ValueError, match="--npy needs --labels"):
        _run(["store", "kernels", "--npy", str(tmp_path / "K.npy"), "--output", str(tmp_path / "x.zarr")])
    with pytest.raises(
        CommandError, match=r"--output .*n\.zarr: already exists; choose another path, or pass --overwrite"
    ):
        _run([*argv, "--output", str(tmp_path / "n.zarr")])
    assert _run([*argv, "--output", str(tmp_path / "n.zarr"), "--overwrite"]) == 0
    meta = json.loads((tmp_path / "n.zarr" / "zarr.json").read_text())["attributes"]["mwumkl_dist"]
    assert meta["format"] == "mwumkl_dist-kernels"

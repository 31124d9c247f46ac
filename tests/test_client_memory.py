"""What the client of a large fit holds: no ``n``-sized index arrays for its samples, one copy of a store's labels."""

import tracemalloc

import numpy as np
import pytest

from mwumkl_dist.solvers import base


def _train_test_split_rows(y, size, seed):
    """The sample as it was drawn before: scikit-learn's ``train_test_split`` (a uniform one where it refuses)."""
    from sklearn.model_selection import train_test_split

    if len(y) <= size:
        return np.arange(len(y))
    try:
        rows, _ = train_test_split(np.arange(len(y)), train_size=size, stratify=y, random_state=seed)
    except ValueError:
        rows = np.random.default_rng(seed).choice(len(y), size=size, replace=False)
    return np.sort(rows)


def test_the_stratified_sample_is_train_test_splits_whatever_the_chunks(monkeypatch):
    rng = np.random.default_rng(0)
    names = np.array(["x", "yy", "z", "w", "v", "u"], dtype=object)
    for trial in range(160):
        n, k = int(rng.integers(2, 300)), int(rng.integers(1, 6))
        codes = rng.integers(0, k, n)
        y = [codes, np.array(list("abcdef"))[codes], codes * 0.5 - 1.0, names[codes]][trial % 4]
        size, seed = int(rng.integers(1, n + 3)), int(rng.integers(0, 1000))
        monkeypatch.setattr(base, "SAMPLE_CHUNK", int(rng.integers(1, 50)))
        np.testing.assert_array_equal(base.stratified_rows(y, size, seed), _train_test_split_rows(y, size, seed),
                                      err_msg=f"trial {trial}")  # fmt: skip


@pytest.mark.timeout(300)
def test_a_large_stratified_sample_holds_no_index_arrays_of_the_rows_size():
    n = 3 * 10**6
    y = np.where(np.random.default_rng(2).random(n) < 0.4, 1.0, -1.0)
    tracemalloc.start()
    try:
        rows = base.stratified_rows(y, 5000, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(rows, _train_test_split_rows(y, 5000, 0))
    assert peak < 8 * n  # train_test_split: 80 bytes a row; here the largest class's permutation (8 a row of it)


def test_a_store_input_shares_its_labels_with_its_views(tmp_path):
    from mwumkl_dist.data.problems import DataStoreInput
    from mwumkl_dist.stores import open_store, write_data_store

    X = np.random.default_rng(0).random((50, 3))
    y = np.where(X[:, 0] > 0.5, 1, -1)
    write_data_store(tmp_path / "s.zarr", X, y, chunk_rows=16)
    data = DataStoreInput(open_store(tmp_path / "s.zarr"), "gaussian:1")
    assert data.with_kernels(["gaussian:2"]).y is data.y  # a store reads its labels afresh at every access
    np.testing.assert_array_equal(data.y, y)


def test_a_store_input_reads_the_same_scattered_rows_once(tmp_path, monkeypatch):
    """The two-stage fit asks for its landmarks and residual rows at several stages; a read of scattered rows
    decodes every chunk of the store, so the last reads are remembered (read-only, a bounded number of rows)."""
    from mwumkl_dist.data import problems
    from mwumkl_dist.data.problems import DataStoreInput
    from mwumkl_dist.stores import open_store, write_data_store

    X = np.random.default_rng(0).random((200, 3))
    write_data_store(tmp_path / "s.zarr", X, (X[:, 0] > 0.5).astype(int), chunk_rows=16)
    data = DataStoreInput(open_store(tmp_path / "s.zarr"), "gaussian:1")
    reads = []
    take = data.store.take_rows
    monkeypatch.setattr(data.store, "take_rows", lambda rows: (reads.append(len(rows)), take(rows))[1])
    monkeypatch.setattr(problems, "REMEMBERED_ROWS", 50)
    a = data.support_vectors([5, 190, 17])
    np.testing.assert_array_equal(a, X[[5, 190, 17]])
    assert data.support_vectors(np.array([5, 190, 17])) is a and reads == [3]
    assert not a.flags.writeable
    data.support_vectors(np.arange(40))  # 43 rows remembered
    data.support_vectors(np.arange(100, 110))  # past 50: the oldest read is forgotten
    data.support_vectors([5, 190, 17])
    assert reads == [3, 40, 10, 3]
    np.testing.assert_array_equal(data.support_vectors(np.arange(60)), X[:60])  # more than 50: not remembered

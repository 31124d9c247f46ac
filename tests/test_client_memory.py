"""What the client of a large fit holds: no ``n``-sized index arrays for its samples, one copy of a store's labels."""

import tracemalloc

import numpy as np
import pytest

from mwumkl_dist.solvers import base


@pytest.fixture
def lean(monkeypatch):
    monkeypatch.setattr(base, "LEAN_SAMPLE_ROWS", 0)
    monkeypatch.setattr(base, "SAMPLE_CHUNK", 7)


def test_the_lean_sample_takes_each_class_its_share_in_sorted_distinct_rows(lean):
    y = np.array(["a"] * 30 + ["b"] * 61 + ["c"] * 9)[np.random.default_rng(0).permutation(100)]
    rows = base.stratified_rows(y, 20, seed=4)
    assert len(rows) == 20 and np.all(np.diff(rows) > 0) and rows[-1] < 100
    # shares 6, 12.2, 1.8: the largest remainder (c's 0.8) gets the last row
    assert [int(np.sum(y[rows] == c)) for c in "abc"] == [6, 12, 2]
    np.testing.assert_array_equal(base.stratified_rows(y, 20, seed=4), rows)  # a seed gives one sample


def test_the_lean_sample_does_not_depend_on_its_chunks_and_is_uniform_within_a_class(lean, monkeypatch):
    y = np.where(np.random.default_rng(1).random(400) < 0.25, 1.0, -1.0)
    first = base.stratified_rows(y, 40, seed=2)
    monkeypatch.setattr(base, "SAMPLE_CHUNK", 1000)
    np.testing.assert_array_equal(base.stratified_rows(y, 40, seed=2), first)
    hits = np.zeros(len(y))
    for seed in range(600):
        hits[base.stratified_rows(y, 40, seed)] += 1
    for label in (1.0, -1.0):  # each row of a class drawn with the same probability: quota / class size
        members = y == label
        expected = 600 * np.sum(y[first] == label) / members.sum()
        freq = hits[members]
        assert abs(freq.mean() - expected) < 1e-9  # exactly the quota every time
        assert freq.std() < 0.35 * expected  # binomial spread (about 0.3 of the mean here); one row always: 3x


@pytest.mark.timeout(300)
def test_a_large_stratified_sample_holds_no_array_of_the_rows_size():
    n = base.LEAN_SAMPLE_ROWS + 1000
    y = np.where(np.random.default_rng(2).random(n) < 0.4, 1.0, -1.0)
    tracemalloc.start()
    try:
        rows = base.stratified_rows(y, 5000, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(rows) == 5000
    assert peak < 8 * n  # train_test_split: 80 bytes a row; here a chunk's arrays (one copy: 8)


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

"""The data loader: svmlight (plain, gzip, CRLF), CSV, .npy, .npz and its error messages."""

from __future__ import annotations

import bz2
import gzip
import os
import re

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from mwumkl_dist.io import data_format, format_label, load_data


@pytest.fixture
def Xy():
    rng = np.random.default_rng(0)
    X = rng.random((12, 5))
    X[X < 0.4] = 0.0  # some sparsity, so svmlight rows skip entries
    X[:, 4] = 0.0  # the last feature never appears in the file
    X[0, 4] = 0.5  # ...except once, so the training file has all 5
    y = np.where(np.arange(12) % 3 == 0, 1.0, -1.0)
    return X, y


def write(path, text, mode="w"):
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(os.path.splitext(str(path))[1], open)
    with opener(path, mode + ("t" if opener is not open else ""), newline="") as fh:
        fh.write(text)
    return path


# ----------------------------------------------------------------------------- svmlight


@pytest.mark.parametrize("name", ["d.svm", "d.libsvm", "d.svmlight", "d.txt", "d.svm.gz", "d.svm.bz2"])
def test_svmlight_round_trip_keeps_csr(tmp_path, Xy, name):
    X, y = Xy
    plain = tmp_path / "plain.svm"
    dump_svmlight_file(X, y, str(plain), zero_based=False)
    path = write(tmp_path / name, plain.read_text())
    Xl, yl = load_data(path)
    assert sp.issparse(Xl) and Xl.format == "csr"
    assert Xl.dtype == np.float64
    np.testing.assert_allclose(Xl.toarray(), X, rtol=1e-15)
    np.testing.assert_array_equal(yl, y)


def test_svmlight_crlf_labels_1_2_and_comments(tmp_path):
    # Like the LIBSVM mushrooms file: CRLF line ends and labels 1/2.
    text = "# a comment\r\n1 1:1 3:1\r\n\r\n2 2:1 3:0.5\r\n1 1:0.25\r\n"
    Xl, yl = load_data(write(tmp_path / "m.svm", text))
    np.testing.assert_array_equal(Xl.toarray(), [[1, 0, 1], [0, 1, 0.5], [0.25, 0, 0]])
    np.testing.assert_array_equal(yl, [1.0, 2.0, 1.0])


def test_svmlight_n_features_pads_a_test_file(tmp_path, Xy):
    X, y = Xy
    Xtest = X[1:].copy()  # row 0 is the only one with feature 5: the file mentions 4 features
    path = tmp_path / "test.svm"
    dump_svmlight_file(Xtest, y[1:], str(path), zero_based=False)
    assert load_data(path)[0].shape == (11, 4)
    Xl, _ = load_data(path, n_features=5)
    assert Xl.shape == (11, 5)
    np.testing.assert_allclose(Xl.toarray(), Xtest)


def test_svmlight_more_features_than_expected(tmp_path, Xy):
    X, y = Xy
    path = tmp_path / "wide.svm"
    dump_svmlight_file(X, y, str(path), zero_based=False)
    with pytest.raises(ValueError, match=r"wide\.svm: the file uses 5 features but 3 are expected"):
        load_data(path, n_features=3)


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("1 1:0.5\n-1 2:abc\n", r"line 2: value 'abc' of feature 2 is not a number"),
        ("1 1:0.5\nyes 2:1\n", r"line 2: label 'yes' is not a number"),
        ("1 1:0.5\n-1 x:1\n", r"line 2: feature index 'x'"),
        ("1,2,3\n", r"line 1: label '1,2,3' is not a number"),
        ("# header\n1 1:0.5\n-1 2:nan\n", r"line 3 has a feature value nan"),
        ("1 1:inf\n", r"line 1 has a feature value inf"),
        ("nan 1:1\n", r"line 1 has label nan"),
        ("", r"the file holds no data rows"),
        ("# only a comment\n\n", r"the file holds no data rows"),
    ],
)
def test_svmlight_errors_name_file_and_line(tmp_path, text, pattern):
    path = write(tmp_path / "bad.svm", text)
    with pytest.raises(ValueError, match=r"bad\.svm: " + pattern):
        load_data(path)


def test_damaged_gzip(tmp_path):
    path = tmp_path / "d.svm.gz"
    path.write_bytes(b"this is not gzip")
    with pytest.raises(ValueError, match=r"d\.svm\.gz: damaged or truncated compressed file"):
        load_data(path)


# ----------------------------------------------------------------------------- CSV and text tables


def test_csv_header_string_labels_crlf(tmp_path):
    text = "f1,f2,label\r\n1.5,2,yes\r\n3,-4e-1,no\r\n\r\n0,0,yes\r\n"
    X, y = load_data(write(tmp_path / "d.csv", text))
    np.testing.assert_array_equal(X, [[1.5, 2], [3, -0.4], [0, 0]])
    assert y.tolist() == ["yes", "no", "yes"]


@pytest.mark.parametrize(
    "name, text",
    [
        ("d.csv", "1,2,1\n3,4,2\n"),
        ("d.csv.gz", "1,2,1\n3,4,2\n"),
        ("d.tsv", "1\t2\t1\n3\t4\t2\n"),
        ("d.csv", "1;2;1\n3;4;2\n"),
        ("d.txt", "1 2 1\n3   4 2\n"),  # a .txt without ':' is a whitespace table
        ("d.txt", "1,2,1\n3,4,2\n"),
    ],
)
def test_delimited_numeric(tmp_path, name, text):
    X, y = load_data(write(tmp_path / name, text))
    np.testing.assert_array_equal(X, [[1, 2], [3, 4]])
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, [1, 2])


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("1,2,1\n3,abc,2\n", r"line 2, column 2 holds 'abc', not a number"),
        ("1,2,1\n3,,2\n", r"line 2, column 2 holds an empty cell"),
        ("1,2,1\n3,4\n", r"line 2 has 2 columns, the first data row has 3"),
        ("a,b,c\n1,2,1\n3,nan,2\n", r"line 3, feature column 2 is nan"),
        ("1,2,1\n3,inf,2\n", r"line 2, feature column 2 is inf"),
        ("1,2,1\n3,4,nan\n", r"line 2 has label nan"),
        ("1,2,1\n3,4,\n", r"line 2 has an empty label"),
        ("", r"the file holds no data rows"),
        ("a,b,label\n", r"the file holds a header but no data rows"),
        ("1\n2\n", r"needs at least one feature column and a label column"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path, text, pattern):
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(ValueError, match=r"bad\.csv: " + pattern):
        load_data(path)


def test_csv_binary_content(tmp_path):
    path = tmp_path / "bin.csv"
    path.write_bytes(b"1,2,3\n\xff\xfe\x00garbage\n")
    with pytest.raises(ValueError, match=r"bin\.csv: line 2 holds byte 0xff, not UTF-8 text: this does not look like a "
                       r"text CSV file"):  # fmt: skip
        load_data(path)


@pytest.mark.parametrize(
    ("content", "line", "what", "hint"),
    [
        (b"L3\x9f\x00\x13binary", 1, "byte 0x9f, not UTF-8 text", "binary or compressed data"),
        (b"1 1:0.5\n-1 2:0.25\n1 3:\xc3(\n", 3, "byte 0xc3, not UTF-8 text", "binary or compressed data"),
        (b"PK\x03\x04\x14\x00\x00\x00\x08\x00", 1, "a NUL byte", "a zip archive"),
        (gzip.compress(b"1 1:0.5\n-1 2:0.25\n"), 1, "byte 0x8b, not UTF-8 text", r"gzip data \(name it \.gz\)"),
    ],
)
def test_binary_svmlight_file_names_the_line(tmp_path, content, line, what, hint):
    """The issue's ``could not convert string to float: b'L3\\x9f...'``: now the file, the line and what is wrong."""
    path = tmp_path / "data.svm"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_data(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line {line} holds {what}: this does not look like a text svmlight file (")
    assert re.search(hint, message), message


def test_malformed_text_svmlight_line_says_so(tmp_path):
    path = write(tmp_path / "d.svm", "1 1:0.5\nL3 2:0.25\n")
    with pytest.raises(
        ValueError, match=r"d\.svm: line 2: label 'L3' is not a number \(is this a text svmlight file\?\)"
    ):
        load_data(path)


def test_csv_labels_auto(tmp_path):
    path = write(tmp_path / "d.csv", "1,2,1\n3,4,2\n")
    X, y = load_data(path, n_features=3, labels="auto")  # 3 columns = 3 features, no labels
    assert y is None and X.shape == (2, 3)
    X, y = load_data(path, n_features=2, labels="auto")
    assert X.shape == (2, 2) and y.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"d\.csv: 2 feature columns plus a label column, but 5 features"):
        load_data(path, n_features=5, labels="auto")
    with pytest.raises(ValueError, match="labels='auto' needs n_features"):
        load_data(path, labels="auto")


# ----------------------------------------------------------------------------- NumPy


def test_npy(tmp_path, Xy):
    X, y = Xy
    path = tmp_path / "d.npy"
    np.save(path, np.column_stack([X, y]))
    Xl, yl = load_data(path)
    np.testing.assert_array_equal(Xl, X)
    np.testing.assert_array_equal(yl, y)
    Xl, yl = load_data(path, n_features=6, labels="auto")
    assert yl is None and Xl.shape == (12, 6)
    with pytest.raises(ValueError, match=r"d\.npy: 5 feature columns plus a label column, but 4 features"):
        load_data(path, n_features=4)


def test_npy_integer_labels_kept(tmp_path):
    path = tmp_path / "i.npy"
    np.save(path, np.array([[1, 2, 0], [3, 4, 7]], dtype=np.int64))
    X, y = load_data(path)
    assert X.dtype == np.float64 and y.tolist() == [0, 7]


@pytest.mark.parametrize(
    "array, pattern",
    [
        (np.zeros(4), r"expected a 2-d array"),
        (np.zeros((0, 3)), r"the file holds no data rows"),
        (np.array([[1.0, np.nan, 1.0]]), r"row 1, feature column 2 is nan"),
        (np.array([[1.0, 2.0, np.inf]]), r"row 1 has label inf"),
        (np.array([["a", "b"]]), r"expected a numeric array"),
    ],
)
def test_npy_errors(tmp_path, array, pattern):
    path = tmp_path / "bad.npy"
    np.save(path, array)
    with pytest.raises(ValueError, match=r"bad\.npy: " + pattern):
        load_data(path)


def test_npy_object_array_and_not_npy(tmp_path):
    path = tmp_path / "obj.npy"
    np.save(path, np.array([[1, "a"]], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"obj\.npy: holds Python objects"):
        load_data(path)
    path = write(tmp_path / "text.npy", "1,2,3\n")
    with pytest.raises(ValueError, match=r"text\.npy: not a \.npy file"):
        load_data(path)


def test_npz(tmp_path, Xy):
    X, _ = Xy
    labels = np.array(["a", "b"] * 6)
    path = tmp_path / "d.npz"
    np.savez(path, X=X, y=labels)
    Xl, yl = load_data(path)
    np.testing.assert_array_equal(Xl, X)
    assert yl.tolist() == labels.tolist()
    np.savez(tmp_path / "bad.npz", data=X)
    with pytest.raises(ValueError, match=r"bad\.npz: expected arrays 'X' and 'y'.*found \['data'\]"):
        load_data(tmp_path / "bad.npz")
    np.savez(tmp_path / "short.npz", X=X, y=labels[:3])
    with pytest.raises(ValueError, match=r"short\.npz: 'y' must be 1-d with one label per row"):
        load_data(tmp_path / "short.npz")


# ----------------------------------------------------------------------------- files and names


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data file not found: .*nope\.svm"):
        load_data(tmp_path / "nope.svm")
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(IsADirectoryError, match=r"dir\.csv is a directory"):
        load_data(tmp_path / "dir.csv")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    path = write(tmp_path / "secret.csv", "1,2,1\n")
    path.chmod(0)
    with pytest.raises(PermissionError, match=r"cannot read .*secret\.csv"):
        load_data(path)


@pytest.mark.parametrize(
    "name, fmt",
    [("a.svm", "svmlight"), ("a.LIBSVM.GZ", "svmlight"), ("a.csv.bz2", "csv"), ("a.npy", "npy"), ("a.txt", "txt")],
)
def test_data_format(name, fmt):
    assert data_format(name) == fmt


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("data.xlsx", r"unknown data file type '\.xlsx'"),
        ("data", r"unknown data file type '\(no extension\)'"),
        ("data.npy.gz", r"compressed \.npy files are not supported"),
    ],
)
def test_unknown_extension(tmp_path, name, pattern):
    path = write(tmp_path / name, "1,2,1\n", mode="w")
    with pytest.raises(ValueError, match=pattern):
        load_data(path)


def test_bad_arguments(tmp_path):
    path = write(tmp_path / "d.csv", "1,2,1\n")
    with pytest.raises(ValueError, match="n_features must be a positive integer"):
        load_data(path, n_features=0)
    with pytest.raises(ValueError, match="labels must be True or 'auto'"):
        load_data(path, labels=False)


def test_format_label():
    assert [format_label(v) for v in (1.0, -1.0, np.float64(2.0), 0.5, np.int64(3), "yes", np.str_("b"))] == [
        "1",
        "-1",
        "2",
        "0.5",
        "3",
        "yes",
        "b",
    ]

"""Reading labelled data files: svmlight/LIBSVM, CSV and NumPy.

:func:`load_data` picks the format from the file name:

========================================  =============================================
``.svm``, ``.svmlight``, ``.libsvm``      svmlight (``label idx:value ...``), read as CSR
``.txt``                                  svmlight, or CSV when the first row has no ``:``
``.csv`` (comma), ``.tsv`` (tab)          one row per point, label in the last column
``.npy``                                  a 2-d numeric array, label in the last column
``.npz``                                  arrays ``X`` (2-d) and ``y`` (1-d)
========================================  =============================================

Text formats may be compressed (``.gz``, ``.bz2``).  Every problem (missing
file, unknown extension, no rows, a non-numeric value, NaN or infinity) raises
an ``OSError`` or ``ValueError`` whose message names the file and, for text
files, the line.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import math
import os
import warnings
import zipfile
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

__all__ = [
    "load_data",
    "read_data",
    "read_npy_header",
    "DataFile",
    "data_format",
    "format_label",
    "SUPPORTED_EXTENSIONS",
    "OneBasedAssumedWarning",
]

_SVMLIGHT = (".svm", ".svmlight", ".libsvm")
_TEXT_COMPRESSIONS = (".gz", ".bz2")
#: File endings :func:`load_data` understands (text formats also with ``.gz`` / ``.bz2``).
SUPPORTED_EXTENSIONS = (*_SVMLIGHT, ".txt", ".csv", ".tsv", ".npy", ".npz")


def data_format(path) -> str:
    """The format :func:`load_data` uses for ``path``: ``svmlight``, ``csv``, ``tsv``, ``txt``, ``npy`` or ``npz``.

    ``txt`` is resolved by looking at the file (svmlight when its first data row has a ``:``).
    """
    name = os.path.basename(os.fspath(path)).lower()
    compressed = name.endswith(_TEXT_COMPRESSIONS)
    if compressed:
        name = name.rsplit(".", 1)[0]
    ext = os.path.splitext(name)[1]
    if ext in _SVMLIGHT:
        return "svmlight"
    if ext in (".txt", ".csv", ".tsv"):
        return ext[1:]
    if ext in (".npy", ".npz"):
        if compressed:
            raise ValueError(f"{os.fspath(path)}: compressed {ext} files are not supported; decompress it first")
        return ext[1:]
    raise ValueError(
        f"{os.fspath(path)}: unknown data file type {ext or '(no extension)'!r}; "
        f"expected one of {', '.join(SUPPORTED_EXTENSIONS)} (text formats may end in .gz or .bz2)"
    )


def load_data(path, n_features=None, *, labels=True, zero_based="auto"):
    """Load a labelled data set from ``path``.

    Parameters
    ----------
    path : str or path-like
        The file; its format follows from the extension (see the module docstring).
    n_features : int or None, default=None
        The number of features expected (e.g. a model's ``n_features_in_``).
        svmlight files with fewer features are padded with zero columns (a test
        file need not mention the last feature); any other mismatch is an error.
    labels : bool or "auto", default=True
        ``True``: the file holds a label per point (last column for CSV and
        ``.npy``).  ``"auto"`` (needs ``n_features``): a CSV or ``.npy`` file
        with exactly ``n_features`` columns has no labels and ``y`` is ``None``;
        with ``n_features + 1`` the last column is the label.  svmlight files
        always carry labels.
    zero_based : bool or "auto", default="auto"
        Feature indices of svmlight files: LIBSVM files count from 1; ``"auto"``
        reads a file that uses index 0 as zero-based.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features) or CSR matrix (svmlight)
        Features as float64; svmlight data stays sparse.
    y : ndarray of shape (n_samples,) or None
        Labels: float64 when every label is a number, else strings (CSV).

    Raises
    ------
    FileNotFoundError, PermissionError, IsADirectoryError
        The file cannot be opened.
    ValueError
        Unknown extension, no data rows, a value that is not a number, NaN or
        infinity, inconsistent rows or a feature count other than ``n_features``.
    """
    return read_data(path, n_features, labels=labels, zero_based=zero_based)[:2]


class DataFile(NamedTuple):
    """What :func:`read_data` read: the rows, the labels, and an svmlight file's index convention."""

    X: np.ndarray | sp.csr_matrix
    y: np.ndarray | None
    #: Whether the svmlight file's feature indices were read as zero-based (None for other formats).
    zero_based: bool | None


def read_data(path, n_features=None, *, labels=True, zero_based="auto") -> DataFile:
    """:func:`load_data`, also saying which index convention an svmlight file was read with.

    A model records it (``fit``), so that ``predict`` and ``evaluate`` read test files the same way
    (a zero-based test file that never uses index 0 would otherwise be read shifted by one).
    """
    path = os.fspath(path)
    if labels not in (True, "auto"):
        raise ValueError(f"labels must be True or 'auto', got {labels!r}")
    if labels == "auto" and n_features is None:
        raise ValueError("labels='auto' needs n_features to tell features from labels")
    if n_features is not None:
        if isinstance(n_features, bool) or int(n_features) != n_features or n_features < 1:
            raise ValueError(f"n_features must be a positive integer, got {n_features!r}")
        n_features = int(n_features)
    fmt = data_format(path)
    _check_readable(path)
    if fmt == "txt":
        fmt = "svmlight" if _looks_like_svmlight(path) else "csv"
    convention = None
    if fmt == "svmlight":
        X, y, convention = _load_svmlight(path, n_features, zero_based)
    elif fmt in ("csv", "tsv"):
        X, y = _load_delimited(path, "\t" if fmt == "tsv" else None, n_features, labels)
    elif fmt == "npy":
        X, y = _load_npy(path, n_features, labels)
    else:
        X, y = _load_npz(path, n_features)
    if X.shape[0] == 0:
        raise ValueError(f"{path}: the file holds no data rows")
    return DataFile(X, y, convention)


# ----------------------------------------------------------------------------- helpers


def _check_readable(path: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"data file not found: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory, not a data file")
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise type(exc)(f"cannot read {path}: {exc.strerror or exc}") from None


def _open_text(path: str):
    # utf-8-sig: a byte order mark at the start (some editors write one) is not part of the first cell.
    lower = path.lower()
    if lower.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    if lower.endswith(".bz2"):
        return bz2.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


#: What reading a damaged, binary or unreadable text file raises (reworded by ``_reword_read_error``).
_READ_ERRORS = (UnicodeDecodeError, EOFError, OSError)
#: Bytes read at a time when looking for the first line that is not text.
_SCAN_BLOCK = 1 << 20
#: Compressed formats by their first bytes (a file named ``.svm`` that is really ``.svm.gz``, say).
_MAGIC = {
    b"\x1f\x8b": "gzip data (name it .gz)",
    b"BZh": "bzip2 data (name it .bz2)",
    b"PK\x03\x04": "a zip archive (an .npz file? a saved model?)",
    b"\x28\xb5\x2f\xfd": "zstd data",
    b"\x93NUMPY": "a NumPy .npy file",
}


def _open_bytes(path: str):
    lower = path.lower()
    if lower.endswith(".gz"):
        return gzip.open(path, "rb")
    if lower.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def _not_text(path: str, kind: str) -> str | None:
    """``"PATH: line N: ... does not look like a text KIND file"`` at the first line that is not UTF-8 text.

    None when every line decodes (reads the file in blocks; a NUL byte counts as binary too).
    """
    try:
        with _open_bytes(path) as fh:
            head = fh.read(8)
            fh.seek(0)
            decoder = codecs.getincrementaldecoder("utf-8")()
            line = 1
            while block := fh.read(_SCAN_BLOCK):
                nul = block.find(b"\0")
                try:
                    decoder.decode(block if nul < 0 else block[:nul])
                    bad = nul
                    what = "a NUL byte" if nul >= 0 else ""
                except UnicodeDecodeError as exc:
                    bad = max(0, exc.start - len(decoder.getstate()[0]))
                    what = f"byte 0x{block[bad]:02x}, not UTF-8 text"
                if bad >= 0:
                    line += block.count(b"\n", 0, bad)
                    break
                line += block.count(b"\n")
            else:
                return None
    except (EOFError, OSError):
        return None
    magic = next((name for m, name in _MAGIC.items() if head.startswith(m)), None)
    hint = f" (it starts like {magic})" if magic else " (binary or compressed data?)"
    return f"{path}: line {line} holds {what}: this does not look like a text {kind} file{hint}"


def _reword_read_error(path: str, exc: BaseException, kind: str = "data") -> Exception:
    if isinstance(exc, UnicodeDecodeError):
        located = _not_text(path, kind)
        if located is not None:
            return ValueError(located)
        return ValueError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})")
    if isinstance(exc, (EOFError, gzip.BadGzipFile)) or "compressed" in str(exc).lower():
        return ValueError(f"{path}: damaged or truncated compressed file ({exc})")
    if isinstance(exc, OSError):
        return type(exc)(f"cannot read {path}: {exc.strerror or exc}")
    return ValueError(f"{path}: {exc}")


def _data_lines(fh):
    """``(line_number, text)`` of non-blank lines that are not ``#`` comments."""
    for number, line in enumerate(fh, start=1):
        text = line.strip()
        if text and not text.startswith("#"):
            yield number, text


def _looks_like_svmlight(path: str) -> bool:
    try:
        with _open_text(path) as fh:
            for _, text in _data_lines(fh):
                # A lone label is a valid svmlight row (all features zero) but no CSV row.
                tokens = text.split()
                return ":" in text or (len(tokens) == 1 and _is_number(tokens[0]))
    except _READ_ERRORS as exc:
        raise _reword_read_error(path, exc, "svmlight or CSV") from None
    return True


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_non_finite(values: np.ndarray) -> int:
    """Index of the first NaN/inf in a 1-d float array, or -1."""
    bad = np.flatnonzero(~np.isfinite(values))
    return int(bad[0]) if len(bad) else -1


def _check_finite_dense(path: str, X: np.ndarray, row_lines=None) -> None:
    if X.size and not np.isfinite(X).all():
        r, c = np.argwhere(~np.isfinite(X))[0]
        where = f"line {row_lines[r]}" if row_lines is not None else f"row {r + 1}"
        raise ValueError(f"{path}: {where}, feature column {c + 1} is {X[r, c]} (NaN and infinity are not allowed)")


def _labels_array(path: str, raw, row_lines=None) -> np.ndarray:
    """Labels as float64 when they are all numbers, else as strings (a warning when some differ in spelling only)."""
    try:
        y = np.asarray(raw, dtype=np.float64)
    except ValueError:
        y = np.asarray(raw, dtype=str)
        _warn_spelling(path, np.unique(y))
        return y
    i = _first_non_finite(y)
    if i >= 0:
        where = f"line {row_lines[i]}" if row_lines is not None else f"row {i + 1}"
        raise ValueError(f"{path}: {where} has label {y[i]} (labels must be finite)")
    return y


def _warn_spelling(path: str, classes) -> None:
    """Warn when text labels spell one number (``1``, ``+1``, ``1.0``) or one word in two cases: distinct classes."""
    groups: dict = {}
    for label in classes:
        text = str(label).strip()
        try:
            key = float(text)
        except (ValueError, OverflowError):
            key = text.casefold()
        groups.setdefault(key, []).append(str(label))
    alike = next((names for names in groups.values() if len(names) > 1), None)
    if alike is not None:
        shown = ", ".join(repr(name) for name in alike[:5])
        warnings.warn(
            f"{path}: labels {shown} differ only in spelling but count as {len(alike)} different classes "
            "(the labels are read as text because not all of them are numbers); write each class one way",
            UserWarning,
            stacklevel=4,
        )


def _split_labels(path: str, n_columns: int, n_features, labels) -> bool:
    """Whether the last of ``n_columns`` columns is the label; checks the feature count."""
    if labels == "auto" and n_columns == n_features:
        return False
    if n_columns < 2:
        raise ValueError(f"{path}: needs at least one feature column and a label column, found {n_columns} column(s)")
    if n_features is not None and n_columns - 1 != n_features:
        extra = " (or that many columns without labels)" if labels == "auto" else ""
        raise ValueError(
            f"{path}: {n_columns - 1} feature columns plus a label column, but {n_features} features "
            f"are expected{extra}"
        )
    return True


# ----------------------------------------------------------------------------- svmlight


#: A file may use feature indices up to ``max(MAX_FEATURES_FLOOR, FEATURES_PER_VALUE * stored values)``: the
#: per-feature arrays of a fit (scaling, the data's scale) grow with the largest index, not with the file.
MAX_FEATURES_FLOOR = 2**24
FEATURES_PER_VALUE = 16
_BOM = codecs.BOM_UTF8


class OneBasedAssumedWarning(UserWarning):
    """An svmlight file read as one-based because ``zero_based="auto"`` found no feature index 0.

    Said once per read: a zero-based file that never uses feature 0 (scikit-learn's ``dump_svmlight_file``
    writes zero-based files; the digits' first pixel is always 0) reads as one-based, one feature short and
    shifted by one, and nothing else would tell.
    """


def _load_svmlight(path: str, n_features, zero_based):
    """``(X, y, zero_based)``: the rows, the labels and the index convention the file was read with."""
    from sklearn.datasets import load_svmlight_file

    try:
        with _open_bytes(path) as fh:
            if fh.read(len(_BOM)) != _BOM:  # a byte order mark (some editors write one) is not part of the label
                fh.seek(0)
            # Raw indices: the convention is resolved below, where it is known which one was used.
            X, y = load_svmlight_file(fh, dtype=np.float64, zero_based=True)
    except (ValueError, OverflowError) as exc:
        located = _locate_svmlight_error(path)
        raise ValueError(located if located is not None else f"{path}: {exc}") from None
    except _READ_ERRORS as exc:
        raise _reword_read_error(path, exc, "svmlight") from None
    X = sp.csr_matrix(X)
    if zero_based == "auto":  # scikit-learn's rule: one-based unless index 0 occurs
        zero_based = X.nnz == 0 or int(X.indices.min()) == 0
        if not zero_based:
            warnings.warn(
                f"{path}: feature indices read as one-based (LIBSVM's convention) because no index 0 occurs; "
                "if the file counts from 0 (as scikit-learn's dump_svmlight_file writes), read it with "
                "zero_based=True (--zero-based yes)",
                OneBasedAssumedWarning,
                stacklevel=4,
            )
    elif zero_based not in (True, False):
        raise ValueError(f"zero_based must be True, False or 'auto', got {zero_based!r}")
    if not zero_based:
        if X.nnz and int(X.indices.min()) == 0:
            row = int(np.searchsorted(X.indptr, int(np.argmin(X.indices)), side="right")) - 1
            raise ValueError(
                f"{path}: {_svmlight_row_line(path, row)} uses feature index 0, but the file is read as one-based "
                "(LIBSVM counts from 1); read it as zero-based (--zero-based yes)"
            )
        X = sp.csr_matrix((X.data, X.indices - 1, X.indptr), shape=(X.shape[0], max(X.shape[1] - 1, 0)))
    width = X.shape[1]
    limit = max(MAX_FEATURES_FLOOR, FEATURES_PER_VALUE * X.nnz)
    if n_features is not None and width > n_features:
        raise ValueError(
            f"{path}: the file uses {width} features but {n_features} are expected "
            "(the model was trained on fewer features)"
        )
    if n_features is None and width > limit:
        row = int(np.searchsorted(X.indptr, int(np.argmax(X.indices)), side="right")) - 1
        raise ValueError(
            f"{path}: {_svmlight_row_line(path, row)} uses feature index {int(X.indices.max()) + (not zero_based)}, "
            f"far beyond its {X.nnz} stored values (at most {limit} features are read): a typo?"
        )
    if n_features is not None and width < n_features:  # a test file need not mention the last features
        X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], n_features))
    i = _first_non_finite(X.data)
    if i >= 0:
        row = int(np.searchsorted(X.indptr, i, side="right")) - 1
        raise ValueError(
            f"{path}: {_svmlight_row_line(path, row)} has a feature value {X.data[i]} "
            "(NaN and infinity are not allowed)"
        )
    i = _first_non_finite(y)
    if i >= 0:
        raise ValueError(f"{path}: {_svmlight_row_line(path, i)} has label {y[i]} (labels must be finite)")
    return X, y, bool(zero_based)


def _svmlight_row_line(path: str, row: int) -> str:
    """``"line L"`` of the ``row``-th data row (0-based), counting comments and blank lines."""
    try:
        with _open_text(path) as fh:
            for k, (number, _) in enumerate(_data_lines(fh)):
                if k == row:
                    return f"line {number}"
    except _READ_ERRORS:
        pass
    return f"data row {row + 1}"


def _locate_svmlight_error(path: str) -> str | None:
    """``"PATH: line N: ..."``, the first malformed line of an svmlight file described (error path only: slow)."""
    located = _not_text(path, "svmlight")
    if located is not None:  # binary data (a model, a compressed file without its ending): say so, not what it holds
        return located
    try:
        with _open_text(path) as fh:
            for number, text in _data_lines(fh):
                tokens = text.split("#", 1)[0].split()
                if not tokens:
                    continue
                problem = _svmlight_line_problem(tokens)
                if problem is not None:
                    return f"{path}: line {number}: {problem}"
    except (UnicodeDecodeError, EOFError, OSError):
        return None
    return None


#: Largest feature index an svmlight file may write (scikit-learn's reader keeps indices as 64-bit integers).
_MAX_INDEX = 2**62


def _svmlight_line_problem(tokens) -> str | None:
    if not _is_number(tokens[0]):
        return f"label {tokens[0]!r} is not a number (is this a text svmlight file?)"
    previous = -1
    for tok in tokens[1:]:
        key, sep, value = tok.partition(":")
        if not sep:
            return f"{tok!r} is not an 'index:value' pair (is this an svmlight file?)"
        if key == "qid":
            continue
        if not (key.isascii() and key.isdigit()):
            return f"feature index {key!r} is not a non-negative integer"
        if len(key) > 19 or int(key) > _MAX_INDEX:
            return f"feature index {key} is too large"
        if not _is_number(value):
            return f"value {value!r} of feature {key} is not a number"
        if int(key) <= previous:
            what = "repeated" if int(key) == previous else "not in increasing order"
            return f"feature index {key} is {what} (indices of a line must increase)"
        previous = int(key)
    return None


# ----------------------------------------------------------------------------- CSV


def _load_delimited(path: str, delimiter, n_features, labels):
    rows, lines = [], []
    try:
        with _open_text(path) as fh:
            if delimiter is None:
                delimiter = _sniff_delimiter(path)
            reader = csv.reader(fh, delimiter=delimiter) if delimiter != " " else None
            source = reader if reader is not None else (line.split() for line in fh)
            for k, row in enumerate(source, start=1):
                number = reader.line_num if reader is not None else k
                cells = [c.strip() for c in row]
                if not any(cells) or cells[0].startswith("#"):
                    continue
                rows.append(cells)
                lines.append(number)
    except csv.Error as exc:
        raise ValueError(_not_text(path, "CSV") or f"{path}: malformed CSV ({exc})") from None
    except _READ_ERRORS as exc:
        raise _reword_read_error(path, exc, "CSV") from None
    if not rows:
        raise ValueError(f"{path}: the file holds no data rows")
    # A header: no feature cell of the first row is a number (a mix is a data row with a typo).
    if not any(_is_number(c) for c in rows[0][:-1]) and len(rows[0]) > 1:
        rows, lines = rows[1:], lines[1:]
        if not rows:
            raise ValueError(f"{path}: the file holds a header but no data rows")
    width = len(rows[0])
    for cells, number in zip(rows, lines):
        if len(cells) != width:
            raise ValueError(f"{path}: line {number} has {len(cells)} columns, the first data row has {width}")
    has_labels = _split_labels(path, width, n_features, labels)
    n_feat = width - 1 if has_labels else width
    try:
        X = np.array([cells[:n_feat] for cells in rows], dtype=np.float64)
    except ValueError:
        for cells, number in zip(rows, lines):
            for c, cell in enumerate(cells[:n_feat]):
                if not _is_number(cell):
                    what = "an empty cell" if cell == "" else f"{cell!r}, not a number"
                    raise ValueError(f"{path}: line {number}, column {c + 1} holds {what}") from None
        raise
    _check_finite_dense(path, X, lines)
    y = _labels_array(path, [cells[-1] for cells in rows], lines) if has_labels else None
    if y is not None and y.dtype.kind == "U" and any(c == "" for c in y):
        i = next(i for i, c in enumerate(y) if c == "")
        raise ValueError(f"{path}: line {lines[i]} has an empty label")
    return X, y


def _sniff_delimiter(path: str) -> str:
    """Comma, semicolon, tab or whitespace, from the first data line."""
    with _open_text(path) as fh:
        for _, text in _data_lines(fh):
            for d in (",", ";", "\t"):
                if d in text:
                    return d
            return " "
    return ","


# ----------------------------------------------------------------------------- NumPy


#: Longest ``.npy`` header read (NumPy's own limit for a header it parses is 10,000 characters).
_MAX_NPY_HEADER = 65536


def read_npy_header(fh, size: int, what: str):
    """``(shape, dtype)`` from the ``.npy`` header at ``fh``'s position, checked against the ``size`` bytes it has.

    The declared array must fill exactly what follows the header and hold no Python objects: an
    array is allocated only for what the file really holds.  Raises ``ValueError`` (``what``: the
    file or member, for the message).
    """
    start = fh.tell()
    # NumPy reads as many header bytes as the header's length field says before it checks them: check it first.
    lead = fh.read(10)
    if len(lead) < 10 or lead[:6] != b"\x93NUMPY" or lead[6] not in (1, 2, 3) or lead[7] != 0:
        raise ValueError(f"{what}: not a valid NumPy array (no .npy header of a version this NumPy reads)")
    width = 2 if lead[6] == 1 else 4
    header_length = int.from_bytes(lead[8 : 8 + width] if width == 2 else lead[8:10] + fh.read(2), "little")
    if header_length > min(_MAX_NPY_HEADER, size - 8 - width):
        raise ValueError(f"{what}: not a valid NumPy array (a header of {header_length} bytes)")
    fh.seek(start)
    try:
        version = np.lib.format.read_magic(fh)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = header(fh)
        dtype = np.dtype(dtype)
    except Exception as exc:  # the header is a Python literal: parsing hostile text raises many kinds of error
        raise ValueError(f"{what}: not a valid NumPy array ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject:
        raise ValueError(f"{what}: holds Python objects, not a numeric array")
    declared = math.prod(shape) * dtype.itemsize
    available = size - (fh.tell() - start)
    if declared != available:
        raise ValueError(
            f"{what}: its header declares shape {shape} of {dtype} ({declared} bytes), but {available} bytes follow "
            "(truncated, padded or damaged)"
        )
    return tuple(shape), dtype


def _read_npy(fh, size: int, what: str) -> np.ndarray:
    """The array at ``fh`` (``size`` bytes), its header checked first (:func:`read_npy_header`)."""
    start = fh.tell()
    read_npy_header(fh, size, what)
    fh.seek(start)
    try:
        return np.lib.format.read_array(fh, allow_pickle=False)
    except Exception as exc:  # what reading hostile array bytes raises: EOFError, zlib.error, BadZipFile, ...
        raise ValueError(f"{what}: not a valid NumPy array ({type(exc).__name__}: {exc})") from None


def _load_npy(path: str, n_features, labels):
    with open(path, "rb") as fh:
        if fh.read(6) != b"\x93NUMPY":
            raise ValueError(f"{path}: not a .npy file (no NumPy header)")
        fh.seek(0)
        A = _read_npy(fh, os.fstat(fh.fileno()).st_size, path)
    if A.ndim != 2:
        raise ValueError(f"{path}: expected a 2-d array (rows = points, last column = label), got shape {A.shape}")
    if A.dtype.kind not in "biuf":
        raise ValueError(f"{path}: expected a numeric array, got dtype {A.dtype}")
    if A.shape[0] == 0:
        raise ValueError(f"{path}: the file holds no data rows")
    has_labels = _split_labels(path, A.shape[1], n_features, labels)
    X = np.array(A[:, :-1] if has_labels else A, dtype=np.float64)
    _check_finite_dense(path, X)
    if not has_labels:
        return X, None
    y = A[:, -1]
    if y.dtype.kind == "f":
        y = _labels_array(path, y)
    return X, y


def _load_npz(path: str, n_features):
    try:
        with zipfile.ZipFile(path) as zf:
            members = {info.filename: info for info in zf.infolist()}
            if not {"X.npy", "y.npy"} <= set(members):
                found = sorted(name.removesuffix(".npy") for name in members)
                raise ValueError(f"{path}: expected arrays 'X' and 'y' in the .npz file, found {found}")
            arrays = []
            for name in ("X.npy", "y.npy"):
                with zf.open(members[name]) as fh:
                    arrays.append(_read_npy(fh, members[name].file_size, f"{path}: member {name}"))
    except ValueError:
        raise
    except Exception as exc:  # BadZipFile, zlib.error, EOFError, NotImplementedError (a zip version), ...
        raise ValueError(f"{path}: not a valid .npz file ({type(exc).__name__}: {exc})") from None
    X, y = arrays
    if X.ndim != 2 or X.dtype.kind not in "biuf":
        raise ValueError(f"{path}: 'X' must be a 2-d numeric array, got shape {X.shape} and dtype {X.dtype}")
    if y.ndim != 1 or len(y) != X.shape[0]:
        raise ValueError(f"{path}: 'y' must be 1-d with one label per row of 'X' ({X.shape[0]}), got shape {y.shape}")
    if y.dtype.kind not in "biufU":
        raise ValueError(f"{path}: 'y' must hold numbers or strings, got dtype {y.dtype}")
    if X.shape[0] and n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{path}: 'X' has {X.shape[1]} features, but {n_features} are expected")
    X = np.asarray(X, dtype=np.float64)
    _check_finite_dense(path, X)
    if y.dtype.kind == "f":
        y = _labels_array(path, y)
    return X, y


def format_label(value) -> str:
    """A label as text: integral floats without the ``.0`` (svmlight labels are floats)."""
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return str(value)

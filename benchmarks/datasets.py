"""The benchmark data sets: load, verify, download once, split and scale.

Where the data come from, in order:

1. ``datasets_dir`` (default: ``../shared/datasets`` beside the repository,
   when it exists): the gzipped svmlight files named in ``MANIFEST.json``,
   each checked against the manifest's file ``sha256``.
2. The download cache (``$MWUMKL_DIST_CACHE``, else ``~/.cache/mwumkl_dist``):
   files fetched once (with pooch) from the public LIBSVM / UCI addresses in
   ``benchmarks/MANIFEST.json``, parsed, checked against the manifest's
   ``data_sha256`` (a checksum of the parsed values, see :func:`data_sha256`)
   and stored as ``.npz``.  Every later load checks the same checksum again.
3. ``wdbc`` ships with scikit-learn (``load_breast_cancer``).

Three small sets (breast_cancer, ionosphere, sonar) in the shared folder were
converted from Debian's ``r-cran-mlbench`` R data files; the download path
converts the UCI originals instead (``format: "csv"`` in the manifest: label
column, dropped columns, missing-value marker).  The values are the same
data, but the R files store some of them with a last-bit difference
(``0.8339800000000001`` for UCI's ``0.83398``), so the gzip files cannot match
byte for byte: that is why the download path checks ``data_sha256``, a hash
of the values rounded to 1e-6 (every file has at most 6 decimals), which
both sources should give.  These machines have no internet, so the download
of the real files was not run here: if the UCI or LIBSVM file differs from
the data the benchmarks were measured on, the load fails with
:class:`ChecksumError` naming the file, the expected and the actual checksum,
rather than running on different data.

Quick mode (:func:`load_or_standin`) never downloads: a data set that is not
on disk is replaced by a *synthetic stand-in* of the same shape class,
clearly named ``"<name> (synthetic stand-in)"``, so the quick run and its test
work on a fresh clone.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

__all__ = [
    "Dataset",
    "ChecksumError",
    "DatasetUnavailableError",
    "SMALL_SETS",
    "ALL_SETS",
    "default_datasets_dir",
    "cache_dir",
    "load_manifest",
    "load_dataset",
    "load_or_standin",
    "fetch",
    "data_sha256",
    "file_sha256",
    "synthetic_standin",
    "scale_split",
    "random_splits",
]

HERE = Path(__file__).resolve().parent
#: The manifest shipped with the benchmarks (the shared folder's, plus source addresses).
MANIFEST_PATH = HERE / "MANIFEST.json"
#: The paper's small sets (WDBC comes from scikit-learn).
SMALL_SETS = ("breast_cancer", "heart", "ionosphere", "sonar", "wdbc")
ALL_SETS = (*SMALL_SETS, "mushrooms", "a9a", "cod-rna")
#: Rounding unit of :func:`data_sha256` (every data file has at most 6 decimals).
_QUANTUM = 1e6


class ChecksumError(ValueError):
    """A data file, or the values parsed from it, do not match the manifest's checksum."""


class DatasetUnavailableError(RuntimeError):
    """A data set is neither on disk nor downloadable."""


@dataclass
class Dataset:
    """A binary data set with labels in {-1, +1}.

    ``X_test``/``y_test`` hold the separate test file when the data set has
    one (a9a, cod-rna); ``source`` says where the data came from
    (``"shared"``, ``"cache"``, ``"sklearn"`` or ``"synthetic"``).
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    source: str = "shared"
    note: str = ""
    info: dict = field(default_factory=dict)

    @property
    def synthetic(self) -> bool:
        return self.source == "synthetic"

    @property
    def label(self) -> str:
        """The name shown in tables and figures (marks synthetic stand-ins)."""
        return f"{self.name} (synthetic stand-in)" if self.synthetic else self.name

    def combined(self) -> tuple[np.ndarray, np.ndarray]:
        """Training and test files together (the paper splits Adult and CodRna 80/20 itself)."""
        if self.X_test is None:
            return self.X, self.y
        return np.vstack([self.X, self.X_test]), np.concatenate([self.y, self.y_test])


# ----------------------------------------------------------------------------- locations


def default_datasets_dir() -> Path | None:
    """``../shared/datasets`` beside the repository, when it exists."""
    candidate = HERE.parent.parent / "shared" / "datasets"
    return candidate if (candidate / "MANIFEST.json").is_file() else None


def cache_dir() -> Path:
    """Where downloads go: ``$MWUMKL_DIST_CACHE`` or ``~/.cache/mwumkl_dist``."""
    env = os.environ.get("MWUMKL_DIST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mwumkl_dist"


def load_manifest(path=None) -> dict:
    """The manifest (default: ``benchmarks/MANIFEST.json``)."""
    path = MANIFEST_PATH if path is None else Path(path)
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


# ----------------------------------------------------------------------------- checksums


def file_sha256(path) -> str:
    """sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def data_sha256(X, y) -> str:
    """sha256 of the parsed values: shape, labels and features rounded to 1e-6.

    Independent of the file's formatting (gzip header, line ends, zero
    entries written or omitted, ``0.0986`` versus ``0.09859999999999999``).
    """
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    h = hashlib.sha256(f"{X.shape[0]},{X.shape[1]};".encode())
    h.update(np.rint(y).astype("<i8").tobytes())
    h.update(np.rint(X * _QUANTUM).astype("<i8").tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- parsing


def _decompress(raw: bytes) -> bytes:
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    if raw[:3] == b"BZh":
        return bz2.decompress(raw)
    if raw[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(raw)
    return raw


def _parse_svmlight(text: bytes, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(io.BytesIO(text), n_features=n_features, zero_based=False)
    return X.toarray(), y


def _parse_csv(text: bytes, fmt: dict, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """A UCI-style CSV: ``label_column``, ``drop_columns``, ``labels`` map, ``missing`` marker."""
    missing = fmt.get("missing")
    label_col = int(fmt.get("label_column", -1))
    drop = {int(c) for c in fmt.get("drop_columns", [])}
    label_map = {str(k): float(v) for k, v in fmt["labels"].items()}
    rows, labels = [], []
    for lineno, line in enumerate(text.decode("utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if missing is not None and missing in cells:
            continue  # the shared files drop rows with missing values too
        lc = label_col % len(cells)
        if cells[lc] not in label_map:
            raise ValueError(f"line {lineno}: unknown label {cells[lc]!r} (expected one of {sorted(label_map)})")
        labels.append(label_map[cells[lc]])
        try:
            rows.append([float(c) for i, c in enumerate(cells) if i != lc and i not in drop])
        except ValueError as exc:
            raise ValueError(f"line {lineno}: {exc}") from None
    X = np.asarray(rows, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != n_features:
        raise ValueError(f"expected {n_features} features per row, got shape {X.shape}")
    return X, np.asarray(labels)


def _parse(raw: bytes, entry: dict) -> tuple[np.ndarray, np.ndarray]:
    text = _decompress(raw)
    fmt = entry.get("source", {}).get("format", {"type": "svmlight"})
    if fmt.get("type", "svmlight") == "svmlight":
        return _parse_svmlight(text, entry["n_features"])
    if fmt["type"] == "csv":
        return _parse_csv(text, fmt, entry["n_features"])
    raise ValueError(f"unknown source format {fmt['type']!r} for {entry['file']}")


# ----------------------------------------------------------------------------- loading


def _entry(manifest: dict, name: str) -> dict:
    if name not in manifest:
        raise ValueError(f"unknown data set {name!r}; the manifest lists {', '.join(sorted(manifest))}")
    return manifest[name]


def _load_file(directory: Path, entry: dict) -> tuple[np.ndarray, np.ndarray]:
    path = directory / entry["file"]
    got = file_sha256(path)
    if got != entry["sha256"]:
        raise ChecksumError(
            f"{path}: sha256 {got} does not match the manifest's {entry['sha256']}; "
            "the file is damaged or not the one the benchmarks were measured on"
        )
    with open(path, "rb") as fh:
        X, y = _parse(fh.read(), {**entry, "source": {}})
    return X, y


def _cached_path(cache: Path, entry: dict) -> Path:
    return cache / (entry["file"].split(".svm")[0] + ".npz")


def _load_cached(cache: Path, entry: dict) -> tuple[np.ndarray, np.ndarray] | None:
    path = _cached_path(cache, entry)
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        X, y = data["X"], data["y"]
    got = data_sha256(X, y)
    if got != entry["data_sha256"]:
        raise ChecksumError(
            f"{path}: cached data checksum {got} does not match the manifest's {entry['data_sha256']}; "
            "delete the file to download it again"
        )
    return X, y


def _download(url: str, entry: dict, cache: Path, timeout: float) -> Path:
    """The file at ``url``, fetched once with pooch into ``cache / "downloads"`` (kept until verified)."""
    import pooch
    import requests

    pooch.get_logger().setLevel("WARNING")  # no "Downloading ..." / "SHA256 of ..." notes on every fetch
    name = os.path.basename(urllib.parse.urlparse(url).path) or entry["file"]
    downloader = pooch.HTTPDownloader(timeout=timeout, progressbar=sys.stderr.isatty())
    try:
        # No known_hash: the values are checked after parsing (data_sha256), not the file's bytes.
        return Path(pooch.retrieve(url, known_hash=None, fname=name, path=cache / "downloads", downloader=downloader))
    except (requests.exceptions.RequestException, OSError) as exc:
        raise DatasetUnavailableError(f"cannot download {entry['file']} from {url}: {exc}") from None


def fetch(entry: dict, cache: Path, timeout: float = 60.0) -> tuple[np.ndarray, np.ndarray]:
    """Download one manifest file, verify its values and store them in ``cache``.

    The download goes through pooch (``cache / "downloads"``); the parsed values
    are stored as ``.npz`` once they match the manifest's ``data_sha256``, and the
    raw download is removed either way (a download that fails verification is
    fetched again next time, never reused).

    Raises :class:`ChecksumError` when the parsed values do not match the
    manifest's ``data_sha256`` (nothing is stored then) and
    :class:`DatasetUnavailableError` when the address cannot be read.
    """
    url = entry.get("source", {}).get("url")
    if not url:
        raise DatasetUnavailableError(f"{entry['file']}: the manifest gives no download address")
    raw_path = _download(url, entry, cache, timeout)
    try:
        raw = raw_path.read_bytes()
    finally:
        raw_path.unlink(missing_ok=True)
    try:
        X, y = _parse(raw, entry)
    except ValueError as exc:
        raise ChecksumError(f"{url}: cannot parse the download as {entry['file']}: {exc}") from None
    got = data_sha256(X, y)
    if got != entry["data_sha256"]:
        raise ChecksumError(
            f"{url}: the downloaded data do not match the manifest (data_sha256 {got}, expected "
            f"{entry['data_sha256']}; {X.shape[0]} rows x {X.shape[1]} features, expected "
            f"{entry['n_samples']} x {entry['n_features']}). The source differs from the file the "
            "benchmarks were measured on; nothing was stored. Get the file from the shared data "
            "folder and pass --datasets-dir."
        )
    cache.mkdir(parents=True, exist_ok=True)
    target = _cached_path(cache, entry)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, X=X, y=y)
        shutil.move(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return X, y


def _to_pm(y: np.ndarray, classes) -> np.ndarray:
    """Labels as -1/+1: the manifest's larger class value is +1 (mushrooms: 2 -> +1)."""
    values = sorted(float(c) for c in classes)
    if len(values) != 2:
        raise ValueError(f"expected two classes, the manifest lists {values}")
    return np.where(np.asarray(y, dtype=np.float64) == values[1], 1.0, -1.0)


def _load_wdbc() -> Dataset:
    from sklearn.datasets import load_breast_cancer

    X, t = load_breast_cancer(return_X_y=True)
    # scikit-learn codes malignant as 0: malignant = +1, as for breast_cancer.
    return Dataset(
        "wdbc",
        X.astype(np.float64),
        np.where(t == 0, 1.0, -1.0),
        source="sklearn",
        note="UCI WDBC, bundled with scikit-learn (load_breast_cancer); malignant=+1",
    )


def load_dataset(name: str, datasets_dir=None, *, download: bool = True, manifest=None, cache=None) -> Dataset:
    """Load a benchmark data set by name, verified against the manifest.

    Parameters
    ----------
    name : str
        One of :data:`ALL_SETS` (or a name in ``manifest``).
    datasets_dir : path or None
        Folder with the manifest's gzipped svmlight files; None uses
        :func:`default_datasets_dir` when it exists.
    download : bool, default=True
        Fetch a missing data set from the manifest's source address into ``cache``.
    manifest : dict or None
        Defaults to ``benchmarks/MANIFEST.json``.
    cache : path or None
        Defaults to :func:`cache_dir`.

    Raises
    ------
    ChecksumError
        A file or download does not match the manifest.
    DatasetUnavailableError
        Not on disk and not downloadable (``download=False`` or no network).
    """
    if name == "wdbc":
        return _load_wdbc()
    manifest = load_manifest() if manifest is None else manifest
    spec = _entry(manifest, name)
    directory = Path(datasets_dir) if datasets_dir is not None else default_datasets_dir()
    cache = cache_dir() if cache is None else Path(cache)
    parts, source = [], None
    for entry in spec["files"]:
        if directory is not None and (directory / entry["file"]).is_file():
            parts.append(_load_file(directory, entry))
            source = source or "shared"
            continue
        cached = _load_cached(cache, entry)
        if cached is None:
            if not download:
                where = f"{directory}" if directory is not None else "no datasets folder"
                raise DatasetUnavailableError(
                    f"{name}: {entry['file']} is not in {where} nor in the cache {cache}, and downloading is off"
                )
            cached = fetch(entry, cache)
        parts.append(cached)
        source = "cache" if source in (None, "cache") else source
    classes = spec["files"][0]["classes"].keys()
    X, y = parts[0][0], _to_pm(parts[0][1], classes)
    X_test = y_test = None
    if len(parts) > 1:
        X_test, y_test = parts[1][0], _to_pm(parts[1][1], classes)
    return Dataset(name, X, y, X_test, y_test, source=source, note=spec.get("note", ""))


# ----------------------------------------------------------------------------- stand-ins


#: Shapes of the synthetic stand-ins: (n_samples, n_features, binary features, class weights, label noise).
_STANDINS = {
    "breast_cancer": (683, 9, False, (0.65, 0.35), 0.02),
    "heart": (270, 13, False, (0.55, 0.45), 0.10),
    "ionosphere": (351, 33, False, (0.36, 0.64), 0.04),
    "sonar": (208, 60, False, (0.47, 0.53), 0.08),
    "mushrooms": (8124, 112, True, (0.48, 0.52), 0.0),
    "a9a": (48842, 123, True, (0.76, 0.24), 0.08),
    "cod-rna": (59535, 8, False, (0.67, 0.33), 0.03),
}


def synthetic_standin(name: str, seed: int = 0, n_samples: int | None = None) -> Dataset:
    """A generated data set shaped like ``name`` (for quick runs without the real files).

    Non-linear (scikit-learn's ``make_classification`` clusters), with the
    real set's feature count, class balance and, for a9a and mushrooms,
    binary features.
    """
    from sklearn.datasets import make_classification

    if name not in _STANDINS:
        raise ValueError(f"no synthetic stand-in for {name!r}; known: {', '.join(sorted(_STANDINS))}")
    n, d, binary, weights, noise = _STANDINS[name]
    n = n if n_samples is None else int(n_samples)
    informative = max(2, min(d // 3, 8))
    X, t = make_classification(
        n_samples=n,
        n_features=d,
        n_informative=informative,
        n_redundant=min(2, d - informative),
        n_clusters_per_class=2,
        shuffle=False,  # informative features first: quick runs use the first few
        weights=list(weights),
        flip_y=noise,
        class_sep=1.0,
        random_state=seed,
    )
    if binary:
        X = (X > 0).astype(np.float64)
    return Dataset(
        name,
        X,
        np.where(t == 1, 1.0, -1.0),
        source="synthetic",
        note="synthetic stand-in (make_classification): the real file was not available",
    )


def load_or_standin(name: str, datasets_dir=None, *, allow_standin: bool, download: bool = True) -> Dataset:
    """:func:`load_dataset`, or with ``allow_standin`` a synthetic stand-in when the data are unavailable."""
    try:
        return load_dataset(name, datasets_dir, download=download and not allow_standin)
    except DatasetUnavailableError:
        if not allow_standin:
            raise
        return synthetic_standin(name)


# ----------------------------------------------------------------------------- splits


def scale_split(X_train, X_test):
    """Scale features to [0, 1] with a MinMaxScaler fit on the training part only."""
    from sklearn.preprocessing import MinMaxScaler

    scaler = MinMaxScaler().fit(X_train)
    return scaler.transform(X_train), scaler.transform(X_test)


def random_splits(y, n_splits: int, test_size: float = 0.2, seed: int = 0):
    """``n_splits`` stratified random train/test index pairs (the same for every method)."""
    from sklearn.model_selection import StratifiedShuffleSplit

    sss = StratifiedShuffleSplit(n_splits=n_splits, test_size=test_size, random_state=seed)
    return list(sss.split(np.zeros(len(y)), y))

"""The Zarr store format: writing, opening, validating and reading data and kernel stores.

A store is a Zarr (format 3) group in a local directory; its metadata sits in
the group attributes under ``"mwumkl_dist"``.  A store is written in a hidden
temporary directory next to its path, its metadata last, and renamed to its
path only when complete (:func:`mwumkl_dist.io.atomic.atomic_directory`): a
write that fails (a full disk, Ctrl-C) leaves no store, or the older store it
was to replace, and a store without the metadata is rejected by :func:`open_store`.

**Data store** (``mwumkl-dist store data``, :func:`write_data_store`)::

    X        (n, d)   float64  chunks (R, d)    dense features, or CSR rows:
    indptr   (n + 1,) int64    chunks (R,)
    indices  (nnz,)   int32    chunks (~R rows' worth of non-zeros)
    data     (nnz,)   float64  same chunks as indices
    y        (n,)     int32    chunks (R,)      class codes into the metadata's ``classes``

**Kernel store** (``mwumkl-dist store kernels``, :func:`write_kernel_store`)::

    K        (m, n, n) float64 chunks (mc, 1, R)   K[i, j, r] = K_i(x_r, x_j): column j of kernel i
    diag     (m, n)    float64 chunks (mc, R)      K_i(x_j, x_j)
    y        (n,)      int32   chunks (R,)

A superstep needs two columns ``K_i[rows, j]`` of every kernel for the rows of
a shard.  Stored as ``K[:, j, rows]`` (for a symmetric kernel that is simply
row ``j``), the columns of one shard are exactly one chunk each when row
shards follow the ``R``-row chunks, which :meth:`DataStore.row_ranges` and
:meth:`KernelStore.row_ranges` arrange.  Shards read them through a bounded
LRU column cache (:class:`mwumkl_dist.stores.ColumnCache`); a fit reports the
hit rate as ``MWUMKLClassifier.cache_info_``.

Integrity: every chunk carries a CRC-32C checksum and missing chunks read as
NaN (or -1); opening a store checks its metadata, array shapes, label codes,
that every chunk file exists and (uncompressed kernel chunks) has the right
size, and every read checks what it got.  Each problem raises
:class:`StoreError` (a ``ValueError``) naming the store and the problem.

.. _chunk-identity:

Chunk identity (store format 2): a checksum only says a chunk is intact, not
that it is the chunk of its place.  Each store gets a random id (``store_id``
in the metadata) and each array a table ``ARRAY/chunk_digests.npy`` of one
64-bit record per chunk: a BLAKE2b hash keyed by the store id over the chunk's
key (array name and chunk position) and its CRC-32C (its content).  The
metadata holds each table's SHA-256 (``chunk_digests``), checked on open.
Every chunk read is checked against the record of its position, so a chunk
file moved, swapped with another or copied from another store (even of the
same shape) raises a :class:`StoreError` naming the array, the chunk and the
store; :meth:`DataStore.verify_chunks` (``mwumkl-dist store info``) checks
every chunk.  Stores of format 1 (written before) are still read, without
these checks (a warning says so; re-create them to have the checks).

The problems that fit from a store live in :mod:`mwumkl_dist.data.store_problems`.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import hashlib
import json
import math
import os
import re
import stat
import threading
import time
import uuid
import warnings

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.core.exact import exact_column_sums, exact_to_float
from mwumkl_dist.core.partition import aligned_ranges, chain_safe_ranges
from mwumkl_dist.core.version import __version__
from mwumkl_dist.io.atomic import atomic_directory, exclusive_writer
from mwumkl_dist.kernels.evaluation import as_csr, data_scale, kernel_column_block, row_group_sqnorms
from mwumkl_dist.kernels.feature_scale import apply_feature_scale
from mwumkl_dist.kernels.specs import KernelSet

__all__ = [
    "StoreError",
    "DataStore",
    "KernelStore",
    "open_store",
    "open_data_store",
    "open_kernel_store",
    "write_data_store",
    "write_kernel_store",
    "as_store",
    "DEFAULT_CACHE_BYTES",
    "DATA_FORMAT",
    "KERNEL_FORMAT",
    "STORE_VERSION",
]

DATA_FORMAT = "mwumkl_dist-data"
KERNEL_FORMAT = "mwumkl_dist-kernels"
#: Store layout version this package writes.  Version 2 added the store id and the per-chunk
#: identity records (:ref:`chunk identity <chunk-identity>` in the module docstring).
STORE_VERSION = 3
#: Versions this package reads: a version 1 store without the chunk identity checks, a version 2 store
#: with its weaker ones (a CRC-32C bound to the position); both without the metadata's integrity record.
READABLE_VERSIONS = (1, 2, 3)
#: Bytes of a format 3 chunk record (a keyed BLAKE2b of the chunk's whole stored bytes).
_RECORD_BYTES = 16
#: Each array's chunk identity records: ``ARRAY/chunk_digests.npy`` in the store.
_DIGESTS_FILE = "chunk_digests.npy"
_ATTR = "mwumkl_dist"
_KINDS = {DATA_FORMAT: "a data store", KERNEL_FORMAT: "a kernel store"}
#: Default column cache of a kernel-store shard.
DEFAULT_CACHE_BYTES = 256 * 2**20
#: Memory a writer uses for one block of kernel columns.
_WRITE_BLOCK_BYTES = 64 * 2**20


class StoreError(ValueError):
    """A store that cannot be used; the message names the store and the problem."""


# ----------------------------------------------------------------------------- labels


def _encode_labels(y) -> tuple[np.ndarray, list, str]:
    """Class codes (int32), the classes as JSON values, and the label dtype to restore them."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-d, got shape {y.shape}")
    if y.dtype.kind in "biuf":
        if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
            raise ValueError("labels contain NaN or infinity")
        classes = np.unique(y)
        kind = y.dtype.str
        values = classes.tolist()
    elif y.dtype.kind in "UO":
        ys = y.astype(str)
        classes = np.unique(ys)
        kind = "str"
        values = classes.tolist()
        y = ys
    else:
        raise ValueError(f"labels must be numbers or strings, got dtype {y.dtype}")
    codes = np.searchsorted(classes, y).astype(np.int32)
    return codes, values, kind


def _decode_classes(values: list, kind: str) -> np.ndarray:
    if kind == "str":
        return np.asarray(values, dtype=str)
    return np.asarray(values, dtype=np.dtype(kind))


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sha256_arrays(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(repr((a.dtype.str, a.shape)).encode())
        h.update(a.view(np.uint8).reshape(-1).data if a.size else b"")
    return h.hexdigest()


# ----------------------------------------------------------------------------- zarr helpers


def _zarr():
    import zarr

    return zarr


def _codecs(compress: bool):
    from zarr.codecs import Crc32cCodec, ZstdCodec

    # The checksum goes last: it covers the stored (compressed) bytes, so a truncated or
    # altered chunk fails its check instead of decoding to wrong numbers.
    return [ZstdCodec(level=3), Crc32cCodec()] if compress else [Crc32cCodec()]


def _create(group, name, shape, chunks, dtype, *, compress: bool, attributes=None):
    fill = np.nan if np.dtype(dtype).kind == "f" else -1
    return group.create_array(
        name,
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        fill_value=fill,
        compressors=_codecs(compress),
        filters=None,
        chunk_key_encoding={"name": "default", "separator": "/"},
        attributes={"compressed": bool(compress), **(attributes or {})},
        # Every chunk written, even one equal to the fill value: each gets its identity record.
        config={"write_empty_chunks": True},
    )


def _prepare_output(path: str, overwrite: bool) -> None:
    """Check that a store may be written at ``path`` (an older store there is replaced once the new one is done)."""
    if os.path.lexists(path):
        if not overwrite:
            raise StoreError(f"{path}: already exists; choose another path, or overwrite=True (--overwrite)")
        if os.path.isdir(path) and not os.path.islink(path):
            if not os.path.exists(os.path.join(path, "zarr.json")) and os.listdir(path):
                raise StoreError(f"{path}: exists and is not a Zarr store; refusing to overwrite it")
        else:
            raise StoreError(f"{path}: exists and is not a directory; refusing to overwrite it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise StoreError(f"{path}: directory {parent} does not exist")


def _chunk_grid(shape, chunks) -> tuple[int, ...]:
    return tuple(max(1, math.ceil(s / c)) if s else 0 for s, c in zip(shape, chunks))


#: Largest metadata file (``zarr.json``) read: a store's is a few KiB.
_MAX_META_FILE_BYTES = 16 * 2**20


def _not_plain_file(st) -> str | None:
    """Why a store's file with ``lstat`` result ``st`` is not read (a link, a FIFO, a device), or None."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link (a store's files are never links: it could point anywhere)"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO or a device would block the reader or never end)"
    return None


def _chunk_files(array_dir: str) -> dict[str, int]:
    """Chunk keys (``"0/3/1"``) and file sizes of a local Zarr v3 array (default key encoding).

    A chunk that is a link, a FIFO or a device has size -1 (refused by the reader without being opened).
    """
    out: dict[str, int] = {}
    root = os.path.join(array_dir, "c")
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for e in entries:
            key = prefix + e.name
            if e.is_dir(follow_symlinks=False):
                stack.append((e.path, key + "/"))
            else:
                st = e.stat(follow_symlinks=False)
                out[key] = -1 if _not_plain_file(st) else st.st_size
    return out


def _chunk_keys(name: str, starts, stops, chunks) -> str:
    """The chunk file(s) a selection touches, for error messages (``K/c/0/17/2``)."""
    ranges = [range(a // c, max(a // c + 1, math.ceil(b / c))) for a, b, c in zip(starts, stops, chunks)]
    keys = [f"{name}/c/" + "/".join(map(str, idx)) for idx in _product(ranges)]
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _product(ranges):
    if not ranges:
        yield ()
        return
    for i in ranges[0]:
        for rest in _product(ranges[1:]):
            yield (i, *rest)


# ----------------------------------------------------------------------------- chunk identity


def _chunk_position(key: str) -> tuple[str, tuple[int, ...]] | None:
    """``("K", (0, 17, 2))`` for the chunk key ``"K/c/0/17/2"``; None for any other key (metadata)."""
    name, sep, rest = key.partition("/c/")
    if not sep or "/" in name:
        return None
    parts = rest.split("/")
    if not all(p.isdigit() for p in parts):
        return None
    return name, tuple(int(p) for p in parts)


def _chunk_key(name: str, position) -> str:
    return f"{name}/c/" + "/".join(map(str, position))


def _chunk_record(store_id: bytes, key: str, raw) -> bytes:
    """A format 3 chunk's record: BLAKE2b keyed by the store id over its key (array and position) and all its bytes.

    A chunk moved, swapped, copied from another store or altered in any byte (its CRC-32C patched to
    match or not) does not match the record of its place.
    """
    h = hashlib.blake2b(digest_size=_RECORD_BYTES, key=store_id, person=b"mwumkl-chunk")
    h.update(key.encode() + b"\0")
    h.update(raw)
    return h.digest()


def _metadata_record(store_id: bytes, meta: dict) -> str:
    """The integrity record of a format 3 store's metadata: BLAKE2b keyed by the store id over all of it.

    The metadata holds the SHA-256 of every array's chunk records and Zarr array metadata, so this one
    value covers the whole store: ``mwumkl-dist store info`` prints it as the store's digest.
    """
    text = json.dumps({k: v for k, v in meta.items() if k != "integrity"}, sort_keys=True, allow_nan=False)
    return hashlib.blake2b(text.encode(), digest_size=32, key=store_id, person=b"mwumkl-meta").hexdigest()


def _chunk_digest(store_id: bytes, key: str, tail: bytes) -> int:
    """A format 2 chunk's identity: its CRC-32C (its last 4 bytes) bound to its key and store.

    Keyed by the store id, over the key (array name and chunk position) and the
    checksum: a chunk moved to another position, swapped with another or copied
    from another store does not match the record of its new place.  The content
    itself is covered by the CRC-32C, which Zarr checks against the chunk's bytes
    when it decodes it.
    """
    h = hashlib.blake2b(key.encode() + b"\0" + bytes(tail), digest_size=8, key=store_id)
    return int.from_bytes(h.digest(), "little")


@functools.cache
def _wrapper_stores():
    """The Zarr store wrappers that record (writing) and check (reading) chunk identities."""
    from zarr.storage import WrapperStore

    class ChunkRecorder(WrapperStore):
        """Passes every write through; keeps each chunk's record (:func:`_chunk_record`) by key.

        :meth:`close` refuses further writes and waits for those under way: when
        one chunk write fails, Zarr raises at once but its other concurrent
        writes go on, and they must not recreate files in a folder being deleted.
        """

        def __init__(self, store, shared=None):
            super().__init__(store)
            self.shared = shared
            self.shared.setdefault("cond", threading.Condition())
            self.records = self.shared["records"]

        def _with_store(self, store):
            return type(self)(store, self.shared)

        async def set(self, key, value) -> None:
            shared = self.shared
            with shared["cond"]:
                if shared["closed"]:
                    raise OSError(errno.ECANCELED, "the store write was abandoned")
                shared["active"] += 1
            try:
                if _chunk_position(key) is not None:
                    self.records[key] = _chunk_record(shared["store_id"], key, value.as_numpy_array())
                await self._store.set(key, value)
            finally:
                with shared["cond"]:
                    shared["active"] -= 1
                    shared["cond"].notify_all()

        def close(self, timeout: float = 60.0) -> None:
            shared = self.shared
            with shared["cond"]:
                shared["closed"] = True
                shared["cond"].wait_for(lambda: shared["active"] == 0, timeout)

    class ChunkVerifier(WrapperStore):
        """Passes every read through; a whole chunk read is checked by ``check(key, buffer)`` first."""

        def __init__(self, store, check):
            super().__init__(store)
            self.check = check

        def _with_store(self, store):
            return type(self)(store, self.check)

        async def get(self, key, prototype=None, byte_range=None):
            buf = await self._store.get(key, prototype, byte_range)
            if buf is not None and byte_range is None:
                self.check(key, buf)
            return buf

    return ChunkRecorder, ChunkVerifier


def _local_store(path: str, *, read_only: bool):
    from zarr.storage import LocalStore

    return LocalStore(path, read_only=read_only)


@functools.cache
def _crc32c_function():
    """``crc(bytes) -> int`` (CRC-32C, as Zarr's codec computes it), or None without a CRC-32C library."""
    try:
        import google_crc32c  # what Zarr's crc32c codec uses

        return google_crc32c.value
    except ImportError:
        pass
    try:
        import crc32c  # newer Zarr releases

        return crc32c.crc32c
    except ImportError:
        return None


class _StoreWriter:
    """A new store being written in the folder ``folder`` (a temporary directory, see :func:`_writing`).

    Chunks go through a recording wrapper; :meth:`finish` writes each array's
    identity records, then the metadata, last: a store without the metadata is
    incomplete and :func:`open_store` rejects it.
    """

    def __init__(self, folder: str):
        self.folder = folder
        self.store_id = uuid.uuid4()
        recorder_class, _ = _wrapper_stores()
        shared = {"records": {}, "active": 0, "closed": False, "store_id": self.store_id.bytes}
        self.recorder = recorder_class(_local_store(folder, read_only=False), shared)
        self.group = _zarr().open_group(self.recorder, mode="w", zarr_format=3)

    def finish(self, meta: dict) -> None:
        digests, array_meta = {}, {}
        for name in sorted(self.group.array_keys()):
            arr = self.group[name]
            grid = _chunk_grid(arr.shape, arr.chunks)
            table = np.empty((*grid, _RECORD_BYTES), dtype=np.uint8)
            for position in np.ndindex(*grid):
                key = _chunk_key(name, position)
                record = self.recorder.records.get(key)
                if record is None:  # pragma: no cover - every chunk is written (write_empty_chunks)
                    raise RuntimeError(f"chunk {key} was not written")
                table[position] = np.frombuffer(record, dtype=np.uint8)
            file = os.path.join(self.folder, name, _DIGESTS_FILE)
            np.save(file, table, allow_pickle=False)
            digests[name] = _sha256_file(file)
            array_meta[name] = _sha256_file(os.path.join(self.folder, name, "zarr.json"))
        meta = {**meta, "store_id": self.store_id.hex, "chunk_digests": digests, "array_metadata": array_meta}
        meta["integrity"] = _metadata_record(self.store_id.bytes, meta)
        self.group.attrs[_ATTR] = meta  # last: a store without it is incomplete


@contextlib.contextmanager
def _writing(path: str, overwrite: bool, what: str):
    """A :class:`_StoreWriter` on a temporary directory next to ``path``, moved to ``path`` when complete.

    A write that fails leaves no store at ``path`` (or the older one, with
    ``overwrite``) and no temporary directory; an ``OSError`` (a full disk) is
    raised as a :class:`~mwumkl_dist.io.atomic.WriteError` naming ``path``.
    """
    _prepare_output(path, overwrite)
    with exclusive_writer(path, what):  # one writer at a time; it removes what killed writers left
        with atomic_directory(path, what, replace=overwrite) as folder:
            writer = _StoreWriter(folder)
            try:
                yield writer
            finally:
                writer.recorder.close()  # no chunk write under way when the folder is moved or deleted


def _meta_value(key: str, doc: str) -> property:
    """A read-only property: the store metadata's ``key``."""
    return property(lambda self: self.meta[key], doc=doc)


def _check_metadata_files(path: str) -> None:
    """The store's ``zarr.json`` files (its own, its arrays') are plain files of a sane size: Zarr reads them whole."""
    files = [os.path.join(path, "zarr.json")]
    with contextlib.suppress(OSError):
        files += [os.path.join(e.path, "zarr.json") for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    for file in files:
        try:
            st = os.lstat(file)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreError(f"{path}: cannot read {file} ({exc.strerror or exc})") from None
        why = _not_plain_file(st)
        if why is None and st.st_size > _MAX_META_FILE_BYTES:
            why = f"{st.st_size} bytes, more than any store's metadata ({_MAX_META_FILE_BYTES})"
        if why is not None:
            raise StoreError(f"{path}: metadata file {file} is {why}")


def _check_positive(meta: dict, keys, fail) -> None:
    """Each metadata value of ``keys`` a positive integer, else ``fail(problem)`` raised."""
    for key in keys:
        v = meta[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise fail(f"metadata {key!r} must be a positive integer, got {v!r}")


def _check_positive_arg(name: str, v) -> None:
    """A writer's argument ``name`` a positive integer (or None), else a ``ValueError``."""
    if v is not None and (isinstance(v, bool) or int(v) != v or v < 1):
        raise ValueError(f"{name} must be a positive integer, got {v!r}")


def _store_meta(fmt: str, n: int, labels: tuple, chunk_rows: int, source, sha: str, shape: dict, chunks: dict) -> dict:
    """A store's metadata: what both kinds hold, ``shape`` after ``n_samples``, ``chunks`` after ``chunk_rows``."""
    classes, label_dtype = labels
    return {
        "format": fmt,
        "format_version": STORE_VERSION,
        "package_version": __version__,
        "n_samples": n,
        **shape,
        "classes": classes,
        "label_dtype": label_dtype,
        "chunk_rows": chunk_rows,
        **chunks,
        "source": os.path.abspath(os.fspath(source)) if source is not None else None,
        "source_sha256": sha,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


#: What metadata values of the wrong type raise in the checks (a string where a number belongs, a list as a key).
_MALFORMED = (TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError)


class _StoreBase:
    """What both store kinds share: opening, validation, labels, lazy arrays on workers."""

    FORMAT = ""
    REQUIRED: tuple[str, ...] = ()

    def __init__(self, path, *, verify: bool = True):
        # Resolved here, where the user named it: workers (other processes, other machines with
        # a shared file system) reopen the store by this path, whatever their working directory.
        self.path = os.path.abspath(os.fspath(path))
        self._group = None
        self._arrays: dict = {}
        self._tables: dict = {}
        self._misplaced_chunks: list[tuple] = []  # (array, position, message) of _check_chunk, raised by _read
        self._y_codes = None
        try:
            self.meta = self._open_meta()
            if verify:
                self._validate()
        except _MALFORMED as exc:  # metadata of the wrong types (edited by hand): one error naming the store
            raise StoreError(f"{self.path}: malformed metadata ({type(exc).__name__}: {exc})") from None
        if verify:
            if self._store_id is None:
                warnings.warn(
                    f"{self.path}: store format {self.meta['format_version']} keeps no chunk identity records, "
                    "so chunk files moved, swapped or copied from another store cannot be detected; "
                    f"re-create the store with this mwumkl_dist ({__version__}) to have them checked",
                    UserWarning,
                    stacklevel=3,
                )
            elif self._format < 3:
                warnings.warn(
                    f"{self.path}: store format {self._format} checks each chunk by its CRC-32C only (an altered "
                    "chunk can be made to pass) and its metadata (classes, n_features, kernel names) is not covered "
                    f"by any check; re-create the store with this mwumkl_dist ({__version__}) to have both checked",
                    UserWarning,
                    stacklevel=3,
                )

    # -- opening -------------------------------------------------------------------------
    def _fail(self, problem: str) -> StoreError:
        return StoreError(f"{self.path}: {problem}")

    def _open_meta(self) -> dict:
        path = self.path
        if not os.path.exists(path):
            raise StoreError(f"{path}: no such store")
        if not os.path.isdir(path):
            raise StoreError(f"{path}: not a store (a Zarr store is a directory)")
        _check_metadata_files(path)
        try:
            group = _zarr().open_group(path, mode="r")
        except Exception as exc:  # zarr raises several types for a directory that is not a group
            raise StoreError(f"{path}: not a Zarr group ({type(exc).__name__}: {exc})") from None
        meta = group.attrs.asdict().get(_ATTR)
        if not isinstance(meta, dict):
            raise StoreError(
                f"{path}: no mwumkl_dist metadata (not written by 'mwumkl-dist store', or its write did not finish)"
            )
        fmt = meta.get("format")
        if fmt != self.FORMAT:
            what = _KINDS.get(fmt)
            problem = f"this is {what}, not {_KINDS[self.FORMAT]}" if what else f"unknown store format {fmt!r}"
            raise StoreError(f"{path}: {problem}")
        version = meta.get("format_version")
        if version not in READABLE_VERSIONS:
            raise StoreError(
                f"{path}: written by an incompatible version (store format {version!r}, "
                f"mwumkl_dist {meta.get('package_version', '?')}); this mwumkl_dist ({__version__}) "
                f"reads store formats {', '.join(map(str, READABLE_VERSIONS))}: rewrite the store"
            )
        required = self.REQUIRED + (("store_id", "chunk_digests") if version >= 2 else ())
        required += ("array_metadata", "integrity") if version >= 3 else ()
        missing = [k for k in required if k not in meta]
        if missing:
            raise StoreError(f"{path}: metadata lacks {', '.join(repr(k) for k in missing)}")
        _check_positive(meta, ("n_samples", "chunk_rows"), self._fail)
        if not isinstance(meta["classes"], list) or len(meta["classes"]) < 1:
            raise StoreError(f"{path}: metadata 'classes' must be a non-empty list")
        try:
            classes = _decode_classes(meta["classes"], meta["label_dtype"])
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{path}: metadata 'classes' cannot be read as {meta['label_dtype']!r} ({exc})") from None
        if classes.ndim != 1 or len(np.unique(classes)) != len(classes):
            raise StoreError(f"{path}: metadata 'classes' must be a list of distinct labels, got {meta['classes']!r}")
        self._store_id = None
        self._format = version
        if version >= 2:
            try:
                self._store_id = uuid.UUID(hex=str(meta["store_id"])).bytes
            except ValueError:
                raise StoreError(f"{path}: metadata 'store_id' is not a UUID: {meta['store_id']!r}") from None
            if not isinstance(meta["chunk_digests"], dict):
                raise StoreError(f"{path}: metadata 'chunk_digests' must be a mapping of array names to SHA-256")
        self._format = version
        if version >= 3:
            try:
                record = _metadata_record(self._store_id, meta)
            except (TypeError, ValueError) as exc:
                record = f"(cannot be computed: {exc})"
            if record != meta["integrity"]:
                raise StoreError(
                    f"{path}: its metadata does not match its integrity record: it was edited after the store was "
                    "written (classes, n_features, kernel names or another entry), so the store cannot be trusted; "
                    "re-create the store"
                )
            if not isinstance(meta["array_metadata"], dict):
                raise StoreError(f"{path}: metadata 'array_metadata' must be a mapping of array names to SHA-256")
        return meta

    @property
    def group(self):
        if self._group is None:
            if self._store_id is None:  # format 1: no identity records to check
                self._group = _zarr().open_group(self.path, mode="r")
            else:
                _, verifier_class = _wrapper_stores()
                store = verifier_class(_local_store(self.path, read_only=True), self._check_chunk)
                self._group = _zarr().open_group(store, mode="r")
        return self._group

    # -- chunk identity ----------------------------------------------------------------------
    def _recreate_hint(self) -> str:
        source = self.meta.get("source")
        cmd = "store kernels" if self.FORMAT == KERNEL_FORMAT else "store data"
        return f"re-create the store with 'mwumkl-dist {cmd}'" + (f" from {source}" if source else "")

    def _digest_table(self, name: str) -> np.ndarray:
        """Array ``name``'s identity records (memory-mapped: a worker touches only the pages it reads)."""
        table = self._tables.get(name)
        if table is None:
            file = os.path.join(self.path, name, _DIGESTS_FILE)
            try:
                table = np.load(file, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise self._fail(
                    f"cannot read the chunk identity records of array {name!r} ({file}: {exc}); {self._recreate_hint()}"
                ) from None
            self._tables[name] = table
        return table

    def _check_chunk(self, key: str, buf) -> None:
        """Note the chunk read at ``key`` unless it is the one written there (format 2); :meth:`_read` raises.

        Called in Zarr's I/O loop: raising there would abandon the read's other
        chunk tasks mid-flight, so the problem is recorded and reported by the read.
        """
        where = _chunk_position(key)
        if where is None:
            return
        name, position = where
        try:
            table = self._digest_table(name)
        except StoreError as exc:
            self._misplaced_chunks.append((name, position, str(exc)))
            return
        grid = table.shape[: len(position)]
        if len(position) != len(self._record_grid(table)) or any(p >= g for p, g in zip(position, grid)):
            return  # outside the array's grid: Zarr never asks for it
        raw = buf.as_numpy_array()
        if not self._matches_record(key, raw, table[position]):
            crc = _crc32c_function()
            if crc is not None and np.uint32(crc(raw[:-4])).tobytes() != raw[-4:].tobytes():
                return  # truncated or corrupt, not misplaced: Zarr's checksum check reports it
            self._misplaced_chunks.append((name, position, str(self._fail(self._misplaced(key, name, position)))))

    def _record_grid(self, table) -> tuple:
        """The chunk grid a table of records covers (format 3 tables have one more axis: the record's bytes)."""
        return tuple(table.shape[:-1]) if self._format >= 3 else tuple(table.shape)

    def _matches_record(self, key: str, raw, record) -> bool:
        """Whether the chunk bytes ``raw`` read at ``key`` are the ones its record (an entry of the table) names."""
        if self._format >= 3:
            return _chunk_record(self._store_id, key, raw) == np.asarray(record).tobytes()
        return _chunk_digest(self._store_id, key, raw[-4:].tobytes()) == int(record)

    def _misplaced_error(self) -> StoreError:
        """The problem :meth:`_check_chunk` noted, the first in chunk order (Zarr reads chunks concurrently)."""
        return StoreError(min(self._misplaced_chunks)[2])

    def _misplaced(self, key: str, name: str, position) -> str:
        return (
            f"chunk {key} (array {name!r}, chunk position {tuple(position)}) is not the chunk written at this "
            "position of this store: it differs from the record kept for it (chunk files moved, "
            f"swapped, copied from another store or altered); {self._recreate_hint()}"
        )

    def _check_digest_table(self, name: str, grid: tuple) -> None:
        """On open: array ``name``'s identity records present, the ones the metadata names, of the chunk grid."""
        digests = self.meta["chunk_digests"]
        if name not in digests:
            raise self._fail(f"metadata 'chunk_digests' has no entry for array {name!r}; {self._recreate_hint()}")
        file = os.path.join(self.path, name, _DIGESTS_FILE)
        try:
            sha = _sha256_file(file)
        except OSError as exc:
            raise self._fail(
                f"cannot read the chunk identity records of array {name!r} ({exc.strerror or exc}: {file}); "
                f"{self._recreate_hint()}"
            ) from None
        if sha != digests[name]:
            raise self._fail(
                f"the chunk identity records of array {name!r} ({file}) are not the ones written with this store "
                f"(SHA-256 differs from the metadata's); {self._recreate_hint()}"
            )
        table = self._digest_table(name)
        dtype, shape = (np.uint8, (*grid, _RECORD_BYTES)) if self._format >= 3 else ("<u8", tuple(grid))
        if table.dtype != np.dtype(dtype) or tuple(table.shape) != tuple(shape):
            raise self._fail(
                f"the chunk identity records of array {name!r} have shape {table.shape}, its chunk grid is {grid}"
            )
        if self._format >= 3:
            self._check_array_metadata(name)

    def array_names(self) -> list[str]:
        """The store's arrays (those its kind requires)."""
        if self.FORMAT == KERNEL_FORMAT:
            return ["K", "diag", "y"]
        return (["indptr", "indices", "data"] if self.meta["sparse"] else ["X"]) + ["y"]

    def verify_chunks(self, limit: int = 20) -> tuple[int, list[str]]:
        """Check every chunk file of the store: present, its content checksum and (format 2) its identity.

        Reads the whole store (``mwumkl-dist store info`` calls it).  Each
        chunk's CRC-32C is checked against its content, and, for a store of
        format 2, the chunk against the identity record of its position (a chunk
        moved, swapped or copied from another store fails).

        Parameters
        ----------
        limit : int, default=20
            Problems described at most.

        Returns
        -------
        n_checked : int
            The number of chunks checked.
        problems : list of str
            One line per bad chunk (the first ``limit``), then ``"... N more"``.
        """
        n_checked, n_bad, problems = self._scan_chunks(limit)
        if n_bad > len(problems):
            problems.append(f"... {n_bad - len(problems)} more")
        return n_checked, problems

    def check_chunks(self, limit: int = 5) -> int:
        """:meth:`verify_chunks`, raising a :class:`StoreError` listing the bad chunks; returns the number checked."""
        n_checked, n_bad, problems = self._scan_chunks(limit)
        if n_bad:
            more = f"; ... {n_bad - len(problems)} more" if n_bad > len(problems) else ""
            raise self._fail(
                f"{n_bad} of its {n_checked} chunks are bad: {'; '.join(problems)}{more}; {self._recreate_hint()}"
            )
        return n_checked

    def _scan_chunks(self, limit: int) -> tuple[int, int, list[str]]:
        crc = _crc32c_function()
        problems: list[str] = []
        n_bad = n_checked = 0
        for name in self.array_names():
            arr = self._array(name)
            grid = _chunk_grid(arr.shape, arr.chunks)
            self._check_grid(name, grid)
            table = self._digest_table(name) if self._store_id is not None else None
            for position in np.ndindex(*grid):
                n_checked += 1
                problem = self._chunk_problem(_chunk_key(name, position), name, position, table, crc)
                if problem is not None:
                    n_bad += 1
                    if len(problems) < limit:
                        problems.append(problem)
        return n_checked, n_bad, problems

    def _check_array_metadata(self, name: str) -> None:
        """Refuse array ``name`` whose ``zarr.json`` is not the one written with this store (format 3)."""
        file = os.path.join(self.path, name, "zarr.json")
        try:
            sha = _sha256_file(file)
        except OSError as exc:
            raise self._fail(f"cannot read {file} ({exc.strerror or exc})") from None
        if sha != self.meta["array_metadata"].get(name):
            raise self._fail(
                f"the Zarr metadata of array {name!r} ({file}) is not the one written with this store "
                f"(edited after the store was written); {self._recreate_hint()}"
            )

    def _check_grid(self, name: str, grid: tuple) -> None:
        """Refuse to scan a chunk grid that the chunk files present cannot justify (an edited shape: 10^8 rows)."""
        if self._format >= 3:
            self._check_array_metadata(name)
        n_files = len(_chunk_files(os.path.join(self.path, name)))
        n_chunks = math.prod(grid)
        if n_chunks > 2 * n_files + 64:
            raise self._fail(
                f"array {name!r} has a grid of {n_chunks} chunks but {n_files} chunk files: its shape was edited; "
                f"{self._recreate_hint()}"
            )

    def _chunk_problem(self, key, name, position, table, crc) -> str | None:
        file = os.path.join(self.path, *key.split("/"))
        try:
            why = _not_plain_file(os.lstat(file))
            if why is not None:
                return f"chunk {key}: {why}"
            arr = self._array(name)
            limit = int(np.prod(arr.chunks)) * arr.dtype.itemsize * 2 + 4096
            with open(file, "rb") as fh:
                raw = fh.read(limit + 1)
            if len(raw) > limit:
                return f"chunk {key}: more than the {limit} bytes a chunk of this array can hold"
        except FileNotFoundError:
            return f"chunk {key}: missing (deleted or never written)"
        except OSError as exc:
            return f"chunk {key}: cannot be read ({exc.strerror or exc})"
        if len(raw) < 4:
            return f"chunk {key}: {len(raw)} bytes, too short to hold its checksum (truncated)"
        tail = raw[-4:]
        if crc is not None and np.uint32(crc(raw[:-4])).tobytes() != tail:
            return f"chunk {key}: its content does not match its CRC-32C checksum (truncated or corrupt)"
        if table is not None and not self._matches_record(key, np.frombuffer(raw, np.uint8), table[position]):
            return (
                f"chunk {key} (array {name!r}, chunk position {tuple(position)}): not the chunk written at this "
                "position (moved, swapped, copied from another store or altered)"
            )
        return None

    def _array(self, name: str):
        arr = self._arrays.get(name)
        if arr is None:
            try:
                arr = self.group[name]
            except KeyError:
                raise self._fail(f"missing array {name!r}") from None
            except (RecursionError, ValueError, TypeError) as exc:  # its zarr.json edited: nested, of wrong types
                raise self._fail(f"array {name!r} has malformed Zarr metadata ({type(exc).__name__})") from None
            self._arrays[name] = arr
        return arr

    def _check_array(self, name: str, shape: tuple, dtype, chunks: tuple | None = None) -> None:
        group = self.group
        if name not in group:
            raise self._fail(f"missing array {name!r}")
        arr = group[name]
        if not hasattr(arr, "shape") or tuple(arr.shape) != tuple(shape):
            raise self._fail(
                f"array {name!r} has shape {tuple(getattr(arr, 'shape', ()))}, the metadata implies {tuple(shape)}"
            )
        if arr.dtype != np.dtype(dtype):
            raise self._fail(f"array {name!r} has dtype {arr.dtype}, expected {np.dtype(dtype)}")
        if chunks is not None and tuple(arr.chunks) != tuple(chunks):
            raise self._fail(f"array {name!r} has chunks {tuple(arr.chunks)}, expected {tuple(chunks)}")
        # Every chunk file present (a missing one would silently read as the fill value), and
        # uncompressed chunks of the exact size (a truncated file is caught before any solving).
        files = _chunk_files(os.path.join(self.path, name))
        grid = _chunk_grid(arr.shape, arr.chunks)
        expected = int(np.prod(grid)) if grid else 0
        valid = 0
        for key in files:
            parts = key.split("/")
            if len(parts) == len(grid) and all(p.isdigit() and int(p) < g for p, g in zip(parts, grid)):
                valid += 1
        if valid < expected:
            raise self._fail(f"array {name!r} is missing {expected - valid} of its {expected} chunk files")
        odd = [k for k, size in files.items() if size < 0]
        if odd:
            file = os.path.join(self.path, name, "c", *odd[0].split("/"))
            raise self._fail(f"chunk {name}/c/{odd[0]} is {_not_plain_file(os.lstat(file))}; {self._recreate_hint()}")
        # A chunk never holds more than its raw bytes plus what the codecs add: a bigger file is not one.
        limit = int(np.prod(arr.chunks)) * arr.dtype.itemsize * 2 + 4096
        big = [k for k, size in files.items() if size > limit]
        if big:
            raise self._fail(
                f"chunk {name}/c/{big[0]} has {files[big[0]]} bytes, more than a chunk of this array can hold "
                f"({limit}); {self._recreate_hint()}"
            )
        if self._store_id is not None:
            self._check_digest_table(name, grid)
        if not arr.attrs.get("compressed", True):
            size = int(np.prod(arr.chunks)) * arr.dtype.itemsize + 4  # raw bytes + CRC-32C
            bad = [k for k, s in files.items() if s != size]
            if bad:
                raise self._fail(
                    f"chunk {name}/c/{bad[0]} has {files[bad[0]]} bytes, expected {size} (truncated or corrupt)"
                    + (f"; {len(bad) - 1} more such chunks" if len(bad) > 1 else "")
                )

    def _read(self, name: str, selection: tuple, what: str) -> np.ndarray:
        """``array[selection]`` with every failure turned into a :class:`StoreError` naming the chunk."""
        arr = self._array(name)
        try:
            out = np.asarray(arr[selection])
        except Exception as exc:  # codec / checksum / I/O errors from zarr
            if self._misplaced_chunks:
                raise self._misplaced_error() from None
            reason = f"{type(exc).__name__}: {exc}"
            if "checksum" in str(exc).lower():  # its message quotes the chunk's bytes: they may be another file's
                reason = "its content does not match its CRC-32C checksum (truncated or corrupt)"
            raise self._fail(
                f"cannot read {what} from array {name!r} (chunk {self._keys(name, selection)}): "
                + re.sub(r"""b(['"]).*?\1""", "b'...'", reason)[:300]
            ) from None
        if self._misplaced_chunks:  # a chunk that is not the one written at its position (_check_chunk)
            raise self._misplaced_error()
        bad = np.isnan(out) if out.dtype.kind == "f" else out < 0
        if bad.any():
            raise self._fail(
                f"array {name!r} has a missing chunk in {what} (chunk {self._keys(name, selection)}): "
                "deleted or never written"
            )
        return out

    def _keys(self, name, selection) -> str:
        arr = self._array(name)
        starts, stops = [], []
        for s, dim in zip(selection, arr.shape):
            if isinstance(s, slice):
                a, b, _ = s.indices(dim)
            else:
                a, b = int(s), int(s) + 1
            starts.append(a)
            stops.append(max(b, a + 1))
        return _chunk_keys(name, starts, stops, arr.chunks)

    # -- labels ----------------------------------------------------------------------------
    def _validate_labels(self) -> None:
        n = self.meta["n_samples"]
        self._check_array("y", (n,), np.int32, (self.meta["chunk_rows"],))
        codes = self._read("y", (slice(0, n),), "the labels")
        n_classes = len(self.meta["classes"])
        if codes.size and int(codes.max()) >= n_classes:
            raise self._fail(
                f"labels use class code {int(codes.max())} but the metadata lists {n_classes} classes "
                "(label count mismatch)"
            )
        self._y_codes = codes

    n_samples = _meta_value("n_samples", "The number of training points.")
    chunk_rows = _meta_value("chunk_rows", "Rows per chunk (``R``).")

    @property
    def classes(self) -> np.ndarray:
        return _decode_classes(self.meta["classes"], self.meta["label_dtype"])

    @property
    def y(self) -> np.ndarray:
        """The training labels (read once, on the driver: ``O(n)``)."""
        if self._y_codes is None:
            self._y_codes = self._read("y", (slice(0, self.n_samples),), "the labels")
        return self.classes[self._y_codes]

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        """Row shards on chunk boundaries (each shard reads whole chunks), near-equal in size."""
        return aligned_ranges(self.n_samples, self.chunk_rows, n_shards)

    def content_id(self) -> np.ndarray:
        """A small array identifying the store's content (for checkpoint fingerprints)."""
        digest = hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode()).digest()
        return np.frombuffer(digest, dtype=np.uint8)

    def training_labels(self, y) -> np.ndarray:
        if y is not None:
            raise ValueError(f"{self.path}: the labels come from the store; call fit(store) with y=None")
        return self.y

    # -- pickling: workers reopen by path, without re-validating ---------------------------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(_group=None, _arrays={}, _tables={}, _misplaced_chunks=[], _y_codes=None)
        return state

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r})"


# ----------------------------------------------------------------------------- data store


class DataStore(_StoreBase):
    """A training set in a Zarr data store (see the module docstring), opened and validated.

    Pass it as ``X`` to :meth:`MWUMKLClassifier.fit` (with ``y=None``): each
    shard reads its own rows (on its Dask worker) and the driver only reads
    the labels and, after the fit, the support vectors.

    Parameters
    ----------
    path : str or path-like
        The store directory.
    verify : bool, default=True
        Check metadata, arrays, chunk files and labels now (workers skip it).

    Raises
    ------
    StoreError
        The store is missing, incomplete, corrupt or of another version.
    """

    FORMAT = DATA_FORMAT
    REQUIRED = (
        "format", "format_version", "package_version", "n_samples", "n_features", "sparse",
        "classes", "label_dtype", "chunk_rows", "source_sha256",
    )  # fmt: skip

    def _validate(self) -> None:
        meta = self.meta
        n, d, R = meta["n_samples"], meta["n_features"], meta["chunk_rows"]
        _check_positive(meta, ("n_features",), self._fail)
        if meta["sparse"]:
            nnz = meta.get("nnz")
            if not isinstance(nnz, int) or nnz < 0:
                raise self._fail(f"metadata 'nnz' must be a non-negative integer, got {nnz!r}")
            self._check_array("indptr", (n + 1,), np.int64, (R,))
            self._check_array("indices", (nnz,), np.int32)
            self._check_array("data", (nnz,), np.float64)
            ends = (
                self._read("indptr", (slice(0, 1),), "the row pointers"),
                self._read("indptr", (slice(n, n + 1),), "the row pointers"),
            )
            if int(ends[0][0]) != 0 or int(ends[1][0]) != nnz:
                raise self._fail(
                    f"row pointers run from {int(ends[0][0])} to {int(ends[1][0])}, expected 0 to nnz={nnz}"
                )
        else:
            self._check_array("X", (n, d), np.float64, (R, d))
        self._validate_labels()

    n_features = _meta_value("n_features", "The number of features.")

    @property
    def sparse(self) -> bool:
        return bool(self.meta["sparse"])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_samples, self.n_features)

    #: ``(factors, offsets)`` applied to every row read (:meth:`with_feature_scale`); None: rows as stored.
    _feature_scale = None

    def with_feature_scale(self, factors, offsets) -> DataStore:
        """This store, its rows read as ``X * factors + offsets`` per feature (see
        :mod:`mwumkl_dist.kernels.feature_scale`).  The files are not changed."""
        view = copy.copy(self)
        view._feature_scale = (np.asarray(factors, dtype=np.float64), np.asarray(offsets, dtype=np.float64))
        return view

    def read_rows(self, start: int, stop: int):
        """Rows ``[start, stop)``: a CSR matrix (sparse store) or a dense array (feature-scaled, if so made)."""
        rows = self._read_rows(start, stop)
        return rows if self._feature_scale is None else apply_feature_scale(rows, *self._feature_scale)

    def _read_rows(self, start: int, stop: int):
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.n_samples:
            raise ValueError(f"{self.path}: rows [{start}, {stop}) outside the store's {self.n_samples} rows")
        what = f"rows {start}..{stop - 1}"
        if not self.sparse:
            X = self._read("X", (slice(start, stop), slice(0, self.n_features)), what)
            if not np.all(np.isfinite(X)):
                raise self._fail(f"non-finite feature values in {what}")
            return X
        ptr = self._read("indptr", (slice(start, stop + 1),), what).astype(np.int64)
        if np.any(np.diff(ptr) < 0) or ptr[-1] > self.meta["nnz"]:
            raise self._fail(f"row pointers of {what} are not increasing (corrupt store)")
        a, b = int(ptr[0]), int(ptr[-1])
        idx = self._read("indices", (slice(a, b),), what) if b > a else np.zeros(0, np.int32)
        data = self._read("data", (slice(a, b),), what) if b > a else np.zeros(0)
        if idx.size and int(idx.max()) >= self.n_features:
            raise self._fail(f"feature index {int(idx.max())} in {what} exceeds n_features={self.n_features}")
        if not np.all(np.isfinite(data)):
            raise self._fail(f"non-finite feature values in {what}")
        return sp.csr_matrix((data, idx, ptr - a), shape=(stop - start, self.n_features))

    def take_rows(self, indices):
        """Rows at ``indices`` (sorted or not), reading each touched chunk block once."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size == 0:
            empty = sp.csr_matrix((0, self.n_features)) if self.sparse else np.zeros((0, self.n_features))
            return empty
        if indices.min() < 0 or indices.max() >= self.n_samples:
            raise ValueError(f"{self.path}: row indices outside the store's {self.n_samples} rows")
        order = np.argsort(indices, kind="stable")
        ordered = indices[order]
        R = self.chunk_rows
        blocks = []
        for c in np.unique(ordered // R):
            a, b = int(c) * R, min(self.n_samples, (int(c) + 1) * R)
            blocks.append(self.read_rows(a, b)[ordered[(ordered >= a) & (ordered < b)] - a])
        rows = sp.vstack(blocks).tocsr() if self.sparse else np.vstack(blocks)
        back = np.empty_like(order)
        back[order] = np.arange(len(order))  # rows come out sorted; restore the order asked for
        return rows[back]

    def point(self, j: int) -> np.ndarray:
        """Row ``j`` as a dense vector."""
        row = self.read_rows(int(j), int(j) + 1)
        return np.asarray(row.toarray() if sp.issparse(row) else row).ravel()

    def sample_rows(self, size: int, seed: int):
        """About ``2 * size`` rows and their labels (all of a small store), read whole chunks at a time.

        Chunks are taken in a random order (from ``seed``) until they hold
        ``2 * size`` rows, and returned in row order, so a store sorted by label
        still gives both classes; ``C="auto"`` cross-validates on such a sample
        (see :func:`mwumkl_dist.solvers.auto.choose_C`).

        Returns
        -------
        X : ndarray or CSR matrix, y : ndarray
        """
        y = self.y
        ranges = self.row_ranges(-(-self.n_samples // self.chunk_rows))
        order = np.random.default_rng(seed).permutation(len(ranges))
        picked, total = [], 0
        for i in order:
            if total >= 2 * size:
                break
            picked.append(ranges[i])
            total += ranges[i][1] - ranges[i][0]
        picked.sort()
        blocks = [self.read_rows(a, b) for a, b in picked]
        X = sp.vstack(blocks, format="csr") if sp.issparse(blocks[0]) else np.concatenate(blocks)
        return X, np.concatenate([y[a:b] for a, b in picked])

    def __repr__(self):
        kind = f"CSR, {self.meta.get('nnz')} non-zeros" if self.sparse else "dense"
        shape = f"{self.n_samples} x {self.n_features}"
        return f"DataStore({self.path!r}: {shape}, {kind}, chunks of {self.chunk_rows} rows)"


def write_data_store(
    path,
    X,
    y,
    *,
    chunk_rows: int = 4096,
    source=None,
    overwrite: bool = False,
    compress: bool = True,
) -> DataStore:
    """Write features and labels to a new data store and return it opened.

    Parameters
    ----------
    path : str or path-like
        The store directory to create.
    X : array-like or sparse matrix of shape (n_samples, n_features)
        Features; sparse input is stored as CSR (never densified).
    y : array-like of shape (n_samples,)
        Labels (numbers or strings); stored as codes with the class list in the metadata.
    chunk_rows : int, default=4096
        Rows per chunk (``R``); row shards follow these chunks.
    source : path or None
        The file the data came from: its SHA-256 goes into the metadata
        (otherwise the SHA-256 of the arrays written).
    overwrite : bool, default=False
        Replace an existing store at ``path``.
    compress : bool, default=True
        Zstandard-compress the chunks (each chunk carries a CRC-32C checksum either way).
    """
    path = os.fspath(path)
    _check_positive_arg("chunk_rows", chunk_rows)
    chunk_rows = int(chunk_rows)
    Xs, sparse = _feature_rows(X)
    n, d = Xs.shape
    codes, classes, label_dtype = _encode_labels(y)
    if len(codes) != n:
        raise ValueError(f"{n} rows but {len(codes)} labels")
    chunk_rows = min(chunk_rows, max(n, 1))  # a chunk longer than the data would be allocated whole, and hold nothing
    _prepare_output(path, overwrite)
    if source is not None:
        sha = _sha256_file(os.fspath(source))
    elif sparse:
        sha = _sha256_arrays(Xs.indptr, Xs.indices, Xs.data, codes)
    else:
        sha = _sha256_arrays(Xs, codes)

    shape = {"n_features": d, "sparse": bool(sparse)}
    meta = _store_meta(DATA_FORMAT, n, (classes, label_dtype), chunk_rows, source, sha, shape, {})
    # Written in a temporary directory and moved to `path` when complete (metadata last).
    with _writing(path, overwrite, "data store") as writer:
        meta.update(_write_features(writer.group, Xs, sparse, chunk_rows, compress))
        _create(writer.group, "y", (n,), (chunk_rows,), np.int32, compress=compress)[:] = codes
        writer.finish(meta)
    return DataStore(path)


def _feature_rows(X):
    """``(rows, sparse)``: sparse ``X`` as CSR (:func:`as_csr`), dense as a float64 array; checked finite and 2-d."""
    sparse = sp.issparse(X)
    if sparse:
        Xs = as_csr(X)
        if not np.all(np.isfinite(Xs.data)):
            raise ValueError("features contain NaN or infinity")
    else:
        Xs = np.asarray(X, dtype=np.float64)
        if Xs.ndim != 2:
            raise ValueError(f"features must be 2-d (n_samples, n_features), got shape {Xs.shape}")
        if not np.all(np.isfinite(Xs)):
            raise ValueError("features contain NaN or infinity")
    n, d = Xs.shape
    if n < 1 or d < 1:
        raise ValueError(f"need at least one row and one feature, got shape {Xs.shape}")
    return Xs, sparse


def _write_features(group, Xs, sparse: bool, chunk_rows: int, compress: bool) -> dict:
    """Write the feature arrays (``indptr``, ``indices``, ``data``, or ``X``); the metadata they add."""
    n, d = Xs.shape
    if not sparse:
        Xa = _create(group, "X", (n, d), (chunk_rows, d), np.float64, compress=compress)
        for a in range(0, n, chunk_rows * 16):
            Xa[a : a + chunk_rows * 16] = Xs[a : a + chunk_rows * 16]
        return {}
    nnz = int(Xs.nnz)
    chunk_nnz = max(1024, math.ceil(nnz / n * min(chunk_rows, n))) if nnz else 1024
    indptr = _create(group, "indptr", (n + 1,), (chunk_rows,), np.int64, compress=compress)
    indices = _create(group, "indices", (nnz,), (chunk_nnz,), np.int32, compress=compress)
    data = _create(group, "data", (nnz,), (chunk_nnz,), np.float64, compress=compress)
    indptr[:] = Xs.indptr.astype(np.int64)
    for a in range(0, nnz, chunk_nnz * 64):
        b = min(nnz, a + chunk_nnz * 64)
        indices[a:b] = Xs.indices[a:b].astype(np.int32)
        data[a:b] = Xs.data[a:b]
    return {"nnz": nnz, "chunk_nnz": chunk_nnz}


def open_data_store(path, *, verify: bool = True) -> DataStore:
    """Open and validate a data store (see :class:`DataStore`)."""
    return DataStore(path, verify=verify)


# ----------------------------------------------------------------------------- kernel store


class KernelStore(_StoreBase):
    """Precomputed kernels in a Zarr kernel store (see the module docstring), opened and validated.

    Pass it as ``X`` to ``MWUMKLClassifier(kernels="precomputed").fit`` (with
    ``y=None``); each shard reads the two kernel columns a superstep needs for
    its rows through a :class:`ColumnCache` of ``cache_bytes``.

    Parameters
    ----------
    path : str or path-like
        The store directory.
    cache_bytes : int, default=256 MiB
        Column cache size of each shard.
    verify : bool, default=True
        Check metadata, arrays, every chunk file's presence and size, labels
        and traces now (workers skip it).
    """

    FORMAT = KERNEL_FORMAT
    REQUIRED = (
        "format", "format_version", "package_version", "n_samples", "n_kernels", "kernel_names",
        "traces", "classes", "label_dtype", "chunk_rows", "chunk_kernels", "source_sha256",
    )  # fmt: skip

    def __init__(self, path, *, cache_bytes: int = DEFAULT_CACHE_BYTES, verify: bool = True):
        if isinstance(cache_bytes, bool) or int(cache_bytes) != cache_bytes or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be a non-negative integer, got {cache_bytes!r}")
        self.cache_bytes = int(cache_bytes)
        super().__init__(path, verify=verify)

    def _validate(self) -> None:
        meta = self.meta
        n, m, R, mc = meta["n_samples"], meta["n_kernels"], meta["chunk_rows"], meta["chunk_kernels"]
        _check_positive(meta, ("n_kernels", "chunk_kernels"), self._fail)
        if len(meta["kernel_names"]) != m or len(meta["traces"]) != m:
            raise self._fail(
                f"metadata lists {len(meta['kernel_names'])} kernel names and {len(meta['traces'])} traces "
                f"for n_kernels={m}"
            )
        self._check_array("K", (m, n, n), np.float64, (mc, 1, R))
        self._check_array("diag", (m, n), np.float64, (mc, R))
        self._validate_labels()
        diag = self.read_diag((0, n), (0, m))
        traces = exact_to_float(exact_column_sums(diag))
        stored = np.asarray(meta["traces"], dtype=np.float64)
        if not np.array_equal(traces, stored):
            i = int(np.flatnonzero(traces != stored)[0])
            raise self._fail(
                f"metadata trace of kernel {i} ({stored[i]!r}) disagrees with its stored diagonal ({traces[i]!r})"
            )

    n_kernels = _meta_value("n_kernels", "The number of kernels (``m``).")
    chunk_kernels = _meta_value("chunk_kernels", "Kernels per chunk.")

    @property
    def kernel_names(self) -> list[str]:
        return list(self.meta["kernel_names"])

    @property
    def traces(self) -> np.ndarray:
        return np.asarray(self.meta["traces"], dtype=np.float64)

    @property
    def nbytes(self) -> int:
        """Size of the kernel array ``K`` (uncompressed)."""
        n = self.n_samples
        return self.n_kernels * n * n * 8

    def read_columns(self, j: int, rows: tuple[int, int], kernels: tuple[int, int]) -> np.ndarray:
        """``K_i[r, j]`` for ``r`` in ``rows`` and ``i`` in ``kernels``, as an ``(n_rows, n_kernels)`` array."""
        (r0, r1), (k0, k1) = rows, kernels
        block = self._read("K", (slice(k0, k1), int(j), slice(r0, r1)), f"column {j}")
        return np.ascontiguousarray(block.T)

    def read_diag(self, rows: tuple[int, int], kernels: tuple[int, int]) -> np.ndarray:
        (r0, r1), (k0, k1) = rows, kernels
        return np.ascontiguousarray(self._read("diag", (slice(k0, k1), slice(r0, r1)), "the diagonal").T)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        """Kernel blocks on kernel-tile boundaries (see :func:`mwumkl_dist.core.partition.chain_safe_ranges`)."""
        return chain_safe_ranges(self.n_kernels, n_blocks)

    def __repr__(self):
        return (
            f"KernelStore({self.path!r}: {self.n_kernels} kernels x {self.n_samples} x {self.n_samples}, "
            f"{self.nbytes / 2**30:.2f} GiB, chunks of {self.chunk_rows} rows)"
        )


def _column_block_size(m: int, n: int) -> int:
    return max(1, min(n, _WRITE_BLOCK_BYTES // max(1, m * n * 8)))


def write_kernel_store(
    path,
    y,
    *,
    K=None,
    X=None,
    kernels=None,
    chunk_rows: int = 1024,
    chunk_kernels: int | None = None,
    source=None,
    overwrite: bool = False,
    progress=None,
) -> KernelStore:
    """Write precomputed kernels to a new kernel store, block by block, and return it opened.

    Give either ``K`` (user kernels) or ``X`` and ``kernels`` (computed here,
    column block by column block: never the whole ``(m, n, n)`` in memory).

    Parameters
    ----------
    path : str or path-like
        The store directory to create.
    y : array-like of shape (n,)
        Training labels.
    K : array-like of shape (m, n, n), a sequence of m arrays of shape (n, n), or a dict of them by name
        Kernel matrices, e.g. ``np.load(file, mmap_mode="r")``; ``K[i][r, j] = K_i(x_r, x_j)``.
        Read one block of columns at a time.  A dict names its kernels (in its order; else
        ``precomputed[i]``).
    X : array-like or sparse matrix of shape (n, d)
        Training features, with ``kernels`` (a spec string or kernel objects, see :class:`KernelSet`).
    chunk_rows : int, default=1024
        ``R``: rows per chunk; row shards follow these chunks.
    chunk_kernels : int or None
        Kernels per chunk (default: all ``m``, so a shard reads one chunk per column).
    source : path or None
        The file the data came from (its SHA-256 goes into the metadata).
    overwrite : bool, default=False
        Replace an existing store at ``path``.
    progress : callable or None
        Called as ``progress(columns_done, n)`` after each block.
    """
    path = os.fspath(path)
    if (K is None) == (X is None):
        raise ValueError("give either K (precomputed kernel arrays) or X with kernels")
    _check_positive_arg("chunk_rows", chunk_rows)
    _check_positive_arg("chunk_kernels", chunk_kernels)
    codes, classes, label_dtype = _encode_labels(y)
    n = len(codes)
    names, columns, n_features, sha = _kernel_source(K, X, kernels, codes)
    m = len(names)
    if n < 1 or m < 1:
        raise ValueError("need at least one point and one kernel")
    mc = m if chunk_kernels is None else min(int(chunk_kernels), m)
    R = min(int(chunk_rows), n)  # a chunk longer than the data would be allocated whole
    _prepare_output(path, overwrite)
    if source is not None:
        sha = _sha256_file(os.fspath(source))
    hasher = hashlib.sha256() if sha is None else None
    # Written in a temporary directory and moved to `path` when complete (metadata last): a failed
    # write leaves no half-written store behind, and an older store at `path` as it was.
    with _writing(path, overwrite, "kernel store") as writer:
        group = writer.group
        diag = _write_kernel_columns(group, columns, (m, n, mc, R), hasher, progress)
        _create(group, "y", (n,), (R,), np.int32, compress=True)[:] = codes
        traces = exact_to_float(exact_column_sums(diag.T)).tolist()
        shape = {"n_kernels": m, "n_features": n_features, "kernel_names": names, "traces": traces}
        chunks = {"chunk_kernels": mc, "layout": "K[i, j, r] = K_i(x_r, x_j) (column j of kernel i)"}
        sha = sha if sha is not None else hasher.hexdigest()
        writer.finish(_store_meta(KERNEL_FORMAT, n, (classes, label_dtype), R, source, sha, shape, chunks))
    return KernelStore(path)


def _kernel_source(K, X, kernels, codes):
    """``(names, columns, n_features, sha)``: the kernels' names, a column-block reader or evaluator, the number of
    features (None for user kernels) and the SHA-256 of the features and labels (None: hashed as written)."""
    n = len(codes)
    if K is not None:
        names, columns = _given_kernel_columns(K, n)
        return names, columns, None, None
    names, columns, Xc = _computed_kernel_columns(X, kernels, n)
    return names, columns, Xc.shape[1], _sha256_arrays(Xc.indptr, Xc.indices, Xc.data, codes)


def _given_kernel_columns(K, n: int):
    """Names and a column-block reader of user kernels ``K`` (``(m, n, n)``, ``m`` arrays ``(n, n)`` or a dict of
    them by name)."""
    kernel_names = list(K) if isinstance(K, dict) else None
    K = list(K.values()) if isinstance(K, dict) else K
    mats = [K[i] for i in range(len(K))] if not hasattr(K, "ndim") or K.ndim == 3 else None
    if mats is None:
        raise ValueError(f"K must be (m, n, n) or a sequence of (n, n) arrays, got shape {K.shape}")
    for i, k in enumerate(mats):
        if getattr(k, "ndim", None) != 2 or tuple(k.shape) != (n, n):
            shape = getattr(k, "shape", None)
            raise ValueError(f"kernel {i} has shape {shape}, expected ({n}, {n}) for {n} labels")
    m = len(mats)
    names = [f"precomputed[{i}]" for i in range(m)] if kernel_names is None else [str(k) for k in kernel_names]

    def columns(c0, c1):  # (m, c1 - c0, n): columns c0..c1-1 of each kernel
        out = np.empty((m, c1 - c0, n))
        for i, k in enumerate(mats):
            out[i] = np.asarray(k[:, c0:c1], dtype=np.float64).T
        return out

    return names, columns


def _computed_kernel_columns(X, kernels, n: int):
    """Names, a column-block evaluator and the CSR rows of ``kernels`` on features ``X``."""
    if kernels is None:
        raise ValueError("X needs kernels (a spec string or kernel objects)")
    if isinstance(kernels, str) and kernels.strip().lower() == "precomputed":
        raise ValueError("kernels='precomputed' cannot be computed from X; pass K instead")
    Xc = as_csr(X)
    if not np.all(np.isfinite(Xc.data)):
        raise ValueError("features contain NaN or infinity")
    if Xc.shape[0] != n:
        raise ValueError(f"{Xc.shape[0]} rows but {n} labels")
    kernel_set = KernelSet(kernels, Xc.shape[1], scale=lambda: data_scale([Xc], Xc.shape[1]))
    plan = kernel_set.plan
    row_sq = row_group_sqnorms(Xc, plan)  # once for all column blocks

    def columns(c0, c1):
        return kernel_column_block(Xc, plan, c0, c1, row_sq)

    return kernel_set.names(), columns, Xc


def _write_kernel_columns(group, columns, sizes, hasher, progress) -> np.ndarray:
    """Write ``K`` one block of columns at a time, then ``diag``; returns the diagonal ``(m, n)``."""
    m, n, mc, R = sizes
    Ka = _create(group, "K", (m, n, n), (mc, 1, R), np.float64, compress=False)
    diag = np.empty((m, n))
    B = _column_block_size(m, n)
    for c0 in range(0, n, B):
        c1 = min(n, c0 + B)
        block = columns(c0, c1)
        if not np.all(np.isfinite(block)):
            raise ValueError(f"kernel values of columns {c0}..{c1 - 1} contain NaN or infinity")
        idx = np.arange(c0, c1)
        diag[:, c0:c1] = block[:, idx - c0, idx]
        if hasher is not None:
            hasher.update(block.tobytes())
        Ka[:, c0:c1, :] = block
        if progress is not None:
            progress(c1, n)
    _create(group, "diag", (m, n), (mc, R), np.float64, compress=False)[:] = diag
    return diag


def open_kernel_store(path, *, cache_bytes: int = DEFAULT_CACHE_BYTES, verify: bool = True) -> KernelStore:
    """Open and validate a kernel store (see :class:`KernelStore`)."""
    return KernelStore(path, cache_bytes=cache_bytes, verify=verify)


def open_store(path, **kwargs) -> DataStore | KernelStore:
    """Open a data or kernel store, whichever ``path`` holds."""
    path = os.fspath(path)
    meta_file = os.path.join(path, "zarr.json")
    fmt = None
    if (
        os.path.isfile(meta_file)
        and not os.path.islink(meta_file)
        and os.path.getsize(meta_file) <= _MAX_META_FILE_BYTES
    ):
        try:
            with open(meta_file, encoding="utf-8") as fh:
                fmt = (json.load(fh).get("attributes") or {}).get(_ATTR, {}).get("format")
        except (OSError, ValueError, AttributeError, RecursionError):
            fmt = None
    if fmt == KERNEL_FORMAT:
        return KernelStore(path, **kwargs)
    kwargs.pop("cache_bytes", None)
    return DataStore(path, **kwargs)  # reports what is wrong with anything else


def as_store(X) -> DataStore | KernelStore | None:
    """``X`` when it is a store object, else None."""
    return X if isinstance(X, (DataStore, KernelStore)) else None

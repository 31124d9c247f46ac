"""The ``store`` commands of ``mwumkl-dist``: ``store data``, ``store kernels`` and ``store info``.

Handlers raise ``ValueError`` / ``OSError`` with one-line messages (printed by
:func:`mwumkl_dist.cli.main` as ``mwumkl-dist: error: ...``).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from mwumkl_dist.cli.args import PROG, ZERO_BASED, CommandError, existing_file
from mwumkl_dist.cli.progress import COMPILING_NOTE, numba_cache_is_cold, progress_bar
from mwumkl_dist.io.files import load_data
from mwumkl_dist.io.zarr_format import StoreError, open_store, write_data_store, write_kernel_store

__all__ = [
    "cmd_store_data",
    "cmd_store_kernels",
    "cmd_store_info",
    "load_labels",
    "read_npy_kernels",
]


def cmd_store_usage(args) -> int:
    raise ValueError("choose what to store: 'store data', 'store kernels' or 'store info'")


def _check_output(args) -> None:
    """``--output`` must not exist unless ``--overwrite`` (said in the command line's words, before any work)."""
    if os.path.lexists(args.output) and not args.overwrite:
        raise CommandError(f"--output {args.output}: already exists; choose another path, or pass --overwrite")


def cmd_store_data(args) -> int:
    """``store data``: load a data file and write it to a data store."""
    _check_output(args)
    X, y = load_data(existing_file(args.input, "--input"), zero_based=ZERO_BASED[args.zero_based])
    store = write_data_store(
        args.output, X, y, chunk_rows=args.chunk_rows, source=args.input, overwrite=args.overwrite,
        compress=args.compress,
    )  # fmt: skip
    kind = "CSR" if store.sparse else "dense"
    print(
        f"data store written to {store.path}: {store.n_samples} points, {store.n_features} features, {kind}, "
        f"{len(store.classes)} classes, chunks of {store.chunk_rows} rows"
    )
    _print_integrity(store)
    return 0


def load_labels(path: str) -> np.ndarray:
    """Labels from a 1-d ``.npy`` array or a text file, one per line (numbers where they all are)."""
    if path.endswith(".npy"):
        y = np.load(path, allow_pickle=False)
    else:
        with open(path, encoding="utf-8") as fh:
            y = np.asarray([line.strip() for line in fh if line.strip()])
        try:
            y = y.astype(np.float64)
        except ValueError:
            pass
    if y.ndim != 1:
        raise ValueError(f"{path}: labels must be a 1-d array, got shape {y.shape}")
    return y


def read_npy_kernels(paths) -> tuple[list, list[str]]:
    """The (n, n) matrices of ``--npy`` files (memory-mapped) and their names."""
    mats, names = [], []
    for f in paths:
        try:
            arr = np.load(f, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{f}: cannot read as a .npy array ({exc})") from None
        if arr.ndim == 2:
            mats.append(arr)
            names.append(os.path.basename(f))
        elif arr.ndim == 3:
            mats.extend(arr[i] for i in range(arr.shape[0]))
            names.extend(f"{os.path.basename(f)}[{i}]" for i in range(arr.shape[0]))
        else:
            raise ValueError(f"{f}: expected an (n, n) or (m, n, n) array, got shape {arr.shape}")
    return mats, names


class _ColumnProgress:
    """``progress(done, total)`` of :func:`write_kernel_store` as a progress bar (created at the first call)."""

    def __init__(self):
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = progress_bar(total, unit="columns")
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_store_kernels(args) -> int:
    """``store kernels``: compute kernels from data, or copy .npy kernels, into a kernel store."""
    if args.input is not None:
        if args.labels is not None:
            raise ValueError("--labels goes with --npy; --input files carry their labels")
        if not args.kernels:
            raise ValueError("--input needs --kernels (e.g. --kernels paper)")
    else:
        if args.kernels is not None:
            raise ValueError("--kernels goes with --input; .npy kernels are already computed")
        if args.labels is None:
            raise ValueError("--npy needs --labels FILE")
    _check_output(args)
    progress = _ColumnProgress()
    try:
        if args.input is not None:
            X, y = load_data(existing_file(args.input, "--input"), zero_based=ZERO_BASED[args.zero_based])
            if numba_cache_is_cold():  # the kernels' columns compile first, silently for a minute: say so
                print(f"{PROG}: {COMPILING_NOTE}", file=sys.stderr, flush=True)
            store = write_kernel_store(
                args.output, y, X=X, kernels=args.kernels, chunk_rows=args.chunk_rows,
                chunk_kernels=args.chunk_kernels, source=args.input, overwrite=args.overwrite, progress=progress,
            )  # fmt: skip
        else:
            mats, names = read_npy_kernels(args.npy)
            if len(set(names)) < len(names):
                raise ValueError(f"--npy: two files give their kernels the same name ({names}); rename one")
            store = write_kernel_store(
                args.output, load_labels(args.labels), K=dict(zip(names, mats)), chunk_rows=args.chunk_rows,
                chunk_kernels=args.chunk_kernels, overwrite=args.overwrite, progress=progress,
            )  # fmt: skip
    finally:
        progress.close()
    print(
        f"kernel store written to {store.path}: {store.n_kernels} kernels on {store.n_samples} points "
        f"({store.nbytes / 2**20:.1f} MiB), chunks of {store.chunk_rows} rows"
    )
    _print_integrity(store)
    return 0


def _report_bad_chunks(path) -> None:
    """When a store fails to open, list all its bad chunks if some are (else the caller's error stands)."""
    try:
        store = open_store(path, verify=False)
    except (StoreError, OSError):
        return
    try:
        store.check_chunks()
    except StoreError as exc:
        raise exc from None
    except (ValueError, OSError):
        return


def cmd_store_info(args) -> int:
    """``store info``: validate a store, print its metadata, and check every chunk (content and position)."""
    try:
        store = open_store(args.path)
    except StoreError:
        _report_bad_chunks(args.path)
        raise
    print(repr(store))
    for key, value in store.meta.items():
        if key == "kernel_names" and len(value) > 12:
            value = value[:12] + [f"... {len(value) - 12} more"]
        if key in ("chunk_digests", "array_metadata"):  # SHA-256 per array: long and of no use to read
            value = f"{len(value)} arrays ({', '.join(value)})"
        if key == "integrity":  # printed last, on its own line
            continue
        print(f"  {key}: {value}")
    sys.stdout.flush()
    n_checked = store.check_chunks()  # raises, listing the bad chunks
    if store.meta.get("store_id") is None:
        print(
            f"chunks: {n_checked} checked (content checksums); chunk positions cannot be checked in this store "
            f"format ({store.meta['format_version']}): re-create the store to have them checked"
        )
    else:
        print(f"chunks: {n_checked} checked: every chunk's content and position match its record")
    _print_integrity(store)
    return 0


def _print_integrity(store) -> None:
    """The store's integrity record: one value over its metadata and every chunk's record (format 3)."""
    record = store.meta.get("integrity")
    if record is not None:
        print(
            f"integrity: {record} (the same value as when the store was written, kept where the store's "
            "writers cannot change it, proves it is that store; see docs/reliability.md)"
        )

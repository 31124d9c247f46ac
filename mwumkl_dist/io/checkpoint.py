"""Driver checkpoints: enough to resume a fit exactly, in one small ``.npz`` file.

The shards' ``O(m n)`` state is not saved: ``V`` follows from the data and
the log of picks (replaying them rebuilds it bit for bit), so a checkpoint
holds the iteration, ``s``, the picks, the current candidates, the finished
one-vs-rest problems (with their training decision values, where the solve scored rows) and a
fingerprint of the data, kernels and settings that a resume checks before it trusts the file.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.core.mwu_rules import Candidate, MWUResult, SolverState
from mwumkl_dist.io.atomic import atomic_file

__all__ = ["fingerprint", "save_checkpoint", "load_checkpoint", "Checkpointer"]

_FORMAT = "mwumkl_dist-checkpoint"
_VERSION = 1


def fingerprint(X, y, kernel_names, settings: dict) -> str:
    """A hash of the training data, labels, kernels and solver settings."""
    h = hashlib.sha256()
    if sp.issparse(X):
        X = X.tocsr()
        for arr in (X.indptr, X.indices, X.data):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(repr(X.shape).encode())
    else:
        X = np.ascontiguousarray(X)
        h.update(X.tobytes())
        h.update(repr(X.shape).encode())
    h.update(np.asarray(y).astype(str).tobytes())
    h.update(json.dumps([list(kernel_names), settings], sort_keys=True, default=str).encode())
    return h.hexdigest()


def _candidate_arrays(prefix: str, c: Candidate) -> dict:
    return {f"{prefix}_index": np.int64(c.index), f"{prefix}_g": np.float64(c.g), f"{prefix}_v": c.v_row}


def save_checkpoint(path, *, fp: str, problem_index: int, state: SolverState, picks, finished) -> None:
    """Write a checkpoint atomically (a crash or a failed write leaves the previous one intact).

    A failed write raises :class:`mwumkl_dist.io.atomic.WriteError` (an ``OSError``) naming ``path``.
    """
    path = os.fspath(path)
    arrays = {
        "s": state.s,
        "picks": np.asarray(picks, dtype=np.int64).reshape(-1, 2),
        **_candidate_arrays("pos", state.pos),
        **_candidate_arrays("neg", state.neg),
    }
    for k, r in enumerate(finished):
        arrays.update({f"done{k}_alpha": r.alpha, f"done{k}_weights": r.kernel_weights, f"done{k}_s": r.s})
        if r.scored_rows is not None:  # its training decision values: a resumed fit checks its bias on the same
            arrays.update({f"done{k}_scored_rows": r.scored_rows, f"done{k}_scores": r.scores})
    meta = {
        "format": _FORMAT,
        "version": _VERSION,
        "fingerprint": fp,
        "problem_index": problem_index,
        "iteration": state.iteration,
        "finished": [{"bias": r.bias, "n_iter": r.n_iter, "interrupted": r.interrupted} for r in finished],
    }
    with atomic_file(path, "checkpoint") as fh:
        np.savez(fh, __meta__=np.array(json.dumps(meta)), **arrays)


def _damaged(path: str, reason) -> ValueError:
    """The one message every unreadable or damaged checkpoint gets."""
    return ValueError(
        f"{path}: not a readable mwumkl_dist checkpoint (damaged or not a checkpoint: {reason}); "
        "delete it to start the fit afresh, or resume from another checkpoint"
    )


def load_checkpoint(path, fp: str) -> dict:
    """Read a checkpoint and check it belongs to this fit (same data, kernels and settings).

    A file that cannot be read in full (not an ``.npz`` archive, truncated, a
    member whose CRC does not match, metadata or arrays missing) raises one
    ``ValueError``: ``"PATH: not a readable mwumkl_dist checkpoint (...)"``.
    A checkpoint of another fit raises ``ValueError`` saying so.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        # Every member read now, inside this try: np.load reads lazily, and a damaged member
        # (bad CRC: zipfile.BadZipFile; bad deflate data: zlib.error) fails only when read.
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["__meta__"]))
            arrays = {name: data[name] for name in data.files if name != "__meta__"}
    except Exception as exc:  # BadZipFile, zlib.error, OSError, EOFError, ValueError, KeyError, ...
        raise _damaged(path, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a mwumkl_dist checkpoint")
    if meta.get("version", 0) > _VERSION:
        raise ValueError(f"{path}: checkpoint version {meta['version']} is newer than this package reads")
    if meta.get("fingerprint") != fp:
        raise ValueError(
            f"{path}: checkpoint was written for different data, labels, kernels or settings; "
            "refusing to resume from it"
        )
    try:
        finished = [
            MWUResult(
                arrays[f"done{k}_alpha"],
                arrays[f"done{k}_weights"],
                f["bias"],
                f["n_iter"],
                arrays[f"done{k}_s"],
                f["interrupted"],
                arrays.get(f"done{k}_scored_rows"),  # absent when not scored (and in older checkpoints)
                arrays.get(f"done{k}_scores"),
            )
            for k, f in enumerate(meta["finished"])
        ]
        return {
            "problem_index": int(meta["problem_index"]),
            "iteration": int(meta["iteration"]),
            "s": arrays["s"],
            "picks": [tuple(p) for p in arrays["picks"].tolist()],
            "pos": (int(arrays["pos_index"]), float(arrays["pos_g"]), arrays["pos_v"]),
            "neg": (int(arrays["neg_index"]), float(arrays["neg_g"]), arrays["neg_v"]),
            "finished": finished,
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise _damaged(path, f"missing or bad entry {exc}") from None


class Checkpointer:
    """Saves the solver state every ``every`` iterations (an ``on_state`` hook for :func:`mwu.solve`)."""

    def __init__(self, path, every: int, fp: str, problem_index: int, finished):
        self.path, self.every, self.fp = path, int(every), fp
        self.problem_index, self.finished = problem_index, finished

    def __call__(self, state: SolverState) -> None:
        if state.iteration % self.every == 0:
            self.save(state)

    def save(self, state: SolverState) -> None:
        save_checkpoint(
            self.path,
            fp=self.fp,
            problem_index=self.problem_index,
            state=state,
            picks=state.picks,
            finished=self.finished,
        )

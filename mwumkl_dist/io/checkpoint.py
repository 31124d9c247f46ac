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
from mwumkl_dist.io.atomic import atomic_file, is_npz_with_meta

__all__ = ["fingerprint", "save_checkpoint", "load_checkpoint", "check_resumable", "Checkpointer", "is_checkpoint_file"]

_FORMAT = "mwumkl_dist-checkpoint"
#: Version 2 added ``state_sha256``: a digest of the whole state, checked before it is used.
_VERSION = 2


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


def is_checkpoint_file(path) -> bool:
    """Whether ``path`` looks like a checkpoint of this package (an ``.npz`` archive with its members; unread)."""
    return is_npz_with_meta(os.fspath(path), "picks")


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
    arrays = {name: np.asarray(a) for name, a in arrays.items()}
    meta["state_sha256"] = _state_digest(meta, arrays)
    with atomic_file(path, "checkpoint", is_ours=is_checkpoint_file) as fh:
        np.savez(fh, __meta__=np.array(json.dumps(meta)), **arrays)


def _state_digest(meta: dict, arrays: dict) -> str:
    """SHA-256 of the metadata (but this digest) and every array: what a resume trusts, bound to the fingerprint.

    It detects a checkpoint altered by hand or by accident; it is no signature (whoever can write the
    file can recompute it), so :func:`check_resumable` also checks that the state itself is possible.
    """
    h = hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "state_sha256"}, sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


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
    version = meta.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise _damaged(path, f"version {version!r}")
    if version > _VERSION:
        raise ValueError(f"{path}: checkpoint version {meta['version']} is newer than this package reads")
    if meta.get("fingerprint") != fp:
        raise ValueError(
            f"{path}: checkpoint was written for different data, labels, kernels or settings; "
            "refusing to resume from it"
        )
    if version >= 2 and meta.get("state_sha256") != _state_digest(meta, arrays):
        raise ValueError(
            f"{path}: the checkpoint's content does not match its digest (altered after it was written); "
            "refusing to resume from it: delete it to start the fit afresh"
        )
    try:
        _check_kinds(arrays)
        if not isinstance(meta["finished"], list) or not all(isinstance(f, dict) for f in meta["finished"]):
            raise TypeError("'finished' must be a list of mappings")
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
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise _damaged(path, f"missing or bad entry {exc}") from None


#: The kind of number (and number of axes) each array of a checkpoint holds; ``done*`` arrays by their suffix.
_KINDS = {
    "picks": ("iu", 2), "s": ("f", 1), "pos_index": ("iu", 0), "neg_index": ("iu", 0), "pos_g": ("f", 0),
    "neg_g": ("f", 0), "pos_v": ("f", 1), "neg_v": ("f", 1), "alpha": ("f", 1), "weights": ("f", 1),
    "scored_rows": ("iu", 1), "scores": ("f", 1),
}  # fmt: skip


def _check_kinds(arrays: dict) -> None:
    """Each array of the kind and number of axes it has in a checkpoint (no text parsed as numbers); ``TypeError``."""
    for name, a in arrays.items():
        key = name.split("_", 1)[1] if name.startswith("done") else name
        if key not in _KINDS:
            raise TypeError(f"unexpected array {name!r}")
        kinds, ndim = _KINDS[key]
        if a.dtype.kind not in kinds or a.ndim != ndim or (name == "picks" and a.shape[1] != 2):
            raise TypeError(f"array {name!r} of dtype {a.dtype} and shape {a.shape}")


def _finite(a) -> bool:
    a = np.asarray(a)
    return a.dtype.kind in "iuf" and bool(np.all(np.isfinite(a)))


def check_resumable(path, saved: dict, *, n_samples: int, n_kernels: int, n_problems: int, n_iter: int,
                    y=None, targets=None) -> None:  # fmt: skip
    """Check that a checkpoint's state is one this fit can be in; a ``ValueError`` naming ``path`` if not.

    The state read by :func:`load_checkpoint`: the one-vs-rest problem in range and as many finished before
    it, ``0 < iteration <= n_iter`` with one pair of picks per iteration, every pick a row of its class
    (``y == targets[problem]`` for the first of each pair, else the second), ``s`` and the candidates
    finite and of ``n_kernels`` values, the finished problems' arrays finite and of the right shapes.
    """
    problem, t, picks = saved["problem_index"], saved["iteration"], saved["picks"]

    def bad(reason: str) -> ValueError:
        return ValueError(f"{path}: the checkpoint's state is not one of this fit ({reason}); refusing to resume "
                          "from it: delete it to start the fit afresh")  # fmt: skip

    if not 0 <= problem < n_problems or len(saved["finished"]) != problem:
        raise bad(f"problem {problem} after {len(saved['finished'])} finished, of {n_problems} problems")
    if not 0 < t <= n_iter:
        raise bad(f"iteration {t}, the fit runs 1 to {n_iter}")
    pairs = np.asarray(picks, dtype=np.int64).reshape(-1, 2)
    if len(pairs) != t:
        raise bad(f"{len(pairs)} pairs of picks for {t} iterations")
    if pairs.size and (pairs.min() < 0 or pairs.max() >= n_samples):
        raise bad(f"a pick outside the {n_samples} training points")
    for side, candidate in (("positive", saved["pos"]), ("negative", saved["neg"])):
        index, g, v = candidate
        if not 0 <= index < n_samples or not np.isfinite(g) or np.shape(v) != (n_kernels,) or not _finite(v):
            raise bad(f"the {side} candidate (row {index}) is not a finite state of {n_kernels} kernels")
    s = saved["s"]
    if np.shape(s) != (n_kernels,) or not _finite(s) or np.any(np.asarray(s) < 0):
        raise bad(f"'s' must hold {n_kernels} finite non-negative values")
    if y is not None and targets is not None:
        positive = np.asarray(y) == targets[problem]
        firsts = np.append(pairs[:, 0], saved["pos"][0])
        seconds = np.append(pairs[:, 1], saved["neg"][0])
        if not positive[firsts].all() or positive[seconds].any():
            raise bad("a pick is not a row of its class")
    for k, r in enumerate(saved["finished"]):
        shapes = (np.shape(r.alpha), np.shape(r.kernel_weights), np.shape(r.s))
        if shapes != ((n_samples,), (n_kernels,), (n_kernels,)) or not all(
            _finite(a) for a in (r.alpha, r.kernel_weights, r.s, r.bias)
        ):
            raise bad(f"finished problem {k} is not {n_samples} finite values and {n_kernels} kernel weights")
        if not 0 < r.n_iter <= n_iter:
            raise bad(f"finished problem {k} ran {r.n_iter} iterations")


class Checkpointer:
    """Saves the solver state every ``every`` iterations (an ``on_state`` hook for :func:`mwu.solve`)."""

    def __init__(self, path, every: int, fp: str, problem_index: int, finished):
        self.path, self.every, self.fp = path, int(every), fp
        self.problem_index, self.finished = problem_index, finished

        self.last = None  # the latest state seen: saved when the fit is interrupted (save_last)

    def __call__(self, state: SolverState) -> None:
        self.last = state
        if state.iteration % self.every == 0:
            self.save(state)

    def save_last(self) -> None:
        """Save the latest state, unless it was saved already: an interrupted fit resumes where it stopped."""
        if self.last is not None and self.last.iteration % self.every != 0:
            self.save(self.last)

    def save(self, state: SolverState) -> None:
        save_checkpoint(
            self.path,
            fp=self.fp,
            problem_index=self.problem_index,
            state=state,
            picks=state.picks,
            finished=self.finished,
        )

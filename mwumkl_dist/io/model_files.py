"""Portable model files: a fitted estimator in one ``.npz`` file that loads without pickle.

The file holds the fitted arrays and one JSON string (``__meta__``) with the
parameters and the scalar attributes.  Callers may add their own arrays and
JSON metadata (e.g. the command line's feature scaling) with ``extra_arrays``
and ``extra_meta``; :func:`load_model_with_extra` gives them back.  The
estimator's ``save``, ``load`` and ``load_with_extra`` call these functions.  A file with
extras is written as format version 2, so an older reader, which would ignore
them, refuses it instead of predicting without them.
"""

from __future__ import annotations

import json
import math
import os
import re
import zipfile

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.core.version import __version__
from mwumkl_dist.io.atomic import atomic_file, check_output_path, is_npz_with_meta
from mwumkl_dist.io.files import FEATURES_PER_VALUE, MAX_FEATURES_FLOOR, read_npy_header
from mwumkl_dist.kernels.specs import BankKernelNames, KernelSet, RandomGaussianBank

__all__ = ["save_model", "load_model", "load_model_with_extra", "is_model_file", "FORMAT", "FORMAT_VERSION"]

FORMAT = "mwumkl_dist-model"
#: The newest format version this package reads; files without extras are written as version 1.
FORMAT_VERSION = 2
_EXTRA_PREFIX = "extra__"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Fitted arrays saved under their own names.
MODEL_ARRAYS = (
    "classes_",
    "kernel_weights_",
    "raw_kernel_weights_",
    "kernel_traces_",
    "support_",
    "dual_coef_",
    "intercept_",
)
#: Fitted arrays saved when the model has them (``probability=True``'s sigmoids).
OPTIONAL_ARRAYS = ("probA_", "probB_", "feature_scale_", "feature_offset_")


def _bank_meta(bank: RandomGaussianBank) -> dict:
    return {"n_kernels": bank.n_kernels, "subset_size": bank.subset_size, "seed": bank.seed, "sigmas": bank.sigmas}


def _saved_params(estimator) -> dict:
    """The estimator's parameters as JSON values (callables and clients are not saved)."""
    params = {k: v for k, v in estimator.get_params().items() if k not in ("callback", "client")}
    names = estimator.kernel_names_
    if not isinstance(params["kernels"], str):
        params["kernels"] = str(names.bank) if isinstance(names, BankKernelNames) else ",".join(names)
    for k in ("C", "epsilon", "rho"):
        if params[k] != "auto":
            params[k] = float(params[k])
    if not isinstance(params.get("selectivity", "auto"), str):
        value = float(params["selectivity"])
        params["selectivity"] = "exact" if np.isinf(value) else value
    if "random_state" in params and not isinstance(params["random_state"], (int, type(None))):
        params["random_state"] = None  # a RandomState object: its state is not saved
    if isinstance(params.get("class_weight"), dict):  # JSON keys are strings: keep the labels as [label, weight]
        params["class_weight"] = [[_json_label(k), float(v)] for k, v in params["class_weight"].items()]
    return {k: (None if (isinstance(v, float) and np.isinf(v)) else v) for k, v in params.items()}


def _json_label(label):
    return label.item() if isinstance(label, np.generic) else label


def _model_meta(estimator) -> dict:
    names = estimator.kernel_names_
    bank = names.bank if isinstance(names, BankKernelNames) else None
    return {
        "format": FORMAT,
        "format_version": 1,
        "package_version": __version__,
        "params": _saved_params(estimator),
        "C_is_inf": estimator.C != "auto" and bool(np.isinf(float(estimator.C))),
        "kernel_names": None if bank is not None else list(names),
        "kernel_bank": None if bank is None else _bank_meta(bank),
        "n_features_in": int(estimator.n_features_in_),
        "n_iter": np.asarray(estimator.n_iter_).tolist(),
        "interrupted": bool(estimator.interrupted_),
        "polished": bool(getattr(estimator, "polished_", False)),
        "polish_skipped_": getattr(estimator, "polish_skipped_", None),
        "C_": None if np.isinf(estimator.C_) else float(estimator.C_),
        "epsilon_": float(estimator.epsilon_),
        "feature_names_in": list(map(str, getattr(estimator, "feature_names_in_", []))) or None,
        "fit_warnings": list(getattr(estimator, "fit_warnings_", [])),
        "solver_": getattr(estimator, "solver_", "mwu"),
        "weight_points_": getattr(estimator, "weight_points_", None),
        "n_components_": np.asarray(estimator.n_components_).tolist() if hasattr(estimator, "n_components_") else None,
        "features_spilled_": getattr(estimator, "features_spilled_", None),
        "nystroem_residual_": (
            np.asarray(estimator.nystroem_residual_).tolist() if hasattr(estimator, "nystroem_residual_") else None
        ),
        "rank_stop_reason_": getattr(estimator, "rank_stop_reason_", None),
        "rank_path_": (
            [[int(r), float(e)] for r, e in estimator.rank_path_.items()] if hasattr(estimator, "rank_path_") else None
        ),
        "kernel_scale_": getattr(estimator, "kernel_scale_", None),
        # The search's choices and paths (its candidates are the solvers' business, a layer above: the estimator's
        # class says how they are written, see mwumkl_dist.solvers.candidates.search_to_json).
        **_search_hook(estimator, "_search_to_json", estimator),
    }


def _search_hook(estimator, name: str, argument) -> dict:
    hook = getattr(estimator, name, None)
    return {} if hook is None else hook(argument)


def _model_arrays(estimator, meta: dict) -> dict:
    arrays = {}
    for name in MODEL_ARRAYS:
        arr = np.asarray(getattr(estimator, name))
        if arr.dtype.kind == "O":
            arr = arr.astype(str)
        arrays[name] = arr
    for name in OPTIONAL_ARRAYS:
        if hasattr(estimator, name):
            arrays[name] = np.asarray(getattr(estimator, name), dtype=np.float64)
    sv = estimator.support_vectors_
    if sv is not None:
        if sp.issparse(sv):
            sv = sv.tocsr()
            arrays.update(sv_data=sv.data, sv_indices=sv.indices, sv_indptr=sv.indptr)
            meta["sv_sparse"] = True
        else:
            arrays["sv_dense"] = np.asarray(sv)
            meta["sv_sparse"] = False
    return arrays


def _extra_arrays(extra_arrays) -> dict:
    out = {}
    for name, value in (extra_arrays or {}).items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"extra array names must be identifiers, got {name!r}")
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufcU":
            raise TypeError(f"extra array {name!r} must hold numbers or strings, got dtype {arr.dtype}")
        out[_EXTRA_PREFIX + name] = arr
    return out


def is_model_file(path) -> bool:
    """Whether ``path`` looks like a model file of this package (an ``.npz`` archive with its members; unread)."""
    return is_npz_with_meta(os.fspath(path), "classes_")


def save_model(
    estimator, path, *, extra_arrays: dict | None = None, extra_meta: dict | None = None, overwrite: bool = False
) -> None:
    """Save a fitted estimator to ``path`` (a ``.npz`` file; no pickle needed to load).

    Parameters
    ----------
    estimator : MWUMKLClassifier
        A fitted estimator.  Callables (``callback``) and clients are not saved.
    path : str or path-like
    extra_arrays : dict of str to ndarray, optional
        The caller's own arrays (numbers or strings), stored next to the model's
        under identifier names; :func:`load_model_with_extra` returns them.
    extra_meta : dict, optional
        The caller's own JSON-serialisable metadata.
    overwrite : bool, default False
        Replace a file at ``path`` that is not a model file.  An older model file is always
        replaced; a symbolic link, a directory, a device node or a FIFO never is.

    Raises
    ------
    mwumkl_dist.io.atomic.WriteError
        The file could not be written (an ``OSError`` naming ``path``); a file
        already at ``path`` is left as it was.  :class:`~mwumkl_dist.io.atomic.UnsafePathError`
        (a ``WriteError``) when ``path`` is refused before anything is written.
    """
    check_output_path(path, "model file", is_ours=is_model_file, overwrite=overwrite)  # before the work
    meta = _model_meta(estimator)
    arrays = _model_arrays(estimator, meta)
    extras = _extra_arrays(extra_arrays)
    if extra_meta is not None and not isinstance(extra_meta, dict):
        raise TypeError(f"extra_meta must be a dict or None, got {type(extra_meta).__name__}")
    if extras or extra_meta:
        meta.update(format_version=2, extra_arrays=sorted(k[len(_EXTRA_PREFIX) :] for k in extras))
        meta["extra_meta"] = extra_meta or {}
    try:
        meta_arr = np.array(json.dumps(meta))
    except TypeError as exc:
        raise TypeError(f"extra_meta must be JSON-serialisable ({exc})") from None
    # Atomic: a failed write (full disk, file size limit, Ctrl-C) leaves the previous model file intact.
    with atomic_file(path, "model file", is_ours=is_model_file, overwrite=overwrite) as fh:
        np.savez_compressed(fh, __meta__=meta_arr, **arrays, **extras)


#: Largest metadata member read (JSON text); a model's metadata is a few KiB, feature names included.
_MAX_META_BYTES = 64 * 2**20
#: What reading a hostile archive or its JSON may raise besides ``ValueError`` (refused, never a traceback).
_BAD_CONTENT = (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, RecursionError)


def _read_meta(path: str, text: str) -> dict:
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _damaged(path, f"its metadata is not valid JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a mwumkl_dist model file")
    version = meta.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"{path}: not a valid mwumkl_dist model file (format_version {version!r})")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{path}: model format version {meta['format_version']} is newer than this "
            f"package supports ({FORMAT_VERSION}); upgrade mwumkl_dist"
        )
    return meta


def _damaged(path: str, reason: str) -> ValueError:
    """The one message of a model file that is an archive but cannot be read in full."""
    return ValueError(
        f"{path}: damaged or incomplete mwumkl_dist model file ({reason}); it was probably cut short "
        "while being written: fit and save the model again"
    )


def _invalid(path: str, reason: str) -> ValueError:
    """The one message of a model file that reads in full but does not hold a consistent model."""
    return ValueError(f"{path}: not a valid mwumkl_dist model file ({reason}); fit and save the model again")


def _member_header(path: str, zf, member: str):
    """``(shape, dtype)`` from the ``.npy`` header of archive member ``member``, checked against its size (unread)."""
    info = zf.getinfo(member)
    try:
        with zf.open(info) as fh:
            return read_npy_header(fh, info.file_size, f"member {member[:-4]!r}")
    except ValueError as exc:
        raise _damaged(path, str(exc)) from None


def _read_member(zf, member: str) -> np.ndarray:
    with zf.open(member) as fh:
        return np.lib.format.read_array(fh, allow_pickle=False)


def _expected_members(meta: dict) -> set[str]:
    """The arrays a model file with metadata ``meta`` may hold: anything else is refused unread."""
    names = set(MODEL_ARRAYS) | set(OPTIONAL_ARRAYS)
    if meta.get("sv_sparse") is True:
        names |= {"sv_data", "sv_indices", "sv_indptr"}
    elif meta.get("sv_sparse") is False:
        names.add("sv_dense")
    extras = meta.get("extra_arrays") or []
    if not isinstance(extras, list) or not all(isinstance(e, str) and _NAME.match(e) for e in extras):
        raise TypeError(f"metadata 'extra_arrays' must be a list of identifiers, got {extras!r}")
    return names | {_EXTRA_PREFIX + e for e in extras}


def _read_archive(path: str) -> tuple[dict, dict]:
    """``(meta, arrays)`` of the model archive at ``path``; members not of a model file are refused unread.

    Every header is read before any array: a member whose shape disagrees with the
    metadata (:func:`_check_declared_shapes`) is refused before its data is allocated.
    """
    try:
        zf = zipfile.ZipFile(path)
    except Exception as exc:  # BadZipFile, OSError, EOFError, NotImplementedError (a zip version it cannot read), ...
        raise ValueError(
            f"{path}: not a mwumkl_dist model file, or a truncated or damaged one ({type(exc).__name__}: {exc})"
        ) from None
    with zf:
        try:
            members = {}
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise _invalid(path, f"unexpected archive member {info.filename!r}")
                members[info.filename[:-4]] = info
            if "__meta__" not in members:
                raise ValueError(f"{path}: not a mwumkl_dist model file (no metadata)")
            shape, dtype = _member_header(path, zf, "__meta__.npy")
            if shape != () or dtype.kind != "U" or dtype.itemsize > _MAX_META_BYTES:
                raise _invalid(path, f"metadata of shape {shape} and dtype {dtype}")
            meta = _read_meta(path, str(_read_member(zf, "__meta__.npy")))
            expected = _expected_members(meta)
            unknown = sorted(set(members) - expected - {"__meta__"})
            if unknown:
                raise _invalid(path, f"unexpected archive member {unknown[0]!r}")
            headers = {name: _member_header(path, zf, name + ".npy") for name in members if name != "__meta__"}
            _check_declared_shapes(path, meta, headers)
            arrays = {name: _read_member(zf, name + ".npy") for name in headers}
        except ValueError as exc:
            if str(exc).startswith(path):
                raise
            raise _damaged(path, f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:  # BadZipFile, zlib.error, EOFError, OSError, ... (a damaged member)
            raise _damaged(path, f"{type(exc).__name__}: {exc}") from None
    return meta, arrays


def _positive_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _n_kernels(meta: dict) -> int:
    """The number of kernels the metadata names (its list, or its random bank's size)."""
    bank = meta.get("kernel_bank")
    if bank:
        if not isinstance(bank, dict) or not _positive_int(bank.get("n_kernels")):
            raise TypeError(f"metadata 'kernel_bank' must hold a positive 'n_kernels', got {bank!r}")
        return bank["n_kernels"]
    names = meta.get("kernel_names")
    if not isinstance(names, list) or not names or not all(isinstance(k, str) for k in names):
        raise TypeError("metadata 'kernel_names' must be a non-empty list of strings")
    return len(names)


def _check_declared_shapes(path: str, meta: dict, headers: dict) -> None:
    """Every member's declared shape is the one the metadata and the other members imply (none read yet)."""
    for name in MODEL_ARRAYS:
        if name not in headers:
            raise _damaged(path, f"entry {name!r} is missing")
    d = meta.get("n_features_in")
    if not _positive_int(d):
        raise _invalid(path, f"n_features_in must be a positive integer, got {d!r}")
    m = _n_kernels(meta)
    (classes_shape, _), (support_shape, _) = headers["classes_"], headers["support_"]
    if len(classes_shape) != 1 or classes_shape[0] < 2:
        raise _invalid(path, f"'classes_' has shape {classes_shape}: a classifier has two classes or more")
    if len(support_shape) != 1:
        raise _invalid(path, f"'support_' has shape {support_shape}, expected 1-d")
    n_classes, n_sv = classes_shape[0], support_shape[0]
    k = 1 if n_classes == 2 else n_classes  # binary problems: one, or one per class (one-vs-rest)
    weights = (m,) if k == 1 else (k, m)
    expected = {
        "kernel_weights_": weights, "raw_kernel_weights_": weights, "kernel_traces_": (m,),
        "dual_coef_": (k, n_sv), "intercept_": (k,), "probA_": (k,), "probB_": (k,),
        "sv_dense": (n_sv, d), "sv_indptr": (n_sv + 1,),
    }  # fmt: skip
    for name, (shape, dtype) in headers.items():
        if dtype.hasobject or dtype.kind not in "biufU" or (dtype.kind == "U" and name != "classes_"):
            if not (name.startswith(_EXTRA_PREFIX) and dtype.kind == "U"):
                raise _invalid(path, f"{name!r} has dtype {dtype}")
        if name in expected and shape != expected[name]:
            raise _invalid(path, f"{name!r} has shape {shape}, expected {expected[name]}")
    sv_names = {True: ("sv_indptr", "sv_indices", "sv_data"), False: ("sv_dense",)}.get(meta.get("sv_sparse"), ())
    for name in sv_names:
        if name not in headers:
            raise _damaged(path, f"entry {name!r} is missing")
    if ("probA_" in headers) != ("probB_" in headers):
        raise _invalid(path, "it holds only one of 'probA_' and 'probB_'")
    if meta.get("sv_sparse") is True:
        shapes = {headers[name][0] for name in ("sv_indices", "sv_data")}
        if len(shapes) != 1 or len(next(iter(shapes))) != 1 or next(iter(shapes))[0] > n_sv * d:
            raise _invalid(path, f"'sv_indices' and 'sv_data' must be 1-d of one length at most {n_sv} x {d}")
        # The feature count sizes what loading and predicting allocate; sparse support vectors do not bound
        # it, so it must be one the stored values can justify (the rule of the data files' indices).
        stored = sum(
            math.prod(shape) for name, (shape, _) in headers.items() if name.startswith(("sv_", _EXTRA_PREFIX))
        )
        limit = max(MAX_FEATURES_FLOOR, FEATURES_PER_VALUE * stored)
        if d > limit:
            raise _invalid(path, f"n_features_in {d} is far beyond its {stored} stored values (at most {limit})")


def _check_finite(path: str, arrays: dict, names) -> None:
    for name in names:
        a = arrays.get(name)
        if a is not None and a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
            raise _invalid(path, f"{name!r} holds NaN or infinity")


def _check_model_arrays(path: str, meta: dict, arrays: dict) -> None:
    """The arrays' values: finite, in range, and consistent with each other (their shapes are checked already)."""
    _check_finite(path, arrays, (*MODEL_ARRAYS, *OPTIONAL_ARRAYS, "sv_data", "sv_dense"))
    classes = arrays["classes_"]
    if len(np.unique(classes)) != len(classes):
        raise _invalid(path, "'classes_' lists a class twice")
    for name in ("kernel_weights_", "raw_kernel_weights_"):
        if np.any(arrays[name] < 0):
            raise _invalid(path, f"{name!r} holds a negative kernel weight")
    if not np.all(arrays["kernel_traces_"] > 0):
        raise _invalid(path, "'kernel_traces_' must be positive")
    support = arrays["support_"]
    if support.dtype.kind not in "iu" or (support.size and support.min() < 0):
        raise _invalid(path, "'support_' must hold non-negative integer row indices")
    params = meta.get("params")
    if isinstance(params, dict) and params.get("kernels") == "precomputed" and support.size:
        if support.max() >= meta["n_features_in"]:  # precomputed kernels: n_features_in is the training size
            raise _invalid(path, f"'support_' holds a row index outside the {meta['n_features_in']} training points")
    if "sv_indptr" in arrays:
        d = meta["n_features_in"]
        ptr, idx = arrays["sv_indptr"], arrays["sv_indices"]
        if ptr.dtype.kind not in "iu" or idx.dtype.kind not in "iu":
            raise _invalid(path, "'sv_indptr' and 'sv_indices' must hold integers")
        if ptr[0] != 0 or ptr[-1] != len(idx) or np.any(np.diff(ptr) < 0):
            raise _invalid(path, f"'sv_indptr' must rise from 0 to {len(idx)} (the number of stored values)")
        if idx.size and (idx.min() < 0 or idx.max() >= d):
            raise _invalid(path, f"'sv_indices' holds a feature index outside [0, {d})")


def _kernel_names(meta: dict):
    if meta.get("kernel_bank"):
        kb = meta["kernel_bank"]
        bank = RandomGaussianBank(kb["n_kernels"], kb["subset_size"], kb["seed"], tuple(kb["sigmas"]))
        return BankKernelNames(bank, meta["n_features_in"])
    return list(meta["kernel_names"])


def _support_vectors(meta: dict, data, n_features: int):
    if "sv_sparse" not in meta:
        return None
    if meta["sv_sparse"]:
        shape = (len(data["sv_indptr"]) - 1, n_features)
        return sp.csr_matrix((data["sv_data"], data["sv_indices"], data["sv_indptr"]), shape=shape)
    return data["sv_dense"]


def _estimator_from(cls, meta: dict, data):
    params = dict(meta["params"])
    if meta.get("C_is_inf"):
        params["C"] = np.inf
    params.setdefault("selectivity", "paper")  # a file from before the selectivity: the paper's rule
    if isinstance(params.get("class_weight"), list):
        params["class_weight"] = {label: weight for label, weight in params["class_weight"]}
    est = cls(**params)
    for name in MODEL_ARRAYS:
        setattr(est, name, data[name])
    for name in OPTIONAL_ARRAYS:
        if name in data:
            setattr(est, name, data[name])
    est.kernel_names_ = _kernel_names(meta)
    est.n_features_in_ = meta["n_features_in"]
    n_iter = meta["n_iter"]
    est.n_iter_ = n_iter if isinstance(n_iter, int) else np.asarray(n_iter)
    est.interrupted_ = meta["interrupted"]
    est.polished_ = bool(meta.get("polished", False))
    if meta.get("polish_skipped_") is not None:  # files from before it: the summary guesses the reason
        est.polish_skipped_ = str(meta["polish_skipped_"])
    if "epsilon_" in meta:
        est.C_ = np.inf if meta["C_"] is None else float(meta["C_"])
        est.epsilon_ = float(meta["epsilon_"])
    if meta.get("feature_names_in"):
        est.feature_names_in_ = np.asarray(meta["feature_names_in"], dtype=object)
    est.fit_warnings_ = list(meta.get("fit_warnings", []))
    est.solver_ = meta.get("solver_", "mwu")  # files from before the two-stage solver: MWU fits
    if meta.get("weight_points_") is not None:
        est.weight_points_ = int(meta["weight_points_"])
        n_components = meta["n_components_"]
        est.n_components_ = n_components if isinstance(n_components, int) else np.asarray(n_components)
        est.features_spilled_ = bool(meta.get("features_spilled_", False))
        residual = meta.get("nystroem_residual_")  # None in files from before the adaptive rank
        if residual is not None:
            est.nystroem_residual_ = float(residual) if isinstance(residual, float) else np.asarray(residual)
        if meta.get("rank_stop_reason_") is not None:  # None in files from before the validated rank
            est.rank_stop_reason_ = str(meta["rank_stop_reason_"])
        if meta.get("rank_path_") is not None:
            est.rank_path_ = {int(r): float(e) for r, e in meta["rank_path_"]}
    if meta.get("kernel_scale_") is not None:
        est.kernel_scale_ = float(meta["kernel_scale_"])
    for name, value in _search_hook(est, "_search_from_json", meta).items():  # choices, paths (older files: fewer)
        setattr(est, name, value)
    est.support_vectors_ = _support_vectors(meta, data, est.n_features_in_)
    return est


def load_model_with_extra(path, estimator_class):
    """Load a model written by :func:`save_model`, with the caller's extras.

    :meth:`MWUMKLClassifier.load_with_extra <mwumkl_dist.MWUMKLClassifier.load_with_extra>`
    calls this with its class.

    Parameters
    ----------
    path : str or path-like
    estimator_class : type
        The class to build (:class:`~mwumkl_dist.MWUMKLClassifier`).

    Returns
    -------
    estimator : MWUMKLClassifier
    extra_arrays : dict of str to ndarray
        Empty for a file saved without extras.
    extra_meta : dict
        Empty for a file saved without extras.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a model file")
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    if not os.path.isfile(path):  # a FIFO would block the reader, a device would be read without end
        raise ValueError(f"{path}: not a regular file, so not a mwumkl_dist model file")
    meta, data = _read_archive(path)
    try:
        extra_arrays = {name: data[_EXTRA_PREFIX + name] for name in meta.get("extra_arrays", [])}
    except KeyError as exc:  # an entry the metadata promises is not in the archive
        raise _damaged(path, f"entry {exc} is missing") from None
    _check_model_arrays(path, meta, data)
    try:
        est = _estimator_from(estimator_class, meta, data)
        _check_kernels(meta, est)
        extra_meta = meta.get("extra_meta") or {}
        if not isinstance(extra_meta, dict):
            raise TypeError(f"'extra_meta' must be a mapping, got {type(extra_meta).__name__}")
    except _BAD_CONTENT as exc:  # metadata of the wrong type, a kernel name that is no kernel, ...
        raise _invalid(path, f"{type(exc).__name__}: {exc}") from None
    return est, extra_arrays, dict(extra_meta)


def _check_kernels(meta: dict, est) -> None:
    """The model's kernels are kernels (bounded parameters, features in range) and its scalars are usable."""
    if est.kernels != "precomputed" and not isinstance(est.kernel_names_, BankKernelNames):
        KernelSet(list(est.kernel_names_), est.n_features_in_)
    if isinstance(est.n_iter_, np.ndarray) and est.n_iter_.dtype.kind not in "iu":
        raise TypeError("'n_iter' must hold integers")
    scale = getattr(est, "kernel_scale_", None)
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"'kernel_scale_' must be a positive finite number, got {scale!r}")
    factors, offsets = getattr(est, "feature_scale_", None), getattr(est, "feature_offset_", None)
    if (factors is None) != (offsets is None):
        raise ValueError("'feature_scale_' and 'feature_offset_' come together")
    if factors is not None and not (
        factors.shape == offsets.shape == (est.n_features_in_,)
        and np.all(np.isfinite(factors) & np.isfinite(offsets))
        and np.all(factors > 0)
    ):
        raise ValueError(f"'feature_scale_' and 'feature_offset_' must hold {est.n_features_in_} finite values each")


def load_model(path, estimator_class):
    """Load a model written by :func:`save_model` (its extras, if any, are not returned)."""
    return load_model_with_extra(path, estimator_class)[0]

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
import os
import re

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.core.version import __version__
from mwumkl_dist.io.atomic import atomic_file
from mwumkl_dist.kernels.specs import BankKernelNames, RandomGaussianBank

__all__ = ["save_model", "load_model", "load_model_with_extra", "FORMAT", "FORMAT_VERSION"]

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
OPTIONAL_ARRAYS = ("probA_", "probB_")


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
        "C_": None if np.isinf(estimator.C_) else float(estimator.C_),
        "epsilon_": float(estimator.epsilon_),
        "selectivity_": getattr(estimator, "selectivity_", "paper"),
        "feature_names_in": list(map(str, getattr(estimator, "feature_names_in_", []))) or None,
        "fit_warnings": list(getattr(estimator, "fit_warnings_", [])),
        "solver_": getattr(estimator, "solver_", "mwu"),
        "weight_points_": getattr(estimator, "weight_points_", None),
        "n_components_": np.asarray(estimator.n_components_).tolist() if hasattr(estimator, "n_components_") else None,
        "features_spilled_": getattr(estimator, "features_spilled_", None),
        "nystroem_residual_": (
            np.asarray(estimator.nystroem_residual_).tolist() if hasattr(estimator, "nystroem_residual_") else None
        ),
        "kernel_scale_": getattr(estimator, "kernel_scale_", None),
        "group_selection_": getattr(estimator, "group_selection_", None),
        "width_band_": getattr(estimator, "width_band_", None),
        "structure_": getattr(estimator, "structure_", None),
        "cross_validation_": getattr(estimator, "cross_validation_", None),
        "cv_paths": {name: _path_items(getattr(estimator, name)) for name in CV_PATHS if hasattr(estimator, name)},
    }


#: The cross-validation paths saved with a model (for its summary and pictures), by attribute.
CV_PATHS = ("C_path_", "selectivity_path_", "group_selection_path_", "width_band_path_", "final_C_path_")


def _path_items(path: dict) -> list:
    """A path as JSON: ``[[key, error], ...]``; a ``(candidate, C)`` key becomes ``[str(candidate), C]``."""
    out = []
    for key, error in path.items():
        if isinstance(key, tuple):
            key = [str(key[0]), float(key[1])]
        elif not isinstance(key, str):
            key = float(key)
        out.append([key, float(error)])
    return out


def _path_from_items(items) -> dict:
    """The path of :func:`_path_items` (group selections and bands keyed by their names)."""
    return {(tuple(key) if isinstance(key, list) else key): float(error) for key, error in items}


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


def save_model(estimator, path, *, extra_arrays: dict | None = None, extra_meta: dict | None = None) -> None:
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

    Raises
    ------
    mwumkl_dist.io.atomic.WriteError
        The file could not be written (an ``OSError`` naming ``path``); a file
        already at ``path`` is left as it was.
    """
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
    with atomic_file(path, "model file") as fh:
        np.savez_compressed(fh, __meta__=meta_arr, **arrays, **extras)


def _read_meta(path: str, data: dict) -> dict:
    if "__meta__" not in data:
        raise ValueError(f"{path}: not a mwumkl_dist model file (no metadata)")
    try:
        meta = json.loads(str(data["__meta__"]))
    except ValueError as exc:
        raise _damaged(path, f"its metadata is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a mwumkl_dist model file")
    if meta.get("format_version", 0) > FORMAT_VERSION:
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


def _read_members(path: str) -> dict:
    """Every array of the ``.npz`` archive at ``path``, read now (np.load reads lazily)."""
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:  # zip/format errors
        raise ValueError(
            f"{path}: not a mwumkl_dist model file, or a truncated or damaged one ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a mwumkl_dist model file (a .npy array, not an .npz archive)")
    with data:
        try:
            # A damaged member (bad CRC: zipfile.BadZipFile; bad deflate data: zlib.error) fails only when read.
            return {name: data[name] for name in data.files}
        except Exception as exc:  # BadZipFile, zlib.error, EOFError, OSError, ValueError, ...
            raise _damaged(path, f"{type(exc).__name__}: {exc}") from None


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
    if "epsilon_" in meta:
        est.C_ = np.inf if meta["C_"] is None else float(meta["C_"])
        est.epsilon_ = float(meta["epsilon_"])
    # Models saved before the selectivity existed were fitted with the paper's rule.
    est.selectivity_ = meta.get("selectivity_", "paper")
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
    if meta.get("kernel_scale_") is not None:
        est.kernel_scale_ = float(meta["kernel_scale_"])
    if meta.get("group_selection_") is not None:
        est.group_selection_ = dict(meta["group_selection_"])
    if meta.get("width_band_") is not None:
        est.width_band_ = dict(meta["width_band_"])
    if meta.get("structure_") is not None:
        est.structure_ = dict(meta["structure_"])
    if meta.get("cross_validation_"):
        est.cross_validation_ = dict(meta["cross_validation_"])
    for name, items in (meta.get("cv_paths") or {}).items():  # files from before them: none
        if name in CV_PATHS:
            setattr(est, name, _path_from_items(items))
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
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    data = _read_members(path)
    meta = _read_meta(path, data)
    try:
        est = _estimator_from(estimator_class, meta, data)
        extra_arrays = {name: data[_EXTRA_PREFIX + name] for name in meta.get("extra_arrays", [])}
    except KeyError as exc:  # an entry the metadata promises is not in the archive
        raise _damaged(path, f"entry {exc} is missing") from None
    return est, extra_arrays, dict(meta.get("extra_meta") or {})


def load_model(path, estimator_class):
    """Load a model written by :func:`save_model` (its extras, if any, are not returned)."""
    return load_model_with_extra(path, estimator_class)[0]

"""Reference models: fingerprints of many fits, to prove that a refactor keeps every model bit-identical.

Run it before and after a change and compare::

    python benchmarks/reference_models.py --out before.json
    # ... refactor ...
    python benchmarks/reference_models.py --out after.json --compare before.json

``--compare OTHER.json`` prints each configuration as ``same`` or ``DIFFERENT``
(naming what differs, with the largest difference of the decision values) and
exits with status 1 when any configuration differs or is missing on one side.
``--load FILE.json --compare OTHER.json`` compares two result files without
fitting anything.  ``--only PATTERN`` (fnmatch, repeatable) runs a subset and
compares only those configurations.  ``--list`` prints the configurations.

Every configuration is one named fit on small deterministic data
(``numpy.random.RandomState``).  For each it records

* the SHA-256 of every array of the model file written by the public
  ``MWUMKLClassifier.save`` (read back with ``np.load``; dtype, shape and bytes
  are hashed), and each JSON value of the file's metadata (long ones hashed);
  the package version is recorded, not compared;
* the SHA-256 of ``decision_function`` on held-out rows (as float64 bytes)
  and the values themselves (so a difference can be sized), and of
  ``predict_proba`` where ``probability=True``;
* a few fitted attributes the file does not hold (``C_path_``,
  ``selectivity_path_``, ``cache_info_``) and, for the store configurations,
  the SHA-256 of the store's chunk files and metadata (its ``created`` time left
  out).

Only public, stable API is used: ``MWUMKLClassifier`` (constructor parameters,
``fit``, ``decision_function``, ``predict_proba``, ``save``),
``write_data_store``, ``write_kernel_store``, ``open_store``,
``RandomGaussianBank`` and kernel spec strings, and ``distributed.LocalCluster``
/ ``Client``.  Nothing imports a module of the package by its internal path, so
the script survives a reorganisation of the package's modules.

The ``cuda_sim_*`` configurations fit with ``device="cuda"`` under numba's CUDA
simulator: ``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is imported, so
they run in a subprocess (this script with ``--cuda-sim-worker``).  Where the
simulator cannot run they are recorded as skipped with the reason (a skip on
one side only counts as a difference).

Besides the comparison, each run checks its own invariants: configurations
that the package documents as giving the same model (thread counts, shard
counts, engines, layouts, devices, stores against in-memory data) are
compared with each other, and the result is printed (``invariants``) and
stored in the output; this does not change the exit status.

Cost: about 2-4 minutes on 2 cores once numba's kernels are compiled (a fresh
checkout, or a refactor that moves the numba modules, compiles them first:
20-60 s more).  Threads: the default ``n_jobs`` (all cores) except where a
configuration sets it; the Dask configurations use one
``LocalCluster(n_workers=2, threads_per_worker=1, processes=False)``.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

#: Metadata values longer than this (as JSON) are recorded as their SHA-256.
_MAX_INLINE = 240
#: Metadata keys recorded but not compared (they describe the installation, not the model).
_INFO_META = ("package_version",)
#: Metadata keys that legitimately differ between configurations that give the same model.
_LAYOUT_META = ("params",)


# ----------------------------------------------------------------------------- data


def make_data(n, d, seed, labels=("no", "yes"), n_test=80, sparse_below=None, imbalance=None):
    """``(X_train, y_train, X_test)``: uniform features, labels from a noisy non-linear score.

    ``labels`` names the classes (their count sets the number of classes);
    ``sparse_below`` zeroes entries below it and returns CSR matrices;
    ``imbalance`` is the quantile below which points get the first label (binary only).
    """
    rng = np.random.RandomState(seed)
    X = rng.rand(n + n_test, d)
    score = np.sin(3.0 * X[:, 0]) + X[:, 1] ** 2 + 0.3 * rng.randn(n + n_test)
    k = len(labels)
    qs = [imbalance] if imbalance is not None else list(np.linspace(0.0, 1.0, k + 1)[1:-1])
    y = np.asarray(labels)[np.digitize(score, np.quantile(score, qs))]
    if sparse_below is not None:
        X = sp.csr_matrix(np.where(X >= sparse_below, X, 0.0))
    return X[:n], y[:n], X[n:]


def explicit_kernels(X, Z):
    """``(4, n_X, n_Z)`` kernels by plain numpy formulas: linear, poly:2, gaussian:0.5, gaussian:1."""
    lin = X @ Z.T
    d2 = np.maximum((X**2).sum(1)[:, None] + (Z**2).sum(1)[None, :] - 2.0 * lin, 0.0)
    return np.stack([lin, (lin + 1.0) ** 2, np.exp(-d2 / 0.5), np.exp(-d2 / 2.0)])


# ----------------------------------------------------------------------------- fingerprints


def sha_array(a) -> str:
    a = np.ascontiguousarray(np.asarray(a))
    if a.dtype.kind == "O":
        raise TypeError("object arrays are not hashed")
    h = hashlib.sha256(f"{a.dtype.str}|{a.shape}|".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def sha_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def inline(value):
    """``value`` itself when its JSON is short, else ``"sha256:..."``."""
    text = json.dumps(value, sort_keys=True)
    return value if len(text) <= _MAX_INLINE else "sha256:" + sha_json(value)


def plain(value):
    """A JSON-able copy of a fitted attribute (dicts, numpy scalars and arrays)."""
    if isinstance(value, dict):
        return {repr(k) if not isinstance(k, str) else k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def fingerprint_model(est, directory: str) -> tuple[dict, dict, dict]:
    """``(arrays, meta, info)``: hashes of the saved model file's arrays, its metadata values, and info."""
    path = os.path.join(directory, "model.npz")
    est.save(path)
    arrays, meta, info = {}, {}, {}
    with np.load(path, allow_pickle=False) as data:
        for name in sorted(data.files):
            if name == "__meta__":
                saved = json.loads(str(data[name]))
                for key in sorted(saved):
                    if key in _INFO_META:
                        info[key] = saved[key]
                    elif key == "params":
                        for pk, pv in sorted(saved[key].items()):
                            if pk == "checkpoint" and isinstance(pv, str):
                                pv = os.path.basename(pv)  # a file in this run's temporary folder
                            meta[f"params.{pk}"] = inline(pv)
                    else:
                        meta[key] = inline(saved[key])
            else:
                arrays[name] = sha_array(data[name])
    os.remove(path)
    return arrays, meta, info


def fingerprint_store(path: str) -> dict:
    """SHA-256 of a store's files (path relative to the store): chunk bytes and metadata without ``created``."""
    out = {}
    for root, _, files in os.walk(path):
        for name in sorted(files):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path)
            with open(full, "rb") as fh:
                raw = fh.read()
            if name.endswith(".json"):
                doc = json.loads(raw)
                _drop_key(doc, "created")
                out[rel] = sha_json(doc)
            else:
                out[rel] = hashlib.sha256(raw).hexdigest()
    return {"n_files": len(out), "sha256": sha_json(out)}


def _drop_key(doc, key):
    if isinstance(doc, dict):
        doc.pop(key, None)
        for v in doc.values():
            _drop_key(v, key)
    elif isinstance(doc, list):
        for v in doc:
            _drop_key(v, key)


def fingerprint(est, X_test, directory: str, proba: bool = False) -> dict:
    arrays, meta, info = fingerprint_model(est, directory)
    rec = {"model": arrays, "meta": meta, "info": info, "attrs": {}}
    scores = np.asarray(est.decision_function(X_test))
    rec["decision"] = {
        "sha256": sha_array(scores.astype(np.float64)),
        "dtype": scores.dtype.str,
        "values": scores.astype(np.float64).tolist(),
    }
    if proba:
        p = np.asarray(est.predict_proba(X_test))
        rec["proba"] = {"sha256": sha_array(p.astype(np.float64)), "dtype": p.dtype.str}
    for name in ("C_path_", "selectivity_path_", "cache_info_"):
        if hasattr(est, name):
            rec["attrs"][name] = plain(getattr(est, name))
    return rec


# ----------------------------------------------------------------------------- configurations


@dataclass
class Config:
    name: str
    build: object  # (ctx) -> (fitted estimator, X_test, extras dict)
    same_as: str | None = None  # a configuration documented to give the same model (an invariant)
    cuda_sim: bool = False
    proba: bool = False


CONFIGS: list[Config] = []


def config(name, same_as=None, cuda_sim=False, proba=False):
    def register(fn):
        CONFIGS.append(Config(name, fn, same_as, cuda_sim, proba))
        return fn

    return register


@dataclass
class Context:
    tmp: str
    _client: object = None
    _cluster: object = None
    extras: dict = field(default_factory=dict)

    def client(self):
        if self._client is None:
            from distributed import Client, LocalCluster

            self._cluster = LocalCluster(
                n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0", silence_logs=40
            )
            self._client = Client(self._cluster)
        return self._client

    def path(self, name):
        return os.path.join(self.tmp, name)

    def close(self):
        if self._client is not None:
            self._client.close()
            self._cluster.close()


def _clf(**params):
    from mwumkl_dist import MWUMKLClassifier

    return MWUMKLClassifier(**params)


#: The MWU algorithm alone (no cross-validated C or selectivity, no polish): the tests' solver settings.
LITERAL = dict(C=100.0, epsilon=0.3, polish=False, selectivity="paper")
#: The two-stage tests' settings.
TWO_STAGE = dict(C=10.0, solver="two-stage", kernels="poly:1,gaussian:0.5,gaussian:1,gaussian:2", n_jobs=1)
#: 192 kernels on 16 features: three kernel tiles, so kernel shards make up to three blocks.
PER_FEATURE = dict(kernels="paper-per-feature", **LITERAL)
#: A bank without squaring chains (no sigma is sqrt(2) times another): its kernels split into blocks anywhere.
NO_CHAIN_SIGMAS = (0.5, 0.8, 1.3, 2.1)


def _binary(n=300, d=5, seed=0, **kw):
    return make_data(n, d, seed, **kw)


def _multiclass(n=300, d=5, seed=1, **kw):
    return make_data(n, d, seed, labels=("a", "b", "c"), **kw)


# --- local, defaults ---------------------------------------------------------------------------------------


@config("default_binary")
def _(ctx):
    X, y, Xt = _binary()
    return _clf().fit(X, y), Xt


@config("default_multiclass")
def _(ctx):
    X, y, Xt = _multiclass()
    return _clf().fit(X, y), Xt


@config("default_sparse_csr")
def _(ctx):
    X, y, Xt = _binary(d=8, seed=2, sparse_below=0.5)
    return _clf().fit(X, y), Xt


@config("default_precomputed")
def _(ctx):
    rng = np.random.RandomState(3)
    X, Xt = rng.rand(200, 4), rng.rand(60, 4)
    y = np.where(X[:, 0] + X[:, 1] ** 2 + 0.3 * rng.randn(200) > 0.9, 1, -1)
    return _clf(kernels="precomputed").fit(explicit_kernels(X, X), y), explicit_kernels(Xt, X)


@config("default_sample_and_class_weight")
def _(ctx):
    X, y, Xt = _binary(seed=4, imbalance=0.75)
    w = np.random.RandomState(5).uniform(0.5, 2.0, len(y))
    w[::17] = 0.0  # weight 0: left out of the fit
    return _clf(class_weight="balanced").fit(X, y, sample_weight=w), Xt


@config("class_weight_dict_multiclass")
def _(ctx):
    X, y, Xt = _multiclass(seed=6)
    return _clf(C=1.0, class_weight={"a": 1.0, "b": 2.5, "c": 0.7}).fit(X, y), Xt


@config("default_probability", proba=True)
def _(ctx):
    X, y, Xt = _binary(seed=7)
    return _clf(probability=True).fit(X, y), Xt


@config("probability_multiclass", proba=True)
def _(ctx):
    X, y, Xt = _multiclass(seed=8)
    return _clf(C=1.0, probability=True).fit(X, y), Xt


@config("paper_algorithm")
def _(ctx):
    X, y, Xt = _binary(seed=9)
    return _clf(C=100.0, epsilon=0.2, scale_C=False, polish=False, selectivity="paper").fit(X, y), Xt


@config("selectivity_exact_polished")
def _(ctx):
    X, y, Xt = _binary(seed=10)
    return _clf(C=10.0, epsilon=0.3, selectivity="exact", polish=True).fit(X, y), Xt


@config("few_iterations_bias_guard")
def _(ctx):
    X, y, Xt = _binary(seed=11, imbalance=0.7)
    return _clf(C=1.0, max_iter=12, polish=False, selectivity=30.0).fit(X, y), Xt


@config("hard_margin")
def _(ctx):
    X, y, Xt = _binary(n=150, seed=12)
    return _clf(C=np.inf, epsilon=0.3, selectivity=100.0).fit(X, y), Xt


@config("kernel_specs_with_subsets_dataframe")
def _(ctx):
    import pandas as pd

    X, y, Xt = _binary(d=6, seed=13)
    cols = [f"f{i}" for i in range(6)]
    kernels = "linear,poly:2:coef0=0.5,poly:3,gaussian:2^0.5@0-2+4,paper@1-3"
    clf = _clf(kernels=kernels, C=10.0, selectivity=100.0)
    return clf.fit(pd.DataFrame(X, columns=cols), y), pd.DataFrame(Xt, columns=cols)


@config("paper_per_feature_default")
def _(ctx):
    X, y, Xt = _binary(n=200, d=4, seed=14)
    return _clf(kernels="paper-per-feature").fit(X, y), Xt


@config("checkpoint_resume_multiclass", same_as="checkpoint_reference_multiclass")
def _(ctx):
    X, y, Xt = _multiclass(n=150, seed=15)
    ckpt = ctx.path("fit.ckpt.npz")
    calls = {"n": 0}

    class Crash(Exception):
        pass

    def crash(info):
        calls["n"] += 1
        if calls["n"] == 5:  # inside the second one-vs-rest problem
            raise Crash

    with contextlib.suppress(Crash):
        _clf(**LITERAL, checkpoint=ckpt, checkpoint_every=7, callback=crash, callback_every=30).fit(X, y)
    if not os.path.exists(ckpt):
        raise RuntimeError("the interrupted fit wrote no checkpoint")
    return _clf(**LITERAL, checkpoint=ckpt, checkpoint_every=7).fit(X, y, resume=ckpt), Xt


@config("checkpoint_reference_multiclass")
def _(ctx):
    X, y, Xt = _multiclass(n=150, seed=15)
    return _clf(**LITERAL).fit(X, y), Xt


# --- threads and local row shards (one reference problem, also used by the Dask layouts) --------------------


def _per_feature_data():
    return make_data(160, 16, 20)


@config("per_feature_local")
def _(ctx):
    X, y, Xt = _per_feature_data()
    return _clf(**PER_FEATURE).fit(X, y), Xt


for _n_jobs in (1, 2, -1):

    @config(f"per_feature_n_jobs_{_n_jobs}", same_as="per_feature_local")
    def _(ctx, n_jobs=_n_jobs):
        X, y, Xt = _per_feature_data()
        return _clf(**PER_FEATURE, n_jobs=n_jobs).fit(X, y), Xt


@config("per_feature_local_shards_3", same_as="per_feature_local")
def _(ctx):
    X, y, Xt = _per_feature_data()
    return _clf(**PER_FEATURE, n_shards=3).fit(X, y), Xt


@config("default_n_jobs_1", same_as="default_binary")
def _(ctx):
    X, y, Xt = _binary()
    return _clf(n_jobs=1).fit(X, y), Xt


# --- solvers ---------------------------------------------------------------------------------------------


def _two_stage_data(n=700):
    return make_data(n, 5, 30, n_test=100)


@config("solver_mwu_700")
def _(ctx):
    X, y, Xt = _two_stage_data()
    return _clf(**{**TWO_STAGE, "solver": "mwu"}).fit(X, y), Xt


@config("solver_two_stage_700")
def _(ctx):
    X, y, Xt = _two_stage_data()
    return _clf(**TWO_STAGE).fit(X, y), Xt


@config("solver_two_stage_700_n_jobs_2", same_as="solver_two_stage_700")
def _(ctx):
    X, y, Xt = _two_stage_data()
    return _clf(**{**TWO_STAGE, "n_jobs": 2}).fit(X, y), Xt


@config("solver_two_stage_700_default_C")
def _(ctx):
    X, y, Xt = _two_stage_data()
    return _clf(solver="two-stage").fit(X, y), Xt


@config("two_stage_sparse_multiclass")
def _(ctx):
    X, y, Xt = make_data(500, 5, 31, labels=("a", "b", "c"), sparse_below=0.3)
    return _clf(**TWO_STAGE).fit(X, y), Xt


#: Above the automatic two-stage threshold (10000 rows) and over two of the linear stage's 8192-row blocks.
def _large_data():
    return make_data(10_000, 5, 32, n_test=200)


@config("solver_auto_10k")
def _(ctx):
    X, y, Xt = _large_data()
    params = {k: v for k, v in TWO_STAGE.items() if k != "solver"}
    return _clf(**params).fit(X, y), Xt


@config("two_stage_10k_shards_3", same_as="solver_auto_10k")
def _(ctx):
    X, y, Xt = _large_data()
    return _clf(**{**TWO_STAGE, "n_jobs": None}, n_shards=3).fit(X, y), Xt


# --- stores ----------------------------------------------------------------------------------------------


def _data_store(ctx, name, X, y, chunk_rows):
    from mwumkl_dist import open_store, write_data_store

    path = ctx.path(name)
    if not os.path.exists(path):
        write_data_store(path, X, y, chunk_rows=chunk_rows)
        ctx.extras.setdefault("stores", {})[name] = fingerprint_store(path)
    return open_store(path)


def _store_extras(ctx, name):
    return {"store": ctx.extras.get("stores", {}).get(name)}


@config("data_store_mwu_default")
def _(ctx):
    X, y, Xt = _binary(seed=40)
    store = _data_store(ctx, "d_mwu.zarr", X, y, 64)
    return _clf(n_shards=3).fit(store), Xt, _store_extras(ctx, "d_mwu.zarr")


@config("data_store_mwu_literal")
def _(ctx):
    X, y, Xt = _binary(seed=40)
    return _clf(**LITERAL).fit(X, y), Xt


@config("data_store_mwu_literal_from_store", same_as="data_store_mwu_literal")
def _(ctx):
    X, y, Xt = _binary(seed=40)
    store = _data_store(ctx, "d_mwu.zarr", X, y, 64)
    return _clf(**LITERAL, n_shards=2).fit(store), Xt


@config("data_store_sparse", same_as="data_store_sparse_in_memory")
def _(ctx):
    X, y, Xt = _binary(n=200, d=8, seed=41, sparse_below=0.4)
    store = _data_store(ctx, "d_sparse.zarr", X, y, 32)
    return _clf(**LITERAL, n_shards=3).fit(store), Xt, _store_extras(ctx, "d_sparse.zarr")


@config("data_store_sparse_in_memory")
def _(ctx):
    X, y, Xt = _binary(n=200, d=8, seed=41, sparse_below=0.4)
    return _clf(**LITERAL).fit(X, y), Xt


@config("data_store_two_stage", same_as="solver_two_stage_700")
def _(ctx):
    X, y, Xt = _two_stage_data()
    store = _data_store(ctx, "d_two_stage.zarr", X, y, 50)
    return _clf(**TWO_STAGE, n_shards=3).fit(store), Xt, _store_extras(ctx, "d_two_stage.zarr")


def _kernel_data():
    rng = np.random.RandomState(42)
    X, Xt = rng.rand(100, 4), rng.rand(40, 4)
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.randn(100) > 1.0, "yes", "no")
    return X, y, Xt


def _kernel_store(ctx, name, **kw):
    from mwumkl_dist import open_store, write_kernel_store

    X, y, _ = _kernel_data()
    path = ctx.path(name)
    if not os.path.exists(path):
        if "K" in kw:
            write_kernel_store(path, y, K=kw["K"], chunk_rows=32)
        else:
            write_kernel_store(path, y, X=X, kernels="linear,gaussian:1,gaussian:2", chunk_rows=32)
        ctx.extras.setdefault("stores", {})[name] = fingerprint_store(path)
    return open_store(path, cache_bytes=4096)


@config("kernel_store_from_X")
def _(ctx):
    X, _, Xt = _kernel_data()
    store = _kernel_store(ctx, "k_X.zarr")
    K_test = explicit_kernels(Xt, X)[[0, 3, 3]]  # any (3, n_test, n_train) array: only its bits matter
    return _clf(kernels="precomputed", n_shards=3).fit(store), K_test, _store_extras(ctx, "k_X.zarr")


@config("kernel_store_user_K")
def _(ctx):
    X, _, Xt = _kernel_data()
    store = _kernel_store(ctx, "k_K.zarr", K=explicit_kernels(X, X))
    return _clf(kernels="precomputed", **LITERAL).fit(store), explicit_kernels(Xt, X), _store_extras(ctx, "k_K.zarr")


@config("kernel_store_user_K_in_memory", same_as="kernel_store_user_K")
def _(ctx):
    X, y, Xt = _kernel_data()
    return _clf(kernels="precomputed", **LITERAL).fit(explicit_kernels(X, X), y), explicit_kernels(Xt, X)


# --- random Gaussian banks -----------------------------------------------------------------------------------


def _bank_data():
    return make_data(150, 6, 50, labels=("a", "b"))


@config("bank_random_200_default")
def _(ctx):
    X, y, Xt = _bank_data()
    return _clf(kernels="random:200:size=2:seed=5").fit(X, y), Xt


@config("bank_random_200_literal")
def _(ctx):
    X, y, Xt = _bank_data()
    return _clf(kernels="random:200:size=2:seed=5", **LITERAL).fit(X, y), Xt


@config("bank_object_no_chains")
def _(ctx):
    from mwumkl_dist import RandomGaussianBank

    X, y, Xt = _bank_data()
    bank = RandomGaussianBank(300, 2, 5, sigmas=NO_CHAIN_SIGMAS)
    return _clf(kernels=bank, **LITERAL).fit(X, y), Xt


@config("bank_sparse")
def _(ctx):
    X, y, Xt = make_data(150, 6, 51, sparse_below=0.4)
    return _clf(kernels="random:200:size=3:seed=1", **LITERAL).fit(X, y), Xt


@config("bank_from_data_store", same_as="bank_random_200_literal")
def _(ctx):
    X, y, Xt = _bank_data()
    store = _data_store(ctx, "d_bank.zarr", X, y, 32)
    return _clf(kernels="random:200:size=2:seed=5", **LITERAL, n_shards=2).fit(store), Xt


# --- Dask --------------------------------------------------------------------------------------------------


for _rows, _kernel_blocks in ((2, 1), (3, 1), (1, 3), (2, 2), (4, 2)):

    @config(f"dask_per_feature_{_rows}x{_kernel_blocks}", same_as="per_feature_local")
    def _(ctx, rows=_rows, kernel_blocks=_kernel_blocks):
        X, y, Xt = _per_feature_data()
        clf = _clf(**PER_FEATURE, engine="dask", client=ctx.client(), n_shards=rows, n_kernel_shards=kernel_blocks)
        return clf.fit(X, y), Xt


@config("dask_default", same_as="default_binary")
def _(ctx):
    X, y, Xt = _binary()
    return _clf(engine="dask", client=ctx.client(), n_shards=2).fit(X, y), Xt


@config("dask_multiclass_3x1", same_as="checkpoint_reference_multiclass")
def _(ctx):
    X, y, Xt = _multiclass(n=150, seed=15)
    return _clf(**LITERAL, engine="dask", client=ctx.client(), n_shards=3).fit(X, y), Xt


@config("dask_without_client", same_as="data_store_mwu_literal")
def _(ctx):
    X, y, Xt = _binary(seed=40)
    return _clf(**LITERAL, engine="dask", n_shards=2).fit(X, y), Xt


@config("dask_precomputed_2x1", same_as="kernel_store_user_K_in_memory")
def _(ctx):
    X, y, Xt = _kernel_data()
    clf = _clf(kernels="precomputed", **LITERAL, engine="dask", client=ctx.client(), n_shards=2)
    return clf.fit(explicit_kernels(X, X), y), explicit_kernels(Xt, X)


@config("dask_data_store_mwu", same_as="data_store_mwu_literal")
def _(ctx):
    X, y, Xt = _binary(seed=40)
    store = _data_store(ctx, "d_mwu.zarr", X, y, 64)
    return _clf(**LITERAL, engine="dask", client=ctx.client(), n_shards=2).fit(store), Xt


@config("dask_kernel_store", same_as="kernel_store_user_K")
def _(ctx):
    X, _, Xt = _kernel_data()
    store = _kernel_store(ctx, "k_K.zarr", K=explicit_kernels(X, X))
    clf = _clf(kernels="precomputed", **LITERAL, engine="dask", client=ctx.client(), n_shards=2)
    return clf.fit(store), explicit_kernels(Xt, X)


@config("dask_bank_1x3", same_as="bank_object_no_chains")
def _(ctx):
    from mwumkl_dist import RandomGaussianBank

    X, y, Xt = _bank_data()
    bank = RandomGaussianBank(300, 2, 5, sigmas=NO_CHAIN_SIGMAS)
    clf = _clf(kernels=bank, **LITERAL, engine="dask", client=ctx.client(), n_shards=1, n_kernel_shards=3)
    return clf.fit(X, y), Xt


@config("dask_bank_2x2", same_as="bank_object_no_chains")
def _(ctx):
    from mwumkl_dist import RandomGaussianBank

    X, y, Xt = _bank_data()
    bank = RandomGaussianBank(300, 2, 5, sigmas=NO_CHAIN_SIGMAS)
    clf = _clf(kernels=bank, **LITERAL, engine="dask", client=ctx.client(), n_shards=2, n_kernel_shards=2)
    return clf.fit(X, y), Xt


@config("dask_two_stage_700", same_as="solver_two_stage_700")
def _(ctx):
    X, y, Xt = _two_stage_data()
    return _clf(**TWO_STAGE, engine="dask", client=ctx.client(), n_shards=3).fit(X, y), Xt


@config("dask_two_stage_10k", same_as="solver_auto_10k")
def _(ctx):
    X, y, Xt = _large_data()
    return _clf(**TWO_STAGE, engine="dask", client=ctx.client(), n_shards=2).fit(X, y), Xt


@config("dask_two_stage_data_store", same_as="solver_two_stage_700")
def _(ctx):
    X, y, Xt = _two_stage_data()
    store = _data_store(ctx, "d_two_stage.zarr", X, y, 50)
    return _clf(**TWO_STAGE, engine="dask", client=ctx.client(), n_shards=2).fit(store), Xt


# --- device="cuda" under numba's CUDA simulator (run in a subprocess), and their CPU twins ----------------------
#
# The simulator runs the kernels' Python code thread by thread: the problems are tiny.

CUDA_PARAMS = dict(kernels="linear, gaussian:1, poly:2", C=10.0, max_iter=20, polish=False, selectivity=100.0)


def _cuda_data():
    rng = np.random.RandomState(60)
    X = rng.normal(size=(24, 4))
    y = np.where(X[:, 0] - X[:, 1] + 0.3 * rng.normal(size=24) > 0, "yes", "no")
    return X, y, rng.normal(size=(6, 4))


def _cuda_sparse_data():
    X, y, Xt = _cuda_data()
    return sp.csr_matrix(np.where(np.abs(X) > 0.5, X, 0.0)), y, sp.csr_matrix(np.where(np.abs(Xt) > 0.5, Xt, 0.0))


def _cuda_bank():
    from mwumkl_dist import RandomGaussianBank

    return RandomGaussianBank(20, 2, 1)


for _device in ("cpu", "cuda"):
    _prefix = "cuda_sim" if _device == "cuda" else "cuda_twin_cpu"
    _sim = _device == "cuda"

    @config(f"{_prefix}_dense", cuda_sim=_sim, same_as=None if _sim else "cuda_sim_dense")
    def _(ctx, device=_device):
        X, y, Xt = _cuda_data()
        return _clf(**CUDA_PARAMS, device=device).fit(X, y), Xt

    @config(f"{_prefix}_sparse", cuda_sim=_sim, same_as=None if _sim else "cuda_sim_sparse")
    def _(ctx, device=_device):
        X, y, Xt = _cuda_sparse_data()
        return _clf(**CUDA_PARAMS, device=device).fit(X, y), Xt

    @config(f"{_prefix}_bank", cuda_sim=_sim, same_as=None if _sim else "cuda_sim_bank")
    def _(ctx, device=_device):
        X, y, Xt = _cuda_data()
        params = {**CUDA_PARAMS, "kernels": _cuda_bank()}
        return _clf(**params, device=device).fit(X, y), Xt

    @config(f"{_prefix}_precomputed", cuda_sim=_sim, same_as=None if _sim else "cuda_sim_precomputed")
    def _(ctx, device=_device):
        X, y, Xt = _cuda_data()
        params = {**CUDA_PARAMS, "kernels": "precomputed"}
        return _clf(**params, device=device).fit(explicit_kernels(X, X), y), explicit_kernels(Xt, X)

    @config(f"{_prefix}_dask_2x1", cuda_sim=_sim, same_as=None if _sim else "cuda_sim_dask_2x1")
    def _(ctx, device=_device):
        X, y, Xt = _cuda_data()
        clf = _clf(**CUDA_PARAMS, device=device, engine="dask", client=ctx.client(), n_shards=2)
        return clf.fit(X, y), Xt


# ----------------------------------------------------------------------------- running


def run_config(cfg: Config, ctx: Context) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=ctx.tmp) as directory, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = cfg.build(ctx)
            est, X_test, extra = out if len(out) == 3 else (*out, {})
            rec = fingerprint(est, X_test, directory, proba=cfg.proba)
        except Exception as exc:  # recorded: a configuration that fails is a difference, not a crash
            return {"error": f"{type(exc).__name__}: {exc}", "info": {"seconds": time.perf_counter() - start}}
    for key, value in (extra or {}).items():
        if value is not None:
            rec[key] = value
    rec["info"]["seconds"] = round(time.perf_counter() - start, 3)
    seen = sorted({f"{w.category.__name__}: {str(w.message)[:300]}" for w in caught})
    if seen:
        rec["info"]["warnings"] = seen  # informational: Dask's own warnings need not repeat run to run
    return rec


def run_configs(configs, tmp: str, log) -> dict:
    ctx = Context(tmp)
    results = {}
    try:
        for cfg in configs:
            rec = run_config(cfg, ctx)
            results[cfg.name] = rec
            status = "ERROR " + rec["error"] if "error" in rec else "ok"
            log(f"  {cfg.name:<44} {rec['info']['seconds']:7.2f} s  {status}")
    finally:
        ctx.close()
    return results


def run_cuda_sim(configs, tmp: str, log) -> dict:
    """The ``cuda_sim`` configurations in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``."""
    if not configs:
        return {}
    out = os.path.join(tmp, "cuda_sim.json")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--cuda-sim-worker", out]
    for cfg in configs:
        cmd += ["--only", cfg.name]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        reason = None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"
        for line in proc.stdout.splitlines():
            log(line)
    except subprocess.TimeoutExpired:
        reason = "the simulator subprocess ran over 600 s"
    if reason is None and os.path.exists(out):
        with open(out) as fh:
            return json.load(fh)
    reason = reason or "the simulator subprocess wrote no results"
    log(f"  cuda_sim: skipped ({reason})")
    return {cfg.name: {"skipped": reason, "info": {"seconds": time.perf_counter() - start}} for cfg in configs}


def cuda_sim_worker(out: str, patterns) -> int:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        print("--cuda-sim-worker needs NUMBA_ENABLE_CUDASIM=1", file=sys.stderr)
        return 2
    configs = [c for c in CONFIGS if c.cuda_sim and selected(c.name, patterns)]
    with tempfile.TemporaryDirectory(prefix="reference_models_sim_") as tmp:
        try:
            from mwumkl_dist import MWUMKLClassifier

            X, y, _ = _cuda_data()
            # Is the device usable?  Without one, device="cuda" is a RuntimeError naming what is missing.
            MWUMKLClassifier(**{**CUDA_PARAMS, "max_iter": 1}, device="cuda").fit(X, y)
        except (RuntimeError, ImportError) as exc:
            reason = f"device='cuda' under the simulator: {type(exc).__name__}: {exc}"
            results = {c.name: {"skipped": reason, "info": {}} for c in configs}
            print(f"  cuda_sim: skipped ({reason})")
        else:
            results = run_configs(configs, tmp, print)
    with open(out, "w") as fh:
        json.dump(results, fh)
    return 0


def selected(name: str, patterns) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def environment() -> dict:
    import mwumkl_dist

    versions = {}
    for mod in ("numpy", "scipy", "numba", "sklearn", "distributed", "zarr"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - informational only
            versions[mod] = None
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "package_file": mwumkl_dist.__file__,
        "package_version": mwumkl_dist.__version__,
        "versions": versions,
        "cpus": os.cpu_count(),
        "MWUMKL_NUM_THREADS": os.environ.get("MWUMKL_NUM_THREADS"),
    }


# ----------------------------------------------------------------------------- comparing


def _compared(rec: dict, layout: bool = False) -> dict:
    """The parts of a record that must be identical: everything but ``info`` (and layout metadata)."""
    out = {}
    for key, value in rec.items():
        if key == "info":
            continue
        if key == "decision":
            value = {k: v for k, v in value.items() if k != "values"}
        if key == "meta" and layout:
            value = {k: v for k, v in value.items() if not k.startswith(_LAYOUT_META)}
        if layout and key in ("attrs", "store"):
            continue  # cache statistics and store files differ between layouts and in-memory data
        out[key] = value
    return out


def differences(a: dict, b: dict, layout: bool = False) -> list[str]:
    """What differs between two records, by name (``model.dual_coef_``, ``decision``, ...)."""
    if "skipped" in a or "skipped" in b:
        if "skipped" in a and "skipped" in b:
            return []
        return ["skipped on one side: " + (a.get("skipped") or b.get("skipped"))]
    if "error" in a or "error" in b:
        if a.get("error") == b.get("error"):
            return []
        return [f"error: {a.get('error')!r} vs {b.get('error')!r}"]
    ca, cb = _compared(a, layout), _compared(b, layout)
    out = []
    for key in sorted(set(ca) | set(cb)):
        va, vb = ca.get(key), cb.get(key)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict) and key != "decision":
            for sub in sorted(set(va) | set(vb)):
                if va.get(sub, "<absent>") != vb.get(sub, "<absent>"):
                    out.append(f"{key}.{sub}")
        else:
            out.append(key)
    if "decision" in out:
        da, db = np.asarray(a["decision"]["values"]), np.asarray(b["decision"]["values"])
        if da.shape == db.shape:
            out[out.index("decision")] = f"decision (max |diff| {np.max(np.abs(da - db)):.3g})"
    return out


def compare(ours: dict, theirs: dict, names=None, log=print) -> bool:
    """Print each configuration as same/DIFFERENT; True when all are the same."""
    a, b = ours["configs"], theirs["configs"]
    names = sorted(set(a) | set(b)) if names is None else names
    ok = True
    width = max(map(len, names), default=10)
    for name in names:
        if name not in a or name not in b:
            log(f"{name:<{width}}  DIFFERENT (missing in {'this run' if name not in a else 'the other file'})")
            ok = False
            continue
        diff = differences(a[name], b[name])
        if diff:
            ok = False
            log(f"{name:<{width}}  DIFFERENT: {', '.join(diff)}")
        else:
            note = " (skipped on both sides)" if "skipped" in a[name] else ""
            log(f"{name:<{width}}  same{note}")
    n_diff = sum(1 for n in names if n not in a or n not in b or differences(a[n], b[n]))
    log(f"{len(names) - n_diff} of {len(names)} configurations the same, {n_diff} different")
    return ok


def invariants(results: dict) -> dict:
    """Each configuration with ``same_as`` against that configuration: "ok", or what differs."""
    out = {}
    for cfg in CONFIGS:
        if cfg.same_as is None or cfg.name not in results or cfg.same_as not in results:
            continue
        a, b = results[cfg.name], results[cfg.same_as]
        if "skipped" in a or "skipped" in b:
            out[f"{cfg.name} == {cfg.same_as}"] = "skipped"
            continue
        diff = differences(a, b, layout=True)
        out[f"{cfg.name} == {cfg.same_as}"] = "ok" if not diff else "differs: " + ", ".join(diff)
    return out


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write this run's results to this JSON file")
    parser.add_argument("--compare", metavar="OTHER.json", help="compare with an earlier results file")
    parser.add_argument("--load", metavar="FILE.json", help="use these results instead of fitting (with --compare)")
    parser.add_argument("--only", action="append", default=[], metavar="PATTERN", help="configurations to run")
    parser.add_argument("--no-cuda-sim", action="store_true", help="leave out the CUDA simulator configurations")
    parser.add_argument("--list", action="store_true", help="list the configurations and exit")
    parser.add_argument("--cuda-sim-worker", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.cuda_sim_worker:
        return cuda_sim_worker(args.cuda_sim_worker, args.only)
    if args.list:
        for cfg in CONFIGS:
            print(cfg.name + (f"  (same as {cfg.same_as})" if cfg.same_as else ""))
        return 0
    if not args.out and not (args.load and args.compare):
        parser.error("give --out FILE.json (and optionally --compare OTHER.json), or --load A.json --compare B.json")

    if args.load:
        with open(args.load) as fh:
            results = json.load(fh)
    else:
        configs = [c for c in CONFIGS if selected(c.name, args.only)]
        if args.no_cuda_sim:
            configs = [c for c in configs if not c.cuda_sim]
        start = time.perf_counter()
        print(f"fitting {len(configs)} configurations", flush=True)
        with tempfile.TemporaryDirectory(prefix="reference_models_") as tmp:
            cpu = run_configs([c for c in configs if not c.cuda_sim], tmp, lambda s: print(s, flush=True))
            sim = run_cuda_sim([c for c in configs if c.cuda_sim], tmp, lambda s: print(s, flush=True))
        merged = {**cpu, **sim}
        ordered = {c.name: merged[c.name] for c in configs}
        checks = invariants(ordered)
        results = {
            "format": "mwumkl_dist-reference-models",
            "format_version": 1,
            "environment": environment(),
            "seconds": round(time.perf_counter() - start, 1),
            "selection": args.only,
            "configs": ordered,
            "invariants": checks,
        }
        bad = {k: v for k, v in checks.items() if v not in ("ok", "skipped")}
        errors = [n for n, r in ordered.items() if "error" in r]
        print(f"{len(ordered)} configurations in {results['seconds']:.1f} s; {len(errors)} failed to fit")
        print(f"invariants: {len(checks) - len(bad)} of {len(checks)} hold (or are skipped)")
        for key, value in bad.items():
            print(f"  INVARIANT {key}: {value}")
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(results, fh, indent=1, sort_keys=False)
            print(f"wrote {args.out}")

    if args.compare:
        with open(args.compare) as fh:
            other = json.load(fh)
        names = list(results["configs"]) if (args.only or args.no_cuda_sim) and not args.load else None
        print(f"\ncomparing with {args.compare}")
        return 0 if compare(results, other, names) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

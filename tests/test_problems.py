"""The input abstraction (mwumkl_dist.data.problems): one factory, every kind behind the same protocols."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import literal

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.data.problems import (
    DataStoreInput,
    FeatureInput,
    KernelStoreInput,
    PrecomputedInput,
    Problem,
    TrainingInput,
    make_training_input,
)
from mwumkl_dist.engines.base import Engine
from mwumkl_dist.engines.local import LocalEngine

zarr = pytest.importorskip("zarr")
from mwumkl_dist.stores import write_data_store, write_kernel_store  # noqa: E402


def _members(protocol) -> set[str]:
    names = {n for n in vars(protocol) if not n.startswith("_") and callable(getattr(protocol, n))}
    return names | set(getattr(protocol, "__annotations__", {}))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stores")
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 3))
    y = np.where(X[:, 0] > 0.5, "p", "n")
    K = np.stack([X @ X.T, (X @ X.T + 1) ** 2])
    data = write_data_store(tmp / "d.zarr", X, y, chunk_rows=8)
    kernels = write_kernel_store(tmp / "k.zarr", y, K=K, chunk_rows=8)
    return {
        FeatureInput: (X, y, "linear,gaussian:1"),
        "csr": (sp.csr_matrix(X), y, "paper"),
        "bank": (X, y, "random:6:size=2:seed=1"),
        PrecomputedInput: (K, y, "precomputed"),
        DataStoreInput: (data, None, "linear,gaussian:1"),
        "store-bank": (data, None, "random:6:size=2:seed=1"),
        KernelStoreInput: (kernels, None, "precomputed"),
    }


def test_the_factory_decides_the_kind_once(inputs):
    kinds = {
        FeatureInput: FeatureInput,
        "csr": FeatureInput,
        "bank": FeatureInput,
        PrecomputedInput: PrecomputedInput,
        DataStoreInput: DataStoreInput,
        "store-bank": DataStoreInput,
        KernelStoreInput: KernelStoreInput,
    }
    for key, (X, y, kernels) in inputs.items():
        data = make_training_input(X, y, kernels, estimator=MWUMKLClassifier(kernels))
        assert type(data) is kinds[key]
        missing = _members(TrainingInput) - set(dir(data))
        assert not missing, (key, missing)
        assert len(data.y) == data.n_samples == 40
        assert data.traces is None or data.traces.shape == (len(data.kernel_names),)


def test_every_kind_gives_a_problem_whose_shards_build_anywhere(inputs):
    for key, (X, y, kernels) in inputs.items():
        data = make_training_input(X, y, kernels, estimator=MWUMKLClassifier(kernels))
        problem = data.binary(np.where(data.y == "p", 1.0, -1.0))
        missing = _members(Problem) - set(dir(problem))
        assert not missing, (key, missing)
        assert problem.n_samples == 40 and problem.n_kernels == len(data.kernel_names)
        ranges = problem.row_ranges(3)
        assert ranges[0][0] == 0 and ranges[-1][1] == 40 and len(ranges) == 3
        assert problem.kernel_ranges(1) == [(0, problem.n_kernels)]
        # the factory is picklable (Dask ships it) and builds the same shard as make_shard
        factory = pickle.loads(pickle.dumps(problem.shard_factory(*ranges[1])))
        shard, direct = factory(), problem.make_shard(*ranges[1])
        np.testing.assert_array_equal(shard.diagonal(), direct.diagonal())
        assert shard.row_offset == ranges[1][0] == direct.row_offset


def test_bad_input_kinds_are_refused_by_the_factory(inputs):
    data_store, kernel_store = inputs[DataStoreInput][0], inputs[KernelStoreInput][0]
    with pytest.raises(ValueError, match="a kernel store needs kernels='precomputed'"):
        make_training_input(kernel_store, None, "paper", estimator=MWUMKLClassifier())
    with pytest.raises(ValueError, match="needs a kernel store, not a data store"):
        make_training_input(data_store, None, "precomputed", estimator=MWUMKLClassifier())
    with pytest.raises(ValueError, match="the labels come from the store"):
        make_training_input(data_store, np.zeros(40), "paper", estimator=MWUMKLClassifier())
    with pytest.raises(TypeError, match="dense"):
        make_training_input(sp.csr_matrix(np.eye(3)), [0, 1, 0], "precomputed", estimator=MWUMKLClassifier())


def test_both_engines_implement_the_engine_protocol():
    pytest.importorskip("distributed")
    from mwumkl_dist.engines.dask import DaskEngine

    wanted = _members(Engine) | {"__enter__", "__exit__"}
    for engine in (LocalEngine, DaskEngine):
        missing = {n for n in wanted if not hasattr(engine, n)} - {"n_kernels", "n_samples", "y"}
        assert not missing, (engine.__name__, missing)


def test_the_local_engine_closes_as_a_context_manager(inputs):
    X, y, kernels = inputs[FeatureInput]
    data = make_training_input(X, y, kernels, estimator=MWUMKLClassifier(kernels))
    with LocalEngine(data.binary(np.where(y == "p", 1.0, -1.0)), n_shards=2) as engine:
        assert len(engine.shards) == 2 and engine.stats() == [{}, {}]
    assert engine.shards == []


def test_predictions_come_chunk_by_chunk_from_a_data_store_and_never_from_a_kernel_store(inputs):
    X, y, kernels = inputs[FeatureInput]
    clf = MWUMKLClassifier(kernels, **literal()).fit(X, y)
    data_store, kernel_store = inputs[DataStoreInput][0], inputs[KernelStoreInput][0]
    np.testing.assert_array_equal(clf.decision_function(data_store), clf.decision_function(X))
    with pytest.raises(TypeError, match="predict from precomputed test kernels"):
        clf.decision_function(kernel_store)
    K, _, _ = inputs[PrecomputedInput]
    pre = MWUMKLClassifier("precomputed", **literal()).fit(K, y)
    with pytest.raises(ValueError, match=r"must have shape \(m=2, n_samples, n_train=40\)"):
        pre.decision_function(K[:, :, :30])

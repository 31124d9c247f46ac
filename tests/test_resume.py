"""Checkpoint and resume for every input kind: data stores, kernel stores, random banks, precomputed kernels.

A fit stopped part-way (its callback returns True, or an exception ends it) and resumed from its
checkpoint must end with the uninterrupted fit's model, bit for bit, on the local and Dask engines.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import explicit_kernels, literal

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core import partition
from mwumkl_dist.core.mwu_rules import FitInterrupted
from mwumkl_dist.kernels import KernelSet

zarr = pytest.importorskip("zarr")

from mwumkl_dist.stores import write_data_store, write_kernel_store  # noqa: E402

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = pytest.mark.timeout(300, method="thread")

KERNELS = "linear,poly:2,gaussian:1,gaussian:2"
BANK = "random:40:size=2:seed=1"
#: The callback stops the fit at iteration 40; the last checkpoint before it is at 30, so a resume
#: replays 30 picks and recomputes 10 iterations the stopped fit had done.
STOP_AT, CALLBACK_EVERY, CHECKPOINT_EVERY = 40, 20, 15


def _data(n=120, d=4, seed=0, n_classes=2):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    score = X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n)
    y = np.array(["no", "yes", "maybe"])[np.digitize(score, [1.0] if n_classes == 2 else [0.8, 1.2])]
    return X, y


def _fit_input(kind, X, y, tmp_path):
    """``(kernels, X, y, X_predict)``: the same training set as each input kind holds it, for ``fit``,
    and what ``decision_function`` takes for the training points."""
    if kind == "bank":
        return BANK, X, y, X
    K = explicit_kernels(KernelSet(KERNELS, X.shape[1]).specs, X)  # (m, n, n)
    if kind == "precomputed":
        return "precomputed", K, y, K
    if kind == "kernel-store":
        return "precomputed", write_kernel_store(tmp_path / "k.zarr", y, K=K, chunk_rows=32), None, K
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=32)
    if kind == "data-store":
        return KERNELS, store, None, X
    if kind == "data-store-bank":
        return BANK, store, None, X
    raise AssertionError(kind)


def _assert_same_model(a, b):
    np.testing.assert_array_equal(a.classes_, b.classes_)
    np.testing.assert_array_equal(a.support_, b.support_)
    np.testing.assert_array_equal(a.dual_coef_, b.dual_coef_)
    np.testing.assert_array_equal(a.intercept_, b.intercept_)
    np.testing.assert_array_equal(a.kernel_weights_, b.kernel_weights_)
    np.testing.assert_array_equal(a.kernel_traces_, b.kernel_traces_)
    np.testing.assert_array_equal(a.n_iter_, b.n_iter_)


@pytest.fixture(scope="module")
def threaded_client():
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        yield client


def _engine_params(engine, request):
    if engine == "local":
        return {}
    client = request.getfixturevalue("threaded_client")
    # Kernel tiles of 2 (this process only: the threaded client's shards live here), so that these few
    # kernels make two kernel blocks; every fit of the test (reference included) runs after this.
    request.getfixturevalue("monkeypatch").setattr(partition, "TILE_KERNELS", 2)
    return dict(engine="dask", client=client, n_shards=2, n_kernel_shards=2)


class _Iterations:
    """A callback that records the iterations it sees and stops the fit at ``stop_at`` (None: never)."""

    def __init__(self, stop_at=None):
        self.stop_at, self.seen = stop_at, []

    def __call__(self, info):
        self.seen.append(info.iteration)
        return self.stop_at is not None and info.iteration >= self.stop_at


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize(
    ("kind", "engine"),
    [
        ("data-store", "local"),
        ("data-store-bank", "local"),
        ("kernel-store", "local"),
        ("bank", "local"),
        ("precomputed", "local"),
        ("kernel-store", "dask"),
        ("data-store", "dask"),
        ("bank", "dask"),
    ],
)
def test_resume_after_a_stop_gives_the_uninterrupted_model(tmp_path, request, kind, engine):
    X, y = _data()
    kernels, fit_X, fit_y, X_predict = _fit_input(kind, X, y, tmp_path)
    params = dict(kernels=kernels, **literal(epsilon=0.3), **_engine_params(engine, request))
    ref = MWUMKLClassifier(**params).fit(fit_X, fit_y)
    assert ref.n_iter_ > STOP_AT and not ref.interrupted_

    ckpt = tmp_path / "fit.ckpt.npz"
    stopped = MWUMKLClassifier(
        **params,
        checkpoint=ckpt,
        checkpoint_every=CHECKPOINT_EVERY,
        callback=_Iterations(stop_at=STOP_AT),
        callback_every=CALLBACK_EVERY,
    ).fit(fit_X, fit_y)
    assert stopped.interrupted_ and stopped.n_iter_ == STOP_AT
    assert ckpt.exists()

    watch = _Iterations()
    resumed = MWUMKLClassifier(**params, callback=watch, callback_every=CALLBACK_EVERY).fit(fit_X, fit_y, resume=ckpt)
    # It went on from the checkpoint, not from scratch: the stop wrote one of its last iteration (40; the
    # periodic one was at 30), and the resumed phase starts there.
    assert watch.seen[0] == STOP_AT and STOP_AT % CHECKPOINT_EVERY
    assert watch.seen[1] > STOP_AT
    assert not resumed.interrupted_
    _assert_same_model(resumed, ref)
    np.testing.assert_array_equal(resumed.decision_function(X_predict), ref.decision_function(X_predict))


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("kind", ["data-store", "kernel-store", "bank", "precomputed"])
def test_resume_after_a_crash_in_a_one_vs_rest_fit(tmp_path, kind):
    """Three classes: the checkpoint also carries the finished one-vs-rest problems."""
    X, y = _data(n=150, seed=3, n_classes=3)
    kernels, fit_X, fit_y, X_predict = _fit_input(kind, X, y, tmp_path)
    params = dict(kernels=kernels, **literal(epsilon=0.3))
    ref = MWUMKLClassifier(**params).fit(fit_X, fit_y)
    n_iter = int(ref.n_iter_[0])
    assert n_iter > STOP_AT

    class Crash(Exception):
        pass

    seen = []

    def crash_in_the_second_problem(info):
        seen.append(info.iteration)
        # The iteration count restarts with each one-vs-rest problem: the second one is under way.
        if seen.count(STOP_AT) == 2:
            raise Crash

    ckpt = tmp_path / "ovr.ckpt.npz"
    with pytest.raises(Crash):
        MWUMKLClassifier(
            **params,
            checkpoint=ckpt,
            checkpoint_every=CHECKPOINT_EVERY,
            callback=crash_in_the_second_problem,
            callback_every=CALLBACK_EVERY,
        ).fit(fit_X, fit_y)
    assert ckpt.exists()
    resumed = MWUMKLClassifier(**params).fit(fit_X, fit_y, resume=ckpt)
    _assert_same_model(resumed, ref)
    np.testing.assert_array_equal(resumed.decision_function(X_predict), ref.decision_function(X_predict))


def test_a_stopped_one_vs_rest_fit_says_how_to_resume(tmp_path):
    X, y = _data(n=150, seed=3, n_classes=3)
    kernels, store, _, _ = _fit_input("data-store", X, y, tmp_path)
    ckpt = tmp_path / "ovr.ckpt.npz"
    stop = _Iterations(stop_at=STOP_AT)
    with pytest.raises(FitInterrupted, match=r"after 1 of 3 one-vs-rest problems; resume it with fit\(\.\.\., resume="):
        MWUMKLClassifier(
            kernels=kernels,
            **literal(epsilon=0.3),
            checkpoint=ckpt,
            checkpoint_every=CHECKPOINT_EVERY,
            callback=stop,
            callback_every=CALLBACK_EVERY,
        ).fit(store)
    ref = MWUMKLClassifier(kernels=kernels, **literal(epsilon=0.3)).fit(store)
    _assert_same_model(MWUMKLClassifier(kernels=kernels, **literal(epsilon=0.3)).fit(store, resume=ckpt), ref)


@pytest.mark.parametrize("kind", ["data-store", "kernel-store"])
def test_resume_refuses_a_checkpoint_of_another_store(tmp_path, kind):
    X, y = _data()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    kernels, store, _, _ = _fit_input(kind, X, y, tmp_path / "a")
    ckpt = tmp_path / "c.npz"
    MWUMKLClassifier(kernels=kernels, **literal(epsilon=0.3), checkpoint=ckpt, checkpoint_every=10, max_iter=20).fit(
        store
    )
    X2 = X.copy()
    X2[5, 2] += 0.25  # one value changed: another training set
    _, other, _, _ = _fit_input(kind, X2, y, tmp_path / "b")
    with pytest.raises(ValueError, match="different data"):
        MWUMKLClassifier(kernels=kernels, **literal(epsilon=0.3), max_iter=20).fit(other, resume=ckpt)
    # the same store resumes fine
    MWUMKLClassifier(kernels=kernels, **literal(epsilon=0.3), max_iter=20).fit(store, resume=ckpt)

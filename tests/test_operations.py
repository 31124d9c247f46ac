"""Operations (issue 11 item 7): placement of rebuilt shards, waiting for workers, a lost scheduler,
too many shards, store paths, damaged checkpoints, per-fit checkpoint names of the deploy drivers.

The placement and waiting logic is tested on a :class:`DaskPool` whose view of the cluster is
replaced (``_live_workers``): no cluster, no timing.  The rest uses threaded ``LocalCluster``\\ s.
"""

from __future__ import annotations

import logging
import pickle
import struct
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import literal

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.cli import main
from mwumkl_dist.io.checkpoint import load_checkpoint
from mwumkl_dist.solvers.mwu.one_vs_rest import MIN_ROWS_PER_SHARD, check_shard_count
from mwumkl_dist.stores import DataStore, write_data_store

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = pytest.mark.timeout(300, method="thread")

REPO = Path(__file__).resolve().parent.parent


def _data(n=208, d=5, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, 1, -1)
    return X, y


# ----------------------------------------------------------------------------- a fake cluster view


class _Cluster:
    """What the engine sees of the scheduler: ``{address: threads}``, changed by the test as it goes."""

    def __init__(self, *states):
        self.states = list(states)  # each call to _live_workers takes the next state; the last stays
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return dict(self.states.pop(0) if len(self.states) > 1 else self.states[0])


def _engine(cluster, blocks, timeout=30.0, n_workers=None):
    """A DaskPool with ``blocks`` ({worker: count}) placed, seeing the cluster through ``cluster``."""
    from mwumkl_dist.engines.dask_pool import DaskPool, _Block

    engine = DaskPool.__new__(DaskPool)
    engine.timeout = timeout
    engine._scheduler_address = "tcp://10.0.0.1:8786"
    engine._departed = set()
    engine._live_workers = cluster
    engine.blocks = []
    for worker, count in blocks.items():
        for _ in range(count):
            block = _Block(((0, 1), (0, 1)))
            block.worker = worker
            engine.blocks.append(block)
    engine._n_workers = len(blocks) if n_workers is None else n_workers
    return engine


def test_a_rebuilt_shard_goes_to_the_worker_holding_fewest_shards():
    # Two shards on A, two on B; B's shards were lost and a restarted worker C (no shards) joined.
    engine = _engine(_Cluster({"tcp://a:1": 1, "tcp://c:1": 1}), {"tcp://a:1": 2, "tcp://b:1": 2})
    lost = [b for b in engine.blocks if b.worker == "tcp://b:1"]
    engine._departed.add("tcp://b:1")
    first = engine._place(lost[0])
    assert first == "tcp://c:1"  # not "any worker other than the dead one" (A already holds two)
    lost[0].worker = first
    assert engine._place(lost[1]) == "tcp://c:1"  # A 2, C 1: still C
    # The dead worker, while the scheduler still lists it, is not chosen though it now holds no shard.
    engine = _engine(_Cluster({"tcp://a:1": 1, "tcp://b:1": 1}), {"tcp://a:1": 1, "tcp://b:1": 1})
    engine._departed.add("tcp://b:1")
    assert engine._place(engine.blocks[1]) == "tcp://a:1"
    # Ties: the worker with more threads, then the address.
    engine = _engine(_Cluster({"tcp://a:1": 1, "tcp://b:1": 4, "tcp://c:1": 4}), {})
    from mwumkl_dist.engines.dask_pool import _Block

    assert engine._place(_Block(((0, 1), (0, 1)))) == "tcp://b:1"


def test_a_rebuild_waits_briefly_for_a_replacement_worker(monkeypatch, caplog):
    import mwumkl_dist.engines.dask_pool as dask_engine

    monkeypatch.setattr(dask_engine, "REPLACEMENT_GRACE", 60.0)  # the replacement comes far sooner
    # B left; a nanny restarts it as B' a few polls later.
    states = [{"tcp://a:1": 1}] * 3 + [{"tcp://a:1": 1, "tcp://b2:1": 1}]
    engine = _engine(_Cluster(*states), {"tcp://a:1": 2, "tcp://b:1": 2}, timeout=600.0)
    engine._departed.add("tcp://b:1")
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        start = time.monotonic()
        engine._wait_for_replacement()
    assert time.monotonic() - start < 30
    assert any("waiting up to 60 s for a replacement" in r.getMessage() for r in caplog.records)
    lost = [b for b in engine.blocks if b.worker == "tcp://b:1"]
    assert engine._place(lost[0]) == "tcp://b2:1"
    # No replacement within the grace: the workers left are used, and the next rebuild does not wait again.
    monkeypatch.setattr(dask_engine, "REPLACEMENT_GRACE", 0.5)
    engine = _engine(_Cluster({"tcp://a:1": 1}), {"tcp://a:1": 2, "tcp://b:1": 2}, timeout=600.0)
    engine._departed.add("tcp://b:1")
    engine._wait_for_replacement()
    assert engine._n_workers == 1
    monkeypatch.setattr(dask_engine, "REPLACEMENT_GRACE", 60.0)  # a second wait would now take a minute
    start = time.monotonic()
    engine._wait_for_replacement()
    assert time.monotonic() - start < 30


@pytest.mark.timeout(30, method="thread")
def test_waiting_for_workers_says_so_and_how_long(monkeypatch, caplog):
    import mwumkl_dist.engines.dask_pool as dask_engine

    monkeypatch.setattr(dask_engine, "WAIT_FIRST_REPORT", 0.2)
    monkeypatch.setattr(dask_engine, "WAIT_REPORT_EVERY", 0.3)
    # Every worker gone (mid-fit), then one comes back.
    engine = _engine(_Cluster(*([{}] * 12), {"tcp://new:1": 2}), {"tcp://a:1": 1}, timeout=30)
    engine._departed.add("tcp://a:1")
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        assert engine._workers() == ["tcp://new:1"]
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for Dask workers (")]
    assert waits, "the wait was silent"
    assert "s of 30 s)" in waits[0] and "tcp://10.0.0.1:8786" in waits[0] and "worker_timeout" in waits[0]
    # Nobody comes: a ConnectionError after the timeout, naming the scheduler.
    engine = _engine(_Cluster({}), {}, timeout=0.8)
    with pytest.raises(ConnectionError, match=r"scheduler at tcp://10.0.0.1:8786 has had no workers for 0.8 s"):
        engine._workers()


@pytest.mark.timeout(300, method="thread")
def test_a_scheduler_without_workers_is_reported_within_seconds(caplog):
    # A real (threaded) scheduler with no worker; the default report times; the fit's worker_timeout.
    distributed = pytest.importorskip("distributed")
    X, y = _data(n=60)
    with (
        distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        clf = MWUMKLClassifier(**literal(), engine="dask", client=client, worker_timeout=3.5)
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
            with pytest.raises(ConnectionError, match="has had no workers for 3.5 s"):
                clf.fit(X, y)
        elapsed = time.monotonic() - start
    messages = [r.getMessage() for r in caplog.records if r.name == "mwumkl_dist"]
    assert "has no workers yet; the fit waits up to 3.5 s (worker_timeout)" in messages[0]  # at once
    waits = [m for m in messages if "waiting for Dask workers" in m]
    assert waits and "(2 s of 3.5 s)" in waits[0]
    assert elapsed < 60  # ends after worker_timeout (3.5 s), not the default 600 s
    # The CLI has the option, with the documented default.
    from mwumkl_dist.cli import build_parser

    args = build_parser().parse_args(["fit", "--data", "x.csv", "--model", "m.npz"])
    assert args.worker_timeout == 600.0
    args = build_parser().parse_args(["fit", "--data", "x", "--model", "m", "--worker-timeout", "5"])
    assert args.worker_timeout == 5


@pytest.mark.timeout(300, method="thread")  # a cold numba cache compiles first
def test_a_worker_joining_during_the_wait_is_used(caplog, monkeypatch):
    distributed = pytest.importorskip("distributed")
    import mwumkl_dist.engines.dask_pool as dask_engine

    monkeypatch.setattr(dask_engine, "WAIT_FIRST_REPORT", 0.3)
    X, y = _data(n=80)
    ref = MWUMKLClassifier(**literal()).fit(X, y)
    with (
        distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        timer = threading.Timer(1.0, cluster.scale, args=(1,))
        timer.start()
        try:
            with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
                clf = MWUMKLClassifier(**literal(), engine="dask", client=client, worker_timeout=60).fit(X, y)
        finally:
            timer.cancel()
    assert any("waiting for Dask workers" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)


# ----------------------------------------------------------------------------- a lost scheduler


@pytest.mark.timeout(300, method="thread")
def test_a_lost_scheduler_is_named_with_the_checkpoint_to_resume_from(tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    from mwumkl_dist.engines.dask import DaskEngine, SchedulerLostError

    X, y = _data(n=120)
    params = literal(epsilon=0.3)
    ref = MWUMKLClassifier(**params).fit(X, y)
    engines = []
    init = DaskEngine.__init__

    def spy(self, *args, **kwargs):
        engines.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(DaskEngine, "__init__", spy)
    ckpt = tmp_path / "fit.ckpt.npz"
    cluster = distributed.LocalCluster(
        n_workers=1, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=":0"
    )
    address = cluster.scheduler_address

    def lose_the_scheduler(info):
        if info.iteration == 20:
            cluster.close()  # the scheduler (and its workers) go away mid-fit
            engines[-1].pool._recover(engines[-1].blocks[0])  # the next shard rebuild needs the scheduler

    try:
        with pytest.raises(SchedulerLostError) as err:
            MWUMKLClassifier(
                **params, engine="dask", client=address, n_shards=1, scheduler_timeout=2.0, checkpoint=ckpt,
                checkpoint_every=10, callback=lose_the_scheduler, callback_every=10,
            ).fit(X, y)  # fmt: skip
    finally:
        cluster.close()
    message = str(err.value)
    assert isinstance(err.value, ConnectionError)
    assert f"lost the connection to the Dask scheduler at {address}" in message
    assert "ConnectionPool closing" not in message.split("(")[0]
    assert f"resume from the checkpoint {ckpt} (iteration 20 of one-vs-rest problem 1)" in message
    # ... and resuming from it (here on the local engine) gives the uninterrupted model.
    resumed = MWUMKLClassifier(**params).fit(X, y, resume=ckpt)
    np.testing.assert_array_equal(resumed.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(resumed.kernel_weights_, ref.kernel_weights_)


def test_the_checkpoint_note_without_a_checkpoint_written():
    from mwumkl_dist.engines.dask import SchedulerLostError
    from mwumkl_dist.solvers.mwu.one_vs_rest import _with_checkpoint_note
    from mwumkl_dist.solvers.spec import ExecutionOptions, FitSpec, ModelSettings

    spec = FitSpec(ModelSettings(), ExecutionOptions(checkpoint="/nonexistent/ck.npz", checkpoint_every=50))
    exc = _with_checkpoint_note(SchedulerLostError("lost the connection to the Dask scheduler at tcp://x:1"), spec, "f")
    assert isinstance(exc, SchedulerLostError)
    assert "no checkpoint of this fit was written yet (/nonexistent/ck.npz is written every 50 iterations)" in str(exc)
    spec = FitSpec(ModelSettings(), ExecutionOptions(checkpoint=None))
    assert "checkpoint=PATH" in str(_with_checkpoint_note(SchedulerLostError("x"), spec, None))
    assert str(_with_checkpoint_note(ConnectionError("no workers"), spec, None)) == "no workers"


# ----------------------------------------------------------------------------- too many shards


def test_more_shards_than_rows_is_an_error_and_few_rows_per_shard_a_warning(tmp_path, capsys):
    X, y = _data(n=208)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"n_shards=300 row shards for 208 training points.*at most 13 shards"):
        MWUMKLClassifier(**literal(), n_shards=300).fit(X, y)
    with pytest.warns(UserWarning, match=r"n_shards=20 gives 10 rows per shard \(fewer than 16\)"):
        check_shard_count(20, 208)
    assert MIN_ROWS_PER_SHARD == 16
    check_shard_count(13, 208)  # 16 rows each: fine
    check_shard_count(1, 1)
    # The command line: one clear error line, at once (not a 93 s fit).
    data = tmp_path / "d.csv"
    np.savetxt(data, np.column_stack([X, y]), delimiter=",")
    code = main(["fit", "--data", str(data), "--model", str(tmp_path / "m.npz"), "--C", "1", "--shards", "300"])
    assert code == 1
    assert "error: n_shards=300 row shards for 208 training points" in capsys.readouterr().err
    assert time.monotonic() - start < 60  # at once, not after the 93 s fit (more on a loaded machine)


# ----------------------------------------------------------------------------- store paths


def test_a_relative_store_path_is_resolved_where_it_was_typed(tmp_path, monkeypatch):
    X, y = _data(n=40)
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    write_data_store("train.zarr", X, y, chunk_rows=16)
    store = DataStore("train.zarr")
    assert store.path == str(tmp_path / "here" / "train.zarr")
    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.stores import DataStoreProblem

    problem = DataStoreProblem(store, np.where(store.y == store.classes[1], 1.0, -1.0), KernelSet("paper", 5))
    factory = pickle.dumps(problem.shard_factory(16, 32))
    monkeypatch.chdir(tmp_path / "elsewhere")  # a worker started in another directory
    shard = pickle.loads(factory)()
    assert shard.n_rows == 16
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(store)).read_rows(0, 3), X[:3])


# ----------------------------------------------------------------------------- damaged checkpoints


def _member_data_offset(path: Path, member: str) -> tuple[int, int]:
    """Where ``member``'s (stored) bytes start in the zip file, and how many there are."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len, info.compress_size


def test_every_damaged_checkpoint_gets_the_same_clear_message(tmp_path, capsys):
    X, y = _data(n=100)
    params = literal(epsilon=0.4)
    good = tmp_path / "good.npz"
    MWUMKLClassifier(**params, checkpoint=good, checkpoint_every=5).fit(X, y)
    raw = good.read_bytes()
    start, size = _member_data_offset(good, "s.npy")
    flipped = bytearray(raw)
    for i in range(start + size - 16, start + size - 8):  # inside the array's data: only the CRC notices
        flipped[i] ^= 0xFF
    damaged = {
        "bad_crc.npz": bytes(flipped),
        "truncated.npz": raw[: len(raw) // 2],
        "garbage.npz": b"not a checkpoint at all",
        "empty.npz": b"",
    }
    message = "not a readable mwumkl_dist checkpoint (damaged or not a checkpoint"
    for name, content in damaged.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ValueError, match=r"^.*" + name + ": " + message.replace("(", r"\(")):
            load_checkpoint(path, "anything")
        with pytest.raises(ValueError, match="not a readable mwumkl_dist checkpoint"):
            MWUMKLClassifier(**params).fit(X, y, resume=path)
    # The bad CRC says so (not "unexpected BadZipFile") on the command line too.
    data = tmp_path / "d.csv"
    np.savetxt(data, np.column_stack([X, y]), delimiter=",")
    argv = ["fit", "--data", str(data), "--model", str(tmp_path / "m.npz"), "--C", "100", "--epsilon", "0.4"]
    assert main([*argv, "--resume", str(tmp_path / "bad_crc.npz")]) == 1
    err = capsys.readouterr().err
    assert message in err and "unexpected" not in err and "BadZipFile" in err


# ----------------------------------------------------------------------------- deploy: checkpoint per fit


@pytest.fixture(scope="module")
def driver():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mwumkl_deploy_driver_ops", REPO / "deploy" / "driver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_deploy_checkpoints_are_named_per_data_and_settings(driver, tmp_path):
    a, b = tmp_path / "a.svm", tmp_path / "b.svm"
    a.write_text("1 1:0.5\n-1 1:0.1\n")
    b.write_text("1 1:0.5\n-1 1:0.2\n")
    parser = driver.build_parser()
    ckpt = str(tmp_path / "mwumkl-checkpoint-{fit}.npz")

    def resolved(*extra):
        args = parser.parse_args(["--scheduler", "tcp://x:1", "--checkpoint", ckpt, "--resume", "auto", *extra])
        driver.check_args(args, parser)
        return args.checkpoint

    first = resolved("--data", str(a))
    assert Path(first).parent == tmp_path and Path(first).name.startswith("mwumkl-checkpoint-a-")
    assert "{fit}" not in first
    assert resolved("--data", str(a)) == first  # a resubmitted job of the same fit resumes its own checkpoint
    assert resolved("--data", str(a), "--shards", "8", "--n-jobs", "2") == first  # same model
    others = {
        resolved("--data", str(b)),
        resolved("--data", str(a), "--C", "10"),
        resolved("--data", str(a), "--kernels", "gaussian"),
        resolved("--data", str(a), "--seed", "1"),
        resolved("--data", str(a), "--max-iter", "50"),
        resolved(),  # the bundled data
    }
    assert first not in others and len(others) == 6
    assert Path(resolved()).name.startswith("mwumkl-checkpoint-breast-cancer-")
    # Without {fit} the path is kept as given.
    args = parser.parse_args(["--scheduler", "tcp://x:1", "--checkpoint", str(tmp_path / "c.npz")])
    driver.check_args(args, parser)
    assert args.checkpoint == str(tmp_path / "c.npz")
    for script in ("allocation.sbatch", "submit.sbatch"):
        assert (
            '--checkpoint "$OUT/mwumkl-checkpoint-{fit}.npz" --resume auto'
            in (REPO / "deploy" / "slurm" / script).read_text()
        )


class _FakeClient:
    """``nthreads()`` grows by one worker every ``every`` calls; records ``close()``."""

    def __init__(self, every: int, most: int = 99):
        self.calls, self.every, self.most, self.closed = 0, every, most, False
        self.scheduler = type("rpc", (), {"address": "tcp://10.0.0.1:8786"})()

    def nthreads(self):
        self.calls += 1
        return {f"tcp://w{i}:1": 1 for i in range(min(self.calls // self.every, self.most))}

    def close(self):
        self.closed = True


@pytest.mark.timeout(30, method="thread")
def test_the_deploy_driver_says_while_it_waits_for_workers(driver, monkeypatch):
    import io

    import mwumkl_dist.engines.dask_pool as dask_engine

    monkeypatch.setattr(dask_engine, "WAIT_FIRST_REPORT", 0.2)
    monkeypatch.setattr(dask_engine, "WAIT_REPORT_EVERY", 0.3)
    out = io.StringIO()
    driver.wait_for_workers(_FakeClient(every=5), 2, timeout=30, out=out)  # ~1 s
    lines = out.getvalue().splitlines()
    assert lines and all("waiting for Dask workers:" in line and "of 2 connected" in line for line in lines)
    assert "s of 30 s, --timeout)" in lines[0]
    client = _FakeClient(every=1, most=1)
    with pytest.raises(driver.DriverError, match="only 1 of 3 Dask workers connected within 0.5 s"):
        driver.wait_for_workers(client, 3, timeout=0.5, out=io.StringIO())
    assert client.closed

"""The two-stage fit within one memory budget (``memory_limit``), and its rank chosen by the held-out error."""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pytest
from _two_stage import smooth_rows, use_small_ranks

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.cli.args import memory_size
from mwumkl_dist.core import partition
from mwumkl_dist.devices import memory, threads
from mwumkl_dist.solvers import driver, two_stage
from mwumkl_dist.solvers.spec import FitSpec
from mwumkl_dist.solvers.two_stage import budget
from mwumkl_dist.solvers.two_stage import solver as solver_module


def _data(n=700, d=3, seed=0):
    return smooth_rows(n, d, seed)


@pytest.fixture
def small_ranks(monkeypatch):
    """Ranks that start at 16 landmarks and may grow to 60, rows in blocks of 64: several levels and blocks."""
    use_small_ranks(monkeypatch)


# polish=False: the Nystroem stage (the exact solve would take these few hundred rows)
PARAMS = dict(C=10.0, solver="two-stage", kernels="gaussian:0.05,gaussian:0.2,poly:2", polish=False, n_jobs=1)


def test_memory_limit_sizes_parse():
    assert memory.parse_memory_limit("auto") is None
    assert memory.parse_memory_limit("1GB") == 10**9
    assert memory.parse_memory_limit("512MiB") == 512 * 2**20
    assert memory.parse_memory_limit("1.5 gib") == int(1.5 * 2**30)
    assert memory.parse_memory_limit(3 * 2**20) == 3 * 2**20
    for bad in ("lots", "1XB", "-1GB", 100, True, None, float("nan"), "inf"):
        with pytest.raises(ValueError, match="memory_limit"):
            memory.parse_memory_limit(bad)
    assert memory_size("2GB") == 2 * 10**9 and memory_size("auto") == "auto"
    with pytest.raises(argparse.ArgumentTypeError):
        memory_size("lots")
    with pytest.raises(ValueError, match="memory_limit"):
        FitSpec.from_params({**MWUMKLClassifier().get_params(), "memory_limit": "lots"})


def test_auto_memory_limit_is_a_constant_capped_by_the_cgroup(tmp_path, monkeypatch):
    """Never what is free now: the constant, or a quarter of the cgroup's limit where that is smaller."""
    monkeypatch.setattr(threads, "_CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(threads, "_PROC_SELF_CGROUP", str(tmp_path / "self"))
    (tmp_path / "self").write_text("0::/fit\n")
    (tmp_path / "fit").mkdir()
    assert memory.resolve_memory_limit("auto")[0] == memory.AUTO_MEMORY
    (tmp_path / "fit" / "memory.max").write_text("max\n")
    assert memory.resolve_memory_limit("auto")[0] == memory.AUTO_MEMORY
    (tmp_path / "memory.max").write_text(f"{2 * 2**30}\n")  # a parent's limit applies too
    limit, source = memory.resolve_memory_limit("auto")
    assert limit == 2**29 and "cgroup" in source
    assert memory.resolve_memory_limit("3GB")[0] == 3 * 10**9  # a given size is the user's


def test_a_fit_that_cannot_run_within_the_limit_refuses_before_any_work():
    X, y = _data(4000)
    seen = []
    with pytest.raises(two_stage.MemoryLimitError, match=r"^memory_limit .* too small .*memory_limit") as info:
        MWUMKLClassifier(solver="two-stage", memory_limit="100MB", callback=seen.append).fit(X, y)
    assert "\n" not in str(info.value) and seen == []  # one line, and no phase began
    with pytest.raises(two_stage.MemoryLimitError, match="n_components=3500"):
        MWUMKLClassifier(solver="two-stage", memory_limit="500MB", n_components=3500, callback=seen.append).fit(X, y)
    assert seen == []


@pytest.mark.timeout(300)
def test_a_fit_within_a_small_limit_keeps_its_columns_out_of_memory_and_the_same_model(small_ranks, monkeypatch):
    """Columns beyond the budget are spilled or computed again level by level: the same bits as kept in memory."""
    monkeypatch.setattr(budget, "WEIGHT_STAGE_MEMORY", 2**20)  # a few hundred rows' weight stage
    X, y = _data()
    load, storages, budgets = two_stage.LinearShard.load_problem, [], []

    def spy(shard, *args, **kwargs):
        storages.append(load(shard, *args, **kwargs))
        budgets.append(shard._budget)
        return storages[-1]

    monkeypatch.setattr(two_stage.LinearShard, "load_problem", spy)
    # the limit reaches the shards: a limit that leaves the first level's columns no room (its arrays alone fit)
    limit = budget.LINEAR_STAGE_RESERVE + budget._driver_bytes(16, len(y), budget.PLAN_THREADS) + 4096
    with threads.thread_limit(1):
        plan = driver.SOLVERS["two-stage"].memory_plan(FitSpec.of(**PARAMS, memory_limit=limit), len(y))
    est = MWUMKLClassifier(**PARAMS, memory_limit=limit, n_shards=2).fit(X, y)
    assert set(budgets) == {plan.columns_budget // 2} and "memory" not in storages
    assert est.n_components_ <= plan.rank_cap < 20
    # the same rank cap, columns out of memory (MWUMKL_FEATURE_MEMORY: the shards' budget in bytes)
    for rank_by in ("gain", "residual"):
        solver = replace(driver.SOLVERS["two-stage"], residual_tol=0.0, rank_by=rank_by)
        storages.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(driver.SOLVERS, "two-stage", solver)
            ref = MWUMKLClassifier(**PARAMS).fit(X, y)
            assert set(storages) == {"memory"}
            storages.clear()
            mp.setenv("MWUMKL_FEATURE_MEMORY", "1024")
            small = MWUMKLClassifier(**PARAMS).fit(X, y)
            assert storages and "memory" not in storages  # spilled or computed again at every pass
        assert not ref.features_spilled_ and ref.n_components_ > 16  # grown past the first level
        for name in ("support_", "dual_coef_", "intercept_", "n_components_", "nystroem_residual_"):
            np.testing.assert_array_equal(getattr(ref, name), getattr(small, name), err_msg=f"{rank_by} {name}")
        assert ref.rank_stop_reason_ == small.rank_stop_reason_


@pytest.mark.timeout(300)
def test_the_rank_stops_where_the_memory_limit_caps_it(small_ranks, monkeypatch):
    X, y = _data()
    monkeypatch.setattr(budget, "WEIGHT_STAGE_MEMORY", 2**20)
    monkeypatch.setitem(driver.SOLVERS, "two-stage", replace(driver.SOLVERS["two-stage"], residual_tol=0.0))
    limit = budget.LINEAR_STAGE_RESERVE + budget._driver_bytes(40, len(y), budget.PLAN_THREADS)
    est = MWUMKLClassifier(**PARAMS, memory_limit=limit).fit(X, y)
    assert 16 < est.n_components_ <= 40
    if est.rank_stop_reason_ != "gain":  # grown to the cap: the memory limit stopped it
        assert est.rank_stop_reason_ == "memory_limit"
    with pytest.warns(two_stage.ResidualWarning, match="memory_limit"):
        est = MWUMKLClassifier(**PARAMS, memory_limit=limit).set_params(C=10.0)
        monkeypatch.setitem(driver.SOLVERS, "two-stage", replace(driver.SOLVERS["two-stage"], rank_by="residual"))
        est.fit(X, y)
    assert est.n_components_ <= 40 and est.rank_stop_reason_ == "memory_limit"


@pytest.mark.timeout(300)
def test_the_rank_follows_the_held_out_error_and_says_why_it_stopped(small_ranks, tmp_path):
    X, y = _data()
    est = MWUMKLClassifier(**PARAMS).fit(X, y)
    assert est.rank_stop_reason_ in two_stage.RANK_STOP_REASONS
    ranks = list(est.rank_path_)
    assert ranks == sorted(ranks) and ranks[0] == 16 and len(est.support_) in ranks
    assert all(0 <= e <= 1 for e in est.rank_path_.values())
    if est.rank_stop_reason_ == "gain" and len(ranks) > 1:  # the last doubling did not pay by a standard error
        assert est.rank_path_[ranks[-2]] - est.rank_path_[ranks[-1]] < 0.05
    assert "the rank stopped" in est.summary()
    est.save(tmp_path / "m.npz")
    back = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert back.rank_stop_reason_ == est.rank_stop_reason_ and back.rank_path_ == est.rank_path_
    assert back.memory_limit == "auto"
    # a separable problem: the first level's held-out error is already 0, nothing more to gain
    y_easy = np.where(X[:, 0] > 0.5, 1.0, -1.0)
    easy = MWUMKLClassifier(**{**PARAMS, "kernels": "poly:1"}).fit(X, y_easy)
    assert easy.rank_stop_reason_ in ("gain", "residual") and easy.n_components_ <= 32
    given = MWUMKLClassifier(**PARAMS, n_components=20).fit(X, y)
    assert given.rank_stop_reason_ == "given" and not hasattr(given, "rank_path_")


@pytest.mark.timeout(300)
def test_a_doubling_that_does_worse_on_the_held_out_rows_is_not_kept(small_ranks, monkeypatch):
    """The rank before it is the model's (its features a level of the stored columns), C checked at that rank."""
    X, y = _data()
    real, calls = two_stage.TwoStageSolver._held_losses, []

    def losses(task, held, decisions):
        calls.append(decisions.shape)
        out = real(task, held, decisions)
        if len(calls) <= 2:  # the first two ranks: 10 % then 20 % held-out error
            out = np.zeros(len(out))
            out[: len(out) // (10 // len(calls))] = 1.0 / len(out)
        return out

    monkeypatch.setattr(two_stage.TwoStageSolver, "_held_losses", staticmethod(losses))
    est = MWUMKLClassifier(**{**PARAMS, "C": "auto"}).fit(X, y)
    assert est.rank_stop_reason_ == "gain" and list(est.rank_path_) == [16, 32]
    assert est.rank_path_[16] < est.rank_path_[32] and est.n_components_ <= len(est.support_) == 16
    assert len(est.final_C_path_) == 4 and np.mean(est.predict(X) == y) > 0.7


def test_each_dask_shard_gets_its_workers_memory():
    """``memory_limit`` per process on Dask: "auto" is a share of each worker's Dask limit less what it holds, a
    given size each worker's as it is; shards placed together share their worker's."""
    gb = 10**9
    workers = {"a": (4 * gb, 300 * 10**6, 1), "b": (4 * gb, 500 * 10**6, 2)}
    auto = budget.shard_memory(workers, 10**6, 2)
    assert auto.budget == int(memory.WORKER_SHARE * 4 * gb) - 2 * budget.HELD_STEP  # 500 MB held: two steps
    assert 500_000 <= auto.rows < 500_000 + partition.ROW_BLOCK  # whole row blocks
    assert budget.shard_memory(workers, 10**6, 2, given=2 * gb).budget == 2 * gb
    assert budget.shard_memory(workers, 10**6, 4).budget == auto.budget // 2
    assert budget.shard_memory({"c": (0, 0, 1)}, 10**6, 1).budget == memory.AUTO_MEMORY


def test_the_rank_cap_on_dask_counts_a_shards_rows_against_its_workers_memory():
    """The columns are distributed: the cluster's memory, not the client's, buys rank (and a shard's columns)."""
    n, limit = 200_000, 2**30
    args = dict(rank_max=3000, rank_min=500)
    local = budget.memory_plan(limit, "test", n, **args)
    shards = budget.shard_memory({"a": (4 * 10**9, 0, 1), "b": (4 * 10**9, 0, 1)}, n, 2)
    dask = budget.memory_plan(limit, "test", n, **args, shards=shards)
    assert local.rank_cap < 1500 < dask.rank_cap and dask.per_shard and not local.per_shard
    # a shard keeps its columns at the cap within its worker's budget, the client's limit not divided
    assert shards.rows * dask.rank_cap * 4 <= dask.columns_budget <= shards.budget
    assert dask.columns_budget > local.columns_budget
    with pytest.raises(budget.MemoryLimitError, match="memory_limit.*Dask workers"):
        budget.memory_plan(limit, "test", n, **args, shards=budget.shard_memory({"a": (1, 0, 1)}, n, 1, given=2**20))


distributed = pytest.importorskip("distributed")


@pytest.mark.timeout(300, method="thread")
def test_a_dask_fit_gives_each_shard_its_workers_budget_and_the_local_model(small_ranks, monkeypatch):
    monkeypatch.setattr(budget, "WEIGHT_STAGE_MEMORY", 2**20)
    X, y = _data()
    load, budgets = two_stage.LinearShard.load_problem, []

    def spy(shard, *args, **kwargs):
        budgets.append(shard._budget)
        return load(shard, *args, **kwargs)

    monkeypatch.setattr(two_stage.LinearShard, "load_problem", spy)
    # In-process workers report the whole test process as what they hold (it grows over a suite run, past 1 GB in
    # CI): fix it at 300 MB, as a fresh worker process holds, so the budget is the rule's, not the run's.
    reported = solver_module.worker_memory

    def fresh_workers(client):
        return {w: (limit, 300 * 2**20, t) for w, (limit, _, t) in reported(client).items()}

    monkeypatch.setattr(solver_module, "worker_memory", fresh_workers)
    ref = MWUMKLClassifier(**PARAMS).fit(X, y)
    budgets.clear()
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0",
                            memory_limit="3GB") as client:  # fmt: skip
        spec = FitSpec.of(**PARAMS, engine="dask")
        plan = driver.SOLVERS["two-stage"].memory_plan(spec, len(y), client)
        est = MWUMKLClassifier(**PARAMS, engine="dask", client=client).fit(X, y)
    # each shard its worker's budget (3 GB's share less what the process holds), not half the client's 1 GiB
    assert plan.per_shard and plan.shards.n_shards == 2
    assert plan.columns_budget > memory.AUTO_MEMORY // 2 and set(budgets) == {plan.columns_budget}
    assert "each shard" in est.shard_layout_ and "columns kept in memory" in est.shard_layout_
    for name in ("support_", "dual_coef_", "intercept_", "C_"):
        np.testing.assert_array_equal(getattr(est, name), getattr(ref, name), err_msg=name)
    np.testing.assert_array_equal(est.predict(X), ref.predict(X))


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_a_dask_fit_leaves_a_small_stores_rows_out_of_the_client(tmp_path, monkeypatch, engine):
    """A store the local engine reads into memory stays out of core on Dask past the exact solve's rows: its shards
    read their own rows, none pass through the client (which held all of them at 10^6 rows of 20 features)."""
    from mwumkl_dist import estimator as estimator_module
    from mwumkl_dist.data.problems import DataStoreInput, FeatureInput
    from mwumkl_dist.stores import write_data_store

    X, y = _data(n=two_stage.exact.EXACT_POINTS + 1)
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=4096)
    monkeypatch.setenv("MWUMKL_STORE_IN_MEMORY_BYTES", str(2**30))  # small enough to be read
    seen = []

    def stop(spec, data, **kwargs):
        seen.append(data)
        raise KeyboardInterrupt

    monkeypatch.setattr(estimator_module, "fit_model", stop)
    with pytest.raises(KeyboardInterrupt):
        MWUMKLClassifier(engine=engine).fit(store)
    assert isinstance(seen[0], DataStoreInput if engine == "dask" else FeatureInput)

"""Ray workers writing straight into replay shards; a shard killed mid-run; shard checkpoints.

The workers run the scripted collectors of ``test_ray.py`` (n-step windows folded in the worker, rows checkable by
brute force from their observation codes ``[env, episode, step]``), so a shard's rows can be checked whole: each
env's windows, in the order the env stepped, nothing missing, nothing of another shard.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import pytest
import torch
from collectors import check_rows, episode_script, prioritizing_collector, row_priority, scripted_collector

from ptl_rl import BatchSampler, PrioritizedDraws, ReplayBuffer, TransitionBatch, UniformDraws
from ptl_rl.distributed import (
    INITIAL_PRIORITY_FIELD,
    RayWorkers,
    ReplayShard,
    ReplayShards,
    ShardedReplay,
    ShardWriter,
    ShardWrites,
)

ray = pytest.importorskip("ray")

K = 3
N = 3  # n-step windows, folded in the worker
NUM_ENVS = 3


def big_uniform_buffer() -> ReplayBuffer:
    return ReplayBuffer(capacity=100_000, draws=UniformDraws())


def _shard_rows(shards: ReplayShards) -> list[dict[str, np.ndarray]]:
    """Every row of every shard, in stored order (no ring wrapped: capacity is far above what the tests write)."""
    out = []
    for handle in shards.handles:
        size = ray.get(handle.stats.remote()).size
        rows = ray.get(handle.rows.remote(np.arange(size)))
        out.append({name: np.asarray(value) for name, value in rows.items()})
    return out


def _assert_streams_whole_and_in_order(rows: dict[str, np.ndarray], shard: int) -> None:
    """Each env's windows start at steps 0, 1, .. of its episodes 0, 1, .. in order; the last episode may be cut."""
    assert ((rows["env_id"] % K) == shard).all(), "a row of another shard's env"
    for env in np.unique(rows["env_id"]).tolist():
        mine = rows["env_id"] == env
        index, episode, step = rows["obs"][mine].T.astype(np.int64)
        assert (index == index[0]).all()
        expected_episode, expected_step = [], []
        for e in range(int(episode.max()) + 1):
            length = int(episode_script(int(index[0]), e)[0])
            expected_episode += [e] * length
            expected_step += list(range(length))
        count = len(episode)
        assert episode.tolist() == expected_episode[:count], f"env {env}: episodes out of order or missing"
        assert step.tolist() == expected_step[:count], f"env {env}: windows out of order or missing"


def test_workers_write_into_the_shards_and_the_learner_only_counts(ray_session, monkeypatch) -> None:
    """Two workers (3 envs each, 3-step windows folded in the worker) write through their own ShardWriters;
    the learner's stage yields counts, samples through ShardedReplay, and no row passes through its process."""

    def refuse(*args: object) -> None:
        raise AssertionError("a row was written from the learner's process")

    monkeypatch.setattr(ShardWriter, "add", refuse)  # (the workers are other processes: theirs is untouched)
    shards = ReplayShards(big_uniform_buffer, K, seed=0)
    factory = functools.partial(scripted_collector, n=N, num_envs=NUM_ENVS)
    workers = RayWorkers(factory, 2, shards=shards, steps_per_call=4, actor_options={"num_cpus": 0.5})
    seen: list[object] = []
    original = RayWorkers.step

    def spy(self: RayWorkers) -> object:
        out = original(self)
        seen.append(out)
        return out

    monkeypatch.setattr(RayWorkers, "step", spy)
    try:
        with pytest.raises(ValueError, match="max_staleness"):
            RayWorkers(factory, 2, shards=shards, max_staleness=1)
        replay = ShardedReplay(shards, workers, warmup=60, transitions_per_yield=8, seed=1)
        sampler = BatchSampler(replay, batch_size=32)
        for _ in range(40):
            batch = next(sampler)
            assert len(batch) == 32
            assert (batch.shard == batch.env_id % K).all()
            check_rows({k: np.asarray(v) for k, v in batch.items()}, n=N)
        workers.drain()  # every call in flight answered and counted: counters and shards now agree
    finally:
        workers.close()
    assert seen and all(isinstance(out, ShardWrites) for out in seen), "the learner's stage yields counts only"
    stored = _shard_rows(shards)
    shards.close()
    total = sum(len(rows["env_id"]) for rows in stored)
    assert total == workers.rows_stored  # every row stored is counted, once
    assert 0 < sum(out.rows for out in seen) <= total  # (drain counted the calls in flight, not yielded)
    # each env step makes one window, but the last N - 1 of each env's unfinished episode wait in the worker
    assert 0 <= workers.total_steps - total <= 2 * NUM_ENVS * (N - 1)
    assert workers.episodes_finished > 0 and workers.episode_stats()["episodes"] == workers.episodes_finished
    env_ids = set()
    for shard, rows in enumerate(stored):
        check_rows(rows, n=N)
        _assert_streams_whole_and_in_order(rows, shard)
        env_ids |= set(np.unique(rows["env_id"]).tolist())
    assert env_ids == set(range(2 * NUM_ENVS)), "worker w's envs are 3w .. 3w + 2: distinct across workers"


ALPHA, EPS = 0.6, 1e-6


def big_prioritized_buffer() -> ReplayBuffer:
    return ReplayBuffer(capacity=100_000, draws=PrioritizedDraws(alpha=ALPHA, beta=0.4, eps=EPS))


def test_a_workers_rows_dropped_at_a_dead_shard_are_counted_by_the_learner(ray_session) -> None:
    """Shard 1 is dead for good: a worker's adds to it are dropped; every ShardWrites says how many, and the
    learner's counts add up to what the live shards hold."""
    shards = ReplayShards(big_uniform_buffer, K, seed=6, max_restarts=0)
    ray.get([handle.stats.remote() for handle in shards.handles])
    ray.kill(shards.handles[1], no_restart=True)
    factory = functools.partial(scripted_collector, n=N, num_envs=NUM_ENVS)  # envs 0, 1, 2: env 1 is shard 1's
    workers = RayWorkers(factory, 1, shards=shards, steps_per_call=4, actor_options={"num_cpus": 0.5})
    try:
        seen = [next(workers) for _ in range(4)]
        workers.drain()
    finally:
        workers.close()
    assert all(isinstance(out, ShardWrites) for out in seen)
    assert all(out.dropped > 0 for out in seen) and sum(out.dropped for out in seen) <= workers.rows_dropped
    live = [shards.handles[0], shards.handles[2]]
    rows = [ray.get(handle.rows.remote(np.arange(ray.get(handle.stats.remote()).size))) for handle in live]
    assert workers.rows_stored == sum(len(r.env_id) for r in rows) > 0
    assert sorted({int(e) for r in rows for e in r.env_id}) == [0, 2]
    # env 1 steps with envs 0 and 2 in one vector env: its windows are dropped as theirs are stored
    assert abs(workers.rows_dropped - workers.rows_stored / 2) <= 2 * (N - 1) + 4
    shards.close()


def test_workers_initial_priorities_are_the_stored_ones(ray_session) -> None:
    """A worker's pipeline attaches each row's priority (Ape-X); the shards store exactly those, not the maximum."""
    shards = ReplayShards(big_prioritized_buffer, K, seed=4)
    factory = functools.partial(prioritizing_collector, n=N, num_envs=NUM_ENVS)
    workers = RayWorkers(factory, 1, shards=shards, steps_per_call=4, actor_options={"num_cpus": 0.5})
    try:
        replay = ShardedReplay(shards, workers, warmup=40, transitions_per_yield=8, seed=5)
        sampler = BatchSampler(replay, batch_size=16)
        for _ in range(5):
            batch = next(sampler)
            assert INITIAL_PRIORITY_FIELD not in batch
        workers.drain()
        for handle, rows in zip(shards.handles, _shard_rows(shards), strict=True):
            assert INITIAL_PRIORITY_FIELD not in rows and len(rows["env_id"]) > 0
            check_rows(rows, n=N)
            expected = (row_priority(rows["obs"], rows["reward"]) + EPS) ** ALPHA  # brute force, from the rows
            np.testing.assert_allclose(ray.get(handle.priorities.remote()), expected, rtol=1e-6)
            assert len(np.unique(expected)) > 1  # (not all one value, as the maximum rule would give)
    finally:
        workers.close()
        shards.close()


@ray.remote
def _recording_collector(writer: ShardWriter, envs: list[int], steps: int, stop: Any) -> dict[str, list[int]]:
    """Writes ``steps`` rows per env (``obs`` = a row id unique over the test), one env's row per add, each add
    waited for, until ``stop`` (an actor) says so; returns the ids stored and the ids dropped (the writer's
    record)."""
    stored, dropped = [], []
    for step in range(steps):
        for env in envs:
            row_id = env * 100_000 + step
            before = writer.rows_dropped
            writer.add(
                TransitionBatch(
                    obs=np.array([[row_id]], np.float32), env_id=np.array([env]), reward=np.zeros(1, np.float32)
                )
            )
            writer.flush()
            (dropped if writer.rows_dropped > before else stored).append(row_id)
        time.sleep(0.002)
        if step % 20 == 19 and ray.get(stop.stopped.remote()):
            break
    return {"stored": stored, "dropped": dropped}


class _Stop:
    def __init__(self) -> None:
        self.flag = False

    def stop(self) -> None:
        self.flag = True

    def stopped(self) -> bool:
        return self.flag


def _incarnation(handle: Any) -> int:
    return int(ray.get(handle.stats.remote()).incarnation)


def test_a_killed_shard_restarts_empty_and_training_goes_on(ray_session) -> None:
    """Shard 1 is killed mid-run (Ray restarts it): the learner goes on sampling, every row of every batch after
    the restart is stored now where the batch says, an update for a row of the dead life is ignored, the writer
    drops only the adds in flight, and the shard fills again."""
    empty = ReplayShard(big_prioritized_buffer).sample(5)  # a shard restarted empty since the split: no rows
    assert empty.batch is None and empty.stats.size == 0
    shards = ReplayShards(big_prioritized_buffer, K, seed=2)
    stop = ray.remote(_Stop).options(num_cpus=0).remote()
    envs = list(range(6))  # env e -> shard e % 3
    collector = _recording_collector.options(num_cpus=0.5).remote(shards.writer(), envs, 100_000, stop)
    try:
        replay = ShardedReplay(shards, warmup=120, seed=3, prefetch=1, sync_updates=True)
        next(replay)
        for _ in range(5):
            replay.sample(32).update_priorities(np.ones(32))
        old_batch = replay.sample(64)
        old_life = _incarnation(shards.handles[1])
        assert (old_batch.shard == 1).any() and (old_batch.shard_incarnation[old_batch.shard == 1] == old_life).all()
        ray.kill(shards.handles[1], no_restart=False)
        deadline = time.monotonic() + 60
        while True:  # the restart: a call sent now waits for the new life (or fails while it dies)
            try:
                if _incarnation(shards.handles[1]) != old_life:
                    break
            except ray.exceptions.RayActorError:
                pass
            assert time.monotonic() < deadline, "shard 1 never restarted"
            time.sleep(0.05)
        new_life = _incarnation(shards.handles[1])
        batches = []
        for _ in range(30):  # sampling goes on throughout (the first requests may meet the dead shard)
            batch = replay.sample(32)
            assert len(batch) == 32
            batch.update_priorities(np.full(32, 2.0))
            batches.append(batch)
        # an update for the dead life's rows is ignored: shard 1's slots now hold other rows
        stale = old_batch.update_priorities(np.full(64, 77.0))
        assert stale == int((old_batch.shard == 1).sum())  # (shards 0 and 2 never wrapped: their rows apply)
        assert ray.get(shards.handles[1].counters.remote())["foreign_updates"] == int((old_batch.shard == 1).sum())
        ray.get(stop.stop.remote())
        record = ray.get(collector)
    finally:
        ray.get(stop.stop.remote())
    stats = shards.stats()
    assert stats[1].incarnation == new_life and stats[1].size > 0, "shard 1 fills again"
    assert not np.isclose(ray.get(shards.handles[1].priorities.remote()), (77.0 + EPS) ** ALPHA).any()
    stored_ids = set(record["stored"])
    # the adds that failed while shard 1 died and restarted (Ray fails calls sent while it is dead, too): only its
    # envs' rows, dropped, never retried; the writer went on with the next add
    assert all(row_id // 100_000 % K == 1 for row_id in record["dropped"]), record["dropped"]
    assert len(stored_ids) > 120
    # the first batch may be the request prefetched before the kill, answered by the old life: drawn while its
    # rows were stored; every later one was asked after the restart
    for batch in batches[1:]:
        ids = batch.obs[:, 0].astype(np.int64)
        assert set(ids.tolist()) <= stored_ids, "a row the writer never stored"
        for k in range(K):
            mine = batch.shard == k
            if not mine.any():
                continue
            life = _incarnation(shards.handles[k])
            assert (batch.shard_incarnation[mine] == life).all(), "a row of a shard's dead life"
            now = ray.get(shards.handles[k].rows.remote(batch.indices[mine])).obs[:, 0].astype(np.int64)
            np.testing.assert_array_equal(now, ids[mine])  # the row is stored there now (no ring wrapped)
            assert (ids[mine] // 100_000 % K == k).all()
    shards.close()


def _no_arrays(value: object) -> bool:
    if isinstance(value, dict):
        return all(_no_arrays(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_no_arrays(v) for v in value)
    return isinstance(value, (str, int, float, bool, type(None)))


def test_shards_save_into_their_own_directories_and_a_checkpoint_refers_to_them(ray_session, tmp_path) -> None:
    """Each shard saves its buffer with save_buffer into its own directory; the state refers to them, holds no
    arrays (torch.load(weights_only=True) reads it), and loads into new shards: same rows, same priorities,
    new incarnations (an update of a batch drawn before the load is ignored)."""
    rows = TransitionBatch(
        obs=np.arange(90, dtype=np.float32)[:, None], env_id=np.arange(90) % 6, reward=np.zeros(90, np.float32)
    )
    shards = ReplayShards(big_prioritized_buffer, K, seed=4, checkpoint_dir=tmp_path / "a")
    target = ReplayShards(big_prioritized_buffer, K, seed=5, checkpoint_dir=tmp_path / "b")
    try:
        writer = shards.writer()
        writer.add(rows)
        writer.flush()
        replay = ShardedReplay(shards, warmup=90, seed=6, sync_updates=True)
        next(replay)
        batch = replay.sample(40)
        batch.update_priorities(batch.obs[:, 0] / 10.0)
        state = replay.state_dict()
        assert _no_arrays(state), state
        path = tmp_path / "checkpoint.pt"
        torch.save(state, path)
        loaded = torch.load(path, weights_only=True)
        assert [s["directory"] for s in loaded["shards"]["saves"]] == [
            str(tmp_path / "a" / f"shard-{k:03d}") for k in range(K)
        ]
        other = target.writer()
        other.add(rows.rows(np.arange(30)))
        other.flush()
        restored = ShardedReplay(target, warmup=30, seed=7, sync_updates=True)
        next(restored)
        before = restored.sample(16)  # drawn from the rows the load replaces
        lives = [s.incarnation for s in target.stats()]
        restored.load_state_dict(loaded)
        assert restored.batches_sampled == replay.batches_sampled and restored.applied_updates == 40
        for k in range(K):
            size = ray.get(shards.handles[k].stats.remote()).size
            assert ray.get(target.handles[k].stats.remote()).size == size
            want, got = (ray.get(s.handles[k].rows.remote(np.arange(size))) for s in (shards, target))
            np.testing.assert_array_equal(got.obs, want.obs)
            np.testing.assert_array_equal(
                ray.get(target.handles[k].priorities.remote()), ray.get(shards.handles[k].priorities.remote())
            )
        assert all(s.incarnation != life for s, life in zip(target.stats(), lives, strict=True))
        assert before.update_priorities(np.full(16, 9.0)) == 16  # rows of the shards' lives before the load
        assert len(restored.sample(32)) == 32
        shards.state_dict()  # a later save to the same directories replaces the one the checkpoint names
        with pytest.raises(ValueError, match="refers to save"):
            target.load_state_dict(loaded["shards"])
        with pytest.raises(ValueError, match="checkpoint_dir"):
            ReplayShards(big_prioritized_buffer, 1).state_dict()
    finally:
        shards.close()
        target.close()


def test_under_ddp_only_rank_0_saves_and_loads_the_shared_shards(ray_session, tmp_path) -> None:
    """Every rank's learner samples the same shards and only rank 0's state is written: a rank-1 state saves no
    shards (its save would replace rank 0's in the same directories), and a rank-1 learner that loads rank 0's
    checkpoint leaves the shards to rank 0 (no second load: same incarnations) and waits for warmup rows again."""
    rows = TransitionBatch(
        obs=np.arange(60, dtype=np.float32)[:, None], env_id=np.arange(60) % 6, reward=np.zeros(60, np.float32)
    )
    shards = ReplayShards(big_prioritized_buffer, K, seed=4, checkpoint_dir=tmp_path / "d")
    try:
        writer = shards.writer()
        writer.add(rows)
        writer.flush()
        learners = [ShardedReplay(shards, warmup=60, seed=6, sync_updates=True) for _ in range(2)]
        learners[1].set_rank(1)
        for learner in learners:
            next(learner)
        first = learners[0].state_dict()
        save_ids = [save["save_id"] for save in first["shards"]["saves"]]
        assert learners[1].state_dict()["shards"] is None  # rank 1 saved nothing: rank 0's saves stand
        lives = [s.incarnation for s in shards.stats()]
        resumed = ShardedReplay(shards, warmup=60, seed=6, sync_updates=True)
        resumed.set_rank(1)  # as PipelineCheckpoint assigns it before the restore
        resumed.load_state_dict(first)
        assert [s.incarnation for s in shards.stats()] == lives  # not loaded again by rank 1
        assert not resumed._warm  # it waits for warmup rows, which rank 0's load brings back
        learners[0].load_state_dict(first)  # rank 0 loads the saves its state names, once
        assert all(s.incarnation != life for s, life in zip(shards.stats(), lives, strict=True))
        assert [save["save_id"] for save in first["shards"]["saves"]] == save_ids
        assert len(resumed.sample(16)) == 16 and len(learners[0].sample(16)) == 16
    finally:
        shards.close()

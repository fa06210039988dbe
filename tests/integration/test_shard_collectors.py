"""Ray workers writing straight into replay shards.

The workers run the scripted collectors of ``test_ray.py`` (n-step windows folded in the worker, rows checkable by
brute force from their observation codes ``[env, episode, step]``), so a shard's rows can be checked whole: each
env's windows, in the order the env stepped, nothing missing, nothing of another shard.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from collectors import check_rows, episode_script, scripted_collector

from ptl_rl import BatchSampler, ReplayBuffer, UniformDraws
from ptl_rl.distributed import RayWorkers, ReplayShards, ShardedReplay, ShardWriter, ShardWrites

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

"""The sharded replay on a local Ray: 3 shards of unequal sizes sample as one buffer holding every row.

Rows carry their id in ``obs`` and are routed by ``env_id % 3``, so each shard's size is known. Sampled
frequencies are compared by chi-square with the probabilities of one reference buffer holding all the rows,
importance weights with a brute-force computation over all priorities; priority updates are checked on the
shard that holds each row.
"""

from __future__ import annotations

import asyncio
import functools
import io
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from stats import SIGNIFICANCE, chi_square_quantile, chi_square_statistic

import ptl_rl
from ptl_rl import BatchSampler, PrioritizedDraws, ReplayBuffer, TransitionBatch, UniformDraws
from ptl_rl.distributed import RateLimit, ReplayShard, ReplayShards, ShardedReplay, ShardWriter, shard_of
from ptl_rl.distributed.rate_limit import RateLimiter
from ptl_rl.distributed.shard_writer import split_by_shard

ray = pytest.importorskip("ray")

K = 3
ALPHA, BETA, EPS = 0.7, 0.5, 1e-6
# env e holds ENV_ROWS[e] rows; shard k holds envs k and k + 3: sizes 10 + 40, 25 + 5, 60 + 15 (unequal)
ENV_ROWS = [10, 25, 60, 40, 5, 15]
N_ROWS = sum(ENV_ROWS)


def all_rows() -> TransitionBatch:
    """``N_ROWS`` rows: ``obs`` [N, 1] float32 = the row id, ``env_id`` int64 [N], ``reward`` float32 [N]."""
    env_id = np.repeat(np.arange(len(ENV_ROWS)), ENV_ROWS).astype(np.int64)
    ids = np.arange(N_ROWS)
    return TransitionBatch(
        obs=ids[:, None].astype(np.float32), env_id=env_id, reward=ids.astype(np.float32), action=ids % 2
    )


def priority_of(ids: np.ndarray) -> np.ndarray:
    """The priority the tests give row ``id`` (float64): 0.5 .. 4.0, unequal across and within shards."""
    return 0.5 + (ids * 7 % 8) / 2.0


def uniform_buffer(capacity: int = 200) -> ReplayBuffer:
    return ReplayBuffer(capacity=capacity, draws=UniformDraws())


def prioritized_buffer(capacity: int = 200) -> ReplayBuffer:
    return ReplayBuffer(capacity=capacity, draws=PrioritizedDraws(alpha=ALPHA, beta=BETA, eps=EPS))


def _fill(shards: ReplayShards) -> None:
    writer = shards.writer()
    rows = all_rows()
    for lo in range(0, N_ROWS, 16):  # batches mixing envs, as a vector env's
        writer.add(rows.rows(slice(lo, lo + 16)))
    writer.flush()


def _set_priorities(shards: ReplayShards) -> None:
    """Every row gets ``priority_of(id)``, set on its shard by slot (rows were written in id order per shard)."""
    for handle in shards.handles:
        size = ray.get(handle.stats.remote()).size
        ids = ray.get(handle.rows.remote(np.arange(size))).obs[:, 0].astype(np.int64)
        ray.get(handle.update_priorities.remote(np.arange(size), priority_of(ids), None))


@pytest.fixture(scope="module")
def uniform_shards(ray_session):
    shards = ReplayShards(uniform_buffer, K, seed=0)
    _fill(shards)
    yield shards
    shards.close()


@pytest.fixture(scope="module")
def prioritized_shards(ray_session):
    shards = ReplayShards(prioritized_buffer, K, seed=1)
    _fill(shards)
    _set_priorities(shards)
    yield shards
    shards.close()


def reference_probabilities(prioritized: bool) -> np.ndarray:
    """P(row id) in one local buffer holding all the rows (float64 [N])."""
    buffer = prioritized_buffer(N_ROWS) if prioritized else uniform_buffer(N_ROWS)
    buffer.add(all_rows())
    if not prioritized:
        return np.full(N_ROWS, 1.0 / len(buffer))
    buffer.update_priorities(np.arange(N_ROWS), priority_of(np.arange(N_ROWS)))
    assert isinstance(buffer.draws, PrioritizedDraws)
    leaves = buffer.draws.priorities()
    probs: np.ndarray = leaves / leaves.sum()
    return probs


def _frequencies(replay: ShardedReplay, batches: int, batch_size: int) -> np.ndarray:
    counts = np.zeros(N_ROWS, dtype=np.int64)
    for _ in range(batches):
        batch = replay.sample(batch_size)
        np.add.at(counts, batch.obs[:, 0].astype(np.int64), 1)
    return counts


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_frequencies_across_unequal_shards_match_one_buffer_holding_all_rows(
    prioritized: bool, uniform_shards: ReplayShards, prioritized_shards: ReplayShards
) -> None:
    shards = prioritized_shards if prioritized else uniform_shards
    assert [s.size for s in shards.stats()] == [50, 30, 75]  # unequal shards
    replay = ShardedReplay(shards, warmup=N_ROWS, seed=3, prefetch=2)
    assert next(replay) is replay and len(replay) == N_ROWS
    counts = _frequencies(replay, batches=130, batch_size=150)
    statistic, dof = chi_square_statistic(counts, reference_probabilities(prioritized))
    assert statistic < chi_square_quantile(dof, SIGNIFICANCE), (statistic, dof)
    # the shards' shares too (a wrong split with right within-shard draws would pass the pooled cells less often)
    shard = shard_of(all_rows().env_id, K)
    per_shard = np.bincount(shard, weights=counts, minlength=K)
    expected = np.bincount(shard, weights=reference_probabilities(prioritized), minlength=K)
    statistic, dof = chi_square_statistic(per_shard.astype(np.int64), expected)
    assert statistic < chi_square_quantile(dof, SIGNIFICANCE), (per_shard, expected)


def test_importance_weights_equal_brute_force_over_all_priorities(prioritized_shards: ReplayShards) -> None:
    replay = ShardedReplay(prioritized_shards, warmup=N_ROWS, seed=4, prefetch=0)
    next(replay)
    assert replay.beta == BETA
    mass = (priority_of(np.arange(N_ROWS)) + EPS) ** ALPHA
    for _ in range(5):
        batch = replay.sample(64)
        ids = batch.obs[:, 0].astype(np.int64)
        probs = mass[ids] / mass.sum()  # P(i) over every row of every shard
        raw = (N_ROWS * probs) ** -BETA
        assert batch.weights.dtype == np.float32 and batch.weights.shape == (64,)
        np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-5)
        assert batch.weights.max() == 1.0
        # each row names its shard, slot and stamp, and the shard holds that row there
        assert np.array_equal(batch.shard, shard_of(batch.env_id, K))
        for k in range(K):
            rows = batch.shard == k
            stored = ray.get(prioritized_shards.handles[k].rows.remote(batch.indices[rows]))
            assert np.array_equal(stored.obs, batch.obs[rows])


def test_initial_priorities_written_with_the_rows_are_stored_and_drawn_by(uniform_shards: ReplayShards) -> None:
    """Ape-X's worker-side priorities: rows written with ``priority_of(id)`` hold exactly that weight, sampling
    follows them as one buffer holding all rows with those priorities, and bad ones are refused, nothing sent."""
    shards = ReplayShards(prioritized_buffer, K, seed=2)
    try:
        writer, rows, ids = shards.writer(), all_rows(), np.arange(N_ROWS)
        for lo in range(0, 96, 16):  # batches mixing envs: the priorities are routed with their rows
            writer.add(rows.rows(slice(lo, lo + 16)), priorities=priority_of(ids[lo : lo + 16]))
        tail = rows.rows(slice(96, N_ROWS))  # the rest as a collector's pipeline gives them: a field (torch)
        tail[ptl_rl.distributed.INITIAL_PRIORITY_FIELD] = torch.from_numpy(priority_of(ids[96:]).astype(np.float32))
        writer.add(tail)
        writer.flush()
        for k, handle in enumerate(shards.handles):  # brute force: every stored slot's weight from its row's id
            size = ray.get(handle.stats.remote()).size
            stored = ray.get(handle.rows.remote(np.arange(size)))
            assert ptl_rl.distributed.INITIAL_PRIORITY_FIELD not in stored
            slot_ids = stored.obs[:, 0].astype(np.int64)
            assert (shard_of(stored.env_id, K) == k).all()
            expected = (priority_of(slot_ids) + EPS) ** ALPHA
            np.testing.assert_allclose(ray.get(handle.priorities.remote()), expected, rtol=1e-6)
        replay = ShardedReplay(shards, warmup=N_ROWS, seed=8, prefetch=2)
        next(replay)
        counts = _frequencies(replay, batches=60, batch_size=150)
        statistic, dof = chi_square_statistic(counts, reference_probabilities(True))
        assert statistic < chi_square_quantile(dof, SIGNIFICANCE), (statistic, dof)
        batch = replay.sample(64)
        mass = (priority_of(batch.obs[:, 0].astype(np.int64)) + EPS) ** ALPHA
        raw = (N_ROWS * mass / ((priority_of(ids) + EPS) ** ALPHA).sum()) ** -BETA
        np.testing.assert_allclose(batch.weights, raw / raw.max(), rtol=1e-4)

        before = shards.stats()
        one = rows.rows(slice(0, 4))
        for bad, match in [
            (np.array([1.0, np.nan, 1.0, 1.0]), "finite"),
            (np.array([1.0, -2.0, 1.0, 1.0]), ">= 0"),
            (np.ones(3), "3 initial priorities for 4 rows"),
        ]:
            with pytest.raises(ValueError, match=match):
                writer.add(one, priorities=bad)
        both = rows.rows(slice(0, 4))
        both[ptl_rl.distributed.INITIAL_PRIORITY_FIELD] = np.ones(4)
        with pytest.raises(ValueError, match="give them once"):
            writer.add(both, priorities=np.ones(4))
        assert writer.rows_written == N_ROWS and shards.stats() == before  # nothing sent, nothing lost
    finally:
        shards.close()
    uniform_before = uniform_shards.stats()
    writer = uniform_shards.writer()
    writer.add(all_rows().rows(slice(0, 4)), priorities=np.ones(4))
    with pytest.raises(TypeError, match="PrioritizedDraws"):  # a shard without priorities refuses, storing nothing
        writer.flush()
    assert uniform_shards.stats() == uniform_before


def test_priority_updates_go_to_the_shard_holding_each_row(prioritized_shards: ReplayShards) -> None:
    replay = ShardedReplay(prioritized_shards, warmup=N_ROWS, seed=5, prefetch=0)
    next(replay)
    batch = replay.sample(48)
    ids = batch.obs[:, 0].astype(np.int64)
    td = torch.tensor(-(1.0 + ids % 5), dtype=torch.float32)  # one value per row id, so repeated rows agree
    assert batch.update_priorities(td) == 0  # sent, not awaited
    assert replay.flush_updates() == 0
    assert replay.applied_updates == 48 and replay.stale_updates == 0
    for k in range(K):
        rows = batch.shard == k
        got = ray.get(prioritized_shards.handles[k].priorities.remote(batch.indices[rows]))
        np.testing.assert_allclose(got, (1.0 + ids[rows] % 5 + EPS) ** ALPHA)
    _set_priorities(prioritized_shards)  # back to the module's priorities for the other tests


def test_bad_input_is_refused_naming_the_fix_and_loses_no_stored_row(prioritized_shards: ReplayShards) -> None:
    before = prioritized_shards.stats()
    replay = ShardedReplay(prioritized_shards, warmup=N_ROWS, seed=9, prefetch=0)
    next(replay)
    with pytest.raises(ValueError, match=r"batch of 1000 .* holding 155 transitions .* warmup=1000"):
        replay.sample(1000)
    batch = replay.sample(8)
    priorities = [ray.get(h.priorities.remote()) for h in prioritized_shards.handles]
    with pytest.raises(ValueError, match=r"finite.*clip the errors.*No shard's priorities changed"):
        batch.update_priorities(np.array([1.0, np.nan, 1.0, 1.0, np.inf, 1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r">= 0"):
        replay.update_priorities(batch.shard, batch.indices, -np.ones(8), batch.generations)
    replay.flush_updates()
    assert prioritized_shards.stats() == before
    for handle, kept in zip(prioritized_shards.handles, priorities, strict=True):
        np.testing.assert_array_equal(ray.get(handle.priorities.remote()), kept)
    with pytest.raises(ValueError, match="needs env_id"):
        prioritized_shards.writer().add(TransitionBatch(obs=np.zeros((2, 1))))


def test_through_batch_sampler_and_to_dataloader_to_torch_batches(prioritized_shards: ReplayShards) -> None:
    replay = ShardedReplay(prioritized_shards, warmup=N_ROWS, seed=10)
    loader = ptl_rl.to_dataloader(BatchSampler(replay, batch_size=16), steps_per_epoch=3)
    batches = list(loader)
    assert len(batches) == 3
    for batch in batches:
        assert isinstance(batch, ptl_rl.TorchBatch)
        assert batch.obs.shape == (16, 1) and batch.obs.dtype == torch.float32
        assert batch.weights.dtype == torch.float32 and batch.shard.dtype == torch.int64
        assert batch.indices.dtype == torch.int64 and batch.generations.dtype == torch.int64
        batch.update_priorities(torch.ones(16))  # what training_step does
    replay.flush_updates()
    assert replay.applied_updates == 48
    _set_priorities(prioritized_shards)


def _rows_of_envs(first_env: int) -> Iterator[TransitionBatch]:
    """Endless batches of 6 envs ``first_env ..``, one row each, shaped like :func:`all_rows`'s."""
    for step in range(10**6):
        row = np.arange(6) + 10_000 + first_env * 1_000 + step * 6
        yield TransitionBatch(
            obs=row[:, None].astype(np.float32),
            env_id=np.arange(first_env, first_env + 6, dtype=np.int64),
            reward=np.zeros(6, np.float32),
            action=row % 2,
        )


def test_a_learner_side_upstream_is_written_into_the_shards_by_env(uniform_shards: ReplayShards) -> None:
    """(After the uniform frequencies: it adds rows of envs 100-105.)"""
    replay = ShardedReplay(uniform_shards, _rows_of_envs(100), warmup=N_ROWS + 30, transitions_per_yield=6, seed=12)
    loader = ptl_rl.to_dataloader(BatchSampler(replay, batch_size=32), steps_per_epoch=4)
    for batch in loader:
        assert batch.obs.shape == (32, 1)
        assert torch.equal(batch.shard, batch.env_id % K)
        assert "weights" not in batch and "indices" not in batch  # uniform rows: the stored fields and shard
    assert len(replay) >= N_ROWS + 30
    with pytest.raises(TypeError, match="no priorities"):
        replay.update_priorities([0], [0], [1.0])


@ray.remote
def _collector(writer: ShardWriter, envs: list[int], steps: int) -> int:
    """A collector elsewhere writing its envs' steps straight into the shards (obs = [row id, step])."""
    ids = np.asarray(envs, dtype=np.int64)
    for step in range(steps):
        obs = np.stack([10**6 + ids * 100 + step, np.full(len(ids), step)], axis=1).astype(np.float32)[:, :1]
        writer.add(TransitionBatch(obs=obs, env_id=ids, reward=np.full(len(ids), step, np.float32), action=ids % 2))
    writer.flush()
    return writer.rows_written


def test_each_env_stream_lands_whole_and_in_order_on_shard_env_id_mod_k(uniform_shards: ReplayShards) -> None:
    """(After the uniform frequencies: a collector adds rows of envs 200-207.)"""
    assert shard_of(np.array([0, 1, 2, 3, 7, 11]), 3).tolist() == [0, 1, 2, 0, 1, 2]
    parts = split_by_shard(TransitionBatch(obs=np.arange(5.0)[:, None], env_id=np.array([4, 2, 1, 5, 3])), 3)
    assert [(k, part.obs[:, 0].tolist()) for k, part in parts] == [(0, [4.0]), (1, [0.0, 2.0]), (2, [1.0, 3.0])]
    writer = uniform_shards.writer(max_in_flight=2)
    envs = list(range(200, 208))
    # a collector (a Ray task here; a RayWorkers actor alike) writes directly, not through this process
    assert ray.get(_collector.remote(writer, envs, 12)) == 96
    for k, handle in enumerate(uniform_shards.handles):
        size = ray.get(handle.stats.remote()).size
        rows = ray.get(handle.rows.remote(np.arange(size)))
        assert set((rows.env_id % K).tolist()) == {k}
        for env in set(envs) & set(rows.env_id.tolist()):  # the env's whole stream, in its order
            assert rows.reward[rows.env_id == env].tolist() == list(range(12))
    assert sum(s.size for s in uniform_shards.stats()) >= N_ROWS + 96


def test_an_update_of_a_row_overwritten_since_its_draw_is_ignored(prioritized_shards: ReplayShards) -> None:
    """(Last of the prioritized tests: it overwrites rows of shard 0.)"""
    writer = prioritized_shards.writer()
    filler = np.arange(1000, 1150)  # env 3 (shard 0) fills shard 0's ring to its capacity of 200
    writer.add(
        TransitionBatch(
            obs=filler[:, None].astype(np.float32),
            env_id=np.full(150, 3),
            reward=np.zeros(150, np.float32),
            action=filler % 2,
        )
    )
    writer.flush()
    replay = ShardedReplay(prioritized_shards, warmup=N_ROWS, seed=7, prefetch=0, sync_updates=True)
    next(replay)
    batch = replay.sample(64)
    # 100 new rows of env 0 overwrite slots 0..99 of shard 0 (its ring is full)
    new = np.arange(2000, 2100)
    writer.add(
        TransitionBatch(
            obs=new[:, None].astype(np.float32),
            env_id=np.zeros(100, np.int64),
            reward=np.zeros(100, np.float32),
            action=new % 2,
        )
    )
    writer.flush()
    overwritten = (batch.shard == 0) & (batch.indices < 100)
    assert overwritten.any() and not overwritten.all()
    before = ray.get(prioritized_shards.handles[0].priorities.remote(np.arange(100)))
    counted = ray.get(prioritized_shards.handles[0].counters.remote())["stale_updates"]
    stale = batch.update_priorities(np.full(64, 5.0))
    assert stale == int(overwritten.sum()) == replay.stale_updates
    assert replay.applied_updates == 64 - stale
    np.testing.assert_array_equal(ray.get(prioritized_shards.handles[0].priorities.remote(np.arange(100))), before)
    for k in range(K):
        rows = ~overwritten & (batch.shard == k)
        got = ray.get(prioritized_shards.handles[k].priorities.remote(batch.indices[rows]))
        np.testing.assert_allclose(got, (5.0 + EPS) ** ALPHA)
    assert ray.get(prioritized_shards.handles[0].counters.remote())["stale_updates"] == counted + stale


def test_a_shard_in_process_draws_more_rows_than_it_holds_with_their_mass() -> None:
    shard = ReplayShard(prioritized_buffer, shard=0, seed=0)
    shard.add(TransitionBatch(obs=np.arange(4.0)[:, None], env_id=np.zeros(4, dtype=np.int64)))
    shard.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]), None)
    answer = shard.sample(10)  # a shard's share of a batch may exceed its rows
    assert answer.batch is not None and len(answer.batch) == 10 and "weights" not in answer.batch
    np.testing.assert_allclose(answer.row_mass, (answer.batch.indices + 1.0 + EPS) ** ALPHA)
    assert answer.stats.size == 4
    np.testing.assert_allclose(answer.stats.mass, ((np.arange(4) + 1.0 + EPS) ** ALPHA).sum())
    with pytest.raises(ValueError, match="cannot be stored"):
        shard.add(TransitionBatch(obs=np.zeros((1, 1)), env_id=np.zeros(1, dtype=np.int64), shard=np.zeros(1)))
    with pytest.raises(TypeError, match="must return a ptl_rl.ReplayBuffer"):
        ReplayShard(dict)  # type: ignore[arg-type]


def test_a_shard_draws_a_request_with_the_stream_its_seed_names_and_keeps_its_own() -> None:
    """The learner's seed decides the shard's draw (DDP ranks: their own streams at the same shard)."""
    shard = ReplayShard(prioritized_buffer, shard=2, seed=0)
    shard.add(TransitionBatch(obs=np.arange(50.0)[:, None], env_id=np.full(50, 2, dtype=np.int64)))
    own = shard.buffer.rng.bit_generator.state
    first, again, other = (shard.sample(64, None, seed) for seed in (11, 11, 12))
    assert shard.buffer.rng.bit_generator.state == own  # lent, not advanced
    assert first.batch is not None and again.batch is not None and other.batch is not None
    assert first.batch.indices.tolist() == again.batch.indices.tolist() != other.batch.indices.tolist()
    # the stream is (seed, shard): the buffer's own draw with that generator, 64 rows at most 50 a call
    reference = prioritized_buffer()
    reference.add(TransitionBatch(obs=np.arange(50.0)[:, None], env_id=np.full(50, 2, dtype=np.int64)))
    reference.rng = np.random.default_rng([11, 2])
    expected = np.concatenate([reference.sample(50).indices, reference.sample(14).indices])
    assert first.batch.indices.tolist() == expected.tolist()


def test_each_rank_samples_with_its_own_stream_and_a_checkpoint_resumes_it(prioritized_shards) -> None:
    """Same seed: rank 0 twice draws the same batches, rank 1 others; a resumed state draws the batches the
    saving learner drew next, the prefetched one included."""

    def ids(replay: ShardedReplay, batches: int) -> list[list[int]]:
        return [replay.sample(16).obs[:, 0].astype(np.int64).tolist() for _ in range(batches)]

    replays = [ShardedReplay(prioritized_shards, warmup=N_ROWS, seed=21, prefetch=1) for _ in range(3)]
    replays[2].set_rank(1)
    drawn = [ids(replay, 4) for replay in replays]
    assert drawn[0] == drawn[1]
    assert all(a != b for a, b in zip(drawn[0], drawn[2], strict=True))
    assert replays[2].rank == 1 and replays[0].rank == 0

    state = replays[0].state_dict()  # one request in flight (prefetch=1)
    assert torch.load(_saved(state), weights_only=True)["rank"] == 0
    after = ids(replays[0], 3)
    resumed = ShardedReplay(prioritized_shards, warmup=N_ROWS, seed=99, prefetch=0)
    resumed.set_rank(1)
    resumed.load_state_dict(state)
    assert resumed.rank == 0 and ids(resumed, 3) == after
    resumed.set_rank(0)  # the rank it holds: a no-op, the restored stream goes on
    assert ids(resumed, 1) == ids(replays[0], 1)


def _saved(state: dict) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def window_buffer() -> ReplayBuffer:
    return ReplayBuffer(capacity=64, draws=ptl_rl.SequenceWindows(length=3, draws=PrioritizedDraws(alpha=1.0)))


def test_a_shard_of_sequence_windows_answers_windows_of_one_env_with_their_start_mass() -> None:
    """Any strategy that draws through a WeightedSlots plugs in: here windows, drawn by priority of their start."""
    shard = ReplayShard(window_buffer, shard=1, seed=0)
    steps = np.arange(12)
    env_id = np.array([1, 4], dtype=np.int64)  # two envs of shard 1 (of 3), interleaved as a vector env writes
    for step in steps:
        done = np.full(2, step % 6 == 5)
        shard.add(
            TransitionBatch(
                obs=np.stack([env_id * 100.0 + step], axis=1).astype(np.float32),
                env_id=env_id,
                terminated=done,
                truncated=np.zeros(2, bool),
                reward=np.zeros(2, np.float32),
            )
        )
    stats = shard.stats()
    assert stats.size == 24 and stats.mass == 16.0  # 4 starts per 6-step episode, 4 episodes, weight 1 each
    answer = shard.sample(40)
    assert answer.batch is not None and answer.batch.obs.shape == (40, 3, 1)
    obs = answer.batch.obs[..., 0]
    assert (np.diff(obs, axis=1) == 1).all()  # consecutive steps of one env's episode
    np.testing.assert_array_equal(answer.row_mass, np.ones(40))


def test_the_rate_limit_grants_rows_as_reverb_does_one_by_one() -> None:
    """``room`` equals granting rows one at a time by Reverb's CanInsert/CanSample; Reverb's bounds are checked."""
    limits = [
        RateLimit.min_size(7),
        RateLimit.sample_to_insert_ratio(2.5, 10, 6.0),
        RateLimit.sample_to_insert_ratio(0.5, 3, (1.0, 4.0)),
    ]
    for limit in limits:
        for inserts in range(0, 40, 3):
            for samples in range(0, 80, 7):
                for insert in (True, False):
                    one_by_one = 0
                    while one_by_one < 20 and (
                        limit.can_insert(inserts + one_by_one, samples)
                        if insert
                        else limit.can_sample(inserts, samples + one_by_one)
                    ):
                        one_by_one += 1
                    assert limit.room(inserts, samples, 20, insert) == one_by_one
    with pytest.raises(ValueError, match=r"2 \* max\(1, samples_per_insert\).*Raise error_buffer"):
        RateLimit.sample_to_insert_ratio(4.0, 10, 3.0)
    with pytest.raises(ValueError, match="above samples_per_insert"):
        RateLimit.sample_to_insert_ratio(1.0, 10, (20.0, 40.0))

    async def writer_ahead_of_the_learner() -> list[tuple[int, int, bool]]:
        limiter = RateLimiter(RateLimit.sample_to_insert_ratio(1.0, 10, 4.0))  # inserts - samples in [6, 14]
        write = asyncio.ensure_future(limiter.insert(30))
        seen = []
        for rows in (0, 8, 16):
            if rows:
                await limiter.sample(rows)
            await asyncio.sleep(0.01)
            seen.append((limiter.inserts, limiter.samples, write.done()))
        return seen

    assert asyncio.run(writer_ahead_of_the_learner()) == [(14, 0, False), (22, 8, False), (30, 24, True)]


def _wait_for_rows(shards: ReplayShards, rows: int) -> int:
    deadline = time.monotonic() + 30
    while (stored := sum(s.size for s in shards.stats())) < rows and time.monotonic() < deadline:
        time.sleep(0.05)
    return stored


@ray.remote
def _limited_collector(writer: ShardWriter, lo: int, hi: int) -> int:
    """A collector writing rows ``lo:hi`` of :func:`all_rows` in batches of 4; returns once all are stored."""
    rows = all_rows()
    for start in range(lo, hi, 4):
        writer.add(rows.rows(slice(start, min(start + 4, hi))))
    writer.flush()
    return hi - lo


def test_a_sample_to_insert_ratio_holds_writers_and_the_learner_to_it(ray_session) -> None:
    # spi 1, min size 20, error buffer 8: inserts - samples stays in [12, 28] once 20 rows are in
    limit = RateLimit.sample_to_insert_ratio(1.0, 20, 8.0)
    shards = ReplayShards(functools.partial(uniform_buffer, 100), 1, seed=13, rate_limit=limit)
    try:
        # writers are collectors (other processes): a process's calls to a shard run in order, so one that
        # both wrote through a limit and sampled would queue its samples behind its own held writes
        collector = _limited_collector.remote(shards.writer(max_in_flight=100), 0, 60)
        assert _wait_for_rows(shards, 28) == 28
        time.sleep(0.3)
        assert sum(s.size for s in shards.stats()) == 28  # the collector waits: 28 - 0 is the most ahead
        replay = ShardedReplay(shards, warmup=20, seed=14, prefetch=0, sample_timeout=0.5)
        next(replay)
        replay.sample(16)  # 28 - 16 >= 12: granted; the writers may go on to 44
        assert _wait_for_rows(shards, 44) == 44
        replay.sample(16)
        assert ray.get(collector) == 60  # 60 - 32 <= 28: every row is in
        assert sum(s.size for s in shards.stats()) == 60
        replay.sample(16)  # 60 - 48 >= 12
        with pytest.raises(TimeoutError, match=r"'inserts': 60, 'samples': 48"):
            replay.sample(16)  # 60 - 64 < 12: the learner waits for writers
        ray.get(_limited_collector.remote(shards.writer(), 60, 76))  # 76 - 64 >= 12
        assert len(replay.sample(16)) == 16  # the request in flight was granted
        counts = shards.rate_counts()
        assert counts["inserts"] == 76 and counts["samples"] == 64
        assert counts["blocked_inserts"] >= 1 and counts["blocked_samples"] >= 1
        with pytest.raises(ValueError, match="writes its upstream's rows itself"):
            ShardedReplay(shards, _rows_of_envs(0), warmup=20)
    finally:
        shards.close()


def test_the_rate_limiters_counts_are_saved_with_the_shards_and_go_on_after_a_load(ray_session, tmp_path) -> None:
    """A resumed run's limiter continues from the saved counts (a fresh one would hold the learner until
    min_size rows were inserted again)."""
    limit = RateLimit.sample_to_insert_ratio(1.0, 20, 8.0)  # inserts - samples in [12, 28] once 20 rows are in

    def make() -> ReplayShards:
        buffer = functools.partial(uniform_buffer, 100)
        return ReplayShards(buffer, 1, seed=15, rate_limit=limit, checkpoint_dir=tmp_path / "replay")

    shards = make()
    try:
        assert ray.get(_limited_collector.remote(shards.writer(), 0, 24)) == 24
        replay = ShardedReplay(shards, warmup=20, seed=16, prefetch=0)
        next(replay)
        replay.sample(8)
        saved = torch.load(_saved(replay.state_dict()), weights_only=True)
        assert saved["shards"]["rate_counts"]["inserts"] == 24 and saved["shards"]["rate_counts"]["samples"] == 8
    finally:
        shards.close()
    restored = make()
    try:
        assert restored.rate_counts()["inserts"] == 0
        replay = ShardedReplay(restored, warmup=20, seed=16, prefetch=0, sample_timeout=60)
        replay.load_state_dict(saved)
        assert restored.rate_counts() == {k: saved["shards"]["rate_counts"][k] for k in restored.rate_counts()}
        assert len(replay.sample(4)) == 4  # 24 - 12 >= 12: granted from the saved counts, no insert needed
        assert restored.rate_counts()["samples"] == 12
    finally:
        restored.close()

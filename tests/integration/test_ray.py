"""RayWorkers on a local Ray with 2 workers: rows correct by brute force, weights per version, a worker killed."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
import torch
from collectors import EPISODE_STRIDE, ShiftPolicy, check_rows, concat_rows, scripted_collector
from faults import InjectedFault, Injector
from normalized_collector import (
    CLIP,
    OBS_SHAPE,
    check_rows_per_version,
    normalized_cartpole_collector,
    policy_network,
)

import ptl_rl
from ptl_rl import BatchSampler, ReplayBuffer
from ptl_rl.distributed import RayWorkers, intake, ray_workers

ray = pytest.importorskip("ray")


def _push(workers: RayWorkers, policy: ShiftPolicy) -> int:
    with torch.no_grad():
        policy.shift.fill_(workers.version + 1)  # version v acts with shift v
    return workers.push_weights()


def _env_ids(buffer: ReplayBuffer) -> set[int]:
    return set(np.unique(buffer.storage.gather(np.arange(len(buffer)))["env_id"]).tolist())


def _run(workers: RayWorkers, policy: ShiftPolicy, wanted: set[int], kill_when: set[int] | None = None) -> ReplayBuffer:
    """Train (sample, push every 5 steps) until rows of every env id in ``wanted`` are stored.

    Actors start at different times (each imports torch), so the test waits for data rather than counting steps.
    ``kill_when``: kill worker 0 once rows of these env ids are stored.
    """
    buffer = ReplayBuffer(workers, capacity=50_000, warmup=50, transitions_per_yield=8, seed=0)
    sampler = BatchSampler(buffer, batch_size=16)
    for step in range(3_000):
        next(sampler)
        if step % 5 == 4:
            _push(workers, policy)
            seen = _env_ids(buffer)
            if kill_when is not None and kill_when <= seen:
                ray.kill(workers.actors[0], no_restart=True)
                kill_when = None
            if wanted <= seen and kill_when is None:
                return buffer
    raise AssertionError(f"rows of env ids {wanted - _env_ids(buffer)} never arrived; failures: {workers.failures}")


def test_two_workers_killed_and_crashing_are_restarted_training_goes_on(ray_session) -> None:
    """Two workers with their own env ids and the pushed weights; then one is killed mid-run and the other's env
    raises: both restart with new env ids and the current weights, collection goes on, no wrong row is stored.

    (One test, because every actor start imports torch: seconds each on a loaded 2-core machine.)
    """
    policy = ShiftPolicy()
    factory = functools.partial(scripted_collector, n=3, fail_at=60, fail_worker=1)
    workers = RayWorkers(factory, 2, policy=policy, steps_per_call=4)
    with pytest.warns(RuntimeWarning, match="restarting it"):
        try:
            buffer = _run(workers, policy, {6, 9}, kill_when=set(range(6)))
            incarnations = list(workers.incarnations)
        finally:
            workers.close()
    assert incarnations == [1, 1] and workers.restarts == 2, workers.failures
    assert any("scripted failure" in f for f in workers.failures), workers.failures
    rows = concat_rows([buffer.storage.gather(np.arange(len(buffer)))])
    check_rows(rows, n=3)
    env_ids = set(np.unique(rows["env_id"]).tolist())
    # incarnation 1 of worker w has rank w + 2: env ids 6..8 and 9..11, new episodes numbered from 1000
    assert set(range(6)) | {6, 9} <= env_ids, "each worker (and each restart) has its own env ids"
    restarted = rows["env_id"] >= 6
    assert (rows["obs"][restarted, 1] >= 1000).all() and (rows["obs"][~restarted, 1] < 1000).all()
    assert rows["policy_version"][restarted].min() >= 1, "a restarted worker acts with the current weights"
    assert workers.total_steps >= len(buffer)


def test_rows_of_a_version_act_with_the_weights_pushed_as_it(ray_session) -> None:
    """The weights of version v are fixed at the push: optimizer steps between the push and the actors' next
    call (here: before the first one, and across a restart) do not leak into rows stamped v."""
    policy = ShiftPolicy()
    workers = RayWorkers(functools.partial(scripted_collector, n=1), 1, policy=policy, steps_per_call=2)
    try:
        _push(workers, policy)  # v1 acts with shift 1
        with torch.no_grad():
            policy.shift.fill_(7)  # the learner trains on without pushing
        first = concat_rows([next(workers) for _ in range(3)])
        workers.close()  # a restart: new actor, same version
        with torch.no_grad():
            policy.shift.fill_(8)
        second = concat_rows([next(workers) for _ in range(3)])
    finally:
        workers.close()
    for rows in (first, second):
        check_rows(rows, n=1)  # action = code + policy_version: the weights pushed as that version acted
        assert (rows["policy_version"] == 1).all()
    assert (second["env_id"] >= 3).all(), "the restarted actor is a new incarnation"


def _collect_until_restarted(ranks: list[RayWorkers], num_envs: int = 3) -> list[dict[str, np.ndarray]]:
    """Step the stages of both (simulated) DDP ranks in turn; kill each one's worker 0 once both its workers
    delivered, and stop when its restarted worker delivered too. Returns every row each rank received.

    Waits for data, not a number of steps: a restarted actor imports torch, seconds on a loaded machine, while
    the other worker goes on delivering (the pause per round keeps what it delivers meanwhile small)."""
    got: list[list] = [[] for _ in ranks]
    seen: list[set[int]] = [set() for _ in ranks]
    killed = [False] * len(ranks)
    deadline = time.monotonic() + 300.0
    while time.monotonic() < deadline:
        time.sleep(0.02)
        for r, workers in enumerate(ranks):
            if killed[r] and workers.incarnations[0] == 1 and len(seen[r]) == 3:
                continue  # this rank is done
            batch = next(workers)
            got[r].append(batch)
            seen[r] |= set((np.asarray(batch["env_id"]) // num_envs).tolist())
            if not killed[r] and len(seen[r]) == 2:
                ray.kill(workers.actors[0], no_restart=True)
                killed[r] = True
        if all(killed) and all(len(s) == 3 for s in seen):
            return [concat_rows(rows) for rows in got]
    raise AssertionError(f"worker ranks seen: {seen}; failures: {[w.failures for w in ranks]}")


def test_workers_of_two_ddp_ranks_and_their_restarts_never_share_env_ids(ray_session) -> None:
    """Two DDP ranks (simulated: set_rank with the world size) with 2 workers each; worker 0 of each is killed and
    restarted. Every incarnation of every worker of every rank has its own worker rank, so its own env ids and
    seeds: rank r, worker w, incarnation i has rank r + 2 * (w + 2 * i)."""
    policy = ShiftPolicy()
    factory = functools.partial(scripted_collector, n=1)
    ranks = [RayWorkers(factory, 2, policy=policy, steps_per_call=2, actor_options={"num_cpus": 0.5}) for _ in range(2)]
    for r, workers in enumerate(ranks):
        workers.set_rank(r, world_size=2)
    with pytest.warns(RuntimeWarning, match="restarting it"):
        try:
            rows = _collect_until_restarted(ranks)
        finally:
            for workers in ranks:
                workers.close()
    expected = [{r + 2 * (w + 2 * i) for w, i in ((0, 0), (1, 0), (0, 1))} for r in range(2)]
    for r in range(2):
        check_rows(rows[r], n=1)
        assert set((rows[r]["env_id"] // 3).tolist()) == expected[r]
    assert not set(rows[0]["env_id"].tolist()) & set(rows[1]["env_id"].tolist()), "two ranks share env ids"
    for r in range(2):  # worker 0, incarnation 1 of each rank plays new episodes
        restarted = rows[r]["env_id"] // 3 == r + 4
        assert restarted.any() and (rows[r]["obs"][restarted, 1] >= EPISODE_STRIDE).all()


def test_a_rank_outside_the_world_size_is_refused_naming_the_fix(ray_session) -> None:
    workers = RayWorkers(scripted_collector, 2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        workers.set_rank(2, world_size=2)
    workers.set_rank(1)  # no torch.distributed here: world size 1
    with pytest.raises(ValueError, match=r"DDP rank 1 but the world size is 1.*set_rank\(rank, world_size=...\)"):
        next(workers)
    assert not workers.running, "no actor was started"


def test_normalization_statistics_travel_with_the_weights_to_ray_workers(ray_session) -> None:
    """Each row of policy_version v was seen by the worker's network normalized as the statistics pushed as v."""
    norm = ptl_rl.ObservationNormalizer(clip=CLIP, shape=OBS_SHAPE)
    policy = policy_network()
    policy[0] = norm.module()
    snapshots = {0: (policy[0].shift.clone(), policy[0].scale.clone())}
    workers = RayWorkers(normalized_cartpole_collector, 1, policy=policy, steps_per_call=2)
    stage = ptl_rl.NormalizeObservations(workers, norm, output="raw", apply_in="model")
    rows = []
    try:
        for i in range(30):
            batch = next(stage)
            rows.append({k: np.asarray(batch[k]) for k in ("obs", "seen", "policy_version")})
            if i % 5 == 4:
                version = workers.push_weights()
                snapshots[version] = (policy[0].shift.clone(), policy[0].scale.clone())
    finally:
        workers.close()
    assert check_rows_per_version(rows, snapshots) >= 2
    obs = np.concatenate([r["obs"] for r in rows])
    assert norm.count == len(obs)


CUT_TARGETS = {"stage": lambda code: code.co_filename in (ray_workers.__file__, intake.__file__)}


def test_a_next_cut_at_any_line_keeps_one_call_in_flight_per_worker(ray_session) -> None:
    """Interrupts and exceptions between the statements of RayWorkers' step (waiting, taking a call's result,
    handing the worker its next call, taking the rows in): before the next next() every worker has exactly one
    call in flight again (one cut between taking a result and the next call is replaced, as after a failure),
    the stream skips a number, every row is right and the counters agree with the episodes handed out."""
    workers = RayWorkers(functools.partial(scripted_collector, n=2), 2, steps_per_call=2)
    injector = Injector(CUT_TARGETS)
    got, popped, replacements = [], [], 0
    try:
        got += [next(workers) for _ in range(4)]  # both actors up
        injector.run(lambda: got.append(next(workers)))
        lines = injector.counts["stage"]
        assert lines > 10
        for k in range(2, lines + 1, 2):  # every other line: a replaced actor imports torch, seconds each
            incarnations, seq = list(workers.incarnations), workers.stream_seq
            fault = KeyboardInterrupt() if k % 4 else InjectedFault()
            try:
                injector.run(lambda: got.append(next(workers)), "stage", k, fault)  # noqa: B023 - run at once
            except (KeyboardInterrupt, InjectedFault) as raised:
                assert raised is fault
            if not injector.fired:
                continue
            cut_step = injector.where is not RayWorkers.snapshot.__code__
            seq = workers.stream_seq
            popped += workers.pop_episodes()
            got.append(next(workers))
            assert sorted(workers._pending.values()) == [0, 1], k  # one call in flight per worker
            replaced = sum(workers.incarnations) - sum(incarnations)
            assert replaced <= 1 and (cut_step or not replaced), k
            replacements += replaced
            assert workers.stream_seq == seq + (2 if cut_step else 1), k  # a step cut short is a cut
        popped += workers.pop_episodes()
        assert workers.episodes_finished == len(popped) > 0
        assert workers.restarts == 0 and not workers.failures  # a replaced worker is no failure
        assert 1 <= replacements < lines // 4, (replacements, lines)  # only a worker left without a call
    finally:
        workers.close()
    check_rows(concat_rows(got), n=2)

"""RayWorkers on a local Ray with 2 workers: rows correct by brute force, weights per version, a worker killed."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest
import torch
from collectors import ShiftPolicy, check_rows, concat_rows, scripted_collector
from paths import REPO, SUPPORT

from ptl_rl import BatchSampler, ReplayBuffer
from ptl_rl.distributed import RayWorkers

ray = pytest.importorskip("ray")

HERE = str(SUPPORT)  # the collectors' module, for the actors to import
ROOT = str(REPO)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (it takes seconds and ~0.7 GB to start).

    Token authentication is switched off for this throwaway local cluster; a
    shared cluster should run with RAY_AUTH_MODE=token (see docs/design/scale-out.md).
    The actors import the test helpers and this checkout's ptl_rl through PYTHONPATH.
    """
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    path = os.pathsep.join([ROOT, HERE, *[p for p in sys.path if p]])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield ray
    ray.shutdown()


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

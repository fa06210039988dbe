"""The extension points of ``ptl_rl.core.protocols``: ptl_rl's own parts meet them, and a user's storage and agent
written only against them work in a buffer, a source and a checkpoint."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import ptl_rl
from ptl_rl.core.protocols import (
    Agent,
    EnvStepAware,
    EpisodeCounter,
    JournaledStorage,
    NStepStream,
    NumberedStream,
    PartlySampleableStorage,
    PartsStorage,
    PerEnvStream,
    RankAware,
    RecurrentAgent,
    ReplayStage,
    RollbackStorage,
    StageLike,
    Stateful,
    Storage,
    StreamBoundStorage,
    implements,
    missing_members,
)


def cartpole_source(agent: Any, seed: int = 0) -> ptl_rl.ExperienceSource:
    return ptl_rl.ExperienceSource(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"), agent, seed=seed)


def push_left(obs: np.ndarray) -> np.ndarray:
    return np.zeros(len(obs), dtype=np.int64)


def numbered_batch(start: int, rows: int) -> ptl_rl.TransitionBatch:
    """Transitions numbered start..start+rows-1; every field encodes the number."""
    ids = np.arange(start, start + rows)
    return ptl_rl.TransitionBatch(
        obs=ids[:, None].astype(np.float32),
        action=ids.astype(np.int64),
        reward=ids.astype(np.float32),
        next_obs=ids[:, None] + np.float32(0.5),
        terminated=np.zeros(rows, dtype=bool),
        truncated=np.zeros(rows, dtype=bool),
        discount=np.full(rows, 0.9, dtype=np.float32),
        env_id=np.zeros(rows, dtype=np.int64),
    )


# ---------------------------------------------------------------------------- ptl_rl's own parts
def test_the_chain_of_ptl_rl_meets_its_protocols():
    agent = ptl_rl.DQNAgent(torch.nn.Linear(4, 2), ptl_rl.EpsilonGreedySelector(0.1, seed=0))
    source = cartpole_source(agent)
    nstep = ptl_rl.NStepTransform(source, n=2, gamma=0.9)
    buffer = ptl_rl.ReplayBuffer(nstep, 100, warmup=8)
    sampler = ptl_rl.BatchSampler(buffer, batch_size=4)
    for protocol in (StageLike, Stateful, RankAware, EpisodeCounter, NumberedStream, PerEnvStream):
        assert isinstance(source, protocol), protocol.__name__
    assert source.upstream is None  # a source is a stage that pulls from nothing
    assert isinstance(nstep, StageLike) and isinstance(nstep, NumberedStream) and isinstance(nstep, Stateful)
    # a FrameStorage downstream reads the n-step n through NStepStream: the n-step stage says it, the source does not
    assert isinstance(nstep, NStepStream) and nstep.n == 2 and not isinstance(source, NStepStream)
    assert isinstance(buffer, ReplayStage) and not isinstance(sampler, ReplayStage)
    assert all(isinstance(stage, StageLike) for stage in (source, nstep, buffer, sampler))
    for protocol in (Agent, EnvStepAware, RankAware, Stateful):
        assert isinstance(agent, protocol), protocol.__name__
    assert isinstance(push_left, Agent) and not isinstance(push_left, RecurrentAgent)


def test_storages_meet_the_storage_protocol_and_say_which_capabilities_they_have():
    plain, frames = ptl_rl.ArrayStorage(8), ptl_rl.FrameStorage(8)
    assert isinstance(plain, Storage) and isinstance(frames, Storage)
    for capability in (PartlySampleableStorage, StreamBoundStorage, JournaledStorage, PartsStorage):
        assert isinstance(frames, capability) and not isinstance(plain, capability), capability.__name__
    # both roll an add back (the journal of a buffer redoes a cut add from it): ArrayStorage's covers its allocation
    assert isinstance(frames, RollbackStorage) and isinstance(plain, RollbackStorage)


def test_a_frame_storage_takes_n_from_an_n_step_stream_and_trusts_a_numbered_one():
    class Stream:  # an upstream written against the protocols only: it numbers its batches and says its n
        def __init__(self, n: int) -> None:
            self.n, self.stream_seq = n, 0

        def __iter__(self) -> Stream:
            return self

        def __next__(self) -> ptl_rl.TransitionBatch:
            raise StopIteration

    assert isinstance(Stream(3), NStepStream) and isinstance(Stream(3), NumberedStream)
    storage = ptl_rl.FrameStorage(8, stack_axis=0)
    storage.bind_upstream(Stream(3))
    assert storage.n_step == 3 and storage.trusted
    plain = ptl_rl.FrameStorage(8, stack_axis=0)
    plain.bind_upstream(iter([]))  # neither numbered nor n-step: 1-step data, stacks compared
    assert plain.n_step == 1 and not plain.trusted
    with pytest.raises(ValueError, match="upstream emits 3-step transitions"):
        ptl_rl.FrameStorage(8, stack_axis=0, n_step=2).bind_upstream(Stream(3))


def test_implements_agrees_with_isinstance_for_protocols_of_methods():
    class Snapshots:
        def snapshot(self) -> int:
            return 0

        def restore(self, snapshot: int) -> None:
            pass

    for obj in (Snapshots(), ptl_rl.ArrayStorage(4), ptl_rl.FrameStorage(4)):
        assert implements(obj, RollbackStorage) == isinstance(obj, RollbackStorage)
    assert implements(Snapshots(), RollbackStorage) and not implements(object(), RollbackStorage)


# ---------------------------------------------------------------------------- a user's storage
class RingOfArrays:
    """A user's storage: one numpy ring per (flat) field, written against ``ptl_rl.core.protocols.Storage`` only."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.cursor = self.size = self.total_added = 0
        self.fields: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.size

    def add(self, batch: ptl_rl.TransitionBatch) -> np.ndarray:
        rows = len(batch)
        if self.fields is None:
            self.fields = {k: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in batch.items()}
        slots = (self.cursor + np.arange(rows)) % self.capacity
        for name, values in batch.items():
            self.fields[name][slots] = values
        self.cursor = (self.cursor + rows) % self.capacity
        self.size = min(self.size + rows, self.capacity)
        self.total_added += rows
        return slots

    def gather(self, indices: np.ndarray) -> ptl_rl.TransitionBatch:
        return ptl_rl.TransitionBatch({k: v[indices] for k, v in self.fields.items()})

    def state_dict(self) -> dict[str, Any]:
        arrays = {k: torch.from_numpy(v[: self.size].copy()) for k, v in (self.fields or {}).items()}
        return {"fields": arrays, "cursor": self.cursor, "size": self.size, "total_added": self.total_added}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor, self.size, self.total_added = state["cursor"], state["size"], state["total_added"]
        self.fields = None
        for name, values in state["fields"].items():
            self.fields = self.fields or {}
            self.fields[name] = np.zeros((self.capacity, *values.shape[1:]), values.numpy().dtype)
            self.fields[name][: self.size] = values.numpy()


def test_a_user_storage_keeps_the_newest_rows_and_its_buffer_samples_them_whole():
    buffer = ptl_rl.ReplayBuffer(None, 8, storage=RingOfArrays, seed=0)
    for start in range(0, 12, 3):
        buffer.add(numbered_batch(start, 3))
    assert len(buffer) == 8 and buffer.storage.total_added == 12
    sample = ptl_rl.TransitionBatch.concat([buffer.sample(8) for _ in range(10)])
    assert set(sample.action.tolist()) == set(range(4, 12))  # the newest 8 of the 12 added (seeded draws)
    np.testing.assert_array_equal(sample.obs[:, 0], sample.action)  # every row is one transition
    np.testing.assert_array_equal(sample.next_obs[:, 0], sample.action + 0.5)


def test_a_user_storage_travels_in_the_buffer_state_and_feeds_a_sampler_in_a_chain():
    buffer = ptl_rl.ReplayBuffer(cartpole_source(push_left), 50, warmup=10, storage=RingOfArrays, seed=0)
    batch = next(ptl_rl.BatchSampler(buffer, batch_size=6))
    assert isinstance(batch, ptl_rl.TorchBatch) and batch.obs.shape == (6, 4)

    restored = ptl_rl.ReplayBuffer(None, 50, storage=RingOfArrays, seed=1)
    restored.load_state_dict(buffer.state_dict())
    assert len(restored) == len(buffer)
    expected, got = buffer.sample(8), restored.sample(8)  # the sampling RNG came along too
    for name in expected.keys():
        np.testing.assert_array_equal(got[name], expected[name])


def test_a_storage_factory_that_returns_no_storage_is_refused_with_what_it_lacks():
    class NoCounters:
        def __init__(self, capacity: int) -> None:
            self.capacity = capacity

        def add(self, batch: Any) -> np.ndarray:
            return np.zeros(0, dtype=np.int64)

    with pytest.raises(TypeError, match=r"NoCounters, which lacks cursor, size, total_added, __len__, gather, "):
        ptl_rl.ReplayBuffer(None, 8, storage=NoCounters)
    assert missing_members(RingOfArrays(4), Storage) == []


# ---------------------------------------------------------------------------- a user's agent
class HookedAgent:
    """A user's agent with every optional hook of ``ptl_rl.core.protocols``: a recurrent, scheduled, seeded one."""

    def __init__(self) -> None:
        self.resets: list[np.ndarray] = []
        self.env_steps: list[int] = []
        self.rank = 0
        self.calls = 0

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.calls += 1
        return np.zeros(len(obs), dtype=np.int64), {"hidden": np.full(len(obs), self.calls, dtype=np.float32)}

    def reset_state(self, mask: np.ndarray) -> None:
        self.resets.append(mask.copy())

    def on_env_steps(self, total_steps: int) -> None:
        self.env_steps.append(total_steps)

    def set_rank(self, rank: int) -> None:
        self.rank = rank

    def state_dict(self) -> dict[str, Any]:
        return ptl_rl.versioned({"calls": self.calls}, 1)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ptl_rl.check_version(state, 1, "HookedAgent")
        self.calls = int(state["calls"])


def test_a_user_agent_gets_its_hooks_called_and_its_state_checkpointed():
    agent = HookedAgent()
    for protocol in (Agent, RecurrentAgent, EnvStepAware, RankAware, Stateful):
        assert isinstance(agent, protocol), protocol.__name__
    source = cartpole_source(agent)
    ptl_rl.assign_rank(source, 1)  # before the first step, as the adapter does under DDP
    assert agent.rank == 1
    batches = [next(source) for _ in range(3)]
    assert [b.hidden.tolist() for b in batches] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]  # extras carried through
    np.testing.assert_array_equal(agent.resets[0], [True, True])  # both envs start an episode at the first step
    assert agent.env_steps == [2, 4, 6]  # env steps of both sub-envs after each vector step

    state = ptl_rl.pipeline_state_dict(source)["stages"]["0:ExperienceSource"]
    assert state["agent"] == {"calls": 3, "state_version": 1}
    fresh = HookedAgent()
    ptl_rl.load_pipeline_state_dict(cartpole_source(fresh), ptl_rl.pipeline_state_dict(source))
    assert fresh.calls == 3


def test_agent_state_for_an_agent_that_cannot_load_it_is_refused_by_name():
    """A checkpoint with a Stateful agent's state, resumed with a plain function as the agent: a TypeError that says
    which agent and what to do, not an AttributeError from inside the source."""
    source = cartpole_source(HookedAgent())
    next(source)
    state = source.state_dict()
    plain = cartpole_source(lambda obs: np.zeros(len(obs), dtype=np.int64))
    with pytest.raises(TypeError, match="has no state_dict/load_state_dict of its own.*kind of agent"):
        plain.load_state_dict(state)

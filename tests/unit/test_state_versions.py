"""Every state_dict names its format version; a newer format is refused clearly, an unversioned one still loads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import ptl_rl
from ptl_rl.state import STATE_VERSION_KEY


def _rows(n: int) -> ptl_rl.TransitionBatch:
    ids = np.arange(n)
    return ptl_rl.TransitionBatch(
        obs=ids[:, None].astype(np.float32),
        action=ids.astype(np.int64),
        reward=np.ones(n, dtype=np.float32),
        next_obs=ids[:, None].astype(np.float32) + 1,
        terminated=ids % 5 == 4,
        truncated=np.zeros(n, dtype=bool),
        discount=np.full(n, 0.9, dtype=np.float32),
        env_id=ids % 2,
    )


def _filled(buffer: Any) -> Any:
    buffer.add(_rows(12))
    return buffer


def _rollout() -> ptl_rl.RolloutBuffer:
    return ptl_rl.RolloutBuffer(None, 4, num_envs=2, value_fn=lambda obs: np.zeros(len(obs)))


def _source(steps: int = 3) -> ptl_rl.ExperienceSource:
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=0)), seed=0)
    for _ in range(steps):
        next(source)
    return source


def _nstep() -> ptl_rl.NStepTransform:
    nstep = ptl_rl.NStepTransform(_source(0), n=3, gamma=0.9)
    next(nstep)
    next(nstep)
    return nstep


def _policy_agent() -> ptl_rl.StochasticPolicyAgent:
    actor = nn.Linear(4, 2)
    return ptl_rl.StochasticPolicyAgent(actor, gym.spaces.Discrete(2), seed=0)


def _evaluation() -> ptl_rl.PeriodicEvaluation:
    source = _source(1)
    env = gym.make("CartPole-v1")
    return ptl_rl.PeriodicEvaluation(source, env, lambda _env: source.agent, every_env_steps=100)


STATEFUL: dict[str, Callable[[], Any]] = {
    "ExperienceSource": _source,
    "NStepTransform": _nstep,
    "BatchSampler": lambda: ptl_rl.BatchSampler(_filled(ptl_rl.ReplayBuffer(None, 16, warmup=0)), 4),
    "DQNAgent": lambda: _source(0).agent,
    "StochasticPolicyAgent": _policy_agent,
    "EpisodeStatsLogger": lambda: ptl_rl.EpisodeStatsLogger(_source(1)),
    "PeriodicEvaluation": _evaluation,
    "ReplayBuffer": lambda: _filled(ptl_rl.ReplayBuffer(None, 16, warmup=0)),
    "ReplayBuffer(replacement=False)": lambda: _filled(ptl_rl.ReplayBuffer(None, 16, warmup=0, replacement=False)),
    "PrioritizedReplayBuffer": lambda: _filled(ptl_rl.PrioritizedReplayBuffer(None, 16, warmup=0)),
    "SequenceReplayBuffer": lambda: _filled(ptl_rl.SequenceReplayBuffer(None, 16, length=2, warmup=0)),
    "RolloutBuffer": _rollout,
    "ArrayStorage": lambda: _filled(ptl_rl.buffers.ArrayStorage(16)),
    "EpsilonGreedySelector": lambda: ptl_rl.EpsilonGreedySelector(0.1, seed=0),
}


@pytest.fixture(params=sorted(STATEFUL))
def stateful(request: pytest.FixtureRequest) -> tuple[str, Callable[[], Any]]:
    return request.param, STATEFUL[request.param]


def test_state_names_its_version_and_round_trips(stateful):
    name, build = stateful
    state = build().state_dict()
    assert isinstance(state[STATE_VERSION_KEY], int) and state[STATE_VERSION_KEY] >= 1
    build().load_state_dict(state)


def test_a_newer_format_is_refused_naming_the_fix(stateful):
    name, build = stateful
    state = build().state_dict()
    state[STATE_VERSION_KEY] += 1
    with pytest.raises(ValueError, match=r"newer than .* upgrade ptl_rl"):
        build().load_state_dict(state)


def test_a_state_written_before_versions_still_loads(stateful):
    name, build = stateful
    state = build().state_dict()
    del state[STATE_VERSION_KEY]
    build().load_state_dict(state)


def test_versioned_states_survive_weights_only_loading(tmp_path):
    state = STATEFUL["PrioritizedReplayBuffer"]().state_dict()
    torch.save(state, tmp_path / "state.pt")
    assert torch.load(tmp_path / "state.pt", weights_only=True)[STATE_VERSION_KEY] == state[STATE_VERSION_KEY]

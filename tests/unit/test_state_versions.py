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
from ptl_rl.core.versions import STATE_VERSION_KEY


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


def _goal_rows(n: int) -> ptl_rl.TransitionBatch:
    """``_rows`` with goal-env observations; every env's last row ends its episode (nothing in flight)."""
    rows = _rows(n)
    goals = rows["obs"].repeat(2, axis=1)
    rows["obs"] = {"achieved_goal": goals, "desired_goal": goals + 1}
    rows["next_obs"] = {"achieved_goal": goals + 1, "desired_goal": goals + 1}
    rows["truncated"] = np.arange(n) >= n - 2
    return rows


def _her(variant: int = 0) -> ptl_rl.HERReplayBuffer:
    reward = lambda achieved, desired, info: (achieved == desired).all(-1) - 1.0  # noqa: E731
    buffer = ptl_rl.HERReplayBuffer(None, 16, compute_reward=reward, warmup=0, seed=variant)
    buffer.add(_goal_rows(12 + 3 * variant))
    return buffer


def _filled(buffer: Any, variant: int = 0) -> Any:
    buffer.add(_rows(12 + 3 * variant))
    return buffer


def _rollout(variant: int = 0) -> ptl_rl.RolloutBuffer:
    return ptl_rl.RolloutBuffer(None, 4, num_envs=2, value_fn=lambda obs: np.zeros(len(obs)), seed=variant)


def _source(steps: int = 3) -> ptl_rl.ExperienceSource:
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=0)), seed=0)
    for _ in range(steps):
        next(source)
    return source


def _nstep(variant: int = 0) -> ptl_rl.NStepTransform:
    nstep = ptl_rl.NStepTransform(_source(0), n=3, gamma=0.9)
    for _ in range(2 + variant):
        next(nstep)
    return nstep


def _policy_agent(variant: int = 0) -> ptl_rl.StochasticPolicyAgent:
    actor = nn.Linear(4, 2)
    agent = ptl_rl.StochasticPolicyAgent(actor, gym.spaces.Discrete(2), seed=0)
    for _ in range(1 + variant):  # its generator is made at the first draw: variant 0 has one, variant 1 a later one
        agent(np.zeros((2, 4), dtype=np.float32))
    return agent


def _evaluation(variant: int = 0) -> ptl_rl.PeriodicEvaluation:
    source = _source(1)
    env = gym.make("CartPole-v1")
    return ptl_rl.PeriodicEvaluation(source, env, lambda _env: source.agent, every_env_steps=100 + 50 * variant)


# name -> build(variant): variants 0 and 1 are objects of the same kind in different states, so that loading one's
# state into the other shows whether the state was taken
STATEFUL: dict[str, Callable[..., Any]] = {
    "ExperienceSource": lambda variant=0: _source(3 + variant),
    "NStepTransform": _nstep,
    "BatchSampler": lambda variant=0: ptl_rl.BatchSampler(_filled(ptl_rl.ReplayBuffer(None, 16, warmup=0), variant), 4),
    "DQNAgent": lambda variant=0: _source(variant).agent,
    "StochasticPolicyAgent": _policy_agent,
    "EpisodeStatsLogger": lambda variant=0: ptl_rl.EpisodeStatsLogger(_source(1 + 60 * variant)),
    "PeriodicEvaluation": _evaluation,
    "ReplayBuffer": lambda variant=0: _filled(ptl_rl.ReplayBuffer(None, 16, warmup=0), variant),
    "ReplayBuffer(replacement=False)": lambda variant=0: _filled(
        ptl_rl.ReplayBuffer(None, 16, warmup=0, replacement=False), variant
    ),
    "PrioritizedReplayBuffer": lambda variant=0: _filled(ptl_rl.PrioritizedReplayBuffer(None, 16, warmup=0), variant),
    "SequenceReplayBuffer": lambda variant=0: _filled(
        ptl_rl.SequenceReplayBuffer(None, 16, length=2, warmup=0), variant
    ),
    "HERReplayBuffer": _her,
    "RolloutBuffer": _rollout,
    "ArrayStorage": lambda variant=0: _filled(ptl_rl.replay.ArrayStorage(16), variant),
    "EpsilonGreedySelector": lambda variant=0: ptl_rl.EpsilonGreedySelector(0.1, seed=variant),
}


def same_state(a: Any, b: Any) -> bool:
    """Deep equality of two states: nested dicts and sequences of arrays, tensors and plain values."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return a == b


CLOCKS = ("trained_s",)  # seconds that keep counting while the test runs (PeriodicEvaluation's training time)


def without_version(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != STATE_VERSION_KEY}


def assert_loaded(loaded: dict[str, Any], saved: dict[str, Any]) -> None:
    """``loaded`` is ``saved``, except that a clock may have run on a little since."""
    loaded, saved = dict(loaded), dict(saved)
    for key in CLOCKS:
        if key in saved:
            assert 0.0 <= loaded.pop(key) - saved.pop(key) < 5.0, key
    assert same_state(loaded, saved), (loaded, saved)


def load_into_other(build: Callable[..., Any], state: dict[str, Any]) -> Any:
    """Load ``state`` (of variant 0) into a variant-1 object, after checking that the two states differ."""
    target = build(1)
    if without_version(state):  # (a BatchSampler holds nothing but the version)
        assert not same_state(without_version(target.state_dict()), without_version(state)), "variants must differ"
    target.load_state_dict(state)
    return target


@pytest.fixture(params=sorted(STATEFUL))
def stateful(request: pytest.FixtureRequest) -> tuple[str, Callable[[], Any]]:
    return request.param, STATEFUL[request.param]


def test_state_names_its_version_and_round_trips(stateful):
    name, build = stateful
    state = build().state_dict()
    assert isinstance(state[STATE_VERSION_KEY], int) and state[STATE_VERSION_KEY] >= 1
    assert_loaded(load_into_other(build, state).state_dict(), state)


def test_a_newer_format_is_refused_naming_the_fix(stateful):
    name, build = stateful
    state = build().state_dict()
    state[STATE_VERSION_KEY] += 1
    with pytest.raises(ValueError, match=r"newer than .* upgrade ptl_rl"):
        build().load_state_dict(state)


def test_a_state_written_before_versions_still_loads(stateful):
    """A state without the key (format 0) is read, all of it: the loaded object's state is the saved one, now
    naming the current format."""
    name, build = stateful
    state = build().state_dict()
    version = state.pop(STATE_VERSION_KEY)
    loaded = load_into_other(build, state).state_dict()
    assert loaded[STATE_VERSION_KEY] == version
    assert_loaded(without_version(loaded), state)


def test_versioned_states_survive_weights_only_loading(tmp_path):
    state = STATEFUL["PrioritizedReplayBuffer"]().state_dict()
    torch.save(state, tmp_path / "state.pt")
    assert torch.load(tmp_path / "state.pt", weights_only=True)[STATE_VERSION_KEY] == state[STATE_VERSION_KEY]

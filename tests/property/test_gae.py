"""GAE and returns of the RolloutBuffer against a brute-force reference.

A tiny scripted env plays a given layout of terminated / truncated episodes;
its observation ``[env, episode, step]`` names each point of each episode, the
reward is a fixed function of it, and a fake critic's value is a known
function of it. The reference is computed from the env's own step record
(independently of ptl_rl) by summing the GAE series term by term.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

import ptl_rl
from ptl_rl.replay.gae import compute_gae

MODES = ("NextStep", "SameStep", "Disabled", "single")


def fake_value(obs: np.ndarray) -> np.ndarray:
    """The critic: a fixed, non-trivial function of the observation, float64 [B]."""
    obs = np.asarray(obs, dtype=np.float64)
    return np.sin(1.3 * obs[..., 0] + 0.7 * obs[..., 1] + 0.31 * obs[..., 2]) * 2.0


def scripted_reward(obs: np.ndarray) -> float:
    env, episode, step = (int(x) for x in obs)
    return float(((env * 7 + episode * 3 + step * 5) % 11) - 5) / 4.0


class LayoutEnv(gym.Env):
    """Plays ``episodes`` = [(length, "term" | "trunc"), ...], then one endless episode.

    Observations are float32 ``[index, episode, step]``; ``record`` holds every
    real step as (obs, reward, next_obs, terminated, truncated).
    """

    def __init__(self, index: int, episodes: Sequence[tuple[int, str]]) -> None:
        self.index, self.episodes = index, list(episodes)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.record: list[tuple[np.ndarray, float, np.ndarray, bool, bool]] = []
        self._episode, self._step = -1, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self._episode, self._step], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._episode, self._step = self._episode + 1, 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs = self._obs()
        reward = scripted_reward(obs)
        self._step += 1
        terminated = truncated = False
        if self._episode < len(self.episodes) and self._step == self.episodes[self._episode][0]:
            kind = self.episodes[self._episode][1]
            terminated, truncated = kind == "term", kind == "trunc"
        self.record.append((obs, reward, self._obs(), terminated, truncated))
        return self._obs(), reward, terminated, truncated, {}


def make_env(layouts: Sequence[Sequence[tuple[int, str]]], mode: str) -> gym.Env:
    fns = [functools.partial(LayoutEnv, i, layout) for i, layout in enumerate(layouts)]
    if mode == "single":
        return fns[0]()
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))


def records_of(env: gym.Env) -> list[list[tuple]]:
    return [env.record] if isinstance(env, LayoutEnv) else [e.record for e in env.envs]


class CriticAgent:
    """Action 0 everywhere; the ``value`` extra is the fake critic (or absent, to test the critic pass)."""

    def __init__(self, record_value: bool = True) -> None:
        self.record_value = record_value

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, dict]:
        extras = {"value": fake_value(obs).astype(np.float32)} if self.record_value else {}
        return np.zeros(len(obs), dtype=np.int64), extras


def reference_gae(steps: Sequence[tuple], gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Brute force for one env's consecutive steps: A_t = sum_k (gamma*lam)^(k-t) delta_k up to the first end."""
    n = len(steps)
    delta = np.empty(n)
    for k, (obs, reward, next_obs, term, _trunc) in enumerate(steps):
        bootstrap = 0.0 if term else gamma * fake_value(next_obs)
        delta[k] = np.float32(reward) + bootstrap - fake_value(obs)
    advantage = np.zeros(n)
    for t in range(n):
        for k in range(t, n):
            advantage[t] += (gamma * lam) ** (k - t) * delta[k]
            if steps[k][3] or steps[k][4]:  # an episode end stops the sum; the data end (k = n-1) too
                break
    values = np.array([fake_value(s[0]) for s in steps])
    return advantage, advantage + values


def obs_key(obs: np.ndarray) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in row) for row in np.asarray(obs)]


def check_rollout(
    rollout: ptl_rl.TransitionBatch, steps: list[list[tuple]], start: list[int], gamma: float, lam: float
) -> None:
    """Rows of ``rollout`` are, per env, exactly the steps ``start[e]:start[e]+count``; GAE matches the reference."""
    env_id = np.asarray(rollout["env_id"])
    got = dict(zip(obs_key(rollout["obs"]), zip(rollout["advantage"], rollout["returns"], strict=True), strict=True))
    assert len(got) == len(rollout), "a transition appears twice in one rollout"
    for e, record in enumerate(steps):
        count = int((env_id == e).sum())
        window = record[start[e] : start[e] + count]
        assert len(window) == count, "the rollout holds steps the env never took"
        adv, ret = reference_gae(window, gamma, lam)
        keys = obs_key(np.stack([s[0] for s in window])) if window else []
        np.testing.assert_allclose([got[k][0] for k in keys], adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose([got[k][1] for k in keys], ret, rtol=1e-5, atol=1e-5)
        start[e] += count


episode = st.tuples(st.integers(1, 6), st.sampled_from(["term", "trunc"]))
layout = st.lists(episode, max_size=5)


@settings(max_examples=150, deadline=None)
@given(
    layouts=st.lists(layout, min_size=1, max_size=3),
    mode=st.sampled_from(MODES),
    steps_per_env=st.integers(1, 9),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
    record_value=st.booleans(),
)
def test_rollout_gae_equals_brute_force(layouts, mode, steps_per_env, gamma, lam, record_value):
    if mode == "single":
        layouts = layouts[:1]
    env = make_env(layouts, mode)
    source = ptl_rl.ExperienceSource(env, CriticAgent(record_value), gamma=gamma, seed=0)
    rollout = ptl_rl.RolloutBuffer(
        source, steps_per_env, num_minibatches=1, gae_lambda=lam, value_fn=fake_value, normalize_advantage=None
    )
    start = [0] * len(layouts)
    for _ in range(3):  # consecutive rollouts continue each env's sequence; episodes straddle rollouts
        batch = rollout.collect()
        counts = np.bincount(batch["env_id"], minlength=len(layouts))
        assert counts.min() >= steps_per_env
        if mode != "NextStep":
            assert (counts == steps_per_env).all()
        check_rollout(batch, records_of(env), start, gamma, lam)


def test_rollout_counts_under_next_step_autoreset():
    """The env that resets lags by one row per reset step; the others keep their extra rows."""
    env = make_env([[(2, "term"), (2, "trunc")], []], "NextStep")
    source = ptl_rl.ExperienceSource(env, CriticAgent(), seed=0)
    batch = ptl_rl.RolloutBuffer(source, 4, epochs=1, num_minibatches=1, value_fn=fake_value).collect()
    # vector steps: env 0 steps, steps (term), resets, steps, steps (trunc) -> 4 rows after 5; env 1 has 5
    assert np.bincount(batch["env_id"]).tolist() == [4, 5]


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    length=st.integers(1, 12),
    num_envs=st.integers(1, 4),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_compute_gae_equals_series(data, length, num_envs, gamma, lam):
    """compute_gae on arbitrary [T, N] arrays equals the explicit sum of discounted TD errors."""
    floats = st.floats(-10, 10, allow_nan=False, width=32)
    shape = (length, num_envs)
    arr = lambda s: np.array(data.draw(st.lists(s, min_size=length * num_envs, max_size=length * num_envs))).reshape(
        shape
    )
    reward, value, next_value = arr(floats), arr(floats), arr(floats)
    terminated, truncated = arr(st.booleans()), arr(st.booleans())
    discount = np.full(shape, gamma)
    end = terminated | truncated
    end[-1] = True
    advantage, returns = compute_gae(reward, value, next_value, discount, terminated, end, lam)
    delta = reward + gamma * np.where(terminated, 0.0, next_value) - value
    for n in range(num_envs):
        for t in range(length):
            expected, weight = 0.0, 1.0
            for k in range(t, length):
                expected += weight * delta[k, n]
                if end[k, n]:
                    break
                weight *= gamma * lam
            assert advantage[t, n] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(returns, advantage + value)


def test_compute_gae_lambda_one_is_discounted_return():
    """lambda = 1, no ends inside: the advantage is the bootstrapped discounted return minus V."""
    reward = np.array([1.0, 2.0, 3.0])
    value = np.array([0.5, -1.0, 2.0])
    next_value = np.array([-1.0, 2.0, 10.0])
    end = np.array([False, False, True])
    advantage, returns = compute_gae(reward, value, next_value, np.full(3, 0.9), np.zeros(3, bool), end, 1.0)
    assert returns[0] == pytest.approx(1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 10)
    assert advantage[0] == pytest.approx(returns[0] - 0.5)

"""evaluate(): a fixed number of whole episodes per sub-env, whatever their lengths."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import ptl_rl


class FixedLengthEnv(gym.Env):
    """Episodes of ``length`` steps with reward 1 per step, so the return equals the length."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int) -> None:
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t >= self.length, False, {}


def zeros_agent(obs: np.ndarray) -> np.ndarray:
    return np.zeros(len(obs), dtype=np.int64)


def test_short_episodes_of_one_sub_env_do_not_crowd_out_long_ones() -> None:
    env = gym.vector.SyncVectorEnv([lambda: FixedLengthEnv(1), lambda: FixedLengthEnv(10)])
    returns = ptl_rl.evaluate(env, zeros_agent, episodes=4, seed=0)
    assert sorted(returns.tolist()) == [1.0, 1.0, 10.0, 10.0]


def test_episode_count_not_divisible_by_the_number_of_envs() -> None:
    env = gym.vector.SyncVectorEnv([lambda: FixedLengthEnv(2), lambda: FixedLengthEnv(3), lambda: FixedLengthEnv(5)])
    returns = ptl_rl.evaluate(env, zeros_agent, episodes=5, seed=0)
    # sub-env i runs (5 + i) // 3 episodes: 1, 2 and 2
    assert sorted(returns.tolist()) == [2.0, 3.0, 3.0, 5.0, 5.0]


def test_single_env_and_bad_count() -> None:
    assert ptl_rl.evaluate(FixedLengthEnv(4), zeros_agent, episodes=3).tolist() == [4.0, 4.0, 4.0]
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        ptl_rl.evaluate(FixedLengthEnv(4), zeros_agent, episodes=0)

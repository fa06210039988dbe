"""CartPole without velocities, the partially observed env of the recurrent examples (r2d2, recurrent_ppo).

Importing this module registers ``CartPoleNoVelocity-v1`` with gymnasium. It
imports gymnasium and numpy only.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.envs.registration import registry

ENV_ID = "CartPoleNoVelocity-v1"


class CartPoleNoVelocity(gym.ObservationWrapper):
    """CartPole with the velocities masked: observations float32 [2] = (cart position, pole angle)."""

    KEEP = np.array([0, 2])  # indices 1 and 3 of CartPole's observation are the velocities

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, spaces.Box), f"CartPole's observations are a Box, got {box}"
        self.observation_space = spaces.Box(box.low[self.KEEP], box.high[self.KEEP], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        kept: np.ndarray = observation[self.KEEP].astype(np.float32)
        return kept


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    """CartPole-v1's dynamics (its 500-step limit comes with the registration) with the velocities masked."""
    return CartPoleNoVelocity(CartPoleEnv(**kwargs))


if ENV_ID not in registry:  # importing this module makes the env available to gym.make and to --env-id
    gym.register(ENV_ID, entry_point=make_cartpole_no_velocity, max_episode_steps=500, reward_threshold=475.0)

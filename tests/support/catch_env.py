"""Catch: a tiny pixel env for learning tests of CNN agents (importing this module registers ``PixelCatch-v0``).

A ball falls from a random column of the top row, one row per step; a
paddle on the bottom row moves left, stays or moves right (actions 0, 1, 2).
When the ball reaches the bottom row the episode terminates with reward +1
if the paddle is under it, else -1. Observations are uint8 frames
``[size * scale, size * scale]`` (0 background, 255 ball and paddle).
Random play scores about -0.6 on average, the optimum is +1 every episode.

``PixelCatch-v0`` stacks 4 frames with gymnasium's ``FrameStackObservation``
(obs ``[4, 14, 14]`` uint8) and cuts episodes with a ``TimeLimit`` of 100
steps (never reached: an episode lasts ``size - 1`` steps).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "PixelCatch-v0"


class Catch(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, size: int = 7, scale: int = 2) -> None:
        self.size, self.scale = int(size), int(scale)
        side = self.size * self.scale
        self.observation_space = spaces.Box(0, 255, shape=(side, side), dtype=np.uint8)
        self.action_space = spaces.Discrete(3)
        self._ball = np.zeros(2, dtype=np.int64)  # row, column
        self._paddle = self.size // 2

    def _frame(self) -> np.ndarray:
        grid = np.zeros((self.size, self.size), dtype=np.uint8)
        grid[self._ball[0], self._ball[1]] = 255
        grid[self.size - 1, self._paddle] = 255
        return np.kron(grid, np.ones((self.scale, self.scale), dtype=np.uint8))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._ball[:] = (0, self.np_random.integers(self.size))
        self._paddle = self.size // 2
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._paddle = int(np.clip(self._paddle + int(action) - 1, 0, self.size - 1))
        self._ball[0] += 1
        terminated = bool(self._ball[0] == self.size - 1)
        reward = (1.0 if self._ball[1] == self._paddle else -1.0) if terminated else 0.0
        return self._frame(), reward, terminated, False, {}


def make_stacked_catch(stack: int = 4, **kwargs: Any) -> gym.Env:
    return gym.wrappers.FrameStackObservation(gym.wrappers.TimeLimit(Catch(**kwargs), 100), stack)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=make_stacked_catch)

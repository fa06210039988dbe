"""The bit-flipping env of the HER paper (Andrychowicz et al. 2017, section 3.1), with the gymnasium-robotics API.

The state is ``n`` bits and so is the goal, both drawn uniformly at reset (the
goal redrawn until it differs from the state, so every episode takes a step).
Action ``i`` flips bit ``i``. The reward is -1 until the state equals the goal,
then 0 and the episode terminates; it is truncated after ``n`` steps, enough
to reach any goal. Random exploration reaches a goal about ``2**-n`` of the
time, so without hindsight the reward is almost always -1.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class BitFlipEnv(gym.Env):
    """``n_bits`` bits to turn into the goal bits, one flip per step (float32 0/1 observations)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, n_bits: int = 10, max_steps: int | None = None) -> None:
        self.n_bits = int(n_bits)
        self.max_steps = self.n_bits if max_steps is None else int(max_steps)
        bits = spaces.Box(0.0, 1.0, (self.n_bits,), dtype=np.float32)
        self.observation_space = spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = spaces.Discrete(self.n_bits)
        self._state = np.zeros(self.n_bits, dtype=np.float32)
        self._goal = np.zeros(self.n_bits, dtype=np.float32)
        self._steps = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            "observation": self._state.copy(),
            "achieved_goal": self._state.copy(),
            "desired_goal": self._goal.copy(),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self._state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self._goal = self._state
        while (self._goal == self._state).all():
            self._goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self._steps = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        self._state = self._state.copy()
        self._state[int(action)] = 1.0 - self._state[int(action)]
        self._steps += 1
        reward = float(self.compute_reward(self._state, self._goal, {}))
        terminated = bool(self.compute_terminated(self._state, self._goal, {}))
        truncated = self._steps >= self.max_steps and not terminated
        return self._obs(), reward, terminated, truncated, {"is_success": terminated}

    @staticmethod
    def compute_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """0 where the achieved goal equals the desired one, else -1 (float32 [...], vectorized over leading axes)."""
        return (np.asarray(achieved_goal) == np.asarray(desired_goal)).all(-1).astype(np.float32) - 1.0

    @staticmethod
    def compute_terminated(achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """Whether the achieved goal equals the desired one (bool [...])."""
        return (np.asarray(achieved_goal) == np.asarray(desired_goal)).all(-1)


def bit_flip_vector_env(num_envs: int, n_bits: int, **kwargs: Any) -> gym.vector.SyncVectorEnv:
    """``num_envs`` bit-flip envs in a ``SyncVectorEnv`` (next-step autoreset, gymnasium's default)."""
    return gym.vector.SyncVectorEnv([lambda: BitFlipEnv(n_bits, **kwargs) for _ in range(num_envs)])

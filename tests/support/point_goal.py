"""PointGoal-v0: a sparse-reward goal env in the gymnasium-robotics API, small enough for a CPU test.

A point in the square ``[-1, 1]^2`` moves by ``0.1 * action`` (``action`` in
``[-1, 1]^2``) towards a goal drawn uniformly in the square at reset. The
observation is the robotics dict: ``observation`` (the position and the
last velocity, float32 [4]), ``achieved_goal`` (the position, float32 [2])
and ``desired_goal`` (float32 [2]). The reward is 0 within ``TOLERANCE`` of
the goal and -1 elsewhere; episodes never terminate and are truncated after
``EPISODE_STEPS`` steps; ``info["is_success"]`` says whether the point is on
the goal. With sparse rewards a random policy rarely meets its goal, which is
the setting hindsight relabeling is for. Importing this module registers the
env, so ``--env-id point_goal:PointGoal-v0`` works from the command line.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

TOLERANCE = 0.05
EPISODE_STEPS = 30
SPEED = 0.1


class PointGoalEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self) -> None:
        box = lambda n: spaces.Box(-1.0, 1.0, (n,), dtype=np.float32)  # noqa: E731
        self.observation_space = spaces.Dict({"observation": box(4), "achieved_goal": box(2), "desired_goal": box(2)})
        self.action_space = box(2)
        self.position = np.zeros(2, dtype=np.float32)
        self.velocity = np.zeros(2, dtype=np.float32)
        self.goal = np.zeros(2, dtype=np.float32)

    @staticmethod
    def compute_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
        """float32 [...]: 0 where ``achieved`` (float [..., 2]) is within TOLERANCE of ``desired``, else -1."""
        return -(np.linalg.norm(achieved - desired, axis=-1) > TOLERANCE).astype(np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        observation = np.concatenate([self.position, self.velocity])
        return {"observation": observation, "achieved_goal": self.position.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.velocity = np.zeros(2, dtype=np.float32)
        return self._obs(), {"is_success": False}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        self.velocity = SPEED * np.clip(np.asarray(action, dtype=np.float32), -1, 1)
        self.position = np.clip(self.position + self.velocity, -1, 1).astype(np.float32)
        reward = float(self.compute_reward(self.position, self.goal, {}))
        return self._obs(), reward, False, False, {"is_success": reward == 0.0}


if "PointGoal-v0" not in gym.registry:
    gym.register("PointGoal-v0", entry_point=PointGoalEnv, max_episode_steps=EPISODE_STEPS)

"""Action selectors (scores -> actions) and schedules driven by the env-step count."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import numpy as np

from ptl_rl.core.ranks import rank_seed
from ptl_rl.core.schedules import LinearSchedule, Schedule, as_schedule
from ptl_rl.core.versions import check_version, versioned

__all__ = ["ArgmaxSelector", "EpsilonGreedySelector", "LinearSchedule", "Schedule", "Selector"]

#: What a Q-value agent picks its actions with: ``selector(scores float [N, A]) -> actions int64 [N]`` (optional
#: hooks: ``on_env_steps``, ``set_rank``, ``state_dict``/``load_state_dict``, ``select_lazily``).
Selector: TypeAlias = Callable[[np.ndarray], np.ndarray]


class ArgmaxSelector:
    """Greedy: ``scores`` float [N, A] -> actions int64 [N]."""

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        actions: np.ndarray = np.asarray(scores).argmax(axis=-1)
        return actions

    def on_env_steps(self, total_steps: int) -> None:
        pass


class EpsilonGreedySelector:
    """With probability epsilon a uniform random action, else the argmax.

    Args:
        epsilon: a float, or a schedule ``env_steps -> epsilon`` such as
            :class:`LinearSchedule`; the agent forwards the env-step count.
        seed: seed of the exploration generator.

    ``scores`` float [N, A] -> actions int64 [N].
    """

    def __init__(self, epsilon: float | Schedule = 0.1, seed: int | None = None) -> None:
        self.schedule = as_schedule(epsilon)
        self.epsilon = self.schedule(0)
        self.seed = seed
        self.rank = 0
        self.rng = np.random.default_rng(seed)

    def set_rank(self, rank: int) -> None:
        """Re-seed for DDP rank ``rank`` (a no-op when already there, so a restored RNG state is kept)."""
        if int(rank) != self.rank:
            self.rank = int(rank)
            self.rng = np.random.default_rng(rank_seed(self.seed, self.rank))

    def on_env_steps(self, total_steps: int) -> None:
        self.epsilon = self.schedule(total_steps)

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        scores = np.asarray(scores)
        return self.select_lazily(len(scores), scores.shape[-1], lambda: scores)

    def select_lazily(self, n: int, num_actions: int, scores: Callable[[], np.ndarray]) -> np.ndarray:
        """Actions int64 [n], calling ``scores()`` (float [n, num_actions]) only if some env acts greedily.

        The same draws as ``self(scores())``, in the same order, so the actions and the
        generator's state do not depend on which of the two was called. A
        :class:`~ptl_rl.agents.dqn.DQNAgent` calls this one, so a step on which every env
        explores (most of them while epsilon is high) skips the network's forward pass.
        """
        if n == 1:  # scalar draws: the same stream as random(1) and integers(0, k, 1), at a quarter of the cost
            if self.rng.random() < self.epsilon:
                return np.array([self.rng.integers(0, num_actions)], dtype=np.int64)
            actions: np.ndarray = np.asarray(scores()).argmax(axis=-1)
            return actions
        explore = self.rng.random(n) < self.epsilon
        exploring = int(np.count_nonzero(explore))
        if exploring == n:
            return self.rng.integers(0, num_actions, n)
        actions = np.asarray(scores()).argmax(axis=-1)
        if exploring:
            actions[explore] = self.rng.integers(0, num_actions, exploring)
        return actions

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        return versioned({"rng": self.rng.bit_generator.state, "epsilon": self.epsilon}, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.rng.bit_generator.state = state["rng"]
        self.epsilon = float(state["epsilon"])

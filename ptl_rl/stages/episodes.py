"""The source's episode bookkeeping: each sub-env's return and length so far, and the episodes that finished.

No per-step loop over envs: returns add as one vector, and an episode's length
is the vector-step count now minus the count at its start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from ptl_rl.core.episode import Episode


class EpisodeTracker:
    """Per-env returns and lengths of ``num_envs`` sub-envs, and the finished episodes.

    Args:
        env_ids: the ``env_id`` of each sub-env (int64 [N]).
        stats_window: how many recent episodes :meth:`stats` averages.
        max_pending: how many finished episodes :meth:`pop` keeps for its next call.
    """

    def __init__(self, env_ids: np.ndarray, stats_window: int, max_pending: int) -> None:
        n = len(env_ids)
        self.env_ids = env_ids
        self.total_steps = 0
        self.episodes_finished = 0
        self._return = np.zeros(n, dtype=np.float64)
        self._vector_steps = 0
        self._start = np.zeros(n, dtype=np.int64)
        self._pending: deque[Episode] = deque(maxlen=int(max_pending))
        self.recent: deque[Episode] = deque(maxlen=stats_window)

    def step(
        self, reward: np.ndarray, done: np.ndarray, any_done: bool, just_reset: np.ndarray | None, stepped: int
    ) -> None:
        """Add a step's ``reward`` (float [N], all envs) to the returns; close the episodes that ended.

        ``just_reset`` (bool [N] or ``None``) marks the envs whose step only reset them (next-step
        autoreset): their episode starts after this step. ``stepped``: the envs that took a real step.
        """
        self._vector_steps += 1
        self._return += reward
        self.total_steps += stepped
        if just_reset is not None:
            # a resetting env's return was zeroed when its episode ended: what its reset step adds is dropped
            self._return[just_reset] = 0.0
            self._start[just_reset] = self._vector_steps
        if any_done:
            self._close(done.nonzero()[0])

    def _close(self, ended: np.ndarray) -> None:
        """Close the episodes of the envs ``ended`` (int [k]): one vectorized read, one Episode each."""
        steps = self.total_steps
        episodes = [
            Episode(r, n, e, steps)
            for r, n, e in zip(
                self._return[ended].tolist(),
                (self._vector_steps - self._start[ended]).tolist(),
                self.env_ids[ended].tolist(),
                strict=True,
            )
        ]
        self.episodes_finished += len(episodes)
        self._pending.extend(episodes)
        self.recent.extend(episodes)
        self._return[ended] = 0.0
        self._start[ended] = self._vector_steps

    def restart_all(self) -> None:
        """Every sub-env starts a new episode now (a reset of all of them); episodes in progress are dropped."""
        self._return[:] = 0.0
        self._start[:] = self._vector_steps

    def pop(self) -> list[Episode]:
        """Episodes finished since the last call (each returned once), oldest first."""
        episodes = list(self._pending)
        self._pending.clear()
        return episodes

    def stats(self) -> dict[str, float]:
        """Mean return and length of the last ``stats_window`` episodes, and counters."""
        stats = {"env_steps": float(self.total_steps), "episodes": float(self.episodes_finished)}
        if self.recent:
            stats["return_mean"] = float(np.mean([e.ret for e in self.recent]))
            stats["length_mean"] = float(np.mean([e.length for e in self.recent]))
        return stats

    def state_dict(self) -> dict[str, Any]:
        """Counters and recent episodes as plain containers (episodes in progress are not saved)."""
        return {
            "total_steps": self.total_steps,
            "episodes_finished": self.episodes_finished,
            "recent": [[e.ret, e.length, e.env_id, e.total_steps] for e in self.recent],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.total_steps = int(state["total_steps"])
        self.episodes_finished = int(state["episodes_finished"])
        self.recent.clear()
        self.recent.extend(Episode(float(r), int(n), int(e), int(t)) for r, n, e, t in state["recent"])
        self._pending.clear()

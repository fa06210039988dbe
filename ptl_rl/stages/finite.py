"""The source's check that what an env returns is finite: rewards and float observations, one probe a step.

Fast path: one dot product with zeros per float array: ``0 * x`` is 0 for
every finite ``x`` (it cannot overflow) and NaN for NaN and inf. Only when a
probe fails are the rows examined, to name the field and the sub-envs.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ptl_rl.core._trees import tree_leaves


@functools.lru_cache(maxsize=64)
def _zeros(size: int, dtype: np.dtype) -> np.ndarray:
    return np.zeros(size, dtype=dtype)


def non_finite_rows(tree: Any) -> tuple[str, np.ndarray] | None:
    """The first float leaf of ``tree`` ([N, ...] arrays) holding NaN or inf, as ``(path, bad rows)``; else ``None``."""
    if type(tree) is np.ndarray:  # the common case, without walking a tree
        if tree.dtype.kind != "f" or tree.size == 0:
            return None
        if math.isfinite(tree.reshape(-1).dot(_zeros(tree.size, tree.dtype))):
            return None
        rows = np.flatnonzero((~np.isfinite(tree.reshape(len(tree), -1))).any(axis=1))
        return ("", rows) if len(rows) else None
    for path, leaf in tree_leaves(tree):
        bad = non_finite_rows(np.asarray(leaf))
        if bad is not None:
            return path, bad[1]
    return None


class FiniteCheck:
    """Raises ``FloatingPointError`` naming the field and the sub-envs of a NaN or inf in a step of ``num_envs``."""

    def __init__(self, num_envs: int) -> None:
        # zeros to dot with: 0 * x is 0 for finite x and NaN for NaN and inf
        self._reward_zeros = np.zeros(num_envs, dtype=np.float32)
        self._obs_zeros: np.ndarray | None = None  # sized at the first step with array observations

    def step(self, reward: np.ndarray, next_obs: Any, obs: Any, env_ids: np.ndarray, env_steps: int) -> None:
        """Check a step's rewards (float32 [N]) and observations; one ``isfinite`` on the common path."""
        zeros = self._obs_zeros
        if next_obs is obs and zeros is not None and type(obs) is np.ndarray and obs.size == zeros.size:
            # array observations, no same-step reset: two dot products with zeros, one isfinite
            probe = reward.dot(self._reward_zeros)
            if obs.dtype.kind == "f":
                probe += obs.reshape(-1).dot(zeros)
            if math.isfinite(probe):
                return
        elif zeros is None and type(obs) is np.ndarray:
            self._obs_zeros = np.zeros(obs.size, dtype=obs.dtype if obs.dtype.kind == "f" else np.float32)
        self.field(reward, "reward", env_ids, env_steps)
        self.field(next_obs, "next_obs", env_ids, env_steps)
        if next_obs is not obs:  # same-step resets: the reset observations are only in obs
            self.field(obs, "reset observation", env_ids, env_steps)

    @staticmethod
    def field(tree: Any, field: str, env_ids: np.ndarray, env_steps: int) -> None:
        """Raise ``FloatingPointError`` if a float leaf of ``tree`` ([N, ...]) holds NaN or inf."""
        bad = non_finite_rows(tree)
        if bad is None:
            return
        path, rows = bad
        name = f"{field}.{path}" if path else field
        raise FloatingPointError(
            f"non-finite {name} (NaN or inf) from sub-env(s) {rows.tolist()} (env_id {env_ids[rows].tolist()}) "
            f"at env step {env_steps}; stored, it would silently turn the network's weights into NaN. "
            "Fix the env (or wrap it so it clips or replaces such values), or pass check_finite=False to "
            "ExperienceSource to turn this check off. The next next() resets every sub-env."
        )

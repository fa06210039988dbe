"""Evaluation: run an agent for whole episodes and report their returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ptl_rl.source import ExperienceSource


def evaluate(env: Any, agent: Callable[[Any], Any], episodes: int, seed: int | None = None) -> np.ndarray:
    """Undiscounted returns (float64 [episodes]) of ``episodes`` whole episodes of ``agent`` in ``env``.

    ``env`` may be a single or a vector env. With ``N`` sub-envs, sub-env ``i``
    contributes its first ``(episodes + i) // N`` episodes, so the count is
    fixed in advance: taking whichever episodes finish first would favour
    short ones and bias the mean low. Use ``N`` dividing ``episodes`` to run
    them all in parallel.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    source = ExperienceSource(env, agent, seed=seed)
    n = source.num_envs
    wanted = {int(env_id): (episodes + i) // n for i, env_id in enumerate(source._env_ids)}
    returns: list[float] = []
    while len(returns) < episodes:
        next(source)
        for episode in source.pop_episodes():
            if wanted[episode.env_id] > 0:
                wanted[episode.env_id] -= 1
                returns.append(episode.ret)
    return np.asarray(returns, dtype=np.float64)

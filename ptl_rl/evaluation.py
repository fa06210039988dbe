"""Evaluation: run an agent for whole episodes and report their returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ptl_rl.source import ExperienceSource


def evaluate(env: Any, agent: Callable[[Any], Any], episodes: int, seed: int | None = None) -> np.ndarray:
    """Undiscounted returns (float64 [episodes]) of the first ``episodes`` episodes ``agent`` finishes in ``env``.

    ``env`` may be a single or vector env; with a vector env the episodes run
    in parallel (the first ``episodes`` to finish are counted, which favours
    short episodes only if more envs than episodes are used: prefer
    ``num_envs`` that divides ``episodes``).
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    source = ExperienceSource(env, agent, seed=seed)
    returns: list[float] = []
    while len(returns) < episodes:
        next(source)
        returns.extend(e.ret for e in source.pop_episodes())
    return np.asarray(returns[:episodes], dtype=np.float64)

"""A standalone replay buffer filled with a whole Minari dataset in one call (:func:`minari_replay_buffer`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ptl_rl.offline.source import MinariSource
from ptl_rl.replay import ReplayBuffer

if TYPE_CHECKING:
    from minari import MinariDataset

__all__ = ["minari_replay_buffer"]


def minari_replay_buffer(
    dataset: MinariDataset | str | os.PathLike[str],
    *,
    nstep: int = 1,
    gamma: float = 0.99,
    capacity: int | None = None,
    seed: int | None = None,
    replacement: bool = True,
    lanes: int = 256,
    **source_kwargs: Any,  # MinariSource's own keywords, forwarded
) -> ReplayBuffer:
    """A standalone :class:`~ptl_rl.replay.ReplayBuffer` holding a whole Minari dataset, filled in one call.

    For offline RL and behaviour cloning: fill once, then sample, e.g.
    ``to_dataloader(BatchSampler(buffer, batch_size=256), steps_per_epoch=...)``.
    ``nstep > 1`` folds n-step returns first (``gamma`` per step).
    ``capacity`` defaults to the dataset's number of steps (every n-step
    window starts at one step, so that holds them all). ``replacement=False``
    samples shuffled passes (epochs) over the data. Other keyword arguments go
    to :class:`MinariSource` (``episode_indices``, ``observation_space``, ...).
    """
    source = MinariSource(dataset, lanes=lanes, gamma=gamma, epochs=1, **source_kwargs)
    if capacity is None:
        capacity = max(1, source.steps_per_pass())
    buffer = ReplayBuffer(None, capacity=capacity, warmup=0, seed=seed, replacement=replacement)
    return source.fill(buffer, nstep=nstep)

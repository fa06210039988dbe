"""Rank-distinct seeds: each DDP rank (or remote worker) must collect and sample different data.

Every seeded part of a pipeline (sub-env seeds, replay sampling, exploration
noise) derives its generator from ``(seed, rank)``. Rank 0 keeps the plain
seed, so a single-process run is the same with or without this module.

The rank is taken from the Lightning Trainer automatically: :func:`assign_rank`
is called by :class:`~ptl_rl.lightning.PipelineCheckpoint` at setup (before a
checkpoint is restored) and by the DataLoader adapter when it starts
iterating. A part takes its rank once; calling it again with the same rank
does nothing, so a restored RNG state is never re-seeded.
"""

from __future__ import annotations

import numpy as np
import torch.distributed as dist

from ptl_rl.core.chain import pipeline_stages
from ptl_rl.core.protocols import Pipeline, RankAware


def rank_seed(seed: int | None, rank: int) -> int | None:
    """The seed of ``rank``: ``seed`` itself for rank 0, an independent 63-bit seed for the others."""
    if seed is None or rank == 0:
        return seed
    return int(np.random.SeedSequence([int(seed), int(rank)]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of this process in ``torch.distributed``; ``(0, 1)`` when it is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def assign_rank(pipeline: Pipeline, rank: int) -> None:
    """Give every :class:`~ptl_rl.core.protocols.RankAware` stage of ``pipeline`` (and the source's agent) its rank."""
    for stage in pipeline_stages(pipeline):
        if isinstance(stage, RankAware):
            stage.set_rank(rank)

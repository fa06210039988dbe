"""PipelineCheckpoint: a pipeline's state in every Lightning checkpoint, under one fixed key, restored on resume."""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch.distributed as dist

from ptl_rl.core.chain import load_pipeline_state_dict, pipeline_stages, pipeline_state_dict
from ptl_rl.core.protocols import Pipeline
from ptl_rl.core.ranks import assign_rank
from ptl_rl.lightning._compat import Callback, ModuleLike, TrainerLike
from ptl_rl.lightning.stops import note_trainer_limits
from ptl_rl.stages.normalize import sync_statistics

__all__ = ["CHECKPOINT_KEY", "PipelineCheckpoint", "is_checkpointed", "last_stage_of", "note_checkpointed"]

# Where a pipeline's state lives in a Lightning checkpoint: one fixed key, whatever the DataModule's class.
CHECKPOINT_KEY = "ptl_rl/pipeline"

# Last stages whose state some PipelineCheckpoint saves; the adapter warns when a checkpoint misses them. Weak: a
# record must not keep a finished pipeline alive.
_CHECKPOINTED: weakref.WeakSet[object] = weakref.WeakSet()


def last_stage_of(pipeline: Pipeline) -> Any:
    """The last stage of ``pipeline`` (a stage, or the loader of :func:`~ptl_rl.lightning.to_dataloader`)."""
    return pipeline_stages(pipeline)[-1]


def note_checkpointed(pipeline: Pipeline) -> None:
    """Record that ``pipeline``'s state is saved (or that its loader has warned that it is not: it warns once)."""
    _CHECKPOINTED.add(last_stage_of(pipeline))


def is_checkpointed(pipeline: Pipeline) -> bool:
    """Whether a :class:`PipelineCheckpoint` saves ``pipeline`` (any of its stages), see :func:`note_checkpointed`."""
    return any(stage in _CHECKPOINTED for stage in pipeline_stages(pipeline))


def _world(trainer: TrainerLike) -> tuple[int, int]:
    return int(trainer.global_rank), int(trainer.world_size)


def _gather_to_rank_zero(state: Any, trainer: TrainerLike) -> list[Any] | None:
    """Every rank's ``state`` on rank 0 (in rank order); ``None`` on the other ranks."""
    rank, world_size = _world(trainer)
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [state]
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(state, gathered, dst=0)
    return gathered


class PipelineCheckpoint(Callback):
    """Saves a pipeline's state in every Lightning checkpoint and restores it on resume.

    The state (replay contents, priorities, RNG states, in-flight n-step
    windows, episode counters, the agent's exploration state) is held as
    tensors and plain containers, so ``torch.load(ckpt, weights_only=True)``
    reads the checkpoint. It lives under one fixed key,
    :data:`CHECKPOINT_KEY`, whatever the DataModule's class.

    Args:
        pipeline: the last stage (or the loader from :func:`to_dataloader`).
        include_replay: ``False`` keeps replay buffers out of checkpoints (for
            replays too large to copy); after a resume they warm up again.

    * Under DDP every rank's pipeline is its own: at save, each rank's state is
      gathered to rank 0, which writes them all; at load, rank ``r`` takes
      entry ``r``. A rank with no saved entry (a larger world on resume) starts
      fresh, with a warning.
    * ``ModelCheckpoint(save_weights_only=True)`` writes no pipeline state
      (Lightning skips callbacks' checkpoint hooks for weights-only saves).
    * Saving does not copy the replay in memory: the saved tensors are views of
      the buffer's arrays, written straight to the file.
    * At ``setup`` it gives every stage the Trainer's global rank (see
      :mod:`ptl_rl.core.ranks`), before any restore.
    """

    def __init__(self, pipeline: Pipeline, include_replay: bool = True) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.include_replay = bool(include_replay)
        note_checkpointed(pipeline)

    @property
    def last_stage(self) -> Any:
        return last_stage_of(self.pipeline)

    def setup(self, trainer: TrainerLike, pl_module: ModuleLike, stage: str) -> None:
        note_trainer_limits(trainer, self.pipeline)
        rank, world_size = _world(trainer)
        if world_size > 1:
            assign_rank(self.pipeline, rank)

    def on_save_checkpoint(self, trainer: TrainerLike, pl_module: ModuleLike, checkpoint: dict[str, Any]) -> None:
        if _world(trainer)[1] > 1:  # every rank is here: the checkpoint gets the statistics of all ranks' data
            sync_statistics(self.pipeline)
        per_rank = _gather_to_rank_zero(pipeline_state_dict(self.pipeline, self.include_replay), trainer)
        if per_rank is not None:
            checkpoint[CHECKPOINT_KEY] = {"world_size": len(per_rank), "ranks": per_rank}

    def on_load_checkpoint(self, trainer: TrainerLike, pl_module: ModuleLike, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(CHECKPOINT_KEY)
        if saved is None:
            warnings.warn(
                "the checkpoint holds no ptl_rl pipeline state (written without PipelineCheckpoint, or with "
                "save_weights_only=True): the pipeline starts fresh, with an empty replay",
                UserWarning,
                stacklevel=2,
            )
            return
        rank, world_size = _world(trainer)
        if rank >= len(saved["ranks"]):
            warnings.warn(
                f"the checkpoint holds the pipelines of {len(saved['ranks'])} ranks; rank {rank} of this run "
                f"(world size {world_size}) has none and starts fresh",
                UserWarning,
                stacklevel=2,
            )
            return
        load_pipeline_state_dict(self.pipeline, saved["ranks"][rank])

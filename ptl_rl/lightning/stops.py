"""How a run over an endless loader stops: :class:`EnvStepLimit`, and which pipelines' Trainers stop by themselves.

A loader without ``steps_per_epoch`` is one endless Lightning epoch. The
adapter warns about it at its first batch unless it knows that the Trainer
stops the run (``max_steps`` or an :class:`EnvStepLimit`). The adapter cannot
see the Trainer, but every ptl_rl callback does at ``setup``: it records the
pipeline's stages here (:func:`note_trainer_limits`), and the adapter asks
(:func:`stop_known`). This module sits below both the adapter and the
callbacks, so neither imports the other.
"""

from __future__ import annotations

import weakref

import torch

from ptl_rl.core.chain import find_episode_source, pipeline_stages
from ptl_rl.core.protocols import EpisodeCounter, Pipeline
from ptl_rl.lightning._compat import Callback, ModuleLike, TrainerLike, trainer_callbacks
from ptl_rl.lightning.expected_warnings import ExpectedWarnings

__all__ = ["EnvStepLimit", "PipelineCallback", "note_trainer_limits", "stop_known", "trainer_has_step_limit"]

# Stages whose Trainer a ptl_rl callback has seen with a stop condition. Weak: a record must not keep a finished
# pipeline (its envs, its replay) alive.
_STOP_KNOWN: weakref.WeakSet[object] = weakref.WeakSet()


def trainer_has_step_limit(trainer: TrainerLike) -> bool:
    """Whether ``trainer`` has an :class:`EnvStepLimit` among its callbacks."""
    return any(isinstance(c, EnvStepLimit) for c in trainer_callbacks(trainer))


def note_trainer_limits(trainer: TrainerLike, pipeline: Pipeline) -> None:
    """Remember, for :func:`stop_known`, whether ``trainer`` stops an endless loader over ``pipeline`` by itself."""
    if trainer.max_steps != -1 or trainer_has_step_limit(trainer):
        _STOP_KNOWN.update(pipeline_stages(pipeline))


def stop_known(pipeline: Pipeline) -> bool:
    """Whether a ptl_rl callback saw a Trainer that stops a run over ``pipeline`` (one of its stages) by itself."""
    return any(stage in _STOP_KNOWN for stage in pipeline_stages(pipeline))


class PipelineCallback(Callback):
    """A callback over a pipeline: at ``setup`` it tells the adapter whether the Trainer stops an endless loader,
    and it ignores the two Lightning warnings the adapter's loader triggers by design while the Trainer runs
    (:mod:`ptl_rl.lightning.expected_warnings`)."""

    pipeline: Pipeline

    def setup(self, trainer: TrainerLike, pl_module: ModuleLike, stage: str) -> None:
        note_trainer_limits(trainer, self.pipeline)
        self._expected_warnings().enter()

    def teardown(self, trainer: TrainerLike, pl_module: ModuleLike, stage: str) -> None:
        self._expected_warnings().exit()

    def _expected_warnings(self) -> ExpectedWarnings:
        # (created on first use: a subclass need not call this __init__)
        expected = self.__dict__.get("_expected")
        if expected is None:
            expected = self.__dict__["_expected"] = ExpectedWarnings()
        return expected


def global_env_steps(trainer: TrainerLike, source: EpisodeCounter) -> int:
    """Env steps taken by the sources of all ranks together (one all-reduce under DDP)."""
    if trainer.world_size == 1:
        return source.total_steps
    total = trainer.strategy.reduce(torch.tensor(source.total_steps, dtype=torch.float64), reduce_op="sum")
    return int(total.item())


class EnvStepLimit(PipelineCallback):
    """Stops training once ``max_env_steps`` env steps have been taken, counted over all ranks together.

    Under DDP each rank's source counts its own steps; their sum is reduced at
    every batch end, so every rank stops at the same batch.
    """

    def __init__(self, pipeline: Pipeline, max_env_steps: int) -> None:
        super().__init__()
        self.source: EpisodeCounter = find_episode_source(pipeline)
        self.pipeline = pipeline
        self.max_env_steps = int(max_env_steps)

    def on_train_batch_end(self, trainer: TrainerLike, *args: object) -> None:
        if global_env_steps(trainer, self.source) >= self.max_env_steps:
            trainer.should_stop = True

"""WeightSync: the Lightning side of remote collection (weight pushes, staleness logging, shutdown)."""

from __future__ import annotations

from typing import Any

from ptl_rl.core.chain import pipeline_stages
from ptl_rl.core.protocols import Pipeline
from ptl_rl.lightning._compat import Callback, ModuleLike, TrainerLike


def find_collecting_stage(pipeline: Pipeline) -> Any:
    """The stage of ``pipeline`` that collects elsewhere and takes weights (it has ``push_weights``)."""
    for stage in pipeline_stages(pipeline):
        if callable(getattr(stage, "push_weights", None)):
            return stage
    raise ValueError(
        f"the pipeline {[type(s).__name__ for s in pipeline_stages(pipeline)]} has no stage that takes weights; "
        "start it with ptl_rl.distributed.AsyncSource or RayWorkers"
    )


class WeightSync(Callback):
    """Pushes the learner's weights to the collectors every ``every_n_steps`` optimizer steps and logs staleness.

    Args:
        pipeline: the loader, or any stage of a pipeline that starts with an
            :class:`~ptl_rl.distributed.AsyncSource` or
            :class:`~ptl_rl.distributed.RayWorkers` (built with ``policy=``,
            the module the learner trains).
        every_n_steps: optimizer steps between pushes (K). Each push is a new
            ``policy_version``.
        log: log ``collector/policy_version``, ``collector/staleness_mean``,
            ``collector/staleness_max`` and ``collector/dropped_stale`` at every step.

    It also stops the collectors when fitting ends, fails or is interrupted
    (Lightning calls ``on_exception`` for a ``KeyboardInterrupt`` too), so no
    process outlives a notebook cell. A later ``fit`` starts them again, with
    fresh episodes. The stage's state (policy version, counters) is saved by
    :class:`~ptl_rl.lightning.PipelineCheckpoint` like any stage's.
    """

    def __init__(self, pipeline: Pipeline, every_n_steps: int = 1, log: bool = True) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.stage = find_collecting_stage(pipeline)
        self.every_n_steps = int(every_n_steps)
        self.log = bool(log)

    def on_train_batch_end(self, trainer: TrainerLike, pl_module: ModuleLike, *args: object) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self.stage.push_weights()
        if self.log:
            stats = self.stage.staleness_stats()
            pl_module.log_dict(
                {f"collector/{key}": value for key, value in stats.items() if key != "staleness_last"},
                on_step=True,
                on_epoch=False,
                batch_size=1,
            )

    def on_exception(self, trainer: TrainerLike, pl_module: ModuleLike, exception: BaseException) -> None:
        self.stage.close()

    def on_fit_end(self, trainer: TrainerLike, pl_module: ModuleLike) -> None:
        self.stage.close()

    def teardown(self, trainer: TrainerLike, pl_module: ModuleLike, stage: str) -> None:
        self.stage.close()

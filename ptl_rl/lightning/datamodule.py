"""RLDataModule: a LightningDataModule over a pipeline, with its state in checkpoints and optional evaluation."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from ptl_rl.core.batch import TorchBatch
from ptl_rl.core.chain import load_pipeline_state_dict
from ptl_rl.core.protocols import Agent, EnvLike
from ptl_rl.evaluation import evaluation_dataloader
from ptl_rl.lightning._compat import DataModule
from ptl_rl.lightning.adapter import PipelineLoader, check_last_stage, to_dataloader
from ptl_rl.lightning.checkpoint import PipelineCheckpoint, last_stage_of
from ptl_rl.lightning.stops import trainer_has_step_limit

__all__ = ["RLDataModule"]


class RLDataModule(DataModule):
    """A DataModule over a pipeline whose state travels in Lightning checkpoints.

    Args:
        pipeline: the last stage (a :class:`~ptl_rl.replay.sampler.BatchSampler` or a
            :class:`~ptl_rl.replay.RolloutBuffer`).
        steps_per_epoch: batches per Lightning epoch (``None``: one endless
            epoch, or one epoch per rollout for a RolloutBuffer).
        include_replay: keep replay buffers in checkpoints (see :class:`PipelineCheckpoint`).
        eval_env, eval_agent: when given, ``val_dataloader`` and ``test_dataloader``
            run ``eval_episodes`` greedy episodes per validation (see
            :func:`~ptl_rl.evaluation.evaluation_dataloader`), so
            ``val_check_interval``, ``EarlyStopping``/``ModelCheckpoint(monitor=...)``
            and ``trainer.validate()`` work on the episode return; pair it with
            :class:`EvaluationMixin` for a ready ``validation_step``.
        eval_episodes, eval_seed: episodes per evaluation, and their seed.
        as_tuple: hand batches over as tuples of these fields (see :func:`to_dataloader`).

    At ``setup`` it adds a :class:`PipelineCheckpoint` for its pipeline to the
    Trainer's callbacks (unless one is there), so the pipeline's state is saved
    under a fixed key and restored on ``fit(..., ckpt_path=...)`` for epoch- and
    step-based training alike, and a subclass reads its parent's checkpoints.
    """

    def __init__(
        self,
        pipeline: Iterator[TorchBatch],
        steps_per_epoch: int | None = 1000,
        *,
        include_replay: bool = True,
        eval_env: EnvLike | None = None,
        eval_agent: Agent | None = None,
        eval_episodes: int = 10,
        eval_seed: int | None = None,
        as_tuple: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if (eval_env is None) != (eval_agent is None):
            raise ValueError("pass eval_env and eval_agent together (the agent acts greedily in eval_env)")
        check_last_stage(pipeline)
        self.pipeline = pipeline
        self.steps_per_epoch = steps_per_epoch
        self.include_replay = include_replay
        self.as_tuple = as_tuple
        self.eval_env, self.eval_agent = eval_env, eval_agent
        self.eval_episodes, self.eval_seed = int(eval_episodes), eval_seed
        self._loader: PipelineLoader | None = None
        if eval_env is None:
            # No evaluation: Lightning must see no val/test loader at all, or it warns on every fit that a
            # val_dataloader has no validation_step. It tells by comparing the method's code with its own
            # base class's, and the two Lightning packages have different bases, so the loaders are hidden
            # on the instance instead of redefined; a subclass's own loaders stay.
            for name in ("val_dataloader", "test_dataloader"):
                if getattr(type(self), name) is getattr(RLDataModule, name):
                    setattr(self, name, None)

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        if trainer is None:
            return
        if not any(
            isinstance(c, PipelineCheckpoint) and c.last_stage is last_stage_of(self.pipeline)
            for c in trainer.callbacks
        ):
            callback = PipelineCheckpoint(self.pipeline, include_replay=self.include_replay)
            trainer.callbacks.append(callback)
            callback.setup(trainer, trainer.lightning_module, stage)
        loader = self.train_dataloader()
        loader.dataset.stop_condition_checked = True
        if loader.dataset.steps_per_epoch is None and trainer.max_steps == -1 and not trainer_has_step_limit(trainer):
            warnings.warn(
                "RLDataModule(steps_per_epoch=None) makes one endless epoch and this Trainer has no max_steps and "
                "no EnvStepLimit callback: training will not stop by itself. Set Trainer(max_steps=...) or "
                "steps_per_epoch.",
                UserWarning,
                stacklevel=2,
            )

    def train_dataloader(self) -> PipelineLoader:
        if self._loader is None:
            self._loader = to_dataloader(self.pipeline, self.steps_per_epoch, as_tuple=self.as_tuple)
        return self._loader

    def val_dataloader(self) -> Any:
        return self._evaluation_loader()

    def test_dataloader(self) -> Any:
        return self._evaluation_loader()

    def _evaluation_loader(self) -> Any:
        if self.eval_env is None or self.eval_agent is None:  # (given together: checked in __init__)
            return []  # no evaluation configured: Lightning runs no validation
        return evaluation_dataloader(self.eval_env, self.eval_agent, self.eval_episodes, self.eval_seed)

    def state_dict(self) -> dict[str, Any]:
        return {}  # the state is saved by PipelineCheckpoint, under a key that does not depend on this class

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "pipeline" in state_dict:  # a checkpoint written before PipelineCheckpoint existed
            load_pipeline_state_dict(self.pipeline, state_dict["pipeline"])

"""The Lightning side: a DataLoader adapter, a DataModule that checkpoints the pipeline, callbacks."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytorch_lightning as pl
from torch.utils.data import DataLoader, IterableDataset

from ptl_rl.evaluation import evaluate
from ptl_rl.source import ExperienceSource

# The adapter always uses num_workers=0, on purpose (the agent must act with the learner's current weights,
# in this process), and with one worker a length on an IterableDataset is exact: Lightning's warnings about
# both do not apply.
warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined", category=UserWarning)
warnings.filterwarnings("ignore", message=r".*does not have many workers", category=UserWarning)


def pipeline_stages(last: Any) -> list[Any]:
    """The stages of a pipeline, source first, found by following ``.upstream``."""
    stages = []
    stage = last
    while stage is not None:
        stages.append(stage)
        stage = getattr(stage, "upstream", None)
    return stages[::-1]


def find_stage(last: Any, kind: type) -> Any:
    """The first stage of type ``kind`` in the pipeline ending at ``last``."""
    for stage in pipeline_stages(last):
        if isinstance(stage, kind):
            return stage
    raise ValueError(f"the pipeline {[type(s).__name__ for s in pipeline_stages(last)]} has no {kind.__name__}")


def pipeline_state_dict(last: Any) -> dict[str, Any]:
    """State of every stage that has ``state_dict``, keyed ``"<position>:<class name>"``."""
    return {
        f"{i}:{type(stage).__name__}": stage.state_dict()
        for i, stage in enumerate(pipeline_stages(last))
        if hasattr(stage, "state_dict")
    }


def load_pipeline_state_dict(last: Any, state: dict[str, Any]) -> None:
    """Restore what :func:`pipeline_state_dict` saved into a pipeline of the same shape."""
    stages = {f"{i}:{type(s).__name__}": s for i, s in enumerate(pipeline_stages(last)) if hasattr(s, "state_dict")}
    if set(stages) != set(state):
        raise ValueError(
            f"checkpointed pipeline has stages {sorted(state)}, this one has {sorted(stages)}; "
            "build the same pipeline before restoring"
        )
    for key, stage in stages.items():
        stage.load_state_dict(state[key])


class PipelineDataset(IterableDataset):
    """An IterableDataset over a live pipeline, ``steps_per_epoch`` batches per epoch.

    Every epoch continues the same pipeline iterator: environments, windows
    and buffers carry over between epochs. Without ``steps_per_epoch`` the
    dataset has no length and Lightning sees one endless epoch (stop it with
    ``Trainer(max_steps=...)``).
    """

    def __init__(self, pipeline: Any, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1 or None, got {steps_per_epoch}")
        self.pipeline = pipeline
        self.steps_per_epoch = steps_per_epoch
        self._iterator: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        if self._iterator is None:
            self._iterator = iter(self.pipeline)
        if self.steps_per_epoch is None:
            yield from self._iterator
            return
        for _ in range(self.steps_per_epoch):
            yield next(self._iterator)

    def __len__(self) -> int:
        if self.steps_per_epoch is None:
            raise TypeError("this PipelineDataset is endless (steps_per_epoch=None)")
        return self.steps_per_epoch


def _as_is(batch: Any) -> Any:
    return batch


def to_dataloader(pipeline: Any, steps_per_epoch: int | None = None) -> DataLoader:
    """Wrap the last pipeline stage as a DataLoader for ``trainer.fit``.

    ``batch_size=None`` (the pipeline already batches), ``num_workers=0`` (the
    agent must act with the learner's current weights, in this process), and
    batches are passed through unchanged. ``steps_per_epoch`` sets
    ``len(loader)``; ``None`` makes one endless epoch, except for an on-policy
    stage with ``batches_per_rollout`` (a :class:`~ptl_rl.buffers.RolloutBuffer`),
    which gets one Lightning epoch per rollout: a sized loader keeps Lightning
    from prefetching, so a rollout is collected only after the last update on
    the previous one.
    """
    if steps_per_epoch is None:
        steps_per_epoch = getattr(pipeline, "batches_per_rollout", None)
    return DataLoader(PipelineDataset(pipeline, steps_per_epoch), batch_size=None, num_workers=0, collate_fn=_as_is)


class RLDataModule(pl.LightningDataModule):
    """A DataModule over a pipeline whose state travels in Lightning checkpoints.

    ``state_dict`` holds each stage's state (replay contents, RNG states,
    in-flight n-step windows, episode counters) as tensors and plain
    containers, so ``torch.load(..., weights_only=True)`` reads the checkpoint.
    Lightning restores it in ``trainer.fit(..., ckpt_path=...)``.
    """

    def __init__(self, pipeline: Any, steps_per_epoch: int | None = 1000) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.steps_per_epoch = steps_per_epoch
        self._loader: DataLoader | None = None

    def train_dataloader(self) -> DataLoader:
        if self._loader is None:
            self._loader = to_dataloader(self.pipeline, self.steps_per_epoch)
        return self._loader

    def state_dict(self) -> dict[str, Any]:
        return {"pipeline": pipeline_state_dict(self.pipeline)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        load_pipeline_state_dict(self.pipeline, state_dict["pipeline"])


class EpisodeStatsLogger(pl.Callback):
    """Logs episode statistics of an :class:`ExperienceSource` every ``every_n_steps`` training batches.

    Logged (and shown in the progress bar): ``episode/return_mean`` and
    ``episode/length_mean`` over the source's recent episodes, and
    ``env_steps``. Pass the source or any later stage of its pipeline. Each
    ``log`` call costs Lightning about as much as a small network's gradient
    step, hence logging every few steps rather than every one.
    """

    def __init__(self, pipeline: Any, every_n_steps: int = 10, prog_bar: bool = True) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.source: ExperienceSource = find_stage(pipeline, ExperienceSource)
        self.every_n_steps = int(every_n_steps)
        self.prog_bar = prog_bar

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step % self.every_n_steps:
            return
        stats = self.source.episode_stats()
        pl_module.log("env_steps", stats["env_steps"], prog_bar=self.prog_bar, on_step=True, on_epoch=False)
        if "return_mean" in stats:
            pl_module.log(
                "episode/return_mean", stats["return_mean"], prog_bar=self.prog_bar, on_step=True, on_epoch=False
            )
            pl_module.log("episode/length_mean", stats["length_mean"], on_step=True, on_epoch=False)


class EnvStepLimit(pl.Callback):
    """Stops training once the pipeline's source has taken ``max_env_steps`` env steps."""

    def __init__(self, pipeline: Any, max_env_steps: int) -> None:
        super().__init__()
        self.source: ExperienceSource = find_stage(pipeline, ExperienceSource)
        self.max_env_steps = int(max_env_steps)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.source.total_steps >= self.max_env_steps:
            trainer.should_stop = True


class PeriodicEvaluation(pl.Callback):
    """Evaluates the current policy every ``every_env_steps`` env steps; can stop training once it is good enough.

    Args:
        pipeline: the training pipeline (any stage after its :class:`ExperienceSource`), whose env-step count
            sets the rhythm.
        env: a separate evaluation env (vector envs run the episodes in parallel).
        make_agent: ``pl_module -> agent``, e.g. ``lambda m: DQNAgent(m.q_net, ArgmaxSelector())`` for a
            greedy policy; called at every evaluation, so it acts with the current weights.
        every_env_steps: env steps between evaluations (``<= 0``: never).
        episodes: episodes per evaluation (see :func:`~ptl_rl.evaluation.evaluate`).
        stop_at_return: stop training once the mean return reaches it (``None``: never).
        seed: evaluation ``k`` resets its env with ``seed + 1000 * k``: fresh start states every time.

    Logs ``eval/return_mean`` (progress bar). Afterwards ``history`` holds ``(env_steps, mean_return)``
    pairs, ``solved_at`` the env steps and ``solved_after_s`` the seconds since training started when
    ``stop_at_return`` was reached (else ``None``).
    """

    def __init__(
        self,
        pipeline: Any,
        env: Any,
        make_agent: Callable[[pl.LightningModule], Callable[[Any], Any]],
        every_env_steps: int,
        episodes: int = 10,
        stop_at_return: float | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.source: ExperienceSource = find_stage(pipeline, ExperienceSource)
        self.env, self.make_agent = env, make_agent
        self.every, self.episodes, self.stop_at_return, self.seed = int(every_env_steps), episodes, stop_at_return, seed
        self.next_eval = self.every
        self.history: list[tuple[int, float]] = []
        self.solved_at: int | None = None
        self.solved_after_s: float | None = None
        self._start = time.perf_counter()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        steps = self.source.total_steps
        if self.every <= 0 or steps < self.next_eval:
            return
        self.next_eval = steps - steps % self.every + self.every
        seed = None if self.seed is None else self.seed + 1_000 * len(self.history)
        mean_return = float(evaluate(self.env, self.make_agent(pl_module), self.episodes, seed=seed).mean())
        self.history.append((steps, mean_return))
        pl_module.log("eval/return_mean", mean_return, prog_bar=True, on_step=True, on_epoch=False)
        if self.stop_at_return is not None and mean_return >= self.stop_at_return:
            self.solved_at, self.solved_after_s = steps, time.perf_counter() - self._start
            trainer.should_stop = True

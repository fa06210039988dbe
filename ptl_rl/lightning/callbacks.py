"""Lightning callbacks: episode logging, an env-step budget, periodic evaluation, normalization sync, a profiler.

They work with either Lightning package and under DDP: every decision to stop
or to evaluate is reduced across ranks, so all ranks take it at the same step
and none waits for the others forever. :class:`EnvStepLimit` is defined with
the other stop conditions in :mod:`ptl_rl.lightning.stops`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ptl_rl.core.chain import find_episode_source
from ptl_rl.core.profile import PipelineProfile, profile
from ptl_rl.core.protocols import Agent, EnvLike, EpisodeCounter, Pipeline
from ptl_rl.core.ranks import rank_seed
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.evaluation import evaluate
from ptl_rl.lightning._compat import ModuleLike, TrainerLike
from ptl_rl.lightning.stops import EnvStepLimit, PipelineCallback, global_env_steps
from ptl_rl.stages.normalize import sync_statistics

__all__ = ["EnvStepLimit", "EpisodeStatsLogger", "NormalizationSync", "PeriodicEvaluation", "PipelineProfiler"]


class EpisodeStatsLogger(PipelineCallback):
    """Logs every finished episode to the loggers, and the recent mean return and env steps as metrics.

    Two kinds of output:

    * **Metrics**, every ``every_n_steps`` training batches, through
      ``pl_module.log`` (on step, not to the loggers): ``env_steps`` (env
      steps so far, this rank's) and ``return`` (mean undiscounted return of
      the source's recent episodes, its ``stats_window``; absent until an
      episode has finished). They are in ``trainer.callback_metrics`` with or
      without a progress bar or a logger, so ``ModelCheckpoint(monitor="return",
      mode="max")`` and ``EarlyStopping(monitor="return", mode="max")`` work on
      them, and the progress bar shows them when ``prog_bar`` is set.
    * **Episodes**: each episode of the pipeline's
      :class:`~ptl_rl.stages.source.ExperienceSource` is written to the Trainer's
      loggers as ``episode/return`` and ``episode/length`` with the env-step
      count at its end as the step (an integer), whatever Lightning's
      ``log_every_n_steps``; ``env_steps`` (an integer) is written to them
      every ``every_n_steps`` batches against the global step.

    A ``self.log`` costs a few tens of microseconds, so ``every_n_steps``
    bounds what the metrics cost (``benchmarks/lightning_overhead.py``
    measures it). Under DDP each rank logs its own source's values, and the
    loggers of rank 0 write rank 0's episodes.

    Args:
        pipeline: the source or any later stage of its pipeline.
        every_n_steps: training batches between two metric points.
        prog_bar: also show ``return`` and ``env_steps`` in the progress bar.
    """

    def __init__(self, pipeline: Pipeline, every_n_steps: int = 10, prog_bar: bool = True) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.source: EpisodeCounter = find_episode_source(pipeline)
        self.pipeline = pipeline
        self.every_n_steps = int(every_n_steps)
        self.prog_bar = prog_bar
        self._logged_episodes = self.source.episodes_finished

    def on_train_batch_end(self, trainer: TrainerLike, pl_module: ModuleLike, *args: object) -> None:
        source = self.source
        if source.episodes_finished != self._logged_episodes:
            self._log_new_episodes(trainer)
        if trainer.global_step % self.every_n_steps:
            return
        for logger in trainer.loggers:
            logger.log_metrics({"env_steps": source.total_steps}, step=trainer.global_step)
        stats = source.episode_stats()
        metrics = {"env_steps": float(stats["env_steps"])}
        if "return_mean" in stats:
            metrics["return"] = float(stats["return_mean"])
        pl_module.log_dict(metrics, prog_bar=self.prog_bar, logger=False, on_step=True, on_epoch=False)

    def _log_new_episodes(self, trainer: TrainerLike) -> None:
        source = self.source
        new = source.episodes_finished - self._logged_episodes
        self._logged_episodes = source.episodes_finished
        episodes = source.recent_episodes()[-new:]  # at most stats_window of them are still held
        for logger in trainer.loggers:
            for episode in episodes:
                logger.log_metrics(
                    {"episode/return": episode.ret, "episode/length": episode.length}, step=episode.total_steps
                )

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        return versioned({"logged_episodes": self._logged_episodes}, self.STATE_VERSION)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_version(state_dict, self.STATE_VERSION, type(self).__name__)
        self._logged_episodes = int(state_dict["logged_episodes"])


class NormalizationSync(PipelineCallback):
    """Under DDP, merges the statistics of the pipeline's normalization stages across ranks every ``every_n_steps``.

    Each rank's :class:`~ptl_rl.stages.normalize.NormalizeObservations` and
    :class:`~ptl_rl.stages.normalize.ScaleRewards` learn from that rank's envs;
    after a sync every rank holds the statistics of all ranks' data (each row
    counted once), so every rank's copy of the model sees inputs normalized
    alike. Outside DDP it does nothing. :class:`~ptl_rl.lightning.PipelineCheckpoint`
    also syncs before every save, so a checkpoint holds the merged statistics.
    """

    def __init__(self, pipeline: Pipeline, every_n_steps: int = 100) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.pipeline = pipeline
        self.every_n_steps = int(every_n_steps)

    def on_train_batch_end(self, trainer: TrainerLike, *args: object) -> None:
        # global_step is the same on every rank at this hook: all ranks take part in the same collectives
        if trainer.world_size > 1 and trainer.global_step % self.every_n_steps == 0:
            sync_statistics(self.pipeline)


class PeriodicEvaluation(PipelineCallback):
    """Evaluates the current policy every ``every_env_steps`` env steps; can stop training once it is good enough.

    Args:
        pipeline: the training pipeline (any stage after its :class:`ExperienceSource`), whose env-step count
            (summed over ranks under DDP) sets the rhythm.
        env: a separate evaluation env (vector envs run the episodes in parallel).
        make_agent: ``pl_module -> agent``, e.g. ``lambda m: DQNAgent(m.q_net, ArgmaxSelector())`` for a
            greedy policy; called at every evaluation, so it acts with the current weights.
        every_env_steps: env steps between evaluations (``<= 0``: never).
        episodes: episodes per evaluation (see :func:`~ptl_rl.evaluation.evaluate`); under DDP every rank
            runs them and the mean is averaged over ranks.
        stop_at_return: stop training once the mean return reaches it (``None``: never).
        seed: evaluation ``k`` resets its env with ``seed + 1000 * k`` (rank-distinct under DDP): fresh start
            states every time.

    Logs ``eval/return_mean`` (progress bar). ``history`` holds ``(env_steps, mean_return)`` pairs,
    ``solved_at`` the env steps and ``solved_after_s`` the seconds of training when ``stop_at_return`` was
    reached (else ``None``). All of it is saved in checkpoints, so a resumed run keeps its rhythm and history.
    For validation inside Lightning's own loop (``val_check_interval``, ``EarlyStopping``), see
    :func:`~ptl_rl.evaluation.evaluation_dataloader` instead.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        env: EnvLike,
        make_agent: Callable[[Any], Agent],
        every_env_steps: int,
        episodes: int = 10,
        stop_at_return: float | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.source: EpisodeCounter = find_episode_source(pipeline)
        self.pipeline = pipeline
        self.env, self.make_agent = env, make_agent
        self.every, self.episodes, self.stop_at_return, self.seed = int(every_env_steps), episodes, stop_at_return, seed
        self.next_eval = self.every
        self.history: list[tuple[int, float]] = []
        self.solved_at: int | None = None
        self.solved_after_s: float | None = None
        self._trained_s = 0.0  # training seconds before this run (restored from a checkpoint)
        self._start = time.perf_counter()

    @property
    def state_key(self) -> str:
        key: str = self._generate_state_key(every_env_steps=self.every, episodes=self.episodes)
        return key

    def on_train_start(self, trainer: TrainerLike, pl_module: ModuleLike) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: TrainerLike, pl_module: ModuleLike, *args: object) -> None:
        if self.every <= 0:
            return
        steps = global_env_steps(trainer, self.source)
        if steps < self.next_eval:
            return
        self.next_eval = steps - steps % self.every + self.every
        mean_return = self._evaluate(trainer, pl_module)
        self.history.append((steps, mean_return))
        pl_module.log("eval/return_mean", mean_return, prog_bar=True, on_step=True, on_epoch=False)
        if self.stop_at_return is not None and mean_return >= self.stop_at_return:
            self.solved_at, self.solved_after_s = steps, self._trained_s + time.perf_counter() - self._start
            trainer.should_stop = True

    def _evaluate(self, trainer: TrainerLike, pl_module: ModuleLike) -> float:
        seed = rank_seed(self.seed, trainer.global_rank)
        seed = None if seed is None else seed + 1_000 * len(self.history)
        mean_return = float(evaluate(self.env, self.make_agent(pl_module), self.episodes, seed=seed).mean())
        if trainer.world_size > 1:  # every rank then takes the same decision
            mean_return = float(
                trainer.strategy.reduce(torch.tensor(mean_return, dtype=torch.float64), reduce_op="mean")
            )
        return mean_return

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        state = {
            "next_eval": self.next_eval,
            "history": [list(entry) for entry in self.history],
            "solved_at": self.solved_at,
            "solved_after_s": self.solved_after_s,
            "trained_s": self._trained_s + time.perf_counter() - self._start,
        }
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_version(state_dict, self.STATE_VERSION, type(self).__name__)
        self.next_eval = int(state_dict["next_eval"])
        self.history = [(int(steps), float(ret)) for steps, ret in state_dict["history"]]
        self.solved_at = state_dict["solved_at"]
        self.solved_after_s = state_dict["solved_after_s"]
        self._trained_s = float(state_dict["trained_s"])


class PipelineProfiler(PipelineCallback):
    """Logs collection and training throughput and where the pipeline's time goes; env steps/s in the progress bar.

    Every ``every_n_steps`` training batches it logs (through ``pl_module.log``, so to every logger
    of the Trainer, step-wise):

    * ``throughput/env_steps_per_s`` and ``throughput/grad_steps_per_s``: env steps taken and
      optimizer steps done per second of wall time since the previous point;
    * ``profile/<stage>``: each stage's share of wall time since training started (see
      :func:`ptl_rl.profile`; stage names with ``_`` for spaces, e.g. ``profile/env_step``,
      ``profile/outside_the_pipeline``, which is mostly the training step itself).

    The progress bar shows ``env_steps/s``. The profile's counters are reset when training starts;
    :attr:`profile` holds the latest table (``print(profiler.profile)`` after ``fit``).

    Args:
        pipeline: the source or any later stage of its pipeline (or the loader).
        every_n_steps: training batches between two points.
        prog_bar: show env steps/s in the progress bar.
    """

    def __init__(self, pipeline: Pipeline, every_n_steps: int = 50, prog_bar: bool = True) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.pipeline = pipeline
        self.source = find_episode_source(pipeline)
        self.every_n_steps = int(every_n_steps)
        self.prog_bar = prog_bar
        self.profile: PipelineProfile | None = None
        self._last = (time.perf_counter(), 0, 0)  # (wall time, env steps, optimizer steps) at the last point

    def _pipeline_profile(self) -> PipelineProfile | None:
        try:
            return profile(self.pipeline)
        except ValueError:  # no stage keeps time (a remote source straight into a stage of another kind)
            return None

    def on_train_start(self, trainer: TrainerLike, pl_module: ModuleLike) -> None:
        table = self._pipeline_profile()
        if table is not None:
            table.reset()
        self._last = (time.perf_counter(), self.source.total_steps, trainer.global_step)

    def on_train_batch_end(self, trainer: TrainerLike, pl_module: ModuleLike, *args: object) -> None:
        if trainer.global_step % self.every_n_steps:
            return
        now, steps, grad_steps = time.perf_counter(), self.source.total_steps, trainer.global_step
        last_time, last_steps, last_grad_steps = self._last
        elapsed = now - last_time
        if elapsed <= 0 or grad_steps == last_grad_steps:
            return
        self._last = (now, steps, grad_steps)
        env_rate, grad_rate = (steps - last_steps) / elapsed, (grad_steps - last_grad_steps) / elapsed
        metrics = {"throughput/env_steps_per_s": env_rate, "throughput/grad_steps_per_s": grad_rate}
        self.profile = self._pipeline_profile()
        if self.profile is not None:
            metrics.update({f"profile/{stage.replace(' ', '_')}": s for stage, s in self.profile.shares().items()})
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False, logger=bool(trainer.loggers))
        if self.prog_bar:
            pl_module.log("env_steps/s", env_rate, prog_bar=True, logger=False, on_step=True, on_epoch=False)

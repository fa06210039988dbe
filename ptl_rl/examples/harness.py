"""What every example does around its algorithm: the Trainer, callbacks, stopping, final evaluation, summary.

An example builds its module and pipeline and hands them to :func:`run` as an
:class:`Experiment`; :func:`run` makes the run directory (:mod:`~ptl_rl.examples.runs`),
fits with the shared limits (env steps, ``--time-limit``, ``--grad-clip``),
evaluates periodically with confirmation (:class:`ConfirmedEvaluation`),
evaluates the final weights on fresh episodes, and writes and prints the
summary. Imported after the arguments are parsed: it loads torch and Lightning.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Timer, TQDMProgressBar

import ptl_rl
from ptl_rl.examples.quiet import quiet_lightning
from ptl_rl.examples.runs import RunDirectory

#: periodic evaluation k uses seed + EVAL_SEED + 1000 k, its confirmation seed + CONFIRM_SEED + 1000 k, the final
#: evaluation seed + FINAL_SEED: three disjoint ranges of start states, none of them the training envs' seeds
EVAL_SEED, CONFIRM_SEED, FINAL_SEED = 10_000, 500_000, 1_000_000
#: every video (--video-every) starts from seed + VIDEO_SEED: the same start state at each recording
VIDEO_SEED = 2_000_000


#: the example's LightningModule class: ``greedy_agent`` receives the module of that class, with its networks
ModuleT = TypeVar("ModuleT", bound=pl.LightningModule)


@dataclass
class Experiment(Generic[ModuleT]):
    """One example's run, ready to fit.

    Args:
        algo: short name (``dqn``), the run directory's prefix.
        args: the parsed flags (those of :func:`ptl_rl.examples.cli.example_parser` plus the algorithm's).
        model: the LightningModule.
        pipeline: the last pipeline stage (its ExperienceSource counts env steps and episodes).
        loader: ``ptl_rl.to_dataloader(...)`` of the pipeline.
        make_env: ``num_envs -> vector env`` for the evaluations.
        greedy_agent: ``module -> agent`` acting greedily with the module's current weights.
        max_epochs: Lightning epochs (``-1``: until a limit stops it).
        config: derived settings that belong in ``config.json``/``hparams.yaml`` beside the flags (schedules, ...).
        extra_summary: ``() -> dict`` of example-specific results, merged into the summary after training.
        log_every: batches between logged episode statistics (default ``args.log_every``).
        make_video_env: ``() -> env`` rendering ``rgb_array`` frames, for ``--video-every`` (default:
            ``gym.make(args.env_id, render_mode="rgb_array")``; an example whose envs have wrappers passes its own).
        max_rollouts: an on-policy example's budget in whole rollouts (:func:`rollouts_for`: ``--env-steps``
            rounded up), its pipeline a ``RolloutBuffer``. The run then ends at a rollout boundary, every rollout
            it collected trained on for all its batches (PPO: ``--update-epochs x --num-minibatches``):
            :class:`RolloutLimit` stops it after the last batch of the last rollout, instead of an
            ``EnvStepLimit``, which fires as the last rollout is collected, after its first batch; the periodic
            evaluation, with its stop on a confirmed target, is due only after a rollout's last batch. The
            summary adds ``rollouts``, ``env_steps_budget`` and ``env_steps_per_rollout``. (``--time-limit``
            and Ctrl-C still stop where they are.)
    """

    algo: str
    args: argparse.Namespace
    model: ModuleT
    pipeline: Any
    loader: Any
    make_env: Callable[[int], Any]
    greedy_agent: Callable[[ModuleT], Any]
    max_epochs: int = -1
    config: dict[str, Any] = field(default_factory=dict)
    extra_summary: Callable[[], dict[str, Any]] | None = None
    log_every: int | None = None
    make_video_env: Callable[[], Any] | None = None
    max_rollouts: int | None = None


def rollouts_for(env_steps: int, num_envs: int, steps_per_env: int) -> int:
    """The rollouts an ``env_steps`` budget buys: ``ceil(env_steps / (num_envs * steps_per_env))``, at least one.

    The on-policy examples' rule (their ``--env-steps`` help, :data:`~ptl_rl.examples.cli.ROLLOUT_BUDGET_HELP`):
    the budget is rounded up to whole rollouts, each trained in full, as SB3's ``learn`` collects rollouts
    until the budget is reached.
    """
    return max(1, -(-int(env_steps) // (int(num_envs) * int(steps_per_env))))


class RolloutLimit(pl.Callback):
    """Stops training after the last batch of the ``max_rollouts``-th rollout of ``rollout`` (a ``RolloutBuffer``).

    ``rollout.batches_per_rollout`` training batches come from each rollout, so the run ends at a rollout
    boundary with every rollout collected trained in full.
    """

    def __init__(self, rollout: Any, max_rollouts: int) -> None:
        super().__init__()
        self.rollout = rollout
        self.max_batches = int(max_rollouts) * int(rollout.batches_per_rollout)
        self.batches = 0

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self.batches += 1
        if self.batches >= self.max_batches:
            trainer.should_stop = True


class ConfirmedEvaluation(ptl_rl.PeriodicEvaluation):
    """:class:`ptl_rl.PeriodicEvaluation` that confirms a target return on fresh episodes before it stops training.

    Every ``every_env_steps`` env steps the greedy policy plays ``episodes``
    episodes. When their mean reaches ``stop_at_return``, it plays
    ``confirm_episodes`` more, from start states no evaluation has used
    (seeds ``seed - EVAL_SEED + CONFIRM_SEED + 1000 k``); only if those reach
    the target too does training stop. A failed confirmation keeps training: a
    policy that crossed by luck of the start states (Acrobot -107.8 on fresh
    episodes after crossing -100) is not declared solved. ``confirm_episodes=0``
    stops at the first crossing, as the parent does. With
    ``batches_per_rollout=B`` an evaluation is due only after every B-th batch:
    after a rollout's last update (on-policy examples), so a stop never cuts
    a rollout's training short.

    ``history`` holds ``(env_steps, mean_return)`` of the periodic evaluations,
    ``confirmations`` those of the confirmations; ``record(env_steps, kind,
    returns)`` is called with every evaluation's returns (float64 [episodes]).
    Single process only (the examples train on one device).
    """

    def __init__(
        self,
        *args: Any,
        confirm_episodes: int = 0,
        record: Callable[[int, str, np.ndarray], None] | None = None,
        batches_per_rollout: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.confirm_episodes = int(confirm_episodes)
        self.confirmations: list[tuple[int, float]] = []
        self.record = record
        self.batches_per_rollout = int(batches_per_rollout)
        self._batches = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self._batches += 1
        if self.every <= 0 or self._batches % self.batches_per_rollout:
            return
        steps = self.source.total_steps
        if steps < self.next_eval:
            return
        self.next_eval = steps - steps % self.every + self.every
        k = len(self.history)
        returns = self._returns(pl_module, self.episodes, None if self.seed is None else self.seed + 1_000 * k)
        self.history.append((steps, float(returns.mean())))
        self._note(pl_module, steps, "eval", returns)
        target = self.stop_at_return
        if target is None or returns.mean() < target:
            return
        if self.confirm_episodes:
            seed = None if self.seed is None else self.seed - EVAL_SEED + CONFIRM_SEED + 1_000 * k
            confirm = self._returns(pl_module, self.confirm_episodes, seed)
            self.confirmations.append((steps, float(confirm.mean())))
            self._note(pl_module, steps, "confirm", confirm)
            if confirm.mean() < target:
                return  # crossed by chance: keep training
        self.solved_at, self.solved_after_s = steps, self._trained_s + time.perf_counter() - self._start
        trainer.should_stop = True

    def _returns(self, pl_module: Any, episodes: int, seed: int | None) -> np.ndarray:
        return ptl_rl.evaluate(self.env, self.make_agent(pl_module), episodes, seed=seed)

    def _note(self, pl_module: Any, steps: int, kind: str, returns: np.ndarray) -> None:
        name = "eval/return_mean" if kind == "eval" else f"eval/{kind}_return_mean"
        pl_module.log(name, float(returns.mean()), prog_bar=kind == "eval", on_step=True, on_epoch=False)
        if self.record is not None:
            self.record(steps, kind, returns)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "confirmations": [list(entry) for entry in self.confirmations]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.confirmations = [(int(steps), float(ret)) for steps, ret in state_dict.get("confirmations", [])]


class EnvStepsProgressBar(TQDMProgressBar):
    """Lightning's progress bar, its ``env_steps`` the source's current count as an integer.

    ``EpisodeStatsLogger`` shows ``env_steps`` through ``self.log``, which
    stores every value as a float tensor (9808.0) and only every
    ``every_n_steps`` batches; the bar's last refresh (at the end of the epoch,
    also when a limit stops training) then showed a count older than the
    summary's. This bar reads the count from the source whenever it refreshes.
    """

    def __init__(self, source: Any, refresh_rate: int) -> None:
        super().__init__(refresh_rate=refresh_rate)
        self.source = source

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        if self.source is not None and "env_steps" in metrics:
            metrics["env_steps"] = int(self.source.total_steps)
        return metrics


class RunRecorder(pl.Callback):
    """Counts training batches (gradient steps, also under manual optimization) and writes finished episodes.

    Episodes are taken with the source's ``pop_episodes`` (each exactly once,
    however many finish between two batches) and appended to ``episodes.csv``.
    """

    def __init__(self, pipeline: Any, run_dir: RunDirectory | None) -> None:
        super().__init__()
        self.source = episode_source(pipeline)
        self.run_dir = run_dir
        self.batches = 0
        if self.source is not None:
            self.source.pop_episodes()  # only the episodes of this run's training

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # a BatchGroup (--batches-per-step K) is one Lightning step of up to K batches
        self.batches += batch.taken if isinstance(batch, ptl_rl.BatchGroup) else 1
        if self.source is not None and self.run_dir is not None:
            self.run_dir.record_episodes(self.source.pop_episodes())


def manual_step(module: pl.LightningModule, optimizer: Any, loss: torch.Tensor, grad_clip: float | None) -> None:
    """One step of ``optimizer`` on ``loss`` under manual optimization, the gradient norm clipped to ``grad_clip``.

    The examples' modules optimize by hand: on their small networks Lightning's automatic closure costs about
    a gradient step (docs/design/hot-path.md, "Lightning's share").
    """
    optimizer.zero_grad(set_to_none=True)
    module.manual_backward(loss)
    if grad_clip:
        module.clip_gradients(optimizer, gradient_clip_val=grad_clip, gradient_clip_algorithm="norm")
    optimizer.step()


def episode_source(pipeline: Any) -> Any:
    """The pipeline's ExperienceSource, or ``None`` for an offline pipeline (a buffer filled from a dataset)."""
    try:
        return ptl_rl.find_stage(pipeline, ptl_rl.ExperienceSource)
    except ValueError:
        return None


def full_config(experiment: Experiment) -> dict[str, Any]:
    """The flags, the derived settings and the module's class: what ``config.json`` and ``hparams.yaml`` hold."""
    clash = set(vars(experiment.args)) & set(experiment.config)
    if clash:  # a derived setting must not hide the flag it came from
        raise ValueError(f"Experiment.config repeats the flags {sorted(clash)}; name the derived settings apart")
    return {
        "algo": experiment.algo,
        "module": type(experiment.model).__name__,
        **vars(experiment.args),
        **experiment.config,
    }


def stop_reason(trainer: pl.Trainer, experiment: Experiment, evaluation: ConfirmedEvaluation | None) -> str:
    """Why ``trainer.fit`` returned, in words for ``summary.json``."""
    source = episode_source(experiment.pipeline)
    if trainer.interrupted:
        return "interrupted"
    if evaluation is not None and evaluation.solved_at is not None:
        return "target return confirmed" if evaluation.confirm_episodes else "target return reached"
    # (Lightning's callback connector sets trainer.callbacks; the Trainer class does not declare it)
    timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)  # type: ignore[attr-defined]
    remaining = None if timer is None else timer.time_remaining("train")
    if remaining is not None and remaining <= 0:
        return "time limit"
    if source is not None and source.total_steps >= experiment.args.env_steps:
        return "env-step budget"
    return "epoch limit"


def _fit(
    experiment: Experiment,
    loggers: list[Any],
    callbacks: list[pl.Callback],
    run_dir: RunDirectory | None,
    recorder: RunRecorder,
    env_steps: Callable[[], int],
    start: float,
) -> pl.Trainer:
    """Build the Trainer and fit; an interrupted fit still leaves a ``summary.json`` saying so."""
    args, model = experiment.args, experiment.model
    log_every = experiment.log_every or args.log_every
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_epochs=experiment.max_epochs,
        max_time=None if args.time_limit is None else datetime.timedelta(seconds=args.time_limit),
        # manual optimization clips in the module's training_step (Lightning refuses gradient_clip_val there)
        gradient_clip_val=args.grad_clip if model.automatic_optimization else None,
        logger=loggers or False,
        log_every_n_steps=log_every,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=args.progress_bar,
        callbacks=callbacks,
    )
    try:
        trainer.fit(model, train_dataloaders=experiment.loader)
    except BaseException as error:  # Ctrl-C ends fit with SystemExit: the run directory still says what happened
        if run_dir is not None:
            partial = {"algo": experiment.algo, "env_id": args.env_id, "seed": args.seed,
                       "stopped": f"interrupted ({type(error).__name__})", "env_steps": env_steps(),
                       "gradient_steps": recorder.batches, "wall_time_s": time.perf_counter() - start}  # fmt: skip
            run_dir.write_json("summary.json", partial)
            run_dir.close()
        raise
    return trainer


def run(experiment: Experiment) -> dict[str, Any]:
    """Fit ``experiment``, evaluate the final weights on fresh episodes, write the run directory; returns the summary.

    The summary (also ``summary.json``) holds ``final_eval_return``,
    ``train_return_last10`` (the last 10 training episodes' mean return),
    ``env_steps``, ``gradient_steps`` (training batches), ``stopped`` (why),
    ``solved_at_env_steps``, ``eval_history`` (``[env_steps, mean_return]``
    pairs), timings and ``run_dir`` (``None`` with ``--runs-dir ''``).
    """
    args, model = experiment.args, experiment.model
    start, start_cpu = time.perf_counter(), time.process_time()
    run_dir = RunDirectory(args.runs_dir, experiment.algo, args.env_id, args.seed) if args.runs_dir else None
    config = full_config(experiment)
    loggers: list[Any] = []
    if run_dir is not None:
        loggers = run_dir.loggers(args.tensorboard)
        for logger in loggers:
            logger.log_hyperparams(config)  # the full config; Lightning adds the module's own at fit
        run_dir.write_json("config.json", config)  # after the loggers, which want an empty directory

    log_every = experiment.log_every or args.log_every
    source = episode_source(experiment.pipeline)
    recorder = RunRecorder(experiment.pipeline, run_dir)
    env_steps = (lambda: source.total_steps) if source is not None else (lambda: 0)
    rollout = ptl_rl.find_stage(experiment.pipeline, ptl_rl.RolloutBuffer) if experiment.max_rollouts else None

    def record(steps: int, kind: str, returns: np.ndarray) -> None:
        if run_dir is not None:
            run_dir.record_evaluation(steps, recorder.batches, kind, returns)

    # offline training (no source) has no env steps to budget, log or evaluate by
    eval_env = experiment.make_env(args.eval_episodes) if args.eval_every and source is not None else None
    evaluation = None
    callbacks: list[pl.Callback] = [recorder]
    if source is not None:
        callbacks.append(ptl_rl.EpisodeStatsLogger(experiment.pipeline, every_n_steps=log_every))
        if rollout is None:
            callbacks.append(ptl_rl.EnvStepLimit(experiment.pipeline, args.env_steps))
        else:  # the budget in whole rollouts, each trained in full
            callbacks.append(RolloutLimit(rollout, experiment.max_rollouts or 0))
    if eval_env is not None:
        evaluation = ConfirmedEvaluation(
            experiment.pipeline,
            eval_env,
            experiment.greedy_agent,
            every_env_steps=args.eval_every,
            episodes=args.eval_episodes,
            stop_at_return=args.solved_return,
            seed=args.seed + EVAL_SEED,
            confirm_episodes=args.confirm_episodes,
            record=record,
            batches_per_rollout=1 if rollout is None else rollout.batches_per_rollout,
        )
        callbacks.append(evaluation)
    video = video_callback(experiment, run_dir) if source is not None else None
    if video is not None:
        callbacks.append(video)
    if args.progress_bar:
        callbacks.append(EnvStepsProgressBar(source, refresh_rate=log_every))
    with quiet_lightning():  # Lightning's no-GPU/TPU lines, litlogger tip and its own LeafSpec warning
        trainer = _fit(experiment, loggers, callbacks, run_dir, recorder, env_steps, start)
    train_time = time.perf_counter() - start
    stopped = stop_reason(trainer, experiment, evaluation)

    final_return = final_std = float("nan")
    if args.final_eval_episodes:
        final_env = experiment.make_env(args.final_eval_episodes)
        model.cpu()
        returns = ptl_rl.evaluate(
            final_env, experiment.greedy_agent(model), args.final_eval_episodes, seed=args.seed + FINAL_SEED
        )
        final_env.close()
        final_return, final_std = float(returns.mean()), float(returns.std())
        record(env_steps(), "final", returns)
    for env in (getattr(source, "env", None), eval_env, getattr(video, "env", None)):
        if env is not None:
            env.close()
    summary: dict[str, Any] = {
        "algo": experiment.algo,
        "env_id": args.env_id,
        "seed": args.seed,
        "stopped": stopped,
        "final_eval_return": final_return,
        "final_eval_return_std": final_std,
        "final_eval_episodes": args.final_eval_episodes,
        "env_steps": env_steps(),
        "episodes": 0 if source is None else source.episodes_finished,
        # what published tables report for training runs (CleanRL's Open RL Benchmark): the last 10 episodes' mean
        "train_return_last10": _last_returns_mean(source, 10),
        "gradient_steps": recorder.batches,
        "solved_return": args.solved_return,
        "solved_at_env_steps": evaluation.solved_at if evaluation else None,
        "solved_after_s": evaluation.solved_after_s if evaluation else None,
        "eval_history": list(evaluation.history) if evaluation else [],
        "confirmations": list(evaluation.confirmations) if evaluation else [],
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - start,
        "cpu_time_s": time.process_time() - start_cpu,
        "run_dir": None if run_dir is None else str(run_dir.path),
        # [{"env_steps", "paths", "returns", "lengths"}] of each recording (--video-every)
        "videos": [] if video is None else list(video.recordings),
    }
    if rollout is not None:  # env_steps above: those taken, in whole rollouts
        summary["rollouts"] = rollout.rollouts_collected
        summary["env_steps_budget"] = args.env_steps
        summary["env_steps_per_rollout"] = rollout.num_envs * rollout.steps_per_env
    if experiment.extra_summary is not None:
        summary.update(experiment.extra_summary())
    if run_dir is not None:
        run_dir.write_json("summary.json", summary)
        run_dir.close()
        step = env_steps() if source is not None else recorder.batches
        for logger in loggers:
            if args.final_eval_episodes:  # also the row that makes metrics.csv exist after a run too short to log
                logger.log_metrics({"eval/final_return_mean": final_return}, step=step)
            logger.finalize("success")
    return summary


def video_callback(experiment: Experiment, run_dir: RunDirectory | None) -> ptl_rl.EvaluationVideo | None:
    """The recorder of greedy videos into ``<run directory>/videos/`` for ``--video-every`` (``None`` when off)."""
    args = experiment.args
    if not getattr(args, "video_every", 0) or run_dir is None:
        return None
    make_env = experiment.make_video_env or (lambda: gym.make(args.env_id, render_mode="rgb_array"))
    return ptl_rl.EvaluationVideo(
        experiment.pipeline,
        make_env(),
        experiment.greedy_agent,
        every_env_steps=args.video_every,
        episodes=args.video_episodes,
        directory=run_dir.path / "videos",
        video_format=args.video_format,
        seed=args.seed + VIDEO_SEED,
        tensorboard=args.tensorboard,
    )


def flat_size(space: gym.Space) -> int:
    """The number of values in one observation of ``space`` (the product of its shape): an MLP's input width.

    A space without a fixed shape (``Dict``, ``Sequence``) is refused: the examples' networks take arrays.
    """
    if space.shape is None:
        raise TypeError(f"the observation space {space} has no fixed shape; this example needs array observations")
    return int(np.prod(space.shape))


def num_actions(space: gym.Space) -> int:
    """The ``n`` of a ``Discrete`` action space (:func:`ptl_rl.examples.cli.parse` refused other kinds)."""
    if not isinstance(space, gym.spaces.Discrete):
        raise TypeError(f"the action space {space} is not Discrete; this example chooses among n actions")
    return int(space.n)


def _last_returns_mean(source: Any, episodes: int) -> float:
    """Mean undiscounted return of the last ``episodes`` finished training episodes (NaN before the first)."""
    last = [] if source is None else source.recent_episodes()[-episodes:]
    return float(np.mean([e.ret for e in last])) if last else float("nan")


def report(summary: dict[str, Any]) -> str:
    """One line for the terminal: what was reached, the final return, the budget used, where the run was written."""
    solved = summary["solved_at_env_steps"]
    reached = f"solved at {solved} env steps" if solved is not None else f"stopped: {summary['stopped']}"
    where = f"; run directory {summary['run_dir']}" if summary["run_dir"] else ""
    steps = f"{summary['env_steps']} env steps"
    if "env_steps_per_rollout" in summary:  # an on-policy run: whole rollouts, the budget rounded up to them
        steps += f" in {summary['rollouts']} whole rollouts"
        if summary["stopped"] == "env-step budget":
            budget, size = summary["env_steps_budget"], summary["env_steps_per_rollout"]
            steps += f" (--env-steps {budget} rounded up to rollouts of {size})"
    return (
        f"{summary['env_id']} seed {summary['seed']}: {reached}; final greedy return "
        f"{summary['final_eval_return']:.1f} over {summary['final_eval_episodes']} fresh episodes; "
        f"{steps}, {summary['gradient_steps']} gradient steps, "
        f"{summary['wall_time_s']:.1f} s{where}"
    )


def set_up(args: argparse.Namespace) -> None:
    """Threads and seeds, first thing in every example's ``train``."""
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)

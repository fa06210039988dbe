"""What an example writes down about its run: the run directory, the evaluations' returns, the summary.

Reporting only: nothing here decides how an example trains or when it stops; each example builds its own
Trainer, callbacks and stopping rule. An example makes a :class:`Run` once its model and pipeline exist, puts
it first among the Trainer's callbacks, plays every greedy evaluation through :meth:`Run.evaluate`, and ends
with :meth:`Run.finish` and :func:`summary_line`::

    run = reporting.Run("dqn", args, model, source, config={...})  # the run directory, config.json, loggers
    trainer = pl.Trainer(..., logger=run.loggers or False, callbacks=[run, ...])
    trainer.fit(model, loader)
    run.evaluate("final", env, greedy_agent(model.q_net), args.final_eval_episodes)
    summary = run.finish(trainer)  # summary.json
    print(reporting.summary_line(summary))

The files are those of :class:`~ptl_rl.examples.runs.RunDirectory`; with ``--runs-dir ''`` nothing is
written and the summary is only returned.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytorch_lightning as pl
from pytorch_lightning.callbacks import Timer, TQDMProgressBar

import ptl_rl
from ptl_rl.examples.runs import RunDirectory


class EpisodeSource(Protocol):
    """What a run reads of the stage that steps the envs: an ``ExperienceSource``, or a ``RayWorkers`` counting
    for its workers."""

    @property
    def total_steps(self) -> int: ...

    @property
    def episodes_finished(self) -> int: ...

    def recent_episodes(self) -> list[ptl_rl.Episode]: ...

    def pop_episodes(self) -> list[ptl_rl.Episode]: ...


#: periodic evaluation k plays from seed + EVAL_SEED + 1000 k, its confirmation from seed + CONFIRM_SEED + 1000 k,
#: the final evaluation from seed + FINAL_SEED: three disjoint ranges of start states, none the training envs' seeds
EVAL_SEED, CONFIRM_SEED, FINAL_SEED = 10_000, 500_000, 1_000_000
#: every video (--video-every) starts from seed + VIDEO_SEED: the same start state at each recording
VIDEO_SEED = 2_000_000


class Run(pl.Callback):
    """One run's records: its directory and loggers, gradient steps, episodes, evaluations and summary.

    Made before the Trainer: it creates ``<runs-dir>/<algo>_<env>_<seed>_<time>/``, Lightning's loggers
    writing there (:attr:`loggers`, for ``Trainer(logger=...)``) and ``config.json`` (every flag, the module's
    class and ``config``, the settings the example derived from the flags). As the Trainer's first callback
    it counts training batches (gradient steps; a :class:`ptl_rl.BatchGroup` counts each of its batches),
    appends finished episodes to ``episodes.csv``, and if ``fit`` ends in an exception (Ctrl-C included)
    writes a ``summary.json`` saying so.

    Args:
        algo: the example's short name (``dqn``), the run directory's prefix.
        args: the parsed flags (:func:`ptl_rl.examples.cli.example_parser`'s plus the algorithm's).
        model: the LightningModule (its class name goes into the config).
        source: the pipeline's ExperienceSource (or the ``RayWorkers`` in its place); ``None`` for training
            from a dataset (no env steps).
        config: derived settings for ``config.json`` and ``hparams.yaml`` (schedules, sizes...).
    """

    def __init__(
        self,
        algo: str,
        args: argparse.Namespace,
        model: pl.LightningModule,
        source: EpisodeSource | None,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.algo, self.args, self.source = algo, args, source
        self.start, self.start_cpu = time.perf_counter(), time.process_time()
        self.train_start: float | None = None
        self.train_end: float | None = None
        self.batches = 0
        self.history: list[tuple[int, float]] = []  # (env steps, mean return) of each periodic evaluation
        self.confirmations: list[tuple[int, float]] = []  # the same of each confirmation
        self.final_returns: np.ndarray | None = None
        self.solved_at: int | None = None
        self.solved_after_s: float | None = None
        self.video_callback: ptl_rl.EvaluationVideo | None = None
        config = config or {}
        clash = set(vars(args)) & set(config)
        if clash:  # a derived setting must not hide the flag it came from
            raise ValueError(f"config repeats the flags {sorted(clash)}; name the derived settings apart")
        full = {"algo": algo, "module": type(model).__name__, **vars(args), **config}
        self.directory = RunDirectory(args.runs_dir, algo, args.env_id, args.seed) if args.runs_dir else None
        self.loggers: list[Any] = []
        if self.directory is not None:
            self.loggers = self.directory.loggers(args.tensorboard)
            for logger in self.loggers:
                logger.log_hyperparams(full)  # Lightning adds the module's own hyperparameters at fit
            self.directory.write_json("config.json", full)  # after the loggers, which want an empty directory
        if source is not None:
            source.pop_episodes()  # only the episodes of this run's training go into episodes.csv

    @property
    def path(self) -> Path | None:
        """The run directory (``None`` with ``--runs-dir ''``)."""
        return None if self.directory is None else self.directory.path

    def env_steps(self) -> int:
        return 0 if self.source is None else self.source.total_steps

    # ------------------------------------------------------------------ Lightning hooks
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.batches += batch.taken if isinstance(batch, ptl_rl.BatchGroup) else 1
        if self.source is not None and self.directory is not None:
            self.directory.record_episodes(self.source.pop_episodes())  # each finished episode once

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_end = time.perf_counter()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.directory is None:
            return
        self.directory.write_json(
            "summary.json",
            {"algo": self.algo, "env_id": self.args.env_id, "seed": self.args.seed,
             "stopped": f"interrupted ({type(exception).__name__})", "env_steps": self.env_steps(),
             "gradient_steps": self.batches, "wall_time_s": time.perf_counter() - self.start},
        )  # fmt: skip
        self.directory.close()

    # ------------------------------------------------------------------ what the example calls
    def evaluate(self, kind: str, env: Any, agent: Any, episodes: int) -> float:
        """Play ``episodes`` episodes of ``agent`` in ``env``, write them down; returns their mean return.

        ``kind`` is ``"eval"`` (periodic), ``"confirm"`` (of the latest periodic one) or ``"final"``; it picks
        the start states (:data:`EVAL_SEED`, ...) and where the result goes: ``evaluations.csv``, and the
        summary's ``eval_history``, ``confirmations`` or ``final_eval_return``.
        """
        offset = {"eval": EVAL_SEED + 1_000 * len(self.history), "final": FINAL_SEED}.get(kind)
        if offset is None:  # a confirmation: fresh start states for the evaluation it confirms
            offset = CONFIRM_SEED + 1_000 * (len(self.history) - 1)
        returns = ptl_rl.evaluate(env, agent, episodes, seed=self.args.seed + offset)
        steps, mean = self.env_steps(), float(returns.mean())
        if kind == "eval":
            self.history.append((steps, mean))
        elif kind == "confirm":
            self.confirmations.append((steps, mean))
        else:
            self.final_returns = returns
        if self.directory is not None:
            self.directory.record_evaluation(steps, self.batches, kind, returns)
        return mean

    def solved(self) -> None:
        """Note that a (confirmed) evaluation reached ``--solved-return`` now: the summary's ``solved_at_env_steps``."""
        self.solved_at = self.env_steps()
        self.solved_after_s = time.perf_counter() - (self.train_start or self.start)

    def video(self, pipeline: Any, env: Any, make_agent: Any) -> ptl_rl.EvaluationVideo:
        """The library's recorder for ``--video-every``: greedy episodes of ``make_agent(module)`` in ``env`` (made
        with ``render_mode="rgb_array"``) into ``<run directory>/videos/``; listed in the summary's ``videos``."""
        args = self.args
        self.video_callback = ptl_rl.EvaluationVideo(
            pipeline,
            env,
            make_agent,
            every_env_steps=args.video_every,
            episodes=args.video_episodes,
            directory=None if self.path is None else self.path / "videos",
            video_format=args.video_format,
            seed=args.seed + VIDEO_SEED,
            tensorboard=args.tensorboard,
        )
        return self.video_callback

    def finish(self, trainer: pl.Trainer, **extra: Any) -> dict[str, Any]:
        """The run's summary, written to ``summary.json`` (the run directory is then closed); returns it.

        It holds ``final_eval_return`` (NaN without a final evaluation), ``train_return_last10`` (the last 10
        training episodes' mean return, what published tables report), ``env_steps``, ``gradient_steps``,
        ``stopped`` (why), ``solved_at_env_steps``, ``eval_history`` (``[env_steps, mean_return]`` pairs),
        timings, ``run_dir`` and ``videos``, then ``extra``: what the example adds.
        """
        args, source, now = self.args, self.source, time.perf_counter()
        final = self.final_returns
        last = [] if source is None else source.recent_episodes()[-10:]
        summary: dict[str, Any] = {
            "algo": self.algo,
            "env_id": args.env_id,
            "seed": args.seed,
            "stopped": self.stop_reason(trainer),
            "final_eval_return": math.nan if final is None else float(final.mean()),
            "final_eval_return_std": math.nan if final is None else float(final.std()),
            "final_eval_episodes": args.final_eval_episodes,
            "env_steps": self.env_steps(),
            "episodes": 0 if source is None else source.episodes_finished,
            "train_return_last10": float(np.mean([e.ret for e in last])) if last else math.nan,
            "gradient_steps": self.batches,
            "solved_return": args.solved_return,
            "solved_at_env_steps": self.solved_at,
            "solved_after_s": self.solved_after_s,
            "eval_history": list(self.history),
            "confirmations": list(self.confirmations),
            "train_time_s": (self.train_end or now) - self.start,
            "wall_time_s": now - self.start,
            "cpu_time_s": time.process_time() - self.start_cpu,
            "run_dir": None if self.path is None else str(self.path),
            # [{"env_steps", "paths", "returns", "lengths"}] of each recording (--video-every)
            "videos": [] if self.video_callback is None else list(self.video_callback.recordings),
            **extra,
        }
        if self.video_callback is not None:
            self.video_callback.env.close()
        if self.directory is not None:
            self.directory.write_json("summary.json", summary)
            self.directory.close()
            step = self.env_steps() if source is not None else self.batches
            for logger in self.loggers:
                if final is not None:  # also the row that makes metrics.csv exist after a run too short to log
                    logger.log_metrics({"eval/final_return_mean": summary["final_eval_return"]}, step=step)
                logger.finalize("success")
        return summary

    def stop_reason(self, trainer: pl.Trainer) -> str:
        """Why ``trainer.fit`` returned, in words for ``summary.json``."""
        if trainer.interrupted:
            return "interrupted"
        if self.solved_at is not None:
            return "target return confirmed" if self.args.confirm_episodes else "target return reached"
        # (Lightning's callback connector sets trainer.callbacks; the Trainer class does not declare it)
        timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)  # type: ignore[attr-defined]
        remaining = None if timer is None else timer.time_remaining("train")
        if remaining is not None and remaining <= 0:
            return "time limit"
        if self.source is not None and self.source.total_steps >= self.args.env_steps:
            return "env-step budget"
        return "epoch limit"


class EnvStepsProgressBar(TQDMProgressBar):
    """Lightning's progress bar, its ``env_steps`` the source's current count as an integer.

    ``EpisodeStatsLogger`` shows ``env_steps`` through ``self.log``, which
    stores every value as a float tensor (9808.0) and only every
    ``every_n_steps`` batches; the bar's last refresh (at the end of the epoch,
    also when a limit stops training) then showed a count older than the
    summary's. This bar reads the count from the source whenever it refreshes,
    and hands it to tqdm as text: tqdm writes a number in the shorter of its
    ``.3g`` form and its digits, so 10,000 env steps showed as ``1e+4``.
    """

    def __init__(self, source: EpisodeSource | None, refresh_rate: int) -> None:
        super().__init__(refresh_rate=refresh_rate)
        self.source = source

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        if self.source is not None and "env_steps" in metrics:
            metrics["env_steps"] = str(int(self.source.total_steps))
        return metrics


def summary_line(summary: dict[str, Any]) -> str:
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

"""What Lightning costs per DQN gradient step: the same pipeline and module, in a Trainer vs a plain PyTorch loop.

Both sides train ``ptl_rl.examples.dqn.DQN`` (64-64 MLP, double DQN, Adam fused)
on batches of 128 from the same pipeline (8 CartPole-v1 envs, 3-step returns,
uniform replay, one vector step per batch), for the same number of gradient
steps, from a warmed-up buffer, torch on one thread. The plain loop calls
``td_loss``, ``backward``, ``step`` and syncs the target network itself.
The Lightning side is ``Trainer(max_steps=N).fit(module, to_dataloader(sampler))``:

* ``bare``: logger, checkpointing, progress bar and model summary off, the
  module's own ``self.log`` calls off (``log_every`` huge): Lightning's fixed cost.
  The example's module takes its gradient step by hand (manual optimization).
* ``auto``: ``bare`` with the same module written for Lightning's automatic
  optimization (``training_step`` returns the loss), the usual way.
* ``grouped``: ``bare`` with ``to_dataloader(..., batches_per_step=10)``: ten
  gradient steps per Lightning step (``ptl_rl.BatchGroup``), the same data.
* ``metrics``: ``bare`` with an ``EpisodeStatsLogger`` at its defaults
  (``return`` and ``env_steps`` logged every 10 batches, for
  ``ModelCheckpoint``/``EarlyStopping`` to monitor), no bar and no logger: what
  those metrics cost.
* ``usual``: progress bar on, the module logging every 100 steps, the default
  CSV logger and an ``EpisodeStatsLogger``: what a user's run pays.

Prints, per variant, gradient steps/s (median of ``--repeats``) and the ratio
to the plain loop (goal >= 0.8), then where the time goes per step: data
(pipeline: env steps, n-step, insert, sample, torch conversion),
``td_loss`` (forward and loss), and the rest (backward, optimizer,
Lightning's loop, hooks and logging). Times are wall time (``perf_counter``);
the variants run interleaved, repeat by repeat. Each run appends a record
(date, commit, load, machine, arguments, medians, every repeat:
``_records.py``) to ``benchmarks/results/lightning_overhead.json``.

    python benchmarks/lightning_overhead.py [--steps 2000] [--repeats 5]
    python benchmarks/lightning_overhead.py --table      # the docs' table, from the records
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings

import _records
import gymnasium as gym
import pytorch_lightning as pl
import torch

import ptl_rl
from ptl_rl.examples.dqn import DQN

BATCH = 128
SYNC_EVERY = 50


class Timed:
    """Wraps a callable and adds up the seconds spent in it."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


class TimedSampler:
    """The sampler with its ``next`` timed (the whole pipeline runs inside it)."""

    def __init__(self, sampler):
        self.sampler, self.timed = sampler, Timed(sampler.__next__)
        self.upstream = sampler  # so find_stage walks through it

    def __iter__(self):
        return self

    def __next__(self):
        return self.timed()


class TimedDQN(DQN):
    """The example's module (manual optimization), adding up the seconds spent in ``td_loss``."""

    step_seconds = 0.0

    def td_loss(self, batch):
        start = time.perf_counter()
        try:
            return super().td_loss(batch)
        finally:
            self.step_seconds += time.perf_counter() - start


class AutomaticDQN(TimedDQN):
    """The same module written for Lightning's automatic optimization: ``training_step`` returns the loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.automatic_optimization = True

    def training_step(self, batch, batch_idx):
        loss, q_taken = self.td_loss(batch)
        if batch_idx % self.hparams.log_every == 0:
            self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
            self.log("train/q_mean", q_taken.mean(), on_step=True, on_epoch=False)
        return loss


def build(log_every: int, seed: int = 0, automatic: bool = False):
    env = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
    torch.manual_seed(seed)
    cls = AutomaticDQN if automatic else TimedDQN
    module = cls(4, 2, hidden=64, target_sync_every=SYNC_EVERY, log_every=log_every)
    agent = ptl_rl.DQNAgent(module.q_net, ptl_rl.EpsilonGreedySelector(0.1, seed=seed))
    source = ptl_rl.ExperienceSource(env, agent, seed=seed)
    nstep = ptl_rl.NStepTransform(source, n=3, gamma=0.99)
    buffer = ptl_rl.ReplayBuffer(nstep, 50_000, warmup=1_000, transitions_per_yield=8, seed=seed)
    sampler = ptl_rl.BatchSampler(buffer, BATCH)
    next(sampler)  # warm-up outside the timing
    return module, TimedSampler(sampler)


def plain(steps: int) -> dict[str, float]:
    module, sampler = build(log_every=10**9)
    optimizer = module.configure_optimizers()
    start = time.perf_counter()
    for i in range(steps):
        loss = module.td_loss(next(sampler))[0]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (i + 1) % SYNC_EVERY == 0:
            module.target_net.sync()
    total = time.perf_counter() - start
    return {"total": total, "data": sampler.timed.seconds, "step": module.step_seconds}


def lightning(
    steps: int, usual: bool, automatic: bool = False, group: int = 1, episode_metrics: bool = False
) -> dict[str, float]:
    module, sampler = build(log_every=100 if usual else 10**9, automatic=automatic)
    callbacks = []
    if usual:
        callbacks = [ptl_rl.EpisodeStatsLogger(sampler.sampler, every_n_steps=100)]
    elif episode_metrics:  # its defaults, no bar and no logger: return and env_steps logged for monitors only
        callbacks = [ptl_rl.EpisodeStatsLogger(sampler.sampler, prog_bar=False)]
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=steps,
            default_root_dir=root,
            logger=usual,
            enable_checkpointing=False,
            enable_progress_bar=usual,
            enable_model_summary=False,
            callbacks=callbacks,
        )
        loader = ptl_rl.to_dataloader(sampler, steps_per_epoch=steps // group, batches_per_step=group)
        start = time.perf_counter()
        trainer.fit(module, train_dataloaders=loader)
        total = time.perf_counter() - start
    return {"total": total, "data": sampler.timed.seconds, "step": module.step_seconds}


LABELS = {
    "plain": "plain PyTorch loop",
    "auto": "``Trainer.fit``, automatic optimization",
    "bare": "``Trainer.fit``, manual optimization (the example)",
    "grouped": "the same, ``batches_per_step=10``",
    "metrics": "manual, ``EpisodeStatsLogger()`` (no bar, no logger)",
    "usual": "manual, progress bar, CSV logger, ``EpisodeStatsLogger``",
}


def table(records: list[dict]) -> str:
    """The docs' table: gradient steps/s per variant, its ratio to the plain loop, and where the time goes."""
    cell, rows = _records.cell, []
    for name, label in LABELS.items():
        held = _records.having(records, name)
        if held:
            rows.append([
                label, cell(held, (name, "steps_per_s"), "{:.0f}"), cell(held, (name, "vs_plain"), "{:.2f}"),
                "-" if name == "plain" else ">= 0.8",
                cell(held, (name, "data_us"), "{:.0f}"), cell(held, (name, "step_us"), "{:.0f}"),
                cell(held, (name, "rest_us"), "{:.0f}"), _records.runs(held),
            ])  # fmt: skip
    header = [
        "DQN gradient step, batch 128",
        "steps/s",
        "vs plain",
        "goal",
        "data us",
        "td_loss us",
        "rest us",
        "run (UTC)",
    ]
    return _records.rst_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2_000, help="gradient steps per run (a multiple of 10)")
    parser.add_argument("--repeats", type=int, default=5)
    _records.add_options(parser, "lightning_overhead")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("lightning_overhead", args, args.results)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    os.environ.setdefault("TQDM_DISABLE", "0")

    runs: dict[str, list[dict[str, float]]] = {name: [] for name in LABELS}
    for _ in range(args.repeats):  # interleaved, so a load change hits every variant alike
        runs["plain"].append(plain(args.steps))
        runs["auto"].append(lightning(args.steps, usual=False, automatic=True))
        runs["bare"].append(lightning(args.steps, usual=False))
        runs["grouped"].append(lightning(args.steps, usual=False, group=10))
        runs["metrics"].append(lightning(args.steps, usual=False, episode_metrics=True))
        runs["usual"].append(lightning(args.steps, usual=True))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    print(f"DQN gradient steps, batch {BATCH}, {args.steps} steps x {args.repeats} repeats (median)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    plain_rate = args.steps / median("plain", "total")
    print(f"{'variant':8} {'steps/s':>9} {'vs plain':>9} {'data us':>9} {'step us':>9} {'rest us':>9}")
    medians = {}
    for name in runs:
        rate = args.steps / median(name, "total")
        per = {key: 1e6 * median(name, key) / args.steps for key in ("total", "data", "step")}
        rest = per["total"] - per["data"] - per["step"]
        print(f"{name:8} {rate:9.0f} {rate / plain_rate:9.2f} {per['data']:9.0f} {per['step']:9.0f} {rest:9.0f}")
        medians[name] = {
            "steps_per_s": rate, "vs_plain": rate / plain_rate, "data_us": per["data"], "step_us": per["step"],
            "rest_us": rest,
        }  # fmt: skip
    print("auto: bare, with the loss returned to Lightning's automatic optimization instead of the example's manual")
    print("data: the pipeline (env step, n-step, insert, sample, to torch); step: td_loss (forward, loss);")
    print("rest: backward and optimizer (both sides), plus Lightning's loop, hooks, logging and progress bar.")
    run.save(medians, {name: {key: [r[key] for r in rs] for key in rs[0]} for name, rs in runs.items()})


if __name__ == "__main__":
    main()

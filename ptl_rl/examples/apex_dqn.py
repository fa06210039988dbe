"""Ape-X DQN (Horgan et al. 2018): N Ray workers with their own epsilons write into K prioritized replay shards.

    pip install -e ".[ray]"
    python -m ptl_rl.examples.apex_dqn --num-workers 2 --num-shards 2 --env-steps 40000
    python -m ptl_rl.examples.apex_dqn --env-id ALE/Pong-v5 --num-workers 8 --num-shards 4   # pixels

Read it top to bottom; the learner is ``ptl_rl.examples.dqn``'s ``DQN`` (double
DQN, n-step targets, a target net, importance-weighted Huber loss, ``|TD|``
fed back as priorities) or, on pixels, ``dqn_atari``'s ``AtariDQN`` (uint8
frame stacks into a CNN). What makes it Ape-X is where the data lives:

1. ``collector`` (runs inside each Ray worker): a vector env, a copy of the
   Q-network, an epsilon-greedy agent with the worker's own fixed epsilon,
   ``eps_i = eps ** (1 + alpha * i / (N - 1))`` (``--apex-eps 0.4``,
   ``--apex-alpha 7``: worker 0 explores at 0.4, the last acts almost
   greedily), ``ExperienceSource -> NStepTransform``. The n-step windows are
   folded in the worker.
2. ``ReplayShards``: ``--num-shards`` Ray actors, each a prioritized
   ``ReplayBuffer`` (``PrioritizedDraws``; on pixels over a ``FrameStorage``,
   each frame stored once and stacks rebuilt at sample time). The workers
   write straight into them (``RayWorkers(..., shards=shards)``: env ``e``'s
   rows go to shard ``e % K``), so no row passes through the learner.
3. The learner's pipeline ``RayWorkers (counts) -> ShardedReplay ->
   BatchSampler``: batches drawn across all shards exactly as from one
   prioritized buffer, one gradient step per ``--rows-per-step`` rows the
   workers stored; ``batch.update_priorities`` in ``training_step`` sends each
   row's new priority to its shard. ``WeightSync`` pushes the learner's
   weights to the workers every ``--push-every`` gradient steps.
4. ``train``: Ray (started here unless already running), the shards, the
   workers, the Trainer with its callbacks (the env-step budget, episode
   logging, greedy evaluations in the learner's process), ``fit``, the final
   evaluation and the summary (with the workers' epsilons, the rows stored
   and the priority updates applied).

New rows get the largest priority stored (the shards' rule), not a priority
computed in the worker as in the paper (a worker's pipeline could attach one
per row as ``ptl_rl.distributed.INITIAL_PRIORITY_FIELD``). On pixels each
worker's writer sends every frame once, and the shard rebuilds the stacks.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from gymnasium import spaces
from torch import nn

import ptl_rl
from ptl_rl.distributed import Collector, RayWorkers, ReplayShards, ShardedReplay, WeightSync, WorkerInfo
from ptl_rl.examples import cli, env_ids, reporting
from ptl_rl.examples.dqn import DQN, QNetwork, greedy_agent
from ptl_rl.examples.dqn_atari import AtariDQN, CNNQNetwork, make_single_env
from ptl_rl.examples.quiet import quiet_lightning

try:
    import ray
except ImportError:  # --help still answers; train() names the install line
    ray = None  # type: ignore[assignment]

RAY_INSTALL = 'pip install -c constraints.txt -e ".[ray]"'


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser("apex_dqn", __doc__, default_env="CartPole-v1", default_env_steps=40_000)
    p.set_defaults(num_envs=1, eval_every=5_000, final_eval_episodes=20)
    x = p.add_argument_group("Ape-X", "--num-envs is each worker's sub-envs")
    x.add_argument("--num-workers", type=int, default=2, help="Ray workers collecting (N)")
    x.add_argument("--num-shards", type=int, default=2, help="replay shards, Ray actors (K)")
    x.add_argument("--apex-eps", type=float, default=0.4, help="eps of worker i: apex-eps ** (1 + alpha i / (N - 1))")
    x.add_argument("--apex-alpha", type=float, default=7.0, help="alpha of the workers' epsilons")
    x.add_argument("--push-every", type=int, default=25, help="gradient steps between weight pushes to the workers")
    x.add_argument("--steps-per-call", type=int, default=8, help="vector steps a worker collects per Ray call")
    x.add_argument("--worker-cpus", type=float, default=1.0, help="CPUs Ray reserves for each worker")
    x.add_argument("--ray-cpus", type=int, default=None, help="CPUs of the local Ray this starts (none: N workers')")
    x.add_argument("--frame-stack", type=int, default=4, help="frames per observation (ALE ids)")
    a = p.add_argument_group("DQN")
    a.add_argument("--network", choices=("nature", "small"), default="nature", help="the CNN on pixel envs")
    a.add_argument("--hidden", type=int, nargs="+", default=[64], help="the MLP's hidden widths (one or two)")
    a.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    a.add_argument("--n-step", type=int, default=3, help="n of the n-step returns (folded in the workers)")
    a.add_argument("--double", action=argparse.BooleanOptionalAction, default=True, help="double DQN targets")
    a.add_argument("--lr", type=float, default=5e-3, help="Adam learning rate")
    a.add_argument("--batch-size", type=int, default=128, help="transitions per gradient step")
    a.add_argument("--buffer-size", type=int, default=50_000, help="replay capacity over all shards (transitions)")
    a.add_argument("--extra-frames", type=int, default=None, help="FrameStorage pool frames per shard (pixels)")
    a.add_argument("--learning-starts", type=int, default=1_000, help="rows stored before the first update")
    a.add_argument("--rows-per-step", type=int, default=4, help="rows the workers store per gradient step")
    a.add_argument("--target-sync-every", type=int, default=50, help="gradient steps between target-net syncs")
    a.add_argument("--alpha", type=float, default=0.6, help="priority exponent of the shards")
    a.add_argument("--beta-start", type=float, default=0.4, help="importance exponent, annealed to 1 over the budget")
    a.add_argument("--prefetch", type=int, default=1, help="sample requests kept in flight (ShardedReplay)")
    env_ids.register_ale()
    args = cli.parse(p, argv, (spaces.Discrete,), "DQN", solved_returns={"ALE/Pong-v5": 20.0})[0]
    for flag in ("num_workers", "num_shards", "push_every", "steps_per_call", "rows_per_step"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if len(args.hidden) > 2 or min(args.hidden) < 1:
        p.error(f"--hidden takes one or two positive widths, got {' '.join(map(str, args.hidden))}")
    if args.buffer_size < args.num_shards * args.batch_size:
        p.error(f"--buffer-size {args.buffer_size} is split over {args.num_shards} shards: give at least "
                f"--num-shards x --batch-size = {args.num_shards * args.batch_size}")  # fmt: skip
    return args


def apex_epsilons(eps: float, alpha: float, num_workers: int) -> list[float]:
    """Ape-X's fixed per-worker epsilons: ``eps ** (1 + alpha * i / (N - 1))`` for ``i = 0 .. N - 1`` (N = 1: eps)."""
    if num_workers == 1:
        return [float(eps)]
    return [float(eps ** (1 + alpha * i / (num_workers - 1))) for i in range(num_workers)]


# ---------------------------------------------------------------------------- envs and networks
def make_env(env_id: str, num_envs: int, frame_stack: int) -> gym.vector.VectorEnv:
    """``num_envs`` envs; ``ALE/*`` ids with the Nature-DQN preprocessing (``dqn_atari.make_single_env``)."""
    return gym.vector.SyncVectorEnv([functools.partial(make_single_env, env_id, frame_stack)] * num_envs)


def is_pixels(obs_space: gym.Space[Any]) -> bool:
    """Stacked frames (uint8 ``[stack, H, W]``): a CNN and a frame-deduplicating replay."""
    return isinstance(obs_space, spaces.Box) and obs_space.dtype == np.uint8 and len(obs_space.shape) == 3


def q_network(obs_space: spaces.Box, num_actions: int, network: str, hidden: list[int]) -> nn.Module:
    """The Q-network the learner trains and each worker acts with (the same layout, so the weights load)."""
    if is_pixels(obs_space):
        return CNNQNetwork(obs_space.shape, num_actions, network)
    return QNetwork(int(np.prod(obs_space.shape)), num_actions, hidden)


# ---------------------------------------------------------------------------- the workers
def collector(info: WorkerInfo, *, args: argparse.Namespace, epsilons: list[float]) -> Collector:
    """Built inside worker ``info.worker``: its envs, its Q-network copy (the learner's weights are pushed into
    it) acting epsilon-greedily with its own epsilon, and the n-step windows folded before they are written."""
    torch.set_num_threads(1)
    env = make_env(args.env_id, args.num_envs, args.frame_stack)
    assert isinstance(env.single_observation_space, spaces.Box)
    assert isinstance(env.single_action_space, spaces.Discrete)
    net = q_network(env.single_observation_space, int(env.single_action_space.n), args.network, args.hidden)
    selector = ptl_rl.EpsilonGreedySelector(epsilons[info.worker], seed=args.seed + info.rank)
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, selector), gamma=args.gamma, seed=args.seed,
                                     rank=info.rank)  # fmt: skip
    return Collector(ptl_rl.NStepTransform(source, n=args.n_step, gamma=args.gamma), net)


def shard_factory(args: argparse.Namespace, pixels: bool) -> Callable[[], ptl_rl.ReplayBuffer]:
    """What each shard actor calls once for its buffer: prioritized, a K-th of the capacity; on pixels each frame
    stored once (``FrameStorage``: stacks along axis 0, ``next_obs`` n steps later). Made of ptl_rl's classes
    only, so a shard imports ptl_rl and not this example (nor Lightning)."""
    beta = ptl_rl.LinearSchedule(args.beta_start, 1.0, args.env_steps)  # clocked by rows written (= env steps)
    storage: Any = None  # (a FrameStorage factory: capacity -> storage)
    if pixels:
        storage = functools.partial(
            ptl_rl.FrameStorage, stack_axis=0, n_step=args.n_step, extra_frames=args.extra_frames
        )
    return functools.partial(
        ptl_rl.ReplayBuffer,
        capacity=args.buffer_size // args.num_shards,
        warmup=0,
        storage=storage,
        # (pickled into each shard: every shard unpickles a strategy of its own)
        draws=ptl_rl.PrioritizedDraws(alpha=args.alpha, beta=beta, beta_clock="env"),
    )


# ---------------------------------------------------------------------------- evaluation
class Evaluation(pl.Callback):
    """Every ``--eval-every`` env steps (the workers' count) the learner's greedy policy plays in ``env``.

    Once the mean return reaches ``--solved-return``, ``--confirm-episodes`` fresh episodes must reach it
    too before training stops. ``run`` plays and records each evaluation.
    """

    def __init__(self, args: argparse.Namespace, run: reporting.Run, workers: RayWorkers, env: Any) -> None:
        self.args, self.run, self.workers, self.env = args, run, workers, env
        self.next_eval = args.eval_every

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *unused: Any) -> None:
        args, steps = self.args, self.workers.total_steps
        if steps < self.next_eval:
            return
        self.next_eval = steps - steps % args.eval_every + args.eval_every
        agent = greedy_agent(pl_module.q_net)
        mean = self.run.evaluate("eval", self.env, agent, args.eval_episodes)
        pl_module.log("eval/return_mean", mean, prog_bar=True, on_step=True, on_epoch=False)
        target = args.solved_return
        if target is not None and mean >= target and args.confirm_episodes:
            mean = self.run.evaluate("confirm", self.env, agent, args.confirm_episodes)
            pl_module.log("eval/confirm_return_mean", mean, on_step=True, on_epoch=False)
        if target is not None and mean >= target:
            self.run.solved()
            trainer.should_stop = True

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.env.close()


# ---------------------------------------------------------------------------- training
def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, evaluate the final weights on fresh episodes, print one line; returns the run's summary."""
    if ray is None:
        raise ImportError(f"the Ape-X example runs its workers and shards on Ray: {RAY_INSTALL}")
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)
    probe = make_env(args.env_id, 1, args.frame_stack)
    obs_space, action_space = probe.single_observation_space, probe.single_action_space
    probe.close()
    assert isinstance(obs_space, spaces.Box) and isinstance(action_space, spaces.Discrete)  # cli.parse checked
    pixels, num_actions = is_pixels(obs_space), int(action_space.n)
    common = dict(lr=args.lr, double=args.double, target_sync_every=args.target_sync_every,
                  log_every=args.log_every, prioritized=True, grad_clip=args.grad_clip)  # fmt: skip
    hidden = args.hidden[0] if len(args.hidden) == 1 else args.hidden
    model: DQN = (
        AtariDQN(obs_space.shape, num_actions, arch=args.network, **common)
        if pixels
        else DQN(int(np.prod(obs_space.shape)), num_actions, hidden=hidden, **common)
    )

    started_ray = not ray.is_initialized()
    if started_ray:  # a new private local Ray ("local": never another one running here); on a cluster call
        # ray.init(address="auto") before train()
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # single-user and local (docs/design/scale-out.md)
        path = os.pathsep.join(p for p in sys.path if p)  # the workers import what this process can (env modules)
        cpus = args.ray_cpus or max(1, round(args.num_workers * args.worker_cpus))
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
    epsilons = apex_epsilons(args.apex_eps, args.apex_alpha, args.num_workers)
    shards: ReplayShards | None = None
    try:
        shards = ReplayShards(shard_factory(args, pixels), args.num_shards, seed=args.seed)
        # RayWorkers (counts) -> ShardedReplay -> BatchSampler: one gradient step per --rows-per-step rows stored
        workers = RayWorkers(
            functools.partial(collector, args=args, epsilons=epsilons),
            args.num_workers,
            policy=model.q_net,
            steps_per_call=args.steps_per_call,
            actor_options={"num_cpus": args.worker_cpus},
            shards=shards,
        )
        warmup = max(args.learning_starts, args.batch_size)
        replay = ShardedReplay(
            shards,
            workers,
            warmup=warmup,
            transitions_per_yield=args.rows_per_step,
            prefetch=args.prefetch,
            seed=args.seed,
        )
        pipeline = ptl_rl.BatchSampler(replay, batch_size=args.batch_size)

        # ------------------------------------------------------------------------ the Trainer
        run = reporting.Run(
            "apex_dqn",
            args,
            model,
            workers,
            config={
                "obs_shape": list(obs_space.shape),
                "num_actions": num_actions,
                "worker_epsilons": epsilons,
                "replay_ratio": args.batch_size / args.rows_per_step,
                "replay_storage": "FrameStorage" if pixels else "ArrayStorage",
                "beta": f"linear {args.beta_start} -> 1.0 over {args.env_steps} rows written",
            },
        )
        callbacks: list[pl.Callback] = [
            run,
            ptl_rl.EnvStepLimit(pipeline, args.env_steps),
            ptl_rl.EpisodeStatsLogger(pipeline, every_n_steps=args.log_every),
            WeightSync(pipeline, every_n_steps=args.push_every, log=False),  # also stops the workers at the end
        ]
        if args.eval_every:
            eval_env = make_env(args.env_id, args.eval_episodes, args.frame_stack)
            callbacks.append(Evaluation(args, run, workers, eval_env))
        if args.video_every:
            video_env = make_single_env(args.env_id, args.frame_stack, render_mode="rgb_array")
            callbacks.append(run.video(pipeline, video_env, lambda module: greedy_agent(module.q_net)))
        if args.progress_bar:
            callbacks.append(reporting.EnvStepsProgressBar(workers, refresh_rate=args.log_every))
        with quiet_lightning():
            trainer = pl.Trainer(
                accelerator=args.accelerator,
                devices=1,
                max_epochs=-1,
                max_time=datetime.timedelta(seconds=args.time_limit) if args.time_limit else None,
                logger=run.loggers or False,
                log_every_n_steps=args.log_every,
                enable_checkpointing=False,
                enable_model_summary=False,
                enable_progress_bar=args.progress_bar,
                callbacks=callbacks,
            )
            trainer.fit(model, train_dataloaders=ptl_rl.to_dataloader(pipeline))
        workers.close()
        replay.flush_updates()
        shard_sizes = [stats.size for stats in shards.stats()]
    finally:
        if shards is not None:
            shards.close()
        if started_ray:
            ray.shutdown()

    # ---------------------------------------------------------------------------- final evaluation, summary
    if args.final_eval_episodes:
        final_env = make_env(args.env_id, args.final_eval_episodes, args.frame_stack)
        run.evaluate("final", final_env, greedy_agent(model.cpu().q_net), args.final_eval_episodes)
        final_env.close()
    summary = run.finish(
        trainer,
        worker_epsilons=epsilons,
        rows_stored=workers.rows_stored,
        shard_sizes=shard_sizes,
        weight_pushes=workers.version,
        applied_priority_updates=replay.applied_updates,
        stale_priority_updates=replay.stale_updates,
    )
    print(reporting.summary_line(summary) + f"; {args.num_workers} workers, {args.num_shards} shards {shard_sizes}")
    return summary


if __name__ == "__main__":
    train(parse_args())

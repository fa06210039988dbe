"""DQN on Atari (Nature CNN, frame-deduplicated uint8 replay) as a LightningModule.

    pip install -e ".[atari]"     # ale-py, which ships the ROMs
    python -m ptl_rl.examples.dqn_atari --env-id ALE/Pong-v5

Read it top to bottom; it reuses ``ptl_rl.examples.dqn.DQN`` (double DQN,
n-step targets, optional prioritized replay) and changes three things:

1. ``make_env``: ``ALE/*`` ids get the Nature-DQN preprocessing, gymnasium's
   ``AtariPreprocessing`` (no-op starts, frame skip 4 with max-pooling, 84x84
   grayscale, no sticky actions, as ``*NoFrameskip-v4``), rewards clipped to
   their sign, then ``FrameStackObservation`` (4 frames, obs ``[4, 84, 84]``
   uint8). Other ids (a test's pixel env) are used as registered.
2. ``CNNQNetwork``: the Nature CNN (Mnih et al. 2015; conv 8x8/4, 4x4/2,
   3x3/1, then 512 units) or, with ``--network small``, a two-layer CNN for
   tiny frames. Both take **uint8** observations and convert them on their
   device (``obs.float() / 255``): pixels stay uint8 from the env through the
   replay to ``training_step``, so every host-to-device copy of a batch
   moves 1 byte per pixel instead of 4.
3. The replay is a ``FrameStorage``: each frame is stored once (stacks are
   rebuilt at sample time, ``next_obs`` points to a later slot), about
   0.13x the bytes of storing ``obs`` and ``next_obs`` in full, so the 1M
   transitions of the reference setup need ~7.4 GB of RAM, or live on disk
   with ``--memmap-dir``.

Defaults follow CleanRL's ``dqn_atari.py`` (10M env steps, 1M replay,
Adam 1e-4, batch 32, learning starts 80k, one update per 4 env steps, target
sync every 1000 updates, epsilon 1 -> 0.01 over the first 10% of steps);
``--num-envs`` sub-envs collect together.
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import TQDMProgressBar
from pytorch_lightning.loggers import CSVLogger
from torch import nn

import ptl_rl
from ptl_rl.examples.cli import check_env
from ptl_rl.examples.dqn import DQN, greedy_agent


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--env-id", default="ALE/Pong-v5", help="an ALE/* id, or any env with pixel stack observations")
    p.add_argument("--env-steps", type=int, default=10_000_000, help="budget of agent steps (all sub-envs together)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--frame-stack", type=int, default=4, help="frames per observation (ALE ids)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--accelerator", default="auto", help="Lightning accelerator (a GPU for the full Pong run)")
    p.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--log-every", type=int, default=1000, help="gradient steps between logged metrics")
    p.add_argument("--log-dir", default=None)
    # algorithm (CleanRL dqn_atari defaults)
    p.add_argument("--network", choices=("nature", "small"), default="nature")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--n-step", type=int, default=1)
    p.add_argument("--double", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--buffer-size", type=int, default=1_000_000)
    p.add_argument("--learning-starts", type=int, default=80_000)
    p.add_argument("--train-every", type=int, default=4, help="env steps collected per gradient step")
    p.add_argument("--target-sync-every", type=int, default=1000, help="gradient steps between target syncs")
    p.add_argument("--eps-start", type=float, default=1.0)
    p.add_argument("--eps-end", type=float, default=0.01)
    p.add_argument("--eps-fraction", type=float, default=0.1, help="fraction of --env-steps of epsilon decay")
    p.add_argument("--prioritized", action=argparse.BooleanOptionalAction, default=False)
    # replay placement
    p.add_argument("--memmap-dir", default=None, help="keep the replay's frames in memory-mapped files there")
    p.add_argument("--extra-frames", type=int, default=None, help="FrameStorage pool frames beyond --buffer-size")
    # evaluation
    p.add_argument("--eval-every", type=int, default=250_000, help="env steps between greedy evaluations (0: never)")
    p.add_argument("--eval-episodes", type=int, default=4)
    p.add_argument("--solved-return", type=float, default=20.0, help="stop once the greedy mean return reaches it")
    p.add_argument("--final-eval-episodes", type=int, default=8)
    args = p.parse_args(argv)
    register_ale()
    check_env(p, args.env_id, (gym.spaces.Discrete,), "DQN")
    return args


def register_ale() -> None:
    """Register the ``ALE/*`` ids with gymnasium when ale-py is installed (the ``atari`` extra)."""
    try:
        import ale_py
    except ImportError:
        return
    gym.register_envs(ale_py)


# ---------------------------------------------------------------------------- envs
def make_single_env(env_id: str, frame_stack: int) -> gym.Env:
    """One env: the Nature-DQN preprocessing for ``ALE/*`` ids, else the env as registered."""
    if not env_id.startswith("ALE/"):
        return gym.make(env_id)
    # frameskip=1 in the emulator: AtariPreprocessing skips 4 and max-pools the last two frames, as in the paper;
    # repeat_action_probability=0 makes it the deterministic *NoFrameskip-v4 setting the references report on
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
    env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))  # reward clipping (Nature DQN)
    return gym.wrappers.FrameStackObservation(env, frame_stack)


def make_env(env_id: str, num_envs: int, frame_stack: int) -> gym.vector.VectorEnv:
    fn = functools.partial(make_single_env, env_id, frame_stack)
    return gym.vector.SyncVectorEnv([fn] * num_envs)


# ---------------------------------------------------------------------------- Q-network
class CNNQNetwork(nn.Module):
    """uint8 frame stacks ``[B, C, H, W]`` -> Q-values float [B, num_actions]; converts to float on its device.

    ``arch="nature"``: the Nature-DQN CNN for 84x84 frames. ``"small"``: two
    3x3 convolutions and 128 units, for frames of a few dozen pixels.
    """

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, arch: str = "nature") -> None:
        super().__init__()
        channels = obs_shape[0]
        if arch == "nature":
            convs = [
                nn.Conv2d(channels, 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
            ]
            hidden = 512
        else:
            convs = [nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU()]
            hidden = 128
        self.features = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            width = self.features(torch.zeros(1, *obs_shape)).shape[1]
        self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, num_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # pixels travel as uint8 (1 byte each); scale on the device the network lives on
        x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()
        return self.head(self.features(x))


class AtariDQN(DQN):
    """:class:`~ptl_rl.examples.dqn.DQN` with a :class:`CNNQNetwork`; the loss and target rule are the parent's."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, arch: str = "nature", **kwargs: Any) -> None:
        super().__init__(int(np.prod(obs_shape)), num_actions, **kwargs)
        self.save_hyperparameters({"obs_shape": list(obs_shape), "arch": arch})
        self.q_net = CNNQNetwork(tuple(obs_shape), num_actions, arch)
        self.target_net = ptl_rl.TargetNet(self.q_net)


# ---------------------------------------------------------------------------- replay
def replay_storage(args: argparse.Namespace) -> Any:
    """The replay's storage factory: frames stored once, stacks rebuilt along axis 0 (FrameStackObservation)."""
    return functools.partial(
        ptl_rl.FrameStorage,
        stack_axis=0,
        n_step=args.n_step,
        extra_frames=args.extra_frames,
        memmap_dir=args.memmap_dir,
    )


def naive_bytes_per_transition(obs_space: gym.spaces.Box) -> int:
    """Bytes of ``obs`` plus ``next_obs`` stored in full, the naive ring's cost per transition."""
    return 2 * int(np.prod(obs_space.shape)) * np.dtype(obs_space.dtype).itemsize


# ---------------------------------------------------------------------------- training
def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, then evaluate the final weights; returns the run's summary (with the replay's bytes per transition)."""
    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)
    env = make_env(args.env_id, args.num_envs, args.frame_stack)
    eval_env = make_env(args.env_id, args.eval_episodes, args.frame_stack)
    obs_space = env.single_observation_space
    num_actions = int(env.single_action_space.n)
    model = AtariDQN(
        tuple(obs_space.shape),
        num_actions,
        arch=args.network,
        lr=args.lr,
        double=args.double,
        target_sync_every=args.target_sync_every,
        log_every=args.log_every,
        prioritized=args.prioritized,
    )
    epsilon = ptl_rl.LinearSchedule(args.eps_start, args.eps_end, int(args.eps_fraction * args.env_steps))
    agent = ptl_rl.DQNAgent(model.q_net, ptl_rl.EpsilonGreedySelector(epsilon, seed=args.seed))

    source = ptl_rl.ExperienceSource(env, agent, gamma=args.gamma, seed=args.seed)
    nstep = ptl_rl.NStepTransform(source, n=args.n_step, gamma=args.gamma)
    replay = dict(
        capacity=args.buffer_size,
        warmup=max(args.learning_starts, args.batch_size),
        transitions_per_yield=args.train_every,
        seed=args.seed,
        storage=replay_storage(args),
    )
    if args.prioritized:
        beta = ptl_rl.LinearSchedule(0.4, 1.0, args.env_steps)
        buffer = ptl_rl.PrioritizedReplayBuffer(nstep, beta=beta, beta_clock="env", **replay)
    else:
        buffer = ptl_rl.ReplayBuffer(nstep, **replay)
    pipeline = ptl_rl.BatchSampler(buffer, batch_size=args.batch_size)

    callbacks: list[pl.Callback] = [
        ptl_rl.EpisodeStatsLogger(pipeline, every_n_steps=args.log_every),
        ptl_rl.EnvStepLimit(pipeline, args.env_steps),
    ]
    evaluation = None
    if args.eval_every:
        evaluation = ptl_rl.PeriodicEvaluation(
            pipeline,
            eval_env,
            lambda module: greedy_agent(module.q_net),
            every_env_steps=args.eval_every,
            episodes=args.eval_episodes,
            stop_at_return=args.solved_return,
            seed=args.seed + 10_000,
        )
        callbacks.append(evaluation)
    if args.progress_bar:
        callbacks.append(TQDMProgressBar(refresh_rate=args.log_every))
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_epochs=-1,
        logger=CSVLogger(args.log_dir, name="dqn_atari") if args.log_dir else False,
        log_every_n_steps=args.log_every,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=args.progress_bar,
        callbacks=callbacks,
    )
    trainer.fit(model, train_dataloaders=ptl_rl.to_dataloader(pipeline))
    train_time = time.perf_counter() - start

    final_return = float("nan")
    if args.final_eval_episodes:
        final_env = make_env(args.env_id, args.final_eval_episodes, args.frame_stack)
        final_agent = greedy_agent(model.q_net.cpu())
        final_return = float(
            ptl_rl.evaluate(final_env, final_agent, args.final_eval_episodes, seed=args.seed + 1_000_000).mean()
        )
        final_env.close()
    storage = buffer.storage
    for e in (env, eval_env):
        e.close()
    return {
        "final_eval_return": final_return,
        "env_steps": source.total_steps,
        "gradient_steps": trainer.global_step,
        "solved_at_env_steps": evaluation.solved_at if evaluation else None,
        "eval_history": evaluation.history if evaluation else [],
        "replay_bytes_per_transition": storage.nbytes / storage.capacity,
        "naive_bytes_per_transition": naive_bytes_per_transition(obs_space),
        "replay_transitions": len(storage),
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = train(args)
    solved = result["solved_at_env_steps"]
    ratio = result["replay_bytes_per_transition"] / result["naive_bytes_per_transition"]
    print(
        f"{args.env_id} seed {args.seed}: "
        + (f"solved at {solved} env steps" if solved is not None else "not solved within the budget")
        + f"; final greedy return {result['final_eval_return']:.2f} over {args.final_eval_episodes} episodes"
        + f"; {result['env_steps']} env steps, {result['gradient_steps']} gradient steps"
        + f"; replay {result['replay_bytes_per_transition']:.0f} B/transition ({ratio:.3f}x obs+next_obs)"
        + f", wall time {result['wall_time_s']:.1f} s"
    )
    return result


if __name__ == "__main__":
    main()

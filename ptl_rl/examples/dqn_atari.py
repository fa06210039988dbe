"""DQN on Atari (Nature CNN, frame-deduplicated uint8 replay) as a LightningModule.

    pip install -e ".[atari]"     # ale-py, which ships the ROMs
    python -m ptl_rl.examples.dqn_atari --env-id ALE/Pong-v5

Read it top to bottom; it reuses ``ptl_rl.examples.dqn``'s ``DQN`` (double DQN,
n-step targets, optional prioritized replay) and its ``Evaluation`` callback,
and changes three things:

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

``train`` then builds the Trainer with its callbacks, fits, evaluates the
final weights on fresh episodes and adds the replay's bytes per transition to
the summary. Defaults follow CleanRL's ``dqn_atari.py`` (10M env steps, 1M replay,
Adam 1e-4, batch 32, learning starts 80k, one update per 4 env steps, target
sync every 1000 updates, epsilon 1 -> 0.01 over the first 10% of steps);
``--num-envs`` sub-envs collect together.
"""

from __future__ import annotations

import argparse
import datetime
import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from gymnasium import spaces
from torch import nn

import ptl_rl
from ptl_rl.examples import cli, env_ids, reporting
from ptl_rl.examples.burst import replay_stage
from ptl_rl.examples.dqn import DQN, Evaluation, greedy_agent
from ptl_rl.examples.quiet import quiet_lightning


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser("dqn_atari", __doc__, default_env="ALE/Pong-v5", default_env_steps=10_000_000)
    p.set_defaults(
        num_envs=8, accelerator="auto", log_every=1_000, eval_every=250_000, eval_episodes=4, final_eval_episodes=8
    )
    p.add_argument("--frame-stack", type=int, default=4, help="frames per observation (ALE ids)")
    a = p.add_argument_group("DQN (CleanRL dqn_atari defaults)")
    a.add_argument("--network", choices=("nature", "small"), default="nature", help="the CNN (small: tiny frames)")
    a.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    a.add_argument("--n-step", type=int, default=1, help="n of the n-step returns (NStepTransform)")
    a.add_argument("--double", action=argparse.BooleanOptionalAction, default=True, help="double DQN targets")
    a.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate")
    a.add_argument("--batch-size", type=int, default=32, help="transitions per gradient step")
    a.add_argument("--buffer-size", type=int, default=1_000_000, help="replay capacity (transitions)")
    a.add_argument("--learning-starts", type=int, default=80_000, help="transitions stored before the first update")
    a.add_argument("--target-sync-every", type=int, default=1000, help="gradient steps between target syncs")
    a.add_argument("--eps-start", type=float, default=1.0, help="epsilon of epsilon-greedy at env step 0")
    a.add_argument("--eps-end", type=float, default=0.01, help="epsilon after the decay")
    a.add_argument("--eps-fraction", type=float, default=0.1, help="fraction of --env-steps of epsilon decay")
    a.add_argument("--prioritized", action=argparse.BooleanOptionalAction, default=False, help="prioritized replay")
    cli.add_burst_flags(p, train_freq=4)
    r = p.add_argument_group("replay placement")
    r.add_argument("--memmap-dir", default=None, help="keep the replay's frames in memory-mapped files there")
    r.add_argument("--extra-frames", type=int, default=None, help="FrameStorage pool frames beyond --buffer-size")
    env_ids.register_ale()  # the ALE/* ids
    # Pong's best return is 21; other ALE games have their own scale and no registered threshold
    return cli.parse(p, argv, (spaces.Discrete,), "DQN", solved_returns={"ALE/Pong-v5": 20.0})[0]


# ---------------------------------------------------------------------------- envs
def make_single_env(env_id: str, frame_stack: int, render_mode: str | None = None) -> gym.Env:
    """One env: the Nature-DQN preprocessing for ``ALE/*`` ids, else the env as registered.

    ``render_mode="rgb_array"`` (the video env of ``--video-every``) renders the emulator's full colour screen,
    not the 84x84 grey frames the network sees.
    """
    # only when asked: gymnasium hands render_mode=None on to the env's constructor, which may not take it
    render: dict[str, Any] = {} if render_mode is None else {"render_mode": render_mode}
    if not env_id.startswith("ALE/"):
        return gym.make(env_id, **render)
    # frameskip=1 in the emulator: AtariPreprocessing skips 4 and max-pools the last two frames, as in the paper;
    # repeat_action_probability=0 makes it the deterministic *NoFrameskip-v4 setting the references report on
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, **render)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
    env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(float(r))))  # reward clipping (Nature DQN)
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
        q: torch.Tensor = self.head(self.features(x))
        return q


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
    """Train, evaluate the final weights, print one line; returns the summary, with the replay's size."""
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)
    env = make_env(args.env_id, args.num_envs, args.frame_stack)
    obs_space, action_space = env.single_observation_space, env.single_action_space
    if not isinstance(obs_space, gym.spaces.Box):  # FrameStackObservation's stacks: a Box [stack, 84, 84]
        raise TypeError(f"{args.env_id}: expected stacked frames (a Box observation space), got {obs_space}")
    assert isinstance(action_space, spaces.Discrete)  # cli.parse checked
    num_actions = int(action_space.n)
    model = AtariDQN(
        obs_space.shape,
        num_actions,
        arch=args.network,
        lr=args.lr,
        double=args.double,
        target_sync_every=args.target_sync_every,
        log_every=args.log_every,
        prioritized=args.prioritized,
        grad_clip=args.grad_clip,
    )
    decay_steps = int(args.eps_fraction * args.env_steps)
    epsilon = ptl_rl.LinearSchedule(args.eps_start, args.eps_end, decay_steps)
    agent = ptl_rl.DQNAgent(model.q_net, ptl_rl.EpsilonGreedySelector(epsilon, seed=args.seed))

    # ExperienceSource -> NStepTransform -> ReplayBuffer (frames stored once) -> BatchSampler
    source = ptl_rl.ExperienceSource(env, agent, gamma=args.gamma, seed=args.seed)
    nstep = ptl_rl.NStepTransform(source, n=args.n_step, gamma=args.gamma)
    replay = dict(
        capacity=args.buffer_size,
        warmup=max(args.learning_starts, args.batch_size),
        transitions_per_yield=args.train_freq,
        seed=args.seed,
        storage=replay_storage(args),
    )
    buffer: ptl_rl.ReplayBuffer
    if args.prioritized:
        beta = ptl_rl.LinearSchedule(0.4, 1.0, args.env_steps)
        buffer = ptl_rl.PrioritizedReplayBuffer(nstep, beta=beta, beta_clock="env", **replay)
    else:
        buffer = ptl_rl.ReplayBuffer(nstep, **replay)
    pipeline = ptl_rl.BatchSampler(replay_stage(buffer, args.gradient_steps), batch_size=args.batch_size)

    # ---------------------------------------------------------------------------- the Trainer
    run = reporting.Run(
        "dqn_atari",
        args,
        model,
        source,
        config={
            "obs_shape": list(obs_space.shape),
            "num_actions": num_actions,
            "epsilon": f"linear {args.eps_start} -> {args.eps_end} over {decay_steps} env steps",
            "replay_warmup": replay["warmup"],
            "replay_ratio": args.batch_size * args.gradient_steps / args.train_freq,
        },
    )
    callbacks: list[pl.Callback] = [
        run,
        ptl_rl.EnvStepLimit(pipeline, args.env_steps),
        ptl_rl.EpisodeStatsLogger(pipeline, every_n_steps=args.log_every),
    ]
    if args.eval_every:  # DQN's evaluations, in preprocessed envs
        callbacks.append(Evaluation(args, run, source, make_env(args.env_id, args.eval_episodes, args.frame_stack)))
    if args.video_every:  # the emulator's colour screen, while the agent sees the preprocessed 84x84 stacks
        video_env = make_single_env(args.env_id, args.frame_stack, render_mode="rgb_array")
        callbacks.append(run.video(pipeline, video_env, lambda module: greedy_agent(module.q_net)))
    if args.progress_bar:
        callbacks.append(reporting.EnvStepsProgressBar(source, refresh_rate=args.log_every))
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
    env.close()

    # ---------------------------------------------------------------------------- final evaluation, summary
    if args.final_eval_episodes:
        final_env = make_env(args.env_id, args.final_eval_episodes, args.frame_stack)
        run.evaluate("final", final_env, greedy_agent(model.cpu().q_net), args.final_eval_episodes)
        final_env.close()
    storage = buffer.storage
    assert isinstance(storage, ptl_rl.FrameStorage)  # what replay_storage builds
    summary = run.finish(
        trainer,
        replay_bytes_per_transition=storage.nbytes / storage.capacity,
        naive_bytes_per_transition=naive_bytes_per_transition(obs_space),
        replay_transitions=len(storage),
    )
    ratio = summary["replay_bytes_per_transition"] / summary["naive_bytes_per_transition"]
    print(
        reporting.summary_line(summary)
        + f"; replay {summary['replay_bytes_per_transition']:.0f} B/transition ({ratio:.3f}x obs+next_obs)"
    )
    return summary


if __name__ == "__main__":
    train(parse_args())

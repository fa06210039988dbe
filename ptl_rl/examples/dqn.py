"""DQN (double DQN, n-step returns; optionally prioritized replay and a dueling head) as a LightningModule.

    python -m ptl_rl.examples.dqn --env-id CartPole-v1 --env-steps 50000 --seed 0
    python -m ptl_rl.examples.dqn --rainbow   # Rainbow-lite: prioritized replay + 3-step returns + dueling head

One algorithm in one file, CleanRL style; read it top to bottom:

1. ``parse_args``: every hyperparameter is a flag (the shared ones, run
   directory, limits and evaluation, come from ``ptl_rl.examples.cli``, which
   also checks the env); the defaults solve CartPole-v1 (greedy mean return
   >= 475, confirmed on fresh episodes) in about 15k env steps and a few CPU
   seconds. Plain DQN (uniform replay, 1-step returns, max-Q targets) is
   ``--n-step 1 --no-double``: double DQN targets are on in every
   configuration until ``--no-double`` turns them off. ``--rainbow`` switches
   on ``--prioritized``, ``--dueling`` and ``--n-step 3`` (flags given
   explicitly still win, e.g. ``--rainbow --no-dueling``).
2. ``QNetwork``: an MLP from observations to one Q-value per action;
   ``DuelingQNetwork`` (``--dueling``) splits the last layer into a state value
   and action advantages, ``Q = V + A - mean(A)``.
3. ``DQN``: the LightningModule. ``training_step`` gets a ``ptl_rl.TorchBatch``
   and takes one gradient step by hand (manual optimization: on a network this
   small it is markedly cheaper than Lightning's automatic loop). ``td_loss``
   regresses Q(obs, action) onto the bootstrapped target
   ``reward + discount * (1 - terminated) * Q_target(next_obs, a*)`` with a
   Huber loss. ``reward`` and ``discount`` come with the batch (an n-step
   transition carries the discounted reward sum and gamma**k), so the module
   never computes gamma**n itself. The target network is a ``ptl_rl.TargetNet``,
   synced every ``--target-sync-every`` gradient steps. With ``--prioritized``
   the batch also carries importance ``weights`` (the loss is weighted by them)
   and ``batch.update_priorities(td_errors)`` feeds ``|TD|`` back to the buffer.
4. ``Evaluation``: every ``--eval-every`` env steps the greedy policy
   (epsilon 0) plays in an env of its own; training stops once it reaches
   ``--solved-return`` and fresh episodes confirm it.
5. ``train``: the vector env, the epsilon-greedy ``DQNAgent`` and the pipeline
   ``ExperienceSource -> NStepTransform -> ReplayBuffer -> BatchSampler``
   (a ``PrioritizedReplayBuffer`` with ``--prioritized``, its beta annealed from
   ``--beta-start`` to 1 over ``--env-steps``; ``--train-freq K --gradient-steps G``
   takes G gradient steps every K env steps); then the Trainer with its
   callbacks (the env-step budget, episode logging, the evaluations, videos),
   ``fit``, the final evaluation on fresh episodes and the summary. What the
   run writes down (its directory, ``summary.json``) is ``ptl_rl.examples.reporting``'s.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

import ptl_rl
from ptl_rl.examples import cli, reporting
from ptl_rl.examples.burst import replay_stage
from ptl_rl.examples.quiet import quiet_lightning

if TYPE_CHECKING:
    from lightning_fabric.utilities.data import AttributeDict


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser("dqn", __doc__, default_env="CartPole-v1", default_env_steps=50_000)
    p.set_defaults(num_envs=4, eval_every=2_500, final_eval_episodes=20)
    a = p.add_argument_group("DQN")
    a.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    a.add_argument("--n-step", type=int, default=3, help="n of the n-step returns (NStepTransform)")
    a.add_argument("--double", action=argparse.BooleanOptionalAction, default=True, help="double DQN targets")
    a.add_argument(
        "--hidden",
        type=int,
        nargs="+",
        default=[64],
        help="widths of the two hidden layers: one number for both, or two (CleanRL's dqn.py: 120 84)",
    )
    a.add_argument("--lr", type=float, default=5e-3, help="Adam learning rate")
    a.add_argument("--batch-size", type=int, default=128, help="transitions per gradient step")
    a.add_argument("--buffer-size", type=int, default=50_000, help="replay capacity (transitions)")
    a.add_argument("--learning-starts", type=int, default=1_000, help="transitions stored before the first update")
    a.add_argument("--target-sync-every", type=int, default=50, help="gradient steps between target-net syncs")
    a.add_argument("--tau", type=float, default=1.0, help="target sync rate: 1 copies (hard), < 1 Polyak-averages")
    a.add_argument("--eps-start", type=float, default=1.0, help="epsilon of epsilon-greedy at env step 0")
    a.add_argument("--eps-end", type=float, default=0.05, help="epsilon after the decay")
    a.add_argument("--eps-decay-steps", type=int, default=10_000, help="env steps of the linear epsilon decay")
    cli.add_burst_flags(p, train_freq=4)
    p.add_argument_group("burst training").add_argument(
        "--steps-per-batch",
        type=int,
        default=None,
        help="vector steps the source writes per batch (ExperienceSource's steps_per_batch: the stages behind it "
        "pay their fixed cost once per batch); default: with --n-step 1, --train-freq / --num-envs when that "
        "divides evenly (the same data as 1), else 1 (n-step folds a chunk on a slower path than one step)",
    )
    p.add_argument_group("Lightning").add_argument(
        "--batches-per-step",
        type=int,
        default=1,
        help="gradient steps per Lightning training step (ptl_rl.BatchGroup): K > 1 pays Lightning's fixed cost "
        "once per K gradient steps, with the same data; logging and callbacks then run every K gradient steps",
    )
    r = p.add_argument_group("Rainbow-lite", "each off by default; --rainbow turns on all three")
    r.add_argument("--prioritized", action=argparse.BooleanOptionalAction, default=False, help="prioritized replay")
    r.add_argument("--alpha", type=float, default=0.6, help="priority exponent of prioritized replay (0: uniform)")
    r.add_argument(
        "--beta-start", type=float, default=0.4, help="importance-sampling exponent, annealed to 1 over --env-steps"
    )
    r.add_argument(
        "--dueling", action=argparse.BooleanOptionalAction, default=False, help="dueling head: V + A - mean(A)"
    )
    r.add_argument(
        "--rainbow",
        action="store_true",
        help="Rainbow-lite: defaults of --prioritized, --dueling and --n-step 3 (explicit flags still win)",
    )
    if p.parse_known_args(argv)[0].rainbow:
        # --rainbow only changes defaults, so flags given explicitly still win (--rainbow --no-dueling)
        p.set_defaults(prioritized=True, dueling=True, n_step=3)
    # a mistyped or unsuitable env ends here, with the usage line and the reason
    args = cli.parse(p, argv, (spaces.Discrete,), "DQN")[0]
    if args.batches_per_step < 1:
        p.error(f"--batches-per-step must be >= 1, got {args.batches_per_step}")
    if args.steps_per_batch is None:
        args.steps_per_batch = source_chunk(args.train_freq, args.num_envs) if args.n_step == 1 else 1
    elif args.steps_per_batch < 1:
        p.error(f"--steps-per-batch must be >= 1, got {args.steps_per_batch}")
    if len(args.hidden) > 2 or min(args.hidden) < 1:
        p.error(f"--hidden takes one or two positive widths, got {' '.join(map(str, args.hidden))}")
    args.hidden = args.hidden[0] if len(args.hidden) == 1 else args.hidden  # one width reads as before: hidden: 64
    return args


def source_chunk(train_freq: int, num_envs: int) -> int:
    """Vector steps per source batch that fill one replay yield exactly (the same data as one step per batch)."""
    return train_freq // num_envs if train_freq % num_envs == 0 and train_freq >= num_envs else 1


# ---------------------------------------------------------------------------- Q-network
def hidden_widths(hidden: int | Sequence[int]) -> tuple[int, int]:
    """The two hidden widths: one number is both, two are (first, second)."""
    widths = (hidden, hidden) if isinstance(hidden, int) else tuple(hidden)
    if len(widths) == 1:
        widths = (widths[0], widths[0])
    if len(widths) != 2 or min(widths) < 1:
        raise ValueError(f"hidden must be one or two positive widths, got {hidden!r}")
    return widths[0], widths[1]


def mlp_trunk(obs_dim: int, hidden: int | Sequence[int]) -> nn.Sequential:
    """obs [B, obs_dim] -> features float [B, second width]: two ReLU layers."""
    first, second = hidden_widths(hidden)
    return nn.Sequential(nn.Linear(obs_dim, first), nn.ReLU(), nn.Linear(first, second), nn.ReLU())


class QNetwork(nn.Module):
    """obs [B, obs_dim] -> Q-values float [B, num_actions]."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int | Sequence[int]) -> None:
        super().__init__()
        self.net = nn.Sequential(*mlp_trunk(obs_dim, hidden), nn.Linear(hidden_widths(hidden)[1], num_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        q: torch.Tensor = self.net(obs.flatten(1).float())
        return q


class DuelingQNetwork(nn.Module):
    """Dueling head (Wang et al. 2016): obs [B, obs_dim] -> Q = V + A - mean(A), float [B, num_actions]."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int | Sequence[int]) -> None:
        super().__init__()
        self.trunk = mlp_trunk(obs_dim, hidden)
        width = hidden_widths(hidden)[1]
        self.value = nn.Linear(width, 1)  # V(s)
        self.advantage = nn.Linear(width, num_actions)  # A(s, a)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.trunk(obs.flatten(1).float())
        advantage = self.advantage(features)
        # subtracting the mean advantage makes V and A identifiable
        q: torch.Tensor = self.value(features) + advantage - advantage.mean(dim=1, keepdim=True)
        return q


# ---------------------------------------------------------------------------- learner
class DQN(pl.LightningModule):
    hparams: AttributeDict  # what save_hyperparameters() makes it (Lightning's property is typed wider)

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden: int | Sequence[int] = 64,
        lr: float = 5e-3,
        double: bool = True,
        target_sync_every: int = 50,
        tau: float = 1.0,
        log_every: int = 100,
        dueling: bool = False,
        prioritized: bool = False,
        grad_clip: float | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False  # training_step takes its gradient step itself
        self.q_net: nn.Module = (DuelingQNetwork if dueling else QNetwork)(obs_dim, num_actions, hidden)
        self.target_net = ptl_rl.TargetNet(self.q_net)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        q: torch.Tensor = self.q_net(obs)
        return q

    def td_loss(self, batch: ptl_rl.TorchBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(Huber loss of the TD errors, Q(obs, action) float [B]) for a batch of B transitions."""
        # Q(obs, action) of the actions that were taken
        q_taken = self.q_net(batch.obs).gather(1, batch.action.long().unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_q = self.target_net(batch.next_obs)
            if self.hparams.double:
                # double DQN: the online network picks the next action, the target network values it
                next_action = self.q_net(batch.next_obs).argmax(dim=1, keepdim=True)
                next_value = next_q.gather(1, next_action).squeeze(1)
            else:
                next_value = next_q.max(dim=1).values
            # ptl_rl's one target rule: discount is gamma**k for the k rewards summed into `reward`
            target = batch.reward + batch.discount * (1.0 - batch.terminated.float()) * next_value
        if self.hparams.prioritized:
            # importance weights undo the bias of sampling by priority; |TD| becomes the rows' new priority
            loss = (batch.weights * F.smooth_l1_loss(q_taken, target, reduction="none")).mean()
            batch.update_priorities(q_taken.detach() - target)
        else:
            loss = F.smooth_l1_loss(q_taken, target)
        return loss, q_taken

    def training_step(self, batch: ptl_rl.TorchBatch | ptl_rl.BatchGroup, batch_idx: int) -> torch.Tensor | None:
        # --batches-per-step K hands over a BatchGroup: K gradient steps in one Lightning step, each batch pulled
        # from the pipeline after the previous step, so Lightning's fixed cost is paid once per K
        batches = batch.batches() if isinstance(batch, ptl_rl.BatchGroup) else (batch,)
        loss = q_taken = None
        for one in batches:
            loss, q_taken = self.gradient_step(one)
        if loss is None or q_taken is None:  # the pipeline ended before this group's first batch (both or neither)
            return None
        if batch_idx % self.hparams.log_every == 0:  # a Lightning self.log costs about as much as a gradient step
            self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
            self.log("train/q_mean", q_taken.mean(), on_step=True, on_epoch=False)
        return loss

    def gradient_step(self, batch: ptl_rl.TorchBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step by hand (manual optimization), then the target sync when due; returns ``td_loss``'s pair.

        On a network this small Lightning's automatic optimization (its closure and hooks) would cost about half
        a gradient step more (docs/design/hot-path.md, "Lightning's share").
        """
        loss, q_taken = self.td_loss(batch)
        optimizer: Any = self.optimizers()  # configure_optimizers' one, as Lightning wraps it
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if self.hparams.grad_clip:  # by hand: Lightning's gradient_clip_val is for automatic optimization
            self.clip_gradients(optimizer, gradient_clip_val=self.hparams.grad_clip, gradient_clip_algorithm="norm")
        optimizer.step()
        # global_step counts optimizer steps, so this syncs every `target_sync_every` gradient steps
        if self.global_step % self.hparams.target_sync_every == 0:
            if self.hparams.tau >= 1.0:
                self.target_net.sync()
            else:
                self.target_net.soft_sync(self.hparams.tau)
        return loss.detach(), q_taken.detach()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # fused: one kernel for all parameters, about 3x faster than the default on a small net
        return torch.optim.Adam(self.q_net.parameters(), lr=self.hparams.lr, fused=True)


# ---------------------------------------------------------------------------- evaluation
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def greedy_agent(q_net: nn.Module) -> ptl_rl.DQNAgent:
    """The greedy policy (epsilon 0) of a Q-network."""
    return ptl_rl.DQNAgent(q_net, ptl_rl.ArgmaxSelector())


class Evaluation(pl.Callback):
    """Every ``--eval-every`` env steps the greedy policy plays ``--eval-episodes`` episodes in ``env``.

    Once their mean return reaches ``--solved-return``, ``--confirm-episodes`` episodes from start states no
    evaluation has used must reach it too, and only then does training stop: a policy that crossed by luck
    of the start states keeps training. ``run`` plays and records each evaluation (its seeds, evaluations.csv).
    """

    def __init__(self, args: argparse.Namespace, run: reporting.Run, source: ptl_rl.ExperienceSource, env: Any) -> None:
        self.args, self.run, self.source, self.env = args, run, source, env
        self.next_eval = args.eval_every

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *unused: Any) -> None:
        args, steps = self.args, self.source.total_steps
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
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)
    env = make_env(args.env_id, args.num_envs)
    obs_space, action_space = env.single_observation_space, env.single_action_space
    assert isinstance(obs_space, spaces.Box) and isinstance(action_space, spaces.Discrete)  # cli.parse checked
    obs_dim, num_actions = int(np.prod(obs_space.shape)), int(action_space.n)
    model = DQN(
        obs_dim,
        num_actions,
        hidden=args.hidden,
        lr=args.lr,
        double=args.double,
        target_sync_every=args.target_sync_every,
        tau=args.tau,
        log_every=args.log_every,
        dueling=args.dueling,
        prioritized=args.prioritized,
        grad_clip=args.grad_clip,
    )

    # the agent acts with the learner's current Q-network; ExperienceSource forwards the env-step count to epsilon
    epsilon = ptl_rl.LinearSchedule(args.eps_start, args.eps_end, args.eps_decay_steps)
    agent = ptl_rl.DQNAgent(model.q_net, ptl_rl.EpsilonGreedySelector(epsilon, seed=args.seed))

    # ExperienceSource -> NStepTransform -> ReplayBuffer -> BatchSampler: G batches per --train-freq env steps
    source = ptl_rl.ExperienceSource(env, agent, gamma=args.gamma, seed=args.seed, steps_per_batch=args.steps_per_batch)
    nstep = ptl_rl.NStepTransform(source, n=args.n_step, gamma=args.gamma)
    replay = dict(
        capacity=args.buffer_size,
        warmup=max(args.learning_starts, args.batch_size),
        transitions_per_yield=args.train_freq,
        seed=args.seed,
    )
    buffer: ptl_rl.ReplayBuffer
    if args.prioritized:
        # beta runs from --beta-start to 1 over the budget, clocked by the transitions stored (= env steps)
        beta = ptl_rl.LinearSchedule(args.beta_start, 1.0, args.env_steps)
        buffer = ptl_rl.PrioritizedReplayBuffer(nstep, alpha=args.alpha, beta=beta, beta_clock="env", **replay)
    else:
        buffer = ptl_rl.ReplayBuffer(nstep, **replay)
    pipeline = ptl_rl.BatchSampler(replay_stage(buffer, args.gradient_steps), batch_size=args.batch_size)
    loader = ptl_rl.to_dataloader(pipeline, batches_per_step=args.batches_per_step)

    # ---------------------------------------------------------------------------- the Trainer
    # the run directory (config.json, the loggers, episodes.csv, evaluations.csv), and the first callback
    run = reporting.Run(
        "dqn",
        args,
        model,
        source,
        config={
            "obs_dim": obs_dim,
            "num_actions": num_actions,
            "epsilon": f"linear {args.eps_start} -> {args.eps_end} over {args.eps_decay_steps} env steps",
            "replay_warmup": replay["warmup"],
            "replay_ratio": args.batch_size * args.gradient_steps / args.train_freq,
            "beta": f"linear {args.beta_start} -> 1.0 over {args.env_steps} env steps" if args.prioritized else None,
        },
    )
    callbacks: list[pl.Callback] = [
        run,
        ptl_rl.EnvStepLimit(pipeline, args.env_steps),  # the budget: one endless epoch until then
        ptl_rl.EpisodeStatsLogger(pipeline, every_n_steps=args.log_every),
    ]
    if args.eval_every:
        callbacks.append(Evaluation(args, run, source, make_env(args.env_id, args.eval_episodes)))
    if args.video_every:  # greedy episodes filmed in an env of their own, into <run directory>/videos/
        video_env = gym.make(args.env_id, render_mode="rgb_array")
        callbacks.append(run.video(pipeline, video_env, lambda module: greedy_agent(module.q_net)))
    if args.progress_bar:
        callbacks.append(reporting.EnvStepsProgressBar(source, refresh_rate=args.log_every))
    with quiet_lightning():  # Lightning's lines that ask nothing of the user (no GPU here, ...)
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
        trainer.fit(model, train_dataloaders=loader)
    env.close()

    # ---------------------------------------------------------------------------- final evaluation, summary
    if args.final_eval_episodes:  # the final weights, greedy, on fresh episodes
        final_env = make_env(args.env_id, args.final_eval_episodes)
        run.evaluate("final", final_env, greedy_agent(model.cpu().q_net), args.final_eval_episodes)
        final_env.close()
    summary = run.finish(trainer)
    print(reporting.summary_line(summary))
    return summary


if __name__ == "__main__":
    train(parse_args())

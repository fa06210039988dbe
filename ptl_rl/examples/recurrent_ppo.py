"""Recurrent PPO: an LSTM actor-critic trained on whole rollout sequences, as a LightningModule.

    python -m ptl_rl.examples.recurrent_ppo --seed 0                  # LSTM on CartPole without velocities
    python -m ptl_rl.examples.recurrent_ppo --seed 0 --feed-forward   # the same network with its memory cut

Read it top to bottom (CleanRL's ``ppo_atari_lstm.py`` and sb3-contrib's
``RecurrentPPO`` are the peers):

1. ``parse_args``: every hyperparameter is a flag. The defaults are
   rl-baselines3-zoo's RecurrentPPO settings for CartPole without velocities
   (8 envs x 32 steps per rollout, 20 epochs of one minibatch, gamma 0.98,
   lambda 0.8, lr 1e-3 and clip 0.2 annealed to 0, separate LSTMs for the policy
   and the value). The env,
   ``CartPoleNoVelocity-v1``, comes from ``ptl_rl.examples.partial_obs`` (cart
   position and pole angle only). ``--feed-forward`` (``--core mlp``) swaps the
   LSTM cell for a ReLU layer of the same width: the baseline without memory.
2. ``network``: a ``ptl_rl.RecurrentActorCritic``: scaled observations ->
   ``TwinCore`` (two ``ptl_rl.RecurrentCore`` LSTM cells, one for the policy
   and one for the value, their states side by side in one state tensor) ->
   a ReLU layer each -> ``ptl_rl.action_head`` and a linear value head.
3. ``RecurrentPPO``: the LightningModule. A minibatch holds whole sequences of
   each env's rollout, ``[B_seq, L, ...]`` (``RolloutBuffer(sequence_length=L)``),
   with ``hidden`` (the state the agent acted from: ``hidden[:, 0]`` starts
   each sequence), ``episode_start`` (where the agent zeroed its state) and
   ``mask`` (False on padding). ``agent.evaluate_sequences`` re-runs the LSTM
   over each sequence from its stored state, zeroing it at episode starts,
   and gives log-probs and values for the clipped-surrogate loss, averaged
   over the real rows.
4. ``Evaluation``: greedy evaluations every ``--eval-every`` env steps, after
   a rollout's last update, stopping once ``--solved-return`` is reached and
   confirmed on fresh episodes.
5. ``train``: ``ExperienceSource`` (a ``ptl_rl.RecurrentActorCriticAgent``: one
   hidden state per sub-env, reset at episode starts) -> ``RolloutBuffer``
   (GAE, sequences); then the Trainer (``max_epochs`` = the rollouts the
   budget buys) with its callbacks, ``fit``, the final evaluation and the
   summary (written down by ``ptl_rl.examples.reporting``).
"""

from __future__ import annotations

import argparse
import datetime
import math
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from gymnasium import spaces
from torch import nn

import ptl_rl
from ptl_rl.examples import cli, reporting
from ptl_rl.examples.partial_obs import ENV_ID  # registers CartPoleNoVelocity-v1
from ptl_rl.examples.quiet import quiet_lightning
from ptl_rl.examples.r2d2 import FeedForwardCore

if TYPE_CHECKING:
    from lightning_fabric.utilities.data import AttributeDict
    from pytorch_lightning.utilities.types import OptimizerLRSchedulerConfig


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser(
        "recurrent_ppo", __doc__, default_env=ENV_ID, default_env_steps=100_000, budget_help=cli.ROLLOUT_BUDGET_HELP
    )
    p.set_defaults(num_envs=8, grad_clip=0.5, eval_every=5_000, final_eval_episodes=20)
    a = p.add_argument_group("recurrent PPO")
    a.add_argument("--core", choices=("lstm", "gru", "mlp"), default="lstm", help="recurrent cell (mlp: no memory)")
    a.add_argument(
        "--feed-forward", dest="core", action="store_const", const="mlp", help="the baseline: same as --core mlp"
    )
    a.add_argument("--hidden", type=int, default=64, help="width of each recurrent cell and of the layer after it")
    a.add_argument("--steps-per-env", type=int, default=32, help="transitions per sub-env per rollout (T)")
    a.add_argument(
        "--sequence-length",
        type=int,
        default=32,
        help="rows per training sequence (L); T or more: each env's whole rollout is one sequence",
    )
    a.add_argument("--update-epochs", type=int, default=20, help="passes over each rollout (K)")
    a.add_argument("--num-minibatches", type=int, default=1, help="minibatches (of whole sequences) per pass")
    a.add_argument("--gamma", type=float, default=0.98, help="discount factor")
    a.add_argument("--gae-lambda", type=float, default=0.8, help="lambda of GAE")
    a.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (annealed with --anneal)")
    a.add_argument("--anneal", action=argparse.BooleanOptionalAction, default=True, help="anneal lr and clip to 0")
    a.add_argument("--clip-coef", type=float, default=0.2, help="clip range of the probability ratio")
    a.add_argument("--ent-coef", type=float, default=0.0, help="weight of the entropy bonus")
    a.add_argument("--vf-coef", type=float, default=0.5, help="weight of the value loss (a mean squared error)")
    args = cli.parse(p, argv, (spaces.Discrete, spaces.MultiDiscrete, spaces.Box), "recurrent PPO")[0]
    for flag in ("hidden", "steps_per_env", "sequence_length", "update_epochs", "num_minibatches"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    return args


# ---------------------------------------------------------------------------- network
class Scale(nn.Module):
    """obs * (1 / bound): CartPole's pole angle (about +-0.2 rad) would else be a small input."""

    inverse: torch.Tensor

    def __init__(self, bound: list[float]) -> None:
        super().__init__()
        self.register_buffer("inverse", 1.0 / torch.tensor(bound, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float() * self.inverse


class TwinCore(nn.Module):
    """Two cells side by side, one for the policy and one for the value (sb3-contrib's ``enable_critic_lstm``).

    The same interface as ``ptl_rl.RecurrentCore``: the state is the two cells' states side by side
    ``[B, S_pi + S_v]`` and the output their outputs ``[B, 2H]``, the policy's first. Separate memories keep the
    value's large regression gradients out of the policy's cell.
    """

    def __init__(self, make_cell: Any) -> None:
        super().__init__()
        self.pi, self.vf = make_cell(), make_cell()
        self.split = int(self.pi.state_size)
        self.state_size = self.split + int(self.vf.state_size)

    def initial_state(self, batch_size: int) -> torch.Tensor:
        return torch.cat([self.pi.initial_state(batch_size), self.vf.initial_state(batch_size)], dim=1)

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out_pi, state_pi = self.pi.step(x, state[:, : self.split])
        out_vf, state_vf = self.vf.step(x, state[:, self.split :])
        return torch.cat([out_pi, out_vf], dim=-1), torch.cat([state_pi, state_vf], dim=-1)

    def forward(
        self, x: torch.Tensor, state: torch.Tensor, mask: Any = None, reset: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out_pi, states_pi = self.pi(x, state[:, : self.split], mask, reset)
        out_vf, states_vf = self.vf(x, state[:, self.split :], mask, reset)
        return torch.cat([out_pi, out_vf], dim=-1), torch.cat([states_pi, states_vf], dim=-1)


class Half(nn.Module):
    """The policy's (first) or the value's (second) half of a ``TwinCore`` output [..., 2H]."""

    def __init__(self, hidden: int, second: bool) -> None:
        super().__init__()
        self.part = slice(hidden, 2 * hidden) if second else slice(0, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., self.part]


def network(
    obs_bound: list[float], action_space: gym.Space[Any], hidden: int, core: str
) -> ptl_rl.RecurrentActorCritic:
    """Scaled obs -> a policy cell and a value cell (LSTM/GRU, or ReLU layers) -> one ReLU layer each -> the heads.

    rl-baselines3-zoo's RecurrentPPO network for CartPole without velocities: LSTM(64) per head, then
    ``pi=[64]``, ``vf=[64]`` with ReLU, default (not orthogonal) initialization.
    """
    size = len(obs_bound)

    def make_cell() -> nn.Module:
        return FeedForwardCore(size, hidden) if core == "mlp" else ptl_rl.RecurrentCore(size, hidden, core)

    policy = nn.Sequential(
        Half(hidden, second=False), nn.Linear(hidden, hidden), nn.ReLU(), ptl_rl.action_head(action_space, hidden)
    )
    value = nn.Sequential(Half(hidden, second=True), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    return ptl_rl.RecurrentActorCritic(Scale(obs_bound), TwinCore(make_cell), policy, value)


# ---------------------------------------------------------------------------- learner
class RecurrentPPO(pl.LightningModule):
    hparams: AttributeDict  # what save_hyperparameters() makes it

    def __init__(
        self, obs_bound: list[float], action_space: gym.Space[Any], args: argparse.Namespace, num_rollouts: int
    ) -> None:
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.num_rollouts = num_rollouts
        self.batches_per_rollout = args.update_epochs * args.num_minibatches
        self.net = network(obs_bound, action_space, args.hidden, args.core)
        self.automatic_optimization = False  # training_step takes its gradient step itself
        # the agent acts with this very network (its own per-env states): each rollout uses the current weights
        self.agent = ptl_rl.RecurrentActorCriticAgent(self.net, action_space, seed=args.seed)

    def progress(self) -> float:
        """Fraction of the run's rollouts done (one Lightning epoch per rollout)."""
        return min(self.current_epoch / self.num_rollouts, 1.0)

    def training_step(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> torch.Tensor:
        loss = self.ppo_loss(batch, batch_idx)
        optimizer: Any = self.optimizers()  # configure_optimizers' one, as Lightning wraps it
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if self.hparams.grad_clip:  # by hand: Lightning's gradient_clip_val is for automatic optimization
            self.clip_gradients(optimizer, gradient_clip_val=self.hparams.grad_clip, gradient_clip_algorithm="norm")
        optimizer.step()
        return loss.detach()

    def on_train_epoch_end(self) -> None:
        scheduler = self.lr_schedulers()
        assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
        scheduler.step()  # one epoch per rollout

    def ppo_loss(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> torch.Tensor:
        """The clipped-surrogate loss over the real rows of a sequence minibatch (+ value loss, - entropy bonus)."""
        hp = self.hparams
        # every sequence re-run from its stored initial state, the state zeroed where the agent's was
        log_prob, entropy, value = self.agent.evaluate_sequences(batch)
        mask = batch.mask.float()
        rows = mask.sum()

        def mean(x: torch.Tensor) -> torch.Tensor:  # over the real rows only: padding repeats rows
            mean: torch.Tensor = (x * mask).sum() / rows
            return mean

        log_ratio = log_prob - batch.log_prob
        ratio = log_ratio.exp()
        clip = hp.clip_coef * (1.0 - self.progress()) if hp.anneal else hp.clip_coef
        pg_loss = mean(torch.max(-batch.advantage * ratio, -batch.advantage * ratio.clamp(1 - clip, 1 + clip)))
        v_loss = mean((value - batch.returns).square())
        loss: torch.Tensor = pg_loss + hp.vf_coef * v_loss - hp.ent_coef * mean(entropy)
        if (batch_idx + 1) % self.batches_per_rollout == 0:  # after a rollout's last update
            with torch.no_grad():
                approx_kl = mean((ratio - 1) - log_ratio)
            self.log_dict(
                {"train/pg_loss": pg_loss, "train/v_loss": v_loss, "train/entropy": mean(entropy),
                 "train/approx_kl": approx_kl},
                on_step=True, on_epoch=False,
            )  # fmt: skip
        return loss

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, eps=1e-5)
        anneal = self.hparams.anneal
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda rollout: 1.0 - min(rollout / self.num_rollouts, 1.0) if anneal else 1.0
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "epoch"}}


# ---------------------------------------------------------------------------- evaluation
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def greedy_agent(net: nn.Module, action_space: gym.Space[Any]) -> ptl_rl.RecurrentActorCriticAgent:
    """The policy's mode with a fresh agent on the same network: its per-env states are its own."""
    return ptl_rl.RecurrentActorCriticAgent(net, action_space, greedy=True)


class Evaluation(pl.Callback):
    """Every ``--eval-every`` env steps, after a rollout's last update, the greedy policy plays ``--eval-episodes``.

    Once their mean return reaches ``--solved-return``, ``--confirm-episodes`` episodes from start states no
    evaluation has used must reach it too, and only then does training stop, at a rollout boundary: a policy
    that crossed by luck of the start states keeps training. ``run`` plays and records each evaluation.
    """

    def __init__(self, args: argparse.Namespace, run: reporting.Run, rollout: ptl_rl.RolloutBuffer, env: Any) -> None:
        self.args, self.run, self.rollout, self.env = args, run, rollout, env
        self.source = ptl_rl.find_stage(rollout, ptl_rl.ExperienceSource)
        self.next_eval = args.eval_every

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        args, steps = self.args, self.source.total_steps
        if (idx + 1) % self.rollout.batches_per_rollout or steps < self.next_eval:
            return  # (a rollout's updates are all done only after its last batch)
        self.next_eval = steps - steps % args.eval_every + args.eval_every
        agent = greedy_agent(pl_module.net, self.env.single_action_space)
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
    assert isinstance(obs_space, spaces.Box)  # cli.parse checked
    # the observation space's finite bounds scale the inputs (CartPole: position 4.8, angle 0.418 rad)
    obs_bound = [float(h) if np.isfinite(h) and h > 0 else 1.0 for h in obs_space.high.reshape(-1)]
    # --env-steps rounded up to whole rollouts, each trained in full (--help says so)
    num_rollouts = max(1, math.ceil(args.env_steps / (args.num_envs * args.steps_per_env)))
    model = RecurrentPPO(obs_bound, action_space, args, num_rollouts)

    # ExperienceSource (one hidden state per sub-env, stored per step as `hidden`) -> RolloutBuffer (GAE, sequences)
    source = ptl_rl.ExperienceSource(env, model.agent, gamma=args.gamma, seed=args.seed)
    rollout = ptl_rl.RolloutBuffer(
        source,
        args.steps_per_env,
        epochs=args.update_epochs,
        num_minibatches=args.num_minibatches,
        gae_lambda=args.gae_lambda,
        sequence_length=args.sequence_length,
        seed=args.seed,
    )
    # one Lightning epoch = one rollout; a sized loader also keeps Lightning from prefetching a stale batch
    loader = ptl_rl.to_dataloader(rollout, steps_per_epoch=rollout.batches_per_rollout)

    # ---------------------------------------------------------------------------- the Trainer
    run = reporting.Run(
        "recurrent_ppo",
        args,
        model,
        source,
        config={
            "obs_bound": obs_bound,
            "num_rollouts": num_rollouts,
            "parameters": sum(p.numel() for p in model.net.parameters()),
            "anneal_schedule": f"lr and clip linear to 0 over {num_rollouts} rollouts" if args.anneal else None,
        },
    )
    log_every = rollout.batches_per_rollout  # once per rollout
    callbacks: list[pl.Callback] = [run, ptl_rl.EpisodeStatsLogger(rollout, every_n_steps=log_every)]
    if args.eval_every:
        callbacks.append(Evaluation(args, run, rollout, make_env(args.env_id, args.eval_episodes)))
    if args.video_every:  # greedy episodes filmed in an env of their own, into <run directory>/videos/
        video_env = gym.make(args.env_id, render_mode="rgb_array")
        callbacks.append(run.video(rollout, video_env, lambda module: greedy_agent(module.net, action_space)))
    if args.progress_bar:
        callbacks.append(reporting.EnvStepsProgressBar(source, refresh_rate=log_every))
    with quiet_lightning():  # Lightning's lines that ask nothing of the user (no GPU here, ...)
        trainer = pl.Trainer(
            accelerator=args.accelerator,
            devices=1,
            max_epochs=num_rollouts,  # the budget: the run ends after the last update of the last rollout
            max_time=datetime.timedelta(seconds=args.time_limit) if args.time_limit else None,
            logger=run.loggers or False,
            log_every_n_steps=log_every,
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
        run.evaluate("final", final_env, greedy_agent(model.cpu().net, action_space), args.final_eval_episodes)
        final_env.close()
    summary = run.finish(
        trainer,
        rollouts=rollout.rollouts_collected,  # env_steps: those taken, in whole rollouts
        env_steps_budget=args.env_steps,
        env_steps_per_rollout=args.num_envs * args.steps_per_env,
    )
    print(reporting.summary_line(summary))
    return summary


if __name__ == "__main__":
    train(parse_args())

"""A2C (synchronous advantage actor-critic) as a LightningModule, fed by a ptl_rl on-policy pipeline.

    python -m ptl_rl.examples.a2c --env-id CartPole-v1 --env-steps 500000 --seed 0

Read it top to bottom, CleanRL style:

1. ``parse_args``: every hyperparameter is a flag (the shared ones, and the
   env check, come from ``ptl_rl.examples.cli``); the defaults are
   rl-baselines3-zoo's A2C for CartPole-v1 (8 envs, 5-step rollouts, RMSprop,
   no advantage normalization, lambda 1: n-step returns bootstrapped by the
   critic, gradient norm clipped to 0.5).
2. ``actor_critic``: separate MLPs for the policy and the value.
3. ``A2C``: the LightningModule. Each ``training_step`` gets a whole rollout
   (``RolloutBuffer`` with one epoch of one minibatch) and takes one
   policy-gradient + value-regression step. A Lightning epoch here spans
   ``--rollouts-per-epoch`` rollouts (a multiple of the rollout length is all
   the DataLoader needs, and per-epoch overhead stays small).
4. ``Evaluation``: every ``--eval-every`` env steps the greedy policy plays on
   a separate env, and training stops once its mean return reaches
   ``--solved-return`` and fresh episodes confirm it (the env-step count then
   is "steps to 475").
5. ``train``: the vector env, the ``ActorCriticAgent`` and the pipeline
   ``ExperienceSource -> RolloutBuffer``; then the Trainer (``max_steps`` = the
   rollouts the budget buys, one gradient step each) with its callbacks,
   ``fit``, the final evaluation on fresh episodes and the summary (written
   down by ``ptl_rl.examples.reporting``).
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
from ptl_rl.examples.quiet import quiet_lightning

if TYPE_CHECKING:
    from lightning_fabric.utilities.data import AttributeDict


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser(
        "a2c", __doc__, default_env="CartPole-v1", default_env_steps=500_000, budget_help=cli.ROLLOUT_BUDGET_HELP
    )
    p.set_defaults(num_envs=8, grad_clip=0.5)
    a = p.add_argument_group("A2C")
    a.add_argument("--steps-per-env", type=int, default=5, help="transitions per sub-env per rollout (the n)")
    a.add_argument("--rollouts-per-epoch", type=int, default=100, help="rollouts (gradient steps) per Lightning epoch")
    a.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    a.add_argument("--gae-lambda", type=float, default=1.0, help="1.0: plain bootstrapped n-step returns")
    a.add_argument("--lr", type=float, default=7e-4, help="RMSprop learning rate")
    a.add_argument("--ent-coef", type=float, default=0.0, help="weight of the entropy bonus")
    a.add_argument("--vf-coef", type=float, default=0.5, help="weight of the value loss")
    a.add_argument(
        "--norm-adv", default="none", choices=["minibatch", "rollout", "none"], help="advantage normalization"
    )
    a.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers")
    # a mistyped or unsuitable env ends here, with the usage line and the reason
    box_or_discrete = (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)
    return cli.parse(p, argv, box_or_discrete, "A2C")[0]


# ---------------------------------------------------------------------------- networks
def layer_init(layer: nn.Linear, gain: float = np.sqrt(2)) -> nn.Linear:
    """Orthogonal weights, zero bias (as SB3's A2C)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(in_features: int, hidden: int) -> nn.Sequential:
    """obs float [B, in_features] -> features float [B, hidden], two tanh layers."""
    return nn.Sequential(
        nn.Flatten(),
        layer_init(nn.Linear(in_features, hidden)),
        nn.Tanh(),
        layer_init(nn.Linear(hidden, hidden)),
        nn.Tanh(),
    )


def actor_critic(obs_dim: int, action_space: gym.Space[Any], hidden: int) -> tuple[nn.Module, nn.Module]:
    """The policy (obs -> action distribution) and the value (obs -> float [B, 1]) networks."""
    actor = nn.Sequential(mlp(obs_dim, hidden), ptl_rl.action_head(action_space, hidden))
    critic = nn.Sequential(mlp(obs_dim, hidden), layer_init(nn.Linear(hidden, 1), gain=1.0))
    return actor, critic


# ---------------------------------------------------------------------------- learner
class A2C(pl.LightningModule):
    hparams: AttributeDict  # what save_hyperparameters() makes it (Lightning's property is typed wider)

    def __init__(self, obs_dim: int, action_space: gym.Space[Any], args: argparse.Namespace) -> None:
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.actor, self.critic = actor_critic(obs_dim, action_space, args.hidden)
        # the agent acts in the envs with these very modules: each rollout uses the current weights
        self.agent = ptl_rl.ActorCriticAgent(self.actor, self.critic, action_space, seed=args.seed)

    def training_step(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> torch.Tensor:
        hp = self.hparams
        log_prob, entropy, value = self.agent.evaluate_actions(batch)
        # the data is from these very weights, so no importance ratio: plain policy gradient
        pg_loss = -(batch.advantage * log_prob).mean()
        v_loss = 0.5 * (value - batch.returns).square().mean()  # returns: critic-bootstrapped n-step returns
        loss: torch.Tensor = pg_loss + hp.vf_coef * v_loss - hp.ent_coef * entropy.mean()
        if (batch_idx + 1) % hp.log_every == 0:  # each self.log call costs about 0.5 ms
            self.log_dict(
                {"train/pg_loss": pg_loss, "train/v_loss": v_loss, "train/entropy": entropy.mean()},
                on_step=True,
                on_epoch=False,
            )
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(self.parameters(), lr=self.hparams.lr, alpha=0.99, eps=1e-5)


# ---------------------------------------------------------------------------- evaluation
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def greedy_agent(actor: nn.Module, action_space: gym.Space[Any]) -> ptl_rl.StochasticPolicyAgent:
    """The policy's mode (argmax / Gaussian mean)."""
    return ptl_rl.StochasticPolicyAgent(actor, action_space, greedy=True)


class Evaluation(pl.Callback):
    """Every ``--eval-every`` env steps the greedy policy plays ``--eval-episodes`` episodes in ``env``.

    Once their mean return reaches ``--solved-return``, ``--confirm-episodes`` episodes from start states no
    evaluation has used must reach it too, and only then does training stop (the env-step count then is
    "steps to 475" on CartPole): a policy that crossed by luck of the start states keeps training. Each batch
    is a whole rollout, so every batch end is a rollout boundary. ``run`` plays and records each evaluation.
    """

    def __init__(self, args: argparse.Namespace, run: reporting.Run, source: ptl_rl.ExperienceSource, env: Any) -> None:
        self.args, self.run, self.source, self.env = args, run, source, env
        self.next_eval = args.eval_every

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *unused: Any) -> None:
        args, steps = self.args, self.source.total_steps
        if steps < self.next_eval:
            return
        self.next_eval = steps - steps % args.eval_every + args.eval_every
        agent = greedy_agent(pl_module.actor, self.env.single_action_space)
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
    obs_dim = int(np.prod(obs_space.shape))
    model = A2C(obs_dim, action_space, args)

    # ExperienceSource -> RolloutBuffer: 5 steps per env, returns and advantages, the rollout as one batch
    source = ptl_rl.ExperienceSource(env, model.agent, gamma=args.gamma, seed=args.seed)
    rollout = ptl_rl.RolloutBuffer(
        source,
        args.steps_per_env,
        epochs=1,
        num_minibatches=1,
        gae_lambda=args.gae_lambda,
        normalize_advantage=None if args.norm_adv == "none" else args.norm_adv,
        seed=args.seed,
    )
    # an epoch of --rollouts-per-epoch rollouts; sized, so Lightning never prefetches a batch of stale weights
    loader = ptl_rl.to_dataloader(rollout, steps_per_epoch=args.rollouts_per_epoch)
    # --env-steps rounded up to whole rollouts (--help says so); one gradient step per rollout
    num_rollouts = max(1, math.ceil(args.env_steps / (args.num_envs * args.steps_per_env)))

    # ---------------------------------------------------------------------------- the Trainer
    run = reporting.Run("a2c", args, model, source, config={"obs_dim": obs_dim, "action_space": str(action_space)})
    callbacks: list[pl.Callback] = [run, ptl_rl.EpisodeStatsLogger(rollout, every_n_steps=args.log_every)]
    if args.eval_every:
        callbacks.append(Evaluation(args, run, source, make_env(args.env_id, args.eval_episodes)))
    if args.video_every:  # greedy episodes filmed in an env of their own, into <run directory>/videos/
        video_env = gym.make(args.env_id, render_mode="rgb_array")
        callbacks.append(run.video(rollout, video_env, lambda module: greedy_agent(module.actor, action_space)))
    if args.progress_bar:
        callbacks.append(reporting.EnvStepsProgressBar(source, refresh_rate=args.log_every))
    with quiet_lightning():  # Lightning's lines that ask nothing of the user (no GPU here, ...)
        trainer = pl.Trainer(
            accelerator=args.accelerator,
            devices=1,
            max_epochs=-1,
            max_steps=num_rollouts,  # the budget: one optimizer step per rollout
            max_time=datetime.timedelta(seconds=args.time_limit) if args.time_limit else None,
            gradient_clip_val=args.grad_clip,  # A2C optimizes automatically: Lightning clips
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
        run.evaluate("final", final_env, greedy_agent(model.cpu().actor, action_space), args.final_eval_episodes)
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

"""A2C (synchronous advantage actor-critic) as a LightningModule, fed by a ptl_rl on-policy pipeline.

    python -m ptl_rl.examples.a2c --env-id CartPole-v1 --env-steps 500000 --seed 0

Read it top to bottom, CleanRL style:

1. ``parse_args``: every hyperparameter is a flag (the shared ones come from
   ``ptl_rl.examples.cli``, parsed before torch is imported); the defaults are
   rl-baselines3-zoo's A2C for CartPole-v1 (8 envs, 5-step rollouts, RMSprop,
   no advantage normalization, lambda 1: n-step returns bootstrapped by the
   critic, gradient norm clipped to 0.5).
2. ``actor_critic``: separate MLPs for the policy and the value.
3. ``A2C``: the LightningModule. Each ``training_step`` gets a whole rollout
   (``RolloutBuffer`` with one epoch of one minibatch) and takes one
   policy-gradient + value-regression step. A Lightning epoch here spans
   ``--rollouts-per-epoch`` rollouts (a multiple of the rollout length is all
   the DataLoader needs, and per-epoch overhead stays small).
4. ``train``: builds the vector env, the ``ActorCriticAgent`` and the pipeline
   ``ExperienceSource -> RolloutBuffer``, and hands them to
   ``ptl_rl.examples.harness.run``: every ``--eval-every`` env steps the greedy
   policy plays on a separate env, and training stops once its mean return
   reaches ``--solved-return`` and fresh episodes confirm it (the env-step count
   then is "steps to 475"); then the final evaluation and the run directory.
"""

# ruff: noqa: E402 - torch, Lightning and ptl_rl's stages are imported after parse_args on purpose (see below)
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from gymnasium import spaces

from ptl_rl.examples import cli


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
    # fails here, with the usage line, for a mistyped or unsuitable env: before the imports below
    box_or_discrete = (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)
    return cli.parse(p, argv, box_or_discrete, "A2C")[0]


if __name__ == "__main__":
    ARGS = parse_args()  # --help and argument errors end here, in about a second

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn

import ptl_rl
from ptl_rl.examples import harness

if TYPE_CHECKING:
    from lightning_fabric.utilities.data import AttributeDict


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


def actor_critic(obs_dim: int, action_space: gym.Space, hidden: int) -> tuple[nn.Module, nn.Module]:
    """The policy (obs -> action distribution) and the value (obs -> float [B, 1]) networks."""
    actor = nn.Sequential(mlp(obs_dim, hidden), ptl_rl.action_head(action_space, hidden))
    critic = nn.Sequential(mlp(obs_dim, hidden), layer_init(nn.Linear(hidden, 1), gain=1.0))
    return actor, critic


# ---------------------------------------------------------------------------- learner
class A2C(pl.LightningModule):
    hparams: AttributeDict  # what save_hyperparameters() makes it (Lightning's property is typed wider)

    def __init__(self, obs_dim: int, action_space: gym.Space, args: argparse.Namespace) -> None:
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
        loss = pg_loss + hp.vf_coef * v_loss - hp.ent_coef * entropy.mean()
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


def greedy_agent(actor: nn.Module, env: gym.vector.VectorEnv) -> ptl_rl.StochasticPolicyAgent:
    """The policy's mode (argmax / Gaussian mean)."""
    return ptl_rl.StochasticPolicyAgent(actor, env.single_action_space, greedy=True)


# ---------------------------------------------------------------------------- training
def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, then evaluate the final weights; returns the run's summary (see ``harness.run``)."""
    harness.set_up(args)
    env = make_env(args.env_id, args.num_envs)
    obs_dim = harness.flat_size(env.single_observation_space)
    model = A2C(obs_dim, env.single_action_space, args)

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
    # an epoch length that is a multiple of batches_per_rollout (= 1 here); sized, so Lightning never prefetches
    loader = ptl_rl.to_dataloader(rollout, steps_per_epoch=args.rollouts_per_epoch * rollout.batches_per_rollout)
    return harness.run(
        harness.Experiment(
            "a2c",
            args,
            model,
            rollout,
            loader,
            make_env=lambda n: make_env(args.env_id, n),
            greedy_agent=lambda module: greedy_agent(module.actor, env),
            config={"obs_dim": obs_dim, "action_space": str(env.single_action_space)},
            max_rollouts=harness.rollouts_for(args.env_steps, args.num_envs, args.steps_per_env),  # rounded up
        )
    )


def main(argv: list[str] | argparse.Namespace | None = None) -> dict[str, Any]:
    """Parse ``argv`` (or take parsed args), train, print a one-line report; returns the summary."""
    args = argv if isinstance(argv, argparse.Namespace) else parse_args(argv)
    summary = train(args)
    print(harness.report(summary))
    return summary


if __name__ == "__main__":
    main(ARGS)

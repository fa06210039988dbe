"""A2C (synchronous advantage actor-critic) as a LightningModule, fed by a ptl_rl on-policy pipeline.

    python -m ptl_rl.examples.a2c --env-id CartPole-v1 --env-steps 500000 --seed 0

Read it top to bottom, CleanRL style:

1. ``parse_args``: every hyperparameter is a flag; the defaults are
   rl-baselines3-zoo's A2C for CartPole-v1 (8 envs, 5-step rollouts, RMSprop,
   no advantage normalization, lambda 1: n-step returns bootstrapped by the critic).
2. ``actor_critic``: separate MLPs for the policy and the value.
3. ``A2C``: the LightningModule. Each ``training_step`` gets a whole rollout
   (``RolloutBuffer`` with one epoch of one minibatch) and takes one
   policy-gradient + value-regression step. A Lightning epoch here spans
   ``--rollouts-per-epoch`` rollouts (a multiple of the rollout length is all
   the DataLoader needs, and per-epoch overhead stays small).
4. ``ptl_rl.PeriodicEvaluation`` (a callback): every ``--eval-every`` env steps, run the greedy
   policy on a separate env; stop once its mean return reaches ``--solved-return``
   (the env-step count at that point is "steps to 475").
5. ``train``: builds the vector env, the ``ActorCriticAgent`` and the pipeline
   ``ExperienceSource -> RolloutBuffer``, fits, and evaluates the final weights.
"""

from __future__ import annotations

import argparse
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


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    # run
    p.add_argument("--env-id", default="CartPole-v1", help="gymnasium id (Discrete, MultiDiscrete or 1-d Box actions)")
    p.add_argument("--env-steps", type=int, default=500_000, help="budget of environment steps (all sub-envs together)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=8, help="sub-envs of the training vector env")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (torch.set_num_threads)")
    p.add_argument("--accelerator", default="cpu", help="Lightning accelerator; a small MLP is fastest on the CPU")
    p.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--log-dir", default="", help="write metrics with a CSVLogger there (empty: no logger)")
    p.add_argument("--log-every", type=int, default=100, help="gradient steps between logged metrics")
    # algorithm
    p.add_argument("--steps-per-env", type=int, default=5, help="transitions per sub-env per rollout (the n)")
    p.add_argument("--rollouts-per-epoch", type=int, default=100, help="rollouts (gradient steps) per Lightning epoch")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=1.0, help="1.0: plain bootstrapped n-step returns")
    p.add_argument("--lr", type=float, default=7e-4)
    p.add_argument("--ent-coef", type=float, default=0.0)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--norm-adv", default="none", choices=["minibatch", "rollout", "none"])
    p.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers")
    # evaluation
    p.add_argument("--eval-every", type=int, default=5_000, help="env steps between greedy evaluations (0: never)")
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--solved-return", type=float, default=475.0, help="stop once the greedy mean return reaches it")
    p.add_argument("--final-eval-episodes", type=int, default=100)
    args = p.parse_args(argv)
    # fail here, with the usage line, rather than with a traceback after the setup
    check_env(p, args.env_id, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box), "A2C")
    return args


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
    """Train, then evaluate the final weights; returns the run's summary."""
    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)

    env = make_env(args.env_id, args.num_envs)
    eval_env = make_env(args.env_id, args.eval_episodes)
    obs_dim = int(np.prod(env.single_observation_space.shape))
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

    evaluation = ptl_rl.PeriodicEvaluation(
        rollout,
        eval_env,
        lambda module: greedy_agent(module.actor, eval_env),
        every_env_steps=args.eval_every,
        episodes=args.eval_episodes,
        stop_at_return=args.solved_return,
        seed=args.seed + 10_000,
    )
    callbacks: list[pl.Callback] = [
        ptl_rl.EpisodeStatsLogger(rollout, every_n_steps=args.log_every),
        ptl_rl.EnvStepLimit(rollout, args.env_steps),
        evaluation,
    ]
    if args.progress_bar:
        callbacks.append(TQDMProgressBar(refresh_rate=args.log_every))
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_epochs=-1,
        gradient_clip_val=args.max_grad_norm,
        logger=CSVLogger(args.log_dir, name=f"a2c_{args.env_id}_{args.seed}") if args.log_dir else False,
        log_every_n_steps=args.log_every,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=args.progress_bar,
        callbacks=callbacks,
    )
    trainer.fit(model, train_dataloaders=loader)
    train_time = time.perf_counter() - start

    final_env = make_env(args.env_id, args.final_eval_episodes)
    final_agent = greedy_agent(model.actor.cpu(), final_env)
    final_return = float(
        ptl_rl.evaluate(final_env, final_agent, args.final_eval_episodes, seed=args.seed + 1_000_000).mean()
    )
    for e in (env, eval_env, final_env):
        e.close()
    return {
        "final_eval_return": final_return,
        "env_steps": source.total_steps,
        "gradient_steps": trainer.global_step,
        "solved_at_env_steps": evaluation.solved_at,
        "solved_after_s": evaluation.solved_after_s,
        "eval_history": evaluation.history,
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = train(args)
    solved = result["solved_at_env_steps"]
    print(
        f"{args.env_id} seed {args.seed}: "
        + (f"solved at {solved} env steps ({result['solved_after_s']:.1f} s)" if solved is not None else "not solved")
        + f"; final greedy return {result['final_eval_return']:.1f} over {args.final_eval_episodes} fresh episodes; "
        f"{result['env_steps']} env steps, {result['gradient_steps']} gradient steps, {result['wall_time_s']:.1f} s"
    )
    return result


if __name__ == "__main__":
    main()

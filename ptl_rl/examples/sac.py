"""SAC (soft actor-critic, twin Q, automatic entropy tuning) as a LightningModule, fed by a ptl_rl replay pipeline.

    python -m ptl_rl.examples.sac --env-id Pendulum-v1 --env-steps 20000 --seed 0

Read it top to bottom, CleanRL style:

1. ``parse_args``: every hyperparameter is a flag; the defaults solve Pendulum-v1.
2. Networks: a tanh-squashed Gaussian policy (``ptl_rl.action_head(...,
   squashed=True)``) acting in policy space ``[-1, 1]``, and twin Q-networks
   ``Q(obs, policy_action)``. The agent maps policy actions to the env's
   bounds (``ptl_rl.ActionRescaler``) and keeps the policy action as the
   ``policy_action`` extra, which is what the critics learn on.
3. ``SAC``: the LightningModule, with manual optimization (three optimizers:
   critics, actor, entropy temperature). Each ``training_step`` regresses both
   critics onto ``reward + discount * (1 - terminated) * (min Q_target(next) -
   alpha * log pi(next))``, then improves the actor and tunes ``alpha`` toward
   the target entropy, then Polyak-averages the target critics with
   ``ptl_rl.TargetNet.soft_sync``.
4. ``ptl_rl.PeriodicEvaluation`` (a callback): every ``--eval-every`` env steps, run the policy's
   mean action on a separate env; stop once its mean return reaches ``--solved-return``.
5. ``train``: builds the env, the agent (uniform random actions for the first
   ``--learning-starts`` steps) and the pipeline ``ExperienceSource ->
   ReplayBuffer -> BatchSampler`` (one gradient step per env step), fits, and
   evaluates the final weights on fresh episodes.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
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
    p.add_argument("--env-id", default="Pendulum-v1", help="gymnasium id of an env with a 1-d Box action space")
    p.add_argument("--env-steps", type=int, default=20_000, help="budget of environment steps (all sub-envs together)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=1, help="sub-envs of the training vector env")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (torch.set_num_threads)")
    p.add_argument("--accelerator", default="cpu", help="Lightning accelerator; a small MLP is fastest on the CPU")
    p.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--log-dir", default="", help="write metrics with a CSVLogger there (empty: no logger)")
    p.add_argument("--log-every", type=int, default=500, help="gradient steps between logged metrics")
    # algorithm
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--tau", type=float, default=0.005, help="Polyak rate of the target critics")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--buffer-size", type=int, default=100_000)
    p.add_argument("--learning-starts", type=int, default=1_000, help="uniformly random env steps before learning")
    p.add_argument("--train-every", type=int, default=1, help="env steps collected per gradient step")
    p.add_argument("--policy-lr", type=float, default=1e-3)
    p.add_argument("--q-lr", type=float, default=1e-3)
    p.add_argument("--alpha-lr", type=float, default=1e-3)
    p.add_argument("--policy-frequency", type=int, default=1, help="critic steps per actor (and alpha) step")
    p.add_argument("--autotune", action=argparse.BooleanOptionalAction, default=True, help="tune the temperature")
    p.add_argument("--alpha", type=float, default=0.2, help="initial (or, without --autotune, fixed) temperature")
    p.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers")
    # evaluation
    p.add_argument("--eval-every", type=int, default=2_000, help="env steps between greedy evaluations (0: never)")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--solved-return", type=float, default=-200.0, help="stop once the greedy mean return reaches it")
    p.add_argument("--final-eval-episodes", type=int, default=100)
    args = p.parse_args(argv)
    # fail here, with the usage line, rather than with a traceback after the setup
    check_env(p, args.env_id, (gym.spaces.Box,), "SAC")
    return args


# ---------------------------------------------------------------------------- networks
def mlp(in_features: int, hidden: int) -> nn.Sequential:
    """float [B, in_features] -> features float [B, hidden], two ReLU layers."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())


class TwinQ(nn.Module):
    """(obs float [B, obs_dim], policy action float [B, act_dim]) -> (q1, q2), each float [B]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int) -> None:
        super().__init__()
        self.q1 = nn.Sequential(mlp(obs_dim + act_dim, hidden), nn.Linear(hidden, 1))
        self.q2 = nn.Sequential(mlp(obs_dim + act_dim, hidden), nn.Linear(hidden, 1))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs.flatten(1).float(), action], dim=1)
        return self.q1(x).squeeze(1), self.q2(x).squeeze(1)


# ---------------------------------------------------------------------------- learner
class SAC(pl.LightningModule):
    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, args: argparse.Namespace) -> None:
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.automatic_optimization = False  # three optimizers, stepped in a fixed order
        act_dim = int(np.prod(action_space.shape))
        head = ptl_rl.action_head(action_space, args.hidden, squashed=True)
        self.actor = nn.Sequential(mlp(obs_dim, args.hidden), head)
        self.q = TwinQ(obs_dim, act_dim, args.hidden)
        self.q_target = ptl_rl.TargetNet(self.q)
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(args.alpha))), requires_grad=args.autotune)
        self.target_entropy = -float(act_dim)
        # acts with self.actor: uniform random policy actions for the first learning_starts env steps
        self.agent = ptl_rl.StochasticPolicyAgent(
            self.actor, action_space, warmup_steps=args.learning_starts, seed=args.seed
        )

    def training_step(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> None:
        hp = self.hparams
        q_opt, actor_opt, alpha_opt = self.optimizers()
        alpha = self.log_alpha.exp().detach()

        # critics: soft Bellman target from the target critics; discount and terminated come with the batch
        with torch.no_grad():
            next_action, next_log_prob = self.actor(batch.next_obs).rsample_with_log_prob()
            next_q = torch.min(*self.q_target(batch.next_obs, next_action)) - alpha * next_log_prob
            target = batch.reward + batch.discount * (1.0 - batch.terminated.float()) * next_q
        q1, q2 = self.q(batch.obs, batch.policy_action)  # the critics learn on policy-space actions
        q_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        q_opt.zero_grad()
        self.manual_backward(q_loss)
        q_opt.step()

        if batch_idx % hp.policy_frequency == 0:
            # actor: maximize min Q + alpha * entropy through the reparameterized sample
            action, log_prob = self.actor(batch.obs).rsample_with_log_prob()
            actor_loss = (alpha * log_prob - torch.min(*self.q(batch.obs, action))).mean()
            actor_opt.zero_grad()
            self.manual_backward(actor_loss)
            actor_opt.step()
            if hp.autotune:
                # temperature: push the policy's entropy (-log_prob) toward target_entropy
                alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
                alpha_opt.zero_grad()
                self.manual_backward(alpha_loss)
                alpha_opt.step()

        self.q_target.soft_sync(hp.tau)
        if (batch_idx + 1) % hp.log_every == 0:  # each self.log call costs about 0.5 ms
            self.log_dict(
                {"train/q_loss": q_loss, "train/q_mean": q1.mean(), "train/alpha": alpha}, on_step=True, on_epoch=False
            )

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        hp = self.hparams
        # fused: one kernel for all parameters, much faster than the default on small CPU nets
        return [
            torch.optim.Adam(self.q.parameters(), lr=hp.q_lr, fused=True),
            torch.optim.Adam(self.actor.parameters(), lr=hp.policy_lr, fused=True),
            torch.optim.Adam([self.log_alpha], lr=hp.alpha_lr),
        ]


# ---------------------------------------------------------------------------- evaluation
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def greedy_agent(actor: nn.Module, env: gym.vector.VectorEnv) -> ptl_rl.StochasticPolicyAgent:
    """The policy's mean action, tanh(mu)."""
    return ptl_rl.StochasticPolicyAgent(actor, env.single_action_space, greedy=True)


# ---------------------------------------------------------------------------- training
def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, then evaluate the final weights; returns the run's summary."""
    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)

    env = make_env(args.env_id, args.num_envs)
    eval_env = make_env(args.env_id, args.eval_episodes)
    if not isinstance(env.single_action_space, gym.spaces.Box):
        raise ValueError(f"SAC needs a Box action space; {args.env_id} has {env.single_action_space}")
    obs_dim = int(np.prod(env.single_observation_space.shape))
    model = SAC(obs_dim, env.single_action_space, args)

    # ExperienceSource -> ReplayBuffer -> BatchSampler: one batch per --train-every env steps
    source = ptl_rl.ExperienceSource(env, model.agent, gamma=args.gamma, seed=args.seed)
    buffer = ptl_rl.ReplayBuffer(
        source,
        capacity=args.buffer_size,
        warmup=max(args.learning_starts, args.batch_size),
        transitions_per_yield=args.train_every,
        seed=args.seed,
    )
    pipeline = ptl_rl.BatchSampler(buffer, batch_size=args.batch_size)

    evaluation = ptl_rl.PeriodicEvaluation(
        pipeline,
        eval_env,
        lambda module: greedy_agent(module.actor, eval_env),
        every_env_steps=args.eval_every,
        episodes=args.eval_episodes,
        stop_at_return=args.solved_return,
        seed=args.seed + 10_000,
    )
    callbacks: list[pl.Callback] = [
        ptl_rl.EpisodeStatsLogger(pipeline, every_n_steps=args.log_every),
        ptl_rl.EnvStepLimit(pipeline, args.env_steps),
        evaluation,
    ]
    if args.progress_bar:
        callbacks.append(TQDMProgressBar(refresh_rate=args.log_every))
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_epochs=-1,  # the env-step budget ends training (manual optimization counts every optimizer's steps)
        logger=CSVLogger(args.log_dir, name=f"sac_{args.env_id}_{args.seed}") if args.log_dir else False,
        log_every_n_steps=args.log_every,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=args.progress_bar,
        callbacks=callbacks,
    )
    trainer.fit(model, train_dataloaders=ptl_rl.to_dataloader(pipeline, steps_per_epoch=1_000))
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
        f"{result['env_steps']} env steps, {result['wall_time_s']:.1f} s"
    )
    return result


if __name__ == "__main__":
    main()

"""PPO (clipped surrogate, GAE) as a LightningModule, fed by a ptl_rl on-policy pipeline.

    python -m ptl_rl.examples.ppo --env-id CartPole-v1 --env-steps 100000 --seed 0

Read it top to bottom, CleanRL style:

1. ``parse_args``: every hyperparameter is a flag (the shared ones, and the
   env check, come from ``ptl_rl.examples.cli``); the defaults solve CartPole-v1
   (they follow rl-baselines3-zoo's tuned PPO for it). Box action spaces work
   too (a diagonal Gaussian policy, or with ``--squashed`` a tanh-squashed
   one), e.g. ``--env-id Pendulum-v1``. For gymnasium's MuJoCo envs the
   defaults are CleanRL's ``ppo_continuous_action.py`` recipe plus observation
   and reward normalization (``MUJOCO_RECIPE``, ``--recipe``):
   ``python -m ptl_rl.examples.ppo --env-id Hopper-v5 --env-steps 1000000``.
2. ``actor_critic``: separate MLPs for the policy and the value, ending in the
   ``ptl_rl.action_head`` that fits the action space.
3. ``PPO``: the LightningModule. ``training_step`` gets a ``ptl_rl.TorchBatch``
   minibatch of a rollout, with the behaviour policy's ``log_prob`` and
   ``value`` and the rollout's GAE ``advantage`` and ``returns``, and takes one
   clipped-surrogate step. One Lightning epoch is one rollout: the
   ``RolloutBuffer`` yields ``--update-epochs x --num-minibatches`` minibatches
   of it, then collects the next rollout with the updated weights. The
   learning rate (and, with ``--anneal-clip``, the clip range) anneal linearly
   per rollout. ``--env-steps`` is rounded up to whole rollouts: every rollout
   collected gets all its updates, and the run ends at a rollout boundary.
4. ``Evaluation``: every ``--eval-every`` env steps, after a rollout's last
   update, the greedy policy plays in an env of its own; training stops once
   it reaches ``--solved-return`` and fresh episodes confirm it.
5. ``train``: the vector env, the ``ActorCriticAgent`` and the pipeline
   ``ExperienceSource [-> NormalizeObservations -> ScaleRewards] -> RolloutBuffer``;
   then the Trainer (``max_epochs`` = the rollouts the budget buys) with its
   callbacks, ``fit``, the final evaluation on fresh episodes and the summary
   (written down by ``ptl_rl.examples.reporting``).
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
    from pytorch_lightning.utilities.types import OptimizerLRSchedulerConfig

# ---------------------------------------------------------------------------- arguments
#: CleanRL's ppo_continuous_action.py (its MuJoCo recipe), plus this library's normalization stages: the defaults
#: for MuJoCo envs (--recipe auto), or for any env with --recipe mujoco. An explicit flag still wins.
MUJOCO_RECIPE: dict[str, Any] = {
    "num_envs": 1, "steps_per_env": 2048, "update_epochs": 10, "num_minibatches": 32, "lr": 3e-4,
    "anneal": True, "anneal_clip": False, "gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2, "ent_coef": 0.0,
    # CleanRL halves its clipped value loss: 0.5 * 0.5 on the squared error
    "vf_coef": 0.25, "clip_vloss": True, "grad_clip": 0.5, "norm_adv": "minibatch", "hidden": 64,
    "norm_obs": True, "norm_reward": True, "obs_clip": 10.0, "reward_clip": 10.0,
    # 1M steps of 1000-step episodes: periodic greedy evaluations would cost more than training; no early stop
    "eval_every": 0, "solved_return": float("inf"), "final_eval_episodes": 10,
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser(
        "ppo", __doc__, default_env="CartPole-v1", default_env_steps=100_000, budget_help=cli.ROLLOUT_BUDGET_HELP
    )
    p.set_defaults(num_envs=8, grad_clip=0.5)
    a = p.add_argument_group("PPO")
    a.add_argument(
        "--recipe",
        choices=["auto", "classic", "mujoco"],
        default="auto",
        help="defaults for the flags below: 'classic' (tuned on CartPole, rl-baselines3-zoo), 'mujoco' "
        "(CleanRL's ppo_continuous_action.py with observation and reward normalization), 'auto': mujoco for "
        "gymnasium's MuJoCo envs, else classic. Flags given explicitly override the recipe",
    )
    a.add_argument("--steps-per-env", type=int, default=32, help="transitions per sub-env per rollout (T)")
    a.add_argument("--update-epochs", type=int, default=20, help="passes over each rollout (K)")
    a.add_argument("--num-minibatches", type=int, default=1, help="minibatches per pass")
    a.add_argument("--gamma", type=float, default=0.98, help="discount factor")
    a.add_argument("--gae-lambda", type=float, default=0.8, help="lambda of GAE")
    a.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (annealed with --anneal)")
    a.add_argument("--anneal", action=argparse.BooleanOptionalAction, default=True, help="anneal lr linearly to 0")
    a.add_argument(
        "--anneal-clip", action=argparse.BooleanOptionalAction, default=True, help="also anneal the clip range"
    )
    a.add_argument("--clip-coef", type=float, default=0.2, help="clip range of the probability ratio")
    a.add_argument("--ent-coef", type=float, default=0.0, help="weight of the entropy bonus")
    a.add_argument("--vf-coef", type=float, default=0.5, help="weight of the value loss (a mean squared error)")
    a.add_argument(
        "--clip-vloss",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="clip the value update around the behaviour value by --clip-coef (CleanRL's and SB3's PPO detail)",
    )
    a.add_argument(
        "--norm-adv", default="minibatch", choices=["minibatch", "rollout", "none"], help="advantage normalization"
    )
    a.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers")
    a.add_argument(
        "--squashed",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="Box actions: a tanh-squashed Gaussian policy (actions stay inside the bounds) instead of a clipped one",
    )
    n = p.add_argument_group("normalization (ptl_rl.NormalizeObservations, ptl_rl.ScaleRewards)")
    n.add_argument(
        "--norm-obs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="normalize observations by their running mean and std (the agent, the rollout and evaluation)",
    )
    n.add_argument("--obs-clip", type=float, default=10.0, help="clip normalized observations to +-this")
    n.add_argument(
        "--norm-reward",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="scale rewards by the running std of the discounted return",
    )
    n.add_argument("--reward-clip", type=float, default=10.0, help="clip scaled rewards to +-this")
    cli.apply_recipe(p, argv, {"mujoco": MUJOCO_RECIPE})
    # a mistyped or unsuitable env ends here, with the usage line and the reason
    box_or_discrete = (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)
    args, env = cli.parse(p, argv, box_or_discrete, "PPO")
    if args.squashed and not isinstance(env.action_space, spaces.Box):
        p.error(f"--squashed applies to Box action spaces; {args.env_id} has {env.action_space}")
    return args


# ---------------------------------------------------------------------------- networks
def layer_init(layer: nn.Linear, gain: float = np.sqrt(2)) -> nn.Linear:
    """Orthogonal weights, zero bias: the PPO implementation detail that matters most for small MLPs."""
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


def actor_critic(
    obs_dim: int, action_space: gym.Space[Any], hidden: int, squashed: bool = False
) -> tuple[nn.Module, nn.Module]:
    """The policy (obs -> action distribution) and the value (obs -> float [B, 1]) networks.

    ``squashed`` (Box only) ends the policy in a tanh-squashed Gaussian; its
    entropy is the quadrature estimate of ``SquashedDiagGaussian.entropy``.
    """
    head = ptl_rl.action_head(action_space, hidden, squashed=squashed)  # small-gain output init
    actor = nn.Sequential(mlp(obs_dim, hidden), head)
    critic = nn.Sequential(mlp(obs_dim, hidden), layer_init(nn.Linear(hidden, 1), gain=1.0))
    return actor, critic


# ---------------------------------------------------------------------------- learner
class PPO(pl.LightningModule):
    hparams: AttributeDict  # what save_hyperparameters() makes it (Lightning's property is typed wider)

    def __init__(self, obs_dim: int, action_space: gym.Space[Any], args: argparse.Namespace, num_rollouts: int) -> None:
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.num_rollouts = num_rollouts
        self.batches_per_rollout = args.update_epochs * args.num_minibatches
        self.actor, self.critic = actor_critic(obs_dim, action_space, args.hidden, squashed=args.squashed)
        # training_step takes its gradient step itself: on 64-64 MLPs Lightning's automatic closure costs about
        # as much as Adam's update (docs/design/hot-path.md, "Lightning's share")
        self.automatic_optimization = False
        # the agent acts in the envs with these very modules: each rollout uses the current weights
        self.agent = ptl_rl.ActorCriticAgent(self.actor, self.critic, action_space, seed=args.seed)

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
        assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)  # the one configure_optimizers returns
        scheduler.step()  # one epoch per rollout: the learning-rate annealing steps per rollout

    def ppo_loss(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> torch.Tensor:
        """The clipped-surrogate loss of a minibatch (plus the value loss and the entropy bonus), logged per rollout."""
        hp = self.hparams
        log_prob, entropy, value = self.agent.evaluate_actions(batch)
        # the clipped surrogate: batch.log_prob is the behaviour policy's, recorded while acting
        log_ratio = log_prob - batch.log_prob
        ratio = log_ratio.exp()
        clip = hp.clip_coef * (1.0 - self.progress()) if hp.anneal and hp.anneal_clip else hp.clip_coef
        pg_loss = torch.max(-batch.advantage * ratio, -batch.advantage * ratio.clamp(1 - clip, 1 + clip)).mean()
        # batch.returns = GAE advantage + behaviour value: the critic's regression target. A plain MSE, as in
        # SB3 (CleanRL halves it): on CartPole the weaker critic let 1 seed in 5 decay from 500 late in training
        v_loss = (value - batch.returns).square()
        if hp.clip_vloss:  # the value moves at most clip_coef from the behaviour value, unless that costs more
            clipped = batch.value + (value - batch.value).clamp(-hp.clip_coef, hp.clip_coef)
            v_loss = torch.max(v_loss, (clipped - batch.returns).square())
        v_loss = v_loss.mean()
        loss: torch.Tensor = pg_loss + hp.vf_coef * v_loss - hp.ent_coef * entropy.mean()
        if (batch_idx + 1) % self.batches_per_rollout == 0:  # after a rollout's last update (a log costs ~0.5 ms)
            with torch.no_grad():
                approx_kl = ((ratio - 1) - log_ratio).mean()
                clip_frac = ((ratio - 1).abs() > clip).float().mean()
            self.log_dict(
                {"train/pg_loss": pg_loss, "train/v_loss": v_loss, "train/entropy": entropy.mean(),
                 "train/approx_kl": approx_kl, "train/clip_frac": clip_frac},
                on_step=True, on_epoch=False,
            )  # fmt: skip
        return loss

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        # fused: one kernel for all parameters, much faster than the default on small CPU nets
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, eps=1e-5, fused=True)
        anneal = self.hparams.anneal
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda rollout: 1.0 - min(rollout / self.num_rollouts, 1.0) if anneal else 1.0
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "epoch"}}


# ---------------------------------------------------------------------------- evaluation
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def greedy_agent(actor: nn.Module, action_space: gym.Space[Any], obs_norm: ptl_rl.ObservationNormalizer | None) -> Any:
    """The policy's mode (argmax / Gaussian mean); with ``--norm-obs`` it sees observations normalized alike."""
    agent = ptl_rl.StochasticPolicyAgent(actor, action_space, greedy=True)
    return agent if obs_norm is None else obs_norm.wrap_agent(agent)  # the statistics frozen as they are now


class Evaluation(pl.Callback):
    """Every ``--eval-every`` env steps, after a rollout's last update, the greedy policy plays ``--eval-episodes``.

    Once their mean return reaches ``--solved-return``, ``--confirm-episodes`` episodes from start states no
    evaluation has used must reach it too, and only then does training stop, at a rollout boundary: a policy
    that crossed by luck of the start states keeps training. ``run`` plays and records each evaluation.
    """

    def __init__(
        self, args: argparse.Namespace, run: reporting.Run, rollout: ptl_rl.RolloutBuffer, env: Any, obs_norm: Any
    ) -> None:
        self.args, self.run, self.rollout, self.env, self.obs_norm = args, run, rollout, env, obs_norm
        self.source = ptl_rl.find_stage(rollout, ptl_rl.ExperienceSource)
        self.next_eval = args.eval_every

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        args, steps = self.args, self.source.total_steps
        if (idx + 1) % self.rollout.batches_per_rollout or steps < self.next_eval:
            return  # (a rollout's updates are all done only after its last batch)
        self.next_eval = steps - steps % args.eval_every + args.eval_every
        agent = greedy_agent(pl_module.actor, self.env.single_action_space, self.obs_norm)
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
    # --env-steps rounded up to whole rollouts, each trained in full (--help says so)
    num_rollouts = max(1, math.ceil(args.env_steps / (args.num_envs * args.steps_per_env)))
    model = PPO(obs_dim, action_space, args, num_rollouts)

    # ExperienceSource [-> NormalizeObservations -> ScaleRewards] -> RolloutBuffer: T steps per env, GAE, K epochs
    # the agent, the rollout and the evaluations all see observations normalized alike
    obs_norm = ptl_rl.ObservationNormalizer(clip=args.obs_clip or None) if args.norm_obs else None
    source = ptl_rl.ExperienceSource(env, model.agent, gamma=args.gamma, seed=args.seed, observation_transform=obs_norm)
    stage: Any = source
    if obs_norm is not None:
        stage = ptl_rl.NormalizeObservations(stage, obs_norm)
    if args.norm_reward:
        stage = ptl_rl.ScaleRewards(stage, gamma=args.gamma, clip=args.reward_clip or None)
    rollout = ptl_rl.RolloutBuffer(
        stage,
        args.steps_per_env,
        epochs=args.update_epochs,
        num_minibatches=args.num_minibatches,
        gae_lambda=args.gae_lambda,
        normalize_advantage=None if args.norm_adv == "none" else args.norm_adv,
        seed=args.seed,
    )
    # one Lightning epoch = one rollout; a sized loader also keeps Lightning from prefetching a stale batch
    loader = ptl_rl.to_dataloader(rollout, steps_per_epoch=rollout.batches_per_rollout)

    # ---------------------------------------------------------------------------- the Trainer
    anneal = "lr and clip" if args.anneal_clip else "lr"
    run = reporting.Run(
        "ppo",
        args,
        model,
        source,
        config={
            "obs_dim": obs_dim,
            "action_space": str(action_space),
            "num_rollouts": num_rollouts,
            "batch_size": args.num_envs * args.steps_per_env // args.num_minibatches,
            "anneal_schedule": f"{anneal} linear to 0 over {num_rollouts} rollouts" if args.anneal else None,
        },
    )
    log_every = rollout.batches_per_rollout  # once per rollout
    callbacks: list[pl.Callback] = [run, ptl_rl.EpisodeStatsLogger(rollout, every_n_steps=log_every)]
    if args.eval_every:
        callbacks.append(Evaluation(args, run, rollout, make_env(args.env_id, args.eval_episodes), obs_norm))
    if args.video_every:  # greedy episodes filmed in an env of their own, into <run directory>/videos/
        video_env = gym.make(args.env_id, render_mode="rgb_array")
        callbacks.append(run.video(rollout, video_env, lambda m: greedy_agent(m.actor, action_space, obs_norm)))
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
        agent = greedy_agent(model.cpu().actor, action_space, obs_norm)
        run.evaluate("final", final_env, agent, args.final_eval_episodes)
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

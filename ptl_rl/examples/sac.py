"""SAC (soft actor-critic, twin Q, automatic entropy tuning) as a LightningModule, fed by a ptl_rl replay pipeline.

    python -m ptl_rl.examples.sac --env-id Pendulum-v1 --env-steps 20000 --seed 0

Read it top to bottom, CleanRL style:

1. ``parse_args``: every hyperparameter is a flag (the shared ones, and the
   env check, come from ``ptl_rl.examples.cli``); the defaults solve
   Pendulum-v1.
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
   ``ptl_rl.TargetNet.soft_sync``. ``--grad-clip`` clips each optimizer's
   gradient norm by hand (Lightning's ``gradient_clip_val`` is for automatic
   optimization only).
4. ``NoisyAgent`` (``--action-noise normal|ou``): exploration noise added to
   the sampled policy action. SAC's own exploration is its policy's entropy,
   which on a sparse-reward env such as MountainCarContinuous-v0 collapses
   before the goal is ever seen (every push costs reward, so "do nothing",
   return 0, wins); temporally correlated Ornstein-Uhlenbeck noise keeps
   pushing one way long enough to rock the car up the hill.
5. ``Evaluation``: every ``--eval-every`` env steps the policy's mean action
   plays in an env of its own; training stops once it reaches
   ``--solved-return`` and fresh episodes confirm it.
6. ``train``: the env, the agent (uniform random actions for the first
   ``--learning-starts`` steps) and the pipeline ``ExperienceSource ->
   ReplayBuffer -> BatchSampler`` (``--gradient-steps`` gradient steps every
   ``--train-freq`` env steps, default one per env step); then the Trainer
   with its callbacks, ``fit``, the final evaluation on fresh episodes and the
   summary (written down by ``ptl_rl.examples.reporting``).
7. Goal envs (``--her``): for envs that observe a dict with ``observation``,
   ``achieved_goal`` and ``desired_goal`` (gymnasium-robotics' Fetch tasks),
   the networks read ``observation`` and ``desired_goal`` side by side
   (``GoalInput``) and the replay is a ``ptl_rl.HERReplayBuffer``, which
   relabels goals at sampling time with the env's own ``compute_reward``.
   ``python -m ptl_rl.examples.sac --env-id gymnasium_robotics:FetchReach-v4``
   takes SB3-zoo's recipe for it; the summary adds the greedy success rate.
"""

from __future__ import annotations

import argparse
import datetime
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
#: defaults per recipe (--recipe; under 'auto' chosen by the env). An explicit flag still wins.
RECIPES: dict[str, dict[str, Any]] = {
    # CleanRL's sac_continuous_action.py. One actor step per critic step: CleanRL's policy_frequency=2 takes two
    # actor steps every second env step, the same number
    "mujoco": {"buffer_size": 1_000_000, "learning_starts": 5_000, "policy_lr": 3e-4, "q_lr": 1e-3,
               "alpha_lr": 1e-3, "policy_frequency": 1, "batch_size": 256, "hidden": 256, "tau": 0.005,
               "gamma": 0.99, "eval_every": 0, "solved_return": float("inf"), "final_eval_episodes": 10},
    # the sparse reward: without temporally correlated noise the policy learns to stand still (docs/design/examples.md)
    "MountainCarContinuous-v0": {"action_noise": "ou", "hidden": 64, "batch_size": 64, "eval_every": 4_000,
                                 "eval_episodes": 2, "confirm_episodes": 4},
    # SB3-zoo's hyperparams/her.yml for FetchReach (SAC/TQC + HER): 20k env steps, gamma 0.95, 64x64 networks
    "FetchReach": {"her": True, "env_steps": 20_000, "buffer_size": 1_000_000, "batch_size": 256, "gamma": 0.95,
                   "learning_starts": 1_000, "policy_lr": 1e-3, "q_lr": 1e-3, "alpha_lr": 1e-3, "hidden": 64,
                   "n_sampled_goal": 4, "goal_strategy": "future", "eval_every": 0, "solved_return": float("inf"),
                   "final_eval_episodes": 100},
}  # fmt: skip
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")  # the gymnasium-robotics goal-env observation dict


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser("sac", __doc__, default_env="Pendulum-v1", default_env_steps=20_000)
    p.set_defaults(eval_every=2_000, eval_episodes=10, log_every=500)
    a = p.add_argument_group("SAC")
    a.add_argument(
        "--recipe",
        choices=["auto", "classic", *RECIPES],
        default="auto",
        help="defaults for the flags below: 'mujoco' (CleanRL's sac_continuous_action.py), an env id's own, "
        "'classic' (those shown, tuned on Pendulum-v1); 'auto': mujoco for gymnasium's MuJoCo envs, the env's "
        "own where there is one, else classic. Flags given explicitly override the recipe",
    )
    a.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    a.add_argument("--tau", type=float, default=0.005, help="Polyak rate of the target critics")
    a.add_argument("--batch-size", type=int, default=256, help="transitions per gradient step")
    a.add_argument("--buffer-size", type=int, default=100_000, help="replay capacity (transitions)")
    a.add_argument("--learning-starts", type=int, default=1_000, help="uniformly random env steps before learning")
    a.add_argument("--policy-lr", type=float, default=1e-3, help="Adam learning rate of the actor")
    a.add_argument("--q-lr", type=float, default=1e-3, help="Adam learning rate of the critics")
    a.add_argument("--alpha-lr", type=float, default=1e-3, help="Adam learning rate of the temperature")
    a.add_argument("--policy-frequency", type=int, default=1, help="critic steps per actor (and alpha) step")
    a.add_argument("--autotune", action=argparse.BooleanOptionalAction, default=True, help="tune the temperature")
    a.add_argument("--alpha", type=float, default=0.2, help="initial (or, without --autotune, fixed) temperature")
    a.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers")
    cli.add_burst_flags(p, train_freq=1)
    n = p.add_argument_group("exploration noise", "added to the sampled policy action (in [-1, 1]) after the warm-up")
    n.add_argument(
        "--action-noise",
        choices=("none", "normal", "ou"),
        default="none",
        help="normal: independent Gaussian noise each step; ou: Ornstein-Uhlenbeck noise, correlated over "
        "about 1/--noise-theta env steps and restarted at each episode start",
    )
    n.add_argument("--noise-std", type=float, default=0.6, help="standard deviation of the noise (stationary, for ou)")
    n.add_argument("--noise-theta", type=float, default=0.02, help="ou: mean reversion per env step, in (0, 1]")
    goal_obs = f"for goal envs (dict observations with {', '.join(GOAL_KEYS)})"
    h = p.add_argument_group("hindsight experience replay", goal_obs)
    h.add_argument(
        "--her",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="relabel goals with ptl_rl.HERReplayBuffer, on for goal envs unless --no-her, which replays the "
        "real goals only, with the same networks",
    )
    h.add_argument("--n-sampled-goal", type=int, default=4, help="relabeled transitions per real one (SB3's meaning)")
    h.add_argument("--goal-strategy", choices=("future", "final", "episode"), default="future", help="which goal")
    cli.apply_recipe(p, argv, RECIPES, recipe_of=_goal_recipe)
    # a mistyped or unsuitable env ends here, with the usage line and the reason
    args, env = cli.parse(p, argv, (spaces.Box,), "SAC", solved_returns={"Pendulum-v1": -200.0}, box_observations=False)
    check_observations(p, args, env.observation_space)
    if args.noise_std < 0 or not 0 < args.noise_theta <= 1:
        p.error(f"--noise-std must be >= 0 and --noise-theta in (0, 1], got {args.noise_std}, {args.noise_theta}")
    return args


def _goal_recipe(env_id: str) -> str | None:
    """The recipe of a gymnasium-robotics Fetch reach env id (any version, with or without a module prefix)."""
    return "FetchReach" if env_id.rpartition(":")[2].startswith("FetchReach") else None


def is_goal_space(space: spaces.Space[Any]) -> bool:
    """Whether ``space`` is a goal env's observation: a Dict of Boxes with the keys of :data:`GOAL_KEYS`."""
    return isinstance(space, spaces.Dict) and all(isinstance(space.spaces.get(key), spaces.Box) for key in GOAL_KEYS)


def check_observations(p: argparse.ArgumentParser, args: argparse.Namespace, space: spaces.Space[Any]) -> None:
    """Resolve ``--her`` (default: on for goal envs) and ``parser.error`` for observations the networks cannot read."""
    goal_env = is_goal_space(space)
    if args.her is None:
        args.her = goal_env
    if args.her and not goal_env:
        p.error(f"--her needs a goal env (dict observations with {', '.join(GOAL_KEYS)}); {args.env_id} has {space}")
    if not goal_env and not isinstance(space, spaces.Box):
        p.error(
            f"--env-id {args.env_id}: the example's MLP needs Box (array) observations or a goal env's dict, "
            f"but {args.env_id} has {space}"
        )
    if args.n_sampled_goal < 0:
        p.error(f"--n-sampled-goal must be >= 0, got {args.n_sampled_goal}")


# ---------------------------------------------------------------------------- networks
class GoalInput(nn.Module):
    """Goal-env observation dict -> float [B, obs_dim + goal_dim]: ``observation`` and ``desired_goal`` side by side.

    ``achieved_goal`` is left out: in the Fetch tasks it is part of ``observation`` already.
    """

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([obs["observation"].flatten(1).float(), obs["desired_goal"].flatten(1).float()], dim=1)


class FlatInput(nn.Module):
    """Array observations float [B, *shape] -> float [B, prod(shape)]."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.flatten(1).float()


def input_layer(space: spaces.Space[Any]) -> tuple[nn.Module, int]:
    """The module that flattens ``space``'s observations for the MLPs, and the width it produces."""
    if is_goal_space(space):
        parts = (space["observation"], space["desired_goal"])  # type: ignore[index]  # a goal env's Dict
        return GoalInput(), sum(int(np.prod(part.shape)) for part in parts)
    return FlatInput(), int(np.prod(space.shape))  # type: ignore[arg-type]  # a Box: checked in parse_args


def mlp(in_features: int, hidden: int) -> nn.Sequential:
    """float [B, in_features] -> features float [B, hidden], two ReLU layers."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())


class TwinQ(nn.Module):
    """(obs [B, ...] as ``inputs`` reads it, policy action float [B, act_dim]) -> (q1, q2), each float [B]."""

    def __init__(self, inputs: nn.Module, obs_dim: int, act_dim: int, hidden: int) -> None:
        super().__init__()
        self.inputs = inputs
        self.q1 = nn.Sequential(mlp(obs_dim + act_dim, hidden), nn.Linear(hidden, 1))
        self.q2 = nn.Sequential(mlp(obs_dim + act_dim, hidden), nn.Linear(hidden, 1))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.inputs(obs), action], dim=1)
        return self.q1(x).squeeze(1), self.q2(x).squeeze(1)


# ---------------------------------------------------------------------------- learner
class SAC(pl.LightningModule):
    hparams: AttributeDict  # what save_hyperparameters() makes it (Lightning's property is typed wider)

    def __init__(
        self, observation_space: gym.spaces.Space[Any], action_space: gym.spaces.Box, args: argparse.Namespace
    ) -> None:
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.automatic_optimization = False  # three optimizers, stepped in a fixed order
        act_dim = int(np.prod(action_space.shape))
        head = ptl_rl.action_head(action_space, args.hidden, squashed=True)
        inputs, obs_dim = input_layer(observation_space)
        self.actor = nn.Sequential(inputs, mlp(obs_dim, args.hidden), head)
        self.q = TwinQ(inputs, obs_dim, act_dim, args.hidden)
        self.q_target = ptl_rl.TargetNet(self.q)
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(args.alpha))), requires_grad=args.autotune)
        self.target_entropy = -float(act_dim)
        # acts with self.actor: uniform random policy actions for the first learning_starts env steps
        self.agent = ptl_rl.StochasticPolicyAgent(
            self.actor, action_space, warmup_steps=args.learning_starts, seed=args.seed
        )

    def training_step(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> None:
        hp = self.hparams
        optimizers = self.optimizers()
        assert isinstance(optimizers, list)  # configure_optimizers returns three
        q_opt, actor_opt, alpha_opt = optimizers
        alpha = self.log_alpha.exp().detach()

        # critics: soft Bellman target from the target critics; discount and terminated come with the batch
        with torch.no_grad():
            next_action, next_log_prob = self.actor(batch.next_obs).rsample_with_log_prob()
            next_q = torch.min(*self.q_target(batch.next_obs, next_action)) - alpha * next_log_prob
            target = batch.reward + batch.discount * (1.0 - batch.terminated.float()) * next_q
        q1, q2 = self.q(batch.obs, batch.policy_action)  # the critics learn on policy-space actions
        q_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.optimize(q_opt, q_loss)

        if batch_idx % hp.policy_frequency == 0:
            # actor: maximize min Q + alpha * entropy through the reparameterized sample
            action, log_prob = self.actor(batch.obs).rsample_with_log_prob()
            actor_loss = (alpha * log_prob - torch.min(*self.q(batch.obs, action))).mean()
            self.optimize(actor_opt, actor_loss)
            if hp.autotune:
                # temperature: push the policy's entropy (-log_prob) toward target_entropy
                alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
                self.optimize(alpha_opt, alpha_loss)

        self.q_target.soft_sync(hp.tau)
        if (batch_idx + 1) % hp.log_every == 0:  # each self.log call costs about 0.5 ms
            self.log_dict(
                {"train/q_loss": q_loss, "train/q_mean": q1.mean(), "train/alpha": alpha}, on_step=True, on_epoch=False
            )

    def optimize(self, optimizer: Any, loss: torch.Tensor) -> None:
        """One step of ``optimizer`` on ``loss``, its gradient norm clipped to ``--grad-clip`` if set."""
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if self.hparams.grad_clip:  # by hand: Lightning's gradient_clip_val is for automatic optimization
            self.clip_gradients(optimizer, gradient_clip_val=self.hparams.grad_clip, gradient_clip_algorithm="norm")
        optimizer.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        hp = self.hparams
        # fused: one kernel for all parameters, much faster than the default on small CPU nets
        return [
            torch.optim.Adam(self.q.parameters(), lr=hp.q_lr, fused=True),
            torch.optim.Adam(self.actor.parameters(), lr=hp.policy_lr, fused=True),
            torch.optim.Adam([self.log_alpha], lr=hp.alpha_lr),
        ]


# ---------------------------------------------------------------------------- exploration noise
class NoisyAgent:
    """``agent`` with ``--action-noise`` added to its sampled policy actions (clipped to [-1, 1]).

    The noisy policy action is what the env gets (through the agent's
    ``ActionRescaler``) and what is stored as ``policy_action``, so the critics
    learn on the action actually taken. During the agent's uniform warm-up no
    noise is added. ``ou`` noise follows ``x <- (1 - theta) x + std sqrt(1 - (1 - theta)^2) eps``
    per env step (stationary standard deviation ``std``), one process per
    sub-env, restarted at 0 when its episode starts.

    Args:
        agent: a ``ptl_rl.StochasticPolicyAgent`` over a Box action space.
        kind: ``"normal"`` or ``"ou"``.
        std, theta: the noise's standard deviation and (ou) mean reversion per step.
        num_envs, act_dim: shape of one batch of actions.
    """

    def __init__(
        self, agent: ptl_rl.StochasticPolicyAgent, kind: str, std: float, theta: float, num_envs: int, act_dim: int,
        seed: int,
    ) -> None:  # fmt: skip
        if agent.rescaler is None:
            raise TypeError(f"action noise needs a Box action space to rescale into, got {agent.action_space}")
        self.agent, self.kind, self.std, self.theta = agent, kind, float(std), float(theta)
        self.rescaler: ptl_rl.ActionRescaler = agent.rescaler
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros((num_envs, act_dim), dtype=np.float64)

    def on_env_steps(self, total_steps: int) -> None:
        self.agent.on_env_steps(total_steps)

    def reset_state(self, mask: np.ndarray) -> None:
        self.state[mask] = 0.0  # a new episode starts its noise afresh

    def noise(self) -> np.ndarray:
        """float64 [num_envs, act_dim]: the next noise sample."""
        eps = self.rng.standard_normal(self.state.shape)
        if self.kind == "normal":
            return self.std * eps
        decay = 1.0 - self.theta
        self.state = decay * self.state + self.std * np.sqrt(1.0 - decay**2) * eps
        return self.state

    def __call__(self, obs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions, extras = self.agent(obs)
        if self.agent.total_steps < self.agent.warmup_steps:
            return actions, extras
        policy_action = np.clip(extras["policy_action"] + self.noise(), -1.0, 1.0).astype(np.float32)
        return self.rescaler.to_env(policy_action), {**extras, "policy_action": policy_action}


# ---------------------------------------------------------------------------- evaluation
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def success_rate(actor: nn.Module, env_id: str, episodes: int, seed: int) -> float:
    """Share of ``episodes`` greedy episodes whose last step reports ``info["is_success"]`` (goal envs)."""
    env = gym.make(env_id)
    agent = ptl_rl.StochasticPolicyAgent(actor, env.action_space, greedy=True)
    successes = 0
    try:
        for episode in range(episodes):
            obs, info = env.reset(seed=seed + episode)
            done = False
            while not done:
                batch = {key: value[None] for key, value in obs.items()}  # a batch of one
                obs, _, terminated, truncated, info = env.step(agent(batch)[0][0])
                done = terminated or truncated
            successes += bool(info.get("is_success", False))
    finally:
        env.close()
    return successes / episodes if episodes else float("nan")


def greedy_agent(actor: nn.Module, action_space: gym.Space[Any]) -> ptl_rl.StochasticPolicyAgent:
    """The policy's mean action, tanh(mu)."""
    return ptl_rl.StochasticPolicyAgent(actor, action_space, greedy=True)


class Evaluation(pl.Callback):
    """Every ``--eval-every`` env steps the policy's mean action plays ``--eval-episodes`` episodes in ``env``.

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
    action_space = env.single_action_space
    if not isinstance(action_space, spaces.Box):  # (cli.parse refused the others; said again for the checker)
        raise TypeError(f"SAC needs a Box action space, got {action_space}")
    model = SAC(env.single_observation_space, action_space, args)
    agent: Any = model.agent
    if args.action_noise != "none":
        act_dim = int(np.prod(action_space.shape))
        agent = NoisyAgent(
            agent, args.action_noise, args.noise_std, args.noise_theta, args.num_envs, act_dim, args.seed
        )

    # ExperienceSource -> ReplayBuffer -> BatchSampler: --gradient-steps batches per --train-freq env steps
    source = ptl_rl.ExperienceSource(env, agent, gamma=args.gamma, seed=args.seed)
    replay = dict(
        capacity=args.buffer_size,
        warmup=max(args.learning_starts, args.batch_size),
        transitions_per_yield=args.train_freq,
        seed=args.seed,
    )
    buffer: ptl_rl.ReplayBuffer | ptl_rl.HERReplayBuffer
    if args.her:  # goals relabeled at sampling time; every sub-env shares the reward function of the first
        goal_env = env.envs[0].unwrapped  # type: ignore[attr-defined]  # make_env builds a SyncVectorEnv
        buffer = ptl_rl.HERReplayBuffer(
            source,
            compute_reward=goal_env.compute_reward,
            strategy=args.goal_strategy,
            n_sampled_goal=args.n_sampled_goal,
            **replay,
        )
    else:
        buffer = ptl_rl.ReplayBuffer(source, **replay)
    pipeline = ptl_rl.BatchSampler(replay_stage(buffer, args.gradient_steps), batch_size=args.batch_size)
    # epochs of 1000 batches: the env-step budget ends training (manual optimization counts every optimizer's
    # steps in global_step, so max_steps would not mean gradient steps)
    loader = ptl_rl.to_dataloader(pipeline, steps_per_epoch=1_000)

    # ---------------------------------------------------------------------------- the Trainer
    run = reporting.Run(
        "sac",
        args,
        model,
        source,
        config={
            "obs_dim": input_layer(env.single_observation_space)[1],
            "action_space": str(action_space),
            "target_entropy": model.target_entropy,
            "replay_ratio": args.batch_size * args.gradient_steps / args.train_freq,
        },
    )
    callbacks: list[pl.Callback] = [
        run,
        ptl_rl.EnvStepLimit(pipeline, args.env_steps),  # the budget
        ptl_rl.EpisodeStatsLogger(pipeline, every_n_steps=args.log_every),
    ]
    if args.eval_every:
        callbacks.append(Evaluation(args, run, source, make_env(args.env_id, args.eval_episodes)))
    if args.video_every:  # greedy episodes filmed in an env of their own, into <run directory>/videos/
        video_env = gym.make(args.env_id, render_mode="rgb_array")
        callbacks.append(run.video(pipeline, video_env, lambda module: greedy_agent(module.actor, action_space)))
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
    extra = {}
    if args.final_eval_episodes:  # the final weights, the policy's mean action, on fresh episodes
        final_env = make_env(args.env_id, args.final_eval_episodes)
        run.evaluate("final", final_env, greedy_agent(model.cpu().actor, action_space), args.final_eval_episodes)
        final_env.close()
    if is_goal_space(env.single_observation_space):  # goal envs: the share of those episodes that reach the goal
        seed = args.seed + reporting.FINAL_SEED
        extra["success_rate"] = success_rate(model.actor, args.env_id, args.final_eval_episodes, seed)
    summary = run.finish(trainer, **extra)
    print(reporting.summary_line(summary))
    return summary


if __name__ == "__main__":
    train(parse_args())

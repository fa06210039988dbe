"""R2D2-lite: a recurrent DQN on sequence replay (stored state, burn-in, n-step) as a LightningModule.

    python -m ptl_rl.examples.r2d2 --seed 0                     # LSTM on CartPole without velocities
    python -m ptl_rl.examples.r2d2 --seed 0 --feed-forward      # the same network with its memory cut

Read it top to bottom:

1. ``CartPoleNoVelocity``: CartPole-v1 showing only the cart position and the
   pole angle (observation indices 0 and 2). The velocities are hidden, so a
   policy must infer them from the observations it has seen: a partially
   observed env that a feed-forward network cannot solve. Registered with
   gymnasium as ``CartPoleNoVelocity-v1`` (500 steps, solved at 475) when this
   module is imported.
2. ``parse_args``: every hyperparameter is a flag (the shared ones come from
   ``ptl_rl.examples.cli``). ``--core lstm|gru|mlp``: ``mlp`` (or
   ``--feed-forward``) swaps the recurrent cell for a feed-forward layer of the
   same width, everything else unchanged: the baseline without memory.
3. ``RecurrentQNetwork``: encoder -> ``ptl_rl.RecurrentCore`` (LSTM or GRU cell
   with a flat state [B, S]) -> Q-values. ``step`` acts one step, ``forward``
   runs a window.
4. ``R2D2``: the LightningModule. A batch holds ``B`` windows of
   ``burn_in + length`` consecutive steps of one episode (``[B, T, ...]``, plus
   ``mask``). ``td_loss``: the state at the window's first position is the one
   stored when the agent acted (``batch.hidden[:, 0]``, R2D2's stored state;
   ``--initial-state zeros`` starts from zeros instead); the burn-in positions
   only advance that state (no gradient), the training positions give
   Q(obs, action). Targets are n-step (``ptl_rl.sequence_nstep_targets``: the
   1-step ``reward``/``discount``/``terminated`` fields of the window folded up
   to ``--n-step`` steps) and bootstrap from the target network's double-DQN
   value of each step's ``next_obs``, taken from the state after that step.
5. ``Evaluation``: greedy evaluations every ``--eval-every`` env steps,
   stopping once ``--solved-return`` is reached and confirmed on fresh episodes.
6. ``train``: ``ExperienceSource`` (a ``ptl_rl.RecurrentDQNAgent``: one hidden
   state per sub-env, reset when its episode starts, returned as the
   ``hidden`` extra) -> ``SequenceReplayBuffer`` (windows with burn-in) ->
   ``BatchSampler``; then the Trainer with its callbacks, ``fit``, the final
   evaluation and the summary (written down by ``ptl_rl.examples.reporting``).
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any, cast

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

# the partially observed env, in a module of its own that recurrent_ppo.py shares; importing it registers the env
from ptl_rl.examples.partial_obs import ENV_ID, CartPoleNoVelocity, make_cartpole_no_velocity  # noqa: F401
from ptl_rl.examples.quiet import quiet_lightning


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser("r2d2", __doc__, default_env=ENV_ID, default_env_steps=100_000)
    p.set_defaults(num_envs=8, eval_every=5_000, final_eval_episodes=20)
    a = p.add_argument_group("R2D2")
    a.add_argument("--core", choices=("lstm", "gru", "mlp"), default="lstm", help="recurrent cell (mlp: no memory)")
    a.add_argument(
        "--feed-forward", dest="core", action="store_const", const="mlp", help="the baseline: same as --core mlp"
    )
    a.add_argument("--hidden", type=int, default=64, help="width of the encoder and of the recurrent cell")
    a.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    a.add_argument("--n-step", type=int, default=5, help="n of the n-step targets, folded inside each window")
    a.add_argument("--length", type=int, default=20, help="training positions per window")
    a.add_argument("--burn-in", type=int, default=10, help="positions before each window that only warm the state up")
    a.add_argument(
        "--initial-state",
        choices=("stored", "zeros"),
        default="stored",
        help="state a window starts from: the one stored when the agent acted (R2D2), or zeros",
    )
    a.add_argument("--double", action=argparse.BooleanOptionalAction, default=True, help="double DQN targets")
    a.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    a.add_argument("--batch-size", type=int, default=32, help="windows per gradient step")
    a.add_argument("--buffer-size", type=int, default=50_000, help="replay capacity (steps)")
    a.add_argument("--learning-starts", type=int, default=2_000, help="steps stored before the first update")
    a.add_argument("--target-sync-every", type=int, default=100, help="gradient steps between target-net syncs")
    a.add_argument("--eps-start", type=float, default=1.0, help="epsilon of epsilon-greedy at env step 0")
    a.add_argument("--eps-end", type=float, default=0.02, help="epsilon after the decay")
    a.add_argument("--eps-decay-steps", type=int, default=20_000, help="env steps of the linear epsilon decay")
    a.add_argument("--prioritized", action=argparse.BooleanOptionalAction, default=False, help="prioritized windows")
    cli.add_burst_flags(p, train_freq=8)
    args = cli.parse(p, argv, (spaces.Discrete,), "R2D2")[0]
    for flag in ("hidden", "n_step", "length", "batch_size"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.burn_in < 0:
        p.error(f"--burn-in must be >= 0, got {args.burn_in}")
    return args


# ---------------------------------------------------------------------------- Q-network
class FeedForwardCore(nn.Module):
    """The baseline's stand-in for ``ptl_rl.RecurrentCore``: a ReLU layer of the same width, no memory.

    Same interface, so the agent, the replay and the loss stay as they are: its
    state (one zero per row) passes through untouched.
    """

    state_size = 1

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(input_size, hidden_size)

    def initial_state(self, batch_size: int) -> torch.Tensor:
        return torch.zeros(batch_size, 1, device=self.linear.weight.device)

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.linear(x)), state

    def forward(
        self,
        x: torch.Tensor,
        state: torch.Tensor,
        mask: torch.Tensor | None = None,
        reset: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # (reset: RecurrentCore's episode starts inside a sequence, for recurrent PPO; nothing to reset here)
        return torch.relu(self.linear(x)), state[:, None].expand(-1, x.shape[1], -1)


class RecurrentQNetwork(nn.Module):
    """obs [B, obs_dim] and state [B, S] -> Q-values [B, A] and the next state (``step``); [B, T, ...] (``forward``)."""

    obs_scale: torch.Tensor  # a buffer: 1 / the observations' bounds

    def __init__(
        self, obs_dim: int, num_actions: int, hidden: int, core: str = "lstm", obs_bound: list[float] | None = None
    ) -> None:
        super().__init__()
        # observations divided by their bound: CartPole's pole angle (about +-0.2) would else be a small input whose
        # step-to-step changes, the velocity the network must infer, are smaller still
        bound = torch.ones(obs_dim) if obs_bound is None else torch.tensor(obs_bound, dtype=torch.float32)
        self.register_buffer("obs_scale", 1.0 / bound)
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU())
        self.core = FeedForwardCore(hidden, hidden) if core == "mlp" else ptl_rl.RecurrentCore(hidden, hidden, core)
        self.head = nn.Linear(hidden, num_actions)

    def initial_state(self, batch_size: int) -> torch.Tensor:
        return self.core.initial_state(batch_size)

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, state = self.core.step(self.encoder(obs.float() * self.obs_scale), state)
        return self.head(out), state

    def forward(
        self, obs: torch.Tensor, state: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [B, T, obs_dim] from state [B, S] -> (Q-values [B, T, A], state after each position [B, T, S])."""
        out, states = self.core(self.encoder(obs.float() * self.obs_scale), state, mask)
        return self.head(out), states


# ---------------------------------------------------------------------------- learner
class R2D2(pl.LightningModule):
    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden: int = 64,
        obs_bound: list[float] | None = None,
        core: str = "lstm",
        lr: float = 1e-3,
        n_step: int = 5,
        burn_in: int = 10,
        initial_state: str = "stored",
        double: bool = True,
        target_sync_every: int = 100,
        prioritized: bool = False,
        log_every: int = 100,
        grad_clip: float | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False  # training_step takes its gradient step itself
        self.q_net = RecurrentQNetwork(obs_dim, num_actions, hidden, core, obs_bound)
        self.target_net = ptl_rl.TargetNet(self.q_net)
        self.lr, self.n_step, self.burn_in, self.start_from = lr, n_step, burn_in, initial_state
        self.double_q, self.target_sync_every, self.prioritized = double, target_sync_every, prioritized
        self.log_every, self.grad_clip = log_every, grad_clip

    @property
    def target_q_net(self) -> RecurrentQNetwork:
        """The target network's copy of ``q_net`` (``TargetNet`` forwards ``forward`` only, not ``step``)."""
        return cast(RecurrentQNetwork, self.target_net.target)

    def start_states(self, batch: ptl_rl.TorchBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The online and target networks' states at the first training position, after the burn-in.

        A window starts from the state stored when its first step was acted on
        (padding at the front repeats the first real step, so ``hidden[:, 0]``
        is that step's state) or from zeros; each network then runs the burn-in
        positions without gradients.
        """
        burn_in = self.burn_in
        if self.start_from == "stored":
            start = batch.hidden[:, 0]
        else:
            start = self.q_net.initial_state(len(batch.mask))
        if burn_in == 0:
            return start, start
        with torch.no_grad():
            prefix, prefix_mask = batch.obs[:, :burn_in], batch.mask[:, :burn_in]
            online = self.q_net(prefix, start, prefix_mask)[1][:, -1]
            target = self.target_net(prefix, start, prefix_mask)[1][:, -1]
        return online, target

    def td_loss(self, batch: ptl_rl.TorchBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(Huber loss over the real training positions, Q(obs, action) float [B, length])."""
        burn_in = self.burn_in
        online_start, target_start = self.start_states(batch)
        window = slice(burn_in, None)
        obs, mask, action = batch.obs[:, window], batch.mask[:, window], batch.action[:, window]
        q, states = self.q_net(obs, online_start, mask)  # [B, L, A], state after each position [B, L, S]
        q_taken = q.gather(2, action.long().unsqueeze(2)).squeeze(2)
        with torch.no_grad():
            # the value of next_obs at each position, from the state after that position's obs
            target_states = self.target_net(obs, target_start, mask)[1]
            next_q = self._step_all(self.target_q_net, batch.next_obs[:, window], target_states)
            if self.double_q:  # the online network picks the next action, the target network values it
                next_action = self._step_all(self.q_net, batch.next_obs[:, window], states).argmax(2, keepdim=True)
                next_value = next_q.gather(2, next_action).squeeze(2)
            else:
                next_value = next_q.max(2).values
            target = ptl_rl.sequence_nstep_targets(
                batch.reward[:, window],
                batch.discount[:, window],
                batch.terminated[:, window],
                batch.truncated[:, window],
                mask,
                next_value,
                self.n_step,
            )
        errors = F.smooth_l1_loss(q_taken, target, reduction="none") * mask
        per_window = errors.sum(1) / mask.sum(1).clamp(min=1)
        if self.prioritized:  # R2D2's priority: a mix of the window's largest and mean |TD|
            td = (q_taken.detach() - target).abs() * mask
            batch.update_priorities(0.9 * td.max(1).values + 0.1 * td.sum(1) / mask.sum(1).clamp(min=1))
            per_window = per_window * batch.weights
        return per_window.mean(), q_taken

    @staticmethod
    def _step_all(net: RecurrentQNetwork, obs: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """Q-values [B, L, A] of obs [B, L, ...], each position from its own state [B, L, S]: one batched step."""
        flat_q = net.step(obs.flatten(0, 1), states.flatten(0, 1))[0]
        q: torch.Tensor = flat_q.unflatten(0, obs.shape[:2])
        return q

    def training_step(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> torch.Tensor:
        loss, q_taken = self.td_loss(batch)
        optimizer: Any = self.optimizers()  # configure_optimizers' one, as Lightning wraps it
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if self.grad_clip:  # by hand: Lightning's gradient_clip_val is for automatic optimization
            self.clip_gradients(optimizer, gradient_clip_val=self.grad_clip, gradient_clip_algorithm="norm")
        optimizer.step()
        if self.global_step % self.target_sync_every == 0:  # global_step counts optimizer steps
            self.target_net.sync()
        if batch_idx % self.log_every == 0:
            self.log("train/loss", loss.detach(), prog_bar=True, on_step=True, on_epoch=False)
            self.log("train/q_mean", q_taken.detach().mean(), on_step=True, on_epoch=False)
        return loss.detach()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.q_net.parameters(), lr=self.lr)


# ---------------------------------------------------------------------------- evaluation
def make_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def greedy_agent(q_net: nn.Module) -> ptl_rl.RecurrentDQNAgent:
    """The greedy policy of the recurrent Q-network: a fresh agent, so its states are its own."""
    return ptl_rl.RecurrentDQNAgent(q_net, ptl_rl.ArgmaxSelector())


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
    # the observation space's finite bounds scale the inputs (CartPole: position 4.8, angle 0.418 rad)
    obs_bound = [float(h) if np.isfinite(h) and h > 0 else 1.0 for h in obs_space.high.reshape(-1)]
    model = R2D2(
        obs_dim,
        num_actions,
        hidden=args.hidden,
        obs_bound=obs_bound,
        core=args.core,
        lr=args.lr,
        n_step=args.n_step,
        burn_in=args.burn_in,
        initial_state=args.initial_state,
        double=args.double,
        target_sync_every=args.target_sync_every,
        prioritized=args.prioritized,
        log_every=args.log_every,
        grad_clip=args.grad_clip,
    )

    # one hidden state per sub-env, reset by the source at each episode start, stored per step as `hidden`
    epsilon = ptl_rl.LinearSchedule(args.eps_start, args.eps_end, args.eps_decay_steps)
    agent = ptl_rl.RecurrentDQNAgent(model.q_net, ptl_rl.EpsilonGreedySelector(epsilon, seed=args.seed))

    # ExperienceSource -> SequenceReplayBuffer (windows of burn_in + length steps) -> BatchSampler
    source = ptl_rl.ExperienceSource(env, agent, gamma=args.gamma, seed=args.seed)
    buffer = ptl_rl.SequenceReplayBuffer(
        source,
        capacity=args.buffer_size,
        length=args.length,
        burn_in=args.burn_in,
        pad_end=True,  # the last steps of each episode (its terminal one) in as many windows as the others
        prioritized=args.prioritized,
        beta=ptl_rl.LinearSchedule(0.4, 1.0, args.env_steps),
        beta_clock="env",
        warmup=max(args.learning_starts, args.batch_size),
        transitions_per_yield=args.train_freq,
        seed=args.seed,
    )
    pipeline = ptl_rl.BatchSampler(replay_stage(buffer, args.gradient_steps), batch_size=args.batch_size)

    # ---------------------------------------------------------------------------- the Trainer
    run = reporting.Run(
        "r2d2",
        args,
        model,
        source,
        config={
            "obs_dim": obs_dim,
            "num_actions": num_actions,
            "epsilon": f"linear {args.eps_start} -> {args.eps_end} over {args.eps_decay_steps} env steps",
            "replay_warmup": max(args.learning_starts, args.batch_size),
            "window": f"{args.burn_in} burn-in + {args.length} training positions",
            "parameters": sum(p.numel() for p in model.q_net.parameters()),
            "obs_bound": obs_bound,
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
        trainer.fit(model, train_dataloaders=ptl_rl.to_dataloader(pipeline))
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

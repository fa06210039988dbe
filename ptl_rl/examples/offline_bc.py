"""Behaviour cloning from a Minari dataset, as a LightningModule fed by the same adapter as online RL.

    python -m ptl_rl.examples.offline_bc --seed 0                       # record an expert dataset, then clone it
    python -m ptl_rl.examples.offline_bc --dataset D4RL/.../expert-v0   # clone a dataset stored locally

Read it top to bottom:

1. ``parse_args``: every setting is a flag; the defaults reach a greedy return
   of 500 on CartPole-v1 in a few CPU seconds of training.
2. ``expert_agent``: the behaviour policy that is recorded, a hand-tuned PD
   controller on the cart position/velocity and pole angle/angular velocity
   (it balances CartPole for the full 500 steps), acting with ``--noise``
   random actions so that the data also shows how it recovers from mistakes.
3. ``record_dataset``: ``ExperienceSource -> MinariRecorder`` writes
   ``--record-episodes`` episodes as a Minari dataset (under
   ``$MINARI_DATASETS_PATH``, default ``~/.minari/datasets``). An existing
   dataset with that id is reused, never overwritten.
4. ``BehaviourCloning``: the LightningModule, an MLP trained with cross-entropy
   on the dataset's ``(obs, action)`` rows; ``training_step`` gets the same
   ``ptl_rl.TorchBatch`` as the online examples.
5. ``train``: ``minari_replay_buffer`` fills a buffer with the whole dataset
   in one call (checked against the env's spaces); ``BatchSampler ->
   to_dataloader`` serves shuffled passes over it (``steps_per_epoch`` batches
   per Lightning epoch). The environment is not stepped during training: it
   is only run afterwards, to evaluate the greedy policy on fresh episodes.

A downloaded dataset works the same way: ``minari download <id>`` on a
machine with internet, copy ``~/.minari/datasets/<id>`` here (or set
``MINARI_DATASETS_PATH``), and pass ``--dataset <id>`` (or the directory path).
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
from torch import nn

import ptl_rl
from ptl_rl.examples.cli import check_env

# the PD controller's gains on (cart position, cart velocity, pole angle, pole angular velocity): push right
# when the weighted sum is positive
PD_GAINS = np.array([0.1, 0.5, 3.0, 1.0])


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--env-id", default="CartPole-v1", help="env of the recorded dataset and of the evaluation")
    p.add_argument(
        "--dataset",
        default=None,
        help="a local Minari dataset id or directory to clone; default: record the PD expert on CartPole-v1 "
        "as 'ptl_rl/cartpole-pd-expert-s<seed>-v0'",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (torch.set_num_threads)")
    p.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True)
    # recording
    p.add_argument("--record-episodes", type=int, default=20, help="episodes of the expert to record")
    p.add_argument("--record-envs", type=int, default=4, help="sub-envs of the recording vector env")
    p.add_argument("--noise", type=float, default=0.1, help="probability of a random action while recording")
    # behaviour cloning
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=4, help="Lightning epochs of --steps-per-epoch batches")
    p.add_argument("--steps-per-epoch", type=int, default=250)
    # evaluation (after training)
    p.add_argument("--eval-episodes", type=int, default=20)
    args = p.parse_args(argv)
    # fail here, with the usage line, rather than with a traceback after recording
    check_env(p, args.env_id, (gym.spaces.Discrete,), "behaviour cloning (a classifier over actions)")
    if args.dataset is None and args.env_id != "CartPole-v1":
        p.error(
            f"--env-id {args.env_id}: the built-in expert (a PD controller) only drives CartPole-v1; pass "
            "--dataset <id or directory> to clone a dataset recorded on that env"
        )
    return args


# ---------------------------------------------------------------------------- the behaviour policy
def expert_agent(noise: float, seed: int):
    """The recorded policy: obs float32 [N, 4] -> actions int64 [N]; PD control, ``noise`` random actions."""
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray) -> np.ndarray:
        actions = (obs @ PD_GAINS > 0).astype(np.int64)
        explore = rng.random(len(actions)) < noise
        actions[explore] = rng.integers(0, 2, size=int(explore.sum()))
        return actions

    return act


def record_dataset(dataset_id: str, args: argparse.Namespace) -> Any:
    """Record ``--record-episodes`` episodes of the expert as the Minari dataset ``dataset_id`` (or load it)."""
    try:
        return ptl_rl.open_minari_dataset(dataset_id)
    except FileNotFoundError:
        pass  # not recorded yet
    env = gym.make_vec(args.env_id, num_envs=args.record_envs, vectorization_mode="sync")
    source = ptl_rl.ExperienceSource(env, expert_agent(args.noise, args.seed), seed=args.seed)
    with ptl_rl.MinariRecorder(
        source,
        dataset_id,
        partial_episodes="drop",  # keep whole episodes only: the dataset is a set of complete expert runs
        author="ptl_rl",
        author_email="n/a",
        code_permalink="ptl_rl/examples/offline_bc.py",
        description=f"PD controller on {args.env_id} with {args.noise} random actions, seed {args.seed}",
    ) as recorder:
        while source.episodes_finished < args.record_episodes:
            next(recorder)
    env.close()
    return recorder.dataset


# ---------------------------------------------------------------------------- learner
class BehaviourCloning(pl.LightningModule):
    """An MLP policy obs [B, obs_dim] -> action logits [B, num_actions], fit to the dataset's actions."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.policy = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_actions)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy(obs.flatten(1).float())

    def training_step(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> torch.Tensor:
        logits = self(batch.obs)
        loss = F.cross_entropy(logits, batch.action.long())
        if batch_idx % 50 == 0:
            accuracy = (logits.argmax(dim=1) == batch.action).float().mean()
            self.log_dict({"train/loss": loss, "train/accuracy": accuracy}, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


# ---------------------------------------------------------------------------- training
def train(args: argparse.Namespace) -> dict[str, Any]:
    """Record (or load) the dataset, clone it, then evaluate the greedy policy; returns the run's summary."""
    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)
    if args.dataset is not None:
        dataset = ptl_rl.open_minari_dataset(args.dataset)
    else:
        dataset = record_dataset(f"ptl_rl/cartpole-pd-expert-s{args.seed}-v0", args)
    record_time = time.perf_counter() - start

    # the env is made here only to read its spaces: a dataset of another env fails now, not after training
    probe = gym.make(args.env_id)
    obs_space, action_space = probe.observation_space, probe.action_space
    probe.close()
    # fill once, then sample: shuffled passes over the whole dataset (replacement=False)
    buffer = ptl_rl.minari_replay_buffer(
        dataset, seed=args.seed, replacement=False, observation_space=obs_space, action_space=action_space
    )
    loader = ptl_rl.to_dataloader(ptl_rl.BatchSampler(buffer, batch_size=args.batch_size), args.steps_per_epoch)
    model = BehaviourCloning(int(np.prod(obs_space.shape)), int(action_space.n), args.hidden, args.lr)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=args.progress_bar,
        callbacks=[TQDMProgressBar(refresh_rate=50)] if args.progress_bar else [],
    )
    train_start = time.perf_counter()
    trainer.fit(model, train_dataloaders=loader)
    train_time = time.perf_counter() - train_start

    # only now is the env touched: fresh episodes of the greedy policy
    eval_env = gym.make_vec(args.env_id, num_envs=args.eval_episodes, vectorization_mode="sync")
    policy = model.policy.cpu().eval()

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return policy(torch.as_tensor(obs).float()).argmax(dim=1).numpy()

    returns = ptl_rl.evaluate(eval_env, greedy, args.eval_episodes, seed=args.seed + 1_000_000)
    eval_env.close()
    return {
        "final_eval_return": float(returns.mean()),
        "min_eval_return": float(returns.min()),
        "dataset_id": dataset.id,
        "dataset_steps": int(dataset.total_steps),
        "dataset_episodes": int(dataset.total_episodes),
        "gradient_steps": int(trainer.global_step),
        "record_time_s": record_time,
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = train(args)
    print(
        f"{result['dataset_id']} ({result['dataset_episodes']} episodes, {result['dataset_steps']} steps), "
        f"seed {args.seed}: greedy return {result['final_eval_return']:.1f} (min {result['min_eval_return']:.0f}) "
        f"over {args.eval_episodes} fresh episodes after {result['gradient_steps']} gradient steps; "
        f"training {result['train_time_s']:.1f} s, wall time {result['wall_time_s']:.1f} s"
    )
    return result


if __name__ == "__main__":
    main()

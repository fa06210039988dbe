"""Behaviour cloning from a Minari dataset, as a LightningModule fed by the same adapter as online RL.

    python -m ptl_rl.examples.offline_bc --seed 0                       # record an expert dataset, then clone it
    python -m ptl_rl.examples.offline_bc --dataset D4RL/.../expert-v0   # clone a dataset stored locally

Read it top to bottom:

1. ``parse_args``: every setting is a flag (the shared ones, and the env
   check, come from ``ptl_rl.examples.cli``); the defaults
   reach a greedy return of 500 on CartPole-v1 in a few CPU seconds of training.
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
   per Lightning epoch, ``--epochs`` of them), which the Trainer fits on. The
   environment is not stepped during training: it is only run afterwards, to
   evaluate the greedy policy on fresh episodes; then the summary (written
   down by ``ptl_rl.examples.reporting``).

A downloaded dataset works the same way: ``minari download <id>`` on a
machine with internet, copy ``~/.minari/datasets/<id>`` here (or set
``MINARI_DATASETS_PATH``), and pass ``--dataset <id>`` (or the directory path).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from gymnasium import spaces
from pytorch_lightning.callbacks import TQDMProgressBar
from torch import nn

import ptl_rl
from ptl_rl.examples import cli, reporting
from ptl_rl.examples.quiet import quiet_lightning

if TYPE_CHECKING:
    from lightning_fabric.utilities.data import AttributeDict

# the PD controller's gains on (cart position, cart velocity, pole angle, pole angular velocity): push right
# when the weighted sum is positive
PD_GAINS = np.array([0.1, 0.5, 3.0, 1.0])


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.example_parser("offline_bc", __doc__, default_env="CartPole-v1", online=False)
    p.set_defaults(final_eval_episodes=20, log_every=50)
    p.add_argument(
        "--dataset",
        default=None,
        help="a local Minari dataset id or directory to clone; default: record the PD expert on CartPole-v1 "
        "as 'ptl_rl/cartpole-pd-expert-s<seed>-v0'",
    )
    r = p.add_argument_group("recording")
    r.add_argument("--record-episodes", type=int, default=20, help="episodes of the expert to record")
    r.add_argument("--record-envs", type=int, default=4, help="sub-envs of the recording vector env")
    r.add_argument("--noise", type=float, default=0.1, help="probability of a random action while recording")
    b = p.add_argument_group("behaviour cloning")
    b.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers")
    b.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    b.add_argument("--batch-size", type=int, default=256, help="rows per gradient step")
    b.add_argument("--epochs", type=int, default=4, help="Lightning epochs of --steps-per-epoch batches")
    b.add_argument("--steps-per-epoch", type=int, default=250, help="batches per Lightning epoch")
    # fails here, with the usage line, rather than with a traceback after recording
    algorithm = "behaviour cloning (a classifier over actions)"
    args = cli.parse(p, argv, (spaces.Discrete,), algorithm)[0]
    problem = offline_problem(args.dataset)
    if problem:
        p.error(problem)
    if args.dataset is None and args.env_id != "CartPole-v1":
        p.error(
            f"--env-id {args.env_id}: the built-in expert (a PD controller) only drives CartPole-v1; pass "
            "--dataset <id or directory> to clone a dataset recorded on that env"
        )
    return args


def datasets_root() -> Path:
    """Where Minari keeps datasets by id: ``$MINARI_DATASETS_PATH``, default ``~/.minari/datasets``."""
    return Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")


def offline_problem(dataset: str | None) -> str | None:
    """Why ``--dataset`` cannot be opened (minari missing, no such dataset), in one line; ``None`` if it can.

    Checked with the file system only, as ``ptl_rl.open_minari_dataset`` looks
    datasets up, so the answer comes before minari loads and anything is recorded.
    """
    if importlib.util.find_spec("minari") is None:
        return 'training from a dataset needs minari: pip install -c constraints.txt -e ".[offline]"'
    if dataset is None:  # recorded by this example
        return None
    path = Path(dataset)
    if path.is_dir():
        if any((folder / "metadata.json").is_file() for folder in (path, path / "data")):
            return None
        return f"--dataset {dataset}: a directory without a Minari dataset (no metadata.json in it or in data/)"
    root = datasets_root()
    if (root / dataset / "data").is_dir():
        return None
    return (
        f"--dataset {dataset}: no such Minari dataset stored locally (looked in {root}, set by "
        "$MINARI_DATASETS_PATH); omit --dataset to record the CartPole expert, pass a dataset directory, "
        f"or download it where there is internet (minari download {dataset}) and copy it there"
    )


# ---------------------------------------------------------------------------- the behaviour policy
def expert_agent(noise: float, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """The recorded policy: obs float32 [N, 4] -> actions int64 [N]; PD control, ``noise`` random actions."""
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray) -> np.ndarray:
        actions: np.ndarray = (obs @ PD_GAINS > 0).astype(np.int64)
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

    hparams: AttributeDict  # what save_hyperparameters() makes it (Lightning's property is typed wider)

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.policy = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_actions)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.policy(obs.flatten(1).float())
        return logits

    def training_step(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> torch.Tensor:
        logits = self(batch.obs)
        loss = F.cross_entropy(logits, batch.action.long())
        if batch_idx % 50 == 0:
            accuracy = (logits.argmax(dim=1) == batch.action).float().mean()
            self.log_dict({"train/loss": loss, "train/accuracy": accuracy}, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


# ---------------------------------------------------------------------------- evaluation
def greedy_agent(policy: nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    """obs [N, obs_dim] -> the most likely action of each row, int64 [N]."""
    policy = policy.eval()

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            actions: np.ndarray = policy(torch.as_tensor(obs).float()).argmax(dim=1).numpy()
            return actions

    return greedy


# ---------------------------------------------------------------------------- training
def train(args: argparse.Namespace) -> dict[str, Any]:
    """Record (or load) the dataset, clone it, evaluate the greedy policy, print one line; returns the summary."""
    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)
    if args.dataset is not None:
        dataset = ptl_rl.open_minari_dataset(args.dataset)
    else:
        dataset = record_dataset(f"ptl_rl/cartpole-pd-expert-s{args.seed}-v0", args)

    # the env is made here only to read its spaces: a dataset of another env fails now, not after training
    probe = gym.make(args.env_id)
    obs_space, action_space = probe.observation_space, probe.action_space
    probe.close()
    assert isinstance(obs_space, spaces.Box) and isinstance(action_space, spaces.Discrete)  # cli.parse checked
    # fill once, then sample: shuffled passes over the whole dataset (replacement=False)
    buffer = ptl_rl.minari_replay_buffer(
        dataset, seed=args.seed, replacement=False, observation_space=obs_space, action_space=action_space
    )
    pipeline = ptl_rl.BatchSampler(buffer, batch_size=args.batch_size)
    model = BehaviourCloning(int(np.prod(obs_space.shape)), int(action_space.n), args.hidden, args.lr)

    # ---------------------------------------------------------------------------- the Trainer
    dataset_info = {
        "dataset_id": dataset.id,
        "dataset_steps": int(dataset.total_steps),
        "dataset_episodes": int(dataset.total_episodes),
    }
    run = reporting.Run("offline_bc", args, model, None, config=dataset_info)  # no source: no env steps
    callbacks: list[pl.Callback] = [run]
    if args.progress_bar:
        callbacks.append(TQDMProgressBar(refresh_rate=args.log_every))
    with quiet_lightning():  # Lightning's lines that ask nothing of the user (no GPU here, ...)
        trainer = pl.Trainer(
            accelerator=args.accelerator,
            devices=1,
            max_epochs=args.epochs,  # passes of --steps-per-epoch batches: the env is not stepped in training
            max_time=datetime.timedelta(seconds=args.time_limit) if args.time_limit else None,
            gradient_clip_val=args.grad_clip,  # automatic optimization: Lightning clips
            logger=run.loggers or False,
            log_every_n_steps=args.log_every,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=args.progress_bar,
            callbacks=callbacks,
        )
        trainer.fit(model, train_dataloaders=ptl_rl.to_dataloader(pipeline, args.steps_per_epoch))

    # ---------------------------------------------------------------------------- final evaluation, summary
    if args.final_eval_episodes:  # only now is the env played: fresh episodes of the greedy policy
        final_env = gym.make_vec(args.env_id, num_envs=args.final_eval_episodes, vectorization_mode="sync")
        run.evaluate("final", final_env, greedy_agent(model.cpu().policy), args.final_eval_episodes)
        final_env.close()
    summary = run.finish(trainer, **dataset_info)
    print(
        f"{summary['dataset_id']} ({summary['dataset_episodes']} episodes, {summary['dataset_steps']} steps): "
        + reporting.summary_line(summary)
    )
    return summary


if __name__ == "__main__":
    train(parse_args())

"""Evaluation: run an agent for whole episodes and report their returns, also as Lightning validation data."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from ptl_rl.core.protocols import Agent, EnvLike
from ptl_rl.core.ranks import distributed_rank, rank_seed
from ptl_rl.stages.source import ExperienceSource


def run_episodes(env: EnvLike, agent: Agent, episodes: int, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Undiscounted returns (float64 [episodes]) and lengths (int64 [episodes]) of ``episodes`` whole episodes.

    ``env`` may be a single or a vector env. With ``N`` sub-envs, sub-env ``i``
    contributes its first ``(episodes + i) // N`` episodes, so the count is
    fixed in advance: taking whichever episodes finish first would favour
    short ones and bias the mean low. Use ``N`` dividing ``episodes`` to run
    them all in parallel.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    source = ExperienceSource(env, agent, seed=seed, rank=0)
    n = source.num_envs
    wanted = np.array([(episodes + i) // n for i in range(n)], dtype=np.int64)  # env_id i = sub-env i at rank 0
    returns: list[float] = []
    lengths: list[int] = []
    while len(returns) < episodes:
        next(source)
        for episode in source.pop_episodes():
            if wanted[episode.env_id] > 0:
                wanted[episode.env_id] -= 1
                returns.append(episode.ret)
                lengths.append(episode.length)
    return np.asarray(returns, dtype=np.float64), np.asarray(lengths, dtype=np.int64)


def evaluate(env: EnvLike, agent: Agent, episodes: int, seed: int | None = None) -> np.ndarray:
    """Undiscounted returns (float64 [episodes]) of ``episodes`` whole episodes; see :func:`run_episodes`."""
    return run_episodes(env, agent, episodes, seed)[0]


class EvaluationDataset(IterableDataset[dict[str, torch.Tensor]]):
    """Each pass runs ``episodes`` episodes of ``agent`` in ``env`` and yields them as one batch.

    The episodes are run when the dataset is iterated, so an agent that holds
    the module's network acts with the current weights. Pass ``k`` is seeded
    with ``seed + 1000 * k`` (rank-distinct under DDP): fresh start states
    every time, reproducible across runs. The batch is
    ``{"episode_return": float32 [episodes], "episode_length": float32 [episodes]}``.
    """

    def __init__(self, env: EnvLike, agent: Agent, episodes: int = 10, seed: int | None = None) -> None:
        super().__init__()
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        self.env, self.agent, self.episodes, self.seed = env, agent, int(episodes), seed
        self.passes = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        seed = rank_seed(self.seed, distributed_rank()[0])
        seed = None if seed is None else seed + 1_000 * self.passes
        self.passes += 1
        returns, lengths = run_episodes(self.env, self.agent, self.episodes, seed)
        yield {
            "episode_return": torch.from_numpy(returns.astype(np.float32)),
            "episode_length": torch.from_numpy(lengths.astype(np.float32)),
        }

    def __len__(self) -> int:
        return 1


def evaluation_dataloader(
    env: EnvLike, agent: Agent, episodes: int = 10, seed: int | None = None
) -> DataLoader[dict[str, torch.Tensor]]:
    """A one-batch DataLoader of evaluation episodes, for Lightning's validation and test loops.

    Return it from ``val_dataloader`` (or pass it as ``val_dataloaders``), and
    log ``batch["episode_return"].mean()`` in ``validation_step`` (or use
    :class:`~ptl_rl.lightning.EvaluationMixin`). ``agent`` should act greedily,
    e.g. ``DQNAgent(module.q_net, ArgmaxSelector())``.
    """
    return DataLoader(EvaluationDataset(env, agent, episodes, seed), batch_size=None, num_workers=0)

"""A collector factory whose policy normalizes its own inputs (``ObservationNormalizer.module()`` first).

It runs in another process (AsyncSource, Ray), so it lives in an importable module. The agent
returns, as the extra ``seen``, the observations exactly as its network saw them, so the learner
can check them against the statistics it pushed with each policy version.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from ptl_rl import ExperienceSource
from ptl_rl.distributed import Collector, WorkerInfo
from ptl_rl.normalization.module import NormalizationModule

OBS_SHAPE = (4,)  # CartPole-v1
CLIP = 5.0


def policy_network() -> nn.Sequential:
    """Normalization first, then a linear Q-head: the same structure on the learner and in every collector."""
    torch.manual_seed(0)
    return nn.Sequential(NormalizationModule(OBS_SHAPE, CLIP), nn.Linear(OBS_SHAPE[0], 2))


class SeeingAgent:
    """Greedy over the policy's outputs; the extra ``seen`` is the normalized observation float32 [N, 4]."""

    def __init__(self, policy: nn.Sequential) -> None:
        self.policy = policy

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        with torch.no_grad():
            seen = self.policy[0](torch.as_tensor(obs))
            actions = self.policy[1](seen).argmax(1)
        return actions.numpy(), {"seen": seen.numpy()}


def normalized_cartpole_collector(info: WorkerInfo) -> Collector:
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    policy = policy_network()
    source = ExperienceSource(env, SeeingAgent(policy), seed=info.rank, rank=info.rank)
    return Collector(source, policy)


def check_rows_per_version(rows: list[dict[str, np.ndarray]], snapshots: dict[int, tuple[torch.Tensor, ...]]) -> int:
    """Each row of ``policy_version`` v was seen by the collector's network as the (shift, scale) pushed as v.

    ``rows``: dicts of ``obs``, ``seen``, ``policy_version``; ``snapshots[v]``: the learner's buffers at push v.
    Returns the number of versions the rows span.
    """
    obs, seen, versions = (np.concatenate([r[k] for r in rows]) for k in ("obs", "seen", "policy_version"))
    for version in np.unique(versions):
        shift, scale = (t.numpy().astype(np.float64) for t in snapshots[int(version)])
        expected = np.clip((obs[versions == version] - shift) * scale, -CLIP, CLIP)
        np.testing.assert_allclose(seen[versions == version], expected, rtol=1e-5, atol=1e-5)
    return len(np.unique(versions))

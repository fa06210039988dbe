"""Mistakes a new user makes when building a pipeline are caught at construction, with a message naming the fix.

Each test builds the chain the way a user would and asserts that the error
comes from the constructor (not from ``next()`` minutes later) and that its
message says what to do instead.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import ptl_rl
from ptl_rl import (
    BatchSampler,
    ExperienceSource,
    NStepTransform,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SequenceReplayBuffer,
)


def cartpole(num_envs: int = 2) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")


def pendulum(num_envs: int = 2) -> gym.vector.VectorEnv:
    return gym.make_vec("Pendulum-v1", num_envs=num_envs, vectorization_mode="sync")


def q_net(obs_dim: int = 4, num_actions: int = 2) -> nn.Module:
    return nn.Sequential(nn.Linear(obs_dim, 16), nn.ReLU(), nn.Linear(16, num_actions))


def transitions(count: int, start: int = 0) -> ptl_rl.TransitionBatch:
    """``count`` 1-step transitions of one env whose ``action`` numbers them."""
    rows = np.arange(start, start + count)
    return ptl_rl.TransitionBatch(
        {
            "obs": rows[:, None].astype(np.float32),
            "action": rows.astype(np.int64),
            "reward": np.ones(count, dtype=np.float32),
            "next_obs": rows[:, None].astype(np.float32) + 1,
            "terminated": np.zeros(count, dtype=bool),
            "truncated": np.zeros(count, dtype=bool),
            "discount": np.full(count, 0.99, dtype=np.float32),
            "env_id": np.zeros(count, dtype=np.int64),
        }
    )


# ---------------------------------------------------------------------- warm-up defaults
@pytest.mark.parametrize(
    "make",
    [
        lambda: ReplayBuffer(None, 64),
        lambda: PrioritizedReplayBuffer(None, 64),
        lambda: SequenceReplayBuffer(None, 64, length=4),
    ],
    ids=["uniform", "prioritized", "sequence"],
)
def test_small_buffers_default_their_warmup_to_the_capacity(make):
    """``warmup`` defaults to ``min(1000, capacity)`` for every replay buffer, as documented for ReplayBuffer."""
    buffer = make()
    assert buffer.warmup == 64


def test_large_prioritized_and_sequence_buffers_keep_the_default_warmup_of_1000():
    assert PrioritizedReplayBuffer(None, 5_000).warmup == 1_000
    assert SequenceReplayBuffer(None, 5_000, length=4).warmup == 1_000


def test_warmup_above_capacity_names_the_fix():
    with pytest.raises(ValueError, match="lower warmup or raise capacity"):
        PrioritizedReplayBuffer(None, 64, warmup=65)

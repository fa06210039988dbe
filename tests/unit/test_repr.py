"""Every stage's repr shows its counters and its place in the chain (content, not the exact string)."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from torch import nn

import ptl_rl


def cartpole_source(num_envs: int = 4) -> ptl_rl.ExperienceSource:
    env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    return ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(nn.Linear(4, 2)), seed=0)


def counters(text: str, stage: str) -> dict[str, str]:
    """The ``key=value`` pairs inside ``stage(...)`` of a chain repr."""
    match = re.search(rf"(?:^| <- ){stage}\(([^)]*)\)", text)
    assert match is not None, f"{stage}(...) not in {text!r}"
    return dict(part.split("=", 1) for part in match.group(1).split(", ") if "=" in part)


def test_replay_pipeline_repr_shows_every_stage_newest_first_with_live_counters():
    source = cartpole_source(4)
    nstep = ptl_rl.NStepTransform(source, n=3, gamma=0.99)
    buffer = ptl_rl.ReplayBuffer(nstep, capacity=5_000, warmup=100, transitions_per_yield=4)
    sampler = ptl_rl.BatchSampler(buffer, batch_size=32)
    for _ in range(10):
        next(sampler)
    text = repr(sampler)
    assert "0x" not in text
    names = [part.split("(")[0] for part in text.split(" <- ")]
    assert names == ["BatchSampler", "ReplayBuffer", "NStepTransform", "ExperienceSource"]
    assert counters(text, "BatchSampler") == {"batch_size": "32"}
    assert counters(text, "ReplayBuffer") == {
        "size": f"{len(buffer)}/5000",
        "warmup": "100",
        "transitions_per_yield": "4",
    }
    in_flight = int(np.count_nonzero(nstep.windows._length))
    assert in_flight > 0
    assert counters(text, "NStepTransform") == {"n": "3", "gamma": "0.99", "windows_in_flight": str(in_flight)}
    assert "ExperienceSource(CartPole-v1 x4, " in text
    assert counters(text, "ExperienceSource") == {
        "env_steps": str(source.total_steps),
        "episodes": str(source.episodes_finished),
    }
    assert source.total_steps > 0


def test_next_of_a_buffer_prints_the_chain_not_an_address():
    buffer = ptl_rl.ReplayBuffer(cartpole_source(2), capacity=100, warmup=10)
    shown = repr(next(buffer))
    assert shown.startswith("ReplayBuffer(size=") and " <- ExperienceSource(CartPole-v1 x2" in shown


def test_counters_follow_the_pipeline():
    source = cartpole_source(2)
    buffer = ptl_rl.ReplayBuffer(source, capacity=100, warmup=10)
    before = repr(buffer)
    for _ in range(30):
        next(buffer)
    after = repr(buffer)
    assert counters(before, "ReplayBuffer")["size"] == "0/100"
    assert counters(after, "ReplayBuffer")["size"] == f"{len(buffer)}/100" != "0/100"
    assert counters(after, "ExperienceSource")["env_steps"] == str(source.total_steps)


def test_prioritized_and_sequence_buffers_show_their_own_counters():
    source = cartpole_source(2)
    beta = ptl_rl.LinearSchedule(0.4, 1.0, 100)
    prioritized = ptl_rl.PrioritizedReplayBuffer(
        source, capacity=200, warmup=20, alpha=0.5, beta=beta, beta_clock="env"
    )
    next(prioritized)
    shown = counters(repr(prioritized), "PrioritizedReplayBuffer")
    assert shown["size"] == f"{len(prioritized)}/200" and shown["alpha"] == "0.5"
    assert float(shown["beta"]) == pytest.approx(prioritized.draws.beta, abs=1e-5) and float(shown["beta"]) > 0.4

    sequence = ptl_rl.SequenceReplayBuffer(cartpole_source(2), capacity=200, length=4, burn_in=2, warmup=40)
    next(sequence)
    shown = counters(repr(sequence), "SequenceReplayBuffer")
    assert shown["windows"] == str(sequence.draws.num_windows) and sequence.draws.num_windows > 0
    assert (shown["length"], shown["burn_in"], shown["prioritized"]) == ("4", "2", "False")


def test_rollout_buffer_repr_shows_rollouts_and_the_minibatch_being_served():
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    actor = nn.Sequential(nn.Linear(4, 8), ptl_rl.action_head(env.single_action_space, 8))
    agent = ptl_rl.ActorCriticAgent(actor, nn.Linear(4, 1), env.single_action_space, seed=0)
    rollout = ptl_rl.RolloutBuffer(ptl_rl.ExperienceSource(env, agent, seed=0), 8, epochs=2, num_minibatches=2)
    next(rollout)
    shown = counters(repr(rollout), "RolloutBuffer")
    assert shown == {"envs": "2", "steps_per_env": "8", "held": str(len(rollout)), "rollouts": "1", "served": "1/4"}
    assert " <- ExperienceSource(CartPole-v1 x2" in repr(rollout)


def test_standalone_stages_and_plain_iterators_have_short_reprs():
    assert repr(ptl_rl.ReplayBuffer(None, 64)) == "ReplayBuffer(size=0/64, warmup=64, transitions_per_yield=1)"
    assert repr(ptl_rl.NStepTransform(None, 2, 0.9)) == "NStepTransform(n=2, gamma=0.9, windows_in_flight=0)"
    # a plain iterator upstream is named by its type, never by its address
    assert repr(ptl_rl.ReplayBuffer(iter([]), 64)).endswith(" <- list_iterator")

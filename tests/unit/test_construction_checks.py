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


# ---------------------------------------------------------------------- BatchSampler wiring
def test_sampler_directly_over_a_source_asks_for_a_buffer_in_between():
    source = ExperienceSource(cartpole(), ptl_rl.DQNAgent(q_net()), seed=0)
    with pytest.raises(TypeError, match=r"yields transition batches.*BatchSampler\(ReplayBuffer\(upstream"):
        BatchSampler(source, batch_size=32)
    with pytest.raises(TypeError, match=r"BatchSampler\(ReplayBuffer\(upstream"):
        BatchSampler(NStepTransform(source, n=3, gamma=0.99), batch_size=32)
    assert source.total_steps == 0  # caught before any env step


def test_sampler_over_a_plain_iterator_of_transition_batches_explains_at_the_first_next():
    sampler = BatchSampler(iter([transitions(4)]), batch_size=2)  # what it yields is only known when it yields
    with pytest.raises(TypeError, match=r"yielded a TransitionBatch.*BatchSampler\(ReplayBuffer\(upstream"):
        next(sampler)


def test_sampler_over_a_rollout_buffer_points_to_to_dataloader():
    env = cartpole()
    actor = nn.Sequential(nn.Linear(4, 8), ptl_rl.action_head(env.single_action_space, 8))
    agent = ptl_rl.ActorCriticAgent(actor, nn.Linear(4, 1), env.single_action_space)
    rollout = ptl_rl.RolloutBuffer(ExperienceSource(env, agent), 4)
    with pytest.raises(TypeError, match=r"to_dataloader\(rollout, steps_per_epoch=rollout.batches_per_rollout\)"):
        BatchSampler(rollout, batch_size=8)


def test_sampler_without_upstream_asks_for_a_buffer():
    with pytest.raises(TypeError, match="pass a ReplayBuffer"):
        BatchSampler(None, batch_size=8)


@pytest.mark.parametrize("buffer_type", [ReplayBuffer, PrioritizedReplayBuffer])
def test_sampler_over_a_standalone_buffer_samples_what_was_added(buffer_type):
    buffer = buffer_type(None, capacity=100, seed=0)
    buffer.add(transitions(30))
    sampler = BatchSampler(buffer, batch_size=8)
    batches = [next(sampler) for _ in range(3)]
    assert all(b.action.shape == (8,) for b in batches)
    assert all(0 <= int(a) < 30 for b in batches for a in b.action)
    buffer.add(transitions(70, start=30))  # later additions are sampled too: the buffer is read on every next()
    seen = torch.cat([next(sampler).action for _ in range(50)])
    assert seen.max() >= 30


def test_sampler_over_a_standalone_sequence_buffer_samples_windows():
    buffer = SequenceReplayBuffer(None, capacity=100, length=4, seed=0)
    buffer.add(transitions(20))
    batch = next(BatchSampler(buffer, batch_size=5))
    assert batch.action.shape == (5, 4)


def test_batch_size_above_warmup_is_reported_at_construction_with_the_warmup_to_use():
    buffer = ReplayBuffer(ExperienceSource(cartpole(), ptl_rl.DQNAgent(q_net())), capacity=10_000, warmup=100)
    with pytest.raises(ValueError, match=r"batch_size=256 exceeds the ReplayBuffer's warmup=100.*warmup=256"):
        BatchSampler(buffer, batch_size=256)
    prioritized = PrioritizedReplayBuffer(iter([]), capacity=500, warmup=10)
    with pytest.raises(ValueError, match="warmup >= 64"):
        BatchSampler(prioritized, batch_size=64)
    BatchSampler(ReplayBuffer(iter([]), capacity=500, warmup=64), batch_size=64)  # equal is fine


def test_batch_size_above_capacity_is_reported_at_construction():
    with pytest.raises(ValueError, match="lower batch_size or raise capacity"):
        BatchSampler(ReplayBuffer(None, capacity=16), batch_size=32)


# ---------------------------------------------------------------------- RolloutBuffer without a critic
def test_rollout_buffer_without_a_critic_is_reported_before_collecting():
    env = cartpole()
    actor = nn.Sequential(nn.Linear(4, 8), ptl_rl.action_head(env.single_action_space, 8))
    source = ExperienceSource(env, ptl_rl.StochasticPolicyAgent(actor, env.single_action_space), seed=0)
    expected = r"ActorCriticAgent\(actor, critic, action_space\) \(or ptl_rl.RecurrentActorCriticAgent\), or pass"
    with pytest.raises(ValueError, match=expected):
        ptl_rl.RolloutBuffer(source, 32)
    assert source.total_steps == 0
    # a value_fn is enough
    ptl_rl.RolloutBuffer(source, 32, value_fn=lambda obs: np.zeros(len(obs)))


# ---------------------------------------------------------------------- agents
def test_a_bare_network_as_the_agent_is_told_to_wrap_it():
    with pytest.raises(TypeError, match=r"bare torch module \(Sequential\).*ptl_rl.DQNAgent\(net\)"):
        ExperienceSource(cartpole(), q_net())


def test_a_schedule_in_place_of_the_selector_is_told_to_wrap_it():
    with pytest.raises(TypeError, match=r"EpsilonGreedySelector\(epsilon\)"):
        ptl_rl.DQNAgent(q_net(), ptl_rl.LinearSchedule(1.0, 0.05, 1_000))
    with pytest.raises(TypeError, match=r"EpsilonGreedySelector\(epsilon\)"):
        ptl_rl.DQNAgent(q_net(), 0.1)


def test_a_non_network_is_rejected_by_the_q_agent():
    with pytest.raises(TypeError, match=r"needs a torch network \(nn.Module\)"):
        ptl_rl.DQNAgent(lambda obs: obs)


def test_dqn_agent_on_a_box_env_names_discrete_when_the_source_is_built():
    with pytest.raises(TypeError, match=r"DQNAgent acts in Discrete action spaces.*Box.*StochasticPolicyAgent"):
        ExperienceSource(pendulum(), ptl_rl.DQNAgent(q_net(3, 2)))


def test_dqn_agent_given_a_box_action_space_names_discrete_at_once():
    with pytest.raises(TypeError, match=r"discrete actions.*use a Discrete env"):
        ptl_rl.DQNAgent(q_net(3, 2), action_space=pendulum().single_action_space)
    agent = ptl_rl.DQNAgent(q_net(), action_space=cartpole().single_action_space)
    assert next(ExperienceSource(cartpole(), agent, seed=0))["action"].shape == (2,)


def test_policy_agent_built_for_another_space_kind_is_reported():
    box = pendulum().single_action_space
    actor = nn.Sequential(nn.Linear(4, 8), ptl_rl.action_head(box, 8))
    with pytest.raises(TypeError, match="build the agent with env.single_action_space"):
        ExperienceSource(cartpole(), ptl_rl.StochasticPolicyAgent(actor, box))


def test_agents_that_fit_the_env_and_plain_callables_pass():
    """Accepted at construction, and then they act: every step's actions are members of the env's action space,
    one per sub-env, and a plain callable's actions are exactly what it returned."""
    box = pendulum().single_action_space
    cases = {
        "DQNAgent": (cartpole(), ptl_rl.DQNAgent(q_net())),
        "StochasticPolicyAgent": (cartpole(), ptl_rl.StochasticPolicyAgent(q_net())),  # logits, no space needed
        "callable": (cartpole(), lambda obs: np.ones(len(obs), dtype=np.int64)),
        "DeterministicActorAgent": (pendulum(), ptl_rl.DeterministicActorAgent(nn.Linear(3, 1), box)),
    }
    for name, (env, agent) in cases.items():
        space = env.single_action_space
        source = ExperienceSource(env, agent, seed=0)
        actions = np.stack([np.asarray(next(source)["action"]) for _ in range(5)])  # [steps, num_envs, *shape]
        assert actions.shape == (5, env.num_envs, *space.shape), name
        assert np.can_cast(actions.dtype, space.dtype, casting="same_kind"), (name, actions.dtype)
        flat = actions.reshape(-1, *space.shape)
        assert all(space.contains(np.asarray(a, dtype=space.dtype)) for a in flat), (name, flat)
        assert source.total_steps == 5 * env.num_envs, name
        if name == "callable":
            np.testing.assert_array_equal(actions, np.ones((5, env.num_envs), dtype=np.int64))


# ---------------------------------------------------------------------- example command lines
def cli_error(module, argv: list[str], capsys) -> str:
    """The message of the ``parser.error`` that ``module.parse_args(argv)`` ends with (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("name", ["dqn", "ppo", "a2c", "sac"])
def test_examples_reject_an_unknown_env_id_with_a_suggestion(name, capsys):
    module = __import__(f"ptl_rl.examples.{name}", fromlist=["parse_args"])
    err = cli_error(module, ["--env-id", "CartPol-v1"], capsys)
    assert "usage:" in err and "no such gymnasium env; did you mean CartPole-v1" in err


def test_dqn_example_rejects_a_box_action_space_naming_discrete(capsys):
    from ptl_rl.examples import dqn

    err = cli_error(dqn, ["--env-id", "Pendulum-v1"], capsys)
    assert "DQN needs Discrete actions, but Pendulum-v1 has Box" in err


def test_sac_example_rejects_a_discrete_action_space_naming_box(capsys):
    from ptl_rl.examples import sac

    assert "SAC needs Box actions, but CartPole-v1 has Discrete(2)" in cli_error(
        sac, ["--env-id", "CartPole-v1"], capsys
    )


@pytest.mark.parametrize("name", ["ppo", "a2c"])
def test_on_policy_examples_reject_non_array_observations(name, capsys):
    module = __import__(f"ptl_rl.examples.{name}", fromlist=["parse_args"])
    err = cli_error(module, ["--env-id", "FrozenLake-v1"], capsys)
    assert "needs Box (array) observations" in err and "Discrete(16)" in err


def test_ppo_squashed_flag_needs_a_box_action_space(capsys):
    from ptl_rl.examples import ppo

    assert "--squashed applies to Box action spaces" in cli_error(ppo, ["--squashed"], capsys)
    assert ppo.parse_args(["--env-id", "Pendulum-v1", "--squashed"]).squashed


@pytest.mark.parametrize(("name", "env_id"), [("dqn", "CartPole-v1"), ("ppo", "Pendulum-v1"), ("a2c", "CartPole-v1"),
                                              ("sac", "MountainCarContinuous-v0")])  # fmt: skip
def test_examples_accept_envs_they_can_run(name, env_id):
    module = __import__(f"ptl_rl.examples.{name}", fromlist=["parse_args"])
    assert module.parse_args(["--env-id", env_id]).env_id == env_id


def test_dqn_command_line_on_pendulum_ends_with_a_usage_error_not_a_traceback():
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "ptl_rl.examples.dqn", "--env-id", "Pendulum-v1"], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and "DQN needs Discrete actions" in run.stderr


def test_policy_agent_is_a_deprecated_stochastic_policy_agent_over_logits():
    with pytest.warns(DeprecationWarning, match="StochasticPolicyAgent"):
        old = ptl_rl.PolicyAgent(q_net(), seed=3)
    new = ptl_rl.StochasticPolicyAgent(old.actor, seed=3)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    (old_actions, old_extras), (new_actions, new_extras) = old(obs), new(obs)
    np.testing.assert_array_equal(old_actions, new_actions)
    np.testing.assert_allclose(old_extras["log_prob"], new_extras["log_prob"])
    assert old_actions.dtype == np.int64 and set(old_actions.tolist()) <= {0, 1}
    logits = old.actor(torch.from_numpy(obs))
    expected = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(old_actions)[:, None])[:, 0]
    np.testing.assert_allclose(old_extras["log_prob"], expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="warmup_steps .* needs the action space"):
        ptl_rl.StochasticPolicyAgent(q_net(), warmup_steps=10)
    with pytest.raises(TypeError, match="needs a torch network"):
        ptl_rl.PolicyAgent(lambda obs: obs)

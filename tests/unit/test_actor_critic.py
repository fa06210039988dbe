"""Action distributions, heads, rescaling and the actor-critic / continuous agents."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import distributions as D
from torch import nn

import ptl_rl
from ptl_rl.agents.distributions import (
    ActionRescaler,
    Categorical,
    DiagGaussian,
    MultiCategorical,
    SquashedDiagGaussian,
    action_head,
)


# ---------------------------------------------------------------------- distributions vs torch.distributions
def test_diag_gaussian_matches_torch_normal():
    g = torch.Generator().manual_seed(0)
    mean, log_std = torch.randn(64, 3, generator=g), torch.randn(64, 3, generator=g) * 0.5
    action = torch.randn(64, 3, generator=g) * 2
    ours = DiagGaussian(mean, log_std)
    ref = D.Independent(D.Normal(mean, log_std.exp()), 1)
    torch.testing.assert_close(ours.log_prob(action), ref.log_prob(action))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    torch.testing.assert_close(ours.mode(), mean)


def test_diag_gaussian_state_independent_log_std_broadcasts():
    mean, log_std = torch.zeros(5, 2), torch.tensor([0.3, -0.7])
    ref = D.Independent(D.Normal(mean, log_std.exp().expand(5, 2)), 1)
    action = torch.ones(5, 2)
    torch.testing.assert_close(DiagGaussian(mean, log_std).log_prob(action), ref.log_prob(action))


def test_diag_gaussian_samples_have_the_right_moments_and_log_prob():
    mean, log_std = torch.tensor([[1.0, -2.0]]).expand(20000, 2), torch.tensor([0.0, -1.0])
    dist = DiagGaussian(mean, log_std)
    action, log_prob = dist.sample_with_log_prob(torch.Generator().manual_seed(1))
    assert action.mean(0).tolist() == pytest.approx([1.0, -2.0], abs=0.03)
    assert action.std(0).tolist() == pytest.approx([1.0, np.exp(-1.0)], abs=0.03)
    torch.testing.assert_close(log_prob, dist.log_prob(action))


def test_squashed_gaussian_matches_torch_tanh_transform():
    g = torch.Generator().manual_seed(0)
    mean, log_std = torch.randn(256, 2, generator=g), torch.randn(256, 2, generator=g) * 0.3 - 0.5
    ours = SquashedDiagGaussian(mean, log_std)
    ref = D.TransformedDistribution(D.Independent(D.Normal(mean, log_std.exp()), 1), [D.TanhTransform()])
    action, log_prob = ours.rsample_with_log_prob(g)
    assert action.abs().max() < 1
    safe = action.abs().max(dim=-1).values < 0.999  # torch inverts tanh, which loses precision near the bounds
    torch.testing.assert_close(log_prob[safe], ref.log_prob(action)[safe], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours.log_prob(action)[safe], log_prob[safe], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours.mode(), torch.tanh(mean))


def test_squashed_gaussian_log_prob_is_finite_at_saturation_and_differentiable():
    mean = torch.full((4, 1), 30.0, requires_grad=True)  # tanh(u) rounds to 1: the naive log(1 - tanh^2) is -inf
    action, log_prob = SquashedDiagGaussian(mean, torch.zeros(4, 1)).rsample_with_log_prob()
    assert torch.isfinite(log_prob).all()
    log_prob.sum().backward()
    assert torch.isfinite(mean.grad).all()


def test_categorical_matches_torch_and_samples_by_frequency():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 5, generator=g)
    ours, ref = Categorical(logits), D.Categorical(logits=logits)
    action = torch.randint(0, 5, (32,), generator=g)
    torch.testing.assert_close(ours.log_prob(action), ref.log_prob(action))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    freq_logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]]).expand(40000, 4)
    sample, log_prob = Categorical(freq_logits).sample_with_log_prob(g)
    counts = torch.bincount(sample, minlength=4).float() / 40000
    torch.testing.assert_close(counts, torch.softmax(freq_logits[0], -1), atol=0.01, rtol=0)
    torch.testing.assert_close(log_prob, Categorical(freq_logits).log_prob(sample))


def test_categorical_entropy_with_impossible_actions_is_finite():
    logits = torch.tensor([[0.0, float("-inf"), 0.0]])
    assert Categorical(logits).entropy().item() == pytest.approx(np.log(2))


def test_multi_categorical_is_a_sum_of_independent_categoricals():
    g = torch.Generator().manual_seed(0)
    nvec = [3, 5, 2]
    logits = torch.randn(16, sum(nvec), generator=g)
    ours = MultiCategorical(logits, nvec)
    parts = [D.Categorical(logits=chunk) for chunk in logits.split(nvec, dim=-1)]
    action, log_prob = ours.sample_with_log_prob(g)
    assert action.shape == (16, 3) and (action < torch.tensor(nvec)).all()
    ref_log_prob = sum(p.log_prob(action[:, i]) for i, p in enumerate(parts))
    torch.testing.assert_close(log_prob, ref_log_prob)
    torch.testing.assert_close(ours.entropy(), sum(p.entropy() for p in parts))
    torch.testing.assert_close(ours.mode(), torch.stack([p.probs.argmax(-1) for p in parts], -1))


def test_action_head_picks_the_distribution():
    assert isinstance(action_head(spaces.Discrete(3), 8)(torch.zeros(2, 8)), Categorical)
    assert isinstance(action_head(spaces.MultiDiscrete([2, 3]), 8)(torch.zeros(2, 8)), MultiCategorical)
    assert isinstance(action_head(spaces.Box(-1, 1, (2,)), 8)(torch.zeros(2, 8)), DiagGaussian)
    assert isinstance(action_head(spaces.Box(-1, 1, (2,)), 8, squashed=True)(torch.zeros(2, 8)), SquashedDiagGaussian)
    with pytest.raises(TypeError, match="no action head"):
        action_head(spaces.MultiBinary(3), 8)


# ---------------------------------------------------------------------- rescaling
def test_rescaler_maps_the_unit_box_onto_the_bounds_and_clips():
    low, high = np.array([-2.0, 0.0, -np.inf], np.float32), np.array([2.0, 10.0, np.inf], np.float32)
    space = spaces.Box(low, high, dtype=np.float32)
    rescaler = ActionRescaler(space)
    policy = np.array([[-1.0, -1.0, -7.0], [0.0, 0.0, 0.0], [1.0, 1.0, 7.0], [3.0, -5.0, 1e9]])
    env = rescaler.to_env(policy)
    assert env.dtype == np.float32
    np.testing.assert_allclose(env, [[-2, 0, -7], [0, 5, 0], [2, 10, 7], [2, 0, 1e9]])
    assert all(space.contains(a) for a in env)
    np.testing.assert_allclose(rescaler.to_policy(env[:3]), policy[:3])


@settings(max_examples=50, deadline=None)
@given(
    low=st.floats(-100, 100),
    width=st.floats(1e-3, 100),
    action=st.lists(st.floats(-5, 5), min_size=1, max_size=8),
)
def test_rescaler_always_lands_in_the_box(low, width, action):
    space = spaces.Box(np.float32(low), np.float32(low + width), shape=(1,), dtype=np.float32)
    env = ActionRescaler(space).to_env(np.array(action)[:, None])
    assert (env >= space.low).all() and (env <= space.high).all()


# ---------------------------------------------------------------------- agents
def make_agent(space: spaces.Space, obs_dim: int = 3, **kwargs) -> ptl_rl.ActorCriticAgent:
    torch.manual_seed(0)
    actor = nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh(), action_head(space, 8, **kwargs.pop("head", {})))
    return ptl_rl.ActorCriticAgent(actor, nn.Linear(obs_dim, 1), space, **kwargs)


@pytest.mark.parametrize(
    ("space", "action_shape", "dtype"),
    [
        (spaces.Discrete(4), (), np.int64),
        (spaces.MultiDiscrete([2, 3]), (2,), np.int64),
        (spaces.Box(-2.0, 2.0, (2,), dtype=np.float32), (2,), np.float32),
    ],
)
def test_actor_critic_agent_outputs(space, action_shape, dtype):
    agent = make_agent(space, seed=0)
    obs = np.random.default_rng(0).normal(size=(5, 3))  # float64 on purpose: the agent casts to float32
    action, extras = agent(obs)
    assert action.shape == (5, *action_shape) and action.dtype == dtype
    assert all(space.contains(a) for a in (action if action_shape else action.tolist()))
    assert extras["log_prob"].shape == (5,) and extras["log_prob"].dtype == np.float32
    assert extras["value"].shape == (5,) and extras["value"].dtype == np.float32
    np.testing.assert_allclose(extras["value"], agent.value(obs), rtol=1e-6)
    batch = {"obs": torch.as_tensor(obs, dtype=torch.float32), "action": torch.as_tensor(action)}
    if isinstance(space, spaces.Box):
        assert extras["policy_action"].shape == (5, 2)
        np.testing.assert_allclose(action, ActionRescaler(space).to_env(extras["policy_action"]))
        batch["policy_action"] = torch.as_tensor(extras["policy_action"])
    log_prob, entropy, value = agent.evaluate_actions(batch)
    np.testing.assert_allclose(log_prob.detach().numpy(), extras["log_prob"], rtol=1e-5, atol=1e-6)
    assert entropy.shape == (5,) and value.requires_grad


def test_agent_sampling_is_reproducible_from_its_seed():
    space = spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
    obs = np.zeros((4, 3), dtype=np.float32)
    a1 = [make_agent(space, seed=7)(obs)[0] for _ in range(2)]
    a2 = make_agent(space, seed=7)(obs)[0]
    np.testing.assert_array_equal(a1[0], a2)
    assert not np.array_equal(make_agent(space, seed=8)(obs)[0], a2)


def test_greedy_agent_acts_with_the_mode():
    space = spaces.Box(-2.0, 2.0, (2,), dtype=np.float32)
    agent = make_agent(space, greedy=True)
    obs = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    action, extras = agent(obs)
    mean = agent.distribution(obs).mode().detach().numpy()
    np.testing.assert_allclose(extras["policy_action"], mean, rtol=1e-6)
    np.testing.assert_allclose(action, np.clip(mean, -1, 1) * 2, rtol=1e-6)


def test_warmup_acts_uniformly_then_follows_the_policy():
    space = spaces.Box(-2.0, 2.0, (1,), dtype=np.float32)
    agent = make_agent(space, warmup_steps=100, seed=0, head={"squashed": True})
    obs = np.zeros((4000, 3), dtype=np.float32)
    action, extras = agent(obs)
    assert action.min() < -1.9 and action.max() > 1.9 and abs(action.mean()) < 0.1
    np.testing.assert_allclose(extras["log_prob"], -np.log(2.0), rtol=1e-6)
    agent.on_env_steps(100)
    _, extras = agent(obs)
    assert not np.allclose(extras["log_prob"], -np.log(2.0))


def test_uniform_warmup_for_discrete_spaces():
    agent = make_agent(spaces.MultiDiscrete([2, 5]), warmup_steps=10, seed=0)
    action, extras = agent(np.zeros((3000, 3), dtype=np.float32))
    assert set(action[:, 0].tolist()) == {0, 1} and set(action[:, 1].tolist()) == set(range(5))
    np.testing.assert_allclose(extras["log_prob"], -np.log(10.0), rtol=1e-6)


def test_stochastic_policy_agent_accepts_raw_logits_for_discrete():
    agent = ptl_rl.StochasticPolicyAgent(nn.Linear(3, 4), spaces.Discrete(4), seed=0)
    action, extras = agent(np.zeros((2, 3), dtype=np.float32))
    assert action.shape == (2,) and set(extras) == {"log_prob"}
    with pytest.raises(TypeError, match="distribution"):
        ptl_rl.StochasticPolicyAgent(nn.Linear(3, 2), spaces.Box(-1, 1, (2,)))(np.zeros((2, 3), dtype=np.float32))


def test_deterministic_actor_agent_noise_clip_and_schedule():
    space = spaces.Box(0.0, 4.0, (2,), dtype=np.float32)
    actor = nn.Sequential(nn.Linear(3, 2), nn.Tanh())
    nn.init.constant_(actor[0].bias, 0.6)  # mean tanh(0.6) = 0.54: noise of std 0.8 gets clipped at 1
    agent = ptl_rl.DeterministicActorAgent(actor, space, noise_std=ptl_rl.LinearSchedule(0.8, 0.0, 100), seed=0)
    obs = np.zeros((4000, 3), dtype=np.float32)
    mean = actor(torch.zeros(1, 3)).detach().numpy()
    action, extras = agent(obs)
    assert extras["policy_action"].min() == -1 and extras["policy_action"].max() == 1
    assert (extras["policy_action"] == 1).mean() == pytest.approx(0.28, abs=0.03)  # P(N(0.54, 0.8^2) > 1)
    assert (action >= 0).all() and (action <= 4).all()
    agent.on_env_steps(100)
    action, extras = agent(obs)
    np.testing.assert_allclose(extras["policy_action"], np.repeat(mean, 4000, 0), rtol=1e-6)
    np.testing.assert_allclose(action, 2 + 2 * extras["policy_action"], rtol=1e-6)


def test_continuous_agent_drives_a_real_env_through_the_source():
    env = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
    agent = make_agent(env.single_action_space, seed=0)
    source = ptl_rl.ExperienceSource(env, agent, seed=0)
    batch = next(source)
    assert batch["action"].dtype == np.float32 and (np.abs(batch["action"]) <= 2).all()
    assert set(batch.extras) == {"log_prob", "value", "policy_action"}

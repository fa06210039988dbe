"""Entropy of the tanh-squashed Gaussian, and PPO/A2C training through a squashed policy."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import ptl_rl
from ptl_rl.agents.distributions import DiagGaussian, SquashedDiagGaussian
from ptl_rl.examples import ppo

# (mean, log_std) per row and action dimension: narrow and wide, centred and saturated, up to the head's bound 2
MEANS = [[0.0, 0.3], [-2.0, 1.0], [4.0, -0.5], [0.0, 0.0], [5.0, 0.0], [-1.0, 3.0]]
LOG_STDS = [[-3.0, 0.0], [-1.0, 1.0], [0.5, -0.5], [2.0, 1.5], [2.0, -5.0], [1.0, 0.0]]


def brute_force_entropy(dist: SquashedDiagGaussian, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte-Carlo ``-E[log p(a)]`` per row (float64 [B]) from ``samples`` reparameterized draws, and its std error."""
    generator = torch.Generator().manual_seed(seed)
    mean = dist.base.mean.unsqueeze(0).expand(samples, *dist.base.mean.shape)
    log_std = dist.base.log_std.unsqueeze(0).expand(samples, *dist.base.log_std.shape)
    _, log_prob = SquashedDiagGaussian(mean, log_std).rsample_with_log_prob(generator)  # [S, B]
    return -log_prob.mean(dim=0), log_prob.std(dim=0) / math.sqrt(samples)


def test_squashed_entropy_matches_a_brute_force_monte_carlo_estimate():
    dist = SquashedDiagGaussian(torch.tensor(MEANS, dtype=torch.float64), torch.tensor(LOG_STDS, dtype=torch.float64))
    reference, stderr = brute_force_entropy(dist, 400_000, seed=0)
    estimate = dist.entropy()
    assert estimate.shape == (len(MEANS),)
    # quadrature error (< 0.03 nats per dimension, see the docstring) plus the reference's own noise
    np.testing.assert_array_less((estimate - reference).abs().numpy(), (0.06 + 5 * stderr).numpy())


def test_squashed_entropy_lies_below_the_gaussian_one_and_meets_it_for_a_narrow_policy():
    """tanh contracts, so H[tanh(u)] < H[u]; around 0 with a tiny std tanh is nearly the identity."""
    mean, log_std = torch.tensor([[0.0, 0.0], [1.5, -2.0]]), torch.tensor([[-6.0, -6.0], [0.0, 0.5]])
    squashed, gaussian = SquashedDiagGaussian(mean, log_std).entropy(), DiagGaussian(mean, log_std).entropy()
    assert squashed[0].item() == pytest.approx(gaussian[0].item(), abs=1e-4)
    assert squashed[1] < gaussian[1] - 0.5


def test_squashed_entropy_gradient_matches_the_reparameterized_monte_carlo_gradient():
    mean = torch.tensor([[0.5, -1.0], [2.0, 0.0]], dtype=torch.float64, requires_grad=True)
    log_std = torch.tensor([[0.0, -0.5], [0.5, 1.0]], dtype=torch.float64, requires_grad=True)
    entropy = SquashedDiagGaussian(mean, log_std).entropy()
    grad_mean, grad_log_std = torch.autograd.grad(entropy.sum(), [mean, log_std])
    reference, _ = brute_force_entropy(SquashedDiagGaussian(mean, log_std), 400_000, seed=1)
    ref_mean, ref_log_std = torch.autograd.grad(reference.sum(), [mean, log_std])
    torch.testing.assert_close(grad_mean, ref_mean, atol=0.02, rtol=0.02)
    torch.testing.assert_close(grad_log_std, ref_log_std, atol=0.02, rtol=0.02)
    assert grad_log_std.abs().min() > 0.05  # the bonus really pushes the std


def test_actor_critic_agent_evaluates_actions_of_a_squashed_box_policy():
    env = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
    actor, critic = ppo.actor_critic(3, env.single_action_space, 16, squashed=True)
    agent = ptl_rl.ActorCriticAgent(actor, critic, env.single_action_space, seed=0)
    rollout = ptl_rl.RolloutBuffer(ptl_rl.ExperienceSource(env, agent, seed=0), 8, num_minibatches=2, seed=0)
    batch = next(rollout)
    log_prob, entropy, value = agent.evaluate_actions(batch)
    assert log_prob.shape == entropy.shape == value.shape == (len(batch),)
    assert torch.isfinite(entropy).all()
    # the stored log_prob was computed by the acting agent from the same weights
    torch.testing.assert_close(log_prob, batch.log_prob, atol=1e-3, rtol=1e-3)


def ppo_args(*extra: str) -> object:
    args = ["--env-id", "Pendulum-v1", "--squashed", "--no-progress-bar", "--hidden", "16", "--runs-dir", ""]
    return ppo.parse_args([*args, *extra])  # no run directory: a test must not write into the checkout


def test_ppo_loss_with_a_squashed_policy_sends_gradients_through_the_entropy_bonus():
    args = ppo_args("--ent-coef", "0.01", "--num-envs", "2", "--steps-per-env", "8")
    env = ppo.make_env(args.env_id, args.num_envs)
    model = ppo.PPO(3, env.single_action_space, args, num_rollouts=1)
    assert isinstance(model.agent.distribution(torch.zeros(1, 3)), SquashedDiagGaussian)
    rollout = ptl_rl.RolloutBuffer(ptl_rl.ExperienceSource(env, model.agent, seed=0), 8, num_minibatches=1, seed=0)
    batch = next(rollout)
    loss = model.ppo_loss(batch, batch_idx=0)  # the loss training_step steps the optimizer with
    loss.backward()
    grads = [p.grad for p in model.actor.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0
    # the entropy term alone reaches the policy's std output
    model.zero_grad()
    _, entropy, _ = model.agent.evaluate_actions(batch)
    entropy.mean().backward()
    assert model.actor[1].out.weight.grad.abs().sum() > 0


def test_ppo_trains_a_few_rollouts_with_a_squashed_policy():
    args = ppo_args("--env-steps", "256", "--num-envs", "2", "--steps-per-env", "32", "--update-epochs", "2",
                    "--eval-every", "0", "--final-eval-episodes", "2", "--eval-episodes", "2")  # fmt: skip
    result = ppo.train(args)
    assert result["rollouts"] == 4
    assert result["gradient_steps"] == 4 * 2 * args.num_minibatches  # every rollout trained in full
    assert np.isfinite(result["final_eval_return"])

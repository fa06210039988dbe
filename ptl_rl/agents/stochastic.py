"""Agents that sample from a policy: :class:`StochasticPolicyAgent`, its critic-holding :class:`ActorCriticAgent`
and the deprecated :class:`PolicyAgent`.

The policy is an :class:`~ptl_rl.agents.distributions.ActionDistribution` (or
raw logits for discrete spaces); sampling is seeded per device
(:mod:`ptl_rl.agents.seeding`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ptl_rl.agents.checks import check_network, check_output_width, scores_width, static_output_width
from ptl_rl.agents.distributions import (
    ActionDistribution,
    ActionRescaler,
    Categorical,
    MultiCategorical,
    uniform_log_prob,
)
from ptl_rl.agents.seeding import GeneratorPerDevice, SeededAgentState
from ptl_rl.agents.tensors import DeviceOf, as_float, is_tensor_tree, obs_to_tensor
from ptl_rl.core._trees import to_numpy
from ptl_rl.core.batch import TorchBatch
from ptl_rl.core.protocols import ObsTree


class StochasticPolicyAgent(SeededAgentState):
    """Samples actions from a policy ``actor(obs) -> ActionDistribution`` (see :mod:`ptl_rl.agents.distributions`).

    Works for ``Discrete``, ``MultiDiscrete`` and 1-d ``Box`` action spaces. For
    the discrete spaces the actor may also return raw logits (float [N, A], or
    [N, sum(nvec)]). ``agent(obs)`` returns ``(actions, extras)``:

    * ``actions``: int64 [N] (Discrete), int64 [N, K] (MultiDiscrete), or the
      env action [N, D] in the space's dtype (Box), produced from the policy
      action by :class:`~ptl_rl.agents.distributions.ActionRescaler` (the one place
      where actions are clipped and rescaled to the Box bounds).
    * ``extras["log_prob"]``: float32 [N], log-prob of the policy action.
    * ``extras["policy_action"]`` (Box only): float32 [N, D], the sampled
      action in policy space, which is what ``log_prob`` refers to and what
      losses should use (:meth:`policy_action` picks the right field).

    Args:
        actor: the policy network; moved with Lightning like any module (its
            device is read at each call).
        action_space: the env's single action space; ``None`` for a
            categorical policy whose actor returns logits [N, A] (a Discrete
            space whose size the logits give; ``warmup_steps`` then needs the space).
        greedy: act with the distribution's mode instead of a sample (evaluation).
        warmup_steps: act uniformly at random (in policy space) until the
            source has taken this many env steps (SAC/TD3 warm-up); the
            reported ``log_prob`` is then the uniform one.
        seed: seeds the sampling generator (one per device).
    """

    def __init__(
        self,
        actor: nn.Module,
        action_space: spaces.Space[Any] | None = None,
        *,
        greedy: bool = False,
        warmup_steps: int = 0,
        seed: int | None = None,
    ) -> None:
        if action_space is None:  # a categorical policy over the actor's logits
            self.action_spaces = (spaces.Discrete,)
            if warmup_steps:
                raise ValueError(
                    "warmup_steps acts uniformly at random, which needs the action space: pass "
                    "action_space=env.single_action_space"
                )
        elif not isinstance(action_space, (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)):
            kind = type(action_space).__name__
            raise TypeError(f"unsupported action space {kind}; use Discrete, MultiDiscrete or Box")
        self.actor = actor
        self.action_space = action_space
        self.greedy = bool(greedy)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = 0
        self.rescaler = ActionRescaler(action_space) if isinstance(action_space, spaces.Box) else None
        self._uniform_log_prob = 0.0 if action_space is None else uniform_log_prob(action_space)
        self._generator = GeneratorPerDevice(seed)
        self._actor_device = DeviceOf(actor)
        self._num_scores: int | None = None  # logits per observation a discrete space needs, once known
        if action_space is not None:
            self._expect_scores(action_space)

    def check_action_space(self, action_space: spaces.Space[Any]) -> None:
        """Check a discrete policy's logits against the env's ``action_space`` (called by ExperienceSource).

        An agent built for a space must get one with as many actions; a
        logits-only agent learns the number here. The actor's width is checked
        at once when it ends in ``nn.Linear`` or a categorical action head, and
        else at every call, before an action is sampled. Raises ValueError.
        """
        own = self.action_space
        if own is None:
            if isinstance(action_space, spaces.Discrete):
                self._expect_scores(action_space)
            return
        if type(own) is type(action_space) and scores_width(own) != scores_width(action_space):
            raise ValueError(
                f"{type(self).__name__} was built for the action space {own}, but the env's is {action_space}, "
                "which has other actions; build the agent (and its action_head) with env.single_action_space"
            )

    def _expect_scores(self, space: spaces.Space[Any]) -> None:
        num_scores = scores_width(space)
        if num_scores is None:
            return
        width = static_output_width(self.actor)
        if width is not None:
            check_output_width(type(self).__name__, width, space, "logits")
        self._num_scores, self._space = num_scores, space

    # ------------------------------------------------------------------ training-side helpers (with gradients)
    def distribution(self, obs: ObsTree) -> ActionDistribution:
        """The policy at ``obs`` (numpy or tensors, leading dim B) under the current weights, with gradients."""
        dtype = self._actor_device.float_dtype()
        if not isinstance(obs, torch.Tensor) and not (isinstance(obs, dict) and is_tensor_tree(obs)):
            obs = obs_to_tensor(obs, self._actor_device(), dtype)
        out = self.actor(as_float(obs, dtype))
        if self._num_scores is not None:
            self._check_logits(out)
        if isinstance(out, torch.Tensor):
            if self.action_space is None or isinstance(self.action_space, spaces.Discrete):
                return Categorical(out)
            if isinstance(self.action_space, spaces.MultiDiscrete):
                return MultiCategorical(out, self.action_space.nvec)
            raise TypeError("for a Box action space the actor must return a distribution (end it in an action_head)")
        return cast(ActionDistribution, out)  # (a Box space's actor ends in an action_head)

    def _check_logits(self, out: Any) -> None:
        """Raw logits, or a Categorical's, of another width than the space's would sample actions it lacks."""
        if isinstance(out, torch.Tensor):
            width = out.shape[-1]
        elif isinstance(out, Categorical) and isinstance(self._space, spaces.Discrete):
            width = out.log_probs.shape[-1]
        else:
            return
        if width != self._num_scores:
            check_output_width(type(self).__name__, int(width), self._space, "logits")

    @staticmethod
    def policy_action(batch: TorchBatch | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The action a log-prob refers to: ``batch.policy_action`` (Box) or ``batch.action`` (discrete)."""
        return batch["policy_action"] if "policy_action" in batch else batch["action"]

    # ------------------------------------------------------------------ acting
    def on_env_steps(self, total_steps: int) -> None:
        self.total_steps = int(total_steps)

    @torch.inference_mode()  # cheaper than no_grad; the outputs leave as numpy
    def __call__(self, obs: ObsTree) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        dist = self.distribution(obs)
        action, log_prob = self._choose(dist)
        return self._outputs(action, log_prob, {})

    def _choose(self, dist: ActionDistribution) -> tuple[torch.Tensor, torch.Tensor]:
        if self.total_steps < self.warmup_steps:
            return self._uniform(dist)
        if self.greedy:
            action = dist.mode()
            return action, dist.log_prob(action)
        return dist.sample_with_log_prob(self._generator(self._actor_device()))

    def _uniform(self, dist: ActionDistribution) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform random actions in policy space, shaped like a sample of ``dist``."""
        like = dist.mode()
        generator = self._generator(like.device)
        if isinstance(self.action_space, spaces.Box):
            action = torch.rand(like.shape, generator=generator, device=like.device) * 2.0 - 1.0
        else:
            choices = getattr(self.action_space, "nvec", getattr(self.action_space, "n", 1))
            high = torch.as_tensor(np.array(np.broadcast_to(choices, like.shape[1:])), device=like.device)
            action = (torch.rand(like.shape, generator=generator, device=like.device) * high).long()
        return action, torch.full(like.shape[:1], self._uniform_log_prob, device=like.device)

    def _outputs(
        self, action: torch.Tensor, log_prob: torch.Tensor, extras: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        extras["log_prob"] = to_numpy(log_prob.float())
        action_np = to_numpy(action)
        if self.rescaler is None:
            return action_np.astype(np.int64, copy=False), extras
        extras["policy_action"] = action_np.astype(np.float32, copy=False)
        return self.rescaler.to_env(action_np), extras


class PolicyAgent(StochasticPolicyAgent):
    """Deprecated: ``StochasticPolicyAgent(net)`` does the same (a categorical policy over ``net``'s logits [N, A]).

    It once was a separate, smaller agent; the two sampled the same way, so one
    remains. ``PolicyAgent(net, greedy, seed)`` still works and warns.
    """

    def __init__(self, net: nn.Module, greedy: bool = False, seed: int | None = None) -> None:
        warnings.warn(
            "PolicyAgent is deprecated: use ptl_rl.StochasticPolicyAgent(net) (or pass the env's action space)",
            DeprecationWarning,
            stacklevel=2,
        )
        check_network(net, "PolicyAgent")
        super().__init__(net, None, greedy=greedy, seed=seed)


class ActorCriticAgent(StochasticPolicyAgent):
    """A :class:`StochasticPolicyAgent` with a state-value critic, for PPO and A2C.

    ``critic(obs)`` gives values float [N] or [N, 1]. Besides the policy's
    extras, ``agent(obs)`` returns ``extras["value"]`` float32 [N] (the value
    of ``obs`` under the acting weights); :meth:`value` evaluates the critic
    on other observations (a rollout's bootstrap ``next_obs``), and
    :meth:`evaluate_actions` gives what a policy-gradient loss needs, with
    gradients.
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        action_space: spaces.Space[Any],
        *,
        greedy: bool = False,
        warmup_steps: int = 0,
        seed: int | None = None,
    ) -> None:
        super().__init__(actor, action_space, greedy=greedy, warmup_steps=warmup_steps, seed=seed)
        self.critic = critic
        self._critic_device = DeviceOf(critic)

    def critic_value(self, obs: ObsTree) -> torch.Tensor:
        """Values float [B] of ``obs`` (tensors on the critic's device), with gradients."""
        dtype = self._critic_device.float_dtype()
        if not isinstance(obs, torch.Tensor) and not (isinstance(obs, dict) and is_tensor_tree(obs)):
            obs = obs_to_tensor(obs, self._critic_device(), dtype)
        out = self.critic(as_float(obs, dtype))
        values: torch.Tensor = out.reshape(out.shape[0])
        return values

    @torch.inference_mode()  # cheaper than no_grad; the outputs leave as numpy
    def value(self, obs: ObsTree) -> np.ndarray:
        """Values float32 [B] of a batch of numpy observations (no gradients)."""
        return self.critic_value(obs).float().cpu().numpy()

    @torch.inference_mode()  # cheaper than no_grad; the outputs leave as numpy
    def __call__(self, obs: ObsTree) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        obs_t = obs_to_tensor(obs, self._actor_device(), self._actor_device.float_dtype())
        dist = self.distribution(obs_t)
        action, log_prob = self._choose(dist)
        value = self.critic_value(obs_t)
        return self._outputs(action, log_prob, {"value": value.float().cpu().numpy()})

    def evaluate_actions(
        self, batch: TorchBatch | Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy, value)``, each float [B], of ``batch``'s actions under the current weights."""
        dist = self.distribution(batch["obs"])
        return dist.log_prob(self.policy_action(batch)), dist.entropy(), self.critic_value(batch["obs"])

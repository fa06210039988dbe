"""Agents: callables from a batch of observations to a batch of actions (and extras)."""

from __future__ import annotations

import copy
import numbers
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ptl_rl.agents.checks import check_output_width, scores_width, static_output_width
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.core._trees import to_numpy
from ptl_rl.core.batch import TorchBatch
from ptl_rl.agents.distributions import ActionDistribution, ActionRescaler, Categorical, MultiCategorical, uniform_log_prob
from ptl_rl.core.protocols import ObsTree
from ptl_rl.core.ranks import rank_seed
from ptl_rl.core.schedules import LinearSchedule, as_schedule
from ptl_rl.agents.selectors import EpsilonGreedySelector


class _DeviceOf:
    """The device of a module's first parameter, read on every call.

    ``Module.to()`` moves parameters in place (the Parameter object stays), so
    holding on to the first one follows the module across devices without
    walking ``parameters()`` on every step.
    """

    def __init__(self, net: nn.Module) -> None:
        self._probe = next(iter(net.parameters()), None)

    def __call__(self) -> torch.device:
        return self._probe.device if self._probe is not None else torch.device("cpu")

    def float_dtype(self) -> torch.dtype:
        """The network's floating dtype (bfloat16 under ``precision="bf16-true"``); float32 if it has no floats."""
        probe = self._probe
        return probe.dtype if probe is not None and probe.is_floating_point() else torch.float32


def obs_to_tensor(obs: ObsTree, device: torch.device, float_dtype: torch.dtype = torch.float32) -> Any:
    """Numpy observations (array or dict of arrays) -> tensors on ``device``.

    Floating arrays become ``float_dtype`` (pass the network's dtype, e.g.
    bfloat16 under ``precision="bf16-true"``); integer arrays such as uint8
    pixels keep their dtype, and the network converts them.
    """
    if isinstance(obs, dict):
        return {k: obs_to_tensor(v, device, float_dtype) for k, v in obs.items()}
    if type(obs) is np.ndarray and obs.flags.writeable and obs.dtype.isnative and obs.dtype.kind in "fiub":
        # what envs return: zero-copy and several times cheaper than as_tensor (~1 us vs ~3.5 us a call)
        t = torch.from_numpy(obs)
        t = t if getattr(device, "type", device) == "cpu" else t.to(device)
    else:
        t = torch.as_tensor(obs, device=device)
    return t.to(float_dtype) if t.is_floating_point() and t.dtype != float_dtype else t


class SelectorHooks:
    """The agent hooks a Q-value agent forwards to its ``selector``: exploration clock, rank and state.

    Shared by :class:`DQNAgent` and :class:`~ptl_rl.agents.recurrent.RecurrentDQNAgent`; a selector without a
    hook (e.g. ``ArgmaxSelector``) makes it a no-op.
    """

    selector: Any

    def on_env_steps(self, total_steps: int) -> None:
        hook = getattr(self.selector, "on_env_steps", None)
        if hook is not None:
            hook(total_steps)

    def set_rank(self, rank: int) -> None:
        """Rank-distinct exploration under DDP: passed on to the selector."""
        hook = getattr(self.selector, "set_rank", None)
        if hook is not None:
            hook(rank)

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """The selector's state (exploration RNG, epsilon); the network's weights live in the LightningModule."""
        hook = getattr(self.selector, "state_dict", None)
        return versioned({"selector": hook()} if hook is not None else {}, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        if "selector" in state:
            self.selector.load_state_dict(state["selector"])


class DQNAgent(SelectorHooks):
    """Acts with a Q-network: ``q = net(obs)`` float [N, A], then ``selector(q)`` -> int64 [N].

    Observations are moved to the network's device (read at every call, so
    moving the network with Lightning just works). ``selector`` defaults to an
    epsilon-greedy selector; its epsilon schedule follows the env-step count
    that :class:`~ptl_rl.stages.source.ExperienceSource` reports through
    :meth:`on_env_steps`. With a selector that has ``select_lazily`` (as
    :class:`EpsilonGreedySelector` does) the selector first draws which envs
    explore, and a step on which all of them do skips the forward pass: the
    same actions, without the network's cost (once the env's action space is
    known and one forward pass has checked the width).

    Q-values need a ``Discrete`` action space (starting at 0) and one Q-value
    per action: the source checks both when it is built (:attr:`action_spaces`,
    :meth:`check_action_space`), and so does the constructor when given the
    optional ``action_space``. A width that only the forward pass shows is
    checked at every call, before an action is picked.

    Examples:
        >>> import numpy as np
        >>> import torch
        >>> from torch import nn
        >>> import ptl_rl
        >>> net = nn.Linear(4, 2)
        >>> with torch.no_grad():  # action 1 always has the larger Q-value
        ...     _ = net.weight.zero_(), net.bias.copy_(torch.tensor([0.0, 1.0]))
        >>> greedy = ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector())
        >>> greedy(np.zeros((3, 4), dtype=np.float32))
        array([1, 1, 1])
        >>> epsilon = ptl_rl.LinearSchedule(1.0, 0.05, 1_000)
        >>> explore = ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(epsilon, seed=0))
        >>> explore(np.zeros((3, 4), dtype=np.float32))  # epsilon 1.0 at first: uniformly random
        array([0, 0, 0])
        >>> explore.on_env_steps(1_000)  # the source calls this after every step
        >>> explore.selector.epsilon
        0.05
    """

    action_spaces = (spaces.Discrete,)

    def __init__(
        self, net: nn.Module, selector: Any | None = None, *, action_space: spaces.Space | None = None
    ) -> None:
        _check_network(net, "DQNAgent")
        _check_selector(selector)
        if action_space is not None and not isinstance(action_space, spaces.Discrete):
            raise TypeError(
                f"DQNAgent picks one of n discrete actions from Q-values, but the action space is {action_space}; "
                "use a Discrete env, or for Box actions StochasticPolicyAgent/ActorCriticAgent or "
                "DeterministicActorAgent"
            )
        self.net = net
        self.selector = selector if selector is not None else EpsilonGreedySelector()
        self.action_space = action_space
        self._device = _DeviceOf(net)
        self._num_actions: int | None = None  # the env's, once known: every call checks the Q-values' width
        # selector.select_lazily(n, num_actions, scores_fn) (EpsilonGreedySelector's) may skip the forward pass;
        # used only after a first forward pass, so that a network of the wrong width fails at the first step
        self._width_seen = False
        if action_space is not None:
            self.check_action_space(action_space)

    def check_action_space(self, action_space: spaces.Space) -> None:
        """Check that the network gives one Q-value per action of ``action_space`` (Discrete).

        Called by :class:`~ptl_rl.stages.source.ExperienceSource` when it is built.
        A network ending in ``nn.Linear`` is checked at once; any other at
        every call, before the selector picks an action, so an action the env
        does not have never reaches it (the selector, exploring included,
        draws among the network's outputs). Raises ValueError naming both.
        """
        if not isinstance(action_space, spaces.Discrete):
            return  # check_agent reports the kind of space; nothing to count here
        num_actions = scores_width(action_space)
        width = static_output_width(self.net)
        if width is not None:
            check_output_width("DQNAgent", width, action_space, "Q-values")
        self._num_actions, self._space = num_actions, action_space

    def __call__(self, obs: ObsTree) -> np.ndarray:
        # looked up at every call: a selector swapped in later (greedy for a while, say) is the one used
        select: Callable[[int, int, Callable[[], np.ndarray]], np.ndarray] | None = (
            getattr(self.selector, "select_lazily", None) if self._width_seen else None
        )
        if select is None or self._num_actions is None or type(obs) is not np.ndarray:
            return self.selector(self._q_values(obs))
        # the selector decides first who explores: when every env does, no forward pass is needed
        return select(len(obs), self._num_actions, lambda: self._q_values(obs))

    @torch.no_grad()
    def _q_values(self, obs: Any) -> np.ndarray:
        q = self.net(obs_to_tensor(obs, self._device(), self._device.float_dtype()))
        if self._num_actions is not None and q.shape[-1] != self._num_actions:
            check_output_width("DQNAgent", int(q.shape[-1]), self._space, "Q-values")
        self._width_seen = True
        return to_numpy(q)


class TargetNet(nn.Module):
    """A frozen copy of ``model`` for bootstrapped targets.

    :meth:`sync` copies the weights (hard update); :meth:`soft_sync` moves them
    by ``tau`` (Polyak averaging: ``target = (1 - tau) * target + tau * model``).
    Call it like the model: ``target(obs)``. It is an ``nn.Module`` holding only
    the copy, so as an attribute of a LightningModule it moves to the module's
    device and is saved in checkpoints, while ``model`` is not registered twice.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._source = [model]  # a list keeps the online model out of this module's parameters
        self.target = copy.deepcopy(model)
        self.target.requires_grad_(False)

    @property
    def model(self) -> nn.Module:
        return self._source[0]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.target(*args, **kwargs)

    @torch.no_grad()
    def sync(self) -> None:
        self.target.load_state_dict(self.model.state_dict())

    @torch.no_grad()
    def soft_sync(self, tau: float) -> None:
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau}")
        for target, source in zip(self.target.parameters(), self.model.parameters(), strict=True):
            target.lerp_(source, tau)
        for target_buffer, source_buffer in zip(self.target.buffers(), self.model.buffers(), strict=True):
            target_buffer.copy_(source_buffer)


# ---------------------------------------------------------------------- actor-critic and continuous agents
def _seeded_generator(device: torch.device, seed: int | None) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # an unseeded torch.Generator would always start from the same fixed seed
    else:
        generator.manual_seed(int(seed))
    return generator


class _GeneratorPerDevice:
    """One seeded generator per device: sampling happens where the network lives, without host round trips."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.base_seed = seed  # the seed given, before any rank offset
        self.rank = 0
        self._generators: dict[torch.device, torch.Generator] = {}

    def __call__(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = self._generators[device] = _seeded_generator(device, self.seed)
        return generator

    def set_rank(self, rank: int) -> None:
        """Re-seed for ``rank`` (a no-op when already there, so a restored state is kept)."""
        if int(rank) != self.rank:
            self.rank = int(rank)
            self.seed = rank_seed(self.base_seed, self.rank)
            self._generators.clear()

    def state_dict(self) -> dict[str, Any]:
        return {str(device): generator.get_state() for device, generator in self._generators.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for device, generator_state in state.items():
            self(torch.device(device)).set_state(generator_state)


class _SeededAgentState:
    """``state_dict``/``set_rank`` of an agent whose only state is ``total_steps`` and its sampling generators."""

    _generator: _GeneratorPerDevice
    total_steps: int

    def set_rank(self, rank: int) -> None:
        """Rank-distinct sampling under DDP."""
        self._generator.set_rank(rank)

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """Env-step count and sampling RNG states; the networks' weights live in the LightningModule."""
        state = {"total_steps": self.total_steps, "generators": self._generator.state_dict()}
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.on_env_steps(int(state["total_steps"]))  # type: ignore[attr-defined]
        self._generator.load_state_dict(state["generators"])


class StochasticPolicyAgent(_SeededAgentState):
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
        action_space: spaces.Space | None = None,
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
        self._generator = _GeneratorPerDevice(seed)
        self._actor_device = _DeviceOf(actor)
        self._num_scores: int | None = None  # logits per observation a discrete space needs, once known
        if action_space is not None:
            self._expect_scores(action_space)

    def check_action_space(self, action_space: spaces.Space) -> None:
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

    def _expect_scores(self, space: spaces.Space) -> None:
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
        if not isinstance(obs, torch.Tensor) and not (isinstance(obs, dict) and _is_tensor_tree(obs)):
            obs = obs_to_tensor(obs, self._actor_device(), dtype)
        out = self.actor(_as_float(obs, dtype))
        if self._num_scores is not None:
            self._check_logits(out)
        if isinstance(out, torch.Tensor):
            if self.action_space is None or isinstance(self.action_space, spaces.Discrete):
                return Categorical(out)
            if isinstance(self.action_space, spaces.MultiDiscrete):
                return MultiCategorical(out, self.action_space.nvec)
            raise TypeError("for a Box action space the actor must return a distribution (end it in an action_head)")
        return out

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
        _check_network(net, "PolicyAgent")
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

    def __init__(self, actor: nn.Module, critic: nn.Module, action_space: spaces.Space, **kwargs: Any) -> None:
        super().__init__(actor, action_space, **kwargs)
        self.critic = critic
        self._critic_device = _DeviceOf(critic)

    def critic_value(self, obs: ObsTree) -> torch.Tensor:
        """Values float [B] of ``obs`` (tensors on the critic's device), with gradients."""
        dtype = self._critic_device.float_dtype()
        if not isinstance(obs, torch.Tensor) and not (isinstance(obs, dict) and _is_tensor_tree(obs)):
            obs = obs_to_tensor(obs, self._critic_device(), dtype)
        out = self.critic(_as_float(obs, dtype))
        return out.reshape(out.shape[0])

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


class DeterministicActorAgent(_SeededAgentState):
    """Acts with a deterministic actor plus Gaussian exploration noise (DDPG/TD3 style), for Box spaces.

    ``actor(obs)`` gives policy actions float [N, D] in ``[-1, 1]`` (end it in
    ``tanh``). The agent adds ``N(0, noise_std^2)`` noise, clips to ``[-1, 1]``
    and returns ``(env_actions, {"policy_action": float32 [N, D]})``, with env
    actions from :class:`~ptl_rl.agents.distributions.ActionRescaler`.

    Args:
        noise_std: a float, or a schedule ``env_steps -> std`` such as
            :class:`~ptl_rl.agents.selectors.LinearSchedule`; 0 acts greedily.
        warmup_steps: uniformly random policy actions until this many env steps.
        seed: seeds the noise generator.
    """

    action_spaces = (spaces.Box,)

    def __init__(
        self,
        actor: nn.Module,
        action_space: spaces.Box,
        *,
        noise_std: float | Any = 0.1,
        warmup_steps: int = 0,
        seed: int | None = None,
    ) -> None:
        self.actor = actor
        self.rescaler = ActionRescaler(action_space)
        self.schedule = as_schedule(noise_std)
        self.noise_std = float(self.schedule(0))
        self.warmup_steps = int(warmup_steps)
        self.total_steps = 0
        self._generator = _GeneratorPerDevice(seed)
        self._actor_device = _DeviceOf(actor)

    def on_env_steps(self, total_steps: int) -> None:
        self.total_steps = int(total_steps)
        self.noise_std = float(self.schedule(total_steps))

    @torch.inference_mode()  # cheaper than no_grad; the outputs leave as numpy
    def __call__(self, obs: ObsTree) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        device = self._actor_device()
        mean = self.actor(obs_to_tensor(obs, device, self._actor_device.float_dtype()))
        generator = self._generator(device)
        if self.total_steps < self.warmup_steps:
            action = torch.rand(mean.shape, generator=generator, device=device) * 2.0 - 1.0
        elif self.noise_std > 0.0:
            noise = torch.randn(mean.shape, generator=generator, device=device) * self.noise_std
            action = (mean + noise).clamp(-1.0, 1.0)
        else:
            action = mean.clamp(-1.0, 1.0)
        policy_action = action.float().cpu().numpy()
        return self.rescaler.to_env(policy_action), {"policy_action": policy_action}


def _check_network(net: Any, agent: str) -> None:
    if not isinstance(net, nn.Module):
        raise TypeError(f"{agent} needs a torch network (nn.Module) as its first argument, got {type(net).__name__}")


def _check_selector(selector: Any) -> None:
    """A selector maps Q-values to actions; catch an epsilon value or schedule passed in its place."""
    if selector is None:
        return
    if isinstance(selector, (LinearSchedule, numbers.Real)):
        raise TypeError(
            f"DQNAgent's second argument is the action selector (Q-values -> actions), got {selector!r}, which is "
            "an epsilon value or schedule. Wrap it: DQNAgent(net, EpsilonGreedySelector(epsilon)), e.g. "
            "EpsilonGreedySelector(LinearSchedule(1.0, 0.05, 10_000))"
        )
    if not callable(selector):
        raise TypeError(
            f"DQNAgent's selector must be callable as selector(q_values) -> actions, got {type(selector).__name__}; "
            "use EpsilonGreedySelector(...) or ArgmaxSelector()"
        )


def _is_tensor_tree(obs: dict) -> bool:
    return all(isinstance(v, torch.Tensor) or (isinstance(v, dict) and _is_tensor_tree(v)) for v in obs.values())


def _as_float(obs: Any, dtype: torch.dtype) -> Any:
    """Floating tensors -> ``dtype`` (the network's); integer observations are left to the network."""
    if isinstance(obs, dict):
        return {k: _as_float(v, dtype) for k, v in obs.items()}
    return obs.to(dtype) if obs.is_floating_point() and obs.dtype != dtype else obs

"""Q-value agents: :class:`DQNAgent`, the selector hooks it shares with the recurrent DQN agent, and :class:`TargetNet`.

A Q-value agent scores every discrete action with its network and leaves the
choice to a selector (:mod:`ptl_rl.agents.selectors`); :class:`TargetNet` is
the frozen copy its learner bootstraps from.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ptl_rl.agents.checks import check_network, check_output_width, check_selector, scores_width, static_output_width
from ptl_rl.agents.selectors import EpsilonGreedySelector, Selector
from ptl_rl.agents.tensors import DeviceOf, obs_to_tensor
from ptl_rl.core._trees import to_numpy
from ptl_rl.core.protocols import ObsTree
from ptl_rl.core.versions import check_version, versioned


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
        self, net: nn.Module, selector: Selector | None = None, *, action_space: spaces.Space[Any] | None = None
    ) -> None:
        check_network(net, "DQNAgent")
        check_selector(selector)
        if action_space is not None and not isinstance(action_space, spaces.Discrete):
            raise TypeError(
                f"DQNAgent picks one of n discrete actions from Q-values, but the action space is {action_space}; "
                "use a Discrete env, or for Box actions StochasticPolicyAgent/ActorCriticAgent or "
                "DeterministicActorAgent"
            )
        self.net = net
        self.selector = selector if selector is not None else EpsilonGreedySelector()
        self.action_space = action_space
        self._device = DeviceOf(net)
        self._num_actions: int | None = None  # the env's, once known: every call checks the Q-values' width
        # selector.select_lazily(n, num_actions, scores_fn) (EpsilonGreedySelector's) may skip the forward pass;
        # used only after a first forward pass, so that a network of the wrong width fails at the first step
        self._width_seen = False
        if action_space is not None:
            self.check_action_space(action_space)

    def check_action_space(self, action_space: spaces.Space[Any]) -> None:
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
            actions: np.ndarray = self.selector(self._q_values(obs))
            return actions
        # the selector decides first who explores: when every env does, no forward pass is needed
        return select(len(obs), self._num_actions, lambda: self._q_values(obs))

    @torch.no_grad()
    def _q_values(self, obs: Any) -> np.ndarray:
        q = self.net(obs_to_tensor(obs, self._device(), self._device.float_dtype()))
        if self._num_actions is not None and q.shape[-1] != self._num_actions:
            check_output_width("DQNAgent", int(q.shape[-1]), self._space, "Q-values")
        self._width_seen = True
        q_values: np.ndarray = to_numpy(q)
        return q_values


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

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # (the model's own arguments, whatever they are)
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

"""Construction-time checks of an agent against the env it will act in.

:class:`~ptl_rl.stages.source.ExperienceSource` calls :func:`check_agent` when it is
built, so that a mistake that would otherwise surface as a raw torch error on
the first ``next()`` (a bare network passed as the agent, a Q-network agent on
a continuous action space) is reported with the fix. See
``docs/design/construction-checks.md``.

An agent declares what it supports in one of two ways, both optional:

* ``action_spaces``: a tuple of ``gymnasium.spaces.Space`` classes it can act
  in (``DQNAgent`` and a logits-only ``StochasticPolicyAgent``: ``(Discrete,)``);
* ``action_space``: the space it was built for (``StochasticPolicyAgent``);
  its type must match the env's.

Plain callables declare nothing and are not checked.

An agent that scores discrete actions (``DQNAgent``, a categorical
``StochasticPolicyAgent``) also has ``check_action_space(space)``, which
:func:`check_agent` calls: the width of the network's output must be the
number of actions (:func:`check_output_width`), known at once for a network
that ends in a linear layer (:func:`static_output_width`) and otherwise at
the agent's first call, before any action leaves it.

The agents' constructors check their own arguments too: :func:`check_network`
(a network where one is expected) and :func:`check_selector` (an epsilon passed
where a Q-value agent's selector goes).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from gymnasium import spaces
from torch import nn

from ptl_rl.core.schedules import LinearSchedule

# what to use instead, per kind of action space, for the messages
_AGENTS_FOR = {
    spaces.Discrete: "DQNAgent (Q-values), PolicyAgent (logits) or StochasticPolicyAgent/ActorCriticAgent",
    spaces.MultiDiscrete: "StochasticPolicyAgent or ActorCriticAgent (with ptl_rl.action_head)",
    spaces.Box: "StochasticPolicyAgent/ActorCriticAgent (Gaussian ptl_rl.action_head) or DeterministicActorAgent",
}


def check_agent(agent: Any, action_space: spaces.Space[Any] | None) -> None:
    """Raise ``TypeError`` naming the fix if ``agent`` cannot act in ``action_space`` (the env's single space)."""
    if isinstance(agent, nn.Module):
        raise TypeError(
            f"the agent is a bare torch module ({type(agent).__name__}), but ExperienceSource calls agent(obs) with "
            "numpy observations and expects numpy actions. Wrap the network in an agent: ptl_rl.DQNAgent(net) for "
            "Q-values, ptl_rl.PolicyAgent(net) for logits, ptl_rl.StochasticPolicyAgent(actor, "
            "env.single_action_space) for a policy ending in ptl_rl.action_head. (A module that really maps numpy "
            "to numpy can be passed as lambda obs: module(obs).)"
        )
    if action_space is None:
        return
    supported = getattr(agent, "action_spaces", None)
    if supported is not None and not isinstance(action_space, tuple(supported)):
        names = " or ".join(kind.__name__ for kind in supported)
        raise TypeError(
            f"{type(agent).__name__} acts in {names} action spaces, but the env's action space is {action_space}. "
            f"{_instead(action_space)}"
        )
    own = getattr(agent, "action_space", None)
    if isinstance(own, spaces.Space) and type(own) is not type(action_space):
        raise TypeError(
            f"{type(agent).__name__} was built for the action space {own}, but the env's is {action_space}; "
            "build the agent with env.single_action_space (or env.action_space for a single env)"
        )
    hook = getattr(agent, "check_action_space", None)
    if callable(hook):  # the width of the agent's output, now if it shows, else at its first call
        hook(action_space)


def static_output_width(net: nn.Module) -> int | None:
    """The size of the last dimension of ``net``'s output, when it shows without a forward pass, else ``None``.

    Known for an ``nn.Linear`` (or a categorical action head) and for an
    ``nn.Sequential`` that ends in one; any other module may reshape its
    output in ``forward``, so its width is left to the first call.
    """
    while isinstance(net, nn.Sequential) and len(net):
        net = net[-1]
    if isinstance(net, nn.Linear) and not isinstance(net, nn.LazyLinear):
        return int(net.out_features)
    logits = getattr(net, "logits", None)  # CategoricalHead / MultiCategoricalHead: their own linear layer
    if type(net).__name__ in ("CategoricalHead", "MultiCategoricalHead") and isinstance(logits, nn.Linear):
        return int(logits.out_features)
    return None


def scores_width(space: spaces.Space[Any]) -> int | None:
    """How many scores (Q-values, logits) a network needs for ``space``: Discrete ``n``, MultiDiscrete ``sum(nvec)``.

    ``None`` for other spaces. A non-zero ``start`` raises ValueError: score
    ``i`` is action ``i``, so actions would be off by ``start``.
    """
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(
                f"the action space {space} starts at {int(space.start)}, but ptl_rl's discrete agents pick action i "
                f"from score i (actions 0..{int(space.n) - 1}). Shift the env's actions to start at 0, e.g. with a "
                "gymnasium.ActionWrapper, and build the agent for Discrete(n)"
            )
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.asarray(space.nvec).sum())
    return None


def check_output_width(agent: str, width: int, space: spaces.Space[Any], what: str = "scores") -> None:
    """Raise ValueError naming the action space and the agent's output if ``width`` does not fit ``space``."""
    expected = scores_width(space)
    if expected is None or width == expected:
        return
    if isinstance(space, spaces.Discrete):
        if width > expected:
            effect = f"it would pick actions up to {width - 1}, which the env does not have (it has 0..{expected - 1})"
        else:
            effect = f"it could never pick actions {width}..{expected - 1}"
        fix = f"env.single_action_space.n = {expected} outputs"
    else:
        effect = "its logits would not split into the space's choices"
        fix = f"sum(env.single_action_space.nvec) = {expected} outputs (or end it in ptl_rl.action_head(space, ...))"
    raise ValueError(
        f"{agent}'s network outputs {width} {what} per observation, but the env's action space is {space}, which "
        f"needs {expected}: {effect}. Build the network's last layer with {fix}"
    )


def check_network(net: Any, agent: str) -> None:
    """Raise TypeError if ``net``, the first argument of ``agent`` (its name), is not an ``nn.Module``."""
    if not isinstance(net, nn.Module):
        raise TypeError(f"{agent} needs a torch network (nn.Module) as its first argument, got {type(net).__name__}")


def check_selector(selector: Any) -> None:
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


def _instead(space: spaces.Space[Any]) -> str:
    for kind, agents in _AGENTS_FOR.items():
        if isinstance(space, kind):
            return f"For {kind.__name__} actions use {agents}."
    return "Use an agent written for that space (a callable obs -> actions)."

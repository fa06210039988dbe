"""Construction-time checks of an agent against the env it will act in.

:class:`~ptl_rl.source.ExperienceSource` calls :func:`check_agent` when it is
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
"""

from __future__ import annotations

from typing import Any

from gymnasium import spaces
from torch import nn

# what to use instead, per kind of action space, for the messages
_AGENTS_FOR = {
    spaces.Discrete: "DQNAgent (Q-values), PolicyAgent (logits) or StochasticPolicyAgent/ActorCriticAgent",
    spaces.MultiDiscrete: "StochasticPolicyAgent or ActorCriticAgent (with ptl_rl.action_head)",
    spaces.Box: "StochasticPolicyAgent/ActorCriticAgent (Gaussian ptl_rl.action_head) or DeterministicActorAgent",
}


def check_agent(agent: Any, action_space: spaces.Space | None) -> None:
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


def _instead(space: spaces.Space) -> str:
    for kind, agents in _AGENTS_FOR.items():
        if isinstance(space, kind):
            return f"For {kind.__name__} actions use {agents}."
    return "Use an agent written for that space (a callable obs -> actions)."

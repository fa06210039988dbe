"""What a source needs of the agent it acts with, the capabilities an agent may have, and recurrent networks'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

#: A batch of observations: an array ``[N, *obs_shape]`` (numpy from a source; torch in a learner, from a
#: :class:`~ptl_rl.core.batch.TorchBatch`), or a (nested) dict of such arrays, as a ``Dict`` observation space gives.
#: (A string: the alias refers to itself, and torch is imported for the checker only.)
ObsTree: TypeAlias = "np.ndarray | torch.Tensor | Mapping[str, ObsTree]"


@runtime_checkable
class Agent(Protocol):
    """What an :class:`~ptl_rl.stages.source.ExperienceSource` acts with: a callable from observations to actions.

    ``agent(obs)`` gets the batch of observations of all sub-envs (numpy
    ``[N, *obs_shape]``, or a dict of such arrays) and returns the actions
    ``[N, *action_shape]``, or ``(actions, extras)`` with ``extras`` a dict of
    arrays ``[N, ...]`` (``log_prob``, ``value``) stored as fields of the
    transitions. Any function or lambda is an agent. The source calls it once
    per vector step, with the learner's current weights.
    """

    # positional-only: the source passes obs by position, so any one-argument callable (a lambda) is an agent
    def __call__(self, obs: Any, /) -> Any: ...


@runtime_checkable
class RecurrentAgent(Protocol):
    """An agent with a hidden state per env: ``reset_state(mask)`` clears it for the envs that start an episode.

    ``mask`` is bool [N]; the source calls it before acting whenever some
    env's observation is the first of an episode.
    """

    def reset_state(self, mask: np.ndarray) -> None: ...


@runtime_checkable
class EnvStepAware(Protocol):
    """An agent (or selector) whose behaviour follows the env-step count (an epsilon schedule, a noise scale).

    The source calls ``on_env_steps(total_steps)`` after every vector step.
    """

    def on_env_steps(self, total_steps: int) -> None: ...


@runtime_checkable
class Critic(Protocol):
    """An agent that estimates state values: ``value(obs) -> float32 [N]``.

    A :class:`~ptl_rl.replay.RolloutBuffer` bootstraps its last step from the
    critic of the first agent upstream that has one.
    """

    def value(self, obs: Any) -> np.ndarray: ...


@runtime_checkable
class TransitionCritic(Protocol):
    """An agent whose values need more than an observation (a recurrent state): ``next_value(rows) -> float32 [R]``.

    ``rows`` maps each field of a rollout (``obs``, ``next_obs``, the agent's
    extras such as ``hidden``) to the arrays of ``R`` rows; the result is
    ``V(next_obs)`` of each row. A :class:`~ptl_rl.replay.RolloutBuffer`
    bootstraps through it in preference to :class:`Critic`.
    """

    def next_value(self, rows: Mapping[str, Any]) -> np.ndarray: ...


@runtime_checkable
class RecurrentQNet(Protocol):
    """What :class:`~ptl_rl.RecurrentDQNAgent` needs of its network.

    ``initial_state(n)`` gives the zero state float [n, S];
    ``step(obs [n, ...], state [n, S])`` gives ``(q [n, A], new_state [n, S])``.
    A module built around a :class:`~ptl_rl.RecurrentCore` has both in a few lines.
    """

    def initial_state(self, batch_size: int) -> torch.Tensor: ...

    def step(self, obs: Any, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class RecurrentActorCriticNet(Protocol):
    """What :class:`~ptl_rl.RecurrentActorCriticAgent` needs of its network (:class:`~ptl_rl.RecurrentActorCritic`
    has it).

    * ``initial_state(n)``: the zero state float [n, S].
    * ``step(obs [n, ...], state [n, S])`` -> ``(policy, value [n], new_state [n, S])``: one step.
    * ``unroll(obs [B, T, ...], state [B, S], episode_start bool [B, T])`` -> ``(policy, value [B, T])``:
      ``T`` steps from ``state``, the state zeroed before each position flagged in ``episode_start``; it must
      equal ``step`` applied position by position.

    ``policy`` is an :class:`~ptl_rl.agents.distributions.ActionDistribution` (an
    :func:`~ptl_rl.action_head`'s output) or raw logits, over the leading dims.
    """

    def initial_state(self, batch_size: int) -> torch.Tensor: ...

    def step(self, obs: Any, state: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor]: ...

    def unroll(self, obs: Any, state: torch.Tensor, episode_start: torch.Tensor) -> tuple[Any, torch.Tensor]: ...

"""The source's call of its agent: one call per vector step on the whole batch, and the checks of what comes back.

An agent returns actions ``[N, *action_shape]``, or ``(actions, extras)`` with
extras ``[N, ...]`` that become fields of the transitions. What it returns is
checked on every call (cheaply: a shape comparison), so a wrong shape names
the problem and the fix at the step that produced it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ptl_rl.agents.checks import check_agent
from ptl_rl.core._trees import to_numpy, tree_leaves
from ptl_rl.core.batch import CORE_FIELDS
from ptl_rl.core.clock import SETTINGS, StageClock, perf_counter_ns
from ptl_rl.core.protocols import Agent, EnvStepAware, RecurrentAgent


class AgentCall:
    """Calls ``agent`` on the observations of ``num_envs`` sub-envs and checks its actions and extras.

    Args:
        agent: a callable ``obs -> actions`` or ``obs -> (actions, extras)``; its optional hooks
            (:class:`~ptl_rl.core.protocols.RecurrentAgent`, :class:`~ptl_rl.core.protocols.EnvStepAware`)
            are looked up once.
        num_envs: ``N``, the sub-envs acted for.
        action_space: one sub-env's action space (the agent is checked against it at construction).
    """

    def __init__(self, agent: Agent, num_envs: int, action_space: Any) -> None:
        check_agent(agent, action_space)  # a bare network, or an agent for another kind of action space
        self.agent = agent
        self.num_envs = num_envs
        action_shape = getattr(action_space, "shape", None)
        self._batch_shape = (num_envs, *action_shape) if action_shape is not None else None
        self._reset_state = agent.reset_state if isinstance(agent, RecurrentAgent) else None
        self.on_env_steps = agent.on_env_steps if isinstance(agent, EnvStepAware) else None
        self.clock = StageClock("agent call", "env steps")

    def __call__(self, obs: Any, fresh: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """Actions ``[N, ...]`` and extras for ``obs`` ``[N, ...]``; ``fresh`` (bool [N]) marks new episodes."""
        if self._reset_state is not None and np.count_nonzero(fresh):
            self._reset_state(fresh.copy())
        if SETTINGS.profiling:
            start = perf_counter_ns()
            out = self.agent(obs)
            self.clock.add(perf_counter_ns() - start, self.num_envs)
        else:
            out = self.agent(obs)
        actions, extras = out if isinstance(out, tuple) else (out, None)
        if not isinstance(actions, np.ndarray):
            actions = to_numpy(actions)
        if actions.shape != self._batch_shape and not self._shape_fits(actions):
            n, shape = self.num_envs, (self._batch_shape or (0, "..."))[1:]
            raise ValueError(
                f"agent returned actions of shape {actions.shape}; expected {(n, *shape)} "
                f"(one action of shape {shape} for each of the {n} envs). "
                "Return a batch of actions with a leading env dimension, also for a single env."
            )
        return actions, self._checked_extras(extras) if extras else {}

    def _shape_fits(self, actions: np.ndarray) -> bool:
        # spaces without a fixed shape (Dict, Tuple, Text) only need one action per env
        return self._batch_shape is None and actions.ndim > 0 and actions.shape[0] == self.num_envs

    def _checked_extras(self, extras: Mapping[str, Any]) -> dict[str, Any]:
        arrays: dict[str, Any] = to_numpy(dict(extras))
        for name, value in arrays.items():
            if name in CORE_FIELDS:
                raise ValueError(f"agent extra {name!r} collides with a core field; rename it")
            for _, leaf in tree_leaves(value):
                if leaf.ndim == 0 or leaf.shape[0] != self.num_envs:
                    raise ValueError(
                        f"agent extra {name!r} has shape {leaf.shape}; "
                        f"expected a leading dimension of {self.num_envs} (one row per env)"
                    )
        return arrays

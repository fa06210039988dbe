"""A collected rollout's GAE: the critic found upstream, V(obs) and the bootstrap V(next_obs), advantages per row.

The rollout arrives time-major, ``[C, N, ...]`` (``C`` rows reserved per env,
env ``e`` in column ``e``), with the number of rows each env holds; it leaves
as the flat batch :meth:`~ptl_rl.replay.rollout.RolloutBuffer.finish` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ptl_rl.core._trees import tree_map
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.chain import pipeline_stages
from ptl_rl.core.protocols import ActingStage, Critic, TransitionCritic
from ptl_rl.replay.gae import compute_gae

ValueFn = Callable[[Any], np.ndarray]
RowsValueFn = Callable[[Mapping[str, Any]], np.ndarray]  # the rows' fields -> V(next_obs) of each row


def find_value_fn(upstream: Any) -> ValueFn | None:
    """The critic of the nearest stage upstream whose agent has one: its public ``agent.value(obs)`` method.

    An agent with a ``value(obs) -> float [B]`` method is a :class:`~ptl_rl.core.protocols.Critic`
    (ActorCriticAgent is one).
    """
    for stage in reversed(pipeline_stages(upstream)):
        agent = stage.agent if isinstance(stage, ActingStage) else None  # a source's
        if isinstance(agent, Critic):
            return agent.value
    return None


def find_next_value_fn(upstream: Any) -> RowsValueFn | None:
    """The bootstrap critic of the nearest agent upstream: ``next_value(rows)``, else ``value(rows["next_obs"])``.

    A recurrent critic (:class:`~ptl_rl.core.protocols.TransitionCritic`) needs more
    than ``next_obs``: the state the row acted from, among the rows' fields.
    """
    for stage in reversed(pipeline_stages(upstream)):
        agent = stage.agent if isinstance(stage, ActingStage) else None
        if isinstance(agent, TransitionCritic):
            return agent.next_value
        if isinstance(agent, Critic):
            value = agent.value
            return lambda rows: value(rows["next_obs"])
    return None


def obs_critic(value_fn: ValueFn | None, upstream: Any) -> ValueFn:
    """``value_fn``, else the upstream agent's ``value(obs)``, as obs [R, ...] -> float64 [R]."""
    fn = value_fn or find_value_fn(upstream)
    if fn is None:
        raise ValueError(
            "no critic for bootstrap values: pass value_fn=..., or use an agent with a value(obs) method "
            "(ptl_rl.ActorCriticAgent)"
        )
    return lambda obs: np.asarray(fn(obs), dtype=np.float64).reshape(-1)


def bootstrap_values(value_fn: ValueFn | None, upstream: Any, fields: dict[str, Any], rows: np.ndarray) -> np.ndarray:
    """V(next_obs) float64 of the rows ``rows`` (bool [C, N]): an obs critic's, or the agent's ``next_value``."""
    if value_fn is not None:
        return obs_critic(value_fn, upstream)(tree_map(lambda a: a[rows], fields["next_obs"]))
    rows_fn = find_next_value_fn(upstream)
    if rows_fn is None:
        raise ValueError(
            "no critic for bootstrap values: pass value_fn=..., or use an agent with a value(obs) method "
            "(ptl_rl.ActorCriticAgent) or a next_value(rows) method (ptl_rl.RecurrentActorCriticAgent)"
        )
    picked = {name: tree_map(lambda a: a[rows], v) for name, v in fields.items()}
    return np.asarray(rows_fn(picked), dtype=np.float64).reshape(-1)


def obs_values(
    fields: dict[str, Any], valid: np.ndarray, value_key: str, value_fn: ValueFn | None, upstream: Any
) -> np.ndarray:
    """V(obs) float64 [C, N], zero on padding: the recorded extra, or one critic pass over the rollout."""
    if value_key in fields:
        recorded = fields[value_key]
        if not isinstance(recorded, np.ndarray) or recorded.shape[2:] not in ((), (1,)):
            raise ValueError(f"the {value_key!r} extra must be float [N] per step (one value per env)")
        return np.where(valid, recorded.reshape(valid.shape), 0.0)
    value = np.zeros(valid.shape, dtype=np.float64)
    value[valid] = obs_critic(value_fn, upstream)(tree_map(lambda a: a[valid], fields["obs"]))
    return value


def rollout_with_gae(
    stored: dict[str, Any],
    count: np.ndarray,
    *,
    gae_lambda: float,
    value_key: str,
    value_fn: ValueFn | None,
    upstream: Any,
    starts_next: np.ndarray | None = None,
) -> TransitionBatch:
    """The rows held as one flat batch [M] with ``advantage`` and ``returns`` (float32 [M]) added.

    ``stored`` maps each field to its ``[C, N, ...]`` arrays (or dicts of them),
    ``count`` int [N] the rows each env holds. Each env's last row is treated as
    a cut: it bootstraps from the critic's value of its ``next_obs`` unless it
    terminated. With ``starts_next`` (bool [N]: whether each env's first row
    starts an episode) the batch also gets ``episode_start`` (bool [M]).
    """
    used = int(count.max())  # rows past the longest sequence are padding: leave them out of the loop
    fields = {name: tree_map(lambda a: a[:used], v) for name, v in stored.items()}
    steps = np.arange(used)[:, None]
    valid = steps < count[None, :]  # [C, N]
    last = steps == (count - 1)[None, :]
    terminated = fields["terminated"] & valid
    end = terminated | fields["truncated"] | last | ~valid
    value = obs_values(fields, valid, value_key, value_fn, upstream)
    next_value = np.zeros_like(value)
    next_value[:-1] = value[1:]  # inside an episode V(next_obs_t) is V(obs_{t+1}), recorded while acting
    bootstrap = valid & ~terminated & (fields["truncated"] | last)
    if bootstrap.any():
        next_value[bootstrap] = bootstrap_values(value_fn, upstream, fields, bootstrap)
    reward = np.where(valid, fields["reward"], 0.0)
    discount = np.where(valid, fields["discount"], 0.0)
    advantage, returns = compute_gae(reward, value, next_value, discount, terminated, end, gae_lambda)
    t_index, env_index = np.nonzero(valid)
    out = {name: tree_map(lambda a: a[t_index, env_index], v) for name, v in fields.items()}
    out["advantage"] = advantage[t_index, env_index].astype(np.float32)
    out["returns"] = returns[t_index, env_index].astype(np.float32)
    if starts_next is not None:
        # an episode starts after a row that ended it; row 0 continues from the last rollout (or starts afresh)
        ended = fields["terminated"] | fields["truncated"]
        starts = np.concatenate([starts_next[None, :], ended[:-1]], axis=0)
        out["episode_start"] = starts[t_index, env_index]
    return TransitionBatch(out)

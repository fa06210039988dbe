"""RolloutBuffer: the on-policy stage. Collects a rollout, computes GAE, yields K epochs of minibatches.

    ExperienceSource(envs, ActorCriticAgent) -> RolloutBuffer -> to_dataloader(steps_per_epoch=...)

One cycle of the stage:

1. **Collect** with the current weights: pull 1-step batches from upstream
   until every env holds ``steps_per_env`` transitions. Each env's rows are
   kept as a time-ordered sequence in preallocated time-major arrays
   ``[capacity, N, ...]``. Under gymnasium's next-step autoreset the source
   drops the row of each reset step, so an env that finished episodes lags
   behind the others; envs that are ahead keep their extra transitions (a
   rollout has between ``N * steps_per_env`` and ``N * (2 * steps_per_env)``
   rows, exactly ``N * steps_per_env`` under same-step or disabled autoreset).
   Nothing is discarded and nothing carries over into the next rollout.
2. **GAE** (:func:`~ptl_rl.gae.compute_gae`): ``V(obs)`` is the agent's
   ``value`` extra (recorded while acting, so no second critic pass);
   ``V(next_obs)`` is the next row's value inside an episode and one batched
   critic call on the real final observations where the sequence stops
   bootstrapping-wise: truncations and each env's last row. Terminations
   bootstrap nothing; no recursion crosses an episode end, in any autoreset
   mode (the source never lets a transition span a reset).
3. **Minibatches**: ``epochs`` passes, each a fresh permutation of the
   rollout split into ``num_minibatches`` near-equal parts, so every
   transition appears exactly once per epoch. Each ``next()`` returns one
   :class:`~ptl_rl.batch.TorchBatch` with every stored field (``obs``,
   ``action``, ``reward``, ``next_obs``, ``terminated``, ``truncated``,
   ``discount``, ``env_id``, the agent's extras such as the behaviour policy's
   ``log_prob`` and ``value``) plus ``advantage`` and ``returns`` (float32 [B]).
4. The ``next()`` after the last minibatch collects the next rollout, with
   whatever weights the learner has then: data is never staler than one rollout.

**Epoch length.** The stage yields ``batches_per_rollout = epochs *
num_minibatches`` batches per rollout, whatever the rollout's size. Give the
DataLoader an explicit length that is a multiple of it, one Lightning epoch
per rollout being the natural choice::

    loader = ptl_rl.to_dataloader(rollout, steps_per_epoch=rollout.batches_per_rollout)

With a sized loader Lightning fetches each batch only when ``training_step``
is about to run on it; an endless loader (``steps_per_epoch=None``) makes
Lightning prefetch one batch, so the first minibatch of a rollout would be
collected before the last update of the previous one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ptl_rl._grouping import rank_within_group
from ptl_rl._reprs import stage_repr
from ptl_rl._state import check_version, versioned
from ptl_rl._trees import tree_map
from ptl_rl.batch import TorchBatch, TransitionBatch
from ptl_rl.gae import compute_gae
from ptl_rl.protocols import Critic
from ptl_rl.stages import pipeline_stages

ValueFn = Callable[[Any], np.ndarray]
_NORMALIZE = ("minibatch", "rollout", None)


def _find_value_fn(upstream: Any) -> ValueFn | None:
    """The critic of the nearest stage upstream whose agent has one: its public ``agent.value(obs)`` method.

    An agent with a ``value(obs) -> float [B]`` method is a :class:`~ptl_rl.protocols.Critic`
    (ActorCriticAgent is one).
    """
    for stage in reversed(pipeline_stages(upstream)):
        agent = getattr(stage, "agent", None)  # a source's (other stages have none)
        if isinstance(agent, Critic):
            return agent.value
    return None


def _normalized(advantage: np.ndarray) -> np.ndarray:
    """(a - mean) / (std + 1e-8), float32; a single row normalizes to 0."""
    return ((advantage - advantage.mean()) / (advantage.std() + 1e-8)).astype(np.float32)


class RolloutBuffer:
    """On-policy rollout stage: collect, compute GAE(lambda), yield ``epochs`` x ``num_minibatches`` torch batches.

    See the module docstring for the cycle and the epoch length.

    Args:
        upstream: an iterator of 1-step :class:`TransitionBatch` (an
            :class:`~ptl_rl.source.ExperienceSource` whose agent returns a
            ``value`` extra, e.g. :class:`~ptl_rl.agents.ActorCriticAgent`),
            or ``None`` to use :meth:`add` / :meth:`finish` by hand. Rows of
            one env must arrive in time order; env ``e`` is column ``e % N``.
        steps_per_env: ``T``, transitions per env per rollout (at least).
        epochs: ``K``, passes over each rollout.
        num_minibatches: minibatches per pass (sizes differ by at most one row).
        gae_lambda: GAE's lambda; gamma is the batches' ``discount`` field,
            set on the source.
        normalize_advantage: ``"minibatch"`` (standardize ``advantage`` within
            each yielded batch, as CleanRL's PPO), ``"rollout"`` (once over the
            whole rollout), or ``None``.
        value_fn: critic for the bootstrap values, numpy obs [R, ...] ->
            float [R]; default: ``agent.value`` of the upstream source.
        value_key: the extra holding ``V(obs)`` recorded while acting; if the
            agent records none, ``value_fn`` evaluates every ``obs`` once per rollout.
        num_envs: ``N``; default ``upstream.num_envs``.
        capacity_per_env: rows reserved per env, default ``2 * T`` (enough for
            next-step autoreset even with 1-step episodes).
        seed: seeds the shuffling.
        device: where the yielded tensors go (default: CPU, Lightning moves them).

    Examples:
        >>> import gymnasium as gym
        >>> import torch
        >>> from torch import nn
        >>> import ptl_rl
        >>> _ = torch.manual_seed(0)
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> actor, critic = nn.Linear(4, 2), nn.Linear(4, 1)  # logits of the 2 actions, V(obs)
        >>> agent = ptl_rl.ActorCriticAgent(actor, critic, env.single_action_space, seed=0)
        >>> source = ptl_rl.ExperienceSource(env, agent, gamma=0.99, seed=0)
        >>> rollout = ptl_rl.RolloutBuffer(source, steps_per_env=8, epochs=2, num_minibatches=2, seed=0)
        >>> rollout.batches_per_rollout  # epochs x num_minibatches, then the next rollout is collected
        4
        >>> minibatch = next(rollout)  # collects 2 envs x 8 steps, computes GAE, yields half of them
        >>> minibatch.obs.shape, minibatch.advantage.shape, minibatch.returns.dtype
        (torch.Size([8, 4]), torch.Size([8]), torch.float32)
        >>> sorted(minibatch.keys())
        ['action', 'advantage', 'discount', 'env_id', 'log_prob', 'next_obs', 'obs', 'returns', 'reward',
         'terminated', 'truncated', 'value']
        >>> len(ptl_rl.to_dataloader(rollout))  # one Lightning epoch per rollout
        4
    """

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None,
        steps_per_env: int,
        *,
        epochs: int = 4,
        num_minibatches: int = 4,
        gae_lambda: float = 0.95,
        normalize_advantage: str | None = "minibatch",
        value_fn: ValueFn | None = None,
        value_key: str = "value",
        num_envs: int | None = None,
        capacity_per_env: int | None = None,
        seed: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        num_envs = num_envs if num_envs is not None else getattr(upstream, "num_envs", None)
        if num_envs is None or num_envs < 1:
            raise ValueError("num_envs is required (>= 1) when upstream has no num_envs attribute")
        if steps_per_env < 1 or epochs < 1 or num_minibatches < 1:
            raise ValueError(
                "steps_per_env, epochs and num_minibatches must be >= 1, "
                f"got {steps_per_env}, {epochs}, {num_minibatches}"
            )
        if num_minibatches > num_envs * steps_per_env:
            raise ValueError(
                f"num_minibatches={num_minibatches} exceeds the {num_envs * steps_per_env} transitions of a rollout"
            )
        if normalize_advantage not in _NORMALIZE:
            raise ValueError(f"normalize_advantage must be one of {_NORMALIZE}, got {normalize_advantage!r}")
        if not 0.0 <= gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda must be in [0, 1], got {gae_lambda}")
        self.upstream = upstream
        self.num_envs = int(num_envs)
        self.steps_per_env = int(steps_per_env)
        self.capacity_per_env = int(capacity_per_env) if capacity_per_env is not None else 2 * self.steps_per_env
        if self.capacity_per_env < self.steps_per_env:
            raise ValueError(f"capacity_per_env={capacity_per_env} is below steps_per_env={steps_per_env}")
        self.epochs = int(epochs)
        self.num_minibatches = int(num_minibatches)
        self.gae_lambda = float(gae_lambda)
        self.normalize_advantage = normalize_advantage
        self.value_fn = value_fn
        self.value_key = value_key
        if upstream is not None and value_fn is None and _find_value_fn(upstream) is None:
            # every rollout bootstraps each env's last row from V(next_obs): without a critic the first one fails
            raise ValueError(
                "a RolloutBuffer needs a critic for the bootstrap values V(next_obs) (each env's last row and "
                f"truncations), and neither value_fn nor the agent of {type(upstream).__name__} has value(obs). Act "
                "with ptl_rl.ActorCriticAgent(actor, critic, action_space), or pass value_fn=... (obs -> float [B])"
            )
        self.device = torch.device(device) if device is not None else None
        self.rng = np.random.default_rng(seed)

        self._fields: dict[str, Any] | None = None  # name -> [capacity, N, ...] arrays (or dicts of them)
        self._flat: dict[str, Any] = {}  # the same memory viewed as [capacity * N, ...]: cheap scattered writes
        self._count = np.zeros(self.num_envs, dtype=np.int64)  # rows held per env
        self._columns = np.arange(self.num_envs)
        self._aligned = True
        self.rollout: TransitionBatch | None = None  # the finished rollout being served, flat [M]
        self._schedule: list[np.ndarray] = []
        self._served = 0
        self.rollouts_collected = 0

    @property
    def batches_per_rollout(self) -> int:
        """Batches yielded per rollout (``epochs * num_minibatches``): the natural ``steps_per_epoch``."""
        return self.epochs * self.num_minibatches

    def __len__(self) -> int:
        """Transitions held for the rollout in progress (or just collected)."""
        return int(self._count.sum())

    # ------------------------------------------------------------------ stage
    def __iter__(self) -> RolloutBuffer:
        return self

    def __next__(self) -> TorchBatch:
        if self._served >= len(self._schedule):
            self._start_rollout()
        rows = self._schedule[self._served]
        self._served += 1
        rollout = self.rollout
        assert rollout is not None  # a schedule to serve exists only with its rollout (_start_rollout sets both)
        batch = rollout.rows(rows)
        if self.normalize_advantage == "minibatch":
            batch["advantage"] = _normalized(batch["advantage"])
        return batch.to_torch(self.device)

    def _start_rollout(self) -> None:
        rollout = self.collect()
        if self.normalize_advantage == "rollout":
            rollout["advantage"] = _normalized(rollout["advantage"])
        self.rollout = rollout
        self._schedule = self.minibatch_indices(len(rollout))
        self._served = 0

    def minibatch_indices(self, size: int) -> list[np.ndarray]:
        """``epochs * num_minibatches`` index arrays into a rollout of ``size`` rows; each epoch is a permutation."""
        return [
            part
            for _ in range(self.epochs)
            for part in np.array_split(self.rng.permutation(size), self.num_minibatches)
        ]

    # ------------------------------------------------------------------ collection
    def collect(self) -> TransitionBatch:
        """Clear, pull from upstream until every env holds ``steps_per_env`` rows, and :meth:`finish`."""
        upstream = self.upstream
        if upstream is None:
            raise TypeError("this RolloutBuffer has no upstream to pull from; use add() and finish()")
        self.clear()
        while self._count.min() < self.steps_per_env:
            self.add(next(upstream))
        self.rollouts_collected += 1
        return self.finish()

    def clear(self) -> None:
        """Forget the rows held (the arrays stay allocated)."""
        self._count[:] = 0
        self._aligned = True  # every env holds the same number of rows

    def add(self, batch: TransitionBatch) -> None:
        """Append the rows of ``batch`` to their envs' sequences (any number of rows per env, in time order)."""
        size = len(batch)
        if size == 0:
            return
        fields = self._fields
        if fields is None:
            fields = self._allocate(batch)
        elif batch.keys() != fields.keys():
            raise ValueError(
                f"batch fields {sorted(batch.keys())} differ from the rollout's {sorted(fields)}; "
                "every batch of a rollout must carry the same fields and agent extras"
            )
        env = np.asarray(batch["env_id"]) % self.num_envs
        if self._aligned and size == self.num_envs and np.array_equal(env, self._columns):
            # the common case (no env lags behind, one row per env in env order): one row write per field
            row = int(self._count[0])
            if row >= self.capacity_per_env:
                self._overflow()
            self._count += 1
            stores: dict[str, Any] = fields
            index: Any = row
        else:
            # envs at different positions (next-step autoreset dropped rows): scatter into the flat views
            unique = size == 1 or bool((env[1:] > env[:-1]).all())  # one row per env, as a source yields them
            pos = self._count[env] if unique else self._count[env] + rank_within_group(env)
            if pos.max() >= self.capacity_per_env:
                self._overflow()
            if unique:
                self._count[env] = pos + 1
            else:
                self._count += np.bincount(env, minlength=self.num_envs)
            self._aligned = bool((self._count == self._count[0]).all())
            stores, index = self._flat, pos * self.num_envs + env
        for name, value in batch.items():
            store = stores[name]
            if isinstance(store, np.ndarray):
                store[index] = value
            else:  # a dict observation: the same write per leaf
                tree_map(lambda leaf, v: leaf.__setitem__(index, v), store, value)

    def _overflow(self) -> None:
        raise RuntimeError(
            f"an env exceeded capacity_per_env={self.capacity_per_env} rows while others still lag behind "
            f"steps_per_env={self.steps_per_env}; raise capacity_per_env"
        )

    def _allocate(self, batch: TransitionBatch) -> dict[str, Any]:
        """Allocate the field arrays [capacity_per_env, N, ...] for ``batch``'s fields; returns them (``_fields``)."""
        needed = ("obs", "reward", "next_obs", "terminated", "truncated", "discount", "env_id")
        missing = [name for name in needed if name not in batch]
        if missing:
            raise ValueError(f"a rollout needs 1-step transition batches; missing fields {missing}")
        shape = (self.capacity_per_env, self.num_envs)
        self._fields = {
            name: tree_map(lambda a: np.zeros((*shape, *a.shape[1:]), dtype=a.dtype), value)
            for name, value in batch.items()
        }
        rows = shape[0] * shape[1]
        self._flat = {name: tree_map(lambda a: a.reshape(rows, *a.shape[2:]), v) for name, v in self._fields.items()}
        return self._fields

    # ------------------------------------------------------------------ GAE
    def finish(self, value_fn: ValueFn | None = None) -> TransitionBatch:
        """The rows held as one flat batch [M] with ``advantage`` and ``returns`` (float32 [M]) added.

        Each env's last row is treated as a cut: it bootstraps from the
        critic's value of its ``next_obs`` unless it terminated.
        """
        if self._fields is None or self._count.max() == 0:
            raise RuntimeError("the rollout is empty; add() transitions first")
        used = int(self._count.max())  # rows past the longest sequence are padding: leave them out of the loop
        fields = {name: tree_map(lambda a: a[:used], v) for name, v in self._fields.items()}
        steps = np.arange(used)[:, None]
        valid = steps < self._count[None, :]  # [C, N]
        last = steps == (self._count - 1)[None, :]
        terminated = fields["terminated"] & valid
        end = terminated | fields["truncated"] | last | ~valid
        value = self._values(fields, valid, value_fn)
        next_value = np.zeros_like(value)
        next_value[:-1] = value[1:]  # inside an episode V(next_obs_t) is V(obs_{t+1}), recorded while acting
        bootstrap = valid & ~terminated & (fields["truncated"] | last)
        if bootstrap.any():
            final_obs = tree_map(lambda a: a[bootstrap], fields["next_obs"])
            next_value[bootstrap] = self._critic(value_fn)(final_obs)
        reward = np.where(valid, fields["reward"], 0.0)
        discount = np.where(valid, fields["discount"], 0.0)
        advantage, returns = compute_gae(reward, value, next_value, discount, terminated, end, self.gae_lambda)
        t_index, env_index = np.nonzero(valid)
        out = {name: tree_map(lambda a: a[t_index, env_index], v) for name, v in fields.items()}
        out["advantage"] = advantage[t_index, env_index].astype(np.float32)
        out["returns"] = returns[t_index, env_index].astype(np.float32)
        return TransitionBatch(out)

    def _critic(self, value_fn: ValueFn | None) -> ValueFn:
        fn = value_fn or self.value_fn or _find_value_fn(self.upstream)
        if fn is None:
            raise ValueError(
                "no critic for bootstrap values: pass value_fn=..., or use an agent with a value(obs) method "
                "(ptl_rl.ActorCriticAgent)"
            )
        return lambda obs: np.asarray(fn(obs), dtype=np.float64).reshape(-1)

    def _values(self, fields: dict[str, Any], valid: np.ndarray, value_fn: ValueFn | None) -> np.ndarray:
        """V(obs) float64 [C, N], zero on padding: the recorded extra, or one critic pass over the rollout."""
        if self.value_key in fields:
            recorded = fields[self.value_key]
            if not isinstance(recorded, np.ndarray) or recorded.shape[2:] not in ((), (1,)):
                raise ValueError(f"the {self.value_key!r} extra must be float [N] per step (one value per env)")
            return np.where(valid, recorded.reshape(valid.shape), 0.0)
        value = np.zeros(valid.shape, dtype=np.float64)
        value[valid] = self._critic(value_fn)(tree_map(lambda a: a[valid], fields["obs"]))
        return value

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """Shuffling RNG and counter (plain containers). The rollout in flight is not saved:
        after :meth:`load_state_dict` the next ``next()`` collects a fresh rollout."""
        state = {"rng": self.rng.bit_generator.state, "rollouts_collected": self.rollouts_collected}
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.rng.bit_generator.state = state["rng"]
        self.rollouts_collected = int(state["rollouts_collected"])
        self.clear()
        self.rollout, self._schedule, self._served = None, [], 0

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """Rollout shape, rows held, rollouts collected, the minibatch being served, and the chain upstream."""
        return stage_repr(
            self,
            envs=self.num_envs,
            steps_per_env=self.steps_per_env,
            held=len(self),
            rollouts=self.rollouts_collected,
            served=f"{self._served}/{len(self._schedule)}",
        )

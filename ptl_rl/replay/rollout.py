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
2. **GAE** (:func:`~ptl_rl.replay.gae.compute_gae`): ``V(obs)`` is the agent's
   ``value`` extra (recorded while acting, so no second critic pass);
   ``V(next_obs)`` is the next row's value inside an episode and one batched
   critic call on the real final observations where the sequence stops
   bootstrapping-wise: truncations and each env's last row. Terminations
   bootstrap nothing; no recursion crosses an episode end, in any autoreset
   mode (the source never lets a transition span a reset).
3. **Minibatches**: ``epochs`` passes, each a fresh permutation of the
   rollout split into ``num_minibatches`` near-equal parts, so every
   transition appears exactly once per epoch. Each ``next()`` returns one
   :class:`~ptl_rl.core.batch.TorchBatch` with every stored field (``obs``,
   ``action``, ``reward``, ``next_obs``, ``terminated``, ``truncated``,
   ``discount``, ``env_id``, the agent's extras such as the behaviour policy's
   ``log_prob`` and ``value``) plus ``advantage`` and ``returns`` (float32 [B]).
   With ``sequence_length=L`` (recurrent PPO) the minibatches hold whole
   time-ordered sequences instead: see "Sequence minibatches" below.
4. The ``next()`` after the last minibatch collects the next rollout, with
   whatever weights the learner has then: data is never staler than one rollout.

**Sequence minibatches** (``sequence_length=L``, for a recurrent policy such
as :class:`~ptl_rl.agents.recurrent_policy.RecurrentActorCriticAgent`). Each env's
rows are cut into sequences of ``L`` consecutive rows from its first row of
the rollout on (the last one shorter when the env's row count is not a
multiple of ``L``: envs lag under next-step autoreset, so rollouts are ragged).
Each epoch shuffles the sequences and splits them into ``num_minibatches``
near-equal parts, so every row still appears exactly once per epoch. A
minibatch has every field as ``[B_seq, L, ...]`` plus

* ``mask`` bool [B_seq, L]: False on padding past a short sequence's end
  (padding repeats the sequence's last row, so every value stays finite);
* ``episode_start`` bool [B_seq, L]: an episode starts at this row (the row
  before it in the env's sequence ended, terminated or truncated; an env's
  first row of the first rollout, and after a restore). The agent's state was
  zeroed exactly there, so the learner zeroes its state there too.

The initial state of a sequence is its stored state field at position 0
(``batch.hidden[:, 0]``): the state the agent acted from at that row. An
``L`` at least the rollout's longest env sequence gives each env's whole
rollout as one sequence (CleanRL's ``ppo_atari_lstm.py``); smaller ``L`` gives
more, shorter sequences per minibatch (sb3-contrib cuts at episode starts
too; here episodes continue inside a sequence, so nothing but an env's tail is
padded). ``advantage`` normalization (``"minibatch"``) uses the valid rows only.

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

from ptl_rl.core._grouping import rank_within_group
from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.core._trees import tree_map
from ptl_rl.core.batch import TorchBatch, TransitionBatch
from ptl_rl.replay.gae import compute_gae
from ptl_rl.core.protocols import Critic, TransitionCritic
from ptl_rl.core.chain import pipeline_stages

ValueFn = Callable[[Any], np.ndarray]
RowsValueFn = Callable[[Mapping[str, Any]], np.ndarray]  # the rows' fields -> V(next_obs) of each row
_NORMALIZE = ("minibatch", "rollout", None)


def _find_value_fn(upstream: Any) -> ValueFn | None:
    """The critic of the nearest stage upstream whose agent has one: its public ``agent.value(obs)`` method.

    An agent with a ``value(obs) -> float [B]`` method is a :class:`~ptl_rl.core.protocols.Critic`
    (ActorCriticAgent is one).
    """
    for stage in reversed(pipeline_stages(upstream)):
        agent = getattr(stage, "agent", None)  # a source's (other stages have none)
        if isinstance(agent, Critic):
            return agent.value
    return None


def _find_next_value_fn(upstream: Any) -> RowsValueFn | None:
    """The bootstrap critic of the nearest agent upstream: ``next_value(rows)``, else ``value(rows["next_obs"])``.

    A recurrent critic (:class:`~ptl_rl.core.protocols.TransitionCritic`) needs more
    than ``next_obs``: the state the row acted from, among the rows' fields.
    """
    for stage in reversed(pipeline_stages(upstream)):
        agent = getattr(stage, "agent", None)
        if isinstance(agent, TransitionCritic):
            return agent.next_value
        if isinstance(agent, Critic):
            value = agent.value
            return lambda rows: value(rows["next_obs"])
    return None


def _normalized(advantage: np.ndarray) -> np.ndarray:
    """(a - mean) / (std + 1e-8), float32; a single row normalizes to 0."""
    return ((advantage - advantage.mean()) / (advantage.std() + 1e-8)).astype(np.float32)


def _normalized_like(advantage: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``advantage`` standardized by the mean and std of its rows where ``mask`` is True (same shape)."""
    real = advantage[mask]
    return ((advantage - real.mean()) / (real.std() + 1e-8)).astype(np.float32)


class RolloutBuffer:
    """On-policy rollout stage: collect, compute GAE(lambda), yield ``epochs`` x ``num_minibatches`` torch batches.

    See the module docstring for the cycle and the epoch length.

    Args:
        upstream: an iterator of 1-step :class:`TransitionBatch` (an
            :class:`~ptl_rl.stages.source.ExperienceSource` whose agent returns a
            ``value`` extra, e.g. :class:`~ptl_rl.agents.policies.ActorCriticAgent`),
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
            float [R]; default: the upstream source's agent, through
            ``agent.next_value(rows)`` (a recurrent critic, which needs each
            row's stored state) or else ``agent.value(next_obs)``.
        value_key: the extra holding ``V(obs)`` recorded while acting; if the
            agent records none, ``value_fn`` evaluates every ``obs`` once per rollout.
        num_envs: ``N``; default ``upstream.num_envs``.
        capacity_per_env: rows reserved per env, default ``2 * T`` (enough for
            next-step autoreset even with 1-step episodes).
        seed: seeds the shuffling.
        sequence_length: ``L``; when set, minibatches hold sequences
            ``[B_seq, L, ...]`` of consecutive rows with ``mask`` and
            ``episode_start`` (see the module docstring), for a recurrent
            policy; ``None`` (default): shuffled single transitions.
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
        sequence_length: int | None = None,
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
        if sequence_length is not None:
            if sequence_length < 1:
                raise ValueError(f"sequence_length must be >= 1 (rows per sequence) or None, got {sequence_length}")
            fewest = num_envs * -(-steps_per_env // sequence_length)  # sequences in the smallest rollout
            if num_minibatches > fewest:
                raise ValueError(
                    f"num_minibatches={num_minibatches} exceeds the {fewest} sequences of {sequence_length} rows that "
                    f"{num_envs} envs x {steps_per_env} steps give; lower num_minibatches or sequence_length"
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
        if upstream is not None and value_fn is None and _find_next_value_fn(upstream) is None:
            # every rollout bootstraps each env's last row from V(next_obs): without a critic the first one fails
            raise ValueError(
                "a RolloutBuffer needs a critic for the bootstrap values V(next_obs) (each env's last row and "
                f"truncations), and neither value_fn nor the agent of {type(upstream).__name__} has value(obs). Act "
                "with ptl_rl.ActorCriticAgent(actor, critic, action_space) (or ptl_rl.RecurrentActorCriticAgent), or "
                "pass value_fn=... (obs -> float [B])"
            )
        self.device = torch.device(device) if device is not None else None
        self.rng = np.random.default_rng(seed)
        self.sequence_length = int(sequence_length) if sequence_length is not None else None

        self._fields: dict[str, Any] | None = None  # name -> [capacity, N, ...] arrays (or dicts of them)
        self._flat: dict[str, Any] = {}  # the same memory viewed as [capacity * N, ...]: cheap scattered writes
        self._count = np.zeros(self.num_envs, dtype=np.int64)  # rows held per env
        self._columns = np.arange(self.num_envs)
        self._aligned = True
        # whether each env's next row starts an episode: its last row ended (the source starts every env afresh)
        self._starts_next = np.ones(self.num_envs, dtype=bool)
        self._sequences: np.ndarray | None = None  # sequence mode: [Q, L] flat row of each sequence position
        self._sequence_mask: np.ndarray | None = None  # [Q, L] False on padding
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
        if self._sequences is not None:
            return self._sequence_batch(rollout, rows).to_torch(self.device)
        batch = rollout.rows(rows)
        if self.normalize_advantage == "minibatch":
            batch["advantage"] = _normalized(batch["advantage"])
        return batch.to_torch(self.device)

    def _sequence_batch(self, rollout: TransitionBatch, sequences: np.ndarray) -> TransitionBatch:
        """The sequences ``sequences`` (indices into the rollout's [Q, L] layout) as one [B_seq, L, ...] batch."""
        assert self._sequences is not None and self._sequence_mask is not None
        batch = rollout.rows(self._sequences[sequences])  # a [B_seq, L] index: every field becomes [B_seq, L, ...]
        mask = self._sequence_mask[sequences]
        batch["mask"] = mask
        batch["episode_start"] = batch["episode_start"] & mask
        if self.normalize_advantage == "minibatch":  # statistics of the real rows: padding repeats rows
            advantage = batch["advantage"]
            batch["advantage"] = np.where(mask, _normalized_like(advantage, mask), 0.0).astype(np.float32)
        return batch

    def _start_rollout(self) -> None:
        rollout = self.collect()
        if self.normalize_advantage == "rollout":
            rollout["advantage"] = _normalized(rollout["advantage"])
        self.rollout = rollout
        if self.sequence_length is not None:
            self._sequences, self._sequence_mask = self.sequence_layout(self._count, self.sequence_length)
            self._schedule = self.minibatch_indices(len(self._sequences))
        else:
            self._schedule = self.minibatch_indices(len(rollout))
        self._served = 0

    def sequence_layout(self, counts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Cut each env's rows into sequences of ``length``: (flat rows int64 [Q, L], mask bool [Q, L]).

        ``counts`` int [N] are the rows per env; the flat rollout of
        :meth:`finish` orders rows time-major (row ``t`` of every env that has
        one, then ``t + 1``). Env ``e`` gives ``ceil(counts[e] / L)``
        sequences, in env order then time order; positions past an env's last
        row repeat that row, with mask False.
        """
        counts = np.asarray(counts, dtype=np.int64)
        steps = np.arange(int(counts.max()))[:, None]
        flat = np.full((len(steps), len(counts)), -1, dtype=np.int64)
        valid = steps < counts[None, :]
        flat[valid] = np.arange(int(valid.sum()))  # boolean assignment runs in the same time-major order
        per_env = -(-counts // length)  # ceil
        env = np.repeat(np.arange(len(counts)), per_env)
        first = (np.arange(len(env)) - np.repeat(np.cumsum(per_env) - per_env, per_env)) * length
        position = first[:, None] + np.arange(length)[None, :]  # [Q, L] time index in the env's sequence
        mask = position < counts[env][:, None]
        position = np.minimum(position, counts[env][:, None] - 1)  # padding repeats the last real row
        return flat[position, env[:, None]], mask

    def minibatch_indices(self, size: int) -> list[np.ndarray]:
        """``epochs * num_minibatches`` index arrays into a rollout of ``size`` rows; each epoch is a permutation.

        In sequence mode ``size`` is the number of sequences and the indices pick sequences.
        """
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
        """Forget the rows held (the arrays stay allocated); whether each env's last one ended carries over."""
        fields = self._fields
        if fields is not None:
            held = self._count > 0
            last = np.maximum(self._count - 1, 0)
            ended = fields["terminated"][last, self._columns] | fields["truncated"][last, self._columns]
            self._starts_next = np.where(held, ended, self._starts_next)
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
            next_value[bootstrap] = self._bootstrap(value_fn, fields, bootstrap)
        reward = np.where(valid, fields["reward"], 0.0)
        discount = np.where(valid, fields["discount"], 0.0)
        advantage, returns = compute_gae(reward, value, next_value, discount, terminated, end, self.gae_lambda)
        t_index, env_index = np.nonzero(valid)
        out = {name: tree_map(lambda a: a[t_index, env_index], v) for name, v in fields.items()}
        out["advantage"] = advantage[t_index, env_index].astype(np.float32)
        out["returns"] = returns[t_index, env_index].astype(np.float32)
        if self.sequence_length is not None:
            # an episode starts after a row that ended it; row 0 continues from the last rollout (or starts afresh)
            ended = fields["terminated"] | fields["truncated"]
            starts = np.concatenate([self._starts_next[None, :], ended[:-1]], axis=0)
            out["episode_start"] = starts[t_index, env_index]
        return TransitionBatch(out)

    def _bootstrap(self, value_fn: ValueFn | None, fields: dict[str, Any], rows: np.ndarray) -> np.ndarray:
        """V(next_obs) float64 of the rows ``rows`` (bool [C, N]): an obs critic's, or the agent's ``next_value``."""
        fn = value_fn or self.value_fn
        if fn is not None:
            return self._critic(fn)(tree_map(lambda a: a[rows], fields["next_obs"]))
        rows_fn = _find_next_value_fn(self.upstream)
        if rows_fn is None:
            raise ValueError(
                "no critic for bootstrap values: pass value_fn=..., or use an agent with a value(obs) method "
                "(ptl_rl.ActorCriticAgent) or a next_value(rows) method (ptl_rl.RecurrentActorCriticAgent)"
            )
        picked = {name: tree_map(lambda a: a[rows], v) for name, v in fields.items()}
        return np.asarray(rows_fn(picked), dtype=np.float64).reshape(-1)

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
        self._sequences = self._sequence_mask = None
        self._starts_next[:] = True  # the restored source starts every episode afresh

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """Rollout shape, rows held, rollouts collected, the minibatch being served, and the chain upstream."""
        shape = {"envs": self.num_envs, "steps_per_env": self.steps_per_env}
        if self.sequence_length is not None:  # sequence minibatches (recurrent PPO)
            shape["sequence_length"] = self.sequence_length
        served = f"{self._served}/{len(self._schedule)}"
        return stage_repr(self, **shape, held=len(self), rollouts=self.rollouts_collected, served=served)

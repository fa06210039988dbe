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
   Nothing is discarded and nothing carries over into the next rollout
   (:class:`~ptl_rl.replay.rollout_rows.RolloutRows`).
2. **GAE** (:func:`~ptl_rl.replay.gae.compute_gae`): ``V(obs)`` is the agent's
   ``value`` extra (recorded while acting, so no second critic pass);
   ``V(next_obs)`` is the next row's value inside an episode and one batched
   critic call on the real final observations where the sequence stops
   bootstrapping-wise: truncations and each env's last row. Terminations
   bootstrap nothing; no recursion crosses an episode end, in any autoreset
   mode (the source never lets a transition span a reset). See
   :mod:`ptl_rl.replay.rollout_gae`.
3. **Minibatches**: ``epochs`` passes, each a fresh permutation of the
   rollout split into ``num_minibatches`` near-equal parts, so every
   transition appears exactly once per epoch. Each ``next()`` returns one
   :class:`~ptl_rl.core.batch.TorchBatch` with every stored field (``obs``,
   ``action``, ``reward``, ``next_obs``, ``terminated``, ``truncated``,
   ``discount``, ``env_id``, the agent's extras such as the behaviour policy's
   ``log_prob`` and ``value``) plus ``advantage`` and ``returns`` (float32 [B]).
   With ``sequence_length=L`` (recurrent PPO) the minibatches hold whole
   time-ordered sequences instead: see "Sequence minibatches" below and
   :mod:`ptl_rl.replay.rollout_minibatches`.
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

from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TorchBatch, TransitionBatch
from ptl_rl.core.chain import find_acting_stage
from ptl_rl.core.stage import Stage
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.replay.rollout_gae import ValueFn, find_next_value_fn, rollout_with_gae
from ptl_rl.replay.rollout_minibatches import epoch_schedule, normalized, sequence_layout, sequence_minibatch
from ptl_rl.replay.rollout_rows import RolloutRows

_NORMALIZE = ("minibatch", "rollout", None)


class RolloutBuffer(Stage[TorchBatch]):
    """On-policy rollout stage: collect, compute GAE(lambda), yield ``epochs`` x ``num_minibatches`` torch batches.

    See the module docstring for the cycle and the epoch length.

    Args:
        upstream: an iterator of 1-step :class:`TransitionBatch` (an
            :class:`~ptl_rl.stages.source.ExperienceSource` whose agent returns a
            ``value`` extra, e.g. :class:`~ptl_rl.agents.stochastic.ActorCriticAgent`),
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
        if num_envs is None and upstream is not None:
            source = find_acting_stage(upstream)  # the sub-envs of the source that feeds the rollout
            num_envs = None if source is None else source.num_envs
        if num_envs is None or num_envs < 1:
            raise ValueError(
                "num_envs is required (>= 1) when no ExperienceSource is upstream to say how many sub-envs feed "
                "the rollout"
            )
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
        super().__init__(upstream)
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
        if upstream is not None and value_fn is None and find_next_value_fn(upstream) is None:
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

        # the rows of the rollout in progress, per env in time order
        self._rows = RolloutRows(self.num_envs, self.capacity_per_env, self.steps_per_env)
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
        return len(self._rows)

    # ------------------------------------------------------------------ stage
    def step(self) -> TorchBatch:
        """The next minibatch of the rollout being served; after its last one, a fresh rollout is collected."""
        if self._served >= len(self._schedule):
            self._start_rollout()
        rows = self._schedule[self._served]
        self._served += 1
        rollout = self.rollout
        assert rollout is not None  # a schedule to serve exists only with its rollout (_start_rollout sets both)
        if self._sequences is not None:
            assert self._sequence_mask is not None  # set together with _sequences
            normalize = self.normalize_advantage == "minibatch"
            batch = sequence_minibatch(rollout, self._sequences, self._sequence_mask, rows, normalize)
            return batch.to_torch(self.device)
        batch = rollout.rows(rows)
        if self.normalize_advantage == "minibatch":
            batch["advantage"] = normalized(batch["advantage"])
        return batch.to_torch(self.device)

    def snapshot(self) -> object:
        # what a step replaces (never changes in place); the rows being collected need none: a rollout cut short
        # is collected again from scratch
        return (self._served, self._schedule, self.rollout, self._sequences, self._sequence_mask,
                self.rollouts_collected)  # fmt: skip

    def restore(self, snapshot: object) -> None:
        saved = cast(tuple[Any, ...], snapshot)  # what snapshot() returned
        self._served, self._schedule, self.rollout, self._sequences, self._sequence_mask = saved[:5]
        self.rollouts_collected = saved[5]

    def _start_rollout(self) -> None:
        rollout = self.collect()
        if self.normalize_advantage == "rollout":
            rollout["advantage"] = normalized(rollout["advantage"])
        self.rollout = rollout
        if self.sequence_length is not None:
            self._sequences, self._sequence_mask = self.sequence_layout(self._rows.count, self.sequence_length)
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
        return sequence_layout(counts, length)

    def minibatch_indices(self, size: int) -> list[np.ndarray]:
        """``epochs * num_minibatches`` index arrays into a rollout of ``size`` rows; each epoch is a permutation.

        In sequence mode ``size`` is the number of sequences and the indices pick sequences.
        """
        return epoch_schedule(self.rng, size, self.epochs, self.num_minibatches)

    # ------------------------------------------------------------------ collection
    def collect(self) -> TransitionBatch:
        """Clear, pull from upstream until every env holds ``steps_per_env`` rows, and :meth:`finish`."""
        if self.upstream is None:
            raise TypeError("this RolloutBuffer has no upstream to pull from; use add() and finish()")
        self.clear()
        while self._rows.count.min() < self.steps_per_env:
            batch = self.pull()
            if self.consume_cut():  # steps are missing before this batch: the rows so far cannot continue into it
                self.clear()
                self._rows.starts_next[:] = True
            self.add(batch)
        self.rollouts_collected += 1
        return self.finish()

    def clear(self) -> None:
        """Forget the rows held (the arrays stay allocated); whether each env's last one ended carries over."""
        self._rows.clear()

    def add(self, batch: TransitionBatch) -> None:
        """Append the rows of ``batch`` to their envs' sequences (any number of rows per env, in time order)."""
        self._rows.add(batch)

    # ------------------------------------------------------------------ GAE
    def finish(self, value_fn: ValueFn | None = None) -> TransitionBatch:
        """The rows held as one flat batch [M] with ``advantage`` and ``returns`` (float32 [M]) added.

        Each env's last row is treated as a cut: it bootstraps from the
        critic's value of its ``next_obs`` unless it terminated.
        """
        rows = self._rows
        if rows.fields is None or rows.count.max() == 0:
            raise RuntimeError("the rollout is empty; add() transitions first")
        return rollout_with_gae(
            rows.fields,
            rows.count,
            gae_lambda=self.gae_lambda,
            value_key=self.value_key,
            value_fn=value_fn or self.value_fn,
            upstream=self.upstream,
            starts_next=rows.starts_next if self.sequence_length is not None else None,
        )

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
        self._rows.starts_next[:] = True  # the restored source starts every episode afresh
        self.state_replaced()

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """Rollout shape, rows held, rollouts collected, the minibatch being served, and the chain upstream."""
        shape = {"envs": self.num_envs, "steps_per_env": self.steps_per_env}
        if self.sequence_length is not None:  # sequence minibatches (recurrent PPO)
            shape["sequence_length"] = self.sequence_length
        served = f"{self._served}/{len(self._schedule)}"
        return stage_repr(self, **shape, held=len(self), rollouts=self.rollouts_collected, served=served)

"""Sampling across shards as if from one buffer: the split of a batch, the probabilities, the weights, the feedback.

Pure numpy, no Ray: :class:`~ptl_rl.distributed.ShardedReplay` calls these with the shards' answers.

* **The split.** A batch of ``B`` rows is split over the ``K`` shards by one multinomial draw over the shards'
  draw masses ``m_k`` (rows stored for uniform draws, the sum of ``(p + eps) ** alpha`` for prioritized ones);
  each shard then draws its count as its own buffer does. A row ``i`` of shard ``k`` is so drawn with
  ``P(i) = m_k / M * w_i / m_k = w_i / M``: exactly the probability in one buffer holding every row.
* **The weights.** ``(N * P(i)) ** -beta`` normalised by the largest in the batch, as
  :class:`~ptl_rl.replay.PrioritizedDraws` does, over the whole batch: ``(min_j P(j) / P(i)) ** beta``.
  ``P`` uses the masses the split used and the mass each shard drew from, so it is the probability the row
  was drawn with even when a shard changed between the two (writers insert concurrently).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.distributed.replay_shard import INCARNATION_FIELD, SHARD_FIELD, ShardSample
from ptl_rl.replay.feedback import to_numpy_1d
from ptl_rl.replay.priority_draws import refuse_bad_priorities


def split_counts(rng: np.random.Generator, batch_size: int, masses: np.ndarray) -> np.ndarray:
    """Rows of a batch of ``batch_size`` per shard (int64 [K]): multinomial over ``masses`` (float64 [K], >= 0)."""
    total = float(masses.sum())
    if not total > 0.0:
        raise ValueError("the shards hold nothing drawable yet; wait for writers (ShardedReplay's warmup)")
    counts: np.ndarray = rng.multinomial(batch_size, masses / total).astype(np.int64)
    return counts


def row_probabilities(
    split_masses: np.ndarray, shard: np.ndarray, row_mass: np.ndarray, drawn_masses: np.ndarray
) -> np.ndarray:
    """``P(i)`` (float64 [B]) of each row: its shard's share of the split times its share of the shard's mass.

    Args:
        split_masses: float64 [K], the masses the batch was split by.
        shard: int64 [B], each row's shard.
        row_mass: float64 [B], each row's draw weight in its shard.
        drawn_masses: float64 [K], the mass each shard drew from (its answer's ``stats.mass``).
    """
    share = split_masses / split_masses.sum()
    probs: np.ndarray = share[shard] * row_mass / drawn_masses[shard]
    return probs


def importance_weights(probs: np.ndarray, beta: float) -> np.ndarray:
    """``(N P(i)) ** -beta / max_j (N P(j)) ** -beta == (min_j P(j) / P(i)) ** beta`` (float32 [B]).

    The convention of :class:`~ptl_rl.replay.PrioritizedDraws`: normalised by the largest weight of the
    batch (``N`` cancels), so the largest is exactly 1.
    """
    weights: np.ndarray = np.power(probs.min() / probs, beta, dtype=np.float32)
    return weights


def merge_answers(
    answers: Sequence[tuple[int, ShardSample]], split_masses: np.ndarray, beta: float | None
) -> TransitionBatch:
    """One batch of the shards' answers, in shard order, with ``shard`` and ``shard_incarnation`` (int64 [B])
    and, given ``beta``, ``weights`` (float32 [B]) computed over all of them.

    ``answers``: ``(shard, answer)`` of every shard asked for at least one row.
    """
    drawn_masses = split_masses.astype(np.float64, copy=True)
    batches, shards, incarnations, masses = [], [], [], []
    for shard, answer in answers:
        assert answer.batch is not None  # (only shards asked for rows answer here)
        drawn_masses[shard] = answer.stats.mass
        batches.append(answer.batch)
        shards.append(np.full(len(answer.batch), shard, dtype=np.int64))
        incarnations.append(np.full(len(answer.batch), answer.stats.incarnation, dtype=np.int64))
        masses.append(answer.row_mass)
    batch = TransitionBatch.concat(batches)
    if len(batches) == 1:  # concat returned the answer itself: copy the dict before adding fields
        batch = TransitionBatch(dict(batch.items()))
    row_shard = np.concatenate(shards)
    batch[SHARD_FIELD] = row_shard
    batch[INCARNATION_FIELD] = np.concatenate(incarnations)
    if beta is not None:
        probs = row_probabilities(split_masses, row_shard, np.concatenate(masses), drawn_masses)
        batch["weights"] = importance_weights(probs, beta)
    return batch


def check_priorities(priorities: np.ndarray) -> None:
    """Refuse non-finite or negative priorities (float [B]) before anything is sent, naming the fix."""
    refuse_bad_priorities(priorities, "No shard's priorities changed.")


class ShardedPriorityTarget(Protocol):
    """Where a sharded batch's priorities go (a :class:`~ptl_rl.distributed.ShardedReplay`)."""

    def update_priorities(
        self,
        shard: Numbers,
        indices: Numbers,
        priorities: Numbers,
        generations: Numbers | None = None,
        incarnations: Numbers | None = None,
    ) -> int: ...


class ShardedPriorityFeedback:
    """The link a batch sampled across shards carries: ``|td_errors|`` go to the shard holding each row.

    The sharded twin of :class:`~ptl_rl.replay.PriorityFeedback` (a :class:`~ptl_rl.core.batch.PriorityLink`):
    numpy copies of the rows' ``shard``, ``indices``, ``generations`` and ``incarnations`` (int64 [B]), so it
    survives ``to_torch`` and ``TorchBatch.to(device)``; ``select`` follows ``rows``.
    """

    __slots__ = ("generations", "incarnations", "indices", "shard", "target")

    def __init__(
        self,
        target: ShardedPriorityTarget,
        shard: np.ndarray,
        indices: np.ndarray,
        generations: np.ndarray,
        incarnations: np.ndarray,
    ) -> None:
        self.target = target
        self.shard = shard
        self.indices = indices
        self.generations = generations
        self.incarnations = incarnations

    def __call__(self, td_errors: torch.Tensor | np.ndarray) -> int:
        """Send ``|td_errors|`` (float [B]) as the rows' new priorities; returns what the target returns."""
        td = to_numpy_1d(td_errors, "td_errors", np.float64)
        return self.target.update_priorities(self.shard, self.indices, np.abs(td), self.generations, self.incarnations)

    def select(self, index: np.ndarray | torch.Tensor | slice) -> ShardedPriorityFeedback:
        """The feedback of the rows ``index`` (slice, bool mask or int indices; numpy or torch)."""
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        return ShardedPriorityFeedback(
            self.target, self.shard[index], self.indices[index], self.generations[index], self.incarnations[index]
        )

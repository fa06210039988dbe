"""PrioritizedReplayBuffer: proportional prioritized replay (Schaul et al. 2016) on a vectorized sum-tree.

Sampling probability of stored transition ``i``: ``P(i) = p_i**alpha / sum_k p_k**alpha``
with ``p_i = priority_i + eps``. Importance weights correct the bias:
``w_i = (N * P(i))**-beta``, normalised by the **largest weight in the batch**,
so ``w_i = (min_j P(j) / P(i))**beta`` over the batch's rows ``j`` and the
largest weight is exactly 1. (Normalising by the buffer-wide maximum, i.e. by
the smallest stored priority, lets a single stale, tiny priority shrink every
weight and so the effective learning rate; the batch maximum, as in Dopamine,
keeps the scale of every update at most and at least once per batch equal to
an unweighted one.)

Priorities flow back from the learner with one call: each sampled batch carries
``indices`` (int64 [B], the slots), ``generations`` (int64 [B], the slots' write
stamps) and ``weights`` (float32 [B]), and ``batch.update_priorities(td_errors)``
(numpy or torch on any device, also after ``batch.to(device)``) writes
``|td_errors|`` back. A slot overwritten since it was sampled has a new stamp:
its update is ignored and counted in :attr:`PrioritizedReplayBuffer.stale_updates`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.protocols import Storage
from ptl_rl.core.schedules import Schedule
from ptl_rl.replay.indexed import (
    SAMPLE_FIELDS,
    IndexedReplayBuffer,
    PriorityFeedback,
    check_reserved_fields,
    to_numpy_1d,
)

__all__ = ["SAMPLE_FIELDS", "PrioritizedReplayBuffer", "PriorityFeedback", "Schedule", "to_numpy_1d"]


class PrioritizedReplayBuffer(IndexedReplayBuffer):
    """Proportional prioritized replay; same stage and standalone behaviour as :class:`ReplayBuffer`.

    Args:
        upstream, capacity, warmup, transitions_per_yield, seed: as for
            :class:`~ptl_rl.replay.ReplayBuffer`.
        alpha: priority exponent (0 = uniform), ``>= 0``.
        beta: importance-sampling exponent: a float, or a schedule
            ``step -> beta`` such as ``LinearSchedule(0.4, 1.0, 100_000)``.
        beta_clock: the step a schedule is called with: ``"learner"`` (number of
            batches sampled so far) or ``"env"`` (transitions added so far).
        eps: added to every priority, so that no transition becomes unreachable (``> 0``).
        stratified: draw one target from each of ``B`` equal segments of the
            total priority mass (lower variance, as in the paper) instead of
            ``B`` independent targets. Either way ``P(i)`` is as above.

    New transitions get the largest priority among the transitions stored
    when they arrive, excluding the ones they overwrite (1.0 in an empty
    buffer): found with the max-tree kept beside the sum-tree.

    :meth:`sample` returns the stored fields ``[B, ...]`` plus ``indices``
    (int64 [B]), ``generations`` (int64 [B]) and ``weights`` (float32 [B]).

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
        >>> buffer = ptl_rl.PrioritizedReplayBuffer(capacity=100, alpha=1.0, beta=1.0, seed=0)
        >>> for _ in range(4):
        ...     slots = buffer.add(next(source))
        >>> batch = buffer.sample(4)
        >>> sorted(field for field in batch.keys() if field not in ptl_rl.CORE_FIELDS)
        ['generations', 'indices', 'weights']
        >>> batch.weights  # all priorities are equal so far
        array([1., 1., 1., 1.], dtype=float32)
        >>> batch.update_priorities(np.array([0.5, -2.0, 1.0, 0.0]))  # TD errors; returns the stale rows skipped
        0
        >>> buffer.update_priorities(np.arange(8), [4.0, 0, 0, 0, 0, 0, 0, 0])  # or by slot
        0
        >>> buffer.sample(4).indices  # now slot 0 holds almost all the mass
        array([0, 0, 0, 0])
    """

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None = None,
        capacity: int = 100_000,
        *,
        alpha: float = 0.6,
        beta: float | Schedule = 0.4,
        beta_clock: str = "learner",
        eps: float = 1e-6,
        stratified: bool = True,
        warmup: int | None = None,
        transitions_per_yield: int = 1,
        seed: int | None = None,
        storage: Callable[[int], Storage] | None = None,
    ) -> None:
        super().__init__(
            upstream,
            capacity,
            prioritized=True,
            alpha=alpha,
            beta=beta,
            beta_clock=beta_clock,
            eps=eps,
            stratified=stratified,
            warmup=warmup,
            transitions_per_yield=transitions_per_yield,
            seed=seed,
            storage=storage,
        )

    # ------------------------------------------------------------------ buffer
    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` transitions of ``batch`` at the current maximum priority; returns their slots (int64 [B])."""
        check_reserved_fields(batch)
        return super().add(batch)

    def _store(self, batch: TransitionBatch) -> np.ndarray:
        # one write: the rows, their generation and their priority, redone whole after a cut
        old_size = self.storage.size
        slots = self.storage.add(batch)
        if len(slots) == 0:
            return slots
        self._stamp(slots)
        self.tree.update(slots, self.draws.weight_for_new(slots, old_size))
        return slots

    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` transitions drawn with probability ``P(i)``, with ``indices``, ``generations``, ``weights``.

        Stored fields come as numpy arrays ``[batch_size, ...]``; ``weights``
        float32 [B] (batch-max normalised, see the module docstring).
        """
        self.settle()
        self._check_batch_size(batch_size)
        indices, weights = self._draw(batch_size)
        return self._finish(self.storage.gather(indices), indices, weights)

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """Size, alpha, beta now, warm-up, replay ratio, and the chain upstream."""
        return stage_repr(
            self,
            **self._size_counters(),
            alpha=self.alpha,
            beta=self.beta,
            transitions_per_yield=self.transitions_per_yield,
        )

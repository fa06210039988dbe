"""How a replay buffer picks the slots of a batch: a weight per slot in a sum-tree.

A slot with weight 0 is never drawn; the others are drawn with probability
proportional to their weight. Two strategies share that mechanism:

* :class:`SlotDraws`: every drawable slot weighs 1, so draws are uniform over
  the drawable slots (a :class:`~ptl_rl.replay.SequenceReplayBuffer` draws
  its window starts this way);
* :class:`PriorityDraws`: proportional prioritized replay (Schaul et al.
  2016), the weight of slot ``i`` is ``(p_i + eps) ** alpha``, and every draw
  comes with importance weights.

A buffer decides which slots are drawable and when; the strategy only keeps
the weights, draws, and (prioritized) turns priorities into weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ptl_rl.core.schedules import Schedule, as_schedule
from ptl_rl.replay.sumtree import SumTree

BETA_CLOCKS = ("learner", "env")
_LOG_MAX_FLOAT = math.log(np.finfo(np.float64).max) - 1.0  # margin for the rounding of pow


def redraw_unsampleable(
    sampleable: Any, drawn: tuple[np.ndarray, ...], draw: Any, max_rounds: int = 100
) -> tuple[np.ndarray, ...]:
    """Replace the rows of ``drawn`` (arrays [B], the first the slots) that ``sampleable`` rejects by fresh draws.

    ``draw(count)`` returns ``count`` new rows as a tuple like ``drawn``. Rejection
    keeps each buffer's sampling distribution, restricted to sampleable slots.
    """
    drawn = tuple(np.array(a, copy=True) for a in drawn)
    for _ in range(max_rounds):
        bad = np.flatnonzero(~sampleable(drawn[0]))
        if len(bad) == 0:
            return drawn
        fresh = draw(len(bad))
        for array, new in zip(drawn, fresh, strict=True):
            array[bad] = new
    raise ValueError(
        f"after {max_rounds} redraws some sampled transitions still wait for their next_obs or lost their frames: "
        "the buffer holds too few sampleable transitions. Raise warmup (so sampling starts once more than "
        "num_envs * n_step transitions are stored) or FrameStorage's extra_frames. If almost no stored "
        "transition ever becomes sampleable, FrameStorage(n_step=...) may differ from the n of the "
        "NStepTransform that feeds it (with check=False nothing compares them)"
    )


class SlotDraws:
    """Uniform draws over the drawable slots: each has weight 1, every other slot 0.

    Args:
        capacity: number of slots.
        stratified: draw one target from each of ``B`` equal segments of the
            total mass (lower variance) instead of ``B`` independent targets.
            Either way each drawable slot has the same probability.
    """

    prioritized = False

    def __init__(self, capacity: int, stratified: bool = True) -> None:
        self.tree = SumTree(capacity)
        self.stratified = bool(stratified)
        self.batches_sampled = 0

    def weight_for_new(self, slots: np.ndarray, old_size: int) -> float:
        """Weight of slots that become drawable now (``slots`` int [B] were just written over ``old_size`` stored)."""
        return 1.0

    def draw(
        self, rng: np.random.Generator, batch_size: int, sampleable: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``batch_size`` slots (int64 [B]) and their importance weights (float32 [B], or ``None`` if uniform).

        ``sampleable(slots) -> bool [B]`` rejects slots the storage cannot
        serve yet; they are redrawn (the distribution restricted to the rest).
        """
        beta = self._beta_now()  # the schedule's value for this batch, before the clock moves on
        self.batches_sampled += 1
        indices, leaves = self.tree.sample(rng.random(batch_size), self.stratified)
        if sampleable is not None:

            def draw(count: int) -> tuple[np.ndarray, np.ndarray]:
                return self.tree.sample(rng.random(count), False)

            indices, leaves = redraw_unsampleable(sampleable, (indices, leaves), draw)
        return indices, None if beta is None else self._importance_weights(leaves, beta)

    def _beta_now(self) -> float | None:
        return None

    def _importance_weights(self, leaves: np.ndarray, beta: float) -> np.ndarray:
        raise NotImplementedError

    def state_dict(self, size: int) -> dict[str, Any]:
        """The weights of the first ``size`` slots and the draw counter (``weights_only``-safe)."""
        return {"priorities": torch.from_numpy(self.tree.leaves[:size].copy()), "batches_sampled": self.batches_sampled}

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise if ``state`` cannot be loaded into this strategy (a hook; nothing to check here)."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.tree.set_all(state["priorities"].numpy())
        self.batches_sampled = int(state["batches_sampled"])


class PriorityDraws(SlotDraws):
    """Proportional prioritized draws: ``P(i) = w_i / sum_k w_k`` with ``w_i = (p_i + eps) ** alpha``.

    Importance weights ``(N * P(i)) ** -beta`` are normalised by the largest
    in the batch, i.e. ``(min_j w_j / w_i) ** beta`` over the batch's rows, so
    the largest is exactly 1 (see :mod:`ptl_rl.replay.prioritized`).

    Args:
        capacity, stratified: as for :class:`SlotDraws`.
        alpha: priority exponent (0 = uniform), ``>= 0``.
        beta: importance-sampling exponent, a float or a schedule ``step -> beta``.
        beta_clock: the step a schedule gets: ``"learner"`` (batches drawn so
            far) or ``"env"`` (``env_clock()``, transitions added so far).
        eps: added to every priority, so that no slot becomes unreachable (``> 0``).
        env_clock: returns the number of transitions added (for ``beta_clock="env"``).
    """

    prioritized = True

    def __init__(
        self,
        capacity: int,
        *,
        alpha: float,
        beta: float | Schedule,
        beta_clock: str,
        eps: float,
        stratified: bool,
        env_clock: Callable[[], int],
    ) -> None:
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
        if not (np.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be > 0 (it keeps every transition reachable), got {eps}")
        if beta_clock not in BETA_CLOCKS:
            raise ValueError(f"beta_clock must be one of {BETA_CLOCKS}, got {beta_clock!r}")
        if not callable(beta) and not 0 <= beta:
            raise ValueError(f"beta must be >= 0 (usually annealed from ~0.4 to 1), got {beta}")
        super().__init__(capacity, stratified)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.beta_schedule: Schedule = as_schedule(beta)
        self.beta_clock = beta_clock
        self.env_clock = env_clock
        self.stale_updates = 0  # priority updates ignored because their slot was overwritten since sampling
        self.applied_updates = 0

    @property
    def beta(self) -> float:
        """The importance-sampling exponent now (the schedule at the current clock)."""
        step = self.batches_sampled if self.beta_clock == "learner" else self.env_clock()
        return float(self.beta_schedule(step))

    def weight_for_new(self, slots: np.ndarray, old_size: int) -> float:
        """The largest weight among the slots that held data and were not just overwritten (1 if none)."""
        capacity = self.tree.capacity
        count, start = len(slots), int(slots[0])
        if old_size + count <= capacity:  # nothing overwritten: all of [0, old_size) stays
            best = self.tree.range_max(0, old_size)
        elif count >= capacity:
            best = 0.0
        else:  # full ring: the kept slots run from the end of the written range around to its start
            stop = start + count
            best = max(self.tree.range_max(stop, capacity), self.tree.range_max(stop - capacity, start))
        return best if best > 0.0 else 1.0

    def _beta_now(self) -> float:
        return self.beta

    def _importance_weights(self, leaves: np.ndarray, beta: float) -> np.ndarray:
        # (N P_i)^-beta / max_j (N P_j)^-beta == (min_j leaf_j / leaf_i)^beta: N and the total cancel
        weights: np.ndarray = np.power(leaves.min() / leaves, beta, dtype=np.float32)
        return weights

    def weights_of(self, priorities: np.ndarray) -> np.ndarray:
        """``(priorities + eps) ** alpha`` (float64 [B]) after checking the values; raises before any change."""
        if len(priorities) == 0:
            return priorities
        low, high = priorities.min(), priorities.max()  # NaN propagates into both
        # fast path: all finite, >= 0, and small enough that (p + eps) ** alpha stays finite
        if low >= 0 and high < np.inf and self.alpha * math.log(high + self.eps) < _LOG_MAX_FLOAT:
            return np.power(priorities + self.eps, self.alpha)
        self._raise_bad_priorities(priorities)
        raise AssertionError("unreachable")

    def _raise_bad_priorities(self, priorities: np.ndarray) -> None:
        """Raise the ``ValueError`` that names what is wrong with ``priorities`` and how to fix it."""
        bad = ~np.isfinite(priorities)
        if bad.any():
            raise ValueError(
                f"priorities must be finite; got {priorities[bad][:5].tolist()} at rows "
                f"{np.flatnonzero(bad)[:5].tolist()} (a diverging loss or target?). Fix the TD targets or clip "
                "the errors, e.g. td.clamp(-100, 100), before feeding them back. The priorities are unchanged."
            )
        negative = priorities < 0
        if negative.any():
            raise ValueError(
                f"priorities must be >= 0; got {priorities[negative][:5].tolist()} at rows "
                f"{np.flatnonzero(negative)[:5].tolist()}. Pass absolute TD errors (td.abs()), or use "
                "batch.update_priorities(td_errors), which takes the absolute value. The priorities are unchanged."
            )
        raise ValueError(
            f"(priority + eps) ** alpha overflows for priorities up to {priorities.max():.3g} with "
            f"alpha={self.alpha}; clip the TD errors. The priorities are unchanged."
        )

    def state_dict(self, size: int) -> dict[str, Any]:
        """As :meth:`SlotDraws.state_dict`, plus ``alpha`` and the update counters."""
        state = super().state_dict(size)
        state.update(alpha=self.alpha, stale_updates=self.stale_updates, applied_updates=self.applied_updates)
        return state

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise if ``state`` was saved with another ``alpha`` (its weights are raised to that alpha)."""
        if float(state.get("alpha", 0.0)) != self.alpha:
            raise ValueError(
                f"the state was saved with alpha={state.get('alpha', 0.0)}, this buffer has alpha={self.alpha}; "
                "stored priorities are raised to alpha, so create the buffer with the checkpoint's alpha"
            )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.check_state(state)
        super().load_state_dict(state)
        self.stale_updates = int(state["stale_updates"])
        self.applied_updates = int(state["applied_updates"])

"""PrioritizedDraws: proportional prioritized draws (Schaul et al. 2016) on a vectorized sum-tree.

Sampling probability of drawable slot ``i``: ``P(i) = w_i / sum_k w_k`` with
``w_i = (p_i + eps) ** alpha``. Importance weights correct the bias:
``(N * P(i)) ** -beta``, normalised by the **largest weight in the batch**, so
they are ``(min_j w_j / w_i) ** beta`` over the batch's rows ``j`` and the
largest is exactly 1. (Normalising by the buffer-wide maximum, i.e. by the
smallest stored priority, lets a single stale, tiny priority shrink every
weight and so the effective learning rate; the batch maximum, as in Dopamine,
keeps the scale of every update at most and at least once per batch equal to
an unweighted one.)

Used alone (``ReplayBuffer(..., draws=PrioritizedDraws(...))``, what a
:class:`~ptl_rl.replay.PrioritizedReplayBuffer` is) every stored row is
drawable; held by a :class:`~ptl_rl.replay.SequenceWindows` or a
:class:`~ptl_rl.replay.HindsightGoals` it weighs the slots they make drawable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np

from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.core.protocols import PartlySampleableStorage, Storage
from ptl_rl.core.protocols.draws import Advance
from ptl_rl.core.schedules import Schedule, as_schedule
from ptl_rl.replay.draws import WeightedSlots, check_batch_fits
from ptl_rl.replay.feedback import check_reserved_fields, to_numpy_1d

BETA_CLOCKS = ("learner", "env")
_LOG_MAX_FLOAT = math.log(np.finfo(np.float64).max) - 1.0  # margin for the rounding of pow


class PrioritizedDraws(WeightedSlots):
    """Rows (or window starts, or steps) drawn with probability ``P(i)`` proportional to ``(p_i + eps) ** alpha``.

    A batch carries the stored fields ``[B, ...]`` plus ``indices`` (int64 [B],
    the slots), ``generations`` (int64 [B], the slots' write stamps) and
    ``weights`` (float32 [B], batch-max normalised importance weights), and
    ``batch.update_priorities(td_errors)`` (numpy or torch on any device, also
    after ``batch.to(device)``) writes ``|td_errors|`` back. A slot overwritten
    since it was drawn has a new stamp: its update is ignored and counted in
    :attr:`stale_updates`. New slots get the largest weight among the slots
    stored when they arrive, excluding the ones they overwrite (1.0 in an empty
    buffer): found with the max-tree kept beside the sum-tree.

    Args:
        alpha: priority exponent (0 = uniform), ``>= 0``.
        beta: importance-sampling exponent: a float, or a schedule
            ``step -> beta`` such as ``LinearSchedule(0.4, 1.0, 100_000)``.
        beta_clock: the step a schedule is called with: ``"learner"`` (number of
            batches drawn so far) or ``"env"`` (transitions added so far).
        eps: added to every priority, so that no slot becomes unreachable (``> 0``).
        stratified: draw one target from each of ``B`` equal segments of the
            total priority mass (lower variance, as in the paper) instead of
            ``B`` independent targets. Either way ``P(i)`` is as above.

    A strategy keeps one buffer's priorities: create one per buffer.

    Examples:
        >>> import numpy as np
        >>> import ptl_rl
        >>> rows = ptl_rl.TransitionBatch(obs=np.arange(8.0)[:, None], action=np.arange(8))
        >>> buffer = ptl_rl.ReplayBuffer(capacity=8, draws=ptl_rl.PrioritizedDraws(alpha=1.0, beta=1.0), seed=0)
        >>> buffer.add(rows)
        array([0, 1, 2, 3, 4, 5, 6, 7])
        >>> batch = buffer.sample(4)
        >>> batch.weights  # all priorities are equal so far
        array([1., 1., 1., 1.], dtype=float32)
        >>> buffer.update_priorities(np.arange(8), [4.0, 0, 0, 0, 0, 0, 0, 0])  # by slot; returns stale rows skipped
        0
        >>> buffer.sample(4).indices  # now slot 0 holds almost all the mass
        array([0, 0, 0, 0])
        >>> buffer.draws.applied_updates, buffer.draws.beta
        (8, 1.0)
    """

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float | Schedule = 0.4,
        beta_clock: str = "learner",
        eps: float = 1e-6,
        stratified: bool = True,
    ) -> None:
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
        if not (np.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be > 0 (it keeps every transition reachable), got {eps}")
        if beta_clock not in BETA_CLOCKS:
            raise ValueError(f"beta_clock must be one of {BETA_CLOCKS}, got {beta_clock!r}")
        if not callable(beta) and not 0 <= beta:
            raise ValueError(f"beta must be >= 0 (usually annealed from ~0.4 to 1), got {beta}")
        super().__init__(stratified)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.beta_schedule: Schedule = as_schedule(beta)
        self.beta_clock = beta_clock
        self.stale_updates = 0  # priority updates ignored because their slot was overwritten since sampling
        self.applied_updates = 0

    @property
    def beta(self) -> float:
        """The importance-sampling exponent now (the schedule at the current clock)."""
        step = self.batches_sampled if self.beta_clock == "learner" else self._storage.total_added
        return float(self.beta_schedule(step))

    # ------------------------------------------------------------------ the strategy of a buffer
    def bind(self, storage: Storage, upstream: Iterator[TransitionBatch] | None) -> None:
        """Draw among the stored rows of ``storage``: every one is drawable, at its priority."""
        self.bind_weights(storage)
        self._partly_sampleable = isinstance(storage, PartlySampleableStorage)

    def check(self, batch: TransitionBatch) -> None:
        check_reserved_fields(batch)

    def added(self, slots: np.ndarray, old_size: int, batch: TransitionBatch, advance: Advance) -> None:
        # redone whole after a cut, with the rows (with a storage that journals its own adds, a cut after the rows
        # leaves them at their slot's previous priority and generation: sampled with a stale weight, never wrong)
        self.stamp(slots)
        self.tree.update(slots, self.weight_for_new(slots, old_size))

    def ready(self) -> bool:
        return True  # any stored row can be drawn: the warm-up alone decides when enough are

    def sample(self, rng: np.random.Generator, batch_size: int) -> TransitionBatch:
        """``batch_size`` rows drawn with probability ``P(i)``, with ``indices``, ``generations``, ``weights``."""
        storage = self._storage
        check_batch_fits(batch_size, storage)
        sampleable = cast(PartlySampleableStorage, storage).sampleable if self._partly_sampleable else None
        indices, weights = self.draw_slots(rng, batch_size, sampleable)
        return self.finish(storage.gather(indices), indices, weights, self)

    def snapshot(self) -> object:
        return None  # an add's writes (stamps, leaves) are rewritten in full by its redo

    def restore(self, snapshot: Any) -> None:
        """Nothing to put back."""

    def counters(self) -> dict[str, object]:
        return {"alpha": self.alpha, "beta": self.beta}

    def state_dict(self) -> dict[str, Any]:
        """Priorities (as weights), generation stamps and counters of the stored rows (``weights_only``-safe)."""
        return self.weights_state_dict(len(self._storage))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.load_weights_state(state)

    # ------------------------------------------------------------------ weights
    def weight_for_new(self, slots: np.ndarray, old_size: int) -> float:
        """The largest weight among the slots that held data and were not just overwritten (1 if none).

        ``slots`` (int [B], a run of ring slots, possibly empty) were just written over ``old_size`` stored.
        """
        capacity = self.tree.capacity
        count = len(slots)
        if old_size + count <= capacity:  # nothing overwritten: all of [0, old_size) stays
            best = self.tree.range_max(0, old_size)
        elif count >= capacity:
            best = 0.0
        else:  # full ring: the kept slots run from the end of the written range around to its start
            start = int(slots[0])
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
        refuse_bad_priorities(priorities, "The priorities are unchanged.")
        raise ValueError(
            f"(priority + eps) ** alpha overflows for priorities up to {priorities.max():.3g} with "
            f"alpha={self.alpha}; clip the TD errors. The priorities are unchanged."
        )

    # ------------------------------------------------------------------ priorities
    def update_priorities(
        self, indices: Numbers, priorities: Numbers, generations: Numbers | None = None, *, drawable: str | None = None
    ) -> int:
        """Set the priorities of the slots ``indices``; returns how many stale rows were ignored.

        Args:
            indices: int [B], the ``indices`` of a sampled batch.
            priorities: float [B], finite and ``>= 0`` (for TD errors pass
                ``|td|``; ``batch.update_priorities(td)`` does that for you).
                Stored as ``(priority + eps) ** alpha``.
            generations: int [B], the ``generations`` of the sampled batch, or
                ``None`` to skip the staleness check. Rows whose slot was
                overwritten since sampling are ignored and counted in
                :attr:`stale_updates`.
            drawable: for a holder that makes only some slots drawable, what
                they are (``"window starts"``): a slot of weight 0 is refused,
                naming them. ``None``: any stored slot.

        Numpy arrays or torch tensors on any device. On invalid input a
        ``ValueError`` says what is wrong and nothing is changed.
        """
        idx = to_numpy_1d(indices, "indices", np.int64)
        values = to_numpy_1d(priorities, "priorities", np.float64)
        if values.shape != idx.shape:
            raise ValueError(
                f"got {len(values)} priorities (td_errors) for a batch of {len(idx)} rows; pass one per sampled "
                "row, in the batch's order (reduce per-step errors of sequences to one value per row). "
                "The priorities are unchanged."
            )
        values = self.weights_of(values)
        size = len(self._storage)
        if len(idx) and (idx.min() < 0 or idx.max() >= size):  # every slot must hold data
            raise ValueError(
                f"indices must be slots in [0, {size}) holding data; got {idx.min()}..{idx.max()}. "
                "Pass the indices of a batch sampled from this buffer. The priorities are unchanged."
            )
        fresh = None
        if generations is not None:
            gens = to_numpy_1d(generations, "generations", np.int64)
            if gens.shape != idx.shape:
                raise ValueError(f"got {len(gens)} generations for {len(idx)} indices; pass the batch's generations")
            fresh = self.generations.take(idx) == gens
        if drawable is not None:
            self._check_drawable(idx if fresh is None else idx[fresh], drawable)
        if fresh is not None and not fresh.all():
            stale = int(len(idx) - np.count_nonzero(fresh))
            self.stale_updates += stale
            idx, values = idx[fresh], values[fresh]
        else:
            stale = 0
        self.tree.update(idx, values)
        self.applied_updates += len(idx)
        return stale

    def _check_drawable(self, idx: np.ndarray, drawable: str) -> None:
        """The (non-stale) slots about to be updated must be drawable (raises before any change)."""
        if len(idx) and not (self.tree.get(idx) > 0.0).all():
            bad = idx[self.tree.get(idx) <= 0.0][:5].tolist()
            raise ValueError(
                f"slots {bad} are not {drawable}; pass the indices of a batch sampled from this buffer "
                "(with its generations). The priorities are unchanged."
            )

    def priorities(self, indices: Numbers | None = None) -> np.ndarray:
        """Stored leaf values ``(priority + eps) ** alpha`` (float64), of ``indices`` or of every stored slot."""
        if indices is None:
            return self.tree.leaves[: len(self._storage)].copy()
        return self.tree.get(to_numpy_1d(indices, "indices", np.int64))

    # ------------------------------------------------------------------ state
    def weights_state_dict(self, size: int) -> dict[str, Any]:
        """As :meth:`WeightedSlots.weights_state_dict`, plus ``alpha`` and the update counters."""
        state = super().weights_state_dict(size)
        state.update(alpha=self.alpha, stale_updates=self.stale_updates, applied_updates=self.applied_updates)
        return state

    def check_weights_state(self, state: Mapping[str, Any]) -> None:
        """Raise if ``state`` was saved with another ``alpha`` (its weights are raised to that alpha)."""
        if float(state.get("alpha", 0.0)) != self.alpha:
            raise ValueError(
                f"the state was saved with alpha={state.get('alpha', 0.0)}, this buffer has alpha={self.alpha}; "
                "stored priorities are raised to alpha, so create the buffer with the checkpoint's alpha"
            )

    def load_weights_state(self, state: Mapping[str, Any]) -> None:
        super().load_weights_state(state)
        self.stale_updates = int(state["stale_updates"])
        self.applied_updates = int(state["applied_updates"])

    def __repr__(self) -> str:
        beta = f"{self.beta:g}" if self._bound else repr(self.beta_schedule)
        return f"PrioritizedDraws(alpha={self.alpha:g}, beta={beta}, beta_clock={self.beta_clock!r}, eps={self.eps:g})"


def refuse_bad_priorities(priorities: np.ndarray, unchanged: str) -> None:
    """Raise a ``ValueError`` naming the non-finite or negative values of ``priorities`` (float [B]) and the fix,
    ending with ``unchanged`` (what the refusal left as it was); return if there are none."""
    bad = ~np.isfinite(priorities)
    if bad.any():
        raise ValueError(
            f"priorities must be finite; got {priorities[bad][:5].tolist()} at rows "
            f"{np.flatnonzero(bad)[:5].tolist()} (a diverging loss or target?). Fix the TD targets or clip "
            f"the errors, e.g. td.clamp(-100, 100), before feeding them back. {unchanged}"
        )
    negative = priorities < 0
    if negative.any():
        raise ValueError(
            f"priorities must be >= 0; got {priorities[negative][:5].tolist()} at rows "
            f"{np.flatnonzero(negative)[:5].tolist()}. Pass absolute TD errors (td.abs()), or use "
            f"batch.update_priorities(td_errors), which takes the absolute value. {unchanged}"
        )

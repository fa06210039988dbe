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

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ptl_rl.batch import TransitionBatch
from ptl_rl.buffers.frames import redraw_unsampleable
from ptl_rl.buffers.replay import ReplayBuffer
from ptl_rl.buffers.sumtree import SumTree
from ptl_rl.reprs import stage_repr

Schedule = Callable[[int], float]
BETA_CLOCKS = ("learner", "env")
_LOG_MAX_FLOAT = math.log(np.finfo(np.float64).max) - 1.0  # margin for the rounding of pow
# Fields the prioritized and sequence buffers add to sampled batches; stored data may not use them.
SAMPLE_FIELDS = ("indices", "generations", "weights", "mask")


def to_numpy_1d(values: Any, name: str, dtype: type) -> np.ndarray:
    """``values`` (numpy, list or torch tensor on any device) as a 1-D numpy array of ``dtype``.

    A trailing singleton dimension (``[B, 1]``, as a Q-network with keepdim gives) is dropped.
    """
    if type(values) is np.ndarray and values.ndim == 1 and values.dtype == dtype:
        return values  # the common case, without further checks
    if isinstance(values, torch.Tensor):
        values = values.detach()
        if values.is_floating_point() and values.dtype not in (torch.float32, torch.float64):
            values = values.float()  # bfloat16/float16 have no numpy twin
        values = values.cpu().numpy()
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise ValueError(
            f"{name} must be one value per sampled row, shape [B]; got shape {array.shape}. "
            "For sequence batches [B, L] reduce over time first (e.g. 0.9 * max + 0.1 * mean over the mask)."
        )
    return array.astype(dtype, copy=False)


class PriorityFeedback:
    """The hook a prioritized batch carries: feeds ``|td_errors|`` back to the buffer that sampled it.

    Holds numpy copies of the batch's slots and generation stamps, so it needs
    no device-to-host copy of the batch's ``indices`` and survives
    ``TorchBatch.to(device)``. Subsetting a batch with ``rows`` selects the
    same rows here.
    """

    __slots__ = ("buffer", "generations", "indices")

    def __init__(self, buffer: PrioritizedReplayBuffer, indices: np.ndarray, generations: np.ndarray) -> None:
        self.buffer = buffer
        self.indices = indices
        self.generations = generations

    def __call__(self, td_errors: Any) -> int:
        """Write ``|td_errors|`` (float [B]) as the new priorities; returns the number of stale rows ignored."""
        td = to_numpy_1d(td_errors, "td_errors", np.float64)
        return self.buffer.update_priorities(self.indices, np.abs(td), self.generations)

    def select(self, index: Any) -> PriorityFeedback:
        """The feedback of the rows ``index`` (slice, bool mask or int indices; numpy or torch)."""
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        return PriorityFeedback(self.buffer, self.indices[index], self.generations[index])


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay; same stage and standalone behaviour as :class:`ReplayBuffer`.

    Args:
        upstream, capacity, warmup, transitions_per_yield, seed: as for
            :class:`~ptl_rl.buffers.ReplayBuffer`.
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
        storage: Callable[[int], Any] | None = None,
    ) -> None:
        super().__init__(
            upstream, capacity, warmup=warmup, transitions_per_yield=transitions_per_yield, seed=seed, storage=storage
        )
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
        if not (np.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be > 0 (it keeps every transition reachable), got {eps}")
        if beta_clock not in BETA_CLOCKS:
            raise ValueError(f"beta_clock must be one of {BETA_CLOCKS}, got {beta_clock!r}")
        if not callable(beta) and not 0 <= beta:
            raise ValueError(f"beta must be >= 0 (usually annealed from ~0.4 to 1), got {beta}")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.beta_schedule: Schedule = beta if callable(beta) else (lambda _step, b=float(beta): b)
        self.beta_clock = beta_clock
        self.stratified = bool(stratified)
        self.tree = SumTree(self.capacity)
        self.generations = np.full(self.capacity, -1, dtype=np.int64)
        self.batches_sampled = 0
        self.stale_updates = 0  # priority updates ignored because their slot was overwritten since sampling
        self.applied_updates = 0

    # ------------------------------------------------------------------ buffer
    @property
    def beta(self) -> float:
        """The importance-sampling exponent now (the schedule at the current clock)."""
        step = self.batches_sampled if self.beta_clock == "learner" else self.storage.total_added
        return float(self.beta_schedule(step))

    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` transitions of ``batch`` at the current maximum priority; returns their slots (int64 [B])."""
        _check_reserved(batch)
        old_size = self.storage.size
        # through ReplayBuffer.add, which redoes a write an interrupt cut short; an interrupt after it leaves
        # whole rows with their slot's previous priority and generation: sampled with a stale weight, never wrong
        slots = super().add(batch)
        if len(slots) == 0:
            return slots
        self._stamp(slots)
        self.tree.update(slots, self._max_priority_kept(slots, old_size))
        return slots

    def _stamp(self, slots: np.ndarray) -> None:
        """Give the freshly written ``slots`` their generation: the running index of the write."""
        self.generations[slots] = np.arange(self.storage.total_added - len(slots), self.storage.total_added)

    def _max_priority_kept(self, slots: np.ndarray, old_size: int) -> float:
        """Largest leaf among the slots that held data before and were not just overwritten (else 1)."""
        count, start = len(slots), int(slots[0])
        if old_size + count <= self.capacity:  # nothing overwritten: all of [0, old_size) stays
            best = self.tree.range_max(0, old_size)
        elif count >= self.capacity:
            best = 0.0
        else:  # full ring: the kept slots run from the end of the written range around to its start
            stop = start + count
            best = max(self.tree.range_max(stop, self.capacity), self.tree.range_max(stop - self.capacity, start))
        return best if best > 0.0 else 1.0

    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` transitions drawn with probability ``P(i)``, with ``indices``, ``generations``, ``weights``.

        Stored fields come as numpy arrays ``[batch_size, ...]``; ``weights``
        float32 [B] (batch-max normalised, see the module docstring).
        """
        self._finish_interrupted_add()
        self._check_batch_size(batch_size)
        indices, weights = self._draw(batch_size)
        batch = self.storage.gather(indices)
        return self._finish(batch, indices, weights)

    def epoch(self, batch_size: int) -> Iterator[TransitionBatch]:
        """Not available: a pass without replacement ignores priorities; use a :class:`ReplayBuffer`."""
        raise TypeError(
            f"{type(self).__name__} samples with replacement by priority; for shuffled passes over a fixed "
            "buffer use ReplayBuffer(replacement=False) or ReplayBuffer.epoch()"
        )

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots drawn with probability proportional to their leaves, and their weights (float32 [B])."""
        beta = self.beta
        self.batches_sampled += 1
        indices, leaves = self.tree.sample(self.rng.random(batch_size), self.stratified)
        if hasattr(self.storage, "sampleable"):  # e.g. a FrameStorage: some slots still wait for their next_obs
            draw = lambda count: self.tree.sample(self.rng.random(count), False)  # noqa: E731
            indices, leaves = redraw_unsampleable(self._sampleable, (indices, leaves), draw)
        # (N P_i)^-beta / max_j (N P_j)^-beta == (min_j leaf_j / leaf_i)^beta: N and the total cancel
        weights = np.power(leaves.min() / leaves, beta, dtype=np.float32)
        return indices, weights

    def _sampleable(self, indices: np.ndarray) -> np.ndarray:
        """Which drawn slots the storage can sample now (bool [B])."""
        return self.storage.sampleable(indices)

    def _finish(self, batch: TransitionBatch, indices: np.ndarray, weights: np.ndarray | None) -> TransitionBatch:
        generations = self.generations.take(indices)
        batch["indices"] = indices
        batch["generations"] = generations
        if weights is not None:
            batch["weights"] = weights
            batch.attach_priority_feedback(PriorityFeedback(self, indices, generations))
        return batch

    # ------------------------------------------------------------------ priorities
    def update_priorities(self, indices: Any, priorities: Any, generations: Any = None) -> int:
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

        Numpy arrays or torch tensors on any device. On invalid input a
        ``ValueError`` says what is wrong and nothing is changed.
        """
        idx = to_numpy_1d(indices, "indices", np.int64)
        values = self._validated_priorities(idx, to_numpy_1d(priorities, "priorities", np.float64))
        self._check_slots(idx)
        fresh = None
        if generations is not None:
            gens = to_numpy_1d(generations, "generations", np.int64)
            if gens.shape != idx.shape:
                raise ValueError(f"got {len(gens)} generations for {len(idx)} indices; pass the batch's generations")
            fresh = self.generations.take(idx) == gens
        self._check_targets(idx if fresh is None else idx[fresh])
        if fresh is not None and not fresh.all():
            stale = int(len(idx) - np.count_nonzero(fresh))
            self.stale_updates += stale
            idx, values = idx[fresh], values[fresh]
        else:
            stale = 0
        self.tree.update(idx, values)
        self.applied_updates += len(idx)
        return stale

    def _validated_priorities(self, idx: np.ndarray, priorities: np.ndarray) -> np.ndarray:
        """``(priorities + eps) ** alpha`` after checking length and values; raises before any change."""
        if priorities.shape != idx.shape:
            raise ValueError(
                f"got {len(priorities)} priorities (td_errors) for a batch of {len(idx)} rows; pass one per sampled "
                "row, in the batch's order (reduce per-step errors of sequences to one value per row). "
                "The priorities are unchanged."
            )
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

    def _check_slots(self, idx: np.ndarray) -> None:
        """Every slot must hold data (raises before any change)."""
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self.storage)):
            raise ValueError(
                f"indices must be slots in [0, {len(self.storage)}) holding data; got {idx.min()}..{idx.max()}. "
                "Pass the indices of a batch sampled from this buffer. The priorities are unchanged."
            )

    def _check_targets(self, idx: np.ndarray) -> None:
        """Hook for subclasses: further checks of the (non-stale) slots about to be updated."""

    def priorities(self, indices: Any | None = None) -> np.ndarray:
        """Stored leaf values ``(priority + eps) ** alpha`` (float64), of ``indices`` or of every stored slot."""
        if indices is None:
            return self.tree.leaves[: len(self.storage)].copy()
        return self.tree.get(to_numpy_1d(indices, "indices", np.int64))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Replay contents, leaf priorities, generation stamps, counters and RNG (``weights_only``-safe)."""
        size = len(self.storage)
        state = super().state_dict()
        state.update(
            alpha=self.alpha,
            priorities=torch.from_numpy(self.tree.leaves[:size].copy()),
            generations=torch.from_numpy(self.generations[:size].copy()),
            batches_sampled=self.batches_sampled,
            stale_updates=self.stale_updates,
            applied_updates=self.applied_updates,
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if float(state["alpha"]) != self.alpha:
            raise ValueError(
                f"the state was saved with alpha={state['alpha']}, this buffer has alpha={self.alpha}; stored "
                "priorities are raised to alpha, so create the buffer with the checkpoint's alpha"
            )
        super().load_state_dict(state)
        self.tree.set_all(state["priorities"].numpy())
        self.generations[:] = -1
        self.generations[: len(self.storage)] = state["generations"].numpy()
        self.batches_sampled = int(state["batches_sampled"])
        self.stale_updates = int(state["stale_updates"])
        self.applied_updates = int(state["applied_updates"])

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


def _check_reserved(batch: TransitionBatch) -> None:
    clash = [name for name in SAMPLE_FIELDS if name in batch]
    if clash:
        raise ValueError(
            f"field(s) {clash} are added to sampled batches by this buffer and cannot be stored; rename the agent "
            "extra(s)"
        )

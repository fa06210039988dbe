"""Replay buffers whose sampled batches name their slots: the base of the prioritized and sequence buffers.

A sampled batch carries ``indices`` (int64 [B], the slots drawn) and
``generations`` (int64 [B], the slots' write stamps), and with priorities
``weights`` (float32 [B]) and the link ``batch.update_priorities(td_errors)``
that writes ``|td_errors|`` back. A slot overwritten since it was sampled has
a new stamp: its update is ignored and counted in ``stale_updates``. Which
slots are drawn, and how, is the business of a draw strategy
(:mod:`ptl_rl.replay.draws`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias, cast

import numpy as np
import torch

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.protocols import PartlySampleableStorage, Storage
from ptl_rl.replay.buffer import ReplayBuffer
from ptl_rl.replay.draws import PriorityDraws, Schedule, SlotDraws
from ptl_rl.replay.sumtree import SumTree

# Fields the prioritized and sequence buffers add to sampled batches; stored data may not use them.
SAMPLE_FIELDS = ("indices", "generations", "weights", "mask")

#: A 1-D array of numbers as a caller holds it: numpy, a torch tensor on any device, or a list.
Numbers: TypeAlias = np.ndarray | torch.Tensor | Sequence[float]


def check_reserved_fields(batch: TransitionBatch) -> None:
    """Refuse a batch that stores a field these buffers add to sampled batches (``indices``, ...)."""
    clash = [name for name in SAMPLE_FIELDS if name in batch]
    if clash:
        raise ValueError(
            f"field(s) {clash} are added to sampled batches by this buffer and cannot be stored; rename the agent "
            "extra(s)"
        )


def to_numpy_1d(values: Numbers, name: str, dtype: type) -> np.ndarray:
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

    def __init__(self, buffer: IndexedReplayBuffer, indices: np.ndarray, generations: np.ndarray) -> None:
        self.buffer = buffer
        self.indices = indices
        self.generations = generations

    def __call__(self, td_errors: Numbers) -> int:
        """Write ``|td_errors|`` (float [B]) as the new priorities; returns the number of stale rows ignored."""
        td = to_numpy_1d(td_errors, "td_errors", np.float64)
        return self.buffer.update_priorities(self.indices, np.abs(td), self.generations)

    def select(self, index: np.ndarray | torch.Tensor | slice) -> PriorityFeedback:
        """The feedback of the rows ``index`` (slice, bool mask or int indices; numpy or torch)."""
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        return PriorityFeedback(self.buffer, self.indices[index], self.generations[index])


class IndexedReplayBuffer(ReplayBuffer):
    """A :class:`~ptl_rl.replay.ReplayBuffer` that draws through a strategy and names the slots it drew.

    With ``prioritized=True`` the strategy is a
    :class:`~ptl_rl.replay.draws.PriorityDraws` (``alpha``, ``beta``,
    ``beta_clock``, ``eps`` apply), else a :class:`~ptl_rl.replay.draws.SlotDraws`
    (uniform over the drawable slots). Subclasses decide which slots are
    drawable: every stored one (:class:`~ptl_rl.replay.PrioritizedReplayBuffer`)
    or the window starts (:class:`~ptl_rl.replay.SequenceReplayBuffer`).
    """

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None,
        capacity: int,
        *,
        prioritized: bool,
        alpha: float,
        beta: float | Schedule,
        beta_clock: str,
        eps: float,
        stratified: bool,
        warmup: int | None,
        transitions_per_yield: int,
        seed: int | None,
        storage: Callable[[int], Storage] | None,
    ) -> None:
        super().__init__(
            upstream, capacity, warmup=warmup, transitions_per_yield=transitions_per_yield, seed=seed, storage=storage
        )
        self.draws: SlotDraws
        if prioritized:
            self.draws = PriorityDraws(
                self.capacity,
                alpha=alpha,
                beta=beta,
                beta_clock=beta_clock,
                eps=eps,
                stratified=stratified,
                env_clock=self._transitions_added,
            )
        else:
            self.draws = SlotDraws(self.capacity, stratified)
        self.generations = np.full(self.capacity, -1, dtype=np.int64)  # write stamp of each slot

    def _transitions_added(self) -> int:
        return self.storage.total_added

    # ------------------------------------------------------------------ the strategy's state
    @property
    def prioritized(self) -> bool:
        """Whether draws follow priorities (with importance weights and priority feedback)."""
        return self.draws.prioritized

    @property
    def tree(self) -> SumTree:
        """The sum-tree of draw weights (:class:`~ptl_rl.replay.SumTree`): 0 for a slot never drawn."""
        return self.draws.tree

    @property
    def batches_sampled(self) -> int:
        """Number of batches drawn so far (the ``"learner"`` clock of ``beta``)."""
        return self.draws.batches_sampled

    @property
    def alpha(self) -> float:
        """Priority exponent (prioritized only)."""
        return self._priority_draws().alpha

    @property
    def beta(self) -> float:
        """The importance-sampling exponent now (prioritized only)."""
        return self._priority_draws().beta

    @property
    def eps(self) -> float:
        """Added to every priority before ``** alpha`` (prioritized only)."""
        return self._priority_draws().eps

    @property
    def stratified(self) -> bool:
        """Whether a batch draws one target per equal segment of the total weight."""
        return self.draws.stratified

    @property
    def stale_updates(self) -> int:
        """Priority updates ignored because their slot was overwritten since sampling."""
        return self._priority_draws().stale_updates

    @property
    def applied_updates(self) -> int:
        """Priority updates written."""
        return self._priority_draws().applied_updates

    def _priority_draws(self) -> PriorityDraws:
        if not isinstance(self.draws, PriorityDraws):
            raise TypeError(f"this {type(self).__name__} samples uniformly; create it with prioritized=True")
        return self.draws

    def _stamp(self, slots: np.ndarray) -> None:
        """Give the freshly written ``slots`` their generation: the running index of the write."""
        self.generations[slots] = np.arange(self.storage.total_added - len(slots), self.storage.total_added)

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Slots drawn by the strategy, redrawn where the storage cannot serve them yet, and their weights."""
        sampleable = self._sampleable if self._partly_sampleable else None
        return self.draws.draw(self.rng, batch_size, sampleable)

    def _sampleable(self, indices: np.ndarray) -> np.ndarray:
        """Which drawn slots the storage can sample now (bool [B])."""
        # called only when the storage is a PartlySampleableStorage (see _partly_sampleable)
        return cast(PartlySampleableStorage, self.storage).sampleable(indices)

    def _finish(self, batch: TransitionBatch, indices: np.ndarray, weights: np.ndarray | None) -> TransitionBatch:
        generations = self.generations.take(indices)
        batch["indices"] = indices
        batch["generations"] = generations
        if weights is not None:
            batch["weights"] = weights
            batch.attach_priority_feedback(PriorityFeedback(self, indices, generations))
        return batch

    def epoch(self, batch_size: int) -> Iterator[TransitionBatch]:
        """Not available: a pass without replacement ignores priorities; use a :class:`ReplayBuffer`."""
        raise TypeError(
            f"{type(self).__name__} samples with replacement by priority; for shuffled passes over a fixed "
            "buffer use ReplayBuffer(replacement=False) or ReplayBuffer.epoch()"
        )

    # ------------------------------------------------------------------ priorities
    def update_priorities(self, indices: Numbers, priorities: Numbers, generations: Numbers | None = None) -> int:
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
        draws = self._priority_draws()  # a TypeError for a buffer that samples uniformly
        values = to_numpy_1d(priorities, "priorities", np.float64)
        if values.shape != idx.shape:
            raise ValueError(
                f"got {len(values)} priorities (td_errors) for a batch of {len(idx)} rows; pass one per sampled "
                "row, in the batch's order (reduce per-step errors of sequences to one value per row). "
                "The priorities are unchanged."
            )
        values = draws.weights_of(values)
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
            draws.stale_updates += stale
            idx, values = idx[fresh], values[fresh]
        else:
            stale = 0
        self.tree.update(idx, values)
        draws.applied_updates += len(idx)
        return stale

    def _check_slots(self, idx: np.ndarray) -> None:
        """Every slot must hold data (raises before any change)."""
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self.storage)):
            raise ValueError(
                f"indices must be slots in [0, {len(self.storage)}) holding data; got {idx.min()}..{idx.max()}. "
                "Pass the indices of a batch sampled from this buffer. The priorities are unchanged."
            )

    def _check_targets(self, idx: np.ndarray) -> None:
        """Further checks of the (non-stale) slots about to be updated (a subclass's hook)."""

    def priorities(self, indices: Numbers | None = None) -> np.ndarray:
        """Stored leaf values ``(priority + eps) ** alpha`` (float64), of ``indices`` or of every stored slot."""
        if indices is None:
            return self.tree.leaves[: len(self.storage)].copy()
        return self.tree.get(to_numpy_1d(indices, "indices", np.int64))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Replay contents, draw weights, generation stamps, counters and RNG (``weights_only``-safe)."""
        self.settle()
        size = len(self.storage)
        state = super().state_dict()
        state.update(self.draws.state_dict(size), generations=torch.from_numpy(self.generations[:size].copy()))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.draws.check_state(state)  # before anything changes
        super().load_state_dict(state)
        self.draws.load_state_dict(state)
        self.generations[:] = -1
        self.generations[: len(self.storage)] = state["generations"].numpy()

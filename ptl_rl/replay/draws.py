"""How a replay buffer draws its rows: uniformly (the default), and the weighted slots the other strategies share.

* :class:`UniformDraws`: every stored row equally likely, with replacement
  (``rng.integers``, or one row per equal segment with ``stratified``) or
  in shuffled passes (``replacement=False``). The default of a
  :class:`~ptl_rl.replay.ReplayBuffer`; its batches are the stored fields only.
* :class:`WeightedSlots`: draws among the slots in proportion to a weight per
  slot kept in a sum-tree (0: never drawn), and names the slots it drew in
  the batch (``indices``, ``generations``, with priorities ``weights`` and the
  feedback link). :class:`~ptl_rl.replay.PrioritizedDraws` weighs a slot by
  its priority. A strategy that draws something other than stored rows
  (:class:`~ptl_rl.replay.SequenceWindows`: window starts,
  :class:`~ptl_rl.replay.HindsightGoals`: steps of complete episodes) holds a
  ``WeightedSlots`` (a ``UniformDraws`` or a ``PrioritizedDraws``), binds it
  with :meth:`WeightedSlots.bind_weights` and sets the weights of the slots
  it makes drawable; the ``WeightedSlots`` only keeps the weights and the
  write stamps, draws, and (prioritized) turns priorities into weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch

from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.core.protocols import PartlySampleableStorage, Storage
from ptl_rl.core.protocols.draws import Advance, PriorityDrawStrategy
from ptl_rl.replay.feedback import PriorityFeedback
from ptl_rl.replay.shuffle import ShuffledPasses
from ptl_rl.replay.sumtree import SumTree


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


def check_batch_fits(batch_size: int, storage: Storage) -> None:
    """Refuse a batch of rows larger than the rows stored (naming the fix)."""
    if batch_size > len(storage):
        raise ValueError(
            f"cannot sample a batch of {batch_size} from a buffer holding {len(storage)} transitions "
            f"(capacity {storage.capacity}); set warmup >= {batch_size} so sampling starts later, or lower batch_size"
        )


class WeightedSlots:
    """Draws slots in proportion to a weight per slot (0: never drawn), and keeps the slots' write stamps.

    Bound to one buffer's storage (:meth:`bind_weights`, by itself or by the
    strategy that holds it): a sum-tree of the weights (``tree``, float64
    [capacity]) and the write stamp of each slot (``generations``, int64
    [capacity], -1 for a slot never written). Every drawable slot weighs 1
    here; :class:`~ptl_rl.replay.PrioritizedDraws` weighs it by its priority.

    Args:
        stratified: draw one target from each of ``B`` equal segments of the
            total weight (lower variance) instead of ``B`` independent targets.
            Either way each slot's probability is its share of the total weight.
    """

    tree: SumTree
    generations: np.ndarray

    def __init__(self, stratified: bool) -> None:
        self.stratified = bool(stratified)
        self.batches_sampled = 0  # batches drawn (the "learner" clock of a prioritized beta)
        self._bound = False

    def _claim(self, storage: Storage) -> None:
        """Take ``storage`` as the one this strategy draws from (a strategy keeps per-slot state of one buffer)."""
        if self._bound:
            raise ValueError(
                f"this {type(self).__name__} already draws for another buffer: a draw strategy keeps the state of "
                "one buffer's slots, so create one per buffer"
            )
        self._bound = True
        self._storage = storage

    def bind_weights(self, storage: Storage) -> None:
        """Draw among the slots of ``storage``, by weights that its holder (or :meth:`added`) sets in ``tree``."""
        self._claim(storage)
        self.tree = SumTree(storage.capacity)
        self.generations = np.full(storage.capacity, -1, dtype=np.int64)

    def stamp(self, slots: np.ndarray) -> None:
        """Give the freshly written ``slots`` (int [B], the last add's) their generation: the write's running index."""
        total = self._storage.total_added
        self.generations[slots] = np.arange(total - len(slots), total)

    def weight_for_new(self, slots: np.ndarray, old_size: int) -> float:
        """Weight of slots that become drawable now (``slots`` int [B] were just written over ``old_size`` stored)."""
        return 1.0

    def draw_slots(
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

    def finish(
        self, batch: TransitionBatch, slots: np.ndarray, weights: np.ndarray | None, target: PriorityDrawStrategy
    ) -> TransitionBatch:
        """``batch`` drawn at ``slots`` (int64 [B]) with ``indices``, ``generations`` (and ``weights``) added.

        With ``weights`` (float32 [B]) the batch also gets the feedback link, which
        sends priorities to ``target.update_priorities`` (the strategy that drew it).
        """
        generations = self.generations.take(slots)
        batch["indices"] = slots
        batch["generations"] = generations
        if weights is not None:
            batch["weights"] = weights
            batch.attach_priority_feedback(PriorityFeedback(target, slots, generations))
        return batch

    def update_priorities(
        self, indices: Numbers, priorities: Numbers, generations: Numbers | None = None, *, drawable: str | None = None
    ) -> int:
        """Not available: uniform draws have no priorities (see :class:`~ptl_rl.replay.PrioritizedDraws`)."""
        raise TypeError(
            f"this buffer draws uniformly ({type(self).__name__}): it has no priorities to update; create it with "
            "prioritized=True, or with draws=ptl_rl.PrioritizedDraws(...)"
        )

    # ------------------------------------------------------------------ state
    def weights_state_dict(self, size: int) -> dict[str, Any]:
        """The weights and stamps of the first ``size`` slots and the draw counter (``weights_only``-safe)."""
        return {
            "priorities": torch.from_numpy(self.tree.leaves[:size].copy()),
            "generations": torch.from_numpy(self.generations[:size].copy()),
            "batches_sampled": self.batches_sampled,
        }

    def check_weights_state(self, state: Mapping[str, Any]) -> None:
        """Raise if ``state`` cannot be loaded (a hook, called before anything changes; nothing to check here)."""

    def load_weights_state(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`weights_state_dict`'s entries (the stamps in place: holders keep a reference)."""
        self.check_weights_state(state)
        self.tree.set_all(state["priorities"].numpy())
        generations = state["generations"].numpy()
        self.generations[:] = -1
        self.generations[: len(generations)] = generations
        self.batches_sampled = int(state["batches_sampled"])


class UniformDraws(WeightedSlots):
    """Every stored row equally likely: the draws of a plain :class:`~ptl_rl.replay.ReplayBuffer` (its default).

    A batch is the stored fields of the rows drawn, ``[B, ...]``, nothing more.

    Args:
        stratified: draw one row from each of ``B`` equal segments of the
            stored rows instead of ``B`` independent rows (each row is still
            equally likely). Off by default, which draws ``rng.integers``.
            Held by a :class:`~ptl_rl.replay.SequenceWindows` or
            :class:`~ptl_rl.replay.HindsightGoals`, it applies to the sum-tree
            of the slots they make drawable.
        replacement: ``True`` (default) draws every batch with replacement;
            ``False`` samples without replacement: shuffled passes in which
            every stored transition comes exactly once (the last batch of a
            pass holds the remainder and may be smaller), for epoch-style
            training on a fixed buffer. A buffer's ``epoch()`` makes such a
            pass either way.

    Examples:
        >>> import numpy as np
        >>> import ptl_rl
        >>> rows = ptl_rl.TransitionBatch(obs=np.arange(6.0)[:, None], action=np.arange(6))
        >>> buffer = ptl_rl.ReplayBuffer(capacity=6, draws=ptl_rl.UniformDraws(replacement=False), seed=0)
        >>> _ = buffer.add(rows)
        >>> sorted(np.concatenate([buffer.sample(4).action, buffer.sample(4).action]).tolist())  # a pass: once each
        [0, 1, 2, 3, 4, 5]
    """

    def __init__(self, *, stratified: bool = False, replacement: bool = True) -> None:
        super().__init__(stratified)
        self.replacement = bool(replacement)
        self.passes = ShuffledPasses()  # the order of sampling without replacement (and of epoch())

    def bind(self, storage: Storage, upstream: Iterator[TransitionBatch] | None) -> None:
        """Draw among the rows of ``storage`` (every stored row is drawable: no sum-tree)."""
        self._claim(storage)
        self._partly_sampleable = isinstance(storage, PartlySampleableStorage)

    def bind_weights(self, storage: Storage) -> None:
        if not self.replacement:
            raise ValueError(
                "windows and hindsight goals are drawn with replacement; pass UniformDraws() (replacement=True)"
            )
        super().bind_weights(storage)

    def check(self, batch: TransitionBatch) -> None:
        """Any batch the storage takes will do."""

    def added(self, slots: np.ndarray, old_size: int, batch: TransitionBatch, advance: Advance) -> None:
        """Nothing to keep per row: a stored row is drawable."""

    def ready(self) -> bool:
        return True  # any stored row can be drawn: the warm-up alone decides when enough are

    def sample(self, rng: np.random.Generator, batch_size: int) -> TransitionBatch:
        """``batch_size`` stored rows, uniformly (or the next of a pass without replacement), ``[B, ...]``."""
        storage = self._storage
        check_batch_fits(batch_size, storage)
        size = len(storage)
        if not self.replacement:
            return storage.gather(self._only_sampleable(self.passes.next(batch_size, size, rng)))
        if self.stratified:  # one row in each of B equal segments of [0, size)
            indices = np.minimum(((np.arange(batch_size) + rng.random(batch_size)) * (size / batch_size)), size - 1)
            indices = indices.astype(np.int64)
        else:
            indices = rng.integers(0, size, batch_size)
        if self._partly_sampleable:
            draw = lambda count: (rng.integers(0, size, count),)  # noqa: E731
            (indices,) = redraw_unsampleable(cast(PartlySampleableStorage, storage).sampleable, (indices,), draw)
        return storage.gather(indices)

    def epoch(self, rng: np.random.Generator, batch_size: int) -> Iterator[TransitionBatch]:
        """One fresh shuffled pass: every stored row exactly once, in batches of ``batch_size`` (the last smaller)."""
        storage = self._storage
        check_batch_fits(1, storage)  # the buffer holds something
        self.passes.start(len(storage), rng)
        while self.passes.remaining:
            yield storage.gather(self._only_sampleable(self.passes.next(batch_size, len(storage), rng)))

    def _only_sampleable(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` without the slots the storage cannot sample yet (all of them for an ArrayStorage)."""
        if not self._partly_sampleable:
            return indices
        sampleable: np.ndarray = indices[cast(PartlySampleableStorage, self._storage).sampleable(indices)]
        return sampleable

    def snapshot(self) -> object:
        return None  # an add changes nothing here

    def restore(self, snapshot: Any) -> None:
        """Nothing to put back."""

    def counters(self) -> dict[str, object]:
        shown: dict[str, object] = {} if self.replacement else {"replacement": False}
        if self.stratified:
            shown["stratified"] = True
        return shown

    def state_dict(self) -> dict[str, Any]:
        """The pass under way, when sampling without replacement (a with-replacement draw keeps nothing)."""
        return {} if self.replacement else {"passes": self.passes.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "passes" in state:
            self.passes.load_state_dict(state["passes"])

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value}" for key, value in self.counters().items())
        return f"UniformDraws({options})"

"""What a replay buffer calls on the strategy that draws its batches, and the capabilities a strategy may have.

A :class:`~ptl_rl.replay.ReplayBuffer` is a storage (where rows live,
:class:`~ptl_rl.core.protocols.Storage`) and a draw strategy (which rows, or
windows of rows, a batch holds, and what the batch carries besides them).
The buffer owns the stage schedule, the guard's journal and the RNG; the
strategy owns whatever it keeps per slot (weights, write stamps, episode
links). ptl_rl's strategies are :class:`~ptl_rl.replay.UniformDraws`,
:class:`~ptl_rl.replay.PrioritizedDraws`, :class:`~ptl_rl.replay.SequenceWindows`
and :class:`~ptl_rl.replay.HindsightGoals`; pass one as
``ReplayBuffer(..., draws=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import numpy as np

from ptl_rl.core.protocols.storages import Storage

if TYPE_CHECKING:
    from ptl_rl.core.batch import Numbers, TransitionBatch

#: ``advance(redo)``: the guard's :meth:`~ptl_rl.core.guard.WriteJournal.advance` of the write under way: from
#: now on a cut of it is finished by ``redo()`` (idempotent) instead of a rewrite from the saved state
Advance: TypeAlias = Callable[[Callable[[], None]], None]


@runtime_checkable
class DrawStrategy(Protocol):
    """How a replay buffer draws its batches: what it keeps per slot, and what a sample is.

    The buffer calls, in this order of a buffer's life:

    * ``bind(storage, upstream)`` once, when the buffer is built: the storage
      whose slots it draws (its ``capacity``, its counters) and the stage that
      feeds the buffer (``None`` for a buffer filled by hand). A strategy
      serves one buffer; binding it twice raises ``ValueError``.
    * ``check(batch)`` before an add writes anything: raise ``ValueError`` to
      refuse the batch (a field the strategy needs is missing, or one it adds
      to samples is stored).
    * ``added(slots, old_size, batch, advance)`` inside the add's write of
      the guard, after the storage wrote ``batch`` at ``slots`` (int64 [B],
      B >= 1) over ``old_size`` stored rows. A cut anywhere in it is redone:
      :meth:`restore` puts back :meth:`snapshot` (taken before the add, with
      the storage's) and the whole add runs again into the same slots; a
      strategy that writes in two phases calls ``advance(redo)`` after its
      planning, so a later cut is finished by ``redo()`` instead.
    * ``ready()`` whether the strategy has what it needs to draw beyond
      stored rows (a complete window, a complete episode; always ``True`` for
      rows): a stage waits for it before its first yield, as for its warm-up.
      ``sample(rng, batch_size)`` the batch:
      the stored fields ``[B, ...]`` (or ``[B, T, ...]`` for windows) as
      numpy arrays, plus whatever the strategy adds (``indices``, ``weights``,
      ``mask``...). ``batch_size >= 1`` is checked by the buffer; the buffer
      finished any add a cut left before it calls.
    * ``counters()`` what the buffer's repr shows of it (``name=value``
      pairs, flat), ``state_dict()`` / ``load_state_dict()`` its part of
      the buffer's checkpoint (``weights_only``-safe: tensors and plain
      containers; loaded after the storage).
    """

    def bind(self, storage: Storage, upstream: Iterator[TransitionBatch] | None) -> None: ...

    def check(self, batch: TransitionBatch) -> None: ...

    def added(self, slots: np.ndarray, old_size: int, batch: TransitionBatch, advance: Advance) -> None: ...

    def ready(self) -> bool: ...

    def sample(self, rng: np.random.Generator, batch_size: int) -> TransitionBatch: ...

    def snapshot(self) -> object: ...

    def restore(self, snapshot: Any) -> None: ...

    def counters(self) -> dict[str, object]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class PriorityDrawStrategy(Protocol):
    """A strategy whose draws follow priorities that the learner feeds back.

    ``update_priorities(indices, priorities, generations)`` sets the
    priorities of the slots ``indices`` (int [B], a sampled batch's) from
    ``priorities`` (float [B], ``>= 0``); rows whose ``generations`` (int [B])
    no longer match their slot's write stamp were overwritten since the draw
    and are skipped; returns how many were. A batch's
    ``update_priorities(td_errors)`` and the buffer's ``update_priorities``
    come here.
    """

    def update_priorities(self, indices: Numbers, priorities: Numbers, generations: Numbers | None = None) -> int: ...


@runtime_checkable
class EpisodeDrawStrategy(Protocol):
    """A strategy that follows the episodes of each env across adds (sequence windows, hindsight goals).

    The buffer calls ``end_episodes(advance)`` as a write of the guard (see
    :class:`DrawStrategy`'s ``added``) where the stream was cut (a stream
    number skipped upstream, a step of its own cut short), after a
    ``load_state_dict``, and when the user calls the buffer's
    ``end_episodes()``: no step added later may continue an episode stored
    before. Such a strategy sees every row of an add: the buffer splits a
    batch longer than the capacity into adds of at most ``capacity`` rows.
    """

    def end_episodes(self, advance: Advance) -> None: ...


@runtime_checkable
class EpochDrawStrategy(Protocol):
    """A strategy that can make shuffled passes: every sampleable stored row exactly once.

    ``epoch(rng, batch_size)`` yields one fresh pass in batches of
    ``batch_size`` (the last one holds the remainder); the buffer's
    ``epoch()`` comes here.
    """

    def epoch(self, rng: np.random.Generator, batch_size: int) -> Iterator[TransitionBatch]: ...

"""What a replay buffer needs of the storage it keeps its transitions in, and the capabilities a storage may have."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from ptl_rl.core.batch import TransitionBatch

#: what a storage's snapshot is (its own choice: a tuple of counters and references)
SnapshotT = TypeVar("SnapshotT")


@runtime_checkable
class Storage(Protocol):
    """Where a replay buffer keeps its transitions: a ring of ``capacity`` slots.

    ``add`` writes the ``B`` rows of a batch into the next slots (the oldest
    are overwritten once full) and returns them (int64 [B]); ``gather``
    returns the rows of the given slots (int [R]) as a
    :class:`~ptl_rl.core.batch.TransitionBatch` [R, ...]. ``len()`` is the number
    of slots holding data, ``size`` the same, ``cursor`` the next slot to
    write and ``total_added`` the rows ever added. A storage must refuse a
    batch it cannot store (``ValueError``/``TypeError``) *before* writing
    anything. Its state is saved with the buffer's (:class:`Stateful`).

    Pass ``storage=lambda capacity: MyStorage(capacity)`` to a replay buffer.
    """

    capacity: int
    cursor: int
    size: int
    total_added: int

    def __len__(self) -> int: ...

    def add(self, batch: TransitionBatch) -> np.ndarray: ...

    def gather(self, indices: np.ndarray) -> TransitionBatch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class RollbackStorage(Protocol[SnapshotT]):
    """A storage whose ``add`` changes more than its counters (per-env bookkeeping): it takes its own snapshots.

    An interrupted ``add`` is redone in full by the buffer: it restores the
    snapshot taken before the add, then adds the batch again. Without these
    methods the buffer rolls back ``cursor``, ``size`` and ``total_added``,
    which suffices for a storage that rewrites whole rows. Generic in the snapshot's type: ``restore`` takes
    what ``snapshot`` returned.
    """

    def snapshot(self) -> SnapshotT: ...

    def restore(self, snapshot: SnapshotT) -> None: ...


@runtime_checkable
class JournaledStorage(Protocol[SnapshotT]):
    """A storage whose own ``add`` is a write of the guard (a FrameStorage): safe against cuts when called directly.

    An add cut short is done again by the storage's next ``add`` or by
    ``settle()`` (a no-op when none is open); a buffer calls ``settle()``
    before every read. Under a buffer the buffer's journal records the add as
    for any :class:`RollbackStorage`: ``snapshot()`` first finishes an add of
    the storage's own that a cut left, and ``restore()`` drops one, so the
    buffer's redo stores the batch once. The buffer's journal then calls
    ``write(batch)``: the add without the storage's own journal (returns the
    slots, int64 [B]; one journal per add is enough). Generic in the
    snapshot's type, as :class:`RollbackStorage`.
    """

    def settle(self) -> None: ...

    def write(self, batch: TransitionBatch) -> np.ndarray: ...

    def snapshot(self) -> SnapshotT: ...

    def restore(self, snapshot: SnapshotT) -> None: ...


@runtime_checkable
class PartlySampleableStorage(Protocol):
    """A storage some of whose slots cannot be sampled yet (a frame stack still incomplete).

    ``sampleable(slots)`` returns a bool array [R]: the buffers draw again
    where it is ``False``, and passes without replacement skip those slots.
    """

    def sampleable(self, indices: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class StreamBoundStorage(Protocol):
    """A storage that follows its buffer's upstream stream (which stage feeds it, and the number of each batch).

    The buffer calls ``bind_upstream(upstream)`` once when it is built and
    ``note_stream_seq(batch, seq)`` before adding each pulled batch, with the
    upstream's :class:`NumberedStream` number (or ``None``).
    """

    def bind_upstream(self, upstream: Iterator[TransitionBatch] | None) -> None: ...

    def note_stream_seq(self, batch: TransitionBatch, seq: int | None) -> None: ...


@runtime_checkable
class PartsStorage(Protocol):
    """A storage saved as its own metadata and named arrays (a FrameStorage), not as one array per field.

    ``saved_parts()`` returns ``(meta, arrays)``: plain counters and layout, and
    views of the arrays to save; ``load_parts(meta, arrays)`` fills the storage
    back from them. :func:`~ptl_rl.replay.persist.save_directory` writes them
    as ``.npy`` files with a manifest; any other storage is saved field by field.
    """

    def saved_parts(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]: ...

    def load_parts(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None: ...

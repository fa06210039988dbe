"""The record of an add under way, kept so that an add cut short by an interrupt can be finished later.

A buffer (``ReplayBuffer.add``) and a ``FrameStorage`` (for adds called on it directly) each own one record.
An add starts by rewriting it, in one statement, to name its batch; the add's end marks it done. A record
found not done when the next call comes means that add was cut short, by a ``KeyboardInterrupt`` or any
exception raised between two statements of the storage's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from ptl_rl.core.batch import TransitionBatch

#: the owner's snapshot type (a FrameStorage's bookkeeping tuple)
SnapshotT = TypeVar("SnapshotT")


@dataclass(slots=True, eq=False)
class UnfinishedAdd(Generic[SnapshotT]):
    """An add under way: what an interrupted add leaves behind, and what it takes to finish or roll it back.

    What an interrupted add leaves: the storage may hold part of the batch (some fields of some rows written,
    frames written to a pool), but nothing that the storage counts as stored is wrong: its counters and
    bookkeeping are those of before the add (the storage's ``snapshot`` / ``restore`` roll back what an add
    changed in place; a storage's atomic insert changes nothing it counts until it commits).

    How it is finished: the owner restores the storage to :attr:`snapshot` (taking one first when it is
    ``None``: the add was cut short before its snapshot, so nothing the storage counts changed) and adds
    :attr:`batches` again, in full, in order; the redo writes the same slots, so the result equals one
    uninterrupted add. A refused batch (``ValueError`` / ``TypeError``: an error in the data) is never
    redone: the owner restores the snapshot and marks the record done.

    One record per owner, reused: an add begins with ``record.batches, record.snapshot, record.done =
    (batch,), None, False`` (one statement, so an interrupt finds either the old record, done, or the new
    one, complete) instead of allocating a record per add. :attr:`done` is set by the owner once the batch
    is stored, or by an atomic insert (``FrameStorage.try_atomic_add``) in the same statement that commits
    the batch, so a record found done is complete even if its owner was interrupted right after the commit.

    Attributes:
        batches: the batches to store, oldest first (one for a buffer's add; a storage's own journal
            collects the batches of adds that found it not done).
        snapshot: the storage's bookkeeping before the first of them (its ``snapshot()``, or the counters of
            a plain ``ArrayStorage``), or ``None`` while none was taken.
        done: the batches are stored and committed (or refused): nothing to redo.
    """

    batches: tuple[TransitionBatch, ...] = ()
    snapshot: SnapshotT | None = None
    done: bool = True

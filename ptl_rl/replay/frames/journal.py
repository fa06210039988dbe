"""The interrupt journal of a FrameStorage: snapshot / restore of its bookkeeping, and adds that redo a cut one.

An add changes, in place, only small bookkeeping (the counters, the per-env state array, the stream
number, the retained batches), which :meth:`FrameJournal.snapshot` copies and :meth:`FrameJournal.restore`
puts back; frames and slot rows need no copy (see ``docs/design/pixel-replay.md``, "Interrupt safety").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.frames.compiled import CompiledInsert
from ptl_rl.replay.frames.env_state import EnvState


class FrameJournal(CompiledInsert):
    """Adds of a FrameStorage that survive interrupts (its sixth layer)."""

    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` rows of ``batch``; returns the slots written (int64 [B]).

        Interrupt-safe: every change to the small bookkeeping (counters, per-env
        state) can be rolled back with :meth:`snapshot` / :meth:`restore`, and
        frames are written only to pool positions already counted as written
        (see :meth:`_write_frames`), so an add cut short, rolled back and done
        again equals one uninterrupted add. A buffer does that itself (see
        ``ReplayBuffer.add``); for a caller that does not, the storage keeps the
        batch and its snapshot (its own :class:`~ptl_rl.replay.unfinished.UnfinishedAdd`,
        rewritten by each add in one statement), and its next ``add`` rolls back and redoes it.

        A refused batch (``ValueError``/``TypeError``: a wrong shape, dtype or
        field, a stack that does not match what the storage holds, see
        :meth:`_checked`) leaves the storage as it was: every check runs before
        the first write, and the batch is not kept for a redo.
        """
        journal = self._journal
        if journal.done:
            journal.batches, journal.snapshot, journal.done = (batch,), None, False  # (one statement)
            if self._kernel is not False:  # (False: not compiled, or a layout the compiled insert does not cover)
                stored = self.try_atomic_add(batch, journal)  # (its commit marks the journal done)
                if stored is not None:
                    return stored
        else:  # an earlier add was cut short: it is redone first
            journal.batches += (batch,)
        if journal.snapshot is None:  # no earlier add was cut short after its snapshot: nothing counted changed
            journal.snapshot = self.snapshot()
        else:  # an earlier add was cut short: roll back to before it, then do it again
            self._restore_bookkeeping(journal.snapshot)
        try:
            for one in journal.batches:
                slots = self._add_chunks(one)
        except (TypeError, ValueError):
            # refused by its checks, before its first write: the storage holds the batches before it, complete
            journal.done = True
            raise
        journal.done = True
        return slots

    def settle(self) -> None:
        """Finish an add a cut left half done (redo it from the committed bookkeeping); a no-op when none is.

        A buffer calls it before every read (:class:`~ptl_rl.core.protocols.JournaledStorage`); the next
        :meth:`add` does it too.
        """
        journal = self._journal
        if journal.done:
            return
        if journal.snapshot is None:  # cut short before its snapshot: nothing counted changed
            journal.snapshot = self.snapshot()
        else:
            self._restore_bookkeeping(journal.snapshot)
        try:
            for one in journal.batches:
                self._add_chunks(one)
        except (TypeError, ValueError):  # refused by its checks, before its first write: an error, not a cut
            pass
        journal.done = True

    def snapshot(self) -> tuple[Any, ...]:
        """The bookkeeping an :meth:`add` changes, for :meth:`restore` to roll an interrupted add back.

        Counters and the per-env state (one small int64 array): no frame array
        is copied (checked mode's pending stacks are a ring whose head is in
        the per-env state, and an add writes only its free position). The
        slots and pool frames an interrupted add wrote need no copy: they
        were unsampleable while being written, and the add done again
        rewrites them.
        """
        fields = self._fields
        state = self._state.array.copy()
        return (fields.cursor, fields.size, fields.total_added, state, self._seen_seq, self._retained)

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Roll the bookkeeping back to ``snapshot`` (taken by :meth:`snapshot` before an add that was cut short).

        ``frames_written`` is not rolled back: pool positions an interrupted add
        may have overwritten stay counted as written, so no stored stack can
        refer to a frame that changed.
        """
        self._restore_bookkeeping(snapshot)
        self._journal.done = True

    def _restore_bookkeeping(self, snapshot: tuple[Any, ...]) -> None:
        cursor, size, total_added, state, seen_seq, self._retained = snapshot
        self._kernel = None  # (it holds the arrays replaced here)
        n = self.n_step or 1
        if state.shape[1] != EnvState.width(self.stack, n):
            # taken before the first add allocated (a placeholder for a stack of 1): nothing was stored then
            self._allocate_env_state(0)
        else:
            restored = EnvState(state.copy(), self.stack, n)
            self._pending = self._pending[: len(state)]  # (envs first seen by the rolled-back add are dropped)
            backup = self._pending_backup
            if backup is not None and backup[0] == total_added:  # pending stacks the rolled-back add overwrote
                self._pending[backup[1]] = backup[2]
            self._state, self._spare = restored, restored.spare()
        self._seen_seq = seen_seq
        fields = self._fields
        fields.cursor, fields.size, fields.total_added = cursor, size, total_added

"""The one safety mechanism: every step of a stage and every write of a storage is a transaction that a cut undoes.

A *cut* is anything that ends a call between two of its statements: a
``KeyboardInterrupt`` in a notebook cell, an exception from the env, the agent
or a check, a signal handler that raises. The rules of
``docs/design/robustness.md`` hold for every stage and storage because both
go through this module, and only this module counts statements:

* **A step** (:func:`run_step`, used by :class:`~ptl_rl.core.stage.Stage`) is
  opened before the stage's own code runs and closed when it returns. A step
  found open on entry was cut short: the stage is put back to its
  :meth:`~ptl_rl.core.stage.Stage.snapshot` taken when that step began, and
  the stream is marked *cut*, so the stage does not join steps across the
  rows that were lost, and its next output skips a stream number for the
  stages downstream. The stage's own code may change its state in any order,
  in as many statements as it likes.
* **A write** (:class:`WriteJournal`) records what it is about to write and
  the storage's counters before writing. A write found open is *redone*: the
  counters (the storage's ``snapshot``) are put back and the same rows written again, in full, before the
  storage is read or written again (a storage's ring may hold rows the cut
  write half overwrote: they cannot be rolled back, only rewritten).

Why a journal and not deferred signals: a journal is repaired on the next
call whatever ended the last one (an exception as well as a signal), costs a
few attribute writes, and works on any thread; blocking signals costs two
system calls per step and helps against signals only. The statement order
that makes the record itself consistent lives in the functions below and is
tested by cutting every line of this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ptl_rl.core.clock import SETTINGS, perf_counter_ns

T = TypeVar("T")


class Transactional(Protocol):
    """What :func:`run_step` needs of its owner: a record, and a snapshot / restore pair."""

    def snapshot(self) -> object: ...

    def restore(self, snapshot: Any) -> None: ...


class StepRecord:
    """The guard's record of one owner's steps: whether one is open, what it began from, the stream numbering.

    Attributes:
        open: a step began and has not returned: found set on entry, it was cut short.
        saved: the owner's snapshot taken when the open step began.
        cut: the stream was cut since the owner last acted on it (a cut step, a gap upstream, a restore);
            the owner reads and clears it with ``consume_cut``.
        skip: the next output follows a cut: its stream number skips one.
        stream_seq: the number of the owner's last output (grows by one, by two after a cut).
        upstream_seq: the upstream's number of the last batch pulled (``None``: none yet, or unnumbered).
    """

    __slots__ = ("cut", "open", "saved", "skip", "stream_seq", "upstream_seq")

    def __init__(self) -> None:
        self.open = False
        self.saved: object = None
        self.cut = False
        self.skip = False
        self.stream_seq = 0
        self.upstream_seq: int | None = None


def run_step(owner: Transactional, record: StepRecord, body: Callable[[], T]) -> T:
    """Run ``body`` (a step of ``owner``) as a transaction; returns what it returns.

    The order of the statements is the mechanism (each is one store, and a cut
    falls between two of them):

    1. an open record means the last step was cut: restore its snapshot. A cut
       inside the restore leaves the record open, so the restore runs again;
    2. take the new snapshot, *then* open the record: a cut between the two
       leaves a closed record and an untouched owner;
    3. run the body: a cut anywhere in it leaves the record open (an upstream that ends, ``StopIteration``,
       is no cut: the record is closed and what the body did stays);
    4. number the output, *then* close the record: a cut between the two
       finds the record open next time and restores, so the state of a step
       whose output never left is rolled back with it.
    """
    if record.open:
        owner.restore(record.saved)
        record.cut = record.skip = True
    record.saved = owner.snapshot()
    record.open = True
    try:
        out = body()
    except StopIteration:
        record.open = False  # the upstream ended: a normal end of the stream, not a cut; what the step did stays
        raise
    record.stream_seq += 2 if record.skip else 1
    record.skip = False
    record.open = False
    return out


def next_step(stage: Any) -> Any:
    """``next(stage)`` of a :class:`~ptl_rl.core.stage.Stage`: :func:`run_step` of its ``step``, timed and numbered.

    The same statement order as :func:`run_step`, written out once more because it runs for every batch of
    every stage: a function call fewer per step.
    """
    record = stage._guard_record
    if record is None:
        record = stage._new_guard_record()
    if record.open:
        stage.restore(record.saved)
        record.cut = record.skip = True
    record.saved = stage.snapshot()
    record.open = True
    try:
        if SETTINGS.profiling:
            start = perf_counter_ns()
            out = stage.step()
            stage.clock.add(perf_counter_ns() - start, stage.count(out))
        else:
            out = stage.step()
    except StopIteration:
        record.open = False  # the upstream ended: a normal end of the stream, not a cut; what the step did stays
        raise
    record.stream_seq += 2 if record.skip else 1
    record.skip = False
    record.open = False
    return out


def mark_cut(record: StepRecord) -> None:
    """The owner's stream is cut (a restore, a reset of its envs): nothing before may be joined with what follows."""
    record.cut = record.skip = True


def state_replaced(record: StepRecord) -> None:
    """The owner's state was replaced whole (``load_state_dict``): a step cut short before is not rolled back
    over it, and the stream is cut (what was in flight does not continue into what was loaded)."""
    record.open = False
    record.cut = record.skip = True


def note_upstream_seq(record: StepRecord, seq: int | None) -> None:
    """Record the upstream's number of a batch just pulled; a skipped number is a cut."""
    last = record.upstream_seq
    if seq is not None and last is not None and seq != last + 1:
        record.cut = record.skip = True
    record.upstream_seq = seq


def consume_cut(record: StepRecord) -> bool:
    """Whether the stream was cut since the last call (then cleared: each cut is acted on once)."""
    if not record.cut:
        return False
    record.cut = False
    return True


# ---------------------------------------------------------------------------- writes
_UNSAVED = object()  # a write whose save() has not returned


class WriteJournal:
    """Writes into a storage that a cut leaves half done are finished before the storage is used again.

    ``write(fn, batch)`` records ``(save(), fn, batch)`` and clears the record
    when ``fn(batch)`` returns. Before every later read or write the owner
    calls :meth:`settle`: an open record is *redone*: ``restore`` puts back what
    ``save`` took (counters, per-env bookkeeping: what a write changes besides
    whole rows) and the same rows are written again into the same slots, so the
    storage never shows a row mixing two batches' fields. A write in several
    phases (the rows, then an index over them) calls :meth:`advance` once the
    rows are written: from then on a cut is finished by the phase's own
    idempotent ``redo`` instead. A batch the write refuses (``ValueError`` /
    ``TypeError``: storages check before their first write) is forgotten, not
    redone.

    Args:
        save: what a write changes besides whole rows, taken before it (cheap: counters, small arrays).
        restore: puts ``save()``'s value back before a redo.
    """

    __slots__ = ("_args", "_fn", "_open", "_phase", "_restore", "_save", "_saved")

    def __init__(self, save: Callable[[], object], restore: Callable[[Any], None]) -> None:
        self._save, self._restore = save, restore
        self._open = False
        self._saved: object = None
        self._fn: Callable[..., Any] | None = None
        self._args: tuple[Any, ...] = ()
        self._phase: Callable[[], None] | None = None

    @property
    def open(self) -> bool:
        """A write began and did not return (the next :meth:`settle` finishes it)."""
        return self._open

    @property
    def saved(self) -> object:
        """What ``save()`` returned for the current (or last) write."""
        return self._saved

    def write(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` as a write that a cut leaves to be finished; a refused batch leaves nothing to redo.

        The order is the mechanism: the record is complete before it is opened, and closed last.
        """
        if self._open:
            self.settle()
        self._phase = None
        self._fn, self._args, self._saved = fn, args, _UNSAVED
        self._open = True  # before save(), which runs the storage's code: a cut inside it is a cut of the write
        self._saved = self._save()
        try:
            out = fn(*args)
        except (TypeError, ValueError):
            if self._phase is None:  # refused before the first write: an error in the data, not a cut
                self._forget()
            raise
        self._open = False
        return out

    def advance(self, redo: Callable[[], None]) -> None:
        """The rows are written: a cut from here on is finished by ``redo()`` (idempotent), not by a rewrite."""
        self._phase = redo

    def settle(self) -> None:
        """Finish the write a cut left open (a no-op when none is)."""
        if not self._open:
            return
        phase = self._phase
        if phase is not None:
            phase()
            self._open = False
            return
        fn = self._fn
        assert fn is not None  # set before the record was opened
        if self._saved is _UNSAVED:  # cut inside save(): nothing was written yet
            self._saved = self._save()
        self._restore(self._saved)
        try:
            fn(*self._args)
        except (TypeError, ValueError):
            # the cut fell before the storage's check, which refuses the batch now (before any write)
            self._forget()
            return
        self._open = False

    def forget(self) -> None:
        """Drop an open write without finishing it (a restore replaced what it was writing into)."""
        self._open = False

    def _forget(self) -> None:
        if self._saved is not _UNSAVED:
            self._restore(self._saved)
        self._open = False

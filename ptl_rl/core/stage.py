"""The base class of a pipeline stage: write ``step()``; iteration, stream numbers, timing and safety come with it.

A stage of your own::

    class ClipRewards(ptl_rl.Stage[ptl_rl.TransitionBatch]):
        def __init__(self, upstream, limit: float) -> None:
            super().__init__(upstream)
            self.limit = limit

        def step(self) -> ptl_rl.TransitionBatch:
            batch = self.pull()
            return ptl_rl.TransitionBatch({**batch, "reward": np.clip(batch.reward, -self.limit, self.limit)})

``next(stage)`` runs ``step()`` through :mod:`ptl_rl.core.guard`, so the
stage gets, without a line of its own:

* **interrupts and exceptions**: a ``next()`` cut short anywhere (a
  ``KeyboardInterrupt``, an env that raised) is rolled back to
  :meth:`Stage.snapshot` before the next step, and the stream is marked cut;
* **stream numbers**: every output is numbered (:attr:`Stage.stream_seq`),
  skipping a number after a cut, and a skipped number upstream (someone
  pulled from the upstream directly, a source reset its envs) is a cut too;
  a stage that joins steps across batches asks :meth:`Stage.consume_cut`;
* **timing**: :func:`ptl_rl.profile` reads :attr:`Stage.clock`.

What a stage must do: change its state only inside ``step()`` (or a method
run through :meth:`Stage.transaction`), pull with :meth:`Stage.pull`, and,
if it has state, say how to save and put it back. The default
:meth:`Stage.snapshot` is a deep copy of ``state_dict()`` (correct for any
stage that checkpoints its state, and cheap for small state); a stage whose
state is large or hot overrides :meth:`Stage.snapshot` and
:meth:`Stage.restore`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, cast

from ptl_rl.core import guard
from ptl_rl.core.clock import StageClock
from ptl_rl.core.protocols import NumberedStream, Stateful

T_co = TypeVar("T_co", covariant=True)
R = TypeVar("R")


class Stage(Generic[T_co]):
    """A pipeline stage yielding ``T_co``: subclass it and implement :meth:`step`.

    Args:
        upstream: the iterator this stage pulls from (``None`` for a source, or a stage used by hand).

    Attributes:
        upstream: the previous stage, walked by :func:`ptl_rl.pipeline_stages`.
        clock: this stage's time accounting (:func:`ptl_rl.profile`).
    """

    upstream: Iterator[Any] | None
    clock: StageClock

    def __init__(self, upstream: Iterator[Any] | None = None) -> None:
        self.upstream = upstream

    # ------------------------------------------------------------------ what a stage writes
    def step(self) -> T_co:
        """Compute the next output: pull with :meth:`pull`, change state freely, return what to yield."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(), the work of one next()")

    def snapshot(self) -> object:
        """What :meth:`restore` needs to put this stage back as it was before a step.

        Default: a deep copy of ``state_dict()`` for a stage that has one, else ``None`` (a stage without
        state). Override both methods for large or per-step-hot state (return references to state the
        step replaces rather than changes in place).
        """
        kind: type = type(self)  # (plain `type`: mypy checks type[Stage] against the cache's Hashable key)
        if _stateful(kind):
            return copy.deepcopy(cast(Stateful, self).state_dict())
        return None

    def restore(self, snapshot: object) -> None:
        """Put back what :meth:`snapshot` returned (called before the step after one that was cut short).

        ``snapshot`` is ``object``: whatever this stage's :meth:`snapshot` made (an override casts it to that).
        """
        if snapshot is not None:
            cast(Stateful, self).load_state_dict(cast(Mapping[str, Any], snapshot))

    def count(self, out: object) -> int:
        """Items of one output, for the clock: its rows (override for a stage that yields something else)."""
        try:
            return len(out)  # type: ignore[arg-type]  # an output without a length is one item (below)
        except TypeError:
            return 1

    # ------------------------------------------------------------------ what a stage calls
    def pull(self) -> Any:
        """The upstream's next output; a stream number it skipped marks this stage's stream cut."""
        upstream = self.upstream
        if upstream is None:
            raise TypeError(f"this {type(self).__name__} has no upstream to pull from")
        item = next(upstream)
        record = self._guard_record or self._new_guard_record()
        numbered = record.numbered_upstream
        if numbered is not None:
            # a Stage upstream: its record read directly, two property calls fewer per pull than stream_seq
            seq = numbered.stream_seq if numbered is not _OTHER_STREAM else cast(NumberedStream, upstream).stream_seq
            guard.note_upstream_seq(record, seq)
        return item

    def consume_cut(self) -> bool:
        """Whether the stream was cut since the last call: a step of this stage was cut short, a stream
        number upstream was skipped, or :meth:`mark_cut` was called. ``True`` once per cut."""
        record = self._guard_record or self._new_guard_record()
        return record.cut and guard.consume_cut(record)  # (no call while uncut: it runs for every batch)

    def mark_cut(self) -> None:
        """Declare the stream cut (a reset of every env): the next output skips a number."""
        guard.mark_cut(self._guard)

    def state_replaced(self) -> None:
        """Declare the state replaced whole (end of ``load_state_dict``): a step cut short before is not rolled
        back over it, and the stream is cut. :func:`ptl_rl.load_pipeline_state_dict` calls it for every stage."""
        guard.state_replaced(self._guard)

    def transaction(self, body: Callable[[], R]) -> R:
        """Run ``body`` (a public method's work outside ``next()``) under the same guarantee as a step."""
        return guard.run_step(self, self._guard, body)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[T_co]:
        return self

    __next__ = guard.next_step  # the step as a transaction: see ptl_rl.core.guard

    @property
    def stream_seq(self) -> int:
        """The number of the last output: one more per output, two more after a cut."""
        return self._guard.stream_seq

    # the guard's record of this stage, created on first use (a subclass need not call Stage.__init__)
    _guard_record: _StageRecord | None = None

    @property
    def _guard(self) -> _StageRecord:
        record = self._guard_record
        return record if record is not None else self._new_guard_record()

    def _new_guard_record(self) -> _StageRecord:
        if not hasattr(self, "clock"):
            # a stage that keeps no clock of its own gets one named after its class, here, at its first use.
            # Neither __getattr__ nor a descriptor on the class: __getattr__ takes CPython's specialized attribute
            # lookups from every self.x of every stage (callgrind: 8 % of the instructions of a vector step of
            # source + 3-step), a descriptor those of self.clock
            self.clock = StageClock(type(self).__name__, "items")
        record = self._guard_record = _StageRecord(self.upstream)
        return record


class _StageRecord(guard.StepRecord):
    """A stage's :class:`~ptl_rl.core.guard.StepRecord`, plus where its upstream's stream numbers are read.

    ``numbered_upstream``: the upstream :class:`Stage`'s own record (its ``stream_seq``), ``_OTHER_STREAM`` for
    another :class:`~ptl_rl.core.protocols.NumberedStream` (read through its attribute), ``None`` for an upstream
    that does not number its batches.
    """

    __slots__ = ("numbered_upstream",)

    def __init__(self, upstream: Any) -> None:
        super().__init__()
        self.numbered_upstream: guard.StepRecord | None
        if isinstance(upstream, Stage) and type(upstream).stream_seq is Stage.stream_seq:  # (not overridden)
            self.numbered_upstream = upstream._guard_record or upstream._new_guard_record()
        elif isinstance(upstream, NumberedStream):
            self.numbered_upstream = _OTHER_STREAM
        else:
            self.numbered_upstream = None


_OTHER_STREAM = guard.StepRecord()  # the marker of an upstream numbered by something other than a Stage


@functools.cache
def _stateful(kind: type) -> bool:
    return issubclass(kind, Stateful)

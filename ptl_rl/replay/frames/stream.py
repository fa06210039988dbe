"""Which stream feeds a FrameStorage: the upstream's n-step ``n``, and the number of each batch it pulled.

A numbered upstream (:class:`~ptl_rl.core.protocols.NumberedStream`) tells the storage where the stream was
cut (a skipped number): there nothing that waits is linked to what follows, and no stack is trusted to
continue. Both facts come from the protocols the upstream declares, looked up once when it is bound.
"""

from __future__ import annotations

from collections.abc import Iterator

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.protocols import NStepStream, NumberedStream

#: (batch, its number) pairs kept: the batch being added, and the few pulled before it
NOTED = 4


class StreamNumbers:
    """The upstream of a FrameStorage and the stream numbers of the batches it delivers.

    Attributes:
        upstream: the stage the storage's buffer pulls from (``None``: fed by hand).
        seen: the number of the batch added last (``None``: none, or not numbered).
        noted: ``(batch, number)`` of the last few batches pulled or added: a batch keeps the number it had
            when it was pulled, though the upstream has moved on by the time an add of it cut short is done
            again.
    """

    def __init__(self) -> None:
        self.upstream: Iterator[TransitionBatch] | None = None
        self._numbered: NumberedStream | None = None
        self.seen: int | None = None
        self.noted: tuple[tuple[TransitionBatch, int | None], ...] = ()

    def bind(self, upstream: Iterator[TransitionBatch] | None, n_step: int | None) -> int | None:
        """Follow ``upstream``; returns the storage's ``n_step``: ``n_step``, else the upstream's ``n`` (1 if none).

        An upstream that declares its ``n`` (:class:`~ptl_rl.core.protocols.NStepStream`, an
        ``NStepTransform``) and numbers its batches must agree with an ``n_step`` given (else ``ValueError``).
        """
        n = None
        if upstream is not None:
            n = int(upstream.n) if isinstance(upstream, NStepStream) else 1
        numbered = upstream if isinstance(upstream, NumberedStream) else None
        if n_step is None:
            n_step = n
        elif n is not None and numbered is not None and n != n_step:
            raise ValueError(
                f"this FrameStorage has n_step={n_step} but its upstream emits {n}-step transitions; drop n_step "
                "(it is taken from the upstream) or set it to the upstream's n"
            )
        self.upstream, self._numbered = upstream, numbered
        return n_step

    @property
    def numbered(self) -> bool:
        """Whether the upstream numbers its batches (now: a numbered stream's number may be ``None`` at first)."""
        numbered = self._numbered
        return numbered is not None and numbered.stream_seq is not None

    def note(self, batch: TransitionBatch, seq: int | None) -> None:
        """Record the upstream's number of ``batch``, read when it was pulled (a buffer calls it from its pull)."""
        self.noted = (*self.noted[1 - NOTED :], (batch, seq))

    def seq_of(self, batch: TransitionBatch) -> int | None:
        """The upstream's number of ``batch`` (``None``: not numbered): noted at its pull, else read now."""
        for noted, seq in self.noted:
            if noted is batch:
                return seq
        if self.upstream is None:  # (not numbered: nothing to note)
            return None
        numbered = self._numbered
        seq = numbered.stream_seq if numbered is not None else None
        self.note(batch, seq)
        return seq

    def is_cut(self, seq: int | None) -> bool:
        """Whether a batch numbered ``seq`` does not follow the one added last (steps are missing between them)."""
        return seq is not None and (self.seen is None or seq != self.seen + 1)

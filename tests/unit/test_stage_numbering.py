"""How a stage reads its upstream's stream numbers: a Stage's own record, or the stream_seq it overrides."""

from __future__ import annotations

import itertools

import ptl_rl


class Counter(ptl_rl.Stage[int]):
    """A source of ints whose stream can be cut by hand (mark_cut: the next output skips a number)."""

    def __init__(self) -> None:
        super().__init__(None)
        self._next = itertools.count()

    def step(self) -> int:
        return next(self._next)


class Forward(ptl_rl.Stage[int]):
    """A pass-through that numbers its outputs with its upstream's numbers (it overrides stream_seq)."""

    def step(self) -> int:
        return int(self.pull())

    @property
    def stream_seq(self) -> int:
        return int(self.upstream.stream_seq)  # type: ignore[union-attr]


class Joiner(ptl_rl.Stage[bool]):
    """Yields whether its stream was cut since the last output."""

    def step(self) -> bool:
        self.pull()
        return self.consume_cut()


def test_a_cut_upstream_stage_is_seen_downstream() -> None:
    source = Counter()
    joiner = Joiner(source)
    assert [next(joiner) for _ in range(3)] == [False, False, False]
    source.mark_cut()
    assert [next(joiner) for _ in range(2)] == [True, False]


def test_a_stage_that_overrides_stream_seq_is_read_through_it() -> None:
    source = Counter()
    forward = Forward(source)
    joiner = Joiner(forward)
    assert [next(joiner) for _ in range(3)] == [False, False, False]
    source.mark_cut()  # the forwarder's own record never skips: only its stream_seq shows the cut
    assert [next(joiner) for _ in range(2)] == [True, False]

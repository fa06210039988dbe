"""A stage's time accounting: nanoseconds, calls and items, with the parts of its work that get a line of their own.

Every stage owns a :class:`StageClock` (``stage.clock``) that adds up the
nanoseconds spent in its ``next()`` (inclusive of the upstream it pulls), the
calls and the items (rows) that passed. Work inside a stage that deserves its
own line (the env step and the agent call inside an ExperienceSource, the
insert inside a ReplayBuffer, the gather, the conversion to torch and the
host-to-device copy of a BatchSampler's batches) has a clock of its own in
``stage.clock.parts``. Two ``time.perf_counter_ns`` calls and three integer
adds per ``next()`` and part: nothing per row. :mod:`ptl_rl.core.profile`
turns the clocks into a table.
"""

from __future__ import annotations

import time

from ptl_rl.core.settings import SETTINGS

perf_counter_ns = time.perf_counter_ns

__all__ = ["SETTINGS", "StageClock", "perf_counter_ns"]


class StageClock:
    """Time, calls and items of one stage (or one part of a stage) since the last :meth:`reset`.

    ``ns``: nanoseconds inside the stage's ``next()`` (or the part), inclusive of
    the upstream pulled there; ``items``: rows that passed (what an item is, is
    the stage's ``unit``: env steps, transitions, rows sampled, batches).
    """

    __slots__ = ("calls", "items", "name", "ns", "optional", "parts", "since_ns", "unit")

    def __init__(self, name: str, unit: str, parts: tuple[StageClock, ...] = (), optional: bool = False) -> None:
        self.name, self.unit, self.parts = name, unit, parts
        self.optional = optional  # a line of the profile only once it has calls (work that may never happen)
        self.reset()

    def add(self, ns: int, items: int) -> None:
        """Record one call that took ``ns`` nanoseconds and passed ``items`` items."""
        self.ns += ns
        self.calls += 1
        self.items += items

    def reset(self) -> None:
        """Zero the counters (and those of the parts); the wall clock of the profile restarts now."""
        self.ns = self.calls = self.items = 0
        self.since_ns = perf_counter_ns()
        for part in self.parts:
            part.reset()

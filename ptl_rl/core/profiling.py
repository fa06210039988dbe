"""Per-stage time accounting of a pipeline, and the table that shows it.

Every stage owns a :class:`StageClock` (``stage.clock``) that adds up the
nanoseconds spent in its ``next()`` (inclusive of the upstream it pulls), the
calls and the items (rows) that passed. Work done inside a stage that deserves
its own line (the env step and the agent call inside an ExperienceSource, the
insert inside a ReplayBuffer, the gather and the conversion to torch inside a
BatchSampler) has a clock of its own in ``stage.clock.parts``. The moves of
:class:`~ptl_rl.core.batch.TorchBatch` to another device (Lightning's batch
transfer calls ``TorchBatch.to``) go to the process-wide :data:`HOST_TO_DEVICE`.

The accounting is two ``time.perf_counter_ns`` calls and three integer adds per
``next()`` and part: nothing per row. :func:`profile` turns the clocks into a
:class:`PipelineProfile` table; a stage's own (exclusive) time is its inclusive
time minus its upstream's inclusive time (the upstream is only pulled from
inside it) minus its parts.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

from ptl_rl.core.chain import pipeline_stages

perf_counter_ns = time.perf_counter_ns


class _Switch:
    """The process-wide on/off switch of the accounting (on by default; see :func:`set_profiling`)."""

    on = True


SWITCH = _Switch()


def set_profiling(enabled: bool) -> None:
    """Turn the per-stage accounting of every pipeline on (the default) or off.

    It costs well under 1% of collection speed (see ``benchmarks/collection.py``);
    switch it off only to measure that.
    """
    SWITCH.on = bool(enabled)


class StageClock:
    """Time, calls and items of one stage (or one part of a stage) since the last :meth:`reset`.

    ``ns``: nanoseconds inside the stage's ``next()`` (or the part), inclusive of
    the upstream pulled there; ``items``: rows that passed (what an item is, is
    the stage's ``unit``: env steps, transitions, rows sampled, batches).
    """

    __slots__ = ("calls", "items", "name", "ns", "parts", "since_ns", "unit")

    def __init__(self, name: str, unit: str, parts: tuple[StageClock, ...] = ()) -> None:
        self.name, self.unit, self.parts = name, unit, parts
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


HOST_TO_DEVICE = StageClock("host-to-device copy", "rows")
"""Moves of a :class:`~ptl_rl.core.batch.TorchBatch` to another device (Lightning's batch transfer), process-wide."""


@dataclass(frozen=True)
class ProfileRow:
    """One line of a :class:`PipelineProfile`: a stage's own time and what passed through it."""

    stage: str
    calls: int
    items: int
    unit: str
    own_s: float
    share: float  # of the profile's wall time

    @property
    def items_per_s(self) -> float:
        """Items per second of the stage's own time (``inf`` if it took none)."""
        return self.items / self.own_s if self.own_s > 0 else float("inf")

    @property
    def us_per_item(self) -> float:
        """Microseconds of own time per item (``nan`` if no item passed)."""
        return 1e6 * self.own_s / self.items if self.items else float("nan")


class PipelineProfile:
    """Where a pipeline's time went: one :class:`ProfileRow` per stage and part, shares of wall time.

    ``rows`` are in pipeline order; the last row, ``outside the pipeline``, is
    wall time spent elsewhere (the training step, Lightning, the notebook) since
    the counters were reset, so the shares sum to 1. Show it in a notebook cell
    (``_repr_html_``) or print it; :meth:`reset` zeroes the counters of the
    pipeline (and the host-to-device clock).
    """

    def __init__(self, rows: list[ProfileRow], wall_s: float, clocks: list[StageClock]) -> None:
        self.rows, self.wall_s, self._clocks = rows, wall_s, clocks

    def __getitem__(self, stage: str) -> ProfileRow:
        for row in self.rows:
            if row.stage == stage:
                return row
        raise KeyError(f"no stage {stage!r} in this profile; stages are {[r.stage for r in self.rows]}")

    def shares(self) -> dict[str, float]:
        """``{stage: share of wall time}``, the ``outside the pipeline`` line included."""
        return {row.stage: row.share for row in self.rows}

    def reset(self) -> None:
        """Zero every counter of the pipeline; the next :func:`profile` covers only what follows."""
        for clock in self._clocks:
            clock.reset()
        HOST_TO_DEVICE.reset()

    def _cells(self) -> list[tuple[str, ...]]:
        def rate(row: ProfileRow) -> str:
            return f"{row.items_per_s:,.0f} {row.unit}/s" if row.items and row.own_s > 0 else "-"

        def per(row: ProfileRow) -> str:
            return f"{row.us_per_item:.2f}" if row.items else "-"

        return [
            (row.stage, f"{100 * row.share:.1f}%", rate(row), per(row), f"{row.own_s:.3f}", f"{row.calls:,}")
            for row in self.rows
        ]

    _HEADER = ("stage", "share", "items/s", "us/item", "own s", "calls")

    def __repr__(self) -> str:
        cells = [self._HEADER, *self._cells()]
        widths = [max(len(line[i]) for line in cells) for i in range(len(self._HEADER))]
        lines = [
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
            for line in cells
        ]
        return f"PipelineProfile(wall {self.wall_s:.3f} s)\n" + "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEADER)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in line) + "</tr>" for line in self._cells())
        return (
            f"<table><caption>pipeline profile, wall {self.wall_s:.3f} s</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )


def profile(last_stage: Any) -> PipelineProfile:
    """The per-stage time table of the pipeline ending at ``last_stage`` (a stage or a ``to_dataloader`` loader).

    Each stage's own time is its inclusive ``next()`` time minus that of its
    upstream (pulled inside it) and of its parts (env step, agent call, insert,
    sample, conversion to torch). Shares are of the wall time since the
    counters were last reset (construction of the stages, or
    :meth:`PipelineProfile.reset`); ``outside the pipeline`` is the rest.
    """
    stages = [s for s in pipeline_stages(last_stage) if isinstance(getattr(s, "clock", None), StageClock)]
    if not stages:
        raise ValueError(
            f"the pipeline {[type(s).__name__ for s in pipeline_stages(last_stage)]} has no stage that keeps "
            "time (ExperienceSource, NStepTransform, ReplayBuffer, BatchSampler); pass one of its stages"
        )
    now = perf_counter_ns()
    clocks = [s.clock for s in stages]
    since = min(c.since_ns for c in clocks)
    raw: list[tuple[StageClock, int]] = []
    upstream_ns = 0
    for clock in clocks:
        parts_ns = sum(p.ns for p in clock.parts)
        for part in clock.parts:
            raw.append((part, part.ns))
        # a stage never pulled (a buffer filled with add()) shows its parts only
        if clock.calls:
            raw.append((clock, max(0, clock.ns - upstream_ns - parts_ns)))
            upstream_ns = clock.ns
    if HOST_TO_DEVICE.calls:
        raw.append((HOST_TO_DEVICE, HOST_TO_DEVICE.ns))
    wall_ns = max(now - since, sum(ns for _, ns in raw), 1)
    rows = [ProfileRow(c.name, c.calls, c.items, c.unit, ns / 1e9, ns / wall_ns) for c, ns in raw]
    outside = wall_ns - sum(ns for _, ns in raw)
    rows.append(ProfileRow("outside the pipeline", 0, 0, "", outside / 1e9, outside / wall_ns))
    return PipelineProfile(rows, wall_ns / 1e9, [*clocks, *(p for c in clocks for p in c.parts)])

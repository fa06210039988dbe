"""The table of where a pipeline's time goes, from its stages' clocks (:func:`profile`).

A stage's own (exclusive) time is its inclusive ``next()`` time minus its
upstream's (the upstream is only pulled from inside it) minus its parts; see
:mod:`ptl_rl.core.clock`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from ptl_rl.core.chain import pipeline_stages
from ptl_rl.core.clock import StageClock, perf_counter_ns
from ptl_rl.core.protocols import Pipeline, Timed


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
    pipeline.
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


def profile(last_stage: Pipeline) -> PipelineProfile:
    """The per-stage time table of the pipeline ending at ``last_stage`` (a stage or a ``to_dataloader`` loader).

    Each stage's own time is its inclusive ``next()`` time minus that of its
    upstream (pulled inside it) and of its parts (env step, agent call, insert,
    sample, conversion to torch). Shares are of the wall time since the
    counters were last reset (construction of the stages, or
    :meth:`PipelineProfile.reset`); ``outside the pipeline`` is the rest.
    """
    stages = [s for s in pipeline_stages(last_stage) if isinstance(s, Timed)]
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
            if part.calls or not part.optional:
                raw.append((part, part.ns))
        # a stage never pulled (a buffer filled with add()) shows its parts only
        if clock.calls:
            raw.append((clock, max(0, clock.ns - upstream_ns - parts_ns)))
            upstream_ns = clock.ns
    wall_ns = max(now - since, sum(ns for _, ns in raw), 1)
    rows = [ProfileRow(c.name, c.calls, c.items, c.unit, ns / 1e9, ns / wall_ns) for c, ns in raw]
    outside = wall_ns - sum(ns for _, ns in raw)
    rows.append(ProfileRow("outside the pipeline", 0, 0, "", outside / 1e9, outside / wall_ns))
    return PipelineProfile(rows, wall_ns / 1e9, [*clocks, *(p for c in clocks for p in c.parts)])

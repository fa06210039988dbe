"""A rate limit between the rows written to the shards and the rows the learner samples: Reverb's semantics.

:class:`RateLimit` is the rule (Reverb's ``RateLimiter``: ``MinSize`` and ``SampleToInsertRatio`` with an
error buffer), :class:`RateLimiter` keeps the counts of all shards together and grants inserts and samples
row by row, as Reverb does per item: one Ray actor (asynchronous, so a call waiting for its grant blocks
nobody else). Writers and the learner pass its grant to the shard call as an argument, which Ray resolves
before the shard runs the call: the writer and the learner never wait for it themselves.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from typing import NamedTuple


class RateLimit(NamedTuple):
    """Reverb's rate limiter rule over rows: ``inserts``, ``samples`` (rows drawn), per row.

    * a sample of a row is allowed when ``inserts >= min_size_to_sample`` and
      ``inserts * samples_per_insert - samples - 1 >= min_diff``;
    * an insert of a row is allowed while ``inserts + 1 <= min_size_to_sample``,
      then when ``(inserts + 1) * samples_per_insert - samples <= max_diff``.

    Build it with :meth:`min_size` or :meth:`sample_to_insert_ratio`. Rows are
    counted when inserted, never deleted (a ring overwrites rows rather than
    removing them), so ``min_size_to_sample`` compares with rows ever written;
    with ``min_size_to_sample <= capacity`` of a shard, the shards then hold at
    least that many rows.
    """

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float

    @classmethod
    def min_size(cls, min_size_to_sample: int) -> RateLimit:
        """Reverb's ``MinSize``: no sample before ``min_size_to_sample`` rows were written, then no limit."""
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be an integer >= 1, got {min_size_to_sample}")
        return cls(1.0, int(min_size_to_sample), -sys.float_info.max, sys.float_info.max)

    @classmethod
    def sample_to_insert_ratio(
        cls, samples_per_insert: float, min_size_to_sample: int, error_buffer: float | tuple[float, float]
    ) -> RateLimit:
        """Reverb's ``SampleToInsertRatio``: each row written is sampled ``samples_per_insert`` times on average.

        After ``min_size_to_sample`` rows, ``(inserts - min_size_to_sample) *
        samples_per_insert - samples`` is kept within ``[-error_buffer,
        error_buffer]``: writers wait above it, the learner below it. A pair
        ``(min_diff, max_diff)`` gives the bounds of ``inserts *
        samples_per_insert - samples`` without the offset.
        """
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be an integer >= 1, got {min_size_to_sample}")
        if isinstance(error_buffer, tuple):
            min_diff, max_diff = (float(bound) for bound in error_buffer)
        else:
            offset = samples_per_insert * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                f"the error buffer spans {max_diff - min_diff:g}, less than 2 * max(1, samples_per_insert) = "
                f"{2 * max(1.0, samples_per_insert):g}: writers and the learner could block each other for good. "
                "Raise error_buffer"
            )
        if min_diff > samples_per_insert * min_size_to_sample:
            raise ValueError(
                "the error buffer lies above samples_per_insert * min_size_to_sample: nothing could be sampled "
                "once min_size_to_sample rows are written. Lower its bounds"
            )
        return cls(float(samples_per_insert), int(min_size_to_sample), float(min_diff), float(max_diff))

    def can_sample(self, inserts: int, samples: int, rows: int = 1) -> bool:
        """Whether ``rows`` more rows may be sampled now (Reverb's ``CanSample``)."""
        if inserts < self.min_size_to_sample:
            return False
        return inserts * self.samples_per_insert - samples - rows >= self.min_diff

    def can_insert(self, inserts: int, samples: int, rows: int = 1) -> bool:
        """Whether ``rows`` more rows may be written now (Reverb's ``CanInsert``)."""
        if inserts + rows <= self.min_size_to_sample:
            return True
        return (inserts + rows) * self.samples_per_insert - samples <= self.max_diff

    def room(self, inserts: int, samples: int, wanted: int, insert: bool) -> int:
        """How many of ``wanted`` rows may be inserted (or sampled) now, one after the other, by the rule.

        The rows allowed one by one are a prefix (each makes the next harder), so
        this is the largest ``k <= wanted`` with ``can_insert(inserts, samples, k)``
        (``can_sample``): found in closed form, then checked against the rule.
        """
        if insert:
            free = self.min_size_to_sample - inserts
            bound = (self.max_diff + samples) / self.samples_per_insert - inserts
            allowed = self.can_insert
        else:
            if inserts < self.min_size_to_sample:
                return 0
            free = 0
            bound = inserts * self.samples_per_insert - samples - self.min_diff
            allowed = self.can_sample
        room = max(free, int(min(float(wanted), max(bound, -1.0)) // 1))
        room = max(0, min(room, wanted))
        while room > 0 and not allowed(inserts, samples, room):  # float rounding: at most a step or two
            room -= 1
        return room


class RateLimiter:
    """The counts of all shards under one :class:`RateLimit`; the body of one asynchronous Ray actor.

    :meth:`insert` and :meth:`sample` return once all their rows were granted,
    granting each row as soon as the rule allows it (Reverb's semantics per
    item; the rows allowed now are counted at once, :meth:`RateLimit.room`),
    so a writer's batch and the learner's batch never wait for each other for
    good: with Reverb's bound on the error buffer one of the two can always
    take a row.
    """

    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self.inserts = 0
        self.samples = 0
        self.blocked_inserts = 0  # calls that had to wait
        self.blocked_samples = 0
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # made in the actor's event loop, at its first call
            self._changed = asyncio.Condition()
        return self._changed

    async def insert(self, rows: int, after: int | None = None) -> int:
        """Wait until ``rows`` rows may be written, counting each as it is granted; returns ``rows``.

        ``after``: the caller's previous grant, passed as an object ref so Ray
        runs this call only once that one is granted. An asynchronous actor
        runs one caller's calls in any order, and a grant taken out of order
        would be held by a write queued, at its shard, behind a write still
        waiting for its own grant.
        """
        return await self._grant(rows, insert=True)

    async def sample(self, rows: int, after: int | None = None) -> int:
        """Wait until ``rows`` rows may be sampled, counting each as it is granted; returns ``rows``
        (``after`` as for :meth:`insert`)."""
        return await self._grant(rows, insert=False)

    async def _grant(self, rows: int, insert: bool) -> int:
        changed = self._condition()
        limit = self.limit
        left = int(rows)
        blocked = False
        async with changed:
            while left > 0:
                granted = limit.room(self.inserts, self.samples, left, insert)
                if insert:
                    self.inserts += granted
                else:
                    self.samples += granted
                left -= granted
                if granted:
                    changed.notify_all()
                if left > 0:
                    blocked = True
                    await changed.wait()
        if blocked:
            if insert:
                self.blocked_inserts += 1
            else:
                self.blocked_samples += 1
        return int(rows)

    async def load_counts(self, counts: Mapping[str, int]) -> dict[str, int]:
        """Continue from ``counts`` (as :meth:`counts` returned them, e.g. from a checkpoint); the calls that
        wait are looked at again under them. Returns the counts now."""
        changed = self._condition()
        async with changed:
            self.inserts, self.samples = int(counts["inserts"]), int(counts["samples"])
            self.blocked_inserts = int(counts.get("blocked_inserts", 0))
            self.blocked_samples = int(counts.get("blocked_samples", 0))
            changed.notify_all()
        return self.counts()

    def counts(self) -> dict[str, int]:
        """Rows granted so far (``inserts``, ``samples``) and the calls that waited."""
        return {
            "inserts": self.inserts,
            "samples": self.samples,
            "blocked_inserts": self.blocked_inserts,
            "blocked_samples": self.blocked_samples,
        }

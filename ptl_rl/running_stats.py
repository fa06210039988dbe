"""Running mean and variance: exact, mergeable, and the same on every DDP rank after a sync.

:class:`Moments` is an immutable value (count, mean, sum of squared deviations),
so a stage can compute the next one and commit it in one assignment (an
interrupt lands before or after, never half way). Merging uses the pairwise
formula of Chan, Golub and LeVeque, which is exact for any split of the data:
folding a trajectory batch by batch, or the data of several ranks in rank
order, gives the mean and variance of all of it at once (up to float64
rounding).

:class:`RunningStatistics` keeps the moments of the data seen by this process
in two parts: ``synced`` (the data of every rank, as of the last
:meth:`RunningStatistics.sync`) and ``local`` (what this process added since).
A sync gathers every rank's ``local`` part and merges them in rank order into
``synced``, so every rank ends with identical statistics and no datum is
counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Moments:
    """The count, mean and ``m2`` (sum of squared deviations from the mean) of a set of rows.

    ``mean`` and ``m2`` are float64 arrays of the rows' shape (``()`` for scalars).
    An empty set has ``count == 0``, mean 0 and :attr:`var` 1, so normalizing by it
    changes nothing.
    """

    count: int
    mean: np.ndarray
    m2: np.ndarray

    @staticmethod
    def empty(shape: tuple[int, ...] = ()) -> Moments:
        return Moments(0, np.zeros(shape, np.float64), np.zeros(shape, np.float64))

    @staticmethod
    def of(rows: np.ndarray) -> Moments:
        """The moments of ``rows`` ``[B, *shape]`` (any numeric dtype; computed in float64)."""
        rows = np.asarray(rows, dtype=np.float64)
        if len(rows) == 0:
            return Moments.empty(rows.shape[1:])
        if len(rows) == 1:  # one env: the common MuJoCo case, a third of the work
            return Moments(1, rows[0].copy(), np.zeros(rows.shape[1:], np.float64))
        mean = rows.mean(axis=0)
        return Moments(len(rows), mean, np.square(rows - mean).sum(axis=0))

    @property
    def shape(self) -> tuple[int, ...]:
        return np.shape(self.mean)

    @property
    def var(self) -> np.ndarray:
        """Population variance (``ddof=0``); 1 where nothing was seen yet."""
        if self.count == 0:
            return np.ones_like(self.mean)
        return self.m2 / self.count

    def merge(self, other: Moments) -> Moments:
        """The moments of the union of both sets (Chan et al.'s pairwise update)."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        if other.shape != self.shape:
            raise ValueError(f"cannot merge statistics of shape {other.shape} into statistics of shape {self.shape}")
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + np.square(delta) * (self.count * other.count / count)
        return Moments(count, mean, m2)

    def add(self, rows: np.ndarray) -> Moments:
        """The moments of this set plus ``rows`` ``[B, *shape]``."""
        return self.merge(Moments.of(rows))

    def state_dict(self) -> dict[str, Any]:
        """Plain int and float64 tensors: ``torch.load(..., weights_only=True)`` reads them."""
        return {
            "count": int(self.count),
            "mean": torch.tensor(np.asarray(self.mean), dtype=torch.float64),
            "m2": torch.tensor(np.asarray(self.m2), dtype=torch.float64),
        }

    @staticmethod
    def from_state_dict(state: Mapping[str, Any]) -> Moments:
        mean = np.asarray(state["mean"], dtype=np.float64)
        return Moments(int(state["count"]), mean.copy(), np.asarray(state["m2"], dtype=np.float64).copy())


class RunningStatistics:
    """The moments of every row added here, plus those of other ranks as of the last :meth:`sync`.

    :attr:`moments` is what a normalizer uses: ``synced`` merged with ``local``.
    Assigning the whole object state happens in :meth:`_commit`, one statement.
    """

    def __init__(self) -> None:
        self.synced: Moments | None = None  # None: no row seen anywhere yet (the shape is not known)
        self.local: Moments | None = None
        self.moments: Moments | None = None

    def with_rows(self, rows: np.ndarray) -> tuple[Moments, Moments]:
        """The ``(local, moments)`` pair after adding ``rows`` ``[B, *shape]``; nothing is changed yet."""
        added = Moments.of(rows)
        if self.moments is not None and added.count and added.shape != self.moments.shape:
            raise ValueError(
                f"rows of shape {added.shape} do not match the statistics kept so far, of shape {self.moments.shape}"
            )
        local = added if self.local is None else self.local.merge(added)
        # synced + local, not moments + added: outside DDP synced stays empty and this merge is free
        moments = local if self.synced is None else self.synced.merge(local)
        return local, moments

    def commit(self, local: Moments, moments: Moments) -> None:
        """Make a pair computed by :meth:`with_rows` current (one tuple assignment)."""
        if self.synced is None:
            self.synced = Moments.empty(moments.shape)
        self.local, self.moments = local, moments

    def add(self, rows: np.ndarray) -> None:
        """Add ``rows`` ``[B, *shape]`` now."""
        self.commit(*self.with_rows(rows))

    def sync(self) -> bool:
        """Merge every rank's local rows into the shared part, in rank order; a no-op outside DDP.

        A collective call: under ``torch.distributed`` every rank must call it at the same
        point (a Lightning callback hook does). Returns whether a merge across ranks happened.
        """
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return False
        mine = None if self.local is None else (self.local.count, self.local.mean, self.local.m2)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        merged = self.synced
        for part in gathered:
            if part is None:
                continue
            moments = Moments(int(part[0]), np.asarray(part[1]), np.asarray(part[2]))
            merged = moments if merged is None else merged.merge(moments)
        if merged is not None:
            empty = Moments.empty(merged.shape)
            self.synced, self.local, self.moments = merged, empty, merged
        return True

    def state_dict(self) -> dict[str, Any]:
        def part(m: Moments | None) -> dict[str, Any] | None:
            return None if m is None else m.state_dict()

        return {"synced": part(self.synced), "local": part(self.local)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        def part(s: Mapping[str, Any] | None) -> Moments | None:
            return None if s is None else Moments.from_state_dict(s)

        synced, local = part(state["synced"]), part(state["local"])
        moments = None if synced is None else synced if local is None else synced.merge(local)
        self.synced, self.local, self.moments = synced, local, moments

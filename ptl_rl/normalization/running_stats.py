"""Running mean and variance: exact, mergeable, and the same on every DDP rank after a sync.

:class:`Moments` is an immutable value (count, mean, sum of squared deviations),
so the statistics after a batch are computed and checked aside, and made
current only once they pass (refused rows change nothing; a stage's step cut
short is put back by the guard, :mod:`ptl_rl.core.guard`). Merging uses the pairwise
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

Non-finite input never reaches the statistics: :meth:`RunningStatistics.with_rows`
(so :meth:`~RunningStatistics.add`), :meth:`~RunningStatistics.sync` and
:meth:`~RunningStatistics.load_state_dict` check the moments they would make
current (one dot product with zeros per array, see :meth:`Moments.is_finite`)
and raise ``FloatingPointError`` before anything changes. Only on failure are
the rows examined one by one, to name them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

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

    def is_finite(self) -> bool:
        """Whether ``mean`` and ``m2`` hold no NaN or inf.

        One dot product with zeros per array: ``0 * x`` is 0 for every finite ``x`` and NaN for
        NaN and inf. Moments of rows with a NaN or inf have a non-finite mean (the sum of a
        column propagates it), so this also tells whether any row taken in was non-finite.
        """
        mean, m2 = self.mean, self.m2
        if mean.ndim == 0:  # scalar rows (ScaleRewards' returns)
            return math.isfinite(mean) and math.isfinite(m2)
        if mean.ndim > 1:
            mean, m2 = mean.reshape(-1), m2.reshape(-1)
        zeros = _zeros(mean.size)
        return math.isfinite(mean.dot(zeros)) and math.isfinite(m2.dot(zeros))

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
        """The moments saved by :meth:`state_dict`; ``ValueError`` if they are not a valid set of moments."""
        count = int(state["count"])
        mean = np.asarray(state["mean"], dtype=np.float64).copy()
        m2 = np.asarray(state["m2"], dtype=np.float64).copy()
        if count < 0 or mean.shape != m2.shape:
            raise ValueError(
                f"the state holds no valid moments (count {count}, mean of shape {mean.shape}, m2 of shape "
                f"{m2.shape}): it was not saved by Moments.state_dict"
            )
        return Moments(count, mean, m2)


@functools.lru_cache(maxsize=64)
def _zeros(size: int) -> np.ndarray:
    return np.zeros(size, np.float64)


def non_finite_rows(rows: Any) -> list[int]:
    """The indices of the rows of ``rows`` ``[B, *shape]`` that hold a NaN or an inf (examined one by one)."""
    rows = np.asarray(rows)
    if rows.dtype.kind not in "fc" or rows.ndim == 0 or rows.size == 0:
        return []
    return np.flatnonzero(~np.isfinite(rows.reshape(len(rows), -1)).all(axis=1)).tolist()


_ROWS_FIX = "Clean or clip the rows (np.nan_to_num, np.clip) before they are added, or fix what produced them."


def _refuse_rows(rows: np.ndarray, what: str, owner: str, fix: str) -> NoReturn:
    """Raise the ``FloatingPointError`` for ``rows`` whose moments are not finite, naming the bad rows."""
    bad = non_finite_rows(rows)
    if bad:
        raise FloatingPointError(
            f"non-finite {what} (NaN or inf) in row(s) {bad} of {len(rows)}; refused: {owner} unchanged. "
            f"Taken in, they would make the mean and variance NaN for good, and everything normalized with them. "
            f"{fix}"
        )
    raise FloatingPointError(
        f"the {what} in these {len(rows)} rows are finite, but their moments overflow float64 (magnitudes of "
        f"1e154 and more); refused: {owner} unchanged. {fix}"
    )


class RunningStatistics:
    """The moments of every row added here, plus those of other ranks as of the last :meth:`sync`.

    :attr:`moments` is what a normalizer uses: ``synced`` merged with ``local``.
    :meth:`with_rows` computes and checks the statistics after some rows; :meth:`commit` makes them current.
    """

    def __init__(self) -> None:
        self.synced: Moments | None = None  # None: no row seen anywhere yet (the shape is not known)
        self.local: Moments | None = None
        self.moments: Moments | None = None

    def with_rows(
        self, rows: np.ndarray, what: str = "values", owner: str = "the statistics are", fix: str = _ROWS_FIX
    ) -> tuple[Moments, Moments]:
        """The ``(local, moments)`` pair after adding ``rows`` ``[B, *shape]``; nothing is changed yet.

        Raises ``ValueError`` for rows of another shape than the statistics', and
        ``FloatingPointError`` naming the rows that hold a NaN or an inf (or when the moments
        would overflow float64). ``what``, ``owner`` and ``fix`` word that message for the caller:
        what a row holds, whose statistics stay unchanged, and what to do.
        """
        added = Moments.of(rows)
        if self.moments is not None and added.count and added.shape != self.moments.shape:
            raise ValueError(
                f"rows of shape {added.shape} do not match the statistics kept so far, of shape {self.moments.shape}"
            )
        local = added if self.local is None else self.local.merge(added)
        # synced + local, not moments + added: outside DDP synced stays empty and this merge is free
        moments = local if self.synced is None else self.synced.merge(local)
        if not moments.is_finite():  # a NaN or inf in a row makes the mean non-finite: then name the rows
            _refuse_rows(np.asarray(rows), what, owner, fix)
        return local, moments

    def commit(self, local: Moments, moments: Moments) -> None:
        """Make a pair computed (and checked) by :meth:`with_rows` current."""
        if self.synced is None:
            self.synced = Moments.empty(moments.shape)
        self.local, self.moments = local, moments

    def add(self, rows: np.ndarray) -> None:
        """Add ``rows`` ``[B, *shape]`` now (refused as :meth:`with_rows` says, with nothing changed)."""
        self.commit(*self.with_rows(rows))

    def sync(self, shape: tuple[int, ...] | None = None) -> bool:
        """Merge every rank's local rows into the shared part, in rank order; a no-op outside DDP.

        A collective call: under ``torch.distributed`` every rank must call it at the same
        point (a Lightning callback hook does). Returns whether a merge across ranks happened.
        The merged statistics must be finite and, where ``shape`` is given, of that shape: else
        every rank raises (all of them merge the same parts) and nothing changes.
        """
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return False
        mine = None if self.local is None else (self.local.count, self.local.mean, self.local.m2)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        merged = self.synced
        parts: list[tuple[int, Moments]] = []
        for rank, part in enumerate(gathered):
            if part is None:
                continue
            moments = Moments(int(part[0]), np.asarray(part[1], np.float64), np.asarray(part[2], np.float64))
            parts.append((rank, moments))
            merged = moments if merged is None else merged.merge(moments)
        if merged is not None and not merged.is_finite():
            bad = [rank for rank, moments in parts if not moments.is_finite()]
            raise FloatingPointError(
                f"the statistics gathered from rank(s) {bad} hold NaN or inf; refused: the statistics of every "
                "rank are unchanged. Those ranks took in non-finite rows outside the checked paths "
                "(update, the normalization stages): find what wrote them, or restore a checkpoint"
            )
        if merged is not None and shape is not None and merged.count and merged.shape != shape:
            raise ValueError(
                f"the statistics gathered from the ranks are of shape {merged.shape}, but these statistics are "
                f"of shape {shape}: every rank must normalize observations of the same shape"
            )
        if merged is not None:
            empty = Moments.empty(merged.shape)
            self.synced, self.local, self.moments = merged, empty, merged
        return True

    def state_dict(self) -> dict[str, Any]:
        def part(m: Moments | None) -> dict[str, Any] | None:
            return None if m is None else m.state_dict()

        return {"synced": part(self.synced), "local": part(self.local)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s statistics; refused with nothing changed if they are not finite."""

        def part(s: Mapping[str, Any] | None) -> Moments | None:
            return None if s is None else Moments.from_state_dict(s)

        synced, local = part(state["synced"]), part(state["local"])
        moments = None if synced is None else synced if local is None else synced.merge(local)
        if any(m is not None and not m.is_finite() for m in (synced, local)):
            raise FloatingPointError(
                "the state holds statistics with NaN or inf; refused: the statistics are unchanged. It was saved "
                "from statistics that had taken in non-finite rows: restore an earlier checkpoint, or leave this "
                "state out and start the statistics afresh"
            )
        self.synced, self.local, self.moments = synced, local, moments

"""The learner's side of remote collection: what it keeps of the messages it takes in, and the stage base class.

A collector (a background process, a Ray actor) sends the learner one message per batch of rows: the rows, the
env steps taken and the episodes finished. :class:`Intake` counts them and keeps the rows within the staleness
bound; :class:`RemoteSource` is the stage that holds an ``Intake`` and shows its counters under the names of an
:class:`~ptl_rl.stages.source.ExperienceSource`, so the episode callbacks work on it unchanged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Self, TypeVar, overload

import numpy as np

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.episode import Episode
from ptl_rl.core.guard import WriteJournal
from ptl_rl.core.stage import Stage
from ptl_rl.distributed.common import VERSION_FIELD, Factory

T_out = TypeVar("T_out", covariant=True)


class StalenessTracker:
    """Learner-side staleness: ``learner version - policy_version`` of each row when it is taken in.

    With ``max_staleness`` set, rows older than that are dropped (counted in
    ``dropped``): the bound is enforced where the staleness is known exactly,
    when the learner takes the rows, whatever sat in queues in between.
    """

    def __init__(self, max_staleness: int | None) -> None:
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.max_staleness = max_staleness
        self.dropped = 0
        self.last = 0
        self.max_seen = 0
        self._sum = 0
        self._rows = 0

    def admit(self, batch: TransitionBatch, version: int) -> TransitionBatch:
        """``batch`` without its rows that are too stale; updates the counters."""
        stamps = np.asarray(batch[VERSION_FIELD])
        if not len(stamps):
            return batch
        staleness = version - stamps
        if self.max_staleness is not None:
            keep = staleness <= self.max_staleness
            kept = int(np.count_nonzero(keep))
            if kept < len(stamps):
                self.dropped += len(stamps) - kept
                batch, staleness = batch.rows(keep.nonzero()[0]), staleness[keep]
        if len(staleness):
            self.last = int(staleness.max())
            self.max_seen = max(self.max_seen, self.last)
            self._sum += int(staleness.sum())
            self._rows += len(staleness)
        return batch

    def stats(self) -> dict[str, float]:
        """``staleness_last`` (max over the last batch), ``staleness_mean``, ``staleness_max``, ``dropped_stale``."""
        mean = self._sum / self._rows if self._rows else 0.0
        return {
            "staleness_last": float(self.last),
            "staleness_mean": float(mean),
            "staleness_max": float(self.max_seen),
            "dropped_stale": float(self.dropped),
        }

    def snapshot(self) -> tuple[int, ...]:
        return self.dropped, self.last, self.max_seen, self._sum, self._rows

    def restore(self, saved: tuple[int, ...]) -> None:
        self.dropped, self.last, self.max_seen, self._sum, self._rows = saved

    def state_dict(self) -> dict[str, int]:
        return {"dropped": self.dropped, "max_seen": self.max_seen, "sum": self._sum, "rows": self._rows}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.dropped, self.max_seen = int(state["dropped"]), int(state["max_seen"])
        self._sum, self._rows = int(state["sum"]), int(state["rows"])


class EpisodeCounters:
    """The learner's view of the collectors' env steps and finished episodes (an ExperienceSource's interface)."""

    def __init__(self, stats_window: int = 100) -> None:
        self.total_steps = 0
        self.episodes_finished = 0
        self._pending: list[Episode] = []  # extended in place by add(), replaced by pop_episodes()
        self._recent: deque[Episode] = deque(maxlen=stats_window)  # replaced by add(), never changed in place

    def add(self, steps: int, episodes: list[Episode]) -> None:
        self.total_steps += int(steps)
        if episodes:
            # a worker counts its own steps; the learner's count is the sum, so restamp the episode ends with it
            episodes = [e._replace(total_steps=self.total_steps) for e in episodes]
            self.episodes_finished += len(episodes)
            self._pending.extend(episodes)
            recent = self._recent.copy()  # (a window of episodes, once per message that finished some)
            recent.extend(episodes)
            self._recent = recent

    def snapshot(self) -> tuple[Any, ...]:
        """What :meth:`restore` puts back before an :meth:`add` is redone: counters and references, no copy."""
        return self.total_steps, self.episodes_finished, self._recent, len(self._pending)

    def restore(self, saved: tuple[Any, ...]) -> None:
        self.total_steps, self.episodes_finished, self._recent, pending = saved
        del self._pending[pending:]  # (no pop in between: the intake settles before every read)

    def recent_episodes(self) -> list[Episode]:
        return list(self._recent)

    def pop_episodes(self) -> list[Episode]:
        episodes, self._pending = self._pending, []
        return episodes

    def episode_stats(self) -> dict[str, float]:
        stats = {"env_steps": float(self.total_steps), "episodes": float(self.episodes_finished)}
        if self._recent:
            stats["return_mean"] = float(np.mean([e.ret for e in self._recent]))
            stats["length_mean"] = float(np.mean([e.length for e in self._recent]))
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {
            "total_steps": self.total_steps,
            "episodes_finished": self.episodes_finished,
            "recent": [[e.ret, e.length, e.env_id, e.total_steps] for e in self._recent],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.total_steps = int(state["total_steps"])
        self.episodes_finished = int(state["episodes_finished"])
        recent: deque[Episode] = deque(maxlen=self._recent.maxlen)
        recent.extend(Episode(float(r), int(n), int(e), int(t)) for r, n, e, t in state["recent"])
        self._recent = recent
        self._pending = []


class Intake:
    """What the learner keeps of the messages it takes in: env-step and episode counters, staleness.

    Taking a message in is one write of a :class:`~ptl_rl.core.guard.WriteJournal`: a cut in the middle of it
    (an interrupt) is finished, the counters put back and the message counted again in full, before the
    counters are read or another message is taken in. So a message is counted once, whole, whether or not its
    rows reached the learner's consumer (its env steps were taken), and never half.
    """

    def __init__(self, stats_window: int, max_staleness: int | None) -> None:
        self._staleness = StalenessTracker(max_staleness)
        self._counters = EpisodeCounters(stats_window)
        self._journal = WriteJournal(self._save, self._restore)

    @overload
    def take(self, batch: TransitionBatch, steps: int, episodes: list[Episode], version: int) -> TransitionBatch: ...
    @overload
    def take(self, batch: None, steps: int, episodes: list[Episode], version: int) -> None: ...

    def take(
        self, batch: TransitionBatch | None, steps: int, episodes: list[Episode], version: int
    ) -> TransitionBatch | None:
        """Count a message's ``steps`` and ``episodes``; return its rows at most ``max_staleness`` behind
        ``version`` (``None``: a message without rows)."""
        return self._journal.write(self._take, batch, steps, episodes, version)

    def _take(
        self, batch: TransitionBatch | None, steps: int, episodes: list[Episode], version: int
    ) -> TransitionBatch | None:
        self._counters.add(steps, episodes)
        return None if batch is None else self._staleness.admit(batch, version)

    @property
    def counters(self) -> EpisodeCounters:
        """The env-step and episode counters (a message whose intake was cut is finished first)."""
        self._journal.settle()
        return self._counters

    @property
    def staleness(self) -> StalenessTracker:
        """The staleness counters (a message whose intake was cut is finished first)."""
        self._journal.settle()
        return self._staleness

    def _save(self) -> object:
        return self._counters.snapshot(), self._staleness.snapshot()

    def _restore(self, saved: Any) -> None:
        self._counters.restore(saved[0])
        self._staleness.restore(saved[1])

    def state_dict(self) -> dict[str, Any]:
        return {"counters": self.counters.state_dict(), "staleness": self.staleness.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._journal.forget()  # the loaded counters replace whatever a cut intake was counting into
        self._counters.load_state_dict(state["counters"])
        self._staleness.load_state_dict(state["staleness"])


class RemoteSource(Stage[T_out]):
    """The base of a source stage whose envs step elsewhere (:class:`~ptl_rl.distributed.AsyncSource`,
    :class:`~ptl_rl.distributed.RayWorkers`): an :class:`Intake` of the collectors' messages, shown under the
    episode interface of an :class:`~ptl_rl.stages.source.ExperienceSource` (``total_steps``,
    ``episodes_finished``, ``recent_episodes``, ``pop_episodes``, ``episode_stats``).

    A subclass implements ``step()`` (taking each message in with ``self.intake.take``), ``close()`` (stop its
    collectors) and ``restore()``: what the guard does before the step after one that was cut short. ``T_out``:
    what it yields (rows; or, for Ray workers writing to replay shards themselves, their counts).
    """

    one_row_per_env = False  # an n-step stage may run in the collector

    def __init__(self, factory: Factory, stats_window: int, max_staleness: int | None) -> None:
        super().__init__(None)  # a source: it pulls from no stage
        self.factory = factory
        self.intake = Intake(stats_window, max_staleness)

    @property
    def counters(self) -> EpisodeCounters:
        """The learner's copy of the collectors' env-step and episode counters."""
        return self.intake.counters

    @property
    def staleness(self) -> StalenessTracker:
        """The staleness of the rows taken in (see :class:`StalenessTracker`)."""
        return self.intake.staleness

    @property
    def total_steps(self) -> int:
        """Env steps the collectors have taken (as far as the learner has received)."""
        return self.counters.total_steps

    @property
    def episodes_finished(self) -> int:
        """Episodes the collectors have finished (as far as the learner has received)."""
        return self.counters.episodes_finished

    def recent_episodes(self) -> list[Episode]:
        """The last ``stats_window`` finished episodes, oldest first (not consumed)."""
        return self.counters.recent_episodes()

    def pop_episodes(self) -> list[Episode]:
        """Episodes received since the last call (each returned once), oldest first."""
        return self.counters.pop_episodes()

    def episode_stats(self) -> dict[str, float]:
        """Mean return and length of the last ``stats_window`` episodes, and counters."""
        return self.counters.episode_stats()

    def close(self) -> None:
        """Stop the collectors; a later ``next()`` starts new ones."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

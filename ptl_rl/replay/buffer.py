"""ReplayBuffer: experience replay composed of a storage and a draw strategy, a pipeline stage or on its own.

The buffer owns the stage schedule (warm-up, credit), the journal that makes every add a write of the guard, and
the sampling RNG; where rows live is the storage's business, which rows a batch holds the draw strategy's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.core.clock import SETTINGS, StageClock, perf_counter_ns
from ptl_rl.core.guard import WriteJournal
from ptl_rl.core.protocols import (
    JournaledStorage,
    NumberedStream,
    RollbackStorage,
    Storage,
    StreamBoundStorage,
)
from ptl_rl.core.protocols.draws import (
    DrawStrategy,
    EpisodeDrawStrategy,
    EpochDrawStrategy,
    PriorityDrawStrategy,
)
from ptl_rl.core.ranks import rank_seed
from ptl_rl.core.stage import Stage
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.replay.draws import UniformDraws
from ptl_rl.replay.parts import checked_draws, checked_storage
from ptl_rl.replay.storage import ArrayStorage


class ReplayBuffer(Stage["ReplayBuffer"]):
    """Replay over a preallocated ring of transitions: a storage, and a strategy that draws the batches.

    As a pipeline stage, each ``next()`` yields the buffer itself, for a
    :class:`~ptl_rl.replay.sampler.BatchSampler` to draw from, after collecting on
    average ``transitions_per_yield`` transitions from ``upstream``: pulled
    transitions are credited, and each yield spends ``transitions_per_yield``
    of the credit. So with 8 envs (8 transitions per pull) and
    ``transitions_per_yield=2`` the buffer yields 4 times per pull, and with
    ``transitions_per_yield=16`` once every 2 pulls. The first yield also waits
    until ``warmup`` transitions are stored (the warm-up pays for that first
    yield only). With one sampled batch per yield, the replay ratio is
    ``batch_size / transitions_per_yield`` sampled transitions per collected one.

    On its own it is a plain buffer: :meth:`add`, :meth:`sample`, ``len()``.
    What a batch is comes from ``draws``; :class:`~ptl_rl.replay.PrioritizedReplayBuffer`,
    :class:`~ptl_rl.replay.SequenceReplayBuffer` and :class:`~ptl_rl.replay.HERReplayBuffer`
    are this class with their strategy built from their arguments.

    Args:
        upstream: iterator of :class:`TransitionBatch` (e.g. an
            :class:`~ptl_rl.stages.nstep.NStepTransform`), or ``None``.
        capacity: number of transitions kept; the oldest are overwritten.
        warmup: transitions stored before the first yield (``<= capacity``);
            default ``min(1000, capacity)``.
        transitions_per_yield: transitions collected from upstream per yield, on average (>= 1).
        seed: seed of the sampling generator (the strategy draws with it).
        replacement: ``False`` is short for ``draws=UniformDraws(replacement=False)``:
            shuffled passes in which every stored transition comes exactly once,
            for epoch-style training on a fixed buffer. See also :meth:`epoch`.
        storage: ``capacity -> storage`` to store transitions in something other
            than an :class:`~ptl_rl.replay.ArrayStorage`, e.g.
            ``functools.partial(FrameStorage, stack_axis=0)`` for pixel
            observations (every frame stored once). Any object with the
            members of :class:`~ptl_rl.core.protocols.Storage` works; one that
            is also a :class:`~ptl_rl.core.protocols.PartlySampleableStorage`
            is only sampled where it says so.
        draws: the draw strategy (a :class:`~ptl_rl.core.protocols.DrawStrategy`): rows drawn
            uniformly (``UniformDraws()``, the default), by priority (``PrioritizedDraws(alpha, beta)``),
            windows of steps (``SequenceWindows(length, burn_in, draws=...)``), steps relabeled with
            hindsight goals (``HindsightGoals(compute_reward, ...)``), or one of your own. It keeps the
            per-slot state of this buffer (create one per buffer), reached as ``buffer.draws``.

    Interrupts: every add is a write of the guard (:class:`~ptl_rl.core.guard.WriteJournal`):
    an add cut short, between two fields of a row or anywhere else, is
    written again in full before the buffer is read or written again, and a
    batch the storage refuses (``ValueError``/``TypeError``: a wrong shape or
    dtype) leaves the buffer as it was. A storage that journals its own adds
    too (:class:`~ptl_rl.core.protocols.JournaledStorage`, e.g. a FrameStorage,
    for adds called on it directly) is settled before every read as well. What a strategy keeps per slot is
    written in the same write (its ``snapshot`` is taken with the storage's).

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
        >>> buffer = ptl_rl.ReplayBuffer(source, capacity=100, warmup=10, transitions_per_yield=2, seed=0)
        >>> next(buffer) is buffer  # yields itself once 10 transitions are stored
        True
        >>> len(buffer), buffer.sample(4).obs.shape
        (10, (4, 4))
        >>> next(buffer) is buffer, len(buffer)  # then once per 2 transitions collected (one vector step here)
        (True, 12)

        On its own, filled by hand:

        >>> standalone = ptl_rl.ReplayBuffer(capacity=3)
        >>> standalone.add(next(source)), standalone.add(next(source))  # the slots written: the ring wraps
        (array([0, 1]), array([2, 0]))
        >>> len(standalone)
        3
    """

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None = None,
        capacity: int = 100_000,
        *,
        warmup: int | None = None,
        transitions_per_yield: int = 1,
        seed: int | None = None,
        replacement: bool = True,
        storage: Callable[[int], Storage] | None = None,
        draws: DrawStrategy | None = None,
    ) -> None:
        super().__init__(upstream)
        self.storage: Storage = checked_storage(ArrayStorage(capacity) if storage is None else storage(capacity))
        # what the storage can do beyond the Storage protocol, looked up once (ptl_rl.core.protocols)
        self._stream_bound = isinstance(self.storage, StreamBoundStorage)
        self._upstream_numbered = isinstance(upstream, NumberedStream)  # its stream_seq is read at every pull
        if self._stream_bound:
            cast(StreamBoundStorage, self.storage).bind_upstream(upstream)
        if warmup is None:
            warmup = min(1_000, self.storage.capacity)
        if not 0 <= warmup <= capacity:
            raise ValueError(
                f"warmup must be in [0, capacity={capacity}], got {warmup}: the buffer cannot hold more than "
                "capacity transitions; lower warmup or raise capacity"
            )
        if transitions_per_yield < 1:
            raise ValueError(f"transitions_per_yield must be >= 1, got {transitions_per_yield}")
        self.capacity = self.storage.capacity
        self.warmup = int(warmup)
        self.transitions_per_yield = int(transitions_per_yield)
        self.seed = seed
        self.rank = 0
        self.rng = np.random.default_rng(seed)
        self._credit = 0  # transitions collected but not yet spent on a yield
        self._added = 0  # transitions added by this stage's pulls (its clock's items)
        self._counted = 0
        self._self_journaled = isinstance(self.storage, JournaledStorage)
        self.draws: DrawStrategy = checked_draws(draws, replacement)
        # what the strategy can do beyond the DrawStrategy protocol, looked up once (ptl_rl.core.protocols.draws)
        self._episodic = isinstance(self.draws, EpisodeDrawStrategy)
        self._takes_priorities = isinstance(self.draws, PriorityDrawStrategy)
        self.draws.bind(self.storage, upstream)
        # adds are writes of the guard: one cut short is written again in full before the next read or write
        self._storage_save: Callable[[], Any]
        self._restore_storage: Callable[[Any], None]
        if isinstance(self.storage, RollbackStorage):  # (an ArrayStorage's: its counters and first allocation)
            self._storage_save, self._restore_storage = self.storage.snapshot, self.storage.restore
        else:  # rows are rewritten in full: the counters suffice
            self._storage_save, self._restore_storage = self._counters, self._put_counters
        # the write the journal holds: a storage that journals its own adds writes without its own journal here
        self._storage_write: Callable[[TransitionBatch], np.ndarray] = (
            cast(JournaledStorage[Any], self.storage).write if self._self_journaled else self.storage.add
        )
        self._uniform = type(self.draws) is UniformDraws  # keeps nothing per add: an add is the storage's write
        if self._uniform:
            self._journal = WriteJournal(self._storage_save, self._restore_storage)
        else:
            self._journal = WriteJournal(self._save_written, self._restore_written)
        # the calls of every add, bound once (an add of 8 rows takes ~7 us; looking these up each time cost ~5 %)
        self._draws_check, self._draws_added, self._draws_snapshot = (
            self.draws.check,
            self.draws.added,
            self.draws.snapshot,
        )
        self._advance = self._journal.advance
        # time accounting (ptl_rl.profile): the stage's own time is the credit loop; add() is its part
        self._insert_clock = StageClock("insert", "transitions")
        self.clock = StageClock("replay", "transitions", (self._insert_clock,))

    def __len__(self) -> int:
        return len(self.storage)

    def set_rank(self, rank: int) -> None:
        """Re-seed sampling for DDP rank ``rank`` (a no-op when already there, so a restored RNG state is kept)."""
        if int(rank) != self.rank:
            self.rank = int(rank)
            self.rng = np.random.default_rng(rank_seed(self.seed, self.rank))

    # ------------------------------------------------------------------ stage
    def step(self) -> ReplayBuffer:
        """Pull until ``transitions_per_yield`` more transitions are credited (and ``warmup`` stored); yield self.

        The first yield also waits until the strategy can draw a batch (a window,
        a complete episode).
        """
        if self.upstream is None:
            raise TypeError("this ReplayBuffer has no upstream to pull from; use add() and sample()")
        draws = self.draws
        warming_up = len(self) < self.warmup or not draws.ready()
        while len(self) < self.warmup or self._credit < self.transitions_per_yield or not draws.ready():
            self._credit += len(self._pull())
        if warming_up:  # the warm-up pays for the first yield only, not for a burst of them
            self._credit = min(self._credit, self.transitions_per_yield)
        self._credit -= self.transitions_per_yield
        return self

    def snapshot(self) -> object:
        return self._credit  # the rows added by a step cut short stay: each add is a write of its own

    def restore(self, snapshot: object) -> None:
        self._credit = int(cast(int, snapshot))

    def count(self, out: object) -> int:
        """Transitions added since the last count (the clock's items)."""
        added, self._counted = self._added - self._counted, self._added
        return added

    def _pull(self) -> np.ndarray:
        """Add the upstream's next batch; returns its slots."""
        batch = self.pull()
        if self._stream_bound:  # (the number as of the pull)
            cast(StreamBoundStorage, self.storage).note_stream_seq(batch, self._upstream_stream_seq())
        if not SETTINGS.profiling:
            slots = self._add_pulled(batch)
        else:  # timed here, not in add(): a standalone add() (offline filling, the add benchmark) pays nothing for it
            start = perf_counter_ns()
            slots = self._add_pulled(batch)
            self._insert_clock.add(perf_counter_ns() - start, len(slots))
        self._added += len(slots)
        return slots

    def _upstream_stream_seq(self) -> int | None:
        """The upstream's number of its last batch (``None``: an unnumbered upstream)."""
        return cast(NumberedStream, self.upstream).stream_seq if self._upstream_numbered else None

    def _add_pulled(self, batch: TransitionBatch) -> np.ndarray:
        """Add a batch pulled from upstream, first ending every episode (of a strategy that follows them) at a cut."""
        if self._episodic and self.consume_cut():
            # steps are missing between the last batch added and this one (the source reset its envs after an
            # interrupt or a restore, or someone pulled batches in between): no episode may run across the gap
            self.end_episodes()
        return self.add(batch)

    # ------------------------------------------------------------------ buffer
    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` transitions of ``batch``; returns their slots (int64 [B]).

        An add cut short (a ``KeyboardInterrupt`` between two fields of a row) is
        written again in full before the buffer is read or written again. A batch
        the storage refuses (``ValueError``/``TypeError``: a wrong shape or dtype)
        is refused before anything is written: the buffer stays as it was, and so
        is one the strategy refuses (a field it needs is missing).
        """
        if self._uniform:  # the default strategy adds nothing to the storage's write
            return self._journal.write(self._storage_write, batch)
        self._draws_check(batch)
        if self._episodic and len(batch) > self.capacity:  # it sees every row: add the batch in ring-sized chunks
            chunks = [self.add(batch.rows(slice(lo, lo + self.capacity))) for lo in range(0, len(batch), self.capacity)]
            return chunks[-1]
        # (no storage code runs before the journal records the batch: a cut anywhere in the storage is redone)
        return self._journal.write(self._store, batch)

    def _store(self, batch: TransitionBatch) -> np.ndarray:
        """The write of one add: the rows, then what the strategy keeps per slot. Redone whole after a cut."""
        old_size = self.storage.size
        slots = self._storage_write(batch)
        if len(slots):
            self._draws_added(slots, old_size, batch, self._advance)
        return slots

    def settle(self) -> None:
        """Finish an add that a cut left half done (called before every read; a no-op when none is)."""
        self._journal.settle()  # (its restore drops an add the storage journals itself: done once, here)
        if self._self_journaled:  # (an add made on the storage directly)
            cast(JournaledStorage[object], self.storage).settle()

    def _save_written(self) -> tuple[object, object]:
        """What an add changes besides whole rows: the storage's counters (all its bookkeeping, if it says so),
        and the strategy's snapshot."""
        return self._storage_save(), self._draws_snapshot()

    def _restore_written(self, saved: tuple[object, object]) -> None:
        storage, draws = saved
        self._restore_storage(storage)
        self.draws.restore(draws)

    def _counters(self) -> tuple[int, int, int]:
        """What an add changes in a storage whose rows are rewritten in full (an ArrayStorage): its counters."""
        storage = self.storage
        return storage.cursor, storage.size, storage.total_added

    def _put_counters(self, saved: tuple[int, int, int]) -> None:
        storage = self.storage
        storage.cursor, storage.size, storage.total_added = saved

    def sample(self, batch_size: int) -> TransitionBatch:
        """A batch of ``batch_size`` rows (or windows) drawn by the strategy, as numpy arrays [batch_size, ...].

        With the default :class:`~ptl_rl.replay.UniformDraws`: stored transitions drawn
        uniformly with replacement, the stored fields only.
        """
        self.settle()  # a buffer filled by hand may be sampled right after an interrupted add
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return self.draws.sample(self.rng, batch_size)

    def epoch(self, batch_size: int) -> Iterator[TransitionBatch]:
        """One fresh shuffled pass: every stored transition exactly once, in batches of ``batch_size``.

        The last batch holds the remainder. A pass begun by an earlier call or by
        ``sample`` without replacement is dropped. Add nothing while iterating.
        Only for a strategy that makes passes (:class:`~ptl_rl.replay.UniformDraws`).
        """
        if not isinstance(self.draws, EpochDrawStrategy):
            raise TypeError(
                f"this {type(self).__name__} draws with {type(self.draws).__name__}, which makes no shuffled passes "
                "(a pass without replacement ignores priorities, windows and episodes); for passes over a fixed "
                "buffer use ReplayBuffer(replacement=False) or ReplayBuffer.epoch()"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.settle()
        return self.draws.epoch(self.rng, batch_size)

    def update_priorities(self, indices: Numbers, priorities: Numbers, generations: Numbers | None = None) -> int:
        """Set the priorities of the slots ``indices`` (int [B]) to ``priorities`` (float [B], ``>= 0``).

        Returns how many rows were skipped as stale (their slot was overwritten
        since the draw whose ``generations`` (int [B]) are passed). For a buffer whose
        strategy draws by priority (:class:`~ptl_rl.core.protocols.PriorityDrawStrategy`,
        see :meth:`ptl_rl.replay.PrioritizedDraws.update_priorities`); a sampled
        batch's ``update_priorities(td_errors)`` does the same with ``|td_errors|``.
        """
        if not self._takes_priorities:
            raise TypeError(
                f"this buffer draws with {type(self.draws).__name__}, which takes no priorities; create it with "
                "draws=ptl_rl.PrioritizedDraws(...)"
            )
        return cast(PriorityDrawStrategy, self.draws).update_priorities(indices, priorities, generations)

    def end_episodes(self) -> None:
        """End every env's episode here: no step added later continues an episode stored before.

        Called by the buffer itself when its stream is cut (a stream number skipped
        upstream, a step of its own cut short) and after :meth:`load_state_dict`;
        call it when feeding :meth:`add` by hand from streams that were cut (envs
        reset without a ``terminated``/``truncated`` step). A no-op for a strategy
        that follows no episodes (:class:`~ptl_rl.core.protocols.EpisodeDrawStrategy`).
        """
        self.settle()
        if self._episodic:  # a write of the guard, like an add
            self._journal.write(cast(EpisodeDrawStrategy, self.draws).end_episodes, self._journal.advance)

    # ------------------------------------------------------------------ state
    # format of state_dict(). 2: the strategy's entries under "draws"; 0 and 1 kept them at the top level
    STATE_VERSION = 2

    def state_dict(self) -> dict[str, Any]:
        """Stored transitions (tensors), cursor, RNG state and the strategy's state: ``weights_only``-safe."""
        self.settle()
        state = {
            "storage": self.storage.state_dict(),
            "rng": self.rng.bit_generator.state,
            "credit": self._credit,
            "draws": self.draws.state_dict(),
        }
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state; episodes in flight are ended (the source starts new ones after a restore)."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        # the strategy first: it refuses a state of another configuration (alpha, length) before anything changes.
        # (Formats 0 and 1 hold its entries at the top level; a format-2 state stripped of its version still has
        # "draws", so the key, not the version, says where they are.)
        self.draws.load_state_dict(state["draws"] if "draws" in state else state)
        self._journal.forget()  # the restored storage replaces whatever was being written
        self.storage.load_state_dict(state["storage"])
        self.rng.bit_generator.state = state["rng"]
        self._credit = int(state["credit"])
        self.end_episodes()

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``ReplayBuffer(size=stored/capacity, warmup=..., <the strategy's counters>, transitions_per_yield=...)``
        and the chain upstream."""
        counters = {"size": f"{len(self)}/{self.capacity}", "warmup": self.warmup, **self.draws.counters()}
        return stage_repr(self, **counters, transitions_per_yield=self.transitions_per_yield)

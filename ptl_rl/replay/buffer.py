"""ReplayBuffer: uniform experience replay, usable as a pipeline stage or on its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.clock import SETTINGS, StageClock, perf_counter_ns
from ptl_rl.core.guard import WriteJournal
from ptl_rl.core.protocols import (
    JournaledStorage,
    NumberedStream,
    PartlySampleableStorage,
    RollbackStorage,
    Storage,
    StreamBoundStorage,
    implements,
    missing_members,
)
from ptl_rl.core.ranks import rank_seed
from ptl_rl.core.stage import Stage
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.replay.draws import redraw_unsampleable
from ptl_rl.replay.shuffle import ShuffledPasses
from ptl_rl.replay.storage import ArrayStorage


class ReplayBuffer(Stage["ReplayBuffer"]):
    """Uniform replay over a preallocated ring of transitions.

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

    Args:
        upstream: iterator of :class:`TransitionBatch` (e.g. an
            :class:`~ptl_rl.stages.nstep.NStepTransform`), or ``None``.
        capacity: number of transitions kept; the oldest are overwritten.
        warmup: transitions stored before the first yield (``<= capacity``);
            default ``min(1000, capacity)``.
        transitions_per_yield: transitions collected from upstream per yield, on average (>= 1).
        seed: seed of the sampling generator.
        replacement: ``True`` (default) draws every batch uniformly with
            replacement; ``False`` samples without replacement: shuffled passes
            in which every stored transition comes exactly once (the last
            batch of a pass holds the remainder and may be smaller), for
            epoch-style training on a fixed buffer. See also :meth:`epoch`.
        storage: ``capacity -> storage`` to store transitions in something other
            than an :class:`~ptl_rl.replay.ArrayStorage`, e.g.
            ``functools.partial(FrameStorage, stack_axis=0)`` for pixel
            observations (every frame stored once). Any object with the
            members of :class:`~ptl_rl.core.protocols.Storage` works; one that
            is also a :class:`~ptl_rl.core.protocols.PartlySampleableStorage`
            is only sampled where it says so.

    Interrupts: every add is a write of the guard (:class:`~ptl_rl.core.guard.WriteJournal`):
    an add cut short, between two fields of a row or anywhere else, is
    written again in full before the buffer is read or written again, and a
    batch the storage refuses (``ValueError``/``TypeError``: a wrong shape or
    dtype) leaves the buffer as it was. A storage that journals its own adds
    too (:class:`~ptl_rl.core.protocols.JournaledStorage`, e.g. a FrameStorage,
    for adds called on it directly) is settled before every read as well.

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
    ) -> None:
        super().__init__(upstream)
        self.storage: Storage = _checked_storage(ArrayStorage(capacity) if storage is None else storage(capacity))
        # what the storage can do beyond the Storage protocol, looked up once (ptl_rl.core.protocols)
        self._stream_bound = isinstance(self.storage, StreamBoundStorage)
        self._partly_sampleable = isinstance(self.storage, PartlySampleableStorage)
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
        self.replacement = bool(replacement)
        self.passes = ShuffledPasses()  # the order of sampling without replacement
        self._credit = 0  # transitions collected but not yet spent on a yield
        self._added = 0  # transitions added by this stage's pulls (its clock's items)
        self._counted = 0
        # adds are writes of the guard: one cut short is written again in full before the next read or write
        self._journal = WriteJournal(self._save_written, self._restore_written)
        self._self_journaled = isinstance(self.storage, JournaledStorage)
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
        """Pull until ``transitions_per_yield`` more transitions are credited (and ``warmup`` stored); yield self."""
        if self.upstream is None:
            raise TypeError("this ReplayBuffer has no upstream to pull from; use add() and sample()")
        warming_up = len(self) < self.warmup
        while len(self) < self.warmup or self._credit < self.transitions_per_yield:
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
        """Add a batch pulled from upstream (a hook for buffers that watch the upstream's stream)."""
        return self.add(batch)

    # ------------------------------------------------------------------ buffer
    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` transitions of ``batch``; returns their slots (int64 [B]).

        An add cut short (a ``KeyboardInterrupt`` between two fields of a row) is
        written again in full before the buffer is read or written again. A batch
        the storage refuses (``ValueError``/``TypeError``: a wrong shape or dtype)
        is refused before anything is written: the buffer stays as it was.
        """
        # (no storage code runs before the journal records the batch: a cut anywhere in the storage is redone)
        return self._journal.write(self._store, batch)

    def _store(self, batch: TransitionBatch) -> np.ndarray:
        """The write of one add: the rows (a subclass adds what it keeps per slot). Redone whole after a cut."""
        return self.storage.add(batch)

    def settle(self) -> None:
        """Finish an add that a cut left half done (called before every read; a no-op when none is)."""
        self._journal.settle()  # (its restore drops an add the storage journals itself: done once, here)
        if self._self_journaled:  # (an add made on the storage directly)
            cast(JournaledStorage[object], self.storage).settle()

    def _save_written(self) -> object:
        """What an add changes besides whole rows: the storage's counters (all its bookkeeping, if it says so)."""
        return storage_snapshot(self.storage)

    def _restore_written(self, saved: Any) -> None:
        restore_storage(self.storage, saved)

    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` transitions drawn uniformly with replacement, as numpy arrays [batch_size, ...]."""
        self.settle()  # a buffer filled by hand may be sampled right after an interrupted add
        self._check_batch_size(batch_size)
        if not self.replacement:
            return self.storage.gather(self._only_sampleable(self.passes.next(batch_size, len(self.storage), self.rng)))
        indices = self.rng.integers(0, len(self.storage), batch_size)
        if self._partly_sampleable:
            draw = lambda count: (self.rng.integers(0, len(self.storage), count),)  # noqa: E731
            (indices,) = redraw_unsampleable(cast(PartlySampleableStorage, self.storage).sampleable, (indices,), draw)
        return self.storage.gather(indices)

    def _only_sampleable(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` without the slots the storage cannot sample yet (all of them for an ArrayStorage)."""
        if not self._partly_sampleable:
            return indices
        sampleable: np.ndarray = indices[cast(PartlySampleableStorage, self.storage).sampleable(indices)]
        return sampleable

    def epoch(self, batch_size: int) -> Iterator[TransitionBatch]:
        """One fresh shuffled pass: every stored transition exactly once, in batches of ``batch_size``.

        The last batch holds the remainder. A pass begun by an earlier call or by
        ``sample`` without replacement is dropped. Add nothing while iterating.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.settle()
        self._check_batch_size(1)  # the buffer holds something
        self.passes.start(len(self.storage), self.rng)
        while self.passes.remaining:
            yield self.storage.gather(self._only_sampleable(self.passes.next(batch_size, len(self.storage), self.rng)))

    def _check_batch_size(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_size > len(self.storage):
            raise ValueError(
                f"cannot sample a batch of {batch_size} from a buffer holding {len(self.storage)} transitions "
                f"(capacity {self.capacity}); set warmup >= {batch_size} so sampling starts later, or lower batch_size"
            )

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1  # format of state_dict(); subclasses that extend it keep or bump it

    def state_dict(self) -> dict[str, Any]:
        """Stored transitions (tensors), cursor and RNG state: plain containers, ``weights_only``-safe."""
        self.settle()
        state = {"storage": self.storage.state_dict(), "rng": self.rng.bit_generator.state, "credit": self._credit}
        if not self.replacement:
            state["passes"] = self.passes.state_dict()
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self._journal.forget()  # the restored storage replaces whatever was being written
        self.storage.load_state_dict(state["storage"])
        self.rng.bit_generator.state = state["rng"]
        self._credit = int(state["credit"])
        if "passes" in state:
            self.passes.load_state_dict(state["passes"])

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``ReplayBuffer(size=stored/capacity, warmup=..., transitions_per_yield=...)`` and the chain upstream."""
        extra = {} if self.replacement else {"replacement": False}
        return stage_repr(self, **self._size_counters(), transitions_per_yield=self.transitions_per_yield, **extra)

    def _size_counters(self) -> dict[str, Any]:
        return {"size": f"{len(self)}/{self.capacity}", "warmup": self.warmup}


def storage_snapshot(storage: Any) -> Any:
    """What an add may change in ``storage`` and an interrupted add must roll back, taken before the add.

    A :class:`~ptl_rl.core.protocols.RollbackStorage` (a :class:`~ptl_rl.replay.FrameStorage`:
    its counters and per-env bookkeeping) gives its own; for any other (an
    :class:`~ptl_rl.replay.ArrayStorage`, whose rows are rewritten in full) the
    three counters suffice.
    """
    if implements(storage, RollbackStorage):
        return storage.snapshot()
    return (storage.cursor, storage.size, storage.total_added)


def restore_storage(storage: Any, snapshot: Any) -> None:
    """Roll ``storage`` back to ``snapshot`` (from :func:`storage_snapshot`) before writing the same batch again."""
    if implements(storage, RollbackStorage):
        storage.restore(snapshot)
    else:
        storage.cursor, storage.size, storage.total_added = snapshot


def _checked_storage(storage: Any) -> Storage:
    """``storage`` if it has every member of the :class:`~ptl_rl.core.protocols.Storage` protocol; else a TypeError."""
    if not isinstance(storage, Storage):
        raise TypeError(
            f"the storage factory returned a {type(storage).__name__}, which lacks "
            f"{', '.join(missing_members(storage, Storage))} of the "
            "ptl_rl.core.protocols.Storage protocol; pass storage=lambda capacity: MyStorage(capacity) with a class "
            "that has them all (see the protocol's documentation)"
        )
    return storage

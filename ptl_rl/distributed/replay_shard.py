"""ReplayShard: one shard of a sharded replay, a plain :class:`~ptl_rl.replay.ReplayBuffer` behind a small API.

The body of each Ray actor of :class:`~ptl_rl.distributed.ReplayShards` (and usable in-process: it imports no
Ray). It holds a buffer built by the user's factory, so every storage and draw strategy of a local buffer
works in a shard, and answers four calls: ``add`` (a writer's rows), ``stats`` (size and draw mass),
``sample`` (``count`` rows drawn as the local buffer draws them, with each row's draw weight, so that the
learner can compute probabilities over all shards) and ``update_priorities`` (the local buffer's path, stale
rows ignored by their generation stamps). A Ray actor runs its calls one at a time, so adds, draws and
updates of one shard never interleave. See ``docs/design/replay-service.md``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.core.schedules import Schedule
from ptl_rl.distributed.frame_wire import FrameAnswer, FrameDecoder, FrameMessage
from ptl_rl.replay.buffer import ReplayBuffer
from ptl_rl.replay.draws import UniformDraws, WeightedSlots
from ptl_rl.replay.feedback import to_numpy_1d
from ptl_rl.replay.frames import FrameStorage
from ptl_rl.replay.hindsight import HindsightGoals
from ptl_rl.replay.persist import load_buffer, read_manifest, save_buffer
from ptl_rl.replay.priority_draws import PrioritizedDraws, refuse_bad_priorities
from ptl_rl.replay.windows import SequenceWindows

#: The field a sharded batch adds: the shard each row was drawn from (int64 [B]); stored rows may not use it.
SHARD_FIELD = "shard"
#: The field a sharded batch adds: the incarnation of the shard each row was drawn from (int64 [B]).
INCARNATION_FIELD = "shard_incarnation"

#: ``factory() -> ReplayBuffer``: called once in each shard's process; a module-level function or a
#: ``functools.partial`` of one (Ray pickles it), building a buffer without an upstream.
BufferFactory = Callable[[], ReplayBuffer]


class ShardStats(NamedTuple):
    """What a shard holds, as of one of its answers.

    Attributes:
        size: rows stored.
        mass: the total draw weight of the shard: the sum of its draw weights
            (``(priority + eps) ** alpha`` of every drawable row for prioritized
            draws, 1 per drawable window start or step for uniform windows and
            hindsight steps) or, for plain uniform rows, ``size``.
        total_added: rows ever added (the generation stamps count these).
        incarnation: the id of the shard's process: drawn at random when the
            shard starts (62 bits), new after every restart, so the rows of
            two lives of one shard, whose generation stamps both count from
            0, are told apart.
    """

    size: int
    mass: float
    total_added: int
    incarnation: int = 0


class ShardSample(NamedTuple):
    """A shard's answer to ``sample(count)``.

    Attributes:
        batch: the ``count`` rows drawn as the shard's buffer draws them (fields
            ``[count, ...]``; ``indices`` and ``generations`` int64 [count] when the
            strategy names its slots; the local ``weights`` are dropped), ``None``
            for ``count == 0``.
        row_mass: each row's draw weight in the shard (float64 [count]): its
            probability within the shard is ``row_mass / stats.mass``.
        stats: the shard as of the draw.
    """

    batch: TransitionBatch | None
    row_mass: np.ndarray
    stats: ShardStats


class ShardInfo(NamedTuple):
    """How a shard draws (the same for every shard of one factory): ``kind`` is ``"uniform"`` or
    ``"prioritized"``; for prioritized draws the strategy's ``beta`` schedule and ``beta_clock``. ``frames``:
    whether its storage is a ``FrameStorage`` (writers then send each frame once), stacked along ``stack_axis``."""

    kind: str
    beta: Schedule | None
    beta_clock: str | None
    capacity: int
    frames: bool = False
    stack_axis: int | None = None


class ReplayShard:
    """One shard: a replay buffer from ``factory``, sampled and updated on request.

    Args:
        factory: ``factory() -> ReplayBuffer`` without an upstream, e.g.
            ``functools.partial(ptl_rl.ReplayBuffer, capacity=100_000, draws=ptl_rl.PrioritizedDraws())``
            pickled into the shard's process (so each shard gets its own strategy). Drawn
            uniformly (``UniformDraws()``), by priority (``PrioritizedDraws``), or windows and
            hindsight steps through the ``WeightedSlots`` they hold; any storage.
        shard: this shard's index, ``0 .. K - 1``.
        seed: with ``shard``, seeds the buffer's sampling generator (``None``: the factory's).
    """

    def __init__(self, factory: BufferFactory, shard: int = 0, seed: int | None = None) -> None:
        buffer = factory()
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(
                f"the shard factory must return a ptl_rl.ReplayBuffer, got {type(buffer).__name__}; pass e.g. "
                "functools.partial(ptl_rl.ReplayBuffer, capacity=100_000, draws=ptl_rl.PrioritizedDraws())"
            )
        if buffer.upstream is not None:
            raise ValueError(
                "a shard's buffer is filled by writers (ShardWriter.add), not by an upstream stage; build it "
                "with upstream=None"
            )
        self.buffer = buffer
        self.shard = int(shard)
        self.weighted = _weighted_slots(buffer)
        # a Ray restart calls __init__ again with the same arguments: a fresh id tells the two lives apart
        self.incarnation = secrets.randbits(62)
        self.foreign_updates = 0  # rows of priority updates for an earlier incarnation's rows, ignored
        self.decoders: dict[int, FrameDecoder] = {}  # per writer's channel: the pixel frames it sent
        self.dropped_rows = 0  # rows of frame messages that followed a gap in their channel
        if seed is not None:
            buffer.rng = np.random.default_rng([int(seed), self.shard])

    def info(self) -> ShardInfo:
        """How this shard draws (read once by the learner's :class:`~ptl_rl.distributed.ShardedReplay`)."""
        weighted, storage = self.weighted, self.buffer.storage
        pixels = (True, storage.stack_axis) if isinstance(storage, FrameStorage) else (False, None)
        if isinstance(weighted, PrioritizedDraws):
            return ShardInfo("prioritized", weighted.beta_schedule, weighted.beta_clock, self.buffer.capacity, *pixels)
        return ShardInfo("uniform", None, None, self.buffer.capacity, *pixels)

    def stats(self) -> ShardStats:
        """Rows stored, total draw weight, rows ever added."""
        buffer = self.buffer
        buffer.settle()
        size = len(buffer)
        mass = float(size) if self.weighted is None else self.weighted.tree.total
        return ShardStats(size, mass, int(buffer.storage.total_added), self.incarnation)

    def add(self, batch: TransitionBatch, grant: int | None = None, priorities: Numbers | None = None) -> ShardStats:
        """Store ``batch`` (``B`` rows, fields ``[B, ...]``) in this shard; returns the shard's stats after it.

        ``grant``: the rate limiter's answer to this insert (a Ray object ref
        when sent, resolved before the call runs: the call waits for it).
        ``priorities``: the rows' initial priorities (float [B], finite, ``>= 0``;
        a worker's own TD errors, as Ape-X's), stored as ``(p + eps) ** alpha``
        instead of the largest stored weight; only for plain prioritized rows
        (``PrioritizedDraws``). Refused before anything is written.
        """
        if SHARD_FIELD in batch or INCARNATION_FIELD in batch:
            raise ValueError(
                f"fields {SHARD_FIELD!r} and {INCARNATION_FIELD!r} are added to batches sampled from a sharded "
                "replay and cannot be stored; rename the agent extra"
            )
        if priorities is None:
            self.buffer.add(batch)
            return self.stats()
        draws = self.buffer.draws
        if not isinstance(draws, PrioritizedDraws):
            raise TypeError(
                f"initial priorities are for rows drawn by priority; this shard draws with {type(draws).__name__}. "
                "Build the shards with draws=ptl_rl.PrioritizedDraws(...), or write without priorities. "
                "Nothing was written."
            )
        values = to_numpy_1d(priorities, "priorities", np.float64)
        if len(values) != len(batch):
            raise ValueError(
                f"got {len(values)} initial priorities for {len(batch)} rows; pass one per row, in the batch's "
                "order. Nothing was written."
            )
        refuse_bad_priorities(values, "Nothing was written.")
        weights = draws.weights_of(values)  # (and an overflow of (p + eps) ** alpha, before the rows are written)
        slots = self.buffer.add(batch)
        draws.tree.update(slots, weights[len(weights) - len(slots) :])  # (the newest rows, if the ring wrapped)
        return self.stats()

    def add_frames(
        self, message: FrameMessage, grant: int | None = None, priorities: Numbers | None = None
    ) -> FrameAnswer:
        """Store the rows of a writer's :class:`~ptl_rl.distributed.frame_wire.FrameMessage` (each frame sent
        once), rebuilt whole: the rows :meth:`add` of the full batch stores. Rows that follow a gap in the
        writer's channel (an add lost with this shard's earlier life) cannot be rebuilt and are dropped, all of
        the message's, until the writer starts a new epoch; the answer counts them (``dropped``)."""
        decoder = self.decoders.get(message.channel)
        if decoder is None:  # (kept for this life: a channel forgotten and heard again would leave a hole in
            decoder = self.decoders[message.channel] = FrameDecoder()  # its envs' streams, refused by n-step links)
        batch = decoder.decode(message)
        if batch is None:
            self.dropped_rows += message.rows
            return FrameAnswer(self.stats(), message.rows)
        return FrameAnswer(self.add(batch, grant, priorities), 0)

    def sample(self, count: int, grant: int | None = None, seed: int | None = None) -> ShardSample:
        """``count`` rows drawn as the buffer draws them, with their draw weights and the shard's stats.

        ``grant``: the rate limiter's answer to the whole batch's sample (as for :meth:`add`).
        ``seed``: the draw's random stream is ``(seed, shard)``, so the learner
        that sent the seed decides it (each DDP rank its own, repeatable with a
        fixed seed whichever learners the shard serves in between); ``None``:
        the buffer's own generator.

        With replacement, like the local buffer; a ``count`` larger than the
        rows stored is drawn in independent draws of at most ``len(buffer)``
        rows each (a local buffer refuses a batch larger than its rows; a
        shard's share of a batch may be), so each row's probability is
        unchanged.

        A shard asked for rows while it holds nothing drawable (it restarted
        empty since the learner split the batch) answers no rows and its
        stats, as for ``count == 0``: the learner asks again with them.
        """
        stats = self.stats()
        if count <= 0 or stats.mass <= 0.0:
            return ShardSample(None, np.zeros(0), stats)
        step = max(1, stats.size)
        buffer, own = self.buffer, self.buffer.rng
        if seed is not None:  # (the buffer's strategy draws with buffer.rng: lend it the request's stream)
            buffer.rng = np.random.default_rng([int(seed), self.shard])
        try:
            parts = [buffer.sample(min(step, count - lo)) for lo in range(0, count, step)]
        finally:
            buffer.rng = own
        batch = TransitionBatch.concat(parts)
        fields = {name: value for name, value in batch.items() if name != "weights"}  # recomputed over all shards
        if self.weighted is None:
            row_mass = np.ones(count)
        else:
            row_mass = self.weighted.tree.get(fields["indices"])
        return ShardSample(TransitionBatch.wrap(fields), row_mass, stats)

    def update_priorities(
        self, indices: Numbers, priorities: Numbers, generations: Numbers | None, incarnation: int | None = None
    ) -> int:
        """Set the priorities of this shard's slots ``indices`` (int [B]); returns the stale rows ignored.

        The local buffer's path (:meth:`ptl_rl.ReplayBuffer.update_priorities`):
        ``priorities`` (float [B], finite, ``>= 0``) are stored as
        ``(priority + eps) ** alpha``; rows whose slot's stamp is no longer
        ``generations`` (int [B]) were overwritten since the draw and are skipped.
        A ``ValueError`` leaves every priority as it was. ``incarnation``: the
        shard's incarnation the rows were drawn from; another one's rows (this
        shard restarted since the draw: its slots and stamps hold other rows)
        are all skipped, counted in ``foreign_updates`` and returned as stale.
        """
        if incarnation is not None and int(incarnation) != self.incarnation:
            skipped = len(to_numpy_1d(indices, "indices", np.int64))
            self.foreign_updates += skipped
            return skipped
        return self.buffer.update_priorities(indices, priorities, generations)

    def save(self, directory: str) -> dict[str, str]:
        """Save this shard's buffer to ``directory`` (:func:`ptl_rl.replay.save_buffer`, atomic; a save there
        before is replaced); returns ``{"directory": absolute path, "save_id": ...}``, what a checkpoint keeps."""
        save_buffer(self.buffer, directory)
        return {"directory": os.path.abspath(directory), "save_id": str(read_manifest(directory)["save_id"])}

    def load(self, directory: str, save_id: str | None = None) -> ShardStats:
        """Replace this shard's rows by the save in ``directory`` (refused if it is not save ``save_id``); the
        shard takes a new incarnation, so updates of rows drawn before are ignored. Returns its stats."""
        read_manifest(directory, save_id)  # (raises naming the problem: no save, another save, a partial one)
        load_buffer(self.buffer, directory)
        self.incarnation = secrets.randbits(62)
        return self.stats()

    def priorities(self, indices: Numbers | None = None) -> np.ndarray:
        """The draw weights (float64) of the slots ``indices``, or of every stored slot (for checks)."""
        if self.weighted is None:
            size = len(self.buffer) if indices is None else len(to_numpy_1d(indices, "indices", np.int64))
            return np.ones(size)
        if indices is None:
            return self.weighted.tree.leaves[: len(self.buffer)].copy()
        return self.weighted.tree.get(to_numpy_1d(indices, "indices", np.int64))

    def rows(self, indices: Numbers) -> TransitionBatch:
        """The stored rows at the slots ``indices`` (int [B]), as they are now (for checks)."""
        self.buffer.settle()
        return self.buffer.storage.gather(to_numpy_1d(indices, "indices", np.int64))

    def counters(self) -> Mapping[str, int]:
        """The strategy's update counters (``stale_updates``, ``applied_updates``; empty for uniform draws)."""
        weighted = self.weighted
        if isinstance(weighted, PrioritizedDraws):
            return {
                "stale_updates": weighted.stale_updates,
                "applied_updates": weighted.applied_updates,
                "foreign_updates": self.foreign_updates,
            }
        return {}


def _weighted_slots(buffer: ReplayBuffer) -> WeightedSlots | None:
    """The weights a buffer's draws follow (``None``: plain uniform rows, every stored row weighs 1)."""
    draws = buffer.draws
    if isinstance(draws, PrioritizedDraws):
        return draws
    if isinstance(draws, (SequenceWindows, HindsightGoals)):
        return draws.draws  # the weights of the window starts / the steps of complete episodes
    if isinstance(draws, UniformDraws):
        if not draws.replacement:
            raise ValueError(
                "a shard draws with replacement (its share of each batch is drawn independently); passes "
                "without replacement over all shards are not supported: use UniformDraws() in the factory"
            )
        return None
    raise TypeError(
        f"a shard cannot weigh the draws of {type(draws).__name__} against other shards: it needs each row's "
        "draw weight. Use UniformDraws, PrioritizedDraws, SequenceWindows or HindsightGoals"
    )

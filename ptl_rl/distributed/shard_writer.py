"""ShardWriter: inserts rows straight into the replay shards, each env's stream into one shard.

The routing rule, in one place (:func:`shard_of`): a row of env ``env_id`` goes to shard ``env_id % K``. Env ids
are distinct across the workers, their restarts and DDP ranks (``WorkerInfo.rank`` offsets them), so each env's
stream lands whole on one shard, in the order it was written: n-step windows are folded before the insert and
sequence windows and hindsight episodes are built inside one shard, never across two. A writer holds only the
shards' actor handles and is picklable: pass it to a collector (a Ray actor, a process, a factory) to write
without going through the learner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.distributed.frame_wire import FrameAnswer, FrameEncoder, FrameWire, new_channel
from ptl_rl.replay.feedback import to_numpy_1d
from ptl_rl.replay.priority_draws import refuse_bad_priorities

#: A field a collector's pipeline may attach to its batches (float [B]): each row's initial priority (Ape-X's
#: worker-side priorities, e.g. the collector's own TD errors). :meth:`ShardWriter.add` takes it out of the batch
#: and stores the rows with it (the field itself is not stored).
INITIAL_PRIORITY_FIELD = "initial_priority"


class ShardWrites(NamedTuple):
    """What a collector that writes to the shards itself reports for one call, instead of its rows.

    :class:`~ptl_rl.distributed.RayWorkers` with ``shards=`` yields one per
    worker call; :class:`~ptl_rl.distributed.ShardedReplay` takes ``rows`` as
    the credit its upstream's batch would have given.

    Its fields: ``rows``, the rows the call stored in the shards (every add
    answered); ``env_steps``, the env steps the call took; ``episodes``, the
    episodes the call finished; ``dropped``, the rows its writer dropped (adds
    in flight to a shard that died: not stored, not retried).
    """

    rows: int
    env_steps: int
    episodes: int
    dropped: int = 0


def ray_module() -> Any:
    """The ``ray`` module, imported on first use (``pip install 'ptl_rl[ray]'``)."""
    try:
        import ray  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise ImportError(
            "the sharded replay needs Ray, which ptl_rl does not install by default: pip install 'ptl_rl[ray]'"
        ) from exc
    return ray


def shard_of(env_id: np.ndarray, num_shards: int) -> np.ndarray:
    """The shard of each row: ``env_id % num_shards`` (int64 [B] from ``env_id`` int [B]).

    Every row of one env goes to one shard, so the windows and episodes a
    shard's strategy builds from an env's stream are whole.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    ids = np.asarray(env_id)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"env_id must be integers of shape [B]; got {ids.dtype} of shape {ids.shape}")
    shards: np.ndarray = np.mod(ids, num_shards).astype(np.int64, copy=False)
    return shards


def split_by_shard(batch: TransitionBatch, num_shards: int) -> list[tuple[int, TransitionBatch]]:
    """``batch`` cut into one batch per shard that gets rows (rows of a shard keep their order)."""
    if "env_id" not in batch:
        raise ValueError(
            "a batch written to the shards needs env_id (int [B]), which routes each env's rows to one shard; "
            f"batches from ExperienceSource and NStepTransform carry it. Fields given: {sorted(batch.keys())}"
        )
    shards = shard_of(batch["env_id"], num_shards)
    if len(shards) == 0:
        return []
    first = int(shards[0])
    if (shards == first).all():  # the common case of one env per writer: no copy
        return [(first, batch)]
    order = np.argsort(shards, kind="stable")
    bounds = np.searchsorted(shards[order], np.arange(num_shards + 1))
    return [
        (shard, batch.rows(order[bounds[shard] : bounds[shard + 1]]))
        for shard in range(num_shards)  # a loop over shards, not rows
        if bounds[shard + 1] > bounds[shard]
    ]


class ShardWriter:
    """Writes transition batches into the shards, ``env_id % K`` deciding the shard of each row.

    Args:
        handles: the shards' Ray actor handles, in shard order (``ReplayShards.handles``).
        max_in_flight: adds sent and not yet answered before :meth:`add` waits
            for the oldest (backpressure: a writer cannot run unboundedly ahead
            of a slow shard, or of a rate limit).
        limiter: the shards' rate limiter actor (``ReplayShards.limiter``), or
            ``None``: each add then waits in Ray, not in the writer, until its
            rows may be written.
        frames: a :class:`~ptl_rl.distributed.frame_wire.FrameWire` when the
            shards store pixel rows in a ``FrameStorage``: each shard's rows
            then travel with each frame once (``obs``/``next_obs`` arrays
            ``[B, *obs_shape]``; Dict observations travel whole), and the shard
            rebuilds them whole (``ReplayShards.writer`` sets it). ``None``: full rows.

    Adds are asynchronous: :meth:`add` sends and returns; :meth:`flush` waits
    until every add sent has been stored and raises the first error a shard
    gave (a batch it refused: wrong shape, dtype, or a reserved field; the
    shard is left as it was, as a local buffer is). An add in flight to a
    shard that died is dropped, not retried (counted in ``rows_dropped``;
    ``rows_stored`` counts the adds answered): the shard restarts empty, and
    later adds go to its new life. With ``frames``, the rows of frame messages
    sent after a lost one cannot be rebuilt: the shard drops them (counted in
    ``rows_dropped``) until this writer, told so by the answer or by the lost
    add's error, starts the shard's channel again with every frame it needs.
    Picklable: a collector that receives it writes to the shards directly
    (each copy a channel of its own).
    """

    def __init__(
        self,
        handles: Sequence[object],
        max_in_flight: int = 8,
        limiter: object | None = None,
        frames: FrameWire | None = None,
    ) -> None:
        if not handles:
            raise ValueError("a ShardWriter needs the handles of at least one shard")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.handles = list(handles)
        self.max_in_flight = int(max_in_flight)
        self.limiter = limiter
        self.rows_written = 0  # rows sent
        self.rows_stored = 0  # rows whose add a shard answered
        self.rows_dropped = 0  # rows of adds in flight to a shard that died: not stored, not retried
        self.frames = frames
        channel = new_channel()  # (a copy of a writer, and a restarted one, is a channel of its own)
        self._encoders = (
            [] if frames is None else [FrameEncoder(channel, frames.stack_axis, frames.window) for _ in handles]
        )
        # (object ref, rows, shard, the frame channel's epoch or -1) of adds sent, oldest first
        self._in_flight: list[tuple[Any, int, int, int]] = []
        self._last_grant: Any = None  # the rate limiter's grant of the last add

    @property
    def num_shards(self) -> int:
        return len(self.handles)

    def add(self, batch: TransitionBatch, priorities: Numbers | None = None) -> int:
        """Send the rows of ``batch`` (fields ``[B, ...]``, ``env_id`` int [B]) to their shards; returns ``B``.

        ``priorities``: each row's initial priority (float [B], numpy or torch,
        finite, ``>= 0``), stored as ``(p + eps) ** alpha`` instead of the
        largest stored weight (shards of ``PrioritizedDraws`` rows only: another
        shard refuses the add). Also taken from the batch's
        :data:`INITIAL_PRIORITY_FIELD`, which is then not stored (how a
        ``RayWorkers`` factory's pipeline gives them). Bad values raise a
        ``ValueError`` here, before anything is sent.
        """
        if INITIAL_PRIORITY_FIELD in batch:  # (a collector's pipeline attached them)
            if priorities is not None:
                raise ValueError(
                    f"the batch carries {INITIAL_PRIORITY_FIELD!r} and add() was given priorities too; give them "
                    "once. Nothing was sent."
                )
            batch, priorities = _take_priorities(batch)
        if priorities is not None:
            batch = _with_priorities(batch, priorities)
        parts = split_by_shard(batch, self.num_shards)
        handles: list[Any] = self.handles
        limiter: Any = self.limiter
        grant = None
        if limiter is not None and parts:  # granted in this writer's order (see RateLimiter.insert)
            grant = self._last_grant = limiter.insert.remote(len(batch), self._last_grant)
        for shard, rows in parts:
            rows, part = _take_priorities(rows) if priorities is not None else (rows, None)
            if self._encoders and isinstance(rows["obs"], np.ndarray) and isinstance(rows["next_obs"], np.ndarray):
                encoder = self._encoders[shard]
                ref = handles[shard].add_frames.remote(encoder.encode(rows), grant, part)
                self._in_flight.append((ref, len(rows), shard, encoder.epoch))
            else:
                self._in_flight.append((handles[shard].add.remote(rows, grant, part), len(rows), shard, -1))
        excess = len(self._in_flight) - self.max_in_flight
        if excess > 0:
            self._collect(excess)
        self.rows_written += len(batch)
        return len(batch)

    def flush(self) -> None:
        """Wait until every add sent is stored; raises the first error a shard gave."""
        self._collect(len(self._in_flight))

    def _collect(self, count: int) -> None:
        """Wait for the ``count`` oldest adds (Ray runs one caller's calls to an actor in order)."""
        done, self._in_flight = self._in_flight[:count], self._in_flight[count:]
        if not done:
            return
        ray = ray_module()
        try:
            answers: list[Any] = ray.get([ref for ref, *_ in done])
        except ray.exceptions.RayActorError:  # a shard died: its adds in flight are dropped, the others counted
            answers = []
            for ref, rows, shard, epoch in done:
                try:
                    answers.append(ray.get(ref))
                except ray.exceptions.RayActorError:
                    answers.append(FrameAnswer(None, rows))
                    self._lost(shard, epoch)
        for (_, rows, shard, epoch), answer in zip(done, answers, strict=True):
            dropped = answer.dropped if isinstance(answer, FrameAnswer) else 0
            if dropped:  # (rows after a gap in the frame channel: start it again)
                self._lost(shard, epoch)
            self.rows_dropped += dropped
            self.rows_stored += rows - dropped

    def _lost(self, shard: int, epoch: int) -> None:
        """An add of ``epoch`` to ``shard`` was lost: the shard's channel starts again, once per epoch."""
        if self._encoders and self._encoders[shard].epoch == epoch:
            self._encoders[shard].reset()

    def __getstate__(self) -> dict[str, Any]:
        # (the adds in flight stay with the sender)
        return {
            "handles": self.handles,
            "max_in_flight": self.max_in_flight,
            "limiter": self.limiter,
            "frames": self.frames,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["handles"], state["max_in_flight"], state["limiter"], state.get("frames"))  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ShardWriter(shards={self.num_shards}, rows_written={self.rows_written})"


def _take_priorities(batch: TransitionBatch) -> tuple[TransitionBatch, Any]:
    """``batch`` without its :data:`INITIAL_PRIORITY_FIELD`, and the values that field held."""
    fields = dict(batch.items())
    values = fields.pop(INITIAL_PRIORITY_FIELD)
    return TransitionBatch.wrap(fields), values


def _with_priorities(batch: TransitionBatch, priorities: Numbers) -> TransitionBatch:
    """``batch`` with ``priorities`` (checked: float64 [B], finite, ``>= 0``) as its :data:`INITIAL_PRIORITY_FIELD`,
    so that they are routed with their rows."""
    values = to_numpy_1d(priorities, "priorities", np.float64)
    if len(values) != len(batch):
        raise ValueError(
            f"got {len(values)} initial priorities for {len(batch)} rows; pass one per row, in the batch's order. "
            "Nothing was sent."
        )
    refuse_bad_priorities(values, "Nothing was sent.")
    return TransitionBatch.wrap({**dict(batch.items()), INITIAL_PRIORITY_FIELD: values})

"""Pixel rows on the wire, each frame once: a writer's encoder per shard, the shard's decoder per writer.

A pixel transition holds ``obs`` and ``next_obs``, each a stack of ``S`` frames, and consecutive transitions of
one env share all but one of them (n-step windows too: ``next_obs`` of row ``t`` is ``obs`` of row ``t + n``).
The writer's :class:`FrameEncoder` (one per shard) keeps the last ``window`` frames it sent to that shard and
sends each row's stacks as references to them (:class:`FrameMessage`): a frame it sent before, byte for byte, is
not sent again. The shard's :class:`FrameDecoder` (one per writer, its *channel*) keeps the same frames and
rebuilds the full rows, which the shard adds to its buffer as if they had been sent whole: the stored rows are
byte-identical, whatever the storage.

Frames are found by content (a 64-bit hash of their bytes, then a byte comparison), not by the stream's
structure, so n-step windows, episode starts and ends, final observations, autoreset and several envs per writer
need no case of their own. A message carries its channel's ``epoch`` and the number of its first new frame; a
decoder that sees a number it does not expect (an add lost with a shard that died, or the first add of a
restarted shard's life) drops the message's rows and every later one of that epoch, and answers so: the writer
then starts a new epoch, whose first message sends every frame it references. See
``docs/design/replay-service.md``.
"""

from __future__ import annotations

import secrets
from typing import Any, NamedTuple

import numpy as np

from ptl_rl.core.batch import TransitionBatch

#: frames an encoder keeps (and the shard's decoder of its channel): 1.8 MB each for 84x84 uint8 frames; a frame
#: must outlive about (n + S) rows of each env of the writer on the shard (n=3, S=4: 36 envs per writer and shard)
DEFAULT_WINDOW = 256

_MULTIPLIERS = np.random.default_rng(0x5EED).integers(1, 2**63, size=1 << 16, dtype=np.uint64) | np.uint64(1)


class FrameWire(NamedTuple):
    """How a writer sends pixel rows: the shards' ``FrameStorage``'s ``stack_axis`` and the frames each side
    keeps per channel (``window``)."""

    stack_axis: int | None
    window: int = DEFAULT_WINDOW


class FrameMessage(NamedTuple):
    """One add of pixel rows to one shard, each frame sent at most once per channel.

    Attributes:
        channel: the writer's id (62 random bits, new for every writer object, a restarted one included).
        epoch: the channel's epoch; a new one starts with no frame known to either side.
        start: the number, within the epoch, of the first frame of ``frames``.
        window: frames both sides keep; a reference is to one of the last ``window`` frames before ``start``
            or to ``frames``.
        frames: the frames sent now, ``[N, *frame_shape]`` in the observations' dtype.
        refs: int64 ``[2, B, S]``: the frame numbers of each row's ``obs`` (``refs[0]``) and ``next_obs``
            (``refs[1]``) stacks, oldest first.
        stack_axis: the axis of an observation along which its ``S`` frames are stacked (``None``: one frame).
        fields: the rows' other fields (``B`` rows; no ``obs``, ``next_obs``).
    """

    channel: int
    epoch: int
    start: int
    window: int
    frames: np.ndarray
    refs: np.ndarray
    stack_axis: int | None
    fields: TransitionBatch

    @property
    def rows(self) -> int:
        """``B``, the rows of the message (a tuple's ``len`` stays its fields')."""
        return int(self.refs.shape[1])


class FrameAnswer(NamedTuple):
    """A shard's answer to a :class:`FrameMessage`: ``stats`` (its :class:`ShardStats` after the add) and the rows
    it could not rebuild and dropped (``dropped``: all of the message's, or none)."""

    stats: Any
    dropped: int


def frame_hashes(frames: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each frame's bytes (uint64 [F] from ``[F, L]`` uint8), equal for equal bytes.

    A weighted sum of the 64-bit words with random odd weights: one vectorized pass. Distinct frames may share a
    hash; callers compare the bytes of every match.
    """
    count, length = frames.shape
    if length % 8:
        frames = np.concatenate([frames, np.zeros((count, 8 - length % 8), dtype=np.uint8)], axis=1)
    words = frames.view(np.uint64)
    width = words.shape[1]
    weights = _MULTIPLIERS[np.arange(width) % len(_MULTIPLIERS)]
    with np.errstate(over="ignore"):
        hashed: np.ndarray = (words * weights).sum(axis=1, dtype=np.uint64)
        hashed ^= hashed >> np.uint64(29)
    return hashed


def stacks_as_frames(obs: np.ndarray, stack_axis: int | None) -> np.ndarray:
    """``obs`` ``[B, *obs_shape]`` as its frames ``[B, S, *frame_shape]`` (a copy only when not contiguous)."""
    if stack_axis is None:
        return obs[:, None]
    return np.ascontiguousarray(np.moveaxis(obs, stack_axis % (obs.ndim - 1) + 1, 1))


def frames_as_stacks(frames: np.ndarray, stack_axis: int | None) -> np.ndarray:
    """The inverse of :func:`stacks_as_frames`: ``[B, S, *frame_shape]`` back to ``[B, *obs_shape]`` (contiguous)."""
    if stack_axis is None:
        return frames[:, 0]
    return np.ascontiguousarray(np.moveaxis(frames, 1, stack_axis % (frames.ndim - 1) + 1))


class FrameEncoder:
    """The writer's side of one channel to one shard: the last ``window`` frames sent, found by content.

    Args:
        channel: the writer's id.
        stack_axis: the axis of an observation along which frames are stacked (the shards' ``FrameStorage``'s).
        window: frames kept; a frame sent more than ``window`` frames ago is sent again.
    """

    def __init__(self, channel: int, stack_axis: int | None, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"the frame window must be >= 1 frame, got {window}")
        self.channel, self.stack_axis, self.window = int(channel), stack_axis, int(window)
        self.epoch = -1
        self.reset()

    def reset(self) -> None:
        """Start a new epoch: no frame is known to the shard, the next message sends every frame it references."""
        self.epoch += 1
        self.sent = 0  # frames sent in this epoch: frame p sits at ring[p % window] while p >= sent - window
        self.ring: np.ndarray | None = None  # [window, L] uint8, allocated by the first message
        self.ring_hash = np.zeros(self.window, dtype=np.uint64)
        self.ring_seq = np.full(self.window, -1, dtype=np.int64)

    def encode(self, batch: TransitionBatch) -> FrameMessage:
        """``batch`` (``obs``/``next_obs`` arrays ``[B, *obs_shape]``) as a message that sends only new frames."""
        obs, next_obs = np.asarray(batch["obs"]), np.asarray(batch["next_obs"])
        stacked = stacks_as_frames(np.concatenate([obs, next_obs]), self.stack_axis)  # [2B, S, *frame]
        frame_shape = stacked.shape[2:]
        length = int(np.prod(frame_shape, dtype=np.int64))
        flat = stacked.reshape(stacked.shape[0] * stacked.shape[1], length).view(np.uint8)  # [F, L] bytes
        if self.ring is not None and self.ring.shape[1] != flat.shape[1]:
            raise ValueError(
                f"frames of {flat.shape[1]} bytes after frames of {self.ring.shape[1]}: the observations of one "
                "writer's pixel rows must keep their shape and dtype"
            )
        hashes = frame_hashes(flat)
        # each frame's first equal in the batch (equal hash and bytes); a hash shared by unequal frames keeps both
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        rep = first[inverse.reshape(-1)]
        rep = np.where((flat == flat[rep]).all(axis=1), rep, np.arange(len(flat)))
        heads = np.flatnonzero(rep == np.arange(len(flat)))  # the distinct frames, in order
        ref_of_head = self._known(flat[heads], hashes[heads])
        new = heads[ref_of_head < 0]
        ref_of_head[ref_of_head < 0] = self.sent + np.arange(len(new))
        refs = np.empty(len(flat), dtype=np.int64)
        refs[heads] = ref_of_head
        refs = refs[rep]
        start = self.sent
        self._remember(flat[new], hashes[new])
        fields = {name: value for name, value in batch.items() if name not in ("obs", "next_obs")}
        return FrameMessage(
            self.channel,
            self.epoch,
            start,
            self.window,
            stacked.reshape(-1, *frame_shape)[new],
            refs.reshape(2, len(obs), stacked.shape[1]),
            self.stack_axis,
            TransitionBatch.wrap(fields),
        )

    def _known(self, frames: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """The frame number of each of ``frames`` (distinct) among those kept, -1 where it is not kept."""
        found = np.full(len(frames), -1, dtype=np.int64)
        if self.ring is None:
            return found
        kept = np.flatnonzero(self.ring_seq >= 0)
        if not len(kept):
            return found
        order = kept[np.argsort(self.ring_hash[kept], kind="stable")]
        slot = order[np.minimum(np.searchsorted(self.ring_hash[order], hashes), len(order) - 1)]
        hit = np.flatnonzero(self.ring_hash[slot] == hashes)
        hit = hit[(self.ring[slot[hit]] == frames[hit]).all(axis=1)]
        found[hit] = self.ring_seq[slot[hit]]
        return found

    def _remember(self, frames: np.ndarray, hashes: np.ndarray) -> None:
        if self.ring is None:
            self.ring = np.zeros((self.window, frames.shape[1]), dtype=np.uint8)
        count = len(frames)
        seqs = self.sent + np.arange(count)
        keep = slice(max(0, count - self.window), count)  # (a message of more new frames than the window)
        slots = seqs[keep] % self.window
        self.ring[slots], self.ring_hash[slots], self.ring_seq[slots] = frames[keep], hashes[keep], seqs[keep]
        self.sent += count


class FrameDecoder:
    """The shard's side of one writer's channel: the frames of the epoch received, rebuilding each row whole."""

    def __init__(self) -> None:
        self.epoch = -1
        self.received = 0  # frames received in this epoch
        self.broken = True  # until an epoch's first message: frames of this epoch are missing
        self.ring: np.ndarray | None = None

    def decode(self, message: FrameMessage) -> TransitionBatch | None:
        """The full rows of ``message`` (``obs``/``next_obs`` rebuilt), or ``None`` when it follows a gap.

        A gap: the message's first frame is not the next one of its epoch (an earlier message was lost), or a
        later message of an epoch already found broken; its rows cannot be rebuilt until the writer starts a new
        epoch. Refs outside what was sent raise ``ValueError``: a message that no encoder made.
        """
        if message.epoch != self.epoch:
            if message.epoch < self.epoch:  # (Ray delivers one caller's calls in order: not from this channel)
                raise ValueError(f"channel {message.channel}: epoch {message.epoch} after epoch {self.epoch}")
            self.epoch, self.received, self.ring = message.epoch, 0, None
            self.broken = message.start != 0
        elif message.start != self.received:
            self.broken = True
        if self.broken:
            return None
        frames, window = message.frames, message.window
        count = len(frames)
        flat = frames.reshape(count, -1).view(np.uint8) if count else np.zeros((0, 0), dtype=np.uint8)
        refs = message.refs.reshape(-1)
        lo, start = max(0, message.start - window), message.start
        if refs.size and (refs.min() < lo or refs.max() >= start + count):
            raise ValueError(
                f"channel {message.channel}: a frame reference outside [{lo}, {start + count}), what was sent"
            )
        if refs.size and refs.min() < start and (self.ring is None or self.ring.shape[0] != window):
            raise ValueError(f"channel {message.channel}: a reference to frames before the window of {window}")
        old = refs < start
        frame_shape = message.frames.shape[1:]
        out = np.empty((refs.size, int(np.prod(frame_shape, dtype=np.int64)) * frames.dtype.itemsize), np.uint8)
        if count:
            out[~old] = flat[refs[~old] - start]
        if old.any():
            assert self.ring is not None
            out[old] = self.ring[refs[old] % window]
        if count:  # the frames received, for later messages (after the references to the older ones were read)
            if self.ring is None:
                self.ring = np.zeros((window, flat.shape[1]), dtype=np.uint8)
            seqs = start + np.arange(max(0, count - window), count)
            self.ring[seqs % window] = flat[seqs - start]
        self.received = start + count
        stacks = out.view(frames.dtype).reshape(2, message.rows, message.refs.shape[2], *frame_shape)
        rows = dict(message.fields.items())
        rows["obs"] = frames_as_stacks(stacks[0], message.stack_axis)
        rows["next_obs"] = frames_as_stacks(stacks[1], message.stack_axis)
        return TransitionBatch.wrap(rows)


def new_channel() -> int:
    """A fresh channel id (62 random bits)."""
    return secrets.randbits(62)

"""The frame pool of a FrameStorage: one ring of frames, stacks stored as rows of absolute frame positions.

Frame ``p`` (an absolute position) lives at ``p % size`` and is still pooled iff ``p >= written - size``.
This module writes frames (deduplicating a stack against the env's previous one and against itself), says
which references survive, and rebuilds stacks from references. It knows frames only: which env a stack
belongs to, and which transition refers to it, is the links' business (``links.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptl_rl.replay.memmap import open_fresh_memmap


def frames_of(obs: np.ndarray, axis: int | None) -> np.ndarray:
    """``obs`` [B, *obs_shape] as ``[B, S, *frame]`` (a view), its stack along ``axis`` of an observation."""
    if axis is None:
        return obs[:, None]
    return np.moveaxis(obs, 1 + axis, 1) if axis else obs


def rows_bitwise_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise equality of each row of ``a`` and ``b`` (same shape and dtype, [R, ...]) as bool [R].

    Bytes, not values: NaN equals a NaN of the same bits, and -0.0 differs from 0.0 (what a frame pool
    needs: a stack rebuilt from shared frames is bit-identical to the one added).
    """
    rows = a.shape[0]
    # (copying strided inputs to contiguous ones first is faster than comparing strided word views)
    a = np.ascontiguousarray(a).reshape(rows, -1).view(np.uint8)
    b = np.ascontiguousarray(b).reshape(rows, -1).view(np.uint8)
    width = a.shape[1]
    for word in (np.uint64, np.uint32, np.uint16):  # compare wide words: 8x fewer elements for uint8 frames
        if width % np.dtype(word).itemsize == 0:
            a, b = a.view(word), b.view(word)
            break
    equal: np.ndarray = (a == b).all(axis=1)
    return equal


def frame_layout(
    stack_axis: int | None, obs_shape: tuple[int, ...], pool_size: int
) -> tuple[int | None, int, tuple[int, ...]]:
    """(stack axis within an observation or ``None``, stack depth S, frame shape) of observations ``obs_shape``.

    Raises for a ``stack_axis`` the observations do not have, and for a pool that cannot hold one stack.
    """
    if stack_axis is None:
        return None, 1, tuple(obs_shape)
    ndim = len(obs_shape)
    if not -ndim <= stack_axis < ndim:
        raise ValueError(
            f"stack_axis={stack_axis} is not an axis of observations of shape {obs_shape}; pass "
            "the axis along which frames are stacked (0 for gymnasium's FrameStackObservation), or None"
        )
    axis = stack_axis % ndim
    stack = obs_shape[axis]
    if stack > pool_size:
        raise ValueError(f"a stack of {stack} frames does not fit the pool of {pool_size} frames; raise extra_frames")
    return axis, stack, tuple(obs_shape[:axis] + obs_shape[axis + 1 :])


def open_array(memmap_dir: str | None, name: str, shape: tuple[int, ...], dtype: Any, fill: int) -> np.ndarray:
    """A zero/``fill`` array, in RAM (``memmap_dir=None``) or as a memory-mapped file ``memmap_dir/name.npy``."""
    if memmap_dir is None:
        return np.full(shape, fill, dtype=dtype) if fill else np.zeros(shape, dtype=dtype)
    return open_fresh_memmap(memmap_dir, name, shape, dtype, fill)


class FramePool:
    """The frame ring of a :class:`~ptl_rl.replay.FrameStorage`.

    Args:
        size: frames the ring holds (the storage's ``capacity + extra_frames``).
        memmap_dir: keep the ring in ``memmap_dir/pool.npy`` (``None``: in RAM).

    Attributes:
        frames: the ring ``[size, *frame_shape]`` in the observations' dtype; ``None`` until :meth:`allocate`.
        watermark: int64 [1], the absolute position of the next frame (:attr:`written`); an array, so that
            the compiled insert advances it in the call that writes the frames.
        axis: the stack axis within an observation (``None``: an observation is one frame).
        stack: frames per observation (S).
        frame_shape: the shape of one frame.
    """

    def __init__(self, size: int, memmap_dir: str | None) -> None:
        self.size = size
        self.memmap_dir = memmap_dir
        self.frames: np.ndarray | None = None
        self.watermark = np.zeros(1, dtype=np.int64)
        self.axis: int | None = None
        self.stack = 1
        self.frame_shape: tuple[int, ...] = ()

    @property
    def written(self) -> int:
        """Frames written since the pool was allocated: frame ``p`` is pooled iff ``p >= written - size``."""
        return int(self.watermark[0])

    @written.setter
    def written(self, value: int) -> None:
        self.watermark[0] = value

    def allocate(self, axis: int | None, stack: int, frame_shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Allocate the ring for frames of ``frame_shape`` and ``dtype``, ``stack`` to an observation."""
        frames = open_array(self.memmap_dir, "pool", (self.size, *frame_shape), dtype, 0)
        self.axis, self.stack, self.frame_shape = axis, stack, tuple(frame_shape)
        self.frames = frames

    def ring(self) -> np.ndarray:
        """The ring, allocated (every caller runs after the first batch allocated it)."""
        assert self.frames is not None
        return self.frames

    def as_frames(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` [B, *obs_shape] as ``[B, S, *frame]`` (a view)."""
        return frames_of(obs, self.axis)

    def floor(self, writes_ahead: int = 0) -> int:
        """The oldest position still pooled after ``writes_ahead`` more frame writes."""
        return max(int(self.watermark[0]) + writes_ahead - self.size, 0)

    def alive(self, refs: np.ndarray, writes_ahead: int) -> np.ndarray:
        """Rows of ``refs`` (int64 [R, S]) whose frames survive ``writes_ahead`` more frame writes (bool [R])."""
        alive: np.ndarray = refs.min(axis=1) >= self.floor(writes_ahead)
        return alive

    def write(self, frames: np.ndarray, arange: np.ndarray | None = None) -> np.ndarray:
        """Append ``frames`` [m, *frame] to the ring; returns their absolute positions (int64 [m]).

        The watermark is advanced *before* the ring changes and never goes back: a frame about to be
        overwritten no longer counts as pooled, so no reader rebuilds a stack from a frame half rewritten,
        and a write done again takes new positions. ``arange``: a cached ``0 .. k-1`` (k >= m) to add the
        first position to instead of a new ``arange``.
        """
        count, pool = len(frames), self.ring()
        if count > self.size:
            raise ValueError(
                f"a batch needs {count} new frames but the pool holds {self.size}; raise capacity or extra_frames"
            )
        first_position = int(self.watermark[0])
        self.watermark[0] = first_position + count
        start = first_position % self.size
        first = min(count, self.size - start)
        pool[start : start + first] = frames[:first]
        if first < count:
            pool[: count - first] = frames[first:]
        if arange is not None and count <= len(arange):
            return arange[:count] + first_position
        return np.arange(first_position, first_position + count)

    def insert_stacks(
        self, prev: np.ndarray, frames: np.ndarray, trust: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Write the frames of stacks ``frames`` [R, S, *frame] not already pooled; their references int64 [R, S].

        A stack whose ``S - 1`` oldest frames equal the newest ones of ``prev``
        (the env's previous stack, int64 [R, S], -1 for none) continues it and
        writes one frame; any other stack writes each frame that differs from
        the next one in the stack. Rows whose ``trust`` (int [R]) is 1 are
        taken to continue without comparing. Also returns which rows
        continued their ``prev`` (bool [R]).
        """
        count, stack, pool = frames.shape[0], self.stack, self.ring()
        if stack == 1:  # nothing to share between consecutive observations
            return self.write(frames[:, 0])[:, None], np.zeros(count, dtype=bool)
        floor = self.floor(count * stack)  # frames from here survive this insert
        if trust is not None and prev.min() >= floor and trust.all():  # the trusted step: no comparison
            cont = np.ones(count, dtype=bool)
        else:
            alive = prev.min(axis=1) >= floor
            known = alive & (trust == 1) if trust is not None else np.zeros(count, dtype=bool)
            check = alive & ~known
            cont = known
            if check.all():  # the common checked step: no row selection (each would copy the stacks)
                cont = rows_bitwise_equal(pool.take(prev[:, 1:] % self.size, axis=0), frames[:, :-1])
            elif check.any():
                a = np.flatnonzero(check)
                old = pool.take(prev[a, 1:] % self.size, axis=0)
                cont = known.copy()
                cont[a] = rows_bitwise_equal(old, frames[a, :-1])
        if cont.all():  # the common step: one new frame per stack
            newest = self.write(frames[:, -1])
            return np.concatenate([prev[:, 1:], newest[:, None]], axis=1), cont
        written = np.ones((count, stack), dtype=bool)
        frame = self.frame_shape
        repeats = rows_bitwise_equal(frames[:, :-1].reshape(-1, *frame), frames[:, 1:].reshape(-1, *frame))
        written[:, :-1] = ~repeats.reshape(count, stack - 1)
        written[cont, :-1] = False
        positions = np.full((count, stack), np.iinfo(np.int64).max, dtype=np.int64)
        positions[written] = self.write(frames[written])
        # each frame refers to the nearest written frame at or after it in its stack (an equal one)
        refs = np.minimum.accumulate(positions[:, ::-1], axis=1)[:, ::-1].copy()
        refs[cont, :-1] = prev[cont, 1:]
        return refs, cont

    def equal_to(self, refs: np.ndarray, stacks: np.ndarray) -> np.ndarray:
        """Whether the pooled stacks ``refs`` (int64 [R, S]) are, bit for bit, ``stacks`` [R, S, *frame] (bool [R])."""
        return rows_bitwise_equal(self.ring().take(refs % self.size, axis=0), stacks)

    def stacks(self, refs: np.ndarray) -> np.ndarray:
        """Observations ``[*I, *obs_shape]`` from frame references ``[*I, S]``."""
        frames = self.ring().take(refs % self.size, axis=0)  # [*I, S, *frame]
        lead = refs.ndim - 1
        if self.axis is None:
            return frames.reshape(*refs.shape[:-1], *self.frame_shape)
        return np.moveaxis(frames, lead, lead + self.axis) if self.axis else frames

    def nbytes(self) -> int:
        """Bytes of the ring (0 before allocation)."""
        return 0 if self.frames is None else int(self.frames.nbytes)

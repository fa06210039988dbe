"""The frame pool of a FrameStorage: one ring of frames, stacks stored as rows of absolute frame positions.

Frame ``p`` (an absolute position) lives at ``p % pool_size`` and is still pooled iff
``p >= frames_written - pool_size``. This module writes frames (deduplicating a stack against the env's
previous one and against itself), says which references survive, and rebuilds stacks from references.
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


class FramePool:
    """The frame ring of a :class:`~ptl_rl.replay.FrameStorage` (the first layer of its class).

    ``frames_written`` (the watermark: the absolute position of the next frame) is kept in a one-element
    int64 array, ``_written``, so that the compiled insert advances it in the same call that writes the
    frames, as :meth:`_write_frames` advances it before writing them.
    """

    capacity: int
    stack_axis: int | None
    pool_size: int
    memmap_dir: str | None
    pool: np.ndarray | None  # [pool_size, *frame]
    _written: np.ndarray  # int64 [1]: frames_written
    obs_dtype: np.dtype | None
    obs_shape: tuple[int, ...]
    stack: int
    frame_shape: tuple[int, ...]
    _axis: int | None
    _env_range: np.ndarray  # 0 .. max(num_envs, 64) - 1, cached
    _env_range_bytes: bytes

    @property
    def frames_written(self) -> int:
        """Frames written to the pool since it was allocated: frame ``p`` is pooled iff ``p >= this - pool_size``."""
        return int(self._written[0])

    @frames_written.setter
    def frames_written(self, value: int) -> None:
        self._written[0] = value

    def _layout(self, obs_shape: tuple[int, ...]) -> tuple[int | None, int, tuple[int, ...]]:
        """(stack axis within an observation or ``None``, stack depth S, frame shape) for observations ``obs_shape``.

        Raises for a ``stack_axis`` the observations do not have, and for a pool that cannot hold one stack.
        """
        if self.stack_axis is None:
            return None, 1, tuple(obs_shape)
        ndim = len(obs_shape)
        if not -ndim <= self.stack_axis < ndim:
            raise ValueError(
                f"stack_axis={self.stack_axis} is not an axis of observations of shape {obs_shape}; pass "
                "the axis along which frames are stacked (0 for gymnasium's FrameStackObservation), or None"
            )
        axis = self.stack_axis % ndim
        stack = obs_shape[axis]
        if stack > self.pool_size:
            raise ValueError(
                f"a stack of {stack} frames does not fit the pool of {self.pool_size} frames; raise extra_frames"
            )
        return axis, stack, tuple(obs_shape[:axis] + obs_shape[axis + 1 :])

    def _array(self, name: str, shape: tuple[int, ...], dtype: Any, fill: int) -> np.ndarray:
        """A zero/``fill`` array, in RAM or as a memory-mapped file ``memmap_dir/name.npy``."""
        if self.memmap_dir is None:
            return np.full(shape, fill, dtype=dtype) if fill else np.zeros(shape, dtype=dtype)
        return open_fresh_memmap(self.memmap_dir, name, shape, dtype, fill)

    def _as_frames(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` [B, *obs_shape] as ``[B, S, *frame]`` (a view)."""
        return frames_of(obs, self._axis)

    def _pool(self) -> np.ndarray:
        """The pool, allocated (every caller runs after the first batch allocated it)."""
        assert self.pool is not None
        return self.pool

    def _insert_stacks(
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
        count, stack, pool = frames.shape[0], self.stack, self._pool()
        if stack == 1:  # nothing to share between consecutive observations
            return self._write_frames(frames[:, 0])[:, None], np.zeros(count, dtype=bool)
        floor = max(self.frames_written + count * stack - self.pool_size, 0)  # frames from here survive this insert
        if trust is not None and prev.min() >= floor and trust.all():  # the trusted step: no comparison
            cont = np.ones(count, dtype=bool)
        else:
            alive = prev.min(axis=1) >= floor
            known = alive & (trust == 1) if trust is not None else np.zeros(count, dtype=bool)
            check = alive & ~known
            cont = known
            if check.all():  # the common checked step: no row selection (each would copy the stacks)
                cont = rows_bitwise_equal(pool.take(prev[:, 1:] % self.pool_size, axis=0), frames[:, :-1])
            elif check.any():
                a = np.flatnonzero(check)
                old = pool.take(prev[a, 1:] % self.pool_size, axis=0)
                cont = known.copy()
                cont[a] = rows_bitwise_equal(old, frames[a, :-1])
        if cont.all():  # the common step: one new frame per stack
            newest = self._write_frames(frames[:, -1])
            return np.concatenate([prev[:, 1:], newest[:, None]], axis=1), cont
        written = np.ones((count, stack), dtype=bool)
        frame = self.frame_shape
        repeats = rows_bitwise_equal(frames[:, :-1].reshape(-1, *frame), frames[:, 1:].reshape(-1, *frame))
        written[:, :-1] = ~repeats.reshape(count, stack - 1)
        written[cont, :-1] = False
        positions = np.full((count, stack), np.iinfo(np.int64).max, dtype=np.int64)
        positions[written] = self._write_frames(frames[written])
        # each frame refers to the nearest written frame at or after it in its stack (an equal one)
        refs = np.minimum.accumulate(positions[:, ::-1], axis=1)[:, ::-1].copy()
        refs[cont, :-1] = prev[cont, 1:]
        return refs, cont

    def _alive(self, refs: np.ndarray, writes_ahead: int) -> np.ndarray:
        """Rows of ``refs`` [R, S] whose frames survive ``writes_ahead`` more frame writes (bool [R])."""
        floor = max(self.frames_written + writes_ahead - self.pool_size, 0)
        alive: np.ndarray = refs.min(axis=1) >= floor
        return alive

    def _write_frames(self, frames: np.ndarray, as_range: bool = False) -> np.ndarray:
        """Append ``frames`` [m, *frame] to the pool ring; returns their absolute positions (int64 [m]).

        ``frames_written`` is advanced *before* the pool changes: a frame about
        to be overwritten no longer counts as pooled, so however an interrupt
        cuts the copy short, no stack can be rebuilt from a changed frame.
        """
        count, pool = len(frames), self._pool()
        if count > self.pool_size:
            raise ValueError(
                f"a batch needs {count} new frames but the pool holds {self.pool_size}; raise capacity or extra_frames"
            )
        first_position = self.frames_written
        self.frames_written = first_position + count
        start = first_position % self.pool_size
        first = min(count, self.pool_size - start)
        pool[start : start + first] = frames[:first]
        if first < count:
            pool[: count - first] = frames[first:]
        if as_range and count <= len(self._env_range):  # (a cached arange: one numpy call fewer)
            return self._env_range[:count] + first_position
        return np.arange(first_position, first_position + count)

    def _stacks(self, refs: np.ndarray) -> np.ndarray:
        """Observations ``[*I, *obs_shape]`` from frame references ``[*I, S]``."""
        frames = self._pool().take(refs % self.pool_size, axis=0)  # [*I, S, *frame]
        lead = refs.ndim - 1
        if self._axis is None:
            return frames.reshape(*refs.shape[:-1], *self.frame_shape)
        return np.moveaxis(frames, lead, lead + self._axis) if self._axis else frames

"""A shared-memory byte ring that carries a batch's large arrays from a collector process to the learner.

Through a ``multiprocessing`` queue a pickled array is copied four times
(into the pickle, through the pipe twice, out of the pickle) and the
learner's share of that is the unpickle and the pipe read. With the ring the
collector writes each large array once into shared memory and the queue
carries only ``(offset, shape, dtype)``; the learner copies the array out once
and releases its bytes at once, so the ring is a FIFO: one writer, one reader,
bytes released in the order they were written.

Positions are byte counters that only grow; ``position % capacity`` is the
offset. A block that would run past the end starts at offset 0 instead (the
tail is skipped). The writer waits while the block's bytes still hold
positions the reader has not released; the reader stores ``released`` (a
shared int64, the end of the last block it copied out) after each copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ptl_rl.core.batch import TransitionBatch

_ALIGN = 64  # every block starts on a cache line, so any dtype's view is aligned
MIN_RING_BYTES = 1024  # arrays smaller than this (per message) stay in the pickle: the ring would not pay


class RingRef(tuple[Any, ...]):
    """Stands for an array in the ring: ``(start position, end position, shape, dtype string)``."""

    __slots__ = ()


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class RingWriter:
    """The collector's side: :meth:`pack` moves a batch's large top-level arrays into the ring."""

    def __init__(self, ring: torch.Tensor, released: Any) -> None:
        self.buf = ring.numpy()
        self.capacity = len(self.buf)
        self.released = released
        self.position = 0

    def pack(self, batch: TransitionBatch, keep_going: Callable[[], bool]) -> TransitionBatch | None:
        """``batch`` with each large array replaced by a :class:`RingRef`; ``None`` if told to stop while waiting."""
        fields = dict(batch.items())
        large = [k for k, v in fields.items() if type(v) is np.ndarray and v.nbytes >= MIN_RING_BYTES]
        need = sum(_aligned(fields[k].nbytes) for k in large)
        if need > self.capacity:  # all of a message's blocks are in the ring at once: the learner frees none before
            raise ValueError(
                f"one message's large arrays ({need / 2**20:.2f} MiB) do not fit the shared-memory ring of "
                f"{self.capacity / 2**20:.2f} MiB; raise AsyncSource(shared_memory_mb=...) or lower steps_per_message"
            )
        for name in large:
            ref = self._write(fields[name], keep_going)
            if ref is None:
                return None
            fields[name] = ref
        return TransitionBatch(fields)

    def _write(self, array: np.ndarray, keep_going: Callable[[], bool]) -> RingRef | None:
        size = _aligned(array.nbytes)
        start = self.position
        if start % self.capacity + size > self.capacity:  # would run past the end: start again at offset 0
            start += self.capacity - start % self.capacity
        end = start + size
        # the block's bytes were last used by positions [start - C, end - C); it may be written once none of
        # those is still unreleased (unreleased: [released, position)); a skipped tail holds nothing
        reuse_end = min(self.position, end - self.capacity)
        while max(self.released.value, start - self.capacity) < reuse_end:  # the learner has not copied them out
            if not keep_going():
                return None
            time.sleep(0.0005)
        offset = start % self.capacity
        np.copyto(self.buf[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape), array)
        self.position = end
        return RingRef((start, end, array.shape, array.dtype.str))


class RingReader:
    """The learner's side: :meth:`unpack` copies the arrays out and releases their bytes."""

    def __init__(self, ring: torch.Tensor, released: Any) -> None:
        self.buf = ring.numpy()
        self.capacity = len(self.buf)
        self.released = released

    def unpack(self, batch: TransitionBatch) -> TransitionBatch:
        fields = dict(batch.items())
        for name, value in fields.items():
            if isinstance(value, RingRef):
                start, end, shape, dtype = value
                offset, dtype = start % self.capacity, np.dtype(dtype)
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                fields[name] = self.buf[offset : offset + nbytes].view(dtype).reshape(shape).copy()
                self.released.value = end  # blocks are read in the order they were written
        return TransitionBatch(fields)

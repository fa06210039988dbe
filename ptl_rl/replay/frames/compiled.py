"""The compiled insert of a FrameStorage: the C kernel's loader (with the Python fallback) and its commit.

``_frame_insert.c`` is an array kernel: it gets the storage's arrays (held as buffers), the batch's arrays
and the counters as integers, writes the batch and returns the number of frames written. Everything else
is here, in Python: which batches it may take (the stream number, a cut, the journal), and the commit of
the bookkeeping once the kernel returned. ``PTL_RL_PURE_PYTHON=1`` (read once by
:mod:`ptl_rl.core.settings`) forces the Python path for every FrameStorage (``FrameStorage.compiled`` does
it for one); a build without a C compiler has no kernel, takes the Python path too, and says so once.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.settings import SETTINGS, load_kernel
from ptl_rl.replay.frames.insert import FrameInsert
from ptl_rl.replay.unfinished import UnfinishedAdd

PURE_PYTHON = not SETTINGS.compiled  # (PTL_RL_PURE_PYTHON=1, read once by ptl_rl.core.settings)
_frame_insert = load_kernel("_frame_insert")
COMPILED_INSERT = _frame_insert is not None and not PURE_PYTHON


class _SlotWindows(dict[int, np.ndarray]):
    """The slots of an add of ``count`` rows at ``cursor``: ``windows[count][cursor]``, int64 [count], read-only.

    One strided view [capacity, count] per batch size seen, over ``arange(capacity + extra) % capacity``, so a
    wrapping add needs no ``arange`` either: its row at ``cursor`` is a view. Integer indexing of the window is
    ~0.1 us cheaper than slicing ``arange(capacity)`` (benchmarks/pixels.py), on ~9 us an add.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._wrapped = np.arange(0, dtype=np.int64)

    def __missing__(self, count: int) -> np.ndarray:
        if len(self._wrapped) < self.capacity + count - 1:  # (views made before keep their shorter array)
            self._wrapped = np.arange(self.capacity + 2 * count, dtype=np.int64) % self.capacity
        step = self._wrapped.strides[0]
        window = np.lib.stride_tricks.as_strided(
            self._wrapped, shape=(self.capacity, count), strides=(step, step), writeable=False
        )
        self[count] = window
        return window


class _Bound:
    """A kernel bound to one storage's arrays, where the retained batches are cut before the newest joins, and
    the slot windows of its ring."""

    __slots__ = ("insert", "keep_from", "windows")

    def __init__(self, kernel: Any, n: int, capacity: int) -> None:
        self.insert = kernel.insert  # (the bound method: one attribute load a call)
        # the last n - 1 earlier batches stay beside the newest; n = 1: none (a start past any tuple's end)
        self.keep_from = 1 - n if n > 1 else sys.maxsize
        self.windows = _SlotWindows(capacity)


class CompiledInsert(FrameInsert):
    """The compiled insert of a FrameStorage (its fifth layer): a kernel call, then one commit statement."""

    _compiled: bool
    _journal: UnfinishedAdd[tuple[Any, ...]]  # the storage's own record of an add under way (see FrameJournal.add)

    @property
    def compiled(self) -> bool:
        """Whether adds may take the compiled insert (see :meth:`try_atomic_add`); ``False`` forces the Python path.

        ``True`` by default when the extension ``ptl_rl.replay._frame_insert`` is built and
        ``PTL_RL_PURE_PYTHON`` is not set. Both paths leave the storage bit-identical.
        """
        return self._compiled

    @compiled.setter
    def compiled(self, value: bool) -> None:
        if value and _frame_insert is None:
            raise ValueError("the compiled insert ptl_rl.replay._frame_insert is not built (see docs/pixels.rst)")
        self._compiled, self._kernel = bool(value), None

    def try_atomic_add(self, batch: TransitionBatch, record: UnfinishedAdd[tuple[Any, ...]]) -> np.ndarray | None:
        """Add ``batch`` with the compiled kernel and mark ``record`` done in the statement that commits it.

        Returns the slots written (int64 [B]), or ``None`` when the batch is not
        covered (then nothing changed: call :meth:`add`). Covered: array
        observations ``[B, S, *frame]`` stacked along axis 0 (S >= 2) and fields
        in their stored dtypes, in trusted and checked mode, with episode ends,
        restarted stacks, envs missing, repeated (trusted mode) or out of order,
        ring and pool wrap; the result is bit-identical to the Python path's.
        Left to :meth:`add`: Dict observations, other stack axes, dtypes to
        cast, a cut in the numbered stream (a batch added again is one), a batch
        of more rows than the ring holds, in checked mode an env twice in one
        batch or an observation that is not the ``next_obs`` it resolves
        (refused there), and any batch while the storage's own journal holds
        an add cut short (``record`` is not that journal).

        An interrupt before the kernel call changes nothing; one after it, before
        the commit, leaves only writes the storage does not count (the per-env
        state went to the spare array, the frames to pool positions the
        watermark already counts, the batch's slots unsampleable until complete;
        see ``docs/design/pixel-replay.md``), so ``record``, not done, redoes the
        batch from the committed bookkeeping.
        """
        bound = self._kernel
        if bound is None:
            bound = self._kernel = self._bind_kernel()
            if bound is None:
                return None
        if bound is False or type(batch) is not TransitionBatch:
            return None
        journal = self._journal
        if not journal.done and journal is not record:  # an add of the storage's own was cut short: redo it first
            return None
        seq = self._stream_seq(batch) if self._numbered or self._upstream is not None else None
        seen = self._seen_seq
        if seq is not None and (seen is None or seq != seen + 1):  # a cut: the Python path resolves what waits
            return None
        trusted = (seq is not None) if self.check is None else not self.check
        data = batch._fields
        f = self._fields
        cursor, total, state, spare = f.cursor, f.total_added, self._state, self._spare
        # the kernel takes the dict itself: a key missing or one more than the bind's, and it returns -1
        count = bound.insert(data, state.array, spare.array, trusted, cursor, total)
        if count < 0:
            return None
        capacity = self.capacity
        # the newest n batches (their own dicts: env_id and next_obs, which a later cut resolves waiting
        # transitions from; references, no copy)
        retained = self._retained[bound.keep_from :] + ((total, data),)
        size = f.size + count  # (a conditional, not min(): a builtin call with keyword parsing costs ~0.2 us)
        new = (
            True, spare, state, retained, seen if seq is None else seq,
            (cursor + count) % capacity, size if size < capacity else capacity, total + count,
        )  # fmt: skip
        r, s = record, self
        # the commit: one statement (no Python code runs in it), its targets on one line so that a line tracer
        # cannot stop it between two stores either: the record done, the new state swapped in, the counters
        r.done, s._state, s._spare, s._retained, s._seen_seq, f.cursor, f.size, f.total_added = new
        slots: np.ndarray = bound.windows[count][cursor]
        return slots

    def _bind_kernel(self) -> _Bound | bool | None:
        """The kernel holding this storage's arrays; ``None`` before they exist, ``False`` if not covered."""
        if not self._compiled or _frame_insert is None:
            return False
        if self.pool is None or self._fields.fields is None:
            return None
        fields = self._fields.fields
        covered = (
            self._obs_keys is None
            and self.stack > 1
            and self._axis == 0
            and self._fields._flat
            and len(fields) <= 64
            and all(type(a) in (np.ndarray, np.memmap) and a.flags.c_contiguous for a in fields.values())
            and all(k in fields for k in ("env_id", "terminated", "truncated"))
            and self._state.array.flags.c_contiguous
        )
        if not covered:
            return False
        names = tuple(fields)
        try:
            kernel = _frame_insert.Kernel(
                self.pool, self._obs_refs, self._next_refs, self._pending, self._written,
                tuple(fields[k] for k in names), ("obs", "next_obs", *names), self._state.array, self._spare.array,
                *(names.index(k) for k in ("env_id", "terminated", "truncated")), self.n_step or 1,
            )  # fmt: skip
        except (ValueError, TypeError, BufferError):  # an array the kernel cannot hold: the Python path
            return False
        return _Bound(kernel, self.n_step or 1, self.capacity)

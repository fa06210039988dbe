"""The compiled insert of a FrameStorage: the C kernel's loader (with the Python fallback) and the Python around it.

``_frame_insert.c`` is an array kernel: it gets the storage's arrays (held as buffers), the batch's arrays
and the counters as integers, writes the batch and returns the number of rows written. Everything else
is here, in Python: which batches it may take (the stream number, a cut), and the bookkeeping once the
kernel returned. ``PTL_RL_PURE_PYTHON=1`` (read once by :mod:`ptl_rl.core.settings`) forces the Python
path for every FrameStorage (``FrameStorage.compiled`` does it for one); a build without a C compiler has
no kernel, takes the Python path too, and says so once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.settings import SETTINGS, load_kernel
from ptl_rl.replay.frames.checks import ObsLayout
from ptl_rl.replay.frames.env_state import EnvTable
from ptl_rl.replay.frames.links import FrameLinks
from ptl_rl.replay.frames.pool import FramePool
from ptl_rl.replay.frames.stream import StreamNumbers
from ptl_rl.replay.storage import ArrayStorage

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
    """A kernel bound to one storage's arrays, the env table's version it holds, where the retained batches are
    cut before the newest joins, and the slot windows of its ring."""

    __slots__ = ("insert", "keep_from", "version", "windows")

    def __init__(self, kernel: Any, n: int, capacity: int, version: int) -> None:
        self.insert = kernel.insert  # (the bound method: one attribute load a call)
        # the last n - 1 earlier batches stay beside the newest; n = 1: none (a start past any tuple's end)
        self.keep_from = 1 - n if n > 1 else sys.maxsize
        self.version = version
        self.windows = _SlotWindows(capacity)


class CompiledInsert:
    """The compiled insert of one FrameStorage: its kernel, bound to the storage's parts' arrays on first use.

    Args:
        layout, fields, pool, links, envs, stream: the storage's parts (the kernel holds their arrays; the
            insert reads and advances their counters).
        check: the storage's ``check`` (``None``: trust the stacks of a numbered stream).
        fallback: the Python path, for a batch the kernel does not cover (``batch -> slots``).
    """

    def __init__(
        self,
        layout: ObsLayout,
        fields: ArrayStorage,
        pool: FramePool,
        links: FrameLinks,
        envs: EnvTable,
        stream: StreamNumbers,
        check: bool | None,
        fallback: Callable[[TransitionBatch], np.ndarray],
    ) -> None:
        self.layout, self.fields, self.pool, self.links, self.envs, self.stream = (
            layout, fields, pool, links, envs, stream,
        )  # fmt: skip
        self.check, self.fallback = check, fallback
        self._bound: _Bound | Literal[False] | None = None  # None: to bind; False: a layout it does not cover

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / deepcopy without the kernel (a C object holding the arrays): the next add binds again."""
        state = self.__dict__.copy()
        state["_bound"] = None
        return state

    @property
    def state(self) -> str:
        """``"bound"`` (the kernel holds the arrays), ``"unbound"`` (binds at the next add), or ``"not covered"``."""
        bound = self._bound
        return "unbound" if bound is None else "not covered" if bound is False else "bound"

    def drop(self) -> None:
        """Forget the kernel (the storage's arrays were replaced): the next add binds again."""
        self._bound = None

    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Add ``batch`` with the kernel, or with the Python path where the kernel does not cover it.

        Returns the slots written (int64 [B]). Covered: array observations
        ``[B, S, *frame]`` stacked along axis 0 (S >= 2) and fields in their
        stored dtypes, in trusted and checked mode, with episode ends, restarted
        stacks, envs missing, repeated (trusted mode) or out of order, ring and
        pool wrap; the result is bit-identical to the Python path's. Left to the
        Python path (``fallback``, before anything changed): Dict observations,
        other stack axes, dtypes to cast, a cut in the numbered stream (a batch
        added again is one), a batch of more rows than the ring holds, in
        checked mode an env twice in one batch or an observation that is not
        the ``next_obs`` it resolves (refused there).

        The kernel writes the next per-env state into the table's spare array and
        the frames at pool positions it counts as written before writing them; a
        cut after it leaves the storage's journal to restore the bookkeeping and
        add the batch again (``docs/design/pixel-replay.md``).
        """
        bound = self._bound
        if bound is None or (bound is not False and bound.version != self.envs.version):
            bound = self._bound = self._bind()
            if bound is None:
                return self.fallback(batch)
        if bound is False or type(batch) is not TransitionBatch:
            return self.fallback(batch)
        stream = self.stream
        seq = stream.seq_of(batch) if stream.noted or stream.upstream is not None else None
        seen = stream.seen
        if seq is not None and (seen is None or seq != seen + 1):  # a cut: the Python path resolves what waits
            return self.fallback(batch)
        check = self.check
        trusted = (seq is not None) if check is None else not check
        data = batch._fields
        fields, envs = self.fields, self.envs
        cursor, total, state, spare = fields.cursor, fields.total_added, envs.state, envs.spare
        # the kernel takes the dict itself: a key missing or one more than the bind's, and it returns -1
        count = bound.insert(data, state.array, spare.array, trusted, cursor, total)
        if count < 0:
            return self.fallback(batch)
        # the bookkeeping of the add: the new state (written into the spare) swapped in, the newest n batches
        # retained (their own dicts: env_id and next_obs, which a later cut resolves waiting transitions from),
        # the stream number, the counters
        envs.state, envs.spare = spare, state
        links = self.links
        links.retained = links.retained[bound.keep_from :] + ((total, data),)
        if seq is not None:
            stream.seen = seq
        capacity = fields.capacity
        size = fields.size + count  # (a conditional, not min(): a builtin call with keyword parsing costs ~0.2 us)
        fields.cursor = (cursor + count) % capacity
        fields.size = size if size < capacity else capacity
        fields.total_added = total + count
        slots: np.ndarray = bound.windows[count][cursor]
        return slots

    def _bind(self) -> _Bound | Literal[False] | None:
        """The kernel holding the storage's arrays; ``None`` before they exist, ``False`` if not covered."""
        if _frame_insert is None:
            return False
        pool, fields_storage, envs = self.pool, self.fields, self.envs
        fields = fields_storage.fields
        if pool.frames is None or fields is None:
            return None
        covered = (
            self.layout.keys is None
            and pool.stack > 1
            and pool.axis == 0
            and fields_storage._flat
            and len(fields) <= 64
            and all(type(a) in (np.ndarray, np.memmap) and a.flags.c_contiguous for a in fields.values())
            and all(k in fields for k in ("env_id", "terminated", "truncated"))
            and envs.state.array.flags.c_contiguous
        )
        if not covered:
            return False
        names, links, n = tuple(fields), self.links, envs.n  # (n: the n-step the per-env table is laid out for)
        try:
            kernel = _frame_insert.Kernel(
                pool.frames, links.obs_refs, links.next_refs, envs.pending, pool.watermark,
                tuple(fields[k] for k in names), ("obs", "next_obs", *names), envs.state.array, envs.spare.array,
                *(names.index(k) for k in ("env_id", "terminated", "truncated")), n,
            )  # fmt: skip
        except (ValueError, TypeError, BufferError):  # an array the kernel cannot hold: the Python path
            return False
        return _Bound(kernel, n, fields_storage.capacity, envs.version)

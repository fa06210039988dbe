"""FrameStorage: replay storage for pixel observations, with every frame stored once.

A drop-in for :class:`~ptl_rl.buffers.ArrayStorage` (same ``add`` / ``gather`` /
state API) that keeps ``obs`` and ``next_obs`` out of the per-transition ring:

* **Frame pool.** Observations are split into frames along the stack axis
  (``stack_axis``; ``None``: the whole observation is one frame) and frames go
  into one ring, the *pool*, of ``capacity + extra_frames`` frames. Every
  stored observation is a row of ``S`` absolute frame positions (int64), so a
  stack is rebuilt at sample time with one ``take``.
* **Stacks stored as single frames.** A new observation of an env whose
  ``S - 1`` oldest frames are bit-identical to the ``S - 1`` newest frames of
  the env's previous observation (what ``FrameStackObservation`` does inside an
  episode) writes only its newest frame. Any other observation (an episode
  start, any data that does not shift) writes its frames, except that a frame
  equal to the next one in the stack is stored once (``"reset"`` padding
  repeats the first frame: one frame written). Because reuse is decided by
  comparing bytes, a rebuilt stack is bit-identical to what was added, for any
  padding and any data.
* **next_obs never stored twice.** A transition without an episode end has as
  ``next_obs`` the ``obs`` of the same env ``n_step`` transitions later (the
  data contract of :class:`~ptl_rl.nstep.NStepTransform` and of 1-step
  sources); it points to that observation's frames once it arrives and is
  *not sampleable* until then. A transition with ``terminated | truncated``
  has a final observation; it is stored on the side in the same pool (its
  stack shares frames with the episode's last observation; the tails of one
  episode share it).
* **Validity.** A transition is sampleable when its ``next_obs`` has arrived
  and every frame it refers to is still in the pool (a pool that overflows,
  with many short episodes and small ``extra_frames``, evicts frames of the
  oldest transitions). Buffers draw only sampleable transitions (see
  :meth:`sampleable`).

Memory per transition: one frame, ``2 * S`` int64 frame references, and the
other fields; with 84x84x4 uint8 Atari stacks about 0.13x of storing ``obs``
and ``next_obs`` in full.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from ptl_rl._grouping import rank_within_group
from ptl_rl._state import check_version, versioned
from ptl_rl.batch import TransitionBatch
from ptl_rl.buffers.memmap import MemmapStorage, open_fresh_memmap
from ptl_rl.buffers.storage import ArrayStorage

_OBS_FIELDS = ("obs", "next_obs")

# The compiled insert (``_frame_insert.c``, built by setup.py when a C compiler is there; optional): the common
# vector step in one C call. ``PTL_RL_PURE_PYTHON=1`` in the environment, read once here at import, forces the
# Python path for every FrameStorage (``FrameStorage.compiled`` does it for one).
PURE_PYTHON = os.environ.get("PTL_RL_PURE_PYTHON", "") not in ("", "0")
try:
    from ptl_rl.buffers import _frame_insert
except ImportError:  # not built (no compiler at install time, or a source checkout without build_ext)
    _frame_insert = None
COMPILED_INSERT = _frame_insert is not None and not PURE_PYTHON


class FrameStorage:
    """A ring of ``capacity`` transitions whose observations live in a shared frame pool.

    Args:
        capacity: transitions kept; the oldest are overwritten.
        stack_axis: the axis of an observation (not of the batch) along which
            frames are stacked, oldest first, as ``FrameStackObservation``
            stacks them (axis 0). ``None``: observations are single frames
            (still stored once for ``obs`` and ``next_obs``).
        n_step: how many transitions ahead ``next_obs`` of a transition
            without an episode end is the ``obs`` (the ``n`` of the upstream
            :class:`~ptl_rl.nstep.NStepTransform`, 1 for 1-step data).
            ``None``: taken from the buffer's upstream (its ``n``, else 1).
        extra_frames: pool frames beyond ``capacity``, for final
            observations and for the frames of episode starts. Default
            ``max(capacity // 32, 64)``; raise it for short episodes (each
            episode adds about 1 to 2 frames beyond its steps).
        memmap_dir: keep the pool, the frame references and the other fields
            (in ``memmap_dir/fields``, a :class:`~ptl_rl.buffers.MemmapStorage`)
            in memory-mapped files in this directory (created; must not hold
            an earlier buffer's files), so a replay larger than RAM lives on disk.
        checkpoint_dir: when set, :meth:`state_dict` saves the storage to a
            fresh subdirectory of it (see :meth:`save`) and returns only a
            reference to it: a Lightning checkpoint then holds the path, not
            the data, and no copy of the replay is made in RAM.
        check: whether a new observation's ``S - 1`` oldest frames are
            compared with the env's previous stack before only its newest
            frame is stored. ``None`` (default): compare unless the storage is
            fed by a numbered upstream (a buffer whose ``upstream`` is an
            ``ExperienceSource`` or ``NStepTransform``): there a stack inside an
            episode is trusted to shift by one frame once the episode's first
            shift was seen (every episode start, episode end and cut in the
            stream is still compared). ``True``: always compare (foreign
            data); ``False``: trust also without such an upstream. Whenever
            it compares, it also refuses (``ValueError``, nothing stored) a
            batch in which an ``obs`` is not, whole stack, the ``next_obs`` of
            its env's transition ``n_step`` rows earlier, which it is stored as.
        frame_key: for ``Dict`` observations, the key whose observations are
            (stacks of) frames, stored once as above; the other keys are
            stored per transition like any other field. Default: the only key
            with two or more dims per observation.

    Rows of one env must arrive in time order (any interleaving across envs),
    every step of an env exactly once, as an ``ExperienceSource`` (optionally
    followed by an ``NStepTransform``) delivers them.
    """

    def __init__(
        self,
        capacity: int,
        *,
        stack_axis: int | None = None,
        n_step: int | None = None,
        extra_frames: int | None = None,
        memmap_dir: str | os.PathLike | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        check: bool | None = None,
        frame_key: str | None = None,
    ) -> None:
        # every field but obs / next_obs (and the non-frame keys of Dict ones), on disk too with memmap_dir
        self._fields = (
            ArrayStorage(capacity)
            if memmap_dir is None
            else MemmapStorage(capacity, memmap_dir=os.path.join(os.fspath(memmap_dir), "fields"))
        )
        self.capacity = self._fields.capacity
        if n_step is not None and (not isinstance(n_step, (int, np.integer)) or n_step < 1):
            raise ValueError(f"n_step must be an integer >= 1 (the upstream NStepTransform's n), got {n_step!r}")
        if extra_frames is None:
            extra_frames = max(self.capacity // 32, 64)
        if extra_frames < 0:
            raise ValueError(f"extra_frames must be >= 0, got {extra_frames}")
        self.stack_axis = stack_axis
        self.n_step = None if n_step is None else int(n_step)
        self.pool_size = self.capacity + int(extra_frames)
        self.memmap_dir = None if memmap_dir is None else os.fspath(memmap_dir)
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.pool: np.ndarray | None = None  # [pool_size, *frame]
        self.frames_written = 0  # absolute position of the next frame; frame p lives at p % pool_size
        self.obs_dtype: np.dtype | None = None
        self.obs_shape: tuple[int, ...] = ()
        self.stack = 1
        self.check = check
        self.frame_key = frame_key
        self._obs_keys: tuple[str, ...] | None = None  # sorted keys of Dict observations
        self._upstream: Any = None
        self._seen_seq: int | None = None  # stream_seq of the upstream's batch added last (trusted mode)
        # (snapshot before them, batches) while an add is under way: still set on entry means an add was cut short
        self._journal: tuple[Any, list[TransitionBatch]] | None = None
        # (batch, its stream_seq) of the last few batches pulled or added: a batch keeps the number it had when it
        # was pulled, though the upstream has moved on by the time an interrupted add of it is done again
        self._numbered: tuple[tuple[TransitionBatch, int | None], ...] = ()
        # (first transition number, env_id, next_obs frames) of the last n_step batches added (references)
        self._retained: tuple[tuple[int, np.ndarray, np.ndarray], ...] = ()
        # the compiled insert's hold on the arrays (None: to build; False: this storage's layout is not covered);
        # reset wherever an array it holds is replaced
        self._plan: Any = None
        self._compiled = COMPILED_INSERT
        self._allocate_env_state(0)

    # ------------------------------------------------------------------ counters (the ArrayStorage API)
    def __len__(self) -> int:
        return len(self._fields)

    @property
    def size(self) -> int:
        return self._fields.size

    @property
    def cursor(self) -> int:
        return self._fields.cursor

    @property
    def total_added(self) -> int:
        return self._fields.total_added

    def bind_upstream(self, upstream: Any) -> None:
        """Take ``n_step`` from the upstream stage when it was not given (an ``NStepTransform``'s ``n``, else 1).

        A numbered upstream (``stream_seq``) also lets ``check=None`` trust the stacks' structure.
        """
        n = int(getattr(upstream, "n", 1) or 1) if upstream is not None else None
        if self.n_step is None:
            self.n_step = n
        elif n is not None and hasattr(upstream, "stream_seq") and n != self.n_step:
            raise ValueError(
                f"this FrameStorage has n_step={self.n_step} but its upstream emits {n}-step transitions; drop n_step "
                "(it is taken from the upstream) or set it to the upstream's n"
            )
        self._upstream = upstream

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / deepcopy without the compiled insert's hold on the arrays (rebuilt by the next add)."""
        state = self.__dict__.copy()
        state["_plan"] = None
        return state

    @property
    def compiled(self) -> bool:
        """Whether adds may take the compiled insert (see :meth:`try_atomic_add`); ``False`` forces the Python path.

        ``True`` by default when the extension ``ptl_rl.buffers._frame_insert`` is built and
        ``PTL_RL_PURE_PYTHON`` is not set. Both paths leave the storage bit-identical.
        """
        return self._compiled

    @compiled.setter
    def compiled(self, value: bool) -> None:
        if value and _frame_insert is None:
            raise ValueError("the compiled insert ptl_rl.buffers._frame_insert is not built (see the README)")
        self._compiled, self._plan = bool(value), None

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage's arrays (pool, references, other fields; memory-mapped ones included)."""
        total = sum(a.nbytes for a in (self.pool, self._obs_refs, self._next_refs) if a is not None)
        if self._fields.fields is not None:
            total += sum(a.nbytes for a in _leaves(self._fields.fields))
        return int(total)

    # ------------------------------------------------------------------ writing
    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` rows of ``batch``; returns the slots written (int64 [B]).

        Interrupt-safe: every change to the small bookkeeping (counters, per-env
        state) can be rolled back with :meth:`snapshot` / :meth:`restore`, and
        frames are written only to pool positions already counted as written
        (see :meth:`_write_frames`), so an add cut short, rolled back and done
        again equals one uninterrupted add. A buffer does that itself (see
        ``ReplayBuffer.add``); for a caller that does not, the storage keeps the
        batch and its snapshot, and its next ``add`` rolls back and redoes it.

        A refused batch (``ValueError``/``TypeError``: a wrong shape, dtype or
        field, a stack that does not match what the storage holds, see
        :meth:`_checked`) leaves the storage as it was: every check runs before
        the first write, and the batch is not kept for a redo.
        """
        if self._journal is None:
            self._journal = (None, [batch])  # (the compiled step clears it in the same call that writes the batch)
            if self._plan is not False:  # (False: not compiled, or a layout the compiled insert does not cover)
                slots = self.try_atomic_add(batch, self, "_journal")
                if slots is not None:
                    return slots
        else:
            self._journal = (self._journal[0], [*self._journal[1], batch])
        saved, batches = self._journal
        if saved is None:  # (None: no earlier add was cut short after its snapshot; nothing was written since)
            saved = self.snapshot()
        else:  # an earlier add was cut short: roll back to before it, then do it again
            self._restore_bookkeeping(saved)
        self._journal = (saved, batches)
        try:
            for one in batches:
                slots = self._add_chunks(one)
        except (TypeError, ValueError):
            # refused by its checks, before its first write: the storage holds the batches before it, complete
            self._journal = None
            raise
        self._journal = None
        return slots

    def try_atomic_add(self, batch: TransitionBatch, owner: Any, record: str) -> np.ndarray | None:
        """Add ``batch`` in one compiled call and set ``owner.<record>`` to ``None`` in that same call.

        Returns the slots written (int64 [B]), or ``None`` when the batch is
        not covered by the compiled insert (then nothing changed: call
        :meth:`add`). Covered: array observations ``[B, S, *frame]``
        stacked along axis 0 (S >= 2) and fields in their stored dtypes, in
        trusted and checked mode, with episode ends, restarted stacks, envs
        missing, repeated (trusted mode) or out of order, ring and pool wrap;
        the result is bit-identical to the Python path's. Left to
        :meth:`add`: Dict observations, other stack axes, dtypes to cast, a
        cut in the numbered stream (a batch added again is one), a batch of
        more rows than the ring holds (it would overwrite its own rows), and in
        checked mode an env twice in one batch (see :meth:`_back_up_pending`)
        or an observation that is not the ``next_obs`` it resolves (refused
        there). No Python code runs inside the call, so an interrupt lands
        before it (nothing written, the caller's record still
        set: the caller redoes the batch) or after it (the batch stored and
        the record cleared): a buffer needs no snapshot for it. See
        ``docs/design/pixel-replay.md``.
        """
        plan = self._plan
        if plan is None:
            plan = self._plan = self._make_plan()
            if plan is None:
                return None
        if plan is False:
            return None
        # the checks (batch type, journal, stream number and cut, trusted mode) and the add, in one compiled call;
        # it also sets _retained, the newest batches' own next_obs that a cut resolves waiting rows from
        slots = plan.add(owner, record, self, batch)
        if slots is NotImplemented:  # not noted at a pull (a standalone add): the upstream's number now, then add
            self._stream_seq(batch)
            slots = plan.add(owner, record, self, batch)
        if type(slots) is int:  # the ring wrapped: the first slot (the batch is stored already)
            return np.arange(slots, slots + len(batch)) % self.capacity
        return slots

    def _make_plan(self) -> Any:
        """The compiled insert's hold on this storage's arrays; ``None`` before they exist, ``False`` if not covered."""
        if not self._compiled:
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
            and self._state.array.flags.c_contiguous
        )
        if not covered:
            return False
        names = tuple(fields)
        try:
            return _frame_insert.Plan(
                self.pool, self._obs_refs, self._next_refs, self._state.array, self._pending, names,
                tuple(fields[k] for k in names), TransitionBatch, np.ndarray,
            )  # fmt: skip
        except (ValueError, TypeError, BufferError):  # an array the plan cannot hold: the Python path
            return False

    def _add_chunks(self, batch: TransitionBatch) -> np.ndarray:
        """Check ``batch`` in full (nothing written if refused), then store it, in chunks if it is large."""
        checked = self._checked(batch)
        if not self.trusted and not _each_once(checked.env):
            self._back_up_pending(checked.env)
        count, limit, seq = len(batch), self._chunk_rows(len(batch)), self._stream_seq(batch)
        if count <= limit:
            return self._add(batch, checked, seq)
        # only the newest `capacity` rows survive, and no write may need more frames than the pool holds; the
        # chunks after the first continue the batch's place in the stream (no cut between them)
        slots = []
        for lo in range(0, count, limit):
            part = slice(lo, lo + limit)
            rows = _Checked(*(a[part] for a in checked[:-1]), checked.rest.rows(part))
            slots.append(self._add(batch.rows(part), rows, seq, continued=lo > 0))
        return np.concatenate(slots)[-self.capacity :]

    def _back_up_pending(self, env: np.ndarray) -> None:
        """Copy the pending stacks of the envs that occur twice or more in ``env`` (int64 [B]), for a redo.

        An env's ring of ``n + 1`` pending stacks takes one write per add without losing one that the add
        compared (see :meth:`_add_obs`); a second write of the same add overwrites one. Should that add be
        cut short, :meth:`_restore_bookkeeping` puts these copies back (the backup names the ``total_added``
        it was taken at), so the redo compares against the stacks stored before it.
        """
        twice = np.flatnonzero(np.bincount(env) > 1)
        twice = twice[twice < len(self._pending)]
        self._pending_backup = (self._fields.total_added, twice, self._pending[twice])  # (fancy index: a copy)

    def _chunk_rows(self, count: int, stack: int | None = None) -> int:
        """Rows of a batch of ``count`` added at once: all, or chunks if it could overflow the ring or the pool.

        A batch of more than ``capacity`` rows, or whose ``count * S`` frames could exceed the pool in one
        write (``_write_frames`` cannot hold them), goes in chunks of at most ``capacity`` rows whose
        observation and final stacks (``2 S`` frames a row) fit the pool together. ``stack``: the stack
        depth (default: the storage's; the first batch passes its own).
        """
        stack = stack or self.stack
        if count <= self.capacity and count * stack <= self.pool_size:
            return count
        return min(self.capacity, max(self.pool_size // (2 * stack), 1))

    def _add(self, batch: TransitionBatch, checked: _Checked, seq: int | None, continued: bool = False) -> np.ndarray:
        """Store ``batch`` (at most :meth:`_chunk_rows` rows), which passed :meth:`_checked`: nothing here refuses.

        ``seq``: the upstream's number of the batch (``None``: not numbered); ``continued``: a chunk after the
        first of one batch (its number is the chunk before's, not a cut).
        """
        count, rest, env, done = len(batch), checked.rest, checked.env, checked.done
        obs, next_obs = checked.obs, checked.next_obs
        if count == 0:
            return self._fields.write_checked(rest)
        if self.n_step is None:
            self.n_step = 1
        # a vector step holds each env once, in order: then no grouping, and often one slice of the env state
        if env.tobytes() == self._env_range_bytes[: 8 * count]:  # envs 0 .. count-1: one bytes compare, no ufunc
            in_order, lowest, highest = True, 0, count - 1
        else:
            in_order = count == 1 or bool((env[1:] > env[:-1]).all())
            lowest, highest = (int(env[0]), int(env[-1])) if in_order else (int(env.min()), int(env.max()))
        any_done = bool(done.any())
        self._grow_envs(highest + 1)
        trusted = self.trusted
        if seq is not None and not continued:
            if self._seen_seq is None or seq != self._seen_seq + 1:
                # steps are missing (a cut in the stream, a restore, a batch lost to an interrupt): no stored
                # transition takes a later observation as next_obs, and no stack is trusted to continue
                self._resolve_waiting()
                self._state.trust[:] = 0
            self._seen_seq = seq
        # the slots to overwrite become unsampleable before any of their fields change (next_obs pending)
        start, first_gen = self._fields.cursor, self._fields.total_added
        if start + count <= self.capacity:
            slots = np.arange(start, start + count)
            self._next_refs[start : start + count, 0] = -1
        else:
            slots = (start + np.arange(count)) % self.capacity
            self._next_refs[slots, 0] = -1
        self._fields.write_checked(rest)
        obs_frames, next_frames = self._as_frames(obs), self._as_frames(next_obs)
        if in_order:
            rows_of = slice(lowest, highest + 1) if highest - lowest + 1 == count else None
            self._add_obs(env, rows_of, slots, first_gen, obs_frames, next_frames, done, any_done, trusted)
        else:
            for rows in _occurrence_groups(env, highest + 1):  # obs first, in time order per env
                if rows is None:  # each env once, out of env order: all rows, as positions (not a new axis)
                    rows = np.arange(count)
                self._add_obs(
                    env[rows], None, slots[rows], first_gen + rows, obs_frames[rows], next_frames[rows],
                    done[rows], any_done, trusted,
                )  # fmt: skip
        if any_done:
            ended = np.flatnonzero(done)
            state = self._state
            for rows in _occurrence_groups(env[ended], len(state.array)):
                self._add_finals(ended if rows is None else ended[rows], env, slots, next_frames)
            # an env whose last row in this batch ended its episode: its newest observation is the final one
            last_row = np.zeros(len(state.array), dtype=np.int64) - 1
            last_row[env] = np.arange(len(env))  # later rows win
            envs = np.flatnonzero(last_row >= 0)
            finished = envs[done[last_row[envs]]]
            state.last[finished] = state.final[finished]
        # the newest batches stay referenced (no copy): at a cut, their rows still waiting take their own next_obs
        self._retained = (*self._retained, (first_gen, env, next_frames))[-self.n_step :]
        return slots

    def _resolve_waiting(self) -> None:
        """At a cut: each transition still waiting for its ``next_obs`` takes the one its own batch carried.

        Its frames are written to the pool (deduplicated against the env's
        newest stack); a transition whose batch is no longer retained stays
        unsampleable. Then nothing waits: no later observation is linked.
        """
        state = self._state
        waiting = state.recent[state.recent >= max(self._fields.total_added - self.capacity, 0)]
        for first_gen, env, next_frames in self._retained if len(waiting) else ():
            rows = waiting - first_gen
            rows = rows[(rows >= 0) & (rows < len(env))]
            if len(rows):
                refs = self._insert_stacks(state.last[env[rows]], next_frames[rows], None)[0]
                self._next_refs[(first_gen + rows) % self.capacity] = refs
        state.recent[:] = -1

    def note_stream_seq(self, batch: TransitionBatch, seq: int | None) -> None:
        """Record the upstream's number of ``batch``, read when it was pulled (a buffer calls it from its pull).

        An add cut short is done again when the *next* batch is added, after the
        upstream numbered that one: the number must come from the pull, or a
        batch lost to a second interrupt during the redo would leave no gap.
        """
        self._numbered = (*self._numbered[-3:], (batch, seq))  # (one assignment: an interrupt cannot split it)

    def _stream_seq(self, batch: TransitionBatch) -> int | None:
        """The upstream's number of ``batch`` (``None``: not numbered): noted at its pull, else read now."""
        for noted, seq in self._numbered:
            if noted is batch:
                return seq
        seq = getattr(self._upstream, "stream_seq", None)
        self.note_stream_seq(batch, seq)
        return seq

    @property
    def trusted(self) -> bool:
        """Whether stacks of an env inside an episode are taken to shift by one frame without comparing them.

        ``check=None`` trusts the structure when the storage is fed by an
        upstream that numbers its batches (an ``ExperienceSource`` or
        ``NStepTransform``, through a buffer's ``upstream``); ``check=True``
        always compares, ``check=False`` always trusts.
        """
        if self.check is None:
            return getattr(self._upstream, "stream_seq", None) is not None
        return not self.check

    def snapshot(self) -> tuple[Any, ...]:
        """The bookkeeping an :meth:`add` changes, for :meth:`restore` to roll an interrupted add back.

        Counters and the per-env state (one small int64 array): no frame array
        is copied (checked mode's pending stacks are a ring whose head is in
        the per-env state, and an add writes only its free position). The
        slots and pool frames an interrupted add wrote need no copy: they
        were unsampleable while being written, and the add done again
        rewrites them.
        """
        fields = self._fields
        state = self._state.array.copy()
        return (fields.cursor, fields.size, fields.total_added, state, self._seen_seq, self._retained)

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Roll the bookkeeping back to ``snapshot`` (taken by :meth:`snapshot` before an add that was cut short).

        ``frames_written`` is not rolled back: pool positions an interrupted add
        may have overwritten stay counted as written, so no stored stack can
        refer to a frame that changed.
        """
        self._restore_bookkeeping(snapshot)
        self._journal = None

    def _restore_bookkeeping(self, snapshot: tuple[Any, ...]) -> None:
        cursor, size, total_added, state, seen_seq, self._retained = snapshot
        self._plan = None  # (it holds the arrays replaced here)
        if state.shape[1] != _EnvState.width(self.stack, self.n_step or 1):
            # taken before the first add allocated (a placeholder for a stack of 1): nothing was stored then
            self._allocate_env_state(0)
        else:
            self._state = _EnvState(state.copy(), self.stack, self.n_step or 1)
            self._pending = self._pending[: len(state)]  # (envs first seen by the rolled-back add are dropped)
            backup = self._pending_backup
            if backup is not None and backup[0] == total_added:  # pending stacks the rolled-back add overwrote
                self._pending[backup[1]] = backup[2]
        self._seen_seq = seen_seq
        fields = self._fields
        fields.cursor, fields.size, fields.total_added = cursor, size, total_added

    def _checked(self, batch: TransitionBatch) -> _Checked:
        """Every check of an add, before its first write: the parts of ``batch`` to store, or a ``ValueError``.

        Checked: the fields ``obs`` / ``next_obs`` (shape and dtype, see
        :meth:`_checked_obs`), the other fields (the inner storage's check),
        ``env_id >= 0``, and in checked mode that each observation is the whole
        ``next_obs`` stack of the transition it resolves (see
        :meth:`_check_next_obs`). The first batch allocates the storage only
        once it passed: a refused first batch leaves it unallocated.
        """
        first = self.pool is None
        try:
            obs, next_obs, keys, frame_key = self._checked_obs(batch)
            rest = TransitionBatch({k: v for k, v in batch.items() if k not in _OBS_FIELDS})
            if keys is not None:  # Dict observations: the keys that are not frames are plain fields
                rest["obs"] = {k: v for k, v in batch["obs"].items() if k != frame_key}
                rest["next_obs"] = {k: v for k, v in batch["next_obs"].items() if k != frame_key}
            self._fields.check(rest)
            env = np.asarray(batch["env_id"], dtype=np.int64)  # (int64 [B] now: the inner check passed)
            if len(env) and env.min() < 0:
                raise ValueError(f"env_id must be >= 0, got {env.min()}; number the envs 0, 1, ...")
            done = np.asarray(batch["terminated"], dtype=bool) | np.asarray(batch["truncated"], dtype=bool)
            axis, stack, _ = self._layout(obs.shape[1:]) if first else (self._axis, self.stack, None)
            if len(env) and not self.trusted:
                frames = (_frames_of(obs, axis), _frames_of(next_obs, axis))
                self._check_next_obs(batch, env, *frames, done, self._chunk_rows(len(env), stack))
        except (TypeError, ValueError):
            if first:  # (the inner check allocated the other fields from this batch)
                self._fields.fields = None
            raise
        if first:
            self._allocate(obs, keys, frame_key)
        return _Checked(obs, next_obs, env, done, rest)

    def _checked_obs(self, batch: TransitionBatch) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None, str | None]:
        """The framed part of ``obs`` and ``next_obs`` of ``batch``, checked to have the stored shape and dtype.

        Also the sorted observation keys and the frame key (``None, None`` for array observations); for the
        first batch they are chosen here and set when the storage allocates.
        """
        for name in (*_OBS_FIELDS, "env_id", "terminated", "truncated"):
            if name not in batch:
                raise ValueError(
                    f"FrameStorage needs the field {name!r} (it links observations per env and episode); add "
                    "transitions as an ExperienceSource / NStepTransform produces them"
                )
        obs, next_obs = batch["obs"], batch["next_obs"]
        first = self.pool is None
        keys, frame_key = self._choose_frame_key(obs) if first else (self._obs_keys, self.frame_key)
        if (keys is None) != (not isinstance(obs, dict)) or isinstance(obs, dict) != isinstance(next_obs, dict):
            raise ValueError(
                "obs and next_obs must both be arrays or both be dicts, as in the first batch this FrameStorage stored"
            )
        if keys is not None:
            for name, value in (("obs", obs), ("next_obs", next_obs)):
                if tuple(sorted(value)) != keys:
                    raise ValueError(
                        f"field {name!r} has the keys {sorted(value)}; the FrameStorage stores {list(keys)} "
                        "(from the first batch). Every batch must carry the same observation keys."
                    )
            obs, next_obs = obs[frame_key], next_obs[frame_key]
        obs, next_obs = np.asarray(obs), np.asarray(next_obs)
        shape, dtype = (obs.shape[1:], obs.dtype) if first else (self.obs_shape, self.obs_dtype)
        if first:
            self._layout(shape)  # (refuses a stack_axis the observations do not have)
        for name, value in (("obs", obs), ("next_obs", next_obs)):
            if value.shape[1:] != shape or value.dtype != dtype or len(value) != len(batch):
                where = name if keys is None else f"{name}.{frame_key}"
                raise ValueError(
                    f"field {where!r} has shape {value.shape} and dtype {value.dtype}; the FrameStorage stores "
                    f"{len(batch)} rows (one per transition) of shape {shape} and dtype {dtype} "
                    "(allocated from the first batch). Every batch added to one buffer must carry observations of "
                    "one shape and dtype."
                )
        return obs, next_obs, keys, frame_key

    def _check_next_obs(
        self,
        batch: TransitionBatch,
        env: np.ndarray,
        obs_frames: np.ndarray,
        next_frames: np.ndarray,
        done: np.ndarray,
        chunk_rows: int,
    ) -> None:
        """Checked mode: refuse ``batch`` unless each observation equals the ``next_obs`` it will be stored as.

        An observation of env ``e`` (frames [B, S, *frame]) is stored once and is the ``next_obs`` of the env's
        transition ``n_step`` rows earlier that still waits for one (stored before, its whole stack kept in
        ``_pending``, or a row of this batch). Both stacks are compared whole, for every row, before anything is
        written: the rows of one env in time order, as the writes would resolve them (chunk by chunk for a batch
        of more than ``chunk_rows`` rows).
        """
        count, n, state = len(env), self.n_step or 1, self._state
        total = self._fields.total_added
        seq = self._stream_seq(batch)
        cut = seq is not None and (self._seen_seq is None or seq != self._seen_seq + 1)  # (then nothing waits)
        if not cut and count <= chunk_rows and len(state.array) > env.max() and _each_once(env):
            # the common step: each row resolves the oldest stored stack of its env, if that one still waits
            gen = state.recent[env, 0]
            waiting = gen >= max(total + count - self.capacity, 0)
            r = np.arange(count) if waiting.all() else np.flatnonzero(waiting)
            want = self._pending[env[r], state.head[env[r]]]
            if len(r) and not _rows_equal(want, obs_frames if len(r) == count else obs_frames[r]).all():
                bad = int(np.flatnonzero(~_rows_equal(want, obs_frames[r]))[0])
                self._refuse_next_obs(int(r[bad]), int(env[r[bad]]), int(gen[r[bad]]), want[bad], obs_frames[r[bad]])
            return
        rows = np.arange(count)
        # transitions still stored when a row is written: the row's chunk is stored by then
        if count <= chunk_rows:
            floor = np.full(count, max(total + count - self.capacity, 0))
        else:
            floor = np.maximum(total + np.minimum((rows // chunk_rows + 1) * chunk_rows, count) - self.capacity, 0)
        each_once = _each_once(env)
        occurrence = np.zeros(count, dtype=np.int64) if each_once else rank_within_group(env)
        checks = []  # (rows, the stacks they must equal, those stacks' transition numbers)
        if not cut:
            r = np.flatnonzero((occurrence < n) & (env < len(state.array)))
            gen = state.recent[env[r], occurrence[r]]
            r, gen = r[gen >= floor[r]], gen[gen >= floor[r]]
            position = (state.head[env[r]] + occurrence[r]) % (n + 1)  # (the k-th oldest of the env's ring)
            checks.append((r, self._pending[env[r], position], gen))
        if not each_once:  # an env's row k resolves its row k - n of this batch
            order = np.argsort(env, kind="stable")
            position = np.empty(count, dtype=np.int64)
            position[order] = rows
            r = np.flatnonzero(occurrence >= n)
            back = order[position[r] - n]
            gen = np.where(done[back], -1, total + back)
            keep = gen >= floor[r]
            checks.append((r[keep], next_frames[back[keep]], gen[keep]))
        refused = []  # (row, transition number, the stack it had to equal) of each mismatch
        for r, want, gen in checks:
            if len(r):
                refused += [(r[b], gen[b], want[b]) for b in np.flatnonzero(~_rows_equal(want, obs_frames[r]))]
        if refused:
            row, number, want = min(refused, key=lambda bad: bad[0])  # (the earliest row)
            self._refuse_next_obs(int(row), int(env[row]), int(number), want, obs_frames[row])

    def _refuse_next_obs(self, row: int, env: int, number: int, want: np.ndarray, got: np.ndarray) -> None:
        """Raise for row ``row`` (env ``env``) whose obs stack ``got`` is not the next_obs ``want`` of ``number``."""
        n = self.n_step or 1
        where = (
            f"row {row} of the batch (env {env}): its obs is not the next_obs of env {env}'s transition number "
            f"{number} (counted from 0 over all adds), {n} step(s) earlier"
        )
        if not _rows_equal(want[-1:], got[-1:])[0]:
            raise ValueError(
                f"{where}. This FrameStorage has n_step={n}: set n_step to the n of the NStepTransform that "
                "feeds the buffer (1 for 1-step data), and add every step of each env once, in time order."
            )
        differ = [j for j in range(len(want) - 1) if not _rows_equal(want[j : j + 1], got[j : j + 1])[0]]
        raise ValueError(
            f"{where}: their newest frames agree, but frame(s) {differ} of the stack (oldest first) differ. "
            "FrameStorage stores that obs once, also as the earlier transition's next_obs, so the batch is refused. "
            "Give each transition the next_obs its env returned, or mark a step whose next_obs is not the next "
            "obs (a reset) as terminated or truncated."
        )

    def _choose_frame_key(self, obs: Any) -> tuple[tuple[str, ...] | None, str | None]:
        """For Dict observations: the sorted keys and the frame key, checked or chosen (``None, None`` for arrays)."""
        if not isinstance(obs, dict):
            if self.frame_key is not None:
                raise ValueError(f"frame_key={self.frame_key!r} is for Dict observations; these are arrays: drop it")
            return None, None
        keys = tuple(sorted(obs))
        if any(isinstance(v, dict) for v in obs.values()):
            raise ValueError("FrameStorage stores Dict observations one level deep; flatten nested dicts first")
        if self.frame_key is None:
            pixels = [k for k in keys if np.ndim(obs[k]) >= 3]  # [B, ...] with at least two dims per observation
            if len(pixels) != 1:
                raise ValueError(
                    f"Dict observations with keys {list(keys)}: pass frame_key= naming the key whose observations "
                    f"are frames to store once (found {len(pixels)} keys with 2+ dims per observation: {pixels})"
                )
            return keys, pixels[0]
        if self.frame_key not in obs:
            raise ValueError(f"frame_key={self.frame_key!r} is not a key of the observations {list(keys)}")
        return keys, self.frame_key

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

    def _allocate(self, obs: np.ndarray, keys: tuple[str, ...] | None = None, frame_key: str | None = None) -> None:
        self.obs_dtype, self.obs_shape = obs.dtype, tuple(obs.shape[1:])
        self._axis, self.stack, frame = self._layout(self.obs_shape)
        self._obs_keys, self.frame_key = keys, frame_key
        self.frame_shape = tuple(frame)
        pool = self._array("pool", (self.pool_size, *frame), self.obs_dtype, 0)
        self._obs_refs = self._array("obs_refs", (self.capacity, self.stack), np.int64, -1)
        self._next_refs = self._array("next_refs", (self.capacity, self.stack), np.int64, -1)
        self._allocate_env_state(0)  # shaped for this stack and frame now
        # last: `pool` set means allocated, so an interrupt above leaves the next add to allocate again
        self.pool = pool

    def _array(self, name: str, shape: tuple[int, ...], dtype: Any, fill: int) -> np.ndarray:
        """A zero/``fill`` array, in RAM or as a memory-mapped file ``memmap_dir/name.npy``."""
        if self.memmap_dir is None:
            return np.full(shape, fill, dtype=dtype) if fill else np.zeros(shape, dtype=dtype)
        return open_fresh_memmap(self.memmap_dir, name, shape, dtype, fill)

    def _as_frames(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` [B, *obs_shape] as ``[B, S, *frame]`` (a view)."""
        return _frames_of(obs, self._axis)

    def _add_obs(
        self,
        env: np.ndarray,
        rows_of: slice | None,
        slots: np.ndarray,
        gens: np.ndarray | int,
        obs_frames: np.ndarray,
        next_frames: np.ndarray,
        done: np.ndarray,
        any_done: bool,
        trusted: bool,
    ) -> None:
        """Store one observation per env of ``env`` (int64 [R], each env once) and resolve what they are next_obs of.

        ``gens`` are the rows' transition numbers (int [R], or the first of
        ``R`` consecutive ones). The env state of these envs is read in one
        gather and written back in one scatter, or changed in place where the
        envs are the consecutive rows ``rows_of`` of the state. The trusted
        step (every stack continues its env's last one) costs about 15 numpy
        calls, whatever the number of envs.
        """
        state, stack, count = self._state, self.stack, len(env)
        row_state = state.array[rows_of] if rows_of is not None else state.array.take(env, axis=0)
        last, trust_col = row_state[:, :stack], 2 * stack
        floor = max(self.frames_written + count - self.pool_size, 0)  # frames from here survive this insert
        if trusted and stack > 1 and row_state[:, trust_col].all() and last.min() >= floor:
            # each stack is its env's last one shifted by one frame: write the newest frame, shift the references
            positions = self._write_frames(obs_frames[:, -1], as_range=True)
            last[:, :-1] = last[:, 1:]
            last[:, -1] = positions
            if any_done:
                row_state[:, trust_col] = ~done
        else:
            refs, cont = self._insert_stacks(last, obs_frames, row_state[:, trust_col] if trusted else None)
            last[:] = refs
            row_state[:, trust_col] = cont & ~done
        if slots[-1] - slots[0] == count - 1:  # (consecutive slots: a slice write)
            self._obs_refs[slots[0] : slots[0] + count] = last
        else:
            self._obs_refs[slots] = last
        # the transition n_step observations of this env back has this observation as next_obs, if it waits for
        # one (its number is the oldest in `recent`, -1 if none) and was not overwritten since
        recent = row_state[:, trust_col + 1 : trust_col + 1 + self.n_step]
        waiting_gen = recent[:, 0]
        waiting = waiting_gen >= max(self._fields.total_added - self.capacity, 0)
        if not trusted:  # (the whole stack: the obs n rows later is checked against it, see _check_next_obs)
            # into the ring's free position, the oldest stays where it is: an add redone after an interrupt
            # (head rolled back with the env state) finds the stacks it compares unchanged, so no snapshot copies them
            head, ring = row_state[:, -1], self.n_step + 1
            self._pending[env, (head + self.n_step) % ring] = next_frames
            row_state[:, -1] = (head + 1) % ring
        if waiting.all():
            self._next_refs[waiting_gen % self.capacity] = last
        elif waiting.any():
            self._next_refs[waiting_gen[waiting] % self.capacity] = last[waiting]
        recent[:, :-1] = recent[:, 1:]  # (a shift register of the env's last n transition numbers)
        if isinstance(gens, int):
            np.add(self._env_range[:count], gens, out=recent[:, -1])
        else:
            recent[:, -1] = gens
        if any_done:
            recent[done, -1] = -1  # an ended transition has its final observation: it waits for nothing
        if rows_of is None:
            state.array[env] = row_state

    def _add_finals(self, rows: np.ndarray, env: np.ndarray, slots: np.ndarray, next_frames: np.ndarray) -> None:
        """Store the final observations of the ended ``rows`` (at most one per env): shared by one episode's tails."""
        state = self._state
        e, finals = env[rows], next_frames[rows]
        cached = state.final[e]
        same = np.zeros(len(rows), dtype=bool)
        alive = self._alive(cached, len(rows) * self.stack)
        if alive.any():
            a = np.flatnonzero(alive)
            same[a] = _rows_equal(self.pool.take(cached[a] % self.pool_size, axis=0), finals[a])
        refs = cached
        if not same.all():
            new = np.flatnonzero(~same)
            refs = cached.copy()
            refs[new] = self._insert_stacks(state.last[e[new]], finals[new], None)[0]
        self._next_refs[slots[rows]] = refs
        state.final[e] = refs

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
        count, stack = frames.shape[0], self.stack
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
                cont = _rows_equal(self.pool.take(prev[:, 1:] % self.pool_size, axis=0), frames[:, :-1])
            elif check.any():
                a = np.flatnonzero(check)
                old = self.pool.take(prev[a, 1:] % self.pool_size, axis=0)
                cont = known.copy()
                cont[a] = _rows_equal(old, frames[a, :-1])
        if cont.all():  # the common step: one new frame per stack
            newest = self._write_frames(frames[:, -1])
            return np.concatenate([prev[:, 1:], newest[:, None]], axis=1), cont
        written = np.ones((count, stack), dtype=bool)
        frame = self.frame_shape
        repeats = _rows_equal(frames[:, :-1].reshape(-1, *frame), frames[:, 1:].reshape(-1, *frame))
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
        return refs.min(axis=1) >= floor

    def _write_frames(self, frames: np.ndarray, as_range: bool = False) -> np.ndarray:
        """Append ``frames`` [m, *frame] to the pool ring; returns their absolute positions (int64 [m]).

        ``frames_written`` is advanced *before* the pool changes: a frame about
        to be overwritten no longer counts as pooled, so however an interrupt
        cuts the copy short, no stack can be rebuilt from a changed frame.
        """
        count = len(frames)
        if count > self.pool_size:
            raise ValueError(
                f"a batch needs {count} new frames but the pool holds {self.pool_size}; raise capacity or extra_frames"
            )
        first_position = self.frames_written
        self.frames_written = first_position + count
        start = first_position % self.pool_size
        first = min(count, self.pool_size - start)
        self.pool[start : start + first] = frames[:first]
        if first < count:
            self.pool[: count - first] = frames[first:]
        if as_range and count <= len(self._env_range):  # (a cached arange: one numpy call fewer)
            return self._env_range[:count] + first_position
        return np.arange(first_position, first_position + count)

    def _allocate_env_state(self, num_envs: int) -> None:
        self._plan = None  # (it holds the arrays replaced here)
        n = self.n_step or 1
        self._state = _EnvState.empty(num_envs, self.stack, n)
        self._pending_backup: tuple[int, np.ndarray, np.ndarray] | None = None  # (see _back_up_pending)
        frame = getattr(self, "frame_shape", ())
        # the stack of each pending next_obs, checked against the obs that resolves it (checked mode): per env a
        # ring of n + 1, the oldest at the env's `head`, the newest n - 1 after it, and one free position
        self._pending = np.zeros((num_envs, n + 1, self.stack, *frame), dtype=self.obs_dtype or np.uint8)
        self._env_range = np.arange(max(num_envs, 64))
        self._env_range_bytes = self._env_range.astype(np.int64).tobytes()

    def _grow_envs(self, num_envs: int) -> None:
        """Make room for envs ``0 .. num_envs - 1``; the new state replaces the old in one assignment."""
        have = len(self._state.array)
        if num_envs <= have:
            return
        self._plan = None  # (it holds the arrays replaced here)
        size = max(num_envs, 2 * have)
        state = _EnvState.empty(size, self.stack, self.n_step or 1)
        state.array[:have] = self._state.array
        pending = np.zeros((size, *self._pending.shape[1:]), dtype=self._pending.dtype)
        pending[: len(self._pending)] = self._pending[:size]
        self._pending = pending
        self._env_range = np.arange(max(size, 64))
        self._env_range_bytes = self._env_range.astype(np.int64).tobytes()
        self._state = state

    # ------------------------------------------------------------------ reading
    def sampleable(self, indices: np.ndarray) -> np.ndarray:
        """Whether each slot in ``indices`` (int, any shape) may be sampled: ``next_obs`` arrived, frames kept."""
        if self.pool is None:
            return np.zeros(np.shape(indices), dtype=bool)
        floor = max(self.frames_written - self.pool_size, 0)
        obs_ok = self._obs_refs[indices].min(axis=-1) >= floor
        return obs_ok & (self._next_refs[indices].min(axis=-1) >= floor)

    @property
    def num_sampleable(self) -> int:
        """Stored transitions that can be sampled now."""
        return int(np.count_nonzero(self.sampleable(np.arange(len(self))))) if len(self) else 0

    def gather(self, indices: np.ndarray) -> TransitionBatch:
        """The transitions at ``indices`` (int, shape ``I``) as a batch ``[*I, ...]``; ``obs``/``next_obs`` rebuilt.

        Only meaningful for sampleable slots (see :meth:`sampleable`); buffers draw only those.
        """
        indices = np.asarray(indices)
        batch = self._fields.gather(indices)
        obs = self._stacks(self._obs_refs.take(indices, axis=0))
        next_obs = self._stacks(self._next_refs.take(indices, axis=0))
        if self._obs_keys is not None:  # Dict observations: the frames beside the per-transition keys
            obs = {**batch["obs"], self.frame_key: obs}
            next_obs = {**batch["next_obs"], self.frame_key: next_obs}
            obs, next_obs = ({k: d[k] for k in self._obs_keys} for d in (obs, next_obs))
        batch["obs"], batch["next_obs"] = obs, next_obs
        return batch

    def _stacks(self, refs: np.ndarray) -> np.ndarray:
        """Observations ``[*I, *obs_shape]`` from frame references ``[*I, S]``."""
        frames = self.pool.take(refs % self.pool_size, axis=0)  # [*I, S, *frame]
        lead = refs.ndim - 1
        if self._axis is None:
            return frames.reshape(*refs.shape[:-1], *self.frame_shape)
        return np.moveaxis(frames, lead, lead + self._axis) if self._axis else frames

    # ------------------------------------------------------------------ state
    def _arrays(self) -> dict[str, np.ndarray]:
        """Every array of the storage's state, by name (views, no copies)."""
        size = len(self)
        kept = min(self.frames_written, self.pool_size)
        arrays = {
            "pool": self.pool[:kept],
            "obs_refs": self._obs_refs[:size],
            "next_refs": self._next_refs[:size],
        }
        arrays.update(self._state.columns())
        for path, leaf in _named_leaves(self._fields.fields):
            arrays[f"field.{path}"] = leaf[:size]
        return arrays

    def _meta(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "pool_size": self.pool_size,
            "stack_axis": self.stack_axis,
            "n_step": self.n_step,
            "frames_written": self.frames_written,
            "cursor": self.cursor,
            "size": self.size,
            "total_added": self.total_added,
            "frame_key": self.frame_key,
            "obs_keys": None if self._obs_keys is None else list(self._obs_keys),
        }

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """The storage as tensors (views of its arrays, ``weights_only``-safe), or a reference to a saved directory.

        With ``checkpoint_dir`` set the storage is saved there (see :meth:`save`)
        and the state is ``{"directory": path, "save_id": ...}``.
        """
        if self.pool is None:
            return versioned({"capacity": self.capacity, "fields": None}, self.STATE_VERSION)
        if self.checkpoint_dir is not None:
            from ptl_rl.buffers.persist import save_to_checkpoint_dir

            return versioned(save_to_checkpoint_dir(self, self.checkpoint_dir), self.STATE_VERSION)
        state = self._meta()
        state["arrays"] = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self._arrays().items()}
        state["fields"] = list(self._fields.fields)
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state (or the directory it refers to); transitions waiting for ``next_obs`` stay unsampleable."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        if "directory" in state:
            from ptl_rl.buffers.persist import load_directory

            load_directory(self, state["directory"], expected_save_id=state.get("save_id"))
            return
        if state.get("fields") is None:
            if self.pool is not None:
                raise ValueError("the state holds an empty storage; load it into a fresh FrameStorage")
            return
        self._restore(state, {k: v.numpy() for k, v in state["arrays"].items()})

    def _restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Fill this storage from ``meta`` and ``arrays`` (as :meth:`_meta` and :meth:`_arrays` give them)."""
        if int(meta["capacity"]) != self.capacity or int(meta["pool_size"]) != self.pool_size:
            raise ValueError(
                f"the saved storage has capacity {meta['capacity']} and a pool of {meta['pool_size']} frames; this "
                f"one has {self.capacity} and {self.pool_size}. Create it with the same capacity and extra_frames."
            )
        if meta["stack_axis"] != self.stack_axis:
            raise ValueError(
                f"the saved storage has stack_axis={meta['stack_axis']}, this one {self.stack_axis}; use the same"
            )
        self._plan = None  # (it holds the arrays replaced here)
        size = int(meta["size"])
        self.n_step = meta["n_step"]
        self.frame_key = meta.get("frame_key")
        self._obs_keys = None if meta.get("obs_keys") is None else tuple(meta["obs_keys"])
        fields = {}
        for name, value in arrays.items():
            if name.startswith("field."):
                _set_path(fields, name[len("field.") :].split("."), value)
        self._fields.load_state_dict(
            {
                "capacity": self.capacity,
                "fields": {k: _tree_to_torch(v) for k, v in fields.items()},
                "cursor": int(meta["cursor"]),
                "size": size,
                "total_added": int(meta["total_added"]),
            }
        )
        pool = arrays["pool"]
        sample_obs = np.zeros((1, *self._obs_shape_from(pool.shape[1:], arrays["obs_refs"].shape[1])), pool.dtype)
        if self.pool is None:
            self._allocate(sample_obs, self._obs_keys, self.frame_key)
        self.pool[: len(pool)] = pool
        self.frames_written = int(meta["frames_written"])
        self._obs_refs[:size] = arrays["obs_refs"]
        self._next_refs[:size] = arrays["next_refs"]
        self._allocate_env_state(len(arrays["last"]))
        for name, column in self._state.columns().items():
            if name in arrays:  # (saves before "trust" existed lack it: nothing is trusted then)
                column[:] = arrays[name]
        # the envs start new episodes after a restore: no stored transition may take a later observation as next_obs,
        # and no stack is trusted to continue one stored before
        self._state.recent[:] = -1
        self._state.trust[:] = 0
        self._seen_seq = None
        self._retained = ()
        self._journal = None

    def _obs_shape_from(self, frame: tuple[int, ...], stack: int) -> tuple[int, ...]:
        if self.stack_axis is None:
            return tuple(frame)
        axis = self.stack_axis % (len(frame) + 1)
        return (*frame[:axis], stack, *frame[axis:])

    def save(self, directory: str | os.PathLike) -> str:
        """Write the storage to ``directory`` atomically (see :func:`ptl_rl.buffers.persist.save_directory`)."""
        from ptl_rl.buffers.persist import save_directory

        return save_directory(self, directory)

    def load(self, directory: str | os.PathLike) -> None:
        """Fill this storage from a directory written by :meth:`save`; a half-written one is refused."""
        from ptl_rl.buffers.persist import load_directory

        load_directory(self, directory)

    def __repr__(self) -> str:
        return (
            f"FrameStorage(size={len(self)}/{self.capacity}, stack={self.stack}, n_step={self.n_step}, "
            f"pool={self.pool_size}, frames_written={self.frames_written})"
        )


class _Checked(NamedTuple):
    """A batch's parts that passed :meth:`FrameStorage._checked` (rows first; ``rest`` last)."""

    obs: np.ndarray  # the framed part of obs [B, *obs_shape]
    next_obs: np.ndarray  # [B, *obs_shape]
    env: np.ndarray  # int64 [B], >= 0
    done: np.ndarray  # bool [B]: terminated | truncated
    rest: TransitionBatch  # the other fields (and the other keys of Dict observations)


def _each_once(env: np.ndarray) -> bool:
    """Whether no env occurs twice in ``env`` (int [B]); a sufficient test: the envs in increasing order."""
    return len(env) <= 1 or bool((env[1:] > env[:-1]).all())


def _frames_of(obs: np.ndarray, axis: int | None) -> np.ndarray:
    """``obs`` [B, *obs_shape] as ``[B, S, *frame]`` (a view), its stack along ``axis`` of an observation."""
    if axis is None:
        return obs[:, None]
    return np.moveaxis(obs, 1 + axis, 1) if axis else obs


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise equality of each row of ``a`` and ``b`` (same shape and dtype, [R, ...]) as bool [R]."""
    rows = a.shape[0]
    # (copying strided inputs to contiguous ones first is faster than comparing strided word views)
    a = np.ascontiguousarray(a).reshape(rows, -1).view(np.uint8)
    b = np.ascontiguousarray(b).reshape(rows, -1).view(np.uint8)
    width = a.shape[1]
    for word in (np.uint64, np.uint32, np.uint16):  # compare wide words: 8x fewer elements for uint8 frames
        if width % np.dtype(word).itemsize == 0:
            a, b = a.view(word), b.view(word)
            break
    return (a == b).all(axis=1)


def _occurrence_groups(env: np.ndarray, num_envs: int) -> list[np.ndarray | None]:
    """Row sets in which each env occurs at most once, in time order (row ``k`` of an env is in group ``k``).

    ``[None]`` (all rows, one group) when no env occurs twice, the common vector step.
    """
    if len(env) <= 1:
        return [None]
    counts = np.bincount(env, minlength=num_envs)
    if counts.max() <= 1:
        return [None]
    occurrence = rank_within_group(env)
    return [np.flatnonzero(occurrence == k) for k in range(int(occurrence.max()) + 1)]


class _EnvState:
    """Per-env bookkeeping of a :class:`FrameStorage` in one int64 array [E, W], with named column views.

    One array, so that a snapshot is one small copy and an env's state is read
    and written back with one gather and one scatter. Columns: the env's
    newest stack (``last``, S frame positions), the newest final stack
    (``final``, S), whether its next stack may be trusted to continue the
    newest (``trust``), and, oldest first, the numbers of the transitions of
    its last ``n`` observations that wait for their ``next_obs`` (``recent``,
    a shift register; -1 for none; a transition's slot is its number modulo
    ``capacity``), and where the oldest of their ``next_obs`` stacks is in
    the env's ring of ``n + 1`` pending stacks (``head``, checked mode).
    """

    __slots__ = ("array", "last", "final", "trust", "recent", "head")

    def __init__(self, array: np.ndarray, stack: int, n: int) -> None:
        s = stack
        self.array = array
        self.last, self.final = array[:, :s], array[:, s : 2 * s]
        self.trust, self.recent = array[:, 2 * s], array[:, 2 * s + 1 : 2 * s + 1 + n]
        self.head = array[:, 2 * s + 1 + n]

    @staticmethod
    def width(stack: int, n: int) -> int:
        """Columns of the array: ``last``, ``final`` (S each), ``trust``, ``recent`` (n), ``head``."""
        return 2 * stack + 2 + n

    @classmethod
    def empty(cls, num_envs: int, stack: int, n: int) -> _EnvState:
        state = cls(np.zeros((num_envs, cls.width(stack, n)), dtype=np.int64), stack, n)
        state.last[:] = -1
        state.final[:] = -1
        state.recent[:] = -1
        return state

    def columns(self) -> dict[str, np.ndarray]:
        """The state by column name (views)."""
        return {name: getattr(self, name) for name in self.__slots__[1:]}


def _leaves(tree: Any) -> Iterator[np.ndarray]:
    for _, leaf in _named_leaves(tree):
        yield leaf


def _named_leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _named_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif tree is not None:
        yield prefix, tree


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _tree_to_torch(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _tree_to_torch(v) for k, v in tree.items()}
    return torch.from_numpy(np.array(tree))  # a copy: saved arrays are read-only memory maps (small fields only)


def redraw_unsampleable(
    sampleable: Any, drawn: tuple[np.ndarray, ...], draw: Any, max_rounds: int = 100
) -> tuple[np.ndarray, ...]:
    """Replace the rows of ``drawn`` (arrays [B], the first the slots) that ``sampleable`` rejects by fresh draws.

    ``draw(count)`` returns ``count`` new rows as a tuple like ``drawn``. Rejection
    keeps each buffer's sampling distribution, restricted to sampleable slots.
    """
    drawn = tuple(np.array(a, copy=True) for a in drawn)
    for _ in range(max_rounds):
        bad = np.flatnonzero(~sampleable(drawn[0]))
        if len(bad) == 0:
            return drawn
        fresh = draw(len(bad))
        for array, new in zip(drawn, fresh, strict=True):
            array[bad] = new
    raise ValueError(
        f"after {max_rounds} redraws some sampled transitions still wait for their next_obs or lost their frames: "
        "the buffer holds too few sampleable transitions. Raise warmup (so sampling starts once more than "
        "num_envs * n_step transitions are stored) or FrameStorage's extra_frames. If almost no stored "
        "transition ever becomes sampleable, FrameStorage(n_step=...) may differ from the n of the "
        "NStepTransform that feeds it (with check=False nothing compares them)"
    )

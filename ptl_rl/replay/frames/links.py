"""How a FrameStorage links observations: obs stacks per env, next_obs from a later slot or a final stack.

A transition without an episode end has as ``next_obs`` the ``obs`` of the same env ``n_step``
transitions later: each env keeps a shift register of the numbers of its transitions that wait for one,
and the observation that arrives resolves the oldest. An ended transition's final observation is stored
after the batch's observations and cached per env (the tails of one episode share it). A cut in the
numbered stream resolves what waits from the batches' own ``next_obs`` (retained by reference).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.frames.env_state import EnvState
from ptl_rl.replay.frames.pool import FramePool, rows_bitwise_equal
from ptl_rl.replay.storage import ArrayStorage


class FrameLinks(FramePool):
    """Obs and next_obs references, the per-env state and the stream numbers of a FrameStorage (its second layer)."""

    n_step: int | None
    check: bool | None
    frame_key: str | None
    _fields: ArrayStorage  # every field but obs / next_obs (and the non-frame keys of Dict ones)
    _obs_keys: tuple[str, ...] | None  # sorted keys of Dict observations
    _obs_refs: np.ndarray  # int64 [capacity, S]
    _next_refs: np.ndarray  # int64 [capacity, S]; -1 in column 0: next_obs not arrived
    _state: EnvState
    _spare: EnvState  # same shape as _state: where the compiled insert writes the state it commits
    _pending: np.ndarray  # [E, n + 1, S, *frame]: pending next_obs stacks (checked mode)
    _pending_backup: tuple[int, np.ndarray, np.ndarray] | None
    _upstream: Iterator[TransitionBatch] | None
    _seen_seq: int | None  # stream_seq of the upstream's batch added last
    # (batch, its stream_seq) of the last few batches pulled or added: a batch keeps the number it had when it
    # was pulled, though the upstream has moved on by the time an interrupted add of it is done again
    _numbered: tuple[tuple[TransitionBatch, int | None], ...]
    # (first transition number, {"env_id": int64 [B], "next_obs": frames [B, S, *frame], ...}) of the last n_step
    # batches added (references: the compiled insert keeps the batch's own dict, the Python path a dict of these two)
    _retained: tuple[tuple[int, Mapping[str, np.ndarray]], ...]
    # the compiled insert's hold on the arrays (None: to build; False: not covered); reset wherever an array it
    # holds is replaced
    _kernel: Any

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

    def bind_upstream(self, upstream: Iterator[TransitionBatch] | None) -> None:
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
        if self._upstream is None:  # (not numbered: nothing to note)
            return None
        seq = getattr(self._upstream, "stream_seq", None)
        self.note_stream_seq(batch, seq)
        return seq

    # ------------------------------------------------------------------ allocation
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

    def _allocate_env_state(self, num_envs: int) -> None:
        self._kernel = None  # (it holds the arrays replaced here)
        n = self.n_step or 1
        state = EnvState.empty(num_envs, self.stack, n)
        self._pending_backup = None  # (see FrameInsert._back_up_pending)
        frame = getattr(self, "frame_shape", ())
        # the stack of each pending next_obs, checked against the obs that resolves it (checked mode): per env a
        # ring of n + 1, the oldest at the env's `head`, the newest n - 1 after it, and one free position
        self._pending = np.zeros((num_envs, n + 1, self.stack, *frame), dtype=self.obs_dtype or np.uint8)
        self._env_range = np.arange(max(num_envs, 64))
        self._env_range_bytes = self._env_range.astype(np.int64).tobytes()
        self._state, self._spare = state, state.spare()

    def _grow_envs(self, num_envs: int) -> None:
        """Make room for envs ``0 .. num_envs - 1``; the new state replaces the old in one assignment."""
        have = len(self._state.array)
        if num_envs <= have:
            return
        self._kernel = None  # (it holds the arrays replaced here)
        size = max(num_envs, 2 * have)
        state = EnvState.empty(size, self.stack, self.n_step or 1)
        state.array[:have] = self._state.array
        pending = np.zeros((size, *self._pending.shape[1:]), dtype=self._pending.dtype)
        pending[: len(self._pending)] = self._pending[:size]
        self._pending = pending
        self._env_range = np.arange(max(size, 64))
        self._env_range_bytes = self._env_range.astype(np.int64).tobytes()
        self._state, self._spare = state, state.spare()

    # ------------------------------------------------------------------ linking
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
        state, stack, count, n = self._state, self.stack, len(env), self.n_step or 1
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
        recent = row_state[:, trust_col + 1 : trust_col + 1 + n]
        waiting_gen = recent[:, 0]
        waiting = waiting_gen >= max(self._fields.total_added - self.capacity, 0)
        if not trusted:  # (the whole stack: the obs n rows later is checked against it, see _check_next_obs)
            # into the ring's free position, the oldest stays where it is: an add redone after an interrupt
            # (head rolled back with the env state) finds the stacks it compares unchanged, so no snapshot copies them
            head, ring = row_state[:, -1], n + 1
            self._pending[env, (head + n) % ring] = next_frames
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
            same[a] = rows_bitwise_equal(self._pool().take(cached[a] % self.pool_size, axis=0), finals[a])
        refs = cached
        if not same.all():
            new = np.flatnonzero(~same)
            refs = cached.copy()
            refs[new] = self._insert_stacks(state.last[e[new]], finals[new], None)[0]
        self._next_refs[slots[rows]] = refs
        state.final[e] = refs

    def _resolve_waiting(self) -> None:
        """At a cut: each transition still waiting for its ``next_obs`` takes the one its own batch carried.

        Its frames are written to the pool (deduplicated against the env's
        newest stack); a transition whose batch is no longer retained stays
        unsampleable. Then nothing waits: no later observation is linked.
        """
        state = self._state
        waiting = state.recent[state.recent >= max(self._fields.total_added - self.capacity, 0)]
        for first_gen, rows_of in self._retained if len(waiting) else ():
            env, next_frames = rows_of["env_id"], rows_of["next_obs"]
            rows = waiting - first_gen
            rows = rows[(rows >= 0) & (rows < len(env))]
            if len(rows):
                refs = self._insert_stacks(state.last[env[rows]], next_frames[rows], None)[0]
                self._next_refs[(first_gen + rows) % self.capacity] = refs
        state.recent[:] = -1

"""How a FrameStorage links observations: obs stacks per env, next_obs from a later slot or a final stack.

A transition without an episode end has as ``next_obs`` the ``obs`` of the same env ``n_step``
transitions later: each env keeps a shift register of the numbers of its transitions that wait for one,
and the observation that arrives resolves the oldest. An ended transition's final observation is stored
after the batch's observations and cached per env (the tails of one episode share it). A cut in the
numbered stream resolves what waits from the batches' own ``next_obs`` (retained by reference).

The links hold the two reference arrays and the retained batches; the frames are the pool's, the per-env
state is the env table's, and the numbers of the transitions still stored are the caller's: each method
is handed them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ptl_rl.replay.frames.env_state import EnvTable
from ptl_rl.replay.frames.pool import FramePool, open_array


class FrameLinks:
    """The obs and next_obs frame references of a FrameStorage's ``capacity`` slots.

    Attributes:
        obs_refs: int64 [capacity, S]: the pool positions of each slot's ``obs`` stack.
        next_refs: int64 [capacity, S]: those of its ``next_obs``; -1 in column 0: not arrived (unsampleable).
        retained: ``(first transition number, {"env_id": int64 [B], "next_obs": frames [B, S, *frame], ...})``
            of the last ``n_step`` batches added (references: the compiled insert keeps the batch's own dict,
            the Python path a dict of these two), which a cut resolves waiting transitions from.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.obs_refs = np.zeros((0, 1), dtype=np.int64)
        self.next_refs = np.zeros((0, 1), dtype=np.int64)
        self.retained: tuple[tuple[int, Mapping[str, np.ndarray]], ...] = ()

    def allocate(self, stack: int, memmap_dir: str | None) -> None:
        """Allocate both reference arrays for stacks of ``stack`` frames (every slot unsampleable)."""
        self.obs_refs = open_array(memmap_dir, "obs_refs", (self.capacity, stack), np.int64, -1)
        self.next_refs = open_array(memmap_dir, "next_refs", (self.capacity, stack), np.int64, -1)

    def sampleable(self, indices: np.ndarray, floor: int) -> np.ndarray:
        """Whether each slot of ``indices`` has its ``next_obs`` and all its frames at positions ``>= floor``."""
        obs_ok = self.obs_refs[indices].min(axis=-1) >= floor
        sampleable: np.ndarray = obs_ok & (self.next_refs[indices].min(axis=-1) >= floor)
        return sampleable

    def invalidate(self, start: int, count: int) -> np.ndarray:
        """The ``count`` slots from ``start`` (int64 [count], wrapping), marked unsampleable (next_obs pending).

        Called before any of their fields change: a half-written slot is never sampleable.
        """
        if start + count <= self.capacity:
            self.next_refs[start : start + count, 0] = -1
            return np.arange(start, start + count)
        slots = (start + np.arange(count)) % self.capacity
        self.next_refs[slots, 0] = -1
        return slots

    def retain(self, first_gen: int, rows_of: Mapping[str, np.ndarray], n: int) -> None:
        """Keep a reference to an added batch's ``env_id`` and ``next_obs`` frames (the newest ``n`` batches)."""
        self.retained = (*self.retained, (first_gen, rows_of))[-n:]

    # ------------------------------------------------------------------ linking
    def add_obs(
        self,
        pool: FramePool,
        envs: EnvTable,
        env: np.ndarray,
        rows_of: slice | None,
        slots: np.ndarray,
        gens: np.ndarray | int,
        obs_frames: np.ndarray,
        next_frames: np.ndarray,
        done: np.ndarray,
        any_done: bool,
        trusted: bool,
        stored_from: int,
    ) -> None:
        """Store one observation per env of ``env`` (int64 [R], each env once) and resolve what they are next_obs of.

        ``gens`` are the rows' transition numbers (int [R], or the first of
        ``R`` consecutive ones); transitions numbered below ``stored_from``
        were overwritten. The env state of these envs is read in one gather
        and written back in one scatter, or changed in place where the envs
        are the consecutive rows ``rows_of`` of the state. The trusted step
        (every stack continues its env's last one) costs about 15 numpy calls,
        whatever the number of envs.
        """
        state, stack, count, n = envs.state, pool.stack, len(env), envs.n
        row_state = state.array[rows_of] if rows_of is not None else state.array.take(env, axis=0)
        last, trust_col = row_state[:, :stack], 2 * stack
        if trusted and stack > 1 and row_state[:, trust_col].all() and last.min() >= pool.floor(count):
            # each stack is its env's last one shifted by one frame: write the newest frame, shift the references
            positions = pool.write(obs_frames[:, -1], envs.arange)
            last[:, :-1] = last[:, 1:]
            last[:, -1] = positions
            if any_done:
                row_state[:, trust_col] = ~done
        else:
            refs, cont = pool.insert_stacks(last, obs_frames, row_state[:, trust_col] if trusted else None)
            last[:] = refs
            row_state[:, trust_col] = cont & ~done
        if slots[-1] - slots[0] == count - 1:  # (consecutive slots: a slice write)
            self.obs_refs[slots[0] : slots[0] + count] = last
        else:
            self.obs_refs[slots] = last
        # the transition n_step observations of this env back has this observation as next_obs, if it waits for
        # one (its number is the oldest in `recent`, -1 if none) and was not overwritten since
        recent = row_state[:, trust_col + 1 : trust_col + 1 + n]
        waiting_gen = recent[:, 0]
        waiting = waiting_gen >= stored_from
        if not trusted:  # (the whole stack: the obs n rows later is checked against it, see checks.py)
            # into the ring's free position, the oldest stays where it is: an add done again (head rolled back
            # with the env state) finds the stacks it compares unchanged, so no snapshot copies them
            head, ring = row_state[:, -1], n + 1
            envs.pending[env, (head + n) % ring] = next_frames
            row_state[:, -1] = (head + 1) % ring
        if waiting.all():
            self.next_refs[waiting_gen % self.capacity] = last
        elif waiting.any():
            self.next_refs[waiting_gen[waiting] % self.capacity] = last[waiting]
        recent[:, :-1] = recent[:, 1:]  # (a shift register of the env's last n transition numbers)
        if isinstance(gens, int):
            np.add(envs.arange[:count], gens, out=recent[:, -1])
        else:
            recent[:, -1] = gens
        if any_done:
            recent[done, -1] = -1  # an ended transition has its final observation: it waits for nothing
        if rows_of is None:
            state.array[env] = row_state

    def add_finals(
        self,
        pool: FramePool,
        envs: EnvTable,
        rows: np.ndarray,
        env: np.ndarray,
        slots: np.ndarray,
        next_frames: np.ndarray,
    ) -> None:
        """Store the final observations of the ended ``rows`` (at most one per env): shared by one episode's tails."""
        state = envs.state
        e, finals = env[rows], next_frames[rows]
        cached = state.final[e]
        same = np.zeros(len(rows), dtype=bool)
        alive = pool.alive(cached, len(rows) * pool.stack)
        if alive.any():
            a = np.flatnonzero(alive)
            same[a] = pool.equal_to(cached[a], finals[a])
        refs = cached
        if not same.all():
            new = np.flatnonzero(~same)
            refs = cached.copy()
            refs[new] = pool.insert_stacks(state.last[e[new]], finals[new], None)[0]
        self.next_refs[slots[rows]] = refs
        state.final[e] = refs

    def resolve_waiting(self, pool: FramePool, envs: EnvTable, stored_from: int) -> None:
        """At a cut: each transition still waiting for its ``next_obs`` takes the one its own batch carried.

        Its frames are written to the pool (deduplicated against the env's
        newest stack); a transition whose batch is no longer retained stays
        unsampleable. Then nothing waits: no later observation is linked.
        """
        state = envs.state
        waiting = state.recent[state.recent >= stored_from]
        for first_gen, rows_of in self.retained if len(waiting) else ():
            env, next_frames = rows_of["env_id"], rows_of["next_obs"]
            rows = waiting - first_gen
            rows = rows[(rows >= 0) & (rows < len(env))]
            if len(rows):
                refs = pool.insert_stacks(state.last[env[rows]], next_frames[rows], None)[0]
                self.next_refs[(first_gen + rows) % self.capacity] = refs
        state.recent[:] = -1

"""The Python path of a FrameStorage add: the rows of a checked batch written in chunks, per env, in time order.

This is the reference: the compiled insert (``compiled.py``, ``_frame_insert.c``) replays these steps in
the same order and must leave a bit-identical storage.
"""

from __future__ import annotations

import numpy as np

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.frames.checks import Checked, FrameChecks
from ptl_rl.replay.frames.env_state import each_once, occurrence_groups


class FrameInsert(FrameChecks):
    """The Python insert of a FrameStorage (its fourth layer): checked rows to fields, frames and links."""

    def _add_chunks(self, batch: TransitionBatch) -> np.ndarray:
        """Check ``batch`` in full (nothing written if refused), then store it, in chunks if it is large."""
        checked = self._checked(batch)
        if not self.trusted and not each_once(checked.env):
            self._back_up_pending(checked.env)
        count, limit, seq = len(batch), self._chunk_rows(len(batch)), self._stream_seq(batch)
        if count <= limit:
            return self._add(batch, checked, seq)
        # only the newest `capacity` rows survive, and no write may need more frames than the pool holds; the
        # chunks after the first continue the batch's place in the stream (no cut between them)
        slots = []
        for lo in range(0, count, limit):
            part = slice(lo, lo + limit)
            c = checked
            rows = Checked(c.obs[part], c.next_obs[part], c.env[part], c.done[part], c.rest.rows(part))
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

    def _add(self, batch: TransitionBatch, checked: Checked, seq: int | None, continued: bool = False) -> np.ndarray:
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
            for rows in occurrence_groups(env, highest + 1):  # obs first, in time order per env
                if rows is None:  # each env once, out of env order: all rows, as positions (not a new axis)
                    rows = np.arange(count)
                self._add_obs(
                    env[rows], None, slots[rows], first_gen + rows, obs_frames[rows], next_frames[rows],
                    done[rows], any_done, trusted,
                )  # fmt: skip
        if any_done:
            ended = np.flatnonzero(done)
            state = self._state
            for rows in occurrence_groups(env[ended], len(state.array)):
                self._add_finals(ended if rows is None else ended[rows], env, slots, next_frames)
            # an env whose last row in this batch ended its episode: its newest observation is the final one
            last_row = np.zeros(len(state.array), dtype=np.int64) - 1
            last_row[env] = np.arange(len(env))  # later rows win
            envs = np.flatnonzero(last_row >= 0)
            finished = envs[done[last_row[envs]]]
            state.last[finished] = state.final[finished]
        # the newest batches stay referenced (no copy): at a cut, their rows still waiting take their own next_obs
        self._retained = (*self._retained, (first_gen, {"env_id": env, "next_obs": next_frames}))[-self.n_step :]
        return slots

"""The Python path of a FrameStorage add: the rows of a checked batch written in chunks, per env, in time order.

This is the reference: the compiled insert (``compiled.py``, ``_frame_insert.c``) replays these steps in
the same order and must leave a bit-identical storage. It changes the per-env state only in a copy
(:meth:`~ptl_rl.replay.frames.env_state.EnvTable.begin_write`), so the state an add began from is what
the storage's journal restores before doing a cut add again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.frames.checks import Checked, ObsLayout, check_next_obs, checked_parts, chunk_rows
from ptl_rl.replay.frames.env_state import EnvTable, each_once, occurrence_groups
from ptl_rl.replay.frames.links import FrameLinks
from ptl_rl.replay.frames.pool import FramePool, frame_layout, frames_of
from ptl_rl.replay.frames.stream import StreamNumbers
from ptl_rl.replay.storage import ArrayStorage


class PythonInsert:
    """Checked rows to fields, frames and links: the parts of one FrameStorage, written in the reference order.

    Args:
        layout: the observations' layout (set by the first batch).
        fields: the storage of every field but the frames (its counters are the storage's).
        pool, links, envs, stream: the storage's frame pool, links, per-env table and stream numbers.
        memmap_dir: where the first batch allocates the pool and the references (``None``: in RAM).
    """

    def __init__(
        self,
        layout: ObsLayout,
        fields: ArrayStorage,
        pool: FramePool,
        links: FrameLinks,
        envs: EnvTable,
        stream: StreamNumbers,
        memmap_dir: str | None,
    ) -> None:
        self.layout, self.fields, self.pool, self.links, self.envs, self.stream = (
            layout, fields, pool, links, envs, stream,
        )  # fmt: skip
        self.memmap_dir = memmap_dir

    def add(self, batch: TransitionBatch, n: int, trusted: bool) -> np.ndarray:
        """Check ``batch`` in full (nothing written if refused), then store it, in chunks if it is large.

        ``n``: the storage's n-step; ``trusted``: stacks inside an episode are taken to continue without
        comparing. Returns the slots written (int64 [B], the newest ``capacity`` of a larger batch).
        """
        checked = self._checked(batch, n, trusted)
        self.envs.begin_write()  # (the add changes a copy: the state it began from stays as a snapshot took it)
        if not trusted and not each_once(checked.env):
            self.envs.back_up_pending(checked.env, self.fields.total_added)
        capacity = self.fields.capacity
        count, limit = len(batch), chunk_rows(len(batch), self.pool.stack, capacity, self.pool.size)
        seq = self.stream.seq_of(batch)
        if count <= limit:
            return self._add(batch, checked, seq, n, trusted)
        # only the newest `capacity` rows survive, and no write may need more frames than the pool holds; the
        # chunks after the first continue the batch's place in the stream (no cut between them)
        slots = []
        for lo in range(0, count, limit):
            part = slice(lo, lo + limit)
            c = checked
            rows = Checked(
                c.obs[part], c.next_obs[part], c.env[part], c.done[part], c.rest.rows(part), c.keys, c.frame_key
            )
            slots.append(self._add(batch.rows(part), rows, seq, n, trusted, continued=lo > 0))
        return np.concatenate(slots)[-capacity:]

    def _checked(self, batch: TransitionBatch, n: int, trusted: bool) -> Checked:
        """Every check of an add, before its first write: the parts of ``batch`` to store, or a ``ValueError``.

        In checked mode each observation must be the whole ``next_obs`` stack of the transition it resolves
        (:func:`~ptl_rl.replay.frames.checks.check_next_obs`). The first batch allocates the storage only
        once it passed: a refused first batch leaves it unallocated.
        """
        pool, fields = self.pool, self.fields
        first = pool.frames is None
        try:
            checked = checked_parts(batch, self.layout, fields, first, pool.size)
            env = checked.env
            if len(env) and not trusted:
                if first:
                    axis, stack, _ = frame_layout(self.layout.stack_axis, checked.obs.shape[1:], pool.size)
                else:
                    axis, stack = pool.axis, pool.stack
                check_next_obs(
                    env, frames_of(checked.obs, axis), frames_of(checked.next_obs, axis), checked.done,
                    envs=self.envs, n=n, cut=self.stream.is_cut(self.stream.seq_of(batch)),
                    total_added=fields.total_added, capacity=fields.capacity,
                    chunk=chunk_rows(len(env), stack, fields.capacity, pool.size),
                )  # fmt: skip
        except (TypeError, ValueError):
            if first:  # (the inner check allocated the other fields from this batch)
                fields.fields = None
            raise
        if first:
            self._allocate(checked, n)
        return checked

    def _allocate(self, checked: Checked, n: int) -> None:
        """Allocate the storage for the observations of a first batch (``checked``, its parts)."""
        layout = self.layout
        layout.keys, layout.frame_key = checked.keys, checked.frame_key
        obs = checked.obs
        allocate(layout, self.pool, self.links, self.envs, obs.shape[1:], obs.dtype, n, self.memmap_dir)

    def _add(
        self, batch: TransitionBatch, checked: Checked, seq: int | None, n: int, trusted: bool, continued: bool = False
    ) -> np.ndarray:
        """Store ``batch`` (at most one chunk of rows), which passed :meth:`_checked`: nothing here refuses.

        ``seq``: the upstream's number of the batch (``None``: not numbered); ``continued``: a chunk after the
        first of one batch (its number is the chunk before's, not a cut).
        """
        pool, links, envs, fields = self.pool, self.links, self.envs, self.fields
        count, rest, env, done = len(batch), checked.rest, checked.env, checked.done
        if count == 0:
            return fields.write_checked(rest)
        capacity = fields.capacity
        # a vector step holds each env once, in order: then no grouping, and often one slice of the env state
        if env.tobytes() == envs.arange_bytes[: 8 * count]:  # envs 0 .. count-1: one bytes compare, no ufunc
            in_order, lowest, highest = True, 0, count - 1
        else:
            in_order = count == 1 or bool((env[1:] > env[:-1]).all())
            lowest, highest = (int(env[0]), int(env[-1])) if in_order else (int(env.min()), int(env.max()))
        any_done = bool(done.any())
        envs.grow(highest + 1)
        stream = self.stream
        if seq is not None and not continued:
            if stream.is_cut(seq):
                # steps are missing (a cut in the stream, a restore, a batch lost to a cut add): no stored
                # transition takes a later observation as next_obs, and no stack is trusted to continue
                links.resolve_waiting(pool, envs, max(fields.total_added - capacity, 0))
                envs.state.trust[:] = 0
            stream.seen = seq
        # the slots to overwrite become unsampleable before any of their fields change (next_obs pending)
        first_gen = fields.total_added
        slots = links.invalidate(fields.cursor, count)
        fields.write_checked(rest)
        stored_from = max(fields.total_added - capacity, 0)
        obs_frames, next_frames = pool.as_frames(checked.obs), pool.as_frames(checked.next_obs)
        if in_order:
            rows_of = slice(lowest, highest + 1) if highest - lowest + 1 == count else None
            links.add_obs(
                pool, envs, env, rows_of, slots, first_gen, obs_frames, next_frames, done, any_done, trusted,
                stored_from,
            )  # fmt: skip
        else:
            for rows in occurrence_groups(env, highest + 1):  # obs first, in time order per env
                if rows is None:  # each env once, out of env order: all rows, as positions (not a new axis)
                    rows = np.arange(count)
                links.add_obs(
                    pool, envs, env[rows], None, slots[rows], first_gen + rows, obs_frames[rows], next_frames[rows],
                    done[rows], any_done, trusted, stored_from,
                )  # fmt: skip
        if any_done:
            ended = np.flatnonzero(done)
            state = envs.state
            for rows in occurrence_groups(env[ended], len(state.array)):
                links.add_finals(pool, envs, ended if rows is None else ended[rows], env, slots, next_frames)
            # an env whose last row in this batch ended its episode: its newest observation is the final one
            last_row = np.zeros(len(state.array), dtype=np.int64) - 1
            last_row[env] = np.arange(len(env))  # later rows win
            ended_envs = np.flatnonzero(last_row >= 0)
            finished = ended_envs[done[last_row[ended_envs]]]
            state.last[finished] = state.final[finished]
        # the newest batches stay referenced (no copy): at a cut, their rows still waiting take their own next_obs
        links.retain(first_gen, {"env_id": env, "next_obs": next_frames}, n)
        return slots


def allocate(
    layout: ObsLayout,
    pool: FramePool,
    links: FrameLinks,
    envs: EnvTable,
    shape: tuple[int, ...],
    dtype: Any,
    n: int,
    memmap_dir: str | None,
) -> None:
    """Allocate the pool, the references and the per-env table for observations of ``shape`` and ``dtype``."""
    layout.dtype, layout.shape = np.dtype(dtype), tuple(shape)
    axis, stack, frame = frame_layout(layout.stack_axis, layout.shape, pool.size)
    links.allocate(stack, memmap_dir)
    envs.reset(0, stack, n, frame, dtype)
    # last: the pool's frames set means allocated, so a cut above leaves the next add to allocate again
    pool.allocate(axis, stack, frame, dtype)

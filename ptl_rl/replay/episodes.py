"""Which stored steps form which episode: the index a hindsight replay buffer draws its goals from.

A replay ring interleaves the steps of every env (a vector env adds one row
per env and step), so the steps of one episode are scattered over the ring.
:class:`EpisodeIndex` keeps, next to the ring and vectorized over the rows of
each add:

* per slot: the step's number ``t`` in its episode, the slot of the step
  before it (``prev``, -1 at ``t = 0``), and once the episode has ended its
  length ``T`` and where its steps are listed in ``order``;
* ``order``: a second ring (``2 * capacity`` slot numbers) to which every
  finished episode appends the slots of its steps in time order, so that step
  ``k`` of the episode of a stored step is one lookup,
  ``order[(start + k) % len(order)]``;
* per env: the running episode's last slot, step count and the write number
  of its first step.

An episode is *complete* from its last step (``terminated | truncated``, or a
cut: :meth:`plan_close`) until the ring overwrites its first step: only then
are all its steps stored. Its slots are marked drawable (length > 0) while it
is complete and only then; an episode whose first step was overwritten before
it ended never is. The ring is first-in first-out and an env's steps arrive in
time order, so a complete episode loses its first step before any other, and
one check at its first step finds the whole episode.

Why ``2 * capacity`` entries suffice: while an episode ``X`` of ``|X|`` steps
is complete, the entries appended after it belong to episodes that ended
later. Their steps written after ``X``'s first step are all still stored and
are not ``X``'s (at most ``capacity - |X|``); the steps written before it
belong to the at most one episode per env that was running when ``X`` began,
which were all stored together with ``X`` when the first of them ended (at
most ``capacity - |X|`` again). So fewer than ``2 * capacity`` entries follow
``X``'s, and they never overwrite them.

Every change an add makes is first computed into a :class:`EpisodePlan` of
absolute values (nothing changes while planning), then written by
:meth:`EpisodeIndex.apply` with plain assignments: applying a plan again, after
an interrupt cut the first application short, gives the same state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from ptl_rl.replay.sumtree import SumTree

_EMPTY = np.zeros(0, dtype=np.int64)


class EpisodePlan(NamedTuple):
    """What one add (or one close) sets in an :class:`EpisodeIndex`: absolute values, so applying twice is safe.

    The new counters (``written``, ``order_written``) and per-env arrays (``last_slot``, ``env_steps``,
    ``first_written``, int64 [E]); the rows written (``slots``, ``step``, ``prev``, int64 [B]); the slots of
    episodes that stop being drawable (``lost``); the ``order`` entries written (``order_pos``,
    ``order_slots``); and the slots of episodes completed now with their episode's ``finished_start`` and
    ``finished_length``.
    """

    written: int  # rows written after the add
    order_written: int  # entries appended to ``order`` after the add
    last_slot: np.ndarray  # per env [E]: slot of the running episode's last step, -1 if none
    env_steps: np.ndarray  # per env [E]: steps of the running episode so far
    first_written: np.ndarray  # per env [E]: write number of the running episode's first step
    slots: np.ndarray  # the rows written: their slots [B] ...
    step: np.ndarray  # ... their step number in the episode [B] ...
    prev: np.ndarray  # ... and the slot of the step before (-1 at t = 0) [B]
    lost: np.ndarray  # slots of complete episodes whose first step is overwritten now: no longer drawable
    order_pos: np.ndarray  # entries of ``order`` written (positions modulo its length) ...
    order_slots: np.ndarray  # ... and the slots they list
    finished: np.ndarray  # slots of the episodes completed now: drawable from now on ...
    finished_start: np.ndarray  # ... the absolute position of their episode's first step in ``order`` ...
    finished_length: np.ndarray  # ... and their episode's length


# what load_state_dict replaces: every array and counter of an index of the same capacity
_INDEX_STATE = (
    "step", "prev", "start", "length", "order", "order_written", "written", "last_slot", "env_steps", "first_written",
)  # fmt: skip


class EpisodeIndex:
    """Episode boundaries of the steps in a ring of ``capacity`` slots (see the module docstring).

    Rows must be added in the ring's order (each add's slots follow the previous
    add's, wrapping) with one env's rows in time order; an episode ends at a row
    with ``done`` (``terminated | truncated``).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.step = np.zeros(self.capacity, dtype=np.int64)
        self.prev = np.full(self.capacity, -1, dtype=np.int64)
        self.start = np.full(self.capacity, -1, dtype=np.int64)
        self.length = np.zeros(self.capacity, dtype=np.int64)  # > 0: the slot's episode is complete (drawable)
        self.order = np.zeros(2 * self.capacity, dtype=np.int64)
        self.order_written = 0
        self.written = 0
        self.last_slot = _EMPTY.copy()
        self.env_steps = _EMPTY.copy()
        self.first_written = _EMPTY.copy()

    # ------------------------------------------------------------------ planning (changes nothing)
    def plan_add(self, slots: np.ndarray, env: np.ndarray, done: np.ndarray) -> EpisodePlan:
        """The changes for rows just written at ``slots`` (int64 [B], a run of ring slots) from ``env`` with ``done``.

        ``env`` int64 [B] (>= 0) and ``done`` bool [B] are the rows' ``env_id`` and ``terminated | truncated``.
        """
        count = len(slots)
        written = self.written + count
        last_slot, env_steps, first_written = self._grown(int(env.max()) + 1 if count else 0)
        # rows that overwrite a stored step: the complete episodes that begin at one of them are broken now
        overwritten = slots[self.written + np.arange(count) >= self.capacity] if written > self.capacity else _EMPTY
        heads = overwritten[(self.length[overwritten] > 0) & (self.step[overwritten] == 0)]
        lost = self.order[self._order_positions(self.start[heads], self.length[heads])]
        grouped = not (np.diff(env) > 0).all()  # else one row per env, as from a vector env step: no grouping
        link = self._link_grouped if grouped else self._link_unique
        step, prev, episode_first, last_rows = link(env, done, slots, env_steps, last_slot, first_written)
        # per env after the batch: its last row's episode, unless that row ended it
        envs, ended = env[last_rows], done[last_rows]
        last_slot[envs] = np.where(ended, -1, slots[last_rows])
        env_steps[envs] = np.where(ended, 0, step[last_rows] + 1)
        first_written[envs] = np.where(ended, 0, episode_first[last_rows])
        ends = np.flatnonzero(done)
        # (walking back from a row: with one row per env only its own `prev` is new, the steps before are older)
        prev_of = (lambda x: self._prev_after(x, slots, prev)) if grouped else self.prev.take
        finished = self._plan_finish(slots[ends], step[ends] + 1, episode_first[ends], written, prev[ends], prev_of)
        return EpisodePlan(
            written, finished[0], last_slot, env_steps, first_written, slots, step, prev, lost, *finished[1:]
        )

    def _link_unique(
        self,
        env: np.ndarray,
        done: np.ndarray,
        slots: np.ndarray,
        env_steps: np.ndarray,
        last_slot: np.ndarray,
        first: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per row of distinct envs: step number, previous slot, write number of the episode's first step; and
        each env's last row (here: every row)."""
        step = env_steps[env]
        begins = step == 0
        rows = np.arange(len(env))
        return step, np.where(begins, -1, last_slot[env]), np.where(begins, self.written + rows, first[env]), rows

    def _link_grouped(
        self,
        env: np.ndarray,
        done: np.ndarray,
        slots: np.ndarray,
        env_steps: np.ndarray,
        last_slot: np.ndarray,
        first: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_link_unique` for any rows: several may come from one env (in time order), ending episodes."""
        count = len(env)
        by_env = np.argsort(env, kind="stable")  # stable: time order within an env
        e, d, s = env[by_env], done[by_env], slots[by_env]
        number = self.written + by_env  # each row's write number
        group_first = np.ones(count, dtype=bool)
        group_first[1:] = e[1:] != e[:-1]
        after_end = np.zeros(count, dtype=bool)
        after_end[1:] = d[:-1] & ~group_first[1:]
        begins = after_end | (group_first & (env_steps[e] == 0))  # the row is step 0 of a new episode
        piece_first = np.flatnonzero(begins | group_first)  # first row of each run of one episode in this batch
        piece = np.cumsum(begins | group_first) - 1
        continues = (group_first & ~begins)[piece_first]  # the run continues the env's running episode
        offset = np.where(continues, env_steps[e[piece_first]], 0)
        sorted_prev = np.empty(count, dtype=np.int64)
        sorted_prev[1:] = s[:-1]
        sorted_prev[piece_first] = np.where(continues, last_slot[e[piece_first]], -1)
        step, prev, episode_first = (np.empty(count, dtype=np.int64) for _ in range(3))
        step[by_env] = np.arange(count) - piece_first[piece] + offset[piece]
        prev[by_env] = sorted_prev
        episode_first[by_env] = np.where(continues, first[e[piece_first]], number[piece_first])[piece]
        group_last = np.ones(count, dtype=bool)
        group_last[:-1] = group_first[1:]
        return step, prev, episode_first, by_env[group_last]

    def plan_close(self) -> EpisodePlan:
        """The changes that end every running episode at its last stored step (a cut: the streams went on elsewhere)."""
        running = np.flatnonzero(self.env_steps > 0)
        last = self.last_slot[running]
        finished = self._plan_finish(
            last, self.env_steps[running], self.first_written[running], self.written, self.prev[last], self.prev.take
        )
        size = len(self.env_steps)
        return EpisodePlan(
            self.written,
            finished[0],
            np.full(size, -1, dtype=np.int64),
            np.zeros(size, dtype=np.int64),
            np.zeros(size, dtype=np.int64),
            _EMPTY,
            _EMPTY,
            _EMPTY,
            _EMPTY,
            *finished[1:],
        )

    def _plan_finish(
        self,
        last: np.ndarray,
        lengths: np.ndarray,
        first_written: np.ndarray,
        written: int,
        last_prev: np.ndarray,
        prev_of: Callable[[np.ndarray], np.ndarray],
    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Order entries and slot marks of the episodes ending at slots ``last`` with ``lengths`` steps.

        ``last_prev`` holds the slots of the steps before the last ones, ``prev_of`` gives ``prev`` of any
        older slot. Only episodes whose first step (write number ``first_written``) is still stored once
        ``written`` rows are written are complete; the others are left undrawable. Returns the new
        ``order_written`` and the ``order_pos``, ``order_slots``, ``finished``, ``finished_start`` and
        ``finished_length`` of the plan.
        """
        complete = first_written >= written - self.capacity
        if not complete.all():
            last, lengths, last_prev = last[complete], lengths[complete], last_prev[complete]
        if len(last) == 0:
            return self.order_written, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY
        # walk back from the last steps, all episodes at once: column j holds step T-1-j (one lookup per step).
        # A shorter episode's walk runs on past its first step (prev -1 reads some slot): masked out below
        longest = int(lengths.max())
        walk = np.empty((longest, len(last)), dtype=np.int64)
        walk[0] = last
        if longest > 1:
            walk[1] = last_prev
        for j in range(2, longest):
            walk[j] = prev_of(walk[j - 1])
        in_time_order = walk[::-1].T  # step 0 first, preceded by the masked part for the shorter episodes
        slots = in_time_order[np.arange(longest) >= longest - lengths[:, None]]
        total = len(slots)
        starts = self.order_written + np.cumsum(lengths) - lengths
        positions = (self.order_written + np.arange(total)) % len(self.order)
        return (
            self.order_written + total,
            positions,
            slots,
            slots,
            np.repeat(starts, lengths),
            np.repeat(lengths, lengths),
        )

    def _prev_after(self, x: np.ndarray, slots: np.ndarray, new_prev: np.ndarray) -> np.ndarray:
        """``prev`` of the slots ``x`` as it will be once the rows at ``slots`` (a run of the ring) are linked."""
        row = (x - slots[0]) % self.capacity
        in_batch = row < len(slots)
        return np.where(in_batch, new_prev.take(np.minimum(row, len(slots) - 1)), self.prev.take(x))

    def _order_positions(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Positions in ``order`` of every step of the episodes listed from ``starts`` with ``lengths`` steps."""
        if len(starts) == 0:
            return _EMPTY
        total = int(lengths.sum())
        within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        positions: np.ndarray = (np.repeat(starts, lengths) + within) % len(self.order)
        return positions

    def _grown(self, num_envs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the per-env arrays, with room for ``num_envs`` envs."""
        grow = max(0, num_envs - len(self.env_steps))
        if not grow:
            return self.last_slot.copy(), self.env_steps.copy(), self.first_written.copy()
        return (
            np.concatenate([self.last_slot, np.full(grow, -1, dtype=np.int64)]),
            np.concatenate([self.env_steps, np.zeros(grow, dtype=np.int64)]),
            np.concatenate([self.first_written, np.zeros(grow, dtype=np.int64)]),
        )

    # ------------------------------------------------------------------ applying (assignments only)
    def apply(self, plan: EpisodePlan, tree: SumTree, weight: float = 1.0) -> None:
        """Write ``plan``; ``tree`` gets ``weight`` for the slots that become drawable, 0 for those that stop being.

        Idempotent: every write is an assignment of values fixed in the plan.
        """
        # a cut anywhere below is finished by running the whole plan again (the journal's redo phase)
        self.written = plan.written
        self.order_written = plan.order_written
        self.last_slot = plan.last_slot
        self.env_steps = plan.env_steps
        self.first_written = plan.first_written
        self.step[plan.slots] = plan.step
        self.prev[plan.slots] = plan.prev
        self.length[plan.lost] = 0
        self.length[plan.slots] = 0
        self.order[plan.order_pos] = plan.order_slots
        self.start[plan.finished] = plan.finished_start
        self.length[plan.finished] = plan.finished_length
        if len(plan.lost) or len(plan.finished):
            # a slot both lost and finished (overwritten by a step of an episode that ends in the same add) ends
            # up drawable: numpy's fancy assignment keeps the last value of a repeated index
            lost = plan.lost[self.length[plan.lost] == 0]
            tree.update(
                np.concatenate([lost, plan.finished]), np.repeat([0.0, weight], [len(lost), len(plan.finished)])
            )

    # ------------------------------------------------------------------ reading
    def drawable(self, slots: np.ndarray) -> np.ndarray:
        """Whether the steps at ``slots`` belong to complete episodes (bool [B])."""
        drawable: np.ndarray = self.length[slots] > 0
        return drawable

    def goal_steps(self, slots: np.ndarray, strategy: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """For drawable ``slots`` [R]: the step ``k`` whose goal each is relabeled with, and that step's slot.

        ``future``: ``k`` uniform in ``t .. T-1`` (the step itself included); ``final``: ``T-1``;
        ``episode``: uniform in ``0 .. T-1``. Returns (``k`` int64 [R], slot int64 [R]).
        """
        t, length = self.step[slots], self.length[slots]
        if strategy == "future":
            k = rng.integers(t, length)
        elif strategy == "final":
            k = length - 1
        else:  # "episode"
            k = rng.integers(0, length)
        return k, self.order[(self.start[slots] + k) % len(self.order)]

    def episode_slots(self, slot: int) -> np.ndarray:
        """The slots of the steps of the complete episode holding ``slot``, in time order (int64 [T])."""
        if self.length[slot] <= 0:
            raise ValueError(f"slot {slot} does not hold a step of a complete episode")
        slots: np.ndarray = self.order[self._order_positions(self.start[[slot]], self.length[[slot]])]
        return slots

    # ------------------------------------------------------------------ state
    def state_dict(self, size: int) -> dict[str, Any]:
        """Per-slot arrays of the first ``size`` slots, the ``order`` ring, counters and per-env arrays."""
        stored = min(self.order_written, len(self.order))
        return {
            "step": torch.from_numpy(self.step[:size].copy()),
            "prev": torch.from_numpy(self.prev[:size].copy()),
            "start": torch.from_numpy(self.start[:size].copy()),
            "length": torch.from_numpy(self.length[:size].copy()),
            "order": torch.from_numpy(self.order[:stored].copy()),
            "order_written": self.order_written,
            "written": self.written,
            "last_slot": torch.from_numpy(self.last_slot.copy()),
            "env_steps": torch.from_numpy(self.env_steps.copy()),
            "first_written": torch.from_numpy(self.first_written.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        size = len(state["step"])
        fresh = EpisodeIndex(self.capacity)
        for name in ("step", "prev", "start", "length"):
            getattr(fresh, name)[:size] = state[name].numpy()
        order = state["order"].numpy()
        fresh.order[: len(order)] = order
        fresh.order_written = int(state["order_written"])
        fresh.written = int(state["written"])
        fresh.last_slot = state["last_slot"].numpy().copy()
        fresh.env_steps = state["env_steps"].numpy().copy()
        fresh.first_written = state["first_written"].numpy().copy()
        for name in _INDEX_STATE:  # the loaded index replaces this one's arrays and counters, all of them
            setattr(self, name, getattr(fresh, name))

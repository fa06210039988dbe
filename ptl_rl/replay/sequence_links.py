"""How SequenceWindows links the stored steps into episodes and finds the steps that start windows.

Transitions of different envs are interleaved in the ring (a vector env adds
``N`` rows per step, an n-step stage flushes episode tails at once), so the
strategy links every stored step to the previous and the next step of the same
env and episode, at add time and vectorized over the batch:

* ``next_slot[s]`` / ``prev_slot[s]``: the slot of the following / preceding
  step of the same episode, or ``s`` itself when there is none (yet). A
  window is then gathered with one ``take`` per time position, and padding
  falls out by itself: following a self-link repeats the last real step.
* links are only made within an episode (not after a step with
  ``terminated | truncated``) and only to steps still stored, and a slot being
  overwritten cuts the link of its successor, so no window crosses an episode
  boundary, the write head, or data that is gone.
* per env the strategy keeps a step counter, the step at which the running
  episode began, and the slots of its last ``length`` steps; with these a
  step is marked a *window start* as soon as the ``length - 1`` steps after it
  in its episode are stored, or, for an episode shorter than ``length``, its
  first step once the episode ends.
"""

from __future__ import annotations

import numpy as np


class SequenceLinks:
    """The episode links of a :class:`~ptl_rl.replay.SequenceWindows` (a base class of it).

    ``next_slot`` / ``prev_slot`` (int64 [capacity]) and the per-env arrays
    (``[E]`` and ``[E, length]``, grown as env ids appear) that the linking
    advances. The strategy calls :meth:`_unlink` for the slots an add
    overwrites and :meth:`_link` for the slots it wrote, and its snapshot for
    the buffer's journal is the per-env arrays (:meth:`_per_env_state`).
    """

    # set by SequenceWindows.bind before any link is made
    capacity: int
    length: int
    pad_end: bool
    generations: np.ndarray  # int64 [capacity]: the write stamp of each slot

    next_slot: np.ndarray
    prev_slot: np.ndarray
    _env_steps: np.ndarray
    _episode_start: np.ndarray
    _recent_slot: np.ndarray
    _recent_gen: np.ndarray

    def _init_links(self) -> None:
        """No links yet (every slot links to itself) and no envs seen."""
        slots = np.arange(self.capacity, dtype=np.int64)
        self.next_slot = slots.copy()  # self-link: no following step (yet)
        self.prev_slot = slots.copy()  # self-link: no preceding step stored
        self._env_steps = np.zeros(0, dtype=np.int64)  # steps added per env (the next step's number)
        self._episode_start = np.zeros(0, dtype=np.int64)  # step number at which each env's episode began
        self._recent_slot = np.zeros((0, self.length), dtype=np.int64)  # slot of step k at [env, k % length]
        self._recent_gen = np.full((0, self.length), -1, dtype=np.int64)  # its generation, to see overwrites

    def _per_env_state(self) -> tuple[np.ndarray, ...]:
        """Copies of the per-env arrays the linking advances (small: [E] and [E, length])."""
        return (self._env_steps.copy(), self._episode_start.copy(), self._recent_slot.copy(), self._recent_gen.copy())

    def _unlink(self, slots: np.ndarray) -> None:
        """Forget the links of what the overwritten ``slots`` held, and the links into them."""
        successor = self.next_slot.take(slots)
        cut = successor != slots
        self.prev_slot[successor[cut]] = successor[cut]  # the step after an overwritten one starts the stored part
        self.next_slot[slots] = slots
        self.prev_slot[slots] = slots

    def _link(self, slots: np.ndarray, env: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Link the new steps to their predecessors; returns the slots that just became window starts.

        Vectorized over the rows: rows are grouped by env (stable, so time order
        is kept within an env), and every row gets its per-env step number
        ``k`` and the step number at which its episode began.
        """
        self._grow(int(env.max()) + 1)
        n = len(slots)
        order = np.argsort(env, kind="stable")
        env, done, slots = env[order], done[order], slots[order]
        first = np.ones(n, dtype=bool)
        first[1:] = env[1:] != env[:-1]
        if first.all():  # one row per env, as from a vector env step
            return self._link_unique(slots, env, done)
        rows = np.arange(n)
        group_start = np.maximum.accumulate(np.where(first, rows, 0))
        k0 = self._env_steps[env]  # per-env step number of the env's first row in this batch
        k = k0 + rows - group_start
        after_done = np.zeros(n, dtype=bool)
        after_done[1:] = done[:-1] & ~first[1:]
        # a first row starts an episode when its env's episode ended before this batch
        begins = after_done | (first & (self._episode_start[env] == k0))
        # episode start of each row: from the last row at or before it (in its group) that knows it
        source = np.maximum.accumulate(np.where(begins | first, rows, 0))
        episode_start = np.where(begins, k, self._episode_start[env])[source]

        # links inside the batch: consecutive rows of one env and episode
        inner = np.flatnonzero(~first & ~after_done)
        self.next_slot[slots[inner - 1]] = slots[inner]
        self.prev_slot[slots[inner]] = slots[inner - 1]
        # links to the env's last step from earlier batches
        self._link_to_earlier(slots, env, k0, first & ~begins)

        starts = self._new_starts(env, k, k0, group_start, episode_start, done, slots)
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        group_end_k = np.repeat(k[last], np.diff(np.append(np.flatnonzero(first), n)))
        keep = k > group_end_k - self.length  # only the newest `length` steps of each env fit the ring
        self._remember(env[keep], k[keep], slots[keep])
        self._close(env[last], k[last], episode_start[last], done[last])
        return starts

    def _link_unique(self, slots: np.ndarray, env: np.ndarray, done: np.ndarray) -> np.ndarray:
        """:meth:`_link` for a batch with one row per env: no grouping needed."""
        k = self._env_steps[env]
        episode_start = self._episode_start[env]
        self._link_to_earlier(slots, env, k, episode_start != k)
        starts = self._new_starts(env, k, k, np.arange(len(k)), episode_start, done, slots)
        self._remember(env, k, slots)
        self._close(env, k, episode_start, done)
        return starts

    def _link_to_earlier(self, slots: np.ndarray, env: np.ndarray, k: np.ndarray, cont: np.ndarray) -> None:
        """Link the rows ``cont`` (bool [n]) to their env's step ``k - 1`` of an earlier batch, if still stored."""
        rows = np.flatnonzero(cont)
        if len(rows) == 0:
            return
        pred, ok = self._recent(env[rows], k[rows] - 1)
        pred, new = pred[ok], slots[rows[ok]]
        self.next_slot[pred] = new
        self.prev_slot[new] = pred

    def _new_starts(
        self,
        env: np.ndarray,
        k: np.ndarray,
        k0: np.ndarray,
        group_start: np.ndarray,
        episode_start: np.ndarray,
        done: np.ndarray,
        slots: np.ndarray,
    ) -> np.ndarray:
        """Slots that became window starts: full windows ending at a new row, and starts of short episodes.

        With ``pad_end``, an episode end also makes a start of each of its steps whose window reaches past it.
        """
        length = self.length
        steps_in = k - episode_start  # steps of the episode before each row
        which = np.flatnonzero(steps_in >= length - 1)  # the window ending at this row lies in one episode
        step = k[which] - (length - 1)
        if done.any() and self.pad_end:  # every step whose window reaches past the episode's end just ended
            ended = np.flatnonzero(done)
            first = np.maximum(episode_start[ended], k[ended] - (length - 2))
            counts = k[ended] - first + 1  # 0 for length 1: every step already started a full window
            offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            which = np.concatenate([which, np.repeat(ended, counts)])
            step = np.concatenate([step, np.repeat(first, counts) + offsets])
        elif done.any():  # a whole episode shorter than the window just ended: its first step
            short = np.flatnonzero(done & (steps_in < length - 1))
            which = np.concatenate([which, short])
            step = np.concatenate([step, episode_start[short]])
        if len(which) == 0:
            return which
        in_batch = step >= k0[which]
        if not in_batch.any():
            slot, ok = self._recent(env[which], step)
            starts: np.ndarray = slot[ok]
            return starts
        found = np.empty(len(step), dtype=np.int64)
        found[in_batch] = slots[group_start[which[in_batch]] + step[in_batch] - k0[which[in_batch]]]
        old, ok = self._recent(env[which[~in_batch]], step[~in_batch])
        found[~in_batch] = np.where(ok, old, -1)
        return found[found >= 0]

    def _recent(self, env: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of the env's recent steps ``step`` (int [R]) and whether each is still stored (bool [R]).

        ``step`` must be one of the env's last ``length`` steps (those are in the ring).
        """
        flat = env * self.length + step % self.length
        slot = self._recent_slot.reshape(-1)[flat]
        return slot, self._recent_gen.reshape(-1)[flat] == self.generations[slot]

    def _remember(self, env: np.ndarray, k: np.ndarray, slots: np.ndarray) -> None:
        """Put the slots of the env's steps ``k`` in the ring of recent steps (at most ``length`` per env)."""
        flat = env * self.length + k % self.length
        self._recent_slot.reshape(-1)[flat] = slots
        self._recent_gen.reshape(-1)[flat] = self.generations[slots]

    def _close(self, env: np.ndarray, k: np.ndarray, episode_start: np.ndarray, done: np.ndarray) -> None:
        """After the last row ``k`` of each env: its step count and where its episode (or the next) began."""
        self._env_steps[env] = k + 1
        self._episode_start[env] = np.where(done, k + 1, episode_start)

    def _grow(self, num_envs: int) -> None:
        if num_envs <= len(self._env_steps):
            return
        grow = max(num_envs, 2 * len(self._env_steps)) - len(self._env_steps)
        self._env_steps = np.concatenate([self._env_steps, np.zeros(grow, dtype=np.int64)])
        self._episode_start = np.concatenate([self._episode_start, np.zeros(grow, dtype=np.int64)])
        self._recent_slot = np.concatenate([self._recent_slot, np.zeros((grow, self.length), dtype=np.int64)])
        self._recent_gen = np.concatenate([self._recent_gen, np.full((grow, self.length), -1, dtype=np.int64)])

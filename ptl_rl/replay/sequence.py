"""SequenceReplayBuffer: windows of consecutive steps of one episode of one env, uniform or prioritized.

Transitions of different envs are interleaved in the ring (a vector env adds
``N`` rows per step, an n-step stage flushes episode tails at once), so the
buffer links every stored step to the previous and the next step of the same
env and episode, at add time and vectorized over the batch:

* ``next_slot[s]`` / ``prev_slot[s]``: the slot of the following / preceding
  step of the same episode, or ``s`` itself when there is none (yet). A
  window is then gathered with one ``take`` per time position, and padding
  falls out by itself: following a self-link repeats the last real step.
* links are only made within an episode (not after a step with
  ``terminated | truncated``) and only to steps still stored, and a slot being
  overwritten cuts the link of its successor, so no window crosses an episode
  boundary, the write head, or data that is gone.
* per env the buffer keeps a step counter, the step at which the running
  episode began, and the slots of its last ``length`` steps; with these a
  step is marked a *window start* as soon as the ``length - 1`` steps after it
  in its episode are stored, or, for an episode shorter than ``length``, its
  first step once the episode ends.

Only window starts are sampled: the sum-tree holds 0 for every other slot, and
for a start the priority of its window (uniform mode: 1). The priority of a
window is the one of its start step's slot; new starts get the largest
priority among the current starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.indexed import IndexedReplayBuffer, check_reserved_fields
from ptl_rl.replay.buffer import restore_storage, storage_snapshot
from ptl_rl.core.protocols import PartlySampleableStorage, Storage
from ptl_rl.core.schedules import Schedule

_REQUIRED_FIELDS = ("env_id", "terminated", "truncated")


class SequenceReplayBuffer(IndexedReplayBuffer):
    """Replay of sequences: ``B`` windows of ``burn_in + length`` steps, each from one episode of one env.

    Batch layout (numpy from :meth:`sample`, torch after the sampler), with
    ``T = burn_in + length``:

    * every stored field as ``[B, T, ...]`` (time second): positions
      ``0 .. burn_in-1`` are the burn-in prefix (the steps before the window
      start, for warming up a recurrent state), positions ``burn_in .. T-1``
      the training window, starting at the sampled start step;
    * ``mask`` bool [B, T]: True where the position holds a real step. The
      burn-in is padded at the front when the episode began less than
      ``burn_in`` steps before the start; the window is padded at the end only
      where its episode ends before it does (for episodes shorter than
      ``length``, or with ``pad_end`` for every window that reaches past an
      end). A padded position repeats the nearest real step (so
      ``batch.hidden[:, 0]`` is the stored state of the first real step);
      mask it out of losses and recurrent updates;
    * ``indices`` int64 [B] (the start slot), ``generations`` int64 [B], and
      with ``prioritized=True`` ``weights`` float32 [B] and the
      ``batch.update_priorities(td_errors [B])`` link (reduce per-step errors
      to one value per window first).

    A recurrent agent's state is stored like any agent extra (any field name,
    one row per step) and comes back per position.

    Args:
        length: steps in the training window, ``>= 1``.
        burn_in: steps before the window, ``>= 0``.
        pad_end: also start windows at the last ``length - 1`` steps of each
            finished episode, padded at the end (R2D2's last sequence of an
            episode). Without it (the default) only a step followed by
            ``length - 1`` steps of its episode starts a window (or the first
            step of a finished episode shorter than ``length``), so the steps
            near an episode's end, its terminal step among them, fall in fewer
            windows than the others: a step ``d < length`` steps from the end
            in ``d + 1`` windows instead of ``length``. With it every stored
            step of a finished episode is in ``length`` windows, like the
            steps of the middle (an episode cut by a stream gap gets no tail
            windows: it has no end step).
        prioritized: sample windows proportionally to ``priority ** alpha`` of
            their start (with importance weights), else uniformly over the
            window starts.
        upstream, capacity, alpha, beta, beta_clock, eps, stratified, warmup, transitions_per_yield, seed: as for
            :class:`~ptl_rl.replay.PrioritizedReplayBuffer` (``alpha``,
            ``beta``, ``beta_clock`` only matter with ``prioritized``).

    Feed it 1-step transitions (straight from an ``ExperienceSource``): an
    episode ends at the step with ``terminated | truncated``. Stored batches
    need ``env_id``, ``terminated`` and ``truncated``; rows of one env must
    arrive in time order (any interleaving across envs).

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
        >>> buffer = ptl_rl.SequenceReplayBuffer(source, capacity=1_000, length=4, burn_in=2, warmup=20, seed=0)
        >>> windows = next(buffer).sample(3)
        >>> windows.obs.shape, windows.reward.shape, windows.mask.shape  # [B, burn_in + length, ...]
        ((3, 6, 4), (3, 6), (3, 6))
        >>> windows.mask  # the first window starts one step into its episode: one burn-in step is padding
        array([[False,  True,  True,  True,  True,  True],
               [ True,  True,  True,  True,  True,  True],
               [ True,  True,  True,  True,  True,  True]])
        >>> windows.env_id  # each window comes from one env
        array([[0, 0, 0, 0, 0, 0],
               [1, 1, 1, 1, 1, 1],
               [1, 1, 1, 1, 1, 1]])
    """

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None = None,
        capacity: int = 100_000,
        *,
        length: int,
        burn_in: int = 0,
        pad_end: bool = False,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float | Schedule = 0.4,
        beta_clock: str = "learner",
        eps: float = 1e-6,
        stratified: bool = True,
        warmup: int | None = None,
        transitions_per_yield: int = 1,
        seed: int | None = None,
        storage: Callable[[int], Storage] | None = None,
    ) -> None:
        if not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"length must be an integer >= 1, got {length!r}")
        if not isinstance(burn_in, (int, np.integer)) or burn_in < 0:
            raise ValueError(f"burn_in must be an integer >= 0, got {burn_in!r}")
        super().__init__(
            upstream,
            capacity,
            prioritized=prioritized,  # else draws are uniform over the window starts
            alpha=alpha,
            beta=beta,
            beta_clock=beta_clock,
            eps=eps,
            stratified=stratified,
            warmup=warmup,
            transitions_per_yield=transitions_per_yield,
            seed=seed,
            storage=storage,
        )
        self.length = int(length)
        self.burn_in = int(burn_in)
        self.pad_end = bool(pad_end)
        slots = np.arange(self.capacity, dtype=np.int64)
        self.next_slot = slots.copy()  # self-link: no following step (yet)
        self.prev_slot = slots.copy()  # self-link: no preceding step stored
        self._env_steps = np.zeros(0, dtype=np.int64)  # steps added per env (the next step's number)
        self._episode_start = np.zeros(0, dtype=np.int64)  # step number at which each env's episode began
        self._recent_slot = np.zeros((0, self.length), dtype=np.int64)  # slot of step k at [env, k % length]
        self._recent_gen = np.full((0, self.length), -1, dtype=np.int64)  # its generation, to see overwrites
        # (storage counters, per-env state, batch) while an add is under way: still set on entry means the
        # previous add was interrupted, with its rows maybe half written or half linked (see add)
        self._journal: tuple[Any, tuple[np.ndarray, ...] | None, TransitionBatch] | None = None
        self._upstream_seq: int | None = None  # stream_seq of the last upstream batch added

    @property
    def num_windows(self) -> int:
        """Number of window starts that can be sampled now."""
        return int(np.count_nonzero(self.tree.leaves[: len(self.storage)]))

    # ------------------------------------------------------------------ adding
    def _add_pulled(self, batch: TransitionBatch) -> np.ndarray:
        """Add a batch pulled from upstream, first ending every episode if the upstream's streams were cut."""
        seq = self._upstream_stream_seq()
        if seq is not None and self._upstream_seq is not None and seq != self._upstream_seq + 1:
            # steps are missing between the last batch added and this one (the source reset its envs
            # after an interrupt or a crash, or someone pulled batches in between): no window may span them
            self.end_episodes()
        slots = self.add(batch)
        self._upstream_seq = seq
        return slots

    def end_episodes(self) -> None:
        """End every env's episode here: no step added later is linked to a step stored before.

        Called by the buffer itself when its upstream's ``stream_seq`` skips a
        number; call it when feeding :meth:`add` by hand from streams that were
        cut (envs reset without a ``terminated``/``truncated`` step). An episode
        cut shorter than ``length`` gives no window.
        """
        self._finish_interrupted_add()
        self._episode_start = self._env_steps.copy()

    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` steps of ``batch`` and link them into their episodes; returns their slots (int64 [B]).

        Interrupt-safe: the state the linking changes per env is small, so it is
        saved (with the storage's counters and the batch) before anything is
        written. If an interrupt cuts an add short, the next ``add`` restores
        that state and does the interrupted add again, in full, into the same
        slots: the storage write and every link are idempotent from there.
        """
        self._finish_interrupted_add()
        check_reserved_fields(batch)
        missing = [name for name in _REQUIRED_FIELDS if name not in batch]
        if missing:
            raise ValueError(f"a SequenceReplayBuffer needs the fields {missing} to find episodes; add them per step")
        if len(batch) > self.capacity:  # only the newest `capacity` rows survive; link them chunk by chunk
            out = [self.add(batch.rows(slice(lo, lo + self.capacity))) for lo in range(0, len(batch), self.capacity)]
            return out[-1]
        env = np.asarray(batch["env_id"], dtype=np.int64)
        if len(env) and env.min() < 0:
            raise ValueError(f"env_id must be >= 0, got {env.min()}")
        storage = self.storage
        counters = (storage.cursor, storage.size, storage.total_added)
        self._journal = (None, None, batch)  # (taking the snapshots runs code an interrupt can cut short)
        self._journal = (storage_snapshot(storage), self._per_env_state(), batch)
        try:
            slots = self._store_and_link(batch, env)
        except (TypeError, ValueError):
            if (storage.cursor, storage.size, storage.total_added) == counters:
                self._journal = None  # the storage refused the batch before writing: an error, not an interrupt
            raise
        self._journal = None
        return slots

    def _finish_interrupted_add(self) -> None:
        """Redo an add that an interrupt cut short (see :meth:`add`), from the state saved before it."""
        if self._journal is None:
            return
        saved, per_env, batch = self._journal
        if saved is None or per_env is None:  # cut short while taking the snapshots (both or neither are set)
            saved, per_env = storage_snapshot(self.storage), self._per_env_state()
        restore_storage(self.storage, saved)
        self._env_steps, self._episode_start, self._recent_slot, self._recent_gen = (a.copy() for a in per_env)
        try:
            self._store_and_link(batch, np.asarray(batch["env_id"], dtype=np.int64))
        except (TypeError, ValueError):
            # refused: the interrupt landed before the storage's check, which refuses it now (before any write);
            # an error in the data, so it is dropped, not redone by every later call
            restore_storage(self.storage, saved)
        self._journal = None

    def _per_env_state(self) -> tuple[np.ndarray, ...]:
        """Copies of the per-env arrays the linking advances (small: [E] and [E, length])."""
        return (self._env_steps.copy(), self._episode_start.copy(), self._recent_slot.copy(), self._recent_gen.copy())

    def _store_and_link(self, batch: TransitionBatch, env: np.ndarray) -> np.ndarray:
        old_size = len(self.storage)
        slots = self.storage.add(batch)
        if len(slots) == 0:
            return slots
        self._stamp(slots)
        best = self.draws.weight_for_new(slots, old_size)  # 1, or the largest priority of the starts kept
        overwrote = old_size + len(slots) > self.capacity
        if overwrote:
            self._unlink(slots)
        starts = self._link(slots, env, np.asarray(batch["terminated"]) | np.asarray(batch["truncated"]))
        if overwrote:  # one tree update: overwritten slots drop out (0), new starts come in at `best`
            self._set_leaves(slots, starts, best)
        elif len(starts):
            self.tree.update(starts, best)
        return slots

    def _unlink(self, slots: np.ndarray) -> None:
        """Forget the links of what the overwritten ``slots`` held, and the links into them."""
        successor = self.next_slot.take(slots)
        cut = successor != slots
        self.prev_slot[successor[cut]] = successor[cut]  # the step after an overwritten one starts the stored part
        self.next_slot[slots] = slots
        self.prev_slot[slots] = slots

    def _set_leaves(self, slots: np.ndarray, starts: np.ndarray, best: float) -> None:
        """Leaves of the written ``slots`` (a contiguous ring range) to 0, of ``starts`` to ``best``, in one update."""
        values = np.zeros(len(slots))
        offset = (starts - slots[0]) % self.capacity
        inside = offset < len(slots)  # new starts among the rows just written (windows shorter than the batch)
        values[offset[inside]] = best
        outside = starts[~inside]
        self.tree.update(np.concatenate([slots, outside]), np.concatenate([values, np.full(len(outside), best)]))

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
            return slot[ok]
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

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` windows as numpy arrays ``[B, burn_in + length, ...]`` with ``mask`` (see the class)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._finish_interrupted_add()  # no window of a half-linked add is drawn
        if not self.tree.total > 0.0:
            raise ValueError(
                f"no window of {self.length} steps is stored yet ({len(self.storage)} steps in the buffer); "
                "raise warmup so that sampling starts once episodes have run for `length` steps"
            )
        starts, weights = self._draw(batch_size)
        slots, mask = self.window_slots(starts)
        batch = self.storage.gather(slots)
        batch["mask"] = mask
        return self._finish(batch, starts, weights)

    def _sampleable(self, starts: np.ndarray) -> np.ndarray:
        """Windows whose every real step the storage can sample (e.g. its next_obs has arrived), bool [B]."""
        slots, mask = self.window_slots(starts)
        # called only when the storage is a PartlySampleableStorage (see _partly_sampleable)
        return (cast(PartlySampleableStorage, self.storage).sampleable(slots) | ~mask).all(axis=1)

    def window_slots(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots ``[B, burn_in + length]`` of the windows starting at ``starts`` (int [B]), and their mask.

        One ``take`` per time position (a loop over positions, never over rows).
        A self-link ends a chain, so padding repeats the nearest real step and
        the mask is where a position differs from its neighbour towards the start.
        """
        steps, k = self.burn_in + self.length, self.burn_in
        out = np.empty((steps, len(starts)), dtype=np.int64)
        out[k] = starts
        next_slot, prev_slot = self.next_slot, self.prev_slot
        for t in range(k + 1, steps):  # (np.take with out= is several times slower than this)
            out[t] = next_slot[out[t - 1]]
        for t in range(k - 1, -1, -1):
            out[t] = prev_slot[out[t + 1]]
        mask = np.empty(out.shape, dtype=bool)
        mask[k] = True
        np.not_equal(out[k + 1 :], out[k:-1], out=mask[k + 1 :])
        np.not_equal(out[:k], out[1 : k + 1], out=mask[:k])
        return np.ascontiguousarray(out.T), np.ascontiguousarray(mask.T)

    # ------------------------------------------------------------------ priorities
    def _check_targets(self, idx: np.ndarray) -> None:
        if len(idx) and not (self.tree.get(idx) > 0.0).all():
            bad = idx[self.tree.get(idx) <= 0.0][:5].tolist()
            raise ValueError(
                f"slots {bad} are not window starts; pass the indices of a batch sampled from this buffer "
                "(with its generations). The priorities are unchanged."
            )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """As the parent's, plus the episode links and per-env counters (``weights_only``-safe)."""
        self._finish_interrupted_add()
        size = len(self.storage)
        state = super().state_dict()
        state.update(
            next_slot=torch.from_numpy(self.next_slot[:size].copy()),
            prev_slot=torch.from_numpy(self.prev_slot[:size].copy()),
            env_steps=torch.from_numpy(self._env_steps.copy()),
            recent_slot=torch.from_numpy(self._recent_slot.copy()),
            recent_gen=torch.from_numpy(self._recent_gen.copy()),
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state. Episodes in flight are closed: the source starts new ones after a restore."""
        if tuple(state["recent_slot"].shape[1:]) != (self.length,):
            raise ValueError(
                f"the state was saved with length={state['recent_slot'].shape[1]}, this buffer has length="
                f"{self.length}; create the buffer with the checkpoint's length"
            )
        self._journal = None  # the restored state replaces whatever was being added
        self._upstream_seq = None
        super().load_state_dict(state)
        size = len(self.storage)
        self.next_slot = np.arange(self.capacity, dtype=np.int64)
        self.prev_slot = self.next_slot.copy()
        self.next_slot[:size] = state["next_slot"].numpy()
        self.prev_slot[:size] = state["prev_slot"].numpy()
        self._env_steps = state["env_steps"].numpy().copy()
        # no step after the restore may link to a step before it
        self._episode_start = self._env_steps.copy()
        self._recent_slot = state["recent_slot"].numpy().copy()
        self._recent_gen = state["recent_gen"].numpy().copy()

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """Steps stored, window starts that can be sampled, window shape, and the chain upstream."""
        shape = {"length": self.length, "burn_in": self.burn_in, "prioritized": self.prioritized}
        if self.pad_end:
            shape["pad_end"] = True
        return stage_repr(self, **self._size_counters(), windows=self.num_windows, **shape)

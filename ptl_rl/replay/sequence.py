"""SequenceReplayBuffer: windows of consecutive steps of one episode of one env, uniform or prioritized.

Each add stores its steps and links them into their episodes
(:class:`~ptl_rl.replay.sequence_links.SequenceLinks`: the ``next_slot`` /
``prev_slot`` links, the per-env arrays, the window starts); this module holds
the journal that makes an add interrupt-safe, sampling, priorities and state.

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
from ptl_rl.core.protocols import PartlySampleableStorage, Storage
from ptl_rl.core.schedules import Schedule
from ptl_rl.replay.buffer import restore_storage, storage_snapshot
from ptl_rl.replay.indexed import IndexedReplayBuffer, check_reserved_fields
from ptl_rl.replay.sequence_links import SequenceLinks

_REQUIRED_FIELDS = ("env_id", "terminated", "truncated")


class SequenceReplayBuffer(SequenceLinks, IndexedReplayBuffer):
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
        self._init_links()

    @property
    def num_windows(self) -> int:
        """Number of window starts that can be sampled now."""
        return int(np.count_nonzero(self.tree.leaves[: len(self.storage)]))

    # ------------------------------------------------------------------ adding
    def _add_pulled(self, batch: TransitionBatch) -> np.ndarray:
        """Add a batch pulled from upstream, first ending every episode if the stream was cut."""
        if self.consume_cut():
            # steps are missing between the last batch added and this one (the source reset its envs
            # after an interrupt or a crash, or someone pulled batches in between): no window may span them
            self.end_episodes()
        return self.add(batch)

    def end_episodes(self) -> None:
        """End every env's episode here: no step added later is linked to a step stored before.

        Called by the buffer itself when its stream is cut (a stream number skipped
        upstream, a step of its own cut short); call it when feeding :meth:`add` by hand
        from streams that were cut (envs reset without a ``terminated``/``truncated``
        step). An episode cut shorter than ``length`` gives no window.
        """
        self.settle()
        self._episode_start = self._env_steps.copy()

    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` steps of ``batch`` and link them into their episodes; returns their slots (int64 [B]).

        One write of the guard: the per-env state the linking changes is small, so it is
        saved with the storage's counters before anything is written, and an add cut short
        is done again, in full, into the same slots before the buffer is used again (the
        storage write and every link are idempotent from the saved state).
        """
        # (no settle() first: the journal's write finishes a cut add itself, after recording this batch)
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
        return self._journal.write(self._store_and_link, batch, env)

    def _save_written(self) -> object:
        return (storage_snapshot(self.storage), self._per_env_state())

    def _restore_written(self, saved: Any) -> None:
        storage, per_env = saved
        restore_storage(self.storage, storage)
        self._env_steps, self._episode_start, self._recent_slot, self._recent_gen = (a.copy() for a in per_env)

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

    def _set_leaves(self, slots: np.ndarray, starts: np.ndarray, best: float) -> None:
        """Leaves of the written ``slots`` (a contiguous ring range) to 0, of ``starts`` to ``best``, in one update."""
        values = np.zeros(len(slots))
        offset = (starts - slots[0]) % self.capacity
        inside = offset < len(slots)  # new starts among the rows just written (windows shorter than the batch)
        values[offset[inside]] = best
        outside = starts[~inside]
        self.tree.update(np.concatenate([slots, outside]), np.concatenate([values, np.full(len(outside), best)]))

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` windows as numpy arrays ``[B, burn_in + length, ...]`` with ``mask`` (see the class)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.settle()  # no window of a half-linked add is drawn
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
        sampleable: np.ndarray = (cast(PartlySampleableStorage, self.storage).sampleable(slots) | ~mask).all(axis=1)
        return sampleable

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
        self.settle()
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
        super().load_state_dict(state)  # (drops an add a cut left: the restored state replaces it)
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

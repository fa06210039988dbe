"""SequenceWindows: draws windows of consecutive steps of one episode of one env, uniformly or by priority.

Each add links its steps into their episodes
(:class:`~ptl_rl.replay.sequence_links.SequenceLinks`: the ``next_slot`` /
``prev_slot`` links, the per-env arrays, the window starts); this module holds
what the buffer calls: the checks, the linking of an add (interrupt-safe
through the snapshot of the per-env arrays), sampling, priorities and state.

Only window starts are drawn: the weights the strategy holds (a
:class:`~ptl_rl.replay.UniformDraws` or a :class:`~ptl_rl.replay.PrioritizedDraws`)
are 0 for every other slot, and for a start 1 (uniform) or the priority of its
window, which is the one of its start step's slot; new starts get the largest
priority among the current starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch

from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.core.protocols import PartlySampleableStorage, Storage
from ptl_rl.core.protocols.draws import Advance
from ptl_rl.replay.draws import UniformDraws, WeightedSlots
from ptl_rl.replay.feedback import check_reserved_fields
from ptl_rl.replay.priority_draws import PrioritizedDraws
from ptl_rl.replay.sequence_links import SequenceLinks
from ptl_rl.replay.sumtree import SumTree

_REQUIRED_FIELDS = ("env_id", "terminated", "truncated")


class SequenceWindows(SequenceLinks):
    """Draws ``B`` windows of ``burn_in + length`` steps, each from one episode of one env.

    Batch layout (numpy from ``sample``, torch after the sampler), with
    ``T = burn_in + length``:

    * every stored field as ``[B, T, ...]`` (time second): positions
      ``0 .. burn_in-1`` are the burn-in prefix (the steps before the window
      start, for warming up a recurrent state), positions ``burn_in .. T-1``
      the training window, starting at the drawn start step;
    * ``mask`` bool [B, T]: True where the position holds a real step. The
      burn-in is padded at the front when the episode began less than
      ``burn_in`` steps before the start; the window is padded at the end only
      where its episode ends before it does (for episodes shorter than
      ``length``, or with ``pad_end`` for every window that reaches past an
      end). A padded position repeats the nearest real step (so
      ``batch.hidden[:, 0]`` is the stored state of the first real step);
      mask it out of losses and recurrent updates;
    * ``indices`` int64 [B] (the start slot), ``generations`` int64 [B], and
      with :class:`~ptl_rl.replay.PrioritizedDraws` ``weights`` float32 [B] and
      the ``batch.update_priorities(td_errors [B])`` link (reduce per-step
      errors to one value per window first).

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
        draws: how window starts are drawn: ``UniformDraws(stratified=True)``
            (the default: uniform over the starts, one per equal segment) or a
            :class:`~ptl_rl.replay.PrioritizedDraws` (proportional to the
            priority of the start, with importance weights).

    Feed it 1-step transitions (straight from an ``ExperienceSource``): an
    episode ends at the step with ``terminated | truncated``. Stored batches
    need ``env_id``, ``terminated`` and ``truncated``; rows of one env must
    arrive in time order (any interleaving across envs).

    Examples:
        >>> import numpy as np
        >>> import ptl_rl
        >>> steps = ptl_rl.TransitionBatch(  # one env, an episode of 5 steps, then one of 3 still running
        ...     obs=np.arange(8.0)[:, None], env_id=np.zeros(8, dtype=np.int64),
        ...     terminated=np.arange(8) == 4, truncated=np.zeros(8, dtype=bool))
        >>> windows = ptl_rl.SequenceWindows(length=3, burn_in=1, draws=ptl_rl.PrioritizedDraws(alpha=0.6))
        >>> buffer = ptl_rl.ReplayBuffer(capacity=16, draws=windows, seed=0)
        >>> _ = buffer.add(steps)
        >>> buffer.draws.num_windows  # starts 0, 1, 2 of the first episode, 5 of the second
        4
        >>> batch = buffer.sample(2)
        >>> batch.obs[..., 0], batch.mask  # [B, burn_in + length]: the step before the start, then the window
        (array([[0., 1., 2., 3.],
               [1., 2., 3., 4.]]), array([[ True,  True,  True,  True],
               [ True,  True,  True,  True]]))
        >>> batch.update_priorities(np.array([0.5, 2.0]))  # one TD error per window
        0
    """

    def __init__(
        self, length: int, burn_in: int = 0, pad_end: bool = False, draws: WeightedSlots | None = None
    ) -> None:
        if not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"length must be an integer >= 1, got {length!r}")
        if not isinstance(burn_in, (int, np.integer)) or burn_in < 0:
            raise ValueError(f"burn_in must be an integer >= 0, got {burn_in!r}")
        if draws is not None and not isinstance(draws, WeightedSlots):
            raise TypeError(
                f"draws must be a UniformDraws or a PrioritizedDraws (how window starts are drawn), got "
                f"{type(draws).__name__}"
            )
        self.length = int(length)
        self.burn_in = int(burn_in)
        self.pad_end = bool(pad_end)
        self.draws: WeightedSlots = UniformDraws(stratified=True) if draws is None else draws

    @property
    def tree(self) -> SumTree:
        """The sum-tree of draw weights: 0 for a slot that starts no window."""
        return self.draws.tree

    @property
    def num_windows(self) -> int:
        """Number of window starts that can be drawn now."""
        return int(np.count_nonzero(self.draws.tree.leaves[: len(self.storage)]))

    # ------------------------------------------------------------------ the strategy of a buffer
    def bind(self, storage: Storage, upstream: Iterator[TransitionBatch] | None) -> None:
        """Draw windows of the steps of ``storage``."""
        self.draws.bind_weights(storage)
        self.storage = storage
        self.capacity = storage.capacity
        self.generations = self.draws.generations  # (the stamps array, filled in place: shared with the draws)
        self._partly_sampleable = isinstance(storage, PartlySampleableStorage)
        self._init_links()

    def check(self, batch: TransitionBatch) -> None:
        """Refuse a batch without the fields that find episodes, or with a field samples get."""
        check_reserved_fields(batch)
        missing = [name for name in _REQUIRED_FIELDS if name not in batch]
        if missing:
            raise ValueError(f"a SequenceReplayBuffer needs the fields {missing} to find episodes; add them per step")
        env = np.asarray(batch["env_id"])
        if len(env) and env.min() < 0:
            raise ValueError(f"env_id must be >= 0, got {env.min()}")

    def added(self, slots: np.ndarray, old_size: int, batch: TransitionBatch, advance: Advance) -> None:
        """Link the steps just written at ``slots`` into their episodes; mark the windows they complete drawable.

        Redone whole after a cut, with the rows: the per-env state the linking
        changes is small, so it is the snapshot, and from there the storage write,
        the unlinking, the links and the tree leaves are idempotent.
        """
        self.draws.stamp(slots)
        best = self.draws.weight_for_new(slots, old_size)  # 1, or the largest priority of the starts kept
        overwrote = old_size + len(slots) > self.capacity
        if overwrote:
            self._unlink(slots)
        env = np.asarray(batch["env_id"], dtype=np.int64)
        starts = self._link(slots, env, np.asarray(batch["terminated"]) | np.asarray(batch["truncated"]))
        if overwrote:  # one tree update: overwritten slots drop out (0), new starts come in at `best`
            self._set_leaves(slots, starts, best)
        elif len(starts):
            self.draws.tree.update(starts, best)

    def _set_leaves(self, slots: np.ndarray, starts: np.ndarray, best: float) -> None:
        """Leaves of the written ``slots`` (a contiguous ring range) to 0, of ``starts`` to ``best``, in one update."""
        values = np.zeros(len(slots))
        offset = (starts - slots[0]) % self.capacity
        inside = offset < len(slots)  # new starts among the rows just written (windows shorter than the batch)
        values[offset[inside]] = best
        outside = starts[~inside]
        self.draws.tree.update(np.concatenate([slots, outside]), np.concatenate([values, np.full(len(outside), best)]))

    def end_episodes(self, advance: Advance) -> None:
        """End every env's episode here: no step added later is linked to a step stored before.

        An episode cut shorter than ``length`` gives no window.
        """
        self._episode_start = self._env_steps.copy()

    def ready(self) -> bool:
        return self.draws.tree.total > 0.0

    def sample(self, rng: np.random.Generator, batch_size: int) -> TransitionBatch:
        """``batch_size`` windows as numpy arrays ``[B, burn_in + length, ...]`` with ``mask`` (see the class)."""
        if not self.ready():
            raise ValueError(
                f"no window of {self.length} steps is stored yet ({len(self.storage)} steps in the buffer); "
                "raise warmup so that sampling starts once episodes have run for `length` steps"
            )
        sampleable = self._sampleable if self._partly_sampleable else None
        starts, weights = self.draws.draw_slots(rng, batch_size, sampleable)
        slots, mask = self.window_slots(starts)
        batch = self.storage.gather(slots)
        batch["mask"] = mask
        return self.draws.finish(batch, starts, weights, self)

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

    def update_priorities(self, indices: Numbers, priorities: Numbers, generations: Numbers | None = None) -> int:
        """Set the priorities of the windows starting at ``indices`` (see :class:`~ptl_rl.replay.PrioritizedDraws`)."""
        return self.draws.update_priorities(indices, priorities, generations, drawable="window starts")

    # ------------------------------------------------------------------ the guard
    def snapshot(self) -> tuple[np.ndarray, ...]:
        """Copies of the per-env arrays the linking advances (small: [E] and [E, length]; about 2 us)."""
        return self._per_env_state()

    def restore(self, snapshot: tuple[np.ndarray, ...]) -> None:
        self._env_steps, self._episode_start, self._recent_slot, self._recent_gen = (a.copy() for a in snapshot)

    # ------------------------------------------------------------------ state and repr
    def counters(self) -> dict[str, object]:
        """Window starts that can be drawn now, the window's shape, and whether draws follow priorities."""
        shown: dict[str, object] = {"windows": self.num_windows, "length": self.length, "burn_in": self.burn_in}
        shown["prioritized"] = isinstance(self.draws, PrioritizedDraws)
        if self.pad_end:
            shown["pad_end"] = True
        return shown

    def state_dict(self) -> dict[str, Any]:
        """Window-start weights and stamps, the episode links and the per-env counters (``weights_only``-safe)."""
        size = len(self.storage)
        state = self.draws.weights_state_dict(size)
        state.update(
            next_slot=torch.from_numpy(self.next_slot[:size].copy()),
            prev_slot=torch.from_numpy(self.prev_slot[:size].copy()),
            env_steps=torch.from_numpy(self._env_steps.copy()),
            recent_slot=torch.from_numpy(self._recent_slot.copy()),
            recent_gen=torch.from_numpy(self._recent_gen.copy()),
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state (the buffer then ends the episodes in flight: the source starts new ones)."""
        if tuple(state["recent_slot"].shape[1:]) != (self.length,):
            raise ValueError(
                f"the state was saved with length={state['recent_slot'].shape[1]}, this buffer has length="
                f"{self.length}; create the buffer with the checkpoint's length"
            )
        self.draws.load_weights_state(state)  # (checks, e.g. alpha, before it changes anything)
        size = len(state["next_slot"])
        self.next_slot = np.arange(self.capacity, dtype=np.int64)
        self.prev_slot = self.next_slot.copy()
        self.next_slot[:size] = state["next_slot"].numpy()
        self.prev_slot[:size] = state["prev_slot"].numpy()
        self._env_steps = state["env_steps"].numpy().copy()
        self._episode_start = self._env_steps.copy()  # (the buffer's end_episodes() follows)
        self._recent_slot = state["recent_slot"].numpy().copy()
        self._recent_gen = state["recent_gen"].numpy().copy()

    def __repr__(self) -> str:
        pad = ", pad_end=True" if self.pad_end else ""
        return f"SequenceWindows(length={self.length}, burn_in={self.burn_in}{pad}, draws={self.draws!r})"

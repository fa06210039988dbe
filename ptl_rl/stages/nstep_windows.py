"""The rings behind an NStepTransform: each env's last ``n - 1`` steps, folded into n-step windows.

Everything here is speed; the rule it implements is the specification in
:class:`~ptl_rl.stages.nstep.NStepTransform`'s docstring. Each env keeps its
steps in a ring of ``n`` slots; a vector step folds every env's window at once
through precomputed tables of discounts (one matrix product instead of a loop
over ``k``), with a lockstep path when every env of a source steps together.
The stage owns one :class:`Windows` and runs every change to it as a step of
the guard (:mod:`ptl_rl.core.guard`): :meth:`Windows.snapshot` is what puts a
cut step back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ptl_rl.core._grouping import rank_within_group
from ptl_rl.core._trees import tree_assign, tree_map, tree_take
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.stages import nstep_lockstep as lockstep

# Fields that describe the end of a step rather than its start: they are not kept in the window.
_STEP_END_FIELDS = ("next_obs", "terminated", "truncated", "discount", "env_id")


class Windows:
    """Per-env rings of the last ``n - 1`` steps, and the folds that turn steps into n-step rows.

    Args:
        n: window length, ``n >= 1``.
        gamma: discount per step, in ``(0, 1]``.
    """

    def __init__(self, n: int, gamma: float) -> None:
        self.n = n
        self.gamma = gamma
        k = np.arange(self.n)
        # _fold[j, k] = gamma**(k - j) for k >= j: row j sums the window tail that starts at step j
        self._fold = np.where(k[None, :] >= k[:, None], self.gamma ** (k[None, :] - k[:, None]), 0.0).astype(np.float32)
        self._discounts = (self.gamma ** np.arange(self.n + 1)).astype(np.float32)
        self._positions = (k[:, None] + k[None, :]) % self.n  # [oldest, j] -> ring position of window step j
        self._next_position = (k + 1) % self.n
        self._fold_t = np.ascontiguousarray(self._fold.T)
        held = k[None, :] < np.arange(self.n + 1)[:, None]  # [length, j]: step j is in a window of that length
        self._held = held.astype(np.float32)
        # [whole * (n + 1) + length, j]: the steps (length - j) of the window emitted from start j, 0 where none is:
        # every tail at an episode end (whole), else only the oldest
        starts = np.concatenate([held & (k[None, :] == 0), held])
        self._spans = np.where(starts, np.tile(np.arange(self.n + 1)[:, None] - k[None, :], (2, 1)), 0)
        # field -> [E * n, ...] arrays: step j of env e's ring sits in row e * n + j (one flat index per
        # row makes every gather a single ndarray.take)
        self._window: dict[str, Any] | None = None
        # [E * n, ...]: next_obs of each step held, so a window can be flushed from its own last step
        self._next_obs: Any = None
        self._head = np.zeros(0, dtype=np.int64)  # next write position per env
        self._length = np.zeros(0, dtype=np.int64)  # steps held per env
        # sized with the windows by _ensure_capacity: a scratch row per env and the tables of _constants
        self._scratch = np.zeros(0, dtype=np.int64)
        self._window_rows, self._no_end, self._full_discount = self._constants(0)
        self._sized_for_source = False
        self._gamma_column = _read_only(np.zeros(0, dtype=np.float32))  # n=1: the discount column
        # Lockstep fast path (ptl_rl.stages.nstep_lockstep): a source's batch that holds every one of its envs, in
        # order, is the same read-only env_id array each time. While every env of it writes at the same
        # ring position (the phase), a step is a few strided slice copies instead of gathers and scatters.
        # _quiet is the fewest steps a window of those envs holds: from n - 1 on, a step fills every window.
        self._lock_ids: np.ndarray | None = None  # the source's env_id array of a full batch
        self._lock_range = (0, 0)
        self._lock_phase: int | None = None  # ring position every lockstep env writes next; None: out of step
        self._quiet = 0
        self._views: dict[str, np.ndarray] | None = None  # [E, n, ...] views of the window arrays

        self._undo: list[tuple[list[Any], np.ndarray, list[Any]]] = []  # see snapshot

    def __len__(self) -> int:
        """Envs whose window holds steps not yet emitted."""
        return int(np.count_nonzero(self._length))

    # ------------------------------------------------------------------ guard
    def snapshot(self) -> tuple[Any, ...]:
        """What a fold may change of what the windows hold: head and length (written in place) as bytes, the
        rings by reference (a growth replaces them), and an undo list for slots a fold overwrites.

        A fold writes each step into its env's free slot, which no window held at the snapshot; only a
        batch holding several steps of one env (:meth:`_fold_in_order`) writes into a slot that an
        earlier step of the same fold freed, so it logs what it overwrites in the snapshot's undo list.
        Everything else a fold changes follows from these (the ``[E, n]`` views, the tables sized with the
        rings) or is found again (the lockstep state), and :meth:`restore` rebuilds it rather than this
        method saving it, because this runs before every step (a copy of every attribute was the dearest part of
        the guard's cost with one env: docs/design/robustness.md). The lockstep path needs no saved state
        of its own: a restore leaves it, as :meth:`load_state_dict` does, until the envs are back in phase.
        """
        undo: list[tuple[list[Any], np.ndarray, list[Any]]] = []
        self._undo = undo
        return undo, self._head.tobytes(), self._length.tobytes(), self._window, self._next_obs

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Put back a :meth:`snapshot`: a fold cut short is undone whole (idempotent, so a cut restore reruns)."""
        undo, head, length, window, next_obs = snapshot
        for stores, slots, saved in reversed(undo):
            for store, values in zip(stores, saved, strict=True):
                tree_assign(store, slots, values)
        self._window, self._next_obs = window, next_obs
        # fresh arrays each time: a restore cut short and run again starts from the same bytes
        self._head = np.frombuffer(head, dtype=np.int64).copy()
        self._length = np.frombuffer(length, dtype=np.int64).copy()
        self._derive()

    def _derive(self) -> None:
        """Rebuild what follows from the rings (after a restore or a load): the tables sized with them, and
        the lockstep state as unknown (the general path runs until the envs are back in one phase)."""
        size = len(self._length)
        self._scratch = np.zeros(size, dtype=np.int64)
        self._window_rows, self._no_end, self._full_discount = self._constants(size)
        self._sized_for_source = False  # the rings may be sized for fewer envs than the upstream has
        self._lock_ids, self._lock_range, self._lock_phase, self._quiet, self._views = None, (0, 0), None, 0, None

    # ------------------------------------------------------------------ folding
    def fold(self, batch: TransitionBatch, one_row_per_env: bool) -> TransitionBatch | None:
        """Add the 1-step rows of ``batch``; returns the n-step rows they complete (``None``: none)."""
        if self.n == 1:
            return self._pass_through(batch) if len(batch) else None
        env_id = np.asarray(batch["env_id"])
        if not len(env_id):
            return None
        return self._fold_batch(batch, env_id, one_row_per_env)

    def _pass_through(self, batch: TransitionBatch) -> TransitionBatch:
        """n=1: every step is its own window; only ``reward`` (float32) and ``discount`` (gamma) change."""
        rows = len(batch)
        if len(self._gamma_column) < rows:
            self._gamma_column = _read_only(np.full(max(rows, 2 * len(self._gamma_column)), self.gamma, np.float32))
        fields = dict(batch.items())
        reward = fields["reward"]
        if type(reward) is not np.ndarray or reward.dtype != np.float32:
            fields["reward"] = np.asarray(reward, dtype=np.float32)
        fields["discount"] = self._gamma_column[:rows]
        return TransitionBatch.wrap(fields)

    def _fold_batch(self, batch: TransitionBatch, env_id: np.ndarray, one_row_per_env: bool) -> TransitionBatch | None:
        if not (one_row_per_env and self._sized_for_source):
            self._ensure_capacity(batch, int(env_id.max()) + 1)
            # a source's batches hold (a subset of) the env ids of its first batch: only other input can grow
            self._sized_for_source = one_row_per_env
            if one_row_per_env and self._lock_ids is None:
                lockstep.adopt_ids(self, env_id)
        if not one_row_per_env:
            self._lock_phase = None  # rows of any envs: the heads may leave the lockstep phase
            if not self._unique(env_id):
                return self._fold_in_order(batch, env_id)
            return self._fold_unique(batch, env_id)
        full_batch = env_id is self._lock_ids
        if full_batch:
            ended = np.count_nonzero(batch["terminated"]) or np.count_nonzero(batch["truncated"])
            phase = self._lock_phase
            if phase is not None:
                if not ended and self._quiet >= self.n - 1:
                    return lockstep.fold(self, batch, phase)
                # every env stepped, in phase, with an episode end or windows not yet full: the general fold, after
                # which every env is still in phase (the heads all moved on by one)
                out = self._fold_unique(batch, env_id)
                lockstep.advance(self, phase, quiet=not ended)
                return out
        elif self._lock_ids is None:
            if not env_id.flags.writeable:  # a full batch of a source (after a restore, say)
                lockstep.adopt_ids(self, env_id)
            return self._fold_unique(batch, env_id)
        elif self._lock_phase is not None and lockstep.absent_are_empty(self, env_id):
            # a step without the envs that only reset (next-step autoreset): their windows are empty, so their
            # heads move on with the others' and every env stays in phase
            phase = self._lock_phase
            out = self._fold_unique(batch, env_id)
            lockstep.advance(self, phase, quiet=False)
            return out
        # out of phase, or a batch without some envs (next-step resets): those envs' heads stay behind
        self._lock_phase, self._quiet = None, 0
        out = self._fold_unique(batch, env_id)
        if full_batch and not ended:
            # only a step that ends no episode can lead to the lockstep path (the windows must fill up
            # first), so only such a step looks for the common phase: none of this while episodes end often
            lockstep.resync(self)
        return out

    def flush(self) -> TransitionBatch | None:
        """Emit every window still in flight as truncated (bootstrap from its last ``next_obs``); empties them."""
        if self._window is None:
            return None
        envs = np.flatnonzero(self._length > 0)
        if len(envs) == 0:
            return None
        self._quiet = 0  # the windows empty: the lockstep path waits until they are full again
        zeros = np.zeros(len(envs), dtype=bool)
        head = self._head[envs]
        last = envs * self.n + (head - 1) % self.n  # the slot of each window's last step
        ends = {"next_obs": tree_take(self._next_obs, last), "terminated": zeros, "truncated": ~zeros}
        out = self._emit(envs, head, self._length[envs], ~zeros, ends, np.arange(len(envs)))
        self._length[envs] = 0
        return out

    def _fold_unique(self, batch: TransitionBatch, env: np.ndarray) -> TransitionBatch | None:
        window = self._window
        assert window is not None  # sized by the first batch, before any fold or emit
        n = self.n
        head = self._head.take(env)
        slots = env * n + head
        # The slot at head is free (a window holds at most n - 1 steps between calls): the write changes
        # no window held, and a snapshot of head and length (see snapshot) undoes the step whole.
        for name, store in window.items():
            tree_assign(store, slots, batch[name])
        tree_assign(self._next_obs, slots, batch["next_obs"])
        head = self._next_position.take(head)
        length = self._length.take(env) + 1

        done = batch["terminated"] | batch["truncated"]
        if not np.count_nonzero(done):  # the common step: only full windows, no tails
            full = length == n
            emitting = np.count_nonzero(full)
            if emitting == len(env):
                out = self._emit_full(env, head, batch["next_obs"])
                length -= 1  # a full window drops its oldest step
            elif not emitting:
                out = None
            else:
                rows = full.nonzero()[0]
                out = self._emit_full(env.take(rows), head.take(rows), tree_take(batch["next_obs"], rows))
                length -= full
        else:
            full = length == n
            rows = (done | full).nonzero()[0]
            if len(rows) < len(env):
                out = self._emit(env.take(rows), head.take(rows), length.take(rows), done.take(rows), batch, rows)
            else:
                out = self._emit(env, head, length, done, batch, rows)
            # a full window drops its oldest step; an ended episode empties its window
            length = np.where(done, 0, length - full)
        self._head[env] = head
        self._length[env] = length
        return out

    def _emit_full(self, env: np.ndarray, head: np.ndarray, next_obs: Any) -> TransitionBatch:
        """The full oldest window of each env in ``env`` (none of them ended); ``head`` is after this step."""
        window = self._window
        assert window is not None  # sized by the first batch, before any fold or emit
        first = env * self.n + head  # a full window's oldest step sits where the next write goes
        rows = len(env)
        out: dict[str, Any] = {}
        for name, store in window.items():
            out[name] = tree_take(store, first)
        out["reward"] = window["reward"].take(self._window_rows[first]).dot(self._fold[0])
        out["next_obs"] = next_obs
        out["terminated"] = out["truncated"] = self._no_end[:rows]
        out["discount"] = self._full_discount[:rows]
        out["env_id"] = env
        return TransitionBatch.wrap(out)

    def _emit(
        self,
        env: np.ndarray,
        head: np.ndarray,
        length: np.ndarray,
        whole: np.ndarray,
        ends: Any,
        end_rows: np.ndarray,
    ) -> TransitionBatch:
        """Emit windows of the envs ``env`` holding ``length`` steps each, ending before ``head``.

        Where ``whole`` is true every tail window is emitted (an episode end);
        elsewhere only the full oldest window. ``ends[k][end_rows]`` holds the
        ``next_obs``/``terminated``/``truncated`` of each env's last step.
        Changes no state.
        """
        window = self._window
        assert window is not None  # sized by the first batch, before any fold or emit
        n = self.n
        # flat indices and ndarray.take throughout: a fraction of the cost of 2-D fancy indexing on small arrays
        slots = self._window_rows.take(env * n + (head - length) % n, axis=0)  # [R, n] window rows, oldest first
        rewards = window["reward"].take(slots) * self._held.take(length, axis=0)
        tail_sums = rewards.dot(self._fold_t)  # [R, n]: discounted sum of the window tail starting at step j
        spans = self._spans.take(length + whole * (n + 1), axis=0)  # [R, n]: see __init__
        picked = spans.ravel().nonzero()[0]  # the emitted (row, start j) pairs, flat: row * n + j
        row = picked // n
        out: dict[str, Any] = {}
        src_slot = slots.take(picked)
        for name, store in window.items():
            out[name] = tree_take(store, src_slot)
        out["reward"] = tail_sums.take(picked)
        last = end_rows.take(row)
        for name in ("next_obs", "terminated", "truncated"):
            out[name] = tree_take(ends[name], last)
        out["discount"] = self._discounts.take(spans.take(picked))
        out["env_id"] = env.take(row)
        return TransitionBatch.wrap(out)

    def _fold_in_order(self, batch: TransitionBatch, env_id: np.ndarray) -> TransitionBatch | None:
        """Several rows of one env in one batch: fold them occurrence by occurrence, keeping time order."""
        occurrence = rank_within_group(env_id)
        outputs = []
        for k in range(int(occurrence.max()) + 1):
            rows = np.flatnonzero(occurrence == k)
            if k:  # the slots it writes may have been freed by the occurrences before: log what they hold
                self._log_overwrite(env_id[rows])
            out = self._fold_unique(batch.rows(rows), env_id[rows])
            if out is not None:
                outputs.append(out)
        return TransitionBatch.concat(outputs) if outputs else None

    def _log_overwrite(self, env: np.ndarray) -> None:
        """Log the rows at the next write slots of ``env`` (int [R]) in the snapshot's undo list."""
        assert self._window is not None  # sized by the first batch, before any fold
        stores = [*self._window.values(), self._next_obs]
        slots = env * self.n + self._head[env]
        self._undo.append((stores, slots, [tree_take(store, slots) for store in stores]))

    def _unique(self, env_id: np.ndarray) -> bool:
        if len(env_id) == 1:
            return True
        marks = self._scratch[: len(self._length)]
        positions = np.arange(len(env_id))
        marks[env_id] = positions
        return bool((marks[env_id] == positions).all())

    # ------------------------------------------------------------------ storage
    def _ensure_capacity(self, batch: TransitionBatch, num_envs: int) -> None:
        window, next_obs = self._window, self._next_obs
        if window is None:
            names = [name for name in batch.keys() if name not in _STEP_END_FIELDS]
            window = {
                name: tree_map(lambda a: np.zeros((0, *a.shape[1:]), dtype=a.dtype), batch[name]) for name in names
            }
            next_obs = tree_map(lambda a: np.zeros((0, *a.shape[1:]), dtype=a.dtype), batch["next_obs"])
        elif num_envs <= len(self._length):
            return
        size = max(num_envs, 2 * len(self._length))
        grow = size - len(self._length)

        def grown(a: np.ndarray, rows_per_env: int = 1) -> np.ndarray:
            return np.concatenate([a, np.zeros((grow * rows_per_env, *a.shape[1:]), dtype=a.dtype)])

        window = {name: tree_map(lambda a: grown(a, self.n), store) for name, store in window.items()}
        next_obs = tree_map(lambda a: grown(a, self.n), next_obs)
        head, length = grown(self._head), grown(self._length)
        window_rows, no_end, full_discount = self._constants(size)
        self._lock_phase, self._quiet, self._views = None, 0, None
        self._window, self._next_obs, self._head, self._length = window, next_obs, head, length
        self._scratch = np.zeros(size, dtype=np.int64)
        self._window_rows, self._no_end, self._full_discount = window_rows, no_end, full_discount

    def _constants(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tables for ``size`` envs: window rows by first slot, the no-end flags and the full discount."""
        # [e * n + oldest] -> the window's rows, oldest first
        window_rows = (np.arange(size)[:, None, None] * self.n + self._positions[None]).reshape(size * self.n, self.n)
        # shared by every emitted batch, so read-only: a consumer that writes to one fails loudly
        no_end = _read_only(np.zeros(size, dtype=bool))
        full_discount = _read_only(np.full(size, self._discounts[self.n], dtype=np.float32))
        return window_rows, no_end, full_discount

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The windows in flight as tensors (``weights_only``-safe)."""
        if self._window is None:
            return {"window": None}
        to_t = lambda a: torch.from_numpy(a.copy())  # noqa: E731
        state = {
            "window": {name: tree_map(to_t, store) for name, store in self._window.items()},
            "last_next_obs": tree_map(to_t, tree_take(self._next_obs, self._last_slots())),
            "head": to_t(self._head),
            "length": to_t(self._length),
        }
        return state

    def _last_slots(self) -> np.ndarray:
        """[E]: the ring slot of each env's most recent step."""
        return np.arange(len(self._head)) * self.n + (self._head - 1) % self.n

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["window"] is None:
            self._window, self._next_obs = None, None
            self._head = np.zeros(0, dtype=np.int64)
            self._length = np.zeros(0, dtype=np.int64)
        else:
            to_np = lambda t: t.numpy().copy()  # noqa: E731
            self._window = {name: tree_map(to_np, store) for name, store in state["window"].items()}
            self._head = to_np(state["head"]).astype(np.int64, copy=False)  # (int64: what snapshot's bytes hold)
            self._length = to_np(state["length"]).astype(np.int64, copy=False)
            last_next_obs = tree_map(to_np, state["last_next_obs"])
            self._next_obs = tree_map(lambda a: np.zeros((len(a) * self.n, *a.shape[1:]), a.dtype), last_next_obs)
            tree_assign(self._next_obs, self._last_slots(), last_next_obs)
        self._derive()


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a

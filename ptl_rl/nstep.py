"""NStepTransform: folds 1-step transitions into n-step transitions, per env.

One discount rule covers every episode end. For a window of steps
``t .. t+k-1`` of one env (``k <= n``)::

    reward   = sum_{i<k} gamma**i * r_{t+i}
    discount = gamma**k
    next_obs = next_obs_{t+k-1}

A window is emitted when it holds ``n`` steps, or when its episode ends inside
it: then every shorter tail window is emitted as well, carrying the
``terminated`` / ``truncated`` flags of the last step. A learner's target is
always ``reward + discount * (1 - terminated) * V(next_obs)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ptl_rl.batch import TransitionBatch, tree_map
from ptl_rl.reprs import stage_repr

# Fields that describe the end of a step rather than its start: they are not kept in the window.
_STEP_END_FIELDS = ("next_obs", "terminated", "truncated", "discount", "env_id")


class NStepTransform:
    """Turn a stream of 1-step :class:`TransitionBatch` into n-step transitions.

    Args:
        upstream: an iterator of 1-step batches (an :class:`ExperienceSource`),
            or ``None`` to use :meth:`fold` on recorded data.
        n: window length, ``n >= 1``.
        gamma: discount per step, in ``(0, 1]``.

    Input rows may come from any number of envs (``env_id``, int64 >= 0) in any
    interleaving; rows of the same env must arrive in time order. Fields other
    than ``next_obs``, ``terminated``, ``truncated``, ``discount`` and ``env_id``
    (``obs``, ``action``, agent extras) are taken from the first step of the
    window; ``reward`` becomes the discounted sum (float32). The incoming
    ``discount`` is replaced by ``gamma**k`` (float32).
    """

    def __init__(self, upstream: Iterator[TransitionBatch] | None, n: int, gamma: float) -> None:
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.upstream = upstream
        # an ExperienceSource yields at most one row per env and batch: no need to check each batch
        self._upstream_one_row_per_env = bool(getattr(upstream, "one_row_per_env", False))
        self.n = int(n)
        self.gamma = float(gamma)
        k = np.arange(self.n)
        # _fold[j, k] = gamma**(k - j) for k >= j: row j sums the window tail that starts at step j
        self._fold = np.where(k[None, :] >= k[:, None], self.gamma ** (k[None, :] - k[:, None]), 0.0).astype(np.float32)
        self._discounts = (self.gamma ** np.arange(self.n + 1)).astype(np.float32)
        self._positions = (k[:, None] + k[None, :]) % self.n  # [oldest, j] -> ring position of window step j
        self._next_position = (k + 1) % self.n
        held = k[None, :] < np.arange(self.n + 1)[:, None]  # [length, j]: step j is in a window of that length
        self._held = held.astype(np.float32)
        # [whole, length, j]: which window starts j are emitted: every tail at an episode end, else the oldest
        self._starts = np.stack([held & (k[None, :] == 0), held])
        # field -> [E * n, ...] arrays: step j of env e's ring sits in row e * n + j (one flat index per
        # row makes every gather a single ndarray.take)
        self._window: dict[str, Any] | None = None
        self._last_next_obs: Any = None  # [E, ...], for flushing windows after a restore
        self._head = np.zeros(0, dtype=np.int64)  # next write position per env
        self._length = np.zeros(0, dtype=np.int64)  # steps held per env
        self._flush_on_next = False
        self._sized_for_source = False

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> NStepTransform:
        return self

    def __next__(self) -> TransitionBatch:
        if self.upstream is None:
            raise TypeError("this NStepTransform has no upstream; call fold(batch) instead")
        while True:
            out = self.fold(next(self.upstream), one_row_per_env=self._upstream_one_row_per_env)
            if out is not None:
                return out

    # ------------------------------------------------------------------ folding
    def fold(self, batch: TransitionBatch, one_row_per_env: bool = False) -> TransitionBatch | None:
        """Add 1-step transitions and return the n-step transitions they complete (or ``None``).

        ``batch`` may hold several consecutive steps of one env (in time order);
        ``one_row_per_env=True`` promises it holds at most one, which skips a check.
        After :meth:`load_state_dict` the restored windows are emitted first, as
        truncated (see :meth:`flush`): the rows of ``batch`` start new episodes.
        """
        restored = None
        if self._flush_on_next:
            self._flush_on_next = False
            restored = self.flush()
        out = self._fold_batch(batch, one_row_per_env) if len(batch) else None
        if restored is None or out is None:
            return out if restored is None else restored
        return TransitionBatch.concat([restored, out])

    def _fold_batch(self, batch: TransitionBatch, one_row_per_env: bool) -> TransitionBatch | None:
        env_id = np.asarray(batch["env_id"])
        if not (one_row_per_env and self._sized_for_source):
            self._ensure_capacity(batch, int(env_id.max()) + 1)
            # a source's batches hold (a subset of) the env ids of its first batch: only other input can grow
            self._sized_for_source = one_row_per_env
        if not one_row_per_env and not self._unique(env_id):
            return self._fold_in_order(batch, env_id)
        return self._fold_unique(batch, env_id)

    def flush(self) -> TransitionBatch | None:
        """Emit every window still in flight as truncated (bootstrap from its last ``next_obs``).

        Use at the end of a recorded trajectory that stops mid-episode. The
        windows are then empty.
        """
        if self._window is None:
            return None
        envs = np.flatnonzero(self._length > 0)
        if len(envs) == 0:
            return None
        zeros = np.zeros(len(envs), dtype=bool)
        ends = {"next_obs": _take(self._last_next_obs, envs), "terminated": zeros, "truncated": ~zeros}
        out = self._emit(envs, self._length[envs], ~zeros, ends, np.arange(len(envs)))
        self._length[envs] = 0
        return out

    def _fold_unique(self, batch: TransitionBatch, env: np.ndarray) -> TransitionBatch | None:
        n = self.n
        head = self._head[env]
        slots = env * n + head
        for name, store in self._window.items():
            _assign(store, slots, batch[name])
        _assign(self._last_next_obs, env, batch["next_obs"])
        self._head[env] = self._next_position[head]
        length = self._length[env] + 1
        self._length[env] = length

        done = batch["terminated"] | batch["truncated"]
        if not np.count_nonzero(done):  # the common step: only full windows, no tails
            full = length == n
            emitting = np.count_nonzero(full)
            if emitting == len(env):
                return self._emit_full(env, batch["next_obs"])
            if not emitting:
                return None
            rows = full.nonzero()[0]
            return self._emit_full(env[rows], _take(batch["next_obs"], rows))
        emit = done | (length == n)
        rows = emit.nonzero()[0]
        if len(rows) < len(env):
            env, length, done = env[rows], length[rows], done[rows]
        out = self._emit(env, length, done, batch, rows)
        # a full window drops its oldest step; an ended episode empties its window
        self._length[env] = np.where(done, 0, length - 1)
        return out

    def _emit_full(self, env: np.ndarray, next_obs: Any) -> TransitionBatch:
        """Emit the full oldest window of each env in ``env`` (none of them ended) and drop its oldest step."""
        first = env * self.n + self._head[env]  # a full window's oldest step sits where the next write goes
        rows = len(env)
        out: dict[str, Any] = {}
        for name, store in self._window.items():
            out[name] = _take(store, first)
        out["reward"] = self._window["reward"].take(self._window_rows[first]) @ self._fold[0]
        out["next_obs"] = next_obs
        out["terminated"] = out["truncated"] = self._no_end[:rows]
        out["discount"] = self._full_discount[:rows]
        out["env_id"] = env
        self._length[env] = self.n - 1
        return TransitionBatch(out)

    def _emit(
        self, env: np.ndarray, length: np.ndarray, whole: np.ndarray, ends: Any, end_rows: np.ndarray
    ) -> TransitionBatch:
        """Emit windows of the envs ``env`` holding ``length`` steps each.

        Where ``whole`` is true every tail window is emitted (an episode end);
        elsewhere only the full oldest window. ``ends[k][end_rows]`` holds the
        ``next_obs``/``terminated``/``truncated`` of each env's last step.
        """
        oldest = (self._head[env] - length) % self.n
        slots = (env * self.n)[:, None] + self._positions[oldest]  # [R, n] window rows, oldest first
        rewards = self._window["reward"].take(slots) * self._held[length]
        tail_sums = rewards @ self._fold.T  # [R, n]: discounted sum of the window tail starting at step j
        row, start = self._starts[whole.view(np.uint8), length].nonzero()
        src_env, src_slot = env[row], slots[row, start]
        out: dict[str, Any] = {}
        for name, store in self._window.items():
            out[name] = _take(store, src_slot)
        out["reward"] = tail_sums[row, start]
        last = end_rows[row]
        for name in ("next_obs", "terminated", "truncated"):
            out[name] = _take(ends[name], last)
        out["discount"] = self._discounts[length[row] - start]
        out["env_id"] = src_env
        return TransitionBatch(out)

    def _fold_in_order(self, batch: TransitionBatch, env_id: np.ndarray) -> TransitionBatch | None:
        """Several rows of one env in one batch: fold them occurrence by occurrence, keeping time order."""
        order = np.argsort(env_id, kind="stable")
        sorted_ids = env_id[order]
        group_start = np.searchsorted(sorted_ids, sorted_ids, side="left")
        occurrence = np.empty(len(env_id), dtype=np.int64)
        occurrence[order] = np.arange(len(env_id)) - group_start
        outputs = []
        for k in range(int(occurrence.max()) + 1):
            rows = np.flatnonzero(occurrence == k)
            out = self._fold_unique(batch.rows(rows), env_id[rows])
            if out is not None:
                outputs.append(out)
        return TransitionBatch.concat(outputs) if outputs else None

    def _unique(self, env_id: np.ndarray) -> bool:
        if len(env_id) == 1:
            return True
        marks = self._scratch[: len(self._length)]
        positions = np.arange(len(env_id))
        marks[env_id] = positions
        return bool((marks[env_id] == positions).all())

    # ------------------------------------------------------------------ storage
    def _ensure_capacity(self, batch: TransitionBatch, num_envs: int) -> None:
        if self._window is None:
            names = [name for name in batch.keys() if name not in _STEP_END_FIELDS]
            self._window = {
                name: tree_map(lambda a: np.zeros((0, *a.shape[1:]), dtype=a.dtype), batch[name]) for name in names
            }
            self._last_next_obs = tree_map(lambda a: np.zeros((0, *a.shape[1:]), dtype=a.dtype), batch["next_obs"])
        if num_envs <= len(self._length):
            return
        size = max(num_envs, 2 * len(self._length))
        grow = size - len(self._length)

        def grown(a: np.ndarray, rows_per_env: int = 1) -> np.ndarray:
            return np.concatenate([a, np.zeros((grow * rows_per_env, *a.shape[1:]), dtype=a.dtype)])

        self._window = {name: tree_map(lambda a: grown(a, self.n), store) for name, store in self._window.items()}
        self._last_next_obs = tree_map(grown, self._last_next_obs)
        self._head = grown(self._head)
        self._length = grown(self._length)
        self._scratch = np.zeros(size, dtype=np.int64)
        self._allocate_constants(size)

    def _allocate_constants(self, size: int) -> None:
        # [e * n + oldest] -> the window's rows, oldest first
        self._window_rows = (np.arange(size)[:, None, None] * self.n + self._positions[None]).reshape(
            size * self.n, self.n
        )
        # shared by every emitted batch, so read-only: a consumer that writes to one fails loudly
        self._no_end = _read_only(np.zeros(size, dtype=bool))
        self._full_discount = _read_only(np.full(size, self._discounts[self.n], dtype=np.float32))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """In-flight windows as tensors (``weights_only``-safe).

        After :meth:`load_state_dict` they are emitted as truncated by the next
        ``next()`` or ``fold()``, ahead of what that step's batch completes,
        because the environments (whose state is not checkpointed) start new
        episodes: a restored window is never continued with new steps.
        """
        if self._window is None:
            return {"window": None}
        to_t = lambda a: torch.from_numpy(a.copy())  # noqa: E731
        return {
            "window": {name: tree_map(to_t, store) for name, store in self._window.items()},
            "last_next_obs": tree_map(to_t, self._last_next_obs),
            "head": to_t(self._head),
            "length": to_t(self._length),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sized_for_source = False  # the restored windows may be sized for fewer envs than the upstream has
        if state["window"] is None:
            self._window = None
            self._flush_on_next = False
            self._head = np.zeros(0, dtype=np.int64)
            self._length = np.zeros(0, dtype=np.int64)
            return
        to_np = lambda t: t.numpy().copy()  # noqa: E731
        self._window = {name: tree_map(to_np, store) for name, store in state["window"].items()}
        self._last_next_obs = tree_map(to_np, state["last_next_obs"])
        self._head = to_np(state["head"])
        self._length = to_np(state["length"])
        self._scratch = np.zeros(len(self._length), dtype=np.int64)
        self._allocate_constants(len(self._length))
        self._flush_on_next = True

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``NStepTransform(n=3, gamma=0.99, windows_in_flight=5)``: envs whose window holds steps not yet emitted."""
        in_flight = int(np.count_nonzero(self._length))
        return stage_repr(self, n=self.n, gamma=self.gamma, windows_in_flight=in_flight)


def _take(tree: Any, rows: np.ndarray) -> Any:
    if isinstance(tree, np.ndarray):
        return tree.take(rows, axis=0)
    return {k: _take(v, rows) for k, v in tree.items()}


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _assign(store: Any, index: Any, value: Any) -> None:
    if isinstance(store, dict):
        for k in store:
            _assign(store[k], index, value[k])
    else:
        store[index] = value

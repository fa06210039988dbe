"""The rows of a rollout being collected: per env a time-ordered sequence in preallocated time-major arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from ptl_rl.core._grouping import rank_within_group
from ptl_rl.core._trees import tree_map
from ptl_rl.core.batch import TransitionBatch


class RolloutRows:
    """Rows held per env in arrays ``[capacity_per_env, N, ...]`` (row ``t`` of env ``e`` at ``[t, e]``).

    Envs may hold different numbers of rows (``count``, int64 [N]): under
    next-step autoreset the source drops each reset step's row, so an env that
    finished episodes lags behind. ``fields`` maps each field name to its
    arrays (or dicts of them for dict observations); ``None`` until the first
    :meth:`add` allocates them from that batch's fields, dtypes and shapes.
    ``starts_next`` (bool [N]) says whether each env's next row starts an
    episode; it carries over :meth:`clear`.
    """

    def __init__(self, num_envs: int, capacity_per_env: int, steps_per_env: int) -> None:
        self.num_envs = num_envs
        self.capacity_per_env = capacity_per_env
        self.steps_per_env = steps_per_env  # (only named when an env overflows)
        self.fields: dict[str, Any] | None = None  # name -> [capacity, N, ...] arrays (or dicts of them)
        self._flat: dict[str, Any] = {}  # the same memory viewed as [capacity * N, ...]: cheap scattered writes
        self.count = np.zeros(num_envs, dtype=np.int64)  # rows held per env
        self._columns = np.arange(num_envs)
        self._aligned = True
        # whether each env's next row starts an episode: its last row ended (the source starts every env afresh)
        self.starts_next = np.ones(num_envs, dtype=bool)

    def __len__(self) -> int:
        return int(self.count.sum())

    def clear(self) -> None:
        """Forget the rows held (the arrays stay allocated); whether each env's last one ended carries over."""
        fields = self.fields
        if fields is not None:
            held = self.count > 0
            last = np.maximum(self.count - 1, 0)
            ended = fields["terminated"][last, self._columns] | fields["truncated"][last, self._columns]
            self.starts_next = np.where(held, ended, self.starts_next)
        self.count[:] = 0
        self._aligned = True  # every env holds the same number of rows

    def add(self, batch: TransitionBatch) -> None:
        """Append the rows of ``batch`` to their envs' sequences (any number of rows per env, in time order)."""
        size = len(batch)
        if size == 0:
            return
        fields = self.fields
        if fields is None:
            fields = self._allocate(batch)
        elif batch.keys() != fields.keys():
            raise ValueError(
                f"batch fields {sorted(batch.keys())} differ from the rollout's {sorted(fields)}; "
                "every batch of a rollout must carry the same fields and agent extras"
            )
        env = np.asarray(batch["env_id"]) % self.num_envs
        if self._aligned and size == self.num_envs and np.array_equal(env, self._columns):
            # the common case (no env lags behind, one row per env in env order): one row write per field
            row = int(self.count[0])
            if row >= self.capacity_per_env:
                self._overflow()
            self.count += 1
            stores: dict[str, Any] = fields
            index: Any = row
        else:
            # envs at different positions (next-step autoreset dropped rows): scatter into the flat views
            unique = size == 1 or bool((env[1:] > env[:-1]).all())  # one row per env, as a source yields them
            pos = self.count[env] if unique else self.count[env] + rank_within_group(env)
            if pos.max() >= self.capacity_per_env:
                self._overflow()
            if unique:
                self.count[env] = pos + 1
            else:
                self.count += np.bincount(env, minlength=self.num_envs)
            self._aligned = bool((self.count == self.count[0]).all())
            stores, index = self._flat, pos * self.num_envs + env
        for name, value in batch.items():
            store = stores[name]
            if isinstance(store, np.ndarray):
                store[index] = value
            else:  # a dict observation: the same write per leaf
                tree_map(lambda leaf, v: leaf.__setitem__(index, v), store, value)

    def _overflow(self) -> None:
        raise RuntimeError(
            f"an env exceeded capacity_per_env={self.capacity_per_env} rows while others still lag behind "
            f"steps_per_env={self.steps_per_env}; raise capacity_per_env"
        )

    def _allocate(self, batch: TransitionBatch) -> dict[str, Any]:
        """Allocate the field arrays [capacity_per_env, N, ...] for ``batch``'s fields; returns them (``fields``)."""
        needed = ("obs", "reward", "next_obs", "terminated", "truncated", "discount", "env_id")
        missing = [name for name in needed if name not in batch]
        if missing:
            raise ValueError(f"a rollout needs 1-step transition batches; missing fields {missing}")
        shape = (self.capacity_per_env, self.num_envs)
        self.fields = {
            name: tree_map(lambda a: np.zeros((*shape, *a.shape[1:]), dtype=a.dtype), value)
            for name, value in batch.items()
        }
        rows = shape[0] * shape[1]
        self._flat = {name: tree_map(lambda a: a.reshape(rows, *a.shape[2:]), v) for name, v in self.fields.items()}
        return self.fields

"""Per-env bookkeeping of a FrameStorage: one int64 array with named column views, its spare, the pending stacks."""

from __future__ import annotations

from typing import Any

import numpy as np

from ptl_rl.core._grouping import rank_within_group

#: cached ``arange`` lengths: at least this many envs, so that small vector envs never grow it
MIN_ARANGE = 64


class EnvState:
    """Per-env bookkeeping of a :class:`FrameStorage` in one int64 array [E, W], with named column views.

    One array, so that a snapshot is one small copy and an env's state is read
    and written back with one gather and one scatter. Columns: the env's
    newest stack (``last``, S frame positions), the newest final stack
    (``final``, S), whether its next stack may be trusted to continue the
    newest (``trust``), and, oldest first, the numbers of the transitions of
    its last ``n`` observations that wait for their ``next_obs`` (``recent``,
    a shift register; -1 for none; a transition's slot is its number modulo
    ``capacity``), and where the oldest of their ``next_obs`` stacks is in
    the env's ring of ``n + 1`` pending stacks (``head``, checked mode).
    """

    __slots__ = ("array", "last", "final", "trust", "recent", "head")

    def __init__(self, array: np.ndarray, stack: int, n: int) -> None:
        s = stack
        self.array = array
        self.last, self.final = array[:, :s], array[:, s : 2 * s]
        self.trust, self.recent = array[:, 2 * s], array[:, 2 * s + 1 : 2 * s + 1 + n]
        self.head = array[:, 2 * s + 1 + n]

    def __reduce__(self) -> tuple[type[EnvState], tuple[np.ndarray, int, int]]:
        # pickle / deepcopy the array once and make the column views of the copy (pickled one by one, each
        # view would come back as an array of its own, no longer a view)
        return EnvState, (self.array, self.last.shape[1], self.recent.shape[1])

    @staticmethod
    def width(stack: int, n: int) -> int:
        """Columns of the array: ``last``, ``final`` (S each), ``trust``, ``recent`` (n), ``head``."""
        return 2 * stack + 2 + n

    @classmethod
    def empty(cls, num_envs: int, stack: int, n: int) -> EnvState:
        state = cls(np.zeros((num_envs, cls.width(stack, n)), dtype=np.int64), stack, n)
        state.last[:] = -1
        state.final[:] = -1
        state.recent[:] = -1
        return state

    def spare(self) -> EnvState:
        """A state of the same shape (contents undefined): where the next add writes the state it commits."""
        stack = self.last.shape[1]
        return EnvState(np.empty_like(self.array), stack, self.recent.shape[1])

    def copy(self) -> EnvState:
        """A state of the same shape and contents, in its own array."""
        stack = self.last.shape[1]
        return EnvState(self.array.copy(), stack, self.recent.shape[1])

    def columns(self) -> dict[str, np.ndarray]:
        """The state by column name (views)."""
        return {"last": self.last, "final": self.final, "trust": self.trust, "recent": self.recent, "head": self.head}


class EnvTable:
    """Everything a FrameStorage keeps per env: the :class:`EnvState` and its spare, and the pending stacks.

    An add never changes the state it began from: it writes the next state into :attr:`spare` and the two
    swap (the compiled insert writes it there; the Python path copies the state there first, see
    :meth:`begin_write`). So a snapshot holds the state by reference, and is good for the add that follows
    it: a redo after a cut starts from it unchanged. :meth:`restore` installs a copy, so the same snapshot
    can be restored again.

    Attributes:
        state: the committed per-env state (int64 [E, W]).
        spare: an array like it, where the next add writes (contents undefined between adds).
        pending: ``[E, n + 1, S, *frame]``: per env a ring of the whole ``next_obs`` stacks that wait for the
            observation that resolves them (checked mode), the oldest at the env's ``head``, the newest
            ``n - 1`` after it, and one free position (an add writes there, so one done again finds the
            stacks it compares unchanged).
        backup: ``(total_added, envs, their rings)``: the rings of the envs an add writes twice (the second
            write overwrites a stack it compared), copied before it, put back by a restore to that
            ``total_added``; ``None``: none.
        arange: ``0 .. max(E, 64) - 1``, cached (one numpy call fewer per add), and ``arange_bytes``, its
            bytes (a vector step's ``env_id`` is recognised by one bytes compare).
        version: grows whenever the arrays above are replaced (the compiled insert holds them, and binds
            again when it changed).
    """

    def __init__(self) -> None:
        self.version = 0
        self.reset(0, 1, 1, (), np.uint8)

    def reset(self, num_envs: int, stack: int, n: int, frame_shape: tuple[int, ...], dtype: Any) -> None:
        """An empty table: ``num_envs`` envs, stacks of ``stack`` frames (``frame_shape``, ``dtype``), ``n``-step."""
        self.stack, self.n = stack, n
        self.pending = np.zeros((num_envs, n + 1, stack, *frame_shape), dtype=dtype)
        self.backup: tuple[int, np.ndarray, np.ndarray] | None = None
        self._install(EnvState.empty(num_envs, stack, n))

    def _install(self, state: EnvState) -> None:
        self.state, self.spare = state, state.spare()
        self.arange = np.arange(max(len(state.array), MIN_ARANGE))
        self.arange_bytes = self.arange.astype(np.int64).tobytes()
        self.version += 1

    def grow(self, num_envs: int) -> None:
        """Make room for envs ``0 .. num_envs - 1`` (at least doubling); new envs start empty."""
        have = len(self.state.array)
        if num_envs <= have:
            return
        size = max(num_envs, 2 * have)
        state = EnvState.empty(size, self.stack, self.n)
        state.array[:have] = self.state.array
        pending = np.zeros((size, *self.pending.shape[1:]), dtype=self.pending.dtype)
        pending[: len(self.pending)] = self.pending[:size]
        self.pending = pending
        self._install(state)

    def begin_write(self) -> EnvState:
        """The state an add may change in place: a copy of the committed one, in the spare, swapped in."""
        state, spare = self.state, self.spare
        np.copyto(spare.array, state.array)
        self.state, self.spare = spare, state
        return spare

    def back_up_pending(self, env: np.ndarray, total_added: int) -> None:
        """Copy the pending rings of the envs that occur twice or more in ``env`` (int64 [B]), for a redo.

        An env's ring of ``n + 1`` pending stacks takes one write per add without losing one that the add
        compared; a second write of the same add overwrites one. Should that add be cut short, :meth:`restore`
        to ``total_added`` puts these copies back, so the redo compares against the stacks stored before it.
        """
        twice = np.flatnonzero(np.bincount(env) > 1)
        twice = twice[twice < len(self.pending)]
        self.backup = (total_added, twice, self.pending[twice])  # (fancy index: a copy)

    def restore(self, state: EnvState, total_added: int) -> None:
        """Install a copy of ``state`` (taken before an add at ``total_added``) and the rings that add backed up."""
        if state.array.shape[1] != EnvState.width(self.stack, self.n):
            # taken before the first add allocated (a placeholder for a stack of 1): nothing was stored then
            self.reset(0, self.stack, self.n, self.pending.shape[3:], self.pending.dtype)
            return
        self.pending = self.pending[: len(state.array)]  # (envs first seen by the rolled-back add are dropped)
        backup = self.backup
        if backup is not None and backup[0] == total_added:  # pending stacks the rolled-back add overwrote
            self.pending[backup[1]] = backup[2]
        self._install(state.copy())


def each_once(env: np.ndarray) -> bool:
    """Whether no env occurs twice in ``env`` (int [B]); a sufficient test: the envs in increasing order."""
    return len(env) <= 1 or bool((env[1:] > env[:-1]).all())


def occurrence_groups(env: np.ndarray, num_envs: int) -> list[np.ndarray | None]:
    """Row sets in which each env occurs at most once, in time order (row ``k`` of an env is in group ``k``).

    ``[None]`` (all rows, one group) when no env occurs twice, the common vector step.
    """
    if len(env) <= 1:
        return [None]
    counts = np.bincount(env, minlength=num_envs)
    if counts.max() <= 1:
        return [None]
    occurrence = rank_within_group(env)
    return [np.flatnonzero(occurrence == k) for k in range(int(occurrence.max()) + 1)]

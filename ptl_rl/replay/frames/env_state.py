"""Per-env bookkeeping of a FrameStorage: one int64 array with named column views, and row grouping helpers."""

from __future__ import annotations

import numpy as np

from ptl_rl.core._grouping import rank_within_group


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
        """A state of the same shape (contents undefined): where the compiled insert writes the next state."""
        stack = self.last.shape[1]
        return EnvState(np.empty_like(self.array), stack, self.recent.shape[1])

    def columns(self) -> dict[str, np.ndarray]:
        """The state by column name (views)."""
        return {name: getattr(self, name) for name in self.__slots__[1:]}


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

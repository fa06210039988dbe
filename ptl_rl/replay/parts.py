"""The parts a replay buffer is composed of, checked once when it is built: its storage and its draw strategy."""

from __future__ import annotations

from typing import Any

from ptl_rl.core.protocols import Storage, missing_members
from ptl_rl.core.protocols.draws import DrawStrategy
from ptl_rl.replay.draws import UniformDraws


def checked_storage(storage: Any) -> Storage:
    """``storage`` if it has every member of the :class:`~ptl_rl.core.protocols.Storage` protocol; else a TypeError."""
    if not isinstance(storage, Storage):
        raise TypeError(
            f"the storage factory returned a {type(storage).__name__}, which lacks "
            f"{', '.join(missing_members(storage, Storage))} of the "
            "ptl_rl.core.protocols.Storage protocol; pass storage=lambda capacity: MyStorage(capacity) with a class "
            "that has them all (see the protocol's documentation)"
        )
    return storage


def checked_draws(draws: Any, replacement: bool) -> DrawStrategy:
    """``draws`` (a ``UniformDraws`` when ``None``) if it has every member of the DrawStrategy protocol; else a
    TypeError. ``replacement=False`` is short for ``UniformDraws(replacement=False)``, not an option of another."""
    if draws is None:
        return UniformDraws(replacement=replacement)
    if not replacement:
        raise ValueError(
            "replacement=False is short for draws=UniformDraws(replacement=False); with draws= pass that instead"
        )
    if not isinstance(draws, DrawStrategy):
        raise TypeError(
            f"draws must be a draw strategy; a {type(draws).__name__} lacks "
            f"{', '.join(missing_members(draws, DrawStrategy))} of the ptl_rl.core.protocols.DrawStrategy protocol "
            "(see its documentation), e.g. draws=ptl_rl.PrioritizedDraws(alpha=0.6, beta=0.4)"
        )
    return draws

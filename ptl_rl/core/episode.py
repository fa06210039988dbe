"""A finished episode, as a source records it and the episode callbacks log it."""

from __future__ import annotations

from typing import NamedTuple


class Episode(NamedTuple):
    """A finished episode: its undiscounted return, length, env and the env-step count at its end."""

    ret: float
    length: int
    env_id: int
    total_steps: int

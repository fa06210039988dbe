"""Format versions of saved states: a checkpoint written by another ptl_rl is read right, or refused clearly.

Every ``state_dict()`` of the package carries ``STATE_VERSION_KEY`` with the
format version of the object that wrote it (a class attribute
``STATE_VERSION``; bump it when the format changes and teach the loader the
older formats). ``load_state_dict`` reads any version up to its own: a state
without the key was written before versions existed and counts as version 0,
which every loader still reads; a newer version is refused with an error that
names the object and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATE_VERSION_KEY = "state_version"


def versioned(state: dict[str, Any], version: int) -> dict[str, Any]:
    """``state`` with its format ``version`` added (the dict itself, for ``return versioned({...}, 1)``)."""
    state[STATE_VERSION_KEY] = int(version)
    return state


def check_version(state: Mapping[str, Any], version: int, owner: str) -> int:
    """The format version of ``state`` (0 when it has none); raises if it is newer than ``version``."""
    found = int(state.get(STATE_VERSION_KEY, 0))
    if found > version:
        raise ValueError(
            f"this {owner} state has format version {found}, newer than the {version} this ptl_rl reads; "
            "upgrade ptl_rl to the version that wrote the checkpoint (or newer) to load it"
        )
    return found

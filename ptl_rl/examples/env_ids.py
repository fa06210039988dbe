"""Env ids on the examples' command line: is it registered, is it an Atari id (and is ale-py there), what is close.

A mistyped id gets the registered ids of a similar name; an Atari id (``ALE/*``,
or one naming an Atari game) without ale-py gets the install line of the
``atari`` extra. Only ``argparse`` and ``gymnasium`` are imported here.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re

import gymnasium as gym
from gymnasium.envs.registration import registry

#: how to get ALE's Atari envs, named wherever an Atari env id is refused for want of them
ATARI_INSTALL = (
    'pip install -c constraints.txt -e ".[atari]" (ale-py, which ships the ROMs, and opencv-python-headless)'
)

#: ALE's games (ale_py.roms.get_all_rom_ids() in lowercase, without underscores), so that an Atari id is told
#: apart from a typo without ale-py installed: ALE/Pong-v5, Pong-v4, PongNoFrameskip-v4, Breakout-ram-v4 ...
ATARI_GAMES = frozenset(
    """adventure airraid alien amidar assault asterix asteroids atlantis atlantis2 backgammon bankheist basicmath
    battlezone beamrider berzerk blackjack bowling boxing breakout carnival casino centipede choppercommand combat
    crazyclimber crossbow darkchambers defender demonattack donkeykong doubledunk earthworld elevatoraction enduro
    entombed et fishingderby flagcapture freeway frogger frostbite galaxian gopher gravitar hangman hauntedhouse hero
    humancannonball icehockey jamesbond journeyescape joust kaboom kangaroo keystonekapers kingkong klax koolaid krull
    kungfumaster lasergates lostluggage mariobros mazecraze miniaturegolf montezumarevenge mrdo mspacman namethisgame
    othello pacman phoenix pitfall pitfall2 pong pooyan privateeye qbert riverraid roadrunner robotank seaquest
    sirlancelot skiing solaris spaceinvaders spacewar stargunner superman surround tennis tetris tictactoe3d timepilot
    trondead turmoil tutankham upndown venture videocheckers videochess videocube videopinball warlords wizardofwor
    wordzapper yarsrevenge zaxxon""".split()
)


def check_registered(parser: argparse.ArgumentParser, env_id: str) -> None:
    """``parser.error`` unless ``env_id`` (optionally ``module:id``) is in gymnasium's registry.

    An Atari id (``ALE/*``, or an id naming one of ALE's games) registers ALE's envs first when ale-py is
    installed, and else names the ``atari`` extra that installs it.
    """
    module, _, name = env_id.rpartition(":")
    if module:  # "module:Env-v0": gymnasium imports the module, which registers the env
        try:
            importlib.import_module(module)
        except ImportError as error:
            parser.error(f"--env-id {env_id}: cannot import {module!r} to register it ({error}); install it")
    if name in registry:
        return
    game = atari_game(name)
    if game is not None:
        if not register_ale():
            known = game.replace("_", "").lower() in ATARI_GAMES
            what = f"{game} is an Atari game" if known else "ALE/* ids are Atari games"
            ids = f" (ALE/{game}-v5, {game}NoFrameskip-v4, ...)" if known else ""
            parser.error(
                f"--env-id {env_id}: {what}; gymnasium has ALE's Atari envs{ids} only with ale-py, which is not "
                f"installed here. Install the atari extra: {ATARI_INSTALL}"
            )
        if name in registry:
            return
    close = similar_env_ids(name)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    parser.error(
        f"--env-id {env_id}: no such gymnasium env{hint} (gymnasium.pprint_registry() lists the registered ids)"
    )


def _split_id(env_id: str) -> tuple[str, str]:
    """``"ALE/Pong-v5"`` -> ``("Pong", "v5")``: the name without its namespace, and the version (``""`` if none)."""
    name = env_id.rpartition("/")[2]
    found = re.fullmatch(r"(.*?)-(v\d+)", name)
    return (found[1], found[2]) if found else (name, "")


def atari_game(env_id: str) -> str | None:
    """The game of an Atari env id as written there (``Pong`` for ``ALE/Pong-v5``, ``PongNoFrameskip-v4``,
    ``pong-ram-v4``), or ``None`` when ``env_id`` is no Atari id.

    An ``ALE/*`` id is one; so is an id whose name, less ALE's ``-ram``, ``NoFrameskip`` and ``Deterministic``
    suffixes, is one of :data:`ATARI_GAMES` (case and underscores aside), unless gymnasium registers an env
    of that very name without ALE (``Blackjack-v1``: ``Blackjack-v2`` is a typo of it).
    """
    name = _split_id(env_id)[0]
    game = re.sub(r"(-ram)?(noframeskip|deterministic)?$", "", name, flags=re.IGNORECASE)
    if env_id.startswith("ALE/"):
        return game
    if game.replace("_", "").lower() not in ATARI_GAMES:
        return None
    own = name.lower()
    if any(_split_id(other)[0].lower() == own and not _is_ale(other) for other in registry):
        return None
    return game


def _is_ale(env_id: str) -> bool:
    entry = registry[env_id].entry_point
    return isinstance(entry, str) and entry.startswith("ale_py")


def register_ale() -> bool:
    """Register ALE's Atari ids (``ALE/Pong-v5``, ``PongNoFrameskip-v4``, ...) with gymnasium; ``False`` without ale-py.

    ale-py (the ``atari`` extra) registers them when imported.
    """
    try:
        import ale_py  # noqa: PLC0415 - only for an Atari id: importing it costs a fraction of a second
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def similar_env_ids(env_id: str, n: int = 3) -> list[str]:
    """Up to ``n`` registered ids whose names, versions aside, are close to ``env_id``'s, the closest first.

    Names are compared without namespace and version, so that ``CartPol-v1`` finds ``CartPole-v1`` and
    ``Pong-v5`` finds ``ALE/Pong-v5`` (among equally close names: the same version, then the same namespace,
    then the newest version first), while ids that share only the version suffix (``Ant-v5`` for ``Pong-v5``)
    are not offered.
    """
    name, version = _split_id(env_id)
    by_name: dict[str, list[str]] = {}
    for other in registry:
        by_name.setdefault(_split_id(other)[0].lower(), []).append(other)
    close = difflib.get_close_matches(name.lower(), list(by_name), n=n, cutoff=0.7)

    namespace = env_id.rpartition("/")[0]

    def rank(other: str) -> tuple[float, bool, bool, int]:
        other_name, other_version = _split_id(other)
        return (
            -difflib.SequenceMatcher(None, name.lower(), other_name.lower()).ratio(),
            other_version != version,
            other.rpartition("/")[0] != namespace,
            -int(other_version[1:] or 0),  # then the newest version
        )

    return sorted((other for key in close for other in by_name[key]), key=rank)[:n]


def is_mujoco(env_id: str) -> bool:
    """Whether gymnasium registers ``env_id`` as one of its MuJoCo envs (read from the entry point, no import)."""
    spec = registry.get(env_id.rpartition(":")[2])
    entry = getattr(spec, "entry_point", "") if spec is not None else ""
    return isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")

"""Command-line checks shared by the examples: reject an env the algorithm cannot run, before any training setup.

Each example's ``parse_args`` calls :func:`check_env` right after parsing,
so an unknown env id or an unsupported action space ends with argparse's
usage line and a one-line reason (exit status 2) instead of a traceback from
deep inside the run.
"""

from __future__ import annotations

import argparse
import difflib
import importlib

import gymnasium as gym
from gymnasium import spaces
from gymnasium.envs.registration import registry


def check_env(
    parser: argparse.ArgumentParser,
    env_id: str,
    action_spaces: tuple[type[spaces.Space], ...],
    algorithm: str,
    *,
    flat_box_actions: bool = True,
) -> gym.Env:
    """The env ``env_id`` (created once to read its spaces, then closed), or ``parser.error`` saying why not.

    Args:
        action_spaces: the ``gymnasium.spaces`` classes ``algorithm`` can act in.
        flat_box_actions: a ``Box`` action space must be 1-d (the Gaussian policy heads).

    Observations must be a ``Box`` (the examples' MLPs flatten them).
    """
    _check_registered(parser, env_id)
    try:
        env = gym.make(env_id)
    except Exception as error:  # noqa: BLE001 - any failure to build the env is a bad --env-id for the user
        parser.error(f"--env-id {env_id}: gymnasium could not create it: {type(error).__name__}: {error}")
    env.close()
    action_space, obs_space = env.action_space, env.observation_space
    if not isinstance(action_space, action_spaces):
        names = ", ".join(kind.__name__ for kind in action_spaces)
        parser.error(f"--env-id {env_id}: {algorithm} needs {names} actions, but {env_id} has {action_space}")
    if flat_box_actions and isinstance(action_space, spaces.Box) and len(action_space.shape) != 1:
        parser.error(f"--env-id {env_id}: {algorithm} needs a 1-d Box action space, got shape {action_space.shape}")
    if not isinstance(obs_space, spaces.Box):
        parser.error(
            f"--env-id {env_id}: the example's MLP needs Box (array) observations, but {env_id} has {obs_space}; "
            "wrap the env (e.g. one-hot encode Discrete observations) or pick another env"
        )
    return env


def _check_registered(parser: argparse.ArgumentParser, env_id: str) -> None:
    """``parser.error`` unless ``env_id`` (optionally ``module:id``) is in gymnasium's registry."""
    module, _, name = env_id.rpartition(":")
    if module:  # "module:Env-v0": gymnasium imports the module, which registers the env
        try:
            importlib.import_module(module)
        except ImportError as error:
            parser.error(f"--env-id {env_id}: cannot import {module!r} to register it ({error}); install it")
    if name in registry:
        return
    close = difflib.get_close_matches(name, list(registry), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    parser.error(
        f"--env-id {env_id}: no such gymnasium env{hint} (gymnasium.pprint_registry() lists the registered ids)"
    )

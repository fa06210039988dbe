"""The checks of an env before the source steps it: the gymnasium API, the old gym API, the autoreset mode.

Each check raises with the problem and the fix at construction, before the
first step, so a wrong env is named where it is passed in.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

NEXT_STEP, SAME_STEP, DISABLED = "NextStep", "SameStep", "Disabled"
AUTORESET_MODES = (NEXT_STEP, SAME_STEP, DISABLED)


def is_vector_env(env: object) -> bool:
    """Whether ``env`` has the vector API (``num_envs`` and ``single_observation_space``)."""
    return hasattr(env, "num_envs") and hasattr(env, "single_observation_space")


def check_env_api(env: object) -> None:
    """Raise ``TypeError`` unless ``env`` has gymnasium's API (``reset``, ``step`` and the two spaces)."""
    missing = [name for name in ("reset", "step", "observation_space", "action_space") if not hasattr(env, name)]
    if missing:
        raise TypeError(
            f"ExperienceSource needs a gymnasium.Env or gymnasium.vector.VectorEnv, got {type(env).__name__} "
            f"(missing {', '.join(missing)}). Create one with gymnasium.make(...) or gymnasium.make_vec(...)."
        )
    check_reset_api(env)  # a gym 0.21 env: refused now, not at the first next()


#: the fix for an env written for gym < 0.26, named wherever such an env is caught
OLD_GYM_FIX = "Port it to gymnasium, or wrap it with shimmy's GymV21CompatibilityV0."
# the TypeError of calling an old gym env's reset(seed=...), directly or through a wrapper (also as an
# AsyncVectorEnv re-raises it from its worker): other TypeErrors of a reset are the env's own and pass unchanged
SEED_KEYWORD_ERROR = re.compile(r"reset\(\) (got an unexpected keyword argument 'seed'|takes no keyword arguments)")


def _takes_seed(reset: Callable[..., object]) -> bool:
    """Whether ``reset`` accepts ``seed=`` (a ``seed`` parameter or ``**kwargs``); ``True`` when it cannot be told."""
    try:
        parameters = inspect.signature(reset).parameters.values()
    except (TypeError, ValueError):  # a builtin or an object inspect cannot read: left to the reset itself
        return True
    return any(p.name == "seed" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _old_gym_layer(env: object) -> object | None:
    """The first layer of ``env`` whose ``reset`` takes no ``seed`` keyword, else ``None``.

    Follows the wrappers (``.env``) down to the innermost env, and the sub-envs of a vector env that holds
    them (``.envs`` of a ``SyncVectorEnv``): a gymnasium wrapper around a gym 0.21 env takes ``seed`` itself
    and fails only when it hands it on.
    """
    layers: list[object] = [env]
    seen: set[int] = set()
    while layers and len(seen) < 256:
        layer = layers.pop()
        if layer is None or id(layer) in seen:
            continue
        seen.add(id(layer))
        reset = _attribute(layer, "reset")
        if callable(reset) and not _takes_seed(reset):
            return layer
        subs = _attribute(layer, "envs")
        if isinstance(subs, (list, tuple)):
            layers.extend(reversed(subs))
        layers.append(_attribute(layer, "env"))
    return None


def _attribute(obj: object, name: str) -> Any:
    """``obj.name``, or ``None`` when it is missing or reading it raises (a property of the user's env)."""
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - the check only looks; a broken attribute is the env's to report
        return None


def check_reset_api(env: object) -> None:
    """Raise ``TypeError`` naming the fix if ``env`` (or a layer or sub-env of it) has an old gym ``reset()``."""
    old = _old_gym_layer(env)
    if old is None:
        return
    where = "" if old is env else f" (inside {type(env).__name__})"
    raise TypeError(
        f"{type(old).__name__}.reset(){where} takes no seed keyword: this env uses the old gym API (gym < 0.26: "
        "reset() -> obs, step() -> (obs, reward, done, info)), not gymnasium's (reset(*, seed=None, options=None) "
        f"-> (obs, info)). {OLD_GYM_FIX}"
    )


def reset_type_error(exc: TypeError) -> TypeError | None:
    """The advice for a ``reset(seed=...)`` that raised ``exc``: an old gym env the construction check could not
    see (hidden in a wrapper of the user's, or in an AsyncVectorEnv's workers); ``None`` for any other error."""
    if not SEED_KEYWORD_ERROR.search(str(exc)):
        return None
    return TypeError(
        f"env.reset(seed=...) failed: {exc}. This env (or a sub-env, or an env inside a wrapper) uses the "
        "old gym API (gym < 0.26: reset() -> obs, step() -> (obs, reward, done, info)), whose reset() takes "
        f"no seed. {OLD_GYM_FIX}"
    )


def autoreset_mode_of(env: object, override: str | None) -> str:
    """The vector env's autoreset mode (``override`` if given), one of :data:`AUTORESET_MODES`."""
    mode = override if override is not None else getattr(env, "metadata", {}).get("autoreset_mode", NEXT_STEP)
    mode = getattr(mode, "value", mode)  # gymnasium.vector.AutoresetMode or its string value
    if mode not in AUTORESET_MODES:
        raise ValueError(f"unknown autoreset mode {mode!r}; expected one of {AUTORESET_MODES}")
    return str(mode)


def has_float64(space: object) -> bool:
    """Whether ``space`` (or a subspace of a ``Dict``) holds float64 observations."""
    spaces = getattr(space, "spaces", None)
    if isinstance(spaces, Mapping):
        return any(has_float64(s) for s in spaces.values())
    return getattr(space, "dtype", None) == np.float64

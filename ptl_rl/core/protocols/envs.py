"""What a source needs of an env: gymnasium's ``Env`` and ``VectorEnv``, and EnvPool through its adapter, have it."""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias, runtime_checkable


@runtime_checkable
class Env(Protocol):
    """A single environment: gymnasium's ``Env`` (``reset(seed=...) -> (obs, info)``, ``step(action) -> (obs,
    reward, terminated, truncated, info)``) with its two spaces. The source treats it as one sub-env.

    (The spaces and the observations are ``Any``: gymnasium's ``Env`` is generic in them, and a protocol
    member narrower than ``Any`` would refuse an env typed with its own.)
    """

    observation_space: Any
    action_space: Any

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]: ...

    # positional-only: gymnasium's VectorEnv names it `actions`, its Env `action`
    def step(self, action: Any, /) -> tuple[Any, Any, Any, Any, dict[str, Any]]: ...


@runtime_checkable
class VectorEnv(Env, Protocol):
    """``num_envs`` sub-envs stepped together: gymnasium's ``VectorEnv`` (sync, async) or an EnvPool pool behind
    :func:`~ptl_rl.envs.envpool.as_vector_env`. Observations, rewards and flags come with a leading ``num_envs``."""

    num_envs: int
    single_observation_space: Any
    single_action_space: Any


#: What :class:`~ptl_rl.ExperienceSource` accepts (an EnvPool pool is adapted on the way in).
EnvLike: TypeAlias = Env | VectorEnv

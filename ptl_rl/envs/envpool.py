"""EnvPool as a gymnasium-style vector env for :class:`~ptl_rl.stages.source.ExperienceSource`.

EnvPool (``pip install 'ptl_rl[envpool]'``) steps its sub-envs in C++ threads.
Its gymnasium API (``envpool.make(task_id, env_type="gymnasium", ...)``) is
close to a ``gymnasium.vector.VectorEnv`` in next-step autoreset mode, with
three differences this adapter settles (docs/design/scale-out.md, "EnvPool"):

* **Seeds** are fixed when the pool is made (env ``i`` gets ``seed + i``, or
  ``env_seed[i]``); EnvPool's ``reset(seed=...)`` ignores them with a warning.
  The adapter makes a new pool with ``env_seed=seeds`` when ExperienceSource
  resets with seeds, so the source's contract (sub-env ``i`` of rank ``r``
  starts from seed ``seed + r * N + i``) holds as for gymnasium envs.
* **Async mode** (``batch_size < num_envs``) returns only the envs that are
  ready, in completion order. ExperienceSource acts on every sub-env at every
  step, so that mode is refused (use ``AsyncSource`` or ``RayWorkers`` to
  overlap env steps with learning).
* **Only next-step autoreset.** EnvPool has no ``final_obs`` (same-step) and
  its ``reset_mask`` reset returns only the reset envs' observations, so
  ``autoreset_mode="SameStep"`` and ``"Disabled"`` are refused when the
  ExperienceSource is made (:func:`check_autoreset_mode`).

One semantic of EnvPool's own stays: at the time limit it reports
``terminated = done & ~truncated``, so an episode that terminates on the very
step its time limit ends is reported as truncated only (gymnasium's
``TimeLimit`` would report both). Bootstrapping from such a terminal state is
the only difference, and only for that one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from ptl_rl.core.protocols import EnvLike

if TYPE_CHECKING:
    from gymnasium import spaces

_INSTALL_HINT = "pip install 'ptl_rl[envpool]'"


def is_envpool(env: object) -> bool:
    """Whether ``env`` is an EnvPool pool (checked without importing envpool)."""
    return any(cls.__module__.startswith("envpool") for cls in type(env).__mro__)


class EnvPoolVectorEnv:
    """A synchronous EnvPool pool presented as a gymnasium vector env with next-step autoreset.

    Args:
        env: a pool made with ``envpool.make(task_id, env_type="gymnasium", ...)``
            in sync mode (``batch_size`` equal to ``num_envs``, the default), or
            a task id such as ``"CartPole-v1"``, then made with ``make_kwargs``.
        **make_kwargs: passed to ``envpool.make`` with a task id (``num_envs``,
            ``max_episode_steps``, ``num_threads``, ...); not allowed with a pool.

    ``step(actions)`` takes ``actions [N, *action_shape]`` (sub-env ``i`` gets
    row ``i``) and returns ``(obs [N, ...], reward float32 [N], terminated bool
    [N], truncated bool [N], info)`` with rows in sub-env order (checked against
    EnvPool's ``info["env_id"]``). ``reset(seed=[s_0, ..., s_{N-1}])`` makes a
    new pool whose sub-env ``i`` is seeded with ``s_i``; ``reset()`` resets the
    current pool.
    """

    metadata = {"autoreset_mode": "NextStep"}  # ptl_rl.stages.source.NEXT_STEP
    copy = True  # EnvPool hands out fresh arrays at every step: no copy needed (tested)

    def __init__(self, env: EnvLike | str, **make_kwargs: object) -> None:
        name = env if isinstance(env, str) else type(env).__name__
        # (Any: a pool's config, spec and close are EnvPool's own, outside the Env protocol)
        pool: Any = env
        if isinstance(env, str):
            try:
                import envpool
            except ImportError as exc:  # pragma: no cover - depends on the installation
                raise ImportError(f"EnvPoolVectorEnv needs envpool: {_INSTALL_HINT}") from exc
            pool = envpool.make(env, env_type="gymnasium", **make_kwargs)
        elif make_kwargs:
            raise TypeError(
                f"make_kwargs {sorted(make_kwargs)} only apply with a task id; this pool is already made. "
                "Pass them to envpool.make, or pass the task id instead of the pool."
            )
        _check_pool(pool)
        self.pool = pool
        self.num_envs = int(pool.config["num_envs"])
        self.single_observation_space = pool.observation_space
        self.single_action_space = pool.action_space
        self.observation_space = _batched(pool.observation_space, self.num_envs)
        self.action_space = _batched(pool.action_space, self.num_envs)
        self.spec = SimpleNamespace(id=name)  # what reprs and logs name the env by; EnvPool's spec is pool.spec
        self.closed = False
        self._untouched = True  # not reset or stepped since made: its seeds are still those it was made with
        self._order = np.arange(self.num_envs, dtype=np.int32)
        self._order.flags.writeable = False

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None) -> Any:
        """Reset every sub-env; with ``seed`` (one int per sub-env, or a base int) make a new pool seeded so."""
        if options:
            raise ValueError(
                f"EnvPoolVectorEnv does not take reset options {sorted(options)}: EnvPool's reset_mask reset returns "
                "only the reset envs' observations, so disabled autoreset cannot be served exactly. "
                "Leave autoreset_mode unset (EnvPool autoresets in next-step mode)."
            )
        if seed is not None:
            seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else [int(s) for s in seed]
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset(seed=...) needs {self.num_envs} seeds (one per sub-env), got {len(seeds)}")
            self._remake(seeds)
        obs, info = self.pool.reset()
        self._untouched = False
        self._check_order(info)
        return obs, info

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every sub-env; rows in sub-env order, reward as float32."""
        obs, reward, terminated, truncated, info = self.pool.step(actions)
        self._untouched = False
        self._check_order(info)
        return obs, np.asarray(reward, dtype=np.float32), terminated, truncated, info

    def close(self, **kwargs: object) -> None:
        """Close the pool (idempotent)."""
        if not self.closed:
            self.pool.close()
            self.closed = True

    def __repr__(self) -> str:
        return f"EnvPoolVectorEnv({self.spec.id} x{self.num_envs})"

    # ------------------------------------------------------------------ internals
    def _remake(self, seeds: list[int]) -> None:
        """Replace the pool by one with the same config whose sub-env ``i`` is seeded with ``seeds[i]``."""
        pool, spec = self.pool, self.pool.spec
        config = dict(pool.config)
        made_with = list(config.get("env_seed") or []) or [int(config["seed"]) + i for i in range(self.num_envs)]
        if self._untouched and made_with == seeds:
            return  # the first reset of a pool made with these seeds: making it again would change nothing
        config["env_seed"] = seeds
        new_spec = type(spec)(type(spec).gen_config(**config))
        self.pool = type(pool)(new_spec)
        pool.close()

    def _check_order(self, info: dict[str, Any]) -> None:
        env_id = info.get("env_id")
        if env_id is not None and not np.array_equal(env_id, self._order):
            raise RuntimeError(
                f"EnvPool returned its sub-envs in the order {np.asarray(env_id).tolist()}, "
                f"not 0..{self.num_envs - 1}; "
                "the rows would be attributed to the wrong sub-envs. Make the pool in sync mode "
                "(batch_size=num_envs) and step it only through this adapter."
            )


def _check_pool(env: object) -> None:
    config = getattr(env, "config", None)
    if not is_envpool(env) or not isinstance(config, dict) or not hasattr(env, "spec"):
        raise TypeError(
            f"EnvPoolVectorEnv needs a pool from envpool.make(..., env_type='gymnasium') or a task id, "
            f"got {type(env).__name__}"
        )
    if not hasattr(env, "single_observation_space"):
        raise TypeError(
            f"EnvPoolVectorEnv needs EnvPool's gymnasium API; {type(env).__name__} is not one. "
            "Make the pool with envpool.make(task_id, env_type='gymnasium', ...)."
        )
    num_envs, batch_size = int(config["num_envs"]), int(config["batch_size"])
    if batch_size != num_envs:
        raise ValueError(
            f"this EnvPool runs in async mode (batch_size={batch_size} < num_envs={num_envs}): each step returns "
            "only the envs that are ready, while ExperienceSource acts on every sub-env at every step. Make the "
            "pool with batch_size=num_envs (the default), and use AsyncSource or RayWorkers to overlap env "
            "steps with learning."
        )
    if int(config.get("max_num_players", 1)) != 1:
        raise ValueError(
            f"multi-player EnvPool tasks (max_num_players={config['max_num_players']}) are not supported: "
            "ExperienceSource yields one row per sub-env and step."
        )


def check_autoreset_mode(env: object, mode: str) -> None:
    """Refuse, before the first step, an autoreset mode other than next-step for an EnvPool env.

    ``mode`` is the mode ExperienceSource will serve (``"NextStep"``,
    ``"SameStep"`` or ``"Disabled"``). EnvPool autoresets in next-step mode
    only; without this check the mismatch surfaced only at the first episode
    end, possibly thousands of steps into a run.
    """
    if isinstance(env, EnvPoolVectorEnv) and mode != "NextStep":
        raise ValueError(
            f"the autoreset mode {mode!r} cannot be served by EnvPool ({env!r}): EnvPool always autoresets in "
            "next-step mode, it has no info['final_obs'] for same-step mode, and its reset_mask reset returns only "
            "the reset envs' observations, so disabled mode cannot be served either. Leave autoreset_mode unset "
            "(or pass autoreset_mode='NextStep'); the rows are the same, ExperienceSource drops the reset steps."
        )


def _batched(space: spaces.Space[Any], n: int) -> spaces.Space[Any]:
    from gymnasium.vector.utils import batch_space

    return batch_space(space, n)


def as_vector_env(env: EnvLike) -> EnvLike:
    """``env`` itself, or an :class:`EnvPoolVectorEnv` around it when it is an EnvPool pool."""
    return EnvPoolVectorEnv(env) if is_envpool(env) and not isinstance(env, EnvPoolVectorEnv) else env

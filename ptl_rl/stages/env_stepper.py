"""How the source talks to its env: resets, vector steps, and the answers as batched arrays, in every autoreset mode.

A single ``gymnasium.Env`` is one sub-env (its answers get a leading
dimension of 1); a vector env's answers are taken as they are, copied where
the env reuses its buffers, float64 observations cast to float32. The
autoreset modes differ only in where an ended episode's final observation
and its reset come from:

* next-step (gymnasium's default): the step after an episode end only resets
  that sub-env (the source drops its row);
* same-step: the final observation is in ``info["final_obs"]``
  (:meth:`EnvStepper.final_obs`);
* disabled, and a single env: the source resets finished sub-envs itself
  (:meth:`EnvStepper.reset_finished`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ptl_rl.core._trees import tree_map
from ptl_rl.core.clock import SETTINGS, StageClock, perf_counter_ns
from ptl_rl.core.protocols import EnvLike
from ptl_rl.envs.checks import (
    DISABLED,
    OLD_GYM_FIX,
    autoreset_mode_of,
    check_env_api,
    has_float64,
    is_vector_env,
    reset_type_error,
)
from ptl_rl.envs.envpool import as_vector_env, check_autoreset_mode
from ptl_rl.envs.failures import check_env_usable, finish_pending_async_call, note_failed_sub_env
from ptl_rl.stages.env_arrays import bool_array, copy_tree, float64_as_float32, set_rows


class EnvStepper:
    """Resets and steps ``env`` and hands back its answers as arrays with a leading sub-env dimension ``N``.

    Args:
        env: a gymnasium ``Env`` (one sub-env), a ``VectorEnv``, or an EnvPool pool (adapted).
        autoreset_mode: ``"NextStep"``, ``"SameStep"`` or ``"Disabled"``; read from the env when ``None``.
        cast_float64: return float64 observations as float32.
    """

    def __init__(self, env: EnvLike, autoreset_mode: str | None, cast_float64: bool) -> None:
        # (Any: a vector env's reset takes a list of seeds, and gymnasium's VectorEnv types it list[int | None],
        # which a protocol of both single and vector envs cannot state; the vector members follow is_vector)
        adapted: Any = as_vector_env(env)  # an EnvPool pool: seeded resets, async mode refused (envs/envpool.py)
        self.env = adapted
        check_env_api(adapted)
        self.is_vector = is_vector_env(adapted)
        self.num_envs = int(adapted.num_envs) if self.is_vector else 1
        self.action_space = adapted.single_action_space if self.is_vector else adapted.action_space
        space = adapted.single_observation_space if self.is_vector else adapted.observation_space
        self.cast_float64 = bool(cast_float64) and has_float64(space)
        self.autoreset_mode = autoreset_mode_of(adapted, autoreset_mode) if self.is_vector else DISABLED
        check_autoreset_mode(adapted, self.autoreset_mode)  # EnvPool: next-step only: refused now, not mid-run
        # a float64 cast makes a fresh array anyway
        self._copy_obs = self.is_vector and not getattr(adapted, "copy", True) and not self.cast_float64
        self.clock = StageClock("env step", "env steps")

    def reset(self, seeds: list[int] | None) -> Any:
        """Reset every sub-env (sub-env ``i`` with ``seeds[i]``); returns the observations ``[N, ...]``."""
        check_env_usable(self.env)
        try:
            if self.is_vector:
                finish_pending_async_call(self.env)
                result = self.env.reset(seed=seeds)
            else:
                result = self.env.reset(seed=None if seeds is None else seeds[0])
        except TypeError as exc:
            advice = reset_type_error(exc)
            if advice is None:
                raise
            raise advice from exc
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                "env.reset() must return (obs, info) as in gymnasium>=0.26; this env uses the old gym API. "
                f"{OLD_GYM_FIX}"
            )
        return self.own(result[0])

    def step(self, actions: np.ndarray, env_ids: np.ndarray) -> tuple[Any, Any, np.ndarray, np.ndarray, dict[str, Any]]:
        """One vector step: ``(obs, reward, terminated, truncated, info)``, each ``[N, ...]`` (flags bool).

        An exception from the env propagates with a note naming the sub-env and its ``env_id``.
        """
        try:
            if SETTINGS.profiling:
                start = perf_counter_ns()
                result = self.env.step(actions if self.is_vector else actions[0])
                self.clock.add(perf_counter_ns() - start, self.num_envs)
            else:
                result = self.env.step(actions if self.is_vector else actions[0])
        except Exception as exc:
            note_failed_sub_env(self.env, self.is_vector, env_ids, exc)
            raise
        if len(result) != 5:
            raise TypeError(
                f"env.step() returned {len(result)} values; gymnasium envs return "
                "(obs, reward, terminated, truncated, info). This env uses the old 4-tuple gym API: "
                "port it to gymnasium, or wrap it with shimmy's GymV21CompatibilityV0."
            )
        obs, reward, terminated, truncated, info = result
        obs = self.own(obs)
        if not self.is_vector:
            reward, terminated, truncated = np.array([reward]), np.array([terminated]), np.array([truncated])
        return obs, reward, bool_array(terminated), bool_array(truncated), info

    def own(self, obs: Any) -> Any:
        """An env's observation as the source keeps it: batched, float64 cast, copied if the env reuses its buffer."""
        if not self.is_vector:
            obs = tree_map(lambda x: np.array(x)[None], obs)
        elif self._copy_obs:
            obs = copy_tree(obs)
        if self.cast_float64:
            obs = float64_as_float32(obs)
        return obs

    def final_obs(self, obs: Any, done: np.ndarray, info: Mapping[str, Any]) -> Any:
        """Same-step mode: ``obs`` with the rows of the ended sub-envs replaced by their final observations."""
        if "final_obs" not in info:
            raise RuntimeError(
                "the vector env reported an episode end without info['final_obs']; it does not autoreset "
                "in same-step mode. Pass autoreset_mode='NextStep' or 'Disabled' to ExperienceSource."
            )
        ended = done.nonzero()[0]
        next_obs = copy_tree(obs)
        set_rows(next_obs, ended, list(info["final_obs"][ended]))
        return next_obs

    def reset_finished(self, done: np.ndarray) -> Any:
        """Reset the sub-envs that ended, where the env does not (a single env, disabled mode): the new
        observations ``[N, ...]``, or ``None`` where the env resets them itself (same-step)."""
        if not self.is_vector:
            return self.own(self.env.reset()[0])
        if self.autoreset_mode == DISABLED:
            obs, _ = self.env.reset(options={"reset_mask": done.copy()})
            return self.own(obs)
        return None

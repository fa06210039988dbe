"""The env protocols of ``ptl_rl.core.protocols`` hold for what the source takes: gymnasium's ``Env`` and vector
envs (sync and async) and EnvPool through its adapter, so ``ExperienceSource(env: EnvLike)`` names them truly."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest

from ptl_rl.core.protocols import Env, EnvLike, VectorEnv


@pytest.fixture
def cartpole() -> Iterator[gym.Env[np.ndarray, np.int64]]:
    env = gym.make("CartPole-v1")
    yield env
    env.close()


def test_a_gymnasium_env_is_an_env_and_not_a_vector_env(cartpole: gym.Env[np.ndarray, np.int64]) -> None:
    assert isinstance(cartpole, Env)
    assert not isinstance(cartpole, VectorEnv)  # no num_envs: the source treats it as one sub-env


def test_a_sync_vector_env_is_a_vector_env() -> None:
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    try:
        assert isinstance(env, VectorEnv) and isinstance(env, Env)
    finally:
        env.close()


def test_an_async_vector_env_is_a_vector_env() -> None:
    env = gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    try:
        assert isinstance(env, VectorEnv) and isinstance(env, Env)
    finally:
        env.close()


def test_the_envpool_adapter_is_a_vector_env() -> None:
    envpool = pytest.importorskip("envpool")
    from ptl_rl.envs.envpool import EnvPoolVectorEnv, as_vector_env  # noqa: PLC0415 - envpool is optional

    pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=2)
    adapter = EnvPoolVectorEnv(pool)
    try:
        assert isinstance(adapter, VectorEnv) and isinstance(adapter, Env)
        assert as_vector_env(adapter) is adapter
        assert isinstance(as_vector_env(pool), VectorEnv)  # a raw pool is adapted on the way in
    finally:
        adapter.close()


def test_an_object_without_the_api_is_not_an_env() -> None:
    class NotAnEnv:
        observation_space = action_space = None

        def reset(self) -> None: ...

    assert not isinstance(NotAnEnv(), Env)  # no step
    assert not isinstance(object(), VectorEnv)


def test_env_like_names_both_protocols() -> None:
    assert set(EnvLike.__args__) == {Env, VectorEnv}

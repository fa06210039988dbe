"""An env written for gym 0.21 (``reset() -> obs``, no ``seed``; ``step() -> 4-tuple``) is refused with the fix.

docs/pipeline.rst: "Bad input fails early with the problem and the fix: a non-gymnasium env,
the old 4-tuple step API, ...". Such an env used to reach ``ExperienceSource``'s
first reset and end in a bare ``TypeError: reset() got an unexpected keyword
argument 'seed'``. Where the old ``reset`` can be seen (the env itself, the
layers of its wrappers, the sub-envs of a ``SyncVectorEnv``) the source now
refuses it when it is built; where it cannot (a wrapper of the user's that hides
it, an ``AsyncVectorEnv``'s workers) the first reset re-raises the error with the
same advice, chained to the original. A ``TypeError`` of a reset's own is not
touched.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from ptl_rl import ExperienceSource

ADVICE = r"old gym API.*Port it to gymnasium, or wrap it with shimmy's GymV21CompatibilityV0"


class Gym021Env:
    """An env as written for gym 0.21: no base class needed then, ``reset()`` without ``seed``, a 4-tuple step."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)
    metadata: dict = {}

    def reset(self):
        self.t = 0
        return np.zeros(2, np.float32)

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 5, {}

    def close(self):
        pass


class HalfPortedEnv(gym.Env):
    """``import gym`` replaced by ``import gymnasium as gym``, the methods left as they were: what a user may try."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self):  # type: ignore[override]
        self.t = 0
        return np.zeros(2, np.float32)

    def step(self, action):  # type: ignore[override]
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 5, {}


class HidingWrapper:
    """A wrapper of the user's that keeps the inner env under another name and forwards ``**kwargs``."""

    def __init__(self, inner):
        self._inner = inner
        self.observation_space, self.action_space = inner.observation_space, inner.action_space

    def reset(self, **kwargs):
        return self._inner.reset(**kwargs)

    def step(self, action):
        return self._inner.step(action)


def act(obs):
    return np.zeros(len(obs), dtype=np.int64)


def registered_old_env() -> gym.Env:
    gym.register("HalfPorted-v0", entry_point=HalfPortedEnv, max_episode_steps=100)
    try:
        return gym.make("HalfPorted-v0")  # PassiveEnvChecker, OrderEnforcing and TimeLimit around it
    finally:
        gym.registry.pop("HalfPorted-v0")


@pytest.mark.parametrize(
    "make",
    [
        Gym021Env,
        HalfPortedEnv,
        lambda: gym.wrappers.TimeLimit(HalfPortedEnv(), 100),
        registered_old_env,
        lambda: gym.vector.SyncVectorEnv([HalfPortedEnv, HalfPortedEnv]),
    ],
    ids=["gym021", "gymnasium-subclass", "in-TimeLimit", "gym.make", "SyncVectorEnv"],
)
def test_an_old_gym_env_is_refused_at_construction_with_the_fix(make):
    env = make()
    with pytest.raises(TypeError, match=r"reset\(\).* takes no seed keyword: this env uses the " + ADVICE):
        ExperienceSource(env, act, seed=0)


def test_the_message_names_the_old_layer_and_what_holds_it():
    with pytest.raises(TypeError, match=r"^HalfPortedEnv\.reset\(\) \(inside TimeLimit\) takes no seed keyword"):
        ExperienceSource(gym.wrappers.TimeLimit(HalfPortedEnv(), 100), act)


@pytest.mark.parametrize("seed", [0, None])
def test_an_old_env_hidden_from_the_check_gets_the_advice_at_the_first_reset(seed):
    source = ExperienceSource(HidingWrapper(Gym021Env()), act, seed=seed)  # **kwargs: nothing to see at construction
    with pytest.raises(TypeError, match=r"env\.reset\(seed=\.\.\.\) failed: .*uses the " + ADVICE) as caught:
        next(source)
    cause = caught.value.__cause__
    assert isinstance(cause, TypeError) and "unexpected keyword argument 'seed'" in str(cause)


@pytest.mark.filterwarnings("ignore:.*(Traceback|Worker-\\d|Raising the last exception):UserWarning")
def test_an_async_vector_env_of_old_envs_gets_the_advice_at_the_first_reset():
    env = gym.vector.AsyncVectorEnv([HalfPortedEnv, HalfPortedEnv], context="fork")
    try:
        source = ExperienceSource(env, act, seed=0)  # the sub-envs live in the workers: the reset tells
        with pytest.raises(TypeError, match=ADVICE):
            next(source)
    finally:
        env.close(terminate=True)


class OwnTypeErrorEnv(gym.Env):
    """A gymnasium env whose reset has a bug of its own that raises TypeError."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        raise TypeError("reset() got an int where a str was expected")  # a bug of the env's, not its API


def test_a_reset_that_raises_a_typeerror_of_its_own_is_not_blamed_on_the_gym_api():
    source = ExperienceSource(OwnTypeErrorEnv(), act, seed=0)
    with pytest.raises(TypeError) as caught:
        next(source)
    assert str(caught.value) == "reset() got an int where a str was expected" and caught.value.__cause__ is None


def test_a_gymnasium_env_and_kwargs_resets_still_run():
    source = ExperienceSource(gym.wrappers.TimeLimit(gym.make("CartPole-v1"), 50), act, seed=0)
    assert next(source).obs.shape == (1, 4)

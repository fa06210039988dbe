"""ExperienceSource over EnvPool: brute force against the pool's own raw trajectory and gymnasium's physics.

Two independent references: (1) a second pool made with the seeds the source
promises (``seed + rank * N + i``) is stepped with the very same action batches
and its raw output is cut into transitions by a per-env loop (a step right
after an episode end only resets); (2) gymnasium's own CartPole, put into each
row's ``obs`` state and stepped with the row's action, must give ``next_obs``
and ``terminated``, and the time limit must truncate exactly at step
``max_episode_steps``.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

from ptl_rl import ExperienceSource
from ptl_rl.envs.envpool import EnvPoolVectorEnv, as_vector_env, is_envpool

envpool = pytest.importorskip("envpool")
# EnvPool's CartPole declares float64 bounds for a float32 Box; gymnasium warns each time a pool is made
pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered:UserWarning")

N, MAX_STEPS = 6, 14  # short time limit: truncations and terminations both occur often under random actions


def make_pool(num_envs=N, **kwargs):
    kwargs.setdefault("max_episode_steps", MAX_STEPS)
    return envpool.make("CartPole-v1", env_type="gymnasium", num_envs=num_envs, **kwargs)


class RecordingAgent:
    """Random actions from its own RNG; keeps every action batch it returned (also those of reset steps)."""

    def __init__(self, num_envs: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.num_envs = num_envs
        self.actions: list[np.ndarray] = []

    def __call__(self, obs):
        assert obs.shape == (self.num_envs, 4) and obs.dtype == np.float32
        actions = self.rng.integers(0, 2, self.num_envs)
        self.actions.append(actions)
        return actions


def raw_transitions(pool, actions):
    """Step ``pool`` with ``actions`` and cut its raw output into each env's transitions, by brute force."""
    obs, _ = pool.reset()
    prev_obs, prev_done = list(obs), [False] * pool.num_envs
    per_env = [[] for _ in range(pool.num_envs)]
    for a in actions:
        obs, reward, term, trunc, _ = pool.step(a)
        for i in range(pool.num_envs):
            if not prev_done[i]:  # after an episode end the step only resets the env: no transition
                per_env[i].append((prev_obs[i], a[i], reward[i], obs[i], term[i], trunc[i]))
            prev_obs[i], prev_done[i] = obs[i], bool(term[i] or trunc[i])
    return per_env


def rows_by_env(batches, env_ids):
    fields = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
    per_env = {int(e): [] for e in env_ids}
    for b in batches:
        for r in range(len(b)):
            per_env[int(b["env_id"][r])].append(tuple(b[f][r] for f in fields))
    return [per_env[int(e)] for e in env_ids]


@pytest.mark.parametrize("wrap", ["raw_pool", "adapter", "task_id"])
def test_source_matches_pool_raw_trajectory(wrap):
    seed, rank, steps = 11, 2, 120
    if wrap == "task_id":
        env = EnvPoolVectorEnv("CartPole-v1", num_envs=N, max_episode_steps=MAX_STEPS)
    else:
        env = make_pool() if wrap == "raw_pool" else EnvPoolVectorEnv(make_pool())
    agent = RecordingAgent(N)
    source = ExperienceSource(env, agent, gamma=0.9, seed=seed, rank=rank)
    with warnings.catch_warnings():
        # EnvPool warns when its reset(seed=...) ignores the seeds: the adapter must never let that happen
        warnings.filterwarnings("error", message=".*seeds are fixed")
        batches = [next(source) for _ in range(steps)]
    assert isinstance(source.env, EnvPoolVectorEnv)

    expected = raw_transitions(make_pool(seed=seed + rank * N), agent.actions)
    got = rows_by_env(batches, source.env_ids)
    assert sum(map(len, got)) == source.total_steps
    n_term = n_trunc = 0
    for i in range(N):
        assert len(got[i]) == len(expected[i]) > 0
        for row, ref in zip(got[i], expected[i], strict=True):
            for value, ref_value in zip(row, ref, strict=True):
                np.testing.assert_array_equal(value, ref_value)
        n_term += sum(bool(r[4]) for r in got[i])
        n_trunc += sum(bool(r[5]) for r in got[i])
    assert n_term > 5 and n_trunc > 5, "both kinds of episode end were exercised"
    for b in batches:
        assert b["reward"].dtype == np.float32 and b["obs"].dtype == np.float32
        np.testing.assert_array_equal(b["discount"], np.float32(0.9))
        assert len(np.unique(b["env_id"])) == len(b)

    # the recorded episodes: one per episode end, with its length and return (1 per step in CartPole)
    episodes = source.pop_episodes()
    assert len(episodes) == n_term + n_trunc
    assert all(e.ret == e.length and 1 <= e.length <= MAX_STEPS for e in episodes)


def test_rows_obey_gymnasium_cartpole_physics_and_time_limit():
    source = ExperienceSource(make_pool(), RecordingAgent(N, seed=3), seed=5)
    reference = gym.make("CartPole-v1").unwrapped
    reference.reset(seed=0)
    length = {}
    for _ in range(150):
        batch = next(source)
        for r in range(len(batch)):
            env_id, obs = int(batch["env_id"][r]), batch["obs"][r]
            length[env_id] = length.get(env_id, 0) + 1
            if length[env_id] == 1:  # an episode's first observation: CartPole's reset range
                assert np.all(np.abs(obs) <= 0.05)
            reference.state, reference.steps_beyond_terminated = obs.astype(np.float64), None
            ref_next, _, ref_term, _, _ = reference.step(int(batch["action"][r]))
            np.testing.assert_allclose(batch["next_obs"][r], ref_next, atol=1e-5)
            at_limit = length[env_id] == MAX_STEPS
            assert bool(batch["truncated"][r]) == at_limit
            # EnvPool reports terminated = done & ~truncated (module docstring)
            assert bool(batch["terminated"][r]) == (ref_term and not at_limit)
            if batch["terminated"][r] or batch["truncated"][r]:
                length[env_id] = 0


def test_restart_reseeds_with_fresh_distinct_seeds():
    """After an interrupted step every sub-env starts over from the source's next seeds, as for gymnasium envs."""
    agent = RecordingAgent(N)
    source = ExperienceSource(make_pool(), agent, seed=1)
    for _ in range(5):
        next(source)
    source._guard.open = True  # what an interrupted next() leaves behind (the guard's record of the step)
    first = next(source)
    seeds = [1 + 1_000_003 + i for i in range(N)]
    expected, _ = make_pool(seed=0, env_seed=seeds).reset()
    np.testing.assert_array_equal(first["obs"], expected)


def test_unseeded_source_keeps_the_pools_own_seeds():
    source = ExperienceSource(make_pool(seed=42), RecordingAgent(N))
    batch = next(source)
    np.testing.assert_array_equal(batch["obs"], make_pool(seed=42).reset()[0])


def test_refuses_async_mode():
    pool = make_pool(num_envs=8, batch_size=4)
    with pytest.raises(ValueError, match="async mode.*batch_size=num_envs"):
        ExperienceSource(pool, RecordingAgent(8))


@pytest.mark.parametrize("wrap", ["raw_pool", "adapter"])
@pytest.mark.parametrize("mode", ["SameStep", "Disabled", gym.vector.AutoresetMode.SAME_STEP])
def test_refuses_same_step_and_disabled_autoreset_when_the_source_is_made(mode, wrap):
    env = make_pool() if wrap == "raw_pool" else EnvPoolVectorEnv(make_pool())
    agent = RecordingAgent(N)
    with pytest.raises(ValueError, match=r"cannot be served by EnvPool.*autoreset_mode='NextStep'") as info:
        ExperienceSource(env, agent, autoreset_mode=mode, seed=0)
    assert agent.actions == [], "the env was stepped before the mode was refused"
    assert "autoreset_mode='Disabled'" not in str(info.value), "suggests a mode EnvPool refuses too"
    # the modes that work are accepted
    for ok in (None, "NextStep"):
        ExperienceSource(env, agent, autoreset_mode=ok, seed=0)


def test_refuses_dm_pools_kwargs_with_a_pool_and_non_pools():
    with pytest.raises(TypeError, match="gymnasium"):
        EnvPoolVectorEnv(envpool.make("CartPole-v1", env_type="dm", num_envs=2))
    with pytest.raises(TypeError, match="only apply with a task id"):
        EnvPoolVectorEnv(make_pool(), num_envs=3)
    with pytest.raises(TypeError, match="envpool.make"):
        EnvPoolVectorEnv(gym.make_vec("CartPole-v1", num_envs=2))
    gym_env = gym.make_vec("CartPole-v1", num_envs=2)
    assert not is_envpool(gym_env) and as_vector_env(gym_env) is gym_env


def test_spaces_and_repr():
    env = EnvPoolVectorEnv("CartPole-v1", num_envs=N)
    assert repr(env) == "EnvPoolVectorEnv(CartPole-v1 x6)"
    assert env.num_envs == N and env.single_observation_space.shape == (4,)
    assert env.observation_space.shape == (N, 4) and env.action_space.shape == (N,)
    assert "x6" in repr(env) and "x6" in repr(ExperienceSource(env, RecordingAgent(N)))
    env.close()
    env.close()

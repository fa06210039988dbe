"""ExperienceSource against a scripted env's own record: every autoreset mode, single env, async, bad input."""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import torch
from scripted_env import (
    BOTH,
    MODES,
    TERM,
    TRUNC,
    ScriptedAgent,
    ScriptedEnv,
    concat_batches,
    env_attr,
    ids_of,
    make_env,
    obs_code,
    raw_transitions,
    recorded_episodes,
    scripted_batches,
)

from ptl_rl import ExperienceSource, TransitionBatch

# Three envs: short episodes (length 1), terminations, truncations and both at once, an env with
# an empty script, ends that coincide across envs and ends that do not.
LAYOUTS = [
    [(1, TERM), (3, TRUNC), (1, TRUNC), (4, TERM), (2, TERM)],
    [(2, TRUNC), (2, BOTH), (5, TRUNC)],
    [],
]
SINGLE_LAYOUT = [[(1, TERM), (3, TRUNC), (1, TRUNC), (4, TERM), (2, TRUNC)]]


def run_and_check(env, mode, layouts, *, dict_obs=False, box_action=False, rank=1, seed=7, gamma=0.9, extra=3):
    """Run a source over the script and check it against the env's record; returns (source, yielded rows)."""
    num_envs = len(layouts)
    agent = ScriptedAgent(num_envs, box_action=box_action, seed=seed)
    source = ExperienceSource(env, agent, gamma=gamma, seed=seed, rank=rank)
    batches, rows_so_far, episodes = [], 0, []
    for batch in scripted_batches(source, layouts, extra_steps=extra):
        assert isinstance(batch, TransitionBatch) and 0 < len(batch) <= num_envs
        assert len(np.unique(batch["env_id"])) == len(batch), "one row per env and step"
        rows_so_far += len(batch)
        assert source.total_steps == rows_so_far
        assert agent.env_steps[-1] == source.total_steps
        # the episodes that ended in this batch, each reported once, stamped with the step count
        new = source.pop_episodes()
        done_envs = batch["env_id"][batch["terminated"] | batch["truncated"]]
        assert sorted(e.env_id for e in new) == sorted(done_envs.tolist())
        assert all(e.total_steps == source.total_steps for e in new)
        episodes += new
        # kept as yielded, no copy: a later step must not overwrite what an earlier batch holds
        batches.append(batch)
        _check_dtypes(batch, dict_obs, box_action)
    got = concat_batches(batches)
    records = env_attr(env, "record")
    raw = raw_transitions(records)

    # env ids and seeds: env_id = rank * N + i, sub-env i first reset with seed + rank * N + i
    got_index = ids_of(got["obs"])[:, 0]
    np.testing.assert_array_equal(got["env_id"], got_index + rank * num_envs)
    first_seeds = [seeds[0] for seeds in env_attr(env, "reset_seeds")]
    assert first_seeds == [seed + rank * num_envs + i for i in range(num_envs)]
    assert all(s is None for seeds in env_attr(env, "reset_seeds") for s in seeds[1:])

    # every yielded transition is one raw transition of its env, and each raw one is yielded once
    got_code = obs_code(ids_of(got["obs"]))
    assert len(np.unique(got_code)) == len(got_code), "a transition was yielded twice"
    order, raw_order = np.argsort(got_code), np.argsort(raw["code"])
    np.testing.assert_array_equal(got_code[order], raw["code"][raw_order])
    np.testing.assert_array_equal(ids_of(got["next_obs"])[order], raw["next_obs"][raw_order])
    np.testing.assert_array_equal(got["action"][order], raw["action"][raw_order])
    np.testing.assert_array_equal(got["reward"][order], raw["reward"][raw_order])
    np.testing.assert_array_equal(got["terminated"][order], raw["terminated"][raw_order])
    np.testing.assert_array_equal(got["truncated"][order], raw["truncated"][raw_order])
    np.testing.assert_array_equal(got["discount"], np.float32(gamma))
    # structural: a transition never spans a reset (same episode, next step); final obs at ends
    obs_id, next_id = ids_of(got["obs"]), ids_of(got["next_obs"])
    np.testing.assert_array_equal(next_id[:, :2], obs_id[:, :2])
    np.testing.assert_array_equal(next_id[:, 2], obs_id[:, 2] + 1)
    if dict_obs:
        np.testing.assert_array_equal(got["obs"]["pos"], np.stack([obs_id[:, 1] * 0.5, obs_id[:, 2] * 0.25], 1))
        np.testing.assert_array_equal(got["next_obs"]["pos"], np.stack([next_id[:, 1] * 0.5, next_id[:, 2] * 0.25], 1))

    # agent extras stayed with their rows
    np.testing.assert_array_equal(got["log_prob"], -got_code.astype(np.float64))
    np.testing.assert_array_equal(got["hidden"], obs_id[:, 1:].astype(np.float32))

    # the whole script ran, and episode statistics match the record
    expected = recorded_episodes(records)
    assert source.pop_episodes() == []
    assert len(episodes) == len(expected) == sum(len(layout) for layout in layouts)
    for i in range(num_envs):
        mine = [e for e in episodes if e.env_id == i + rank * num_envs]
        theirs = [e for e in expected if e[0] == i]
        assert [e.length for e in mine] == [e[1] for e in theirs] == [length for length, _ in layouts[i]]
        np.testing.assert_allclose([e.ret for e in mine], [e[2] for e in theirs], rtol=1e-6, atol=1e-6)
    assert source.episodes_finished == len(expected)
    stats = source.episode_stats()
    assert stats["episodes"] == len(expected) and stats["env_steps"] == len(got["env_id"])
    if expected:
        assert stats["length_mean"] == pytest.approx(np.mean([e[1] for e in expected]))
    assert agent.reset_calls >= 1
    return source, got


def _check_dtypes(batch, dict_obs, box_action):
    assert batch["reward"].dtype == np.float32
    assert batch["discount"].dtype == np.float32
    assert batch["terminated"].dtype == bool and batch["truncated"].dtype == bool
    assert batch["env_id"].dtype == np.int64
    assert batch["action"].shape == ((len(batch), 2) if box_action else (len(batch),))
    if dict_obs:
        assert set(batch["obs"]) == {"id", "pos"} and set(batch["next_obs"]) == {"id", "pos"}
        assert batch["obs"]["pos"].dtype == np.float32


@pytest.mark.parametrize("variant", ["plain", "dict_obs", "box_action_no_copy"])
@pytest.mark.parametrize("mode", MODES)
def test_source_matches_raw_record(mode, variant):
    dict_obs, box_action = variant == "dict_obs", variant == "box_action_no_copy"
    copy = variant != "box_action_no_copy"
    layouts = SINGLE_LAYOUT if mode == "single" else LAYOUTS
    env = make_env(layouts, mode, dict_obs=dict_obs, box_action=box_action, copy=copy, reward_seed=3)
    rank = 1 if mode == "single" else 2
    source, got = run_and_check(env, mode, layouts, dict_obs=dict_obs, box_action=box_action, rank=rank)
    expected_mode = "Disabled" if mode == "single" else mode
    assert source.autoreset_mode == expected_mode


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_source_random_layouts(mode):
    rng = np.random.default_rng(11)
    for _ in range(4):
        layouts = [[(int(rng.integers(1, 4)), (TERM, TRUNC)[rng.integers(2)]) for _ in range(5)] for _ in range(4)]
        run_and_check(make_env(layouts, mode, reward_seed=int(rng.integers(100))), mode, layouts, rank=0, seed=0)


@pytest.mark.parametrize("mode", MODES[:3])
def test_source_every_env_ends_every_step(mode):
    # under next-step autoreset every other vector step only resets: it yields nothing
    layouts = [[(1, TERM), (1, TRUNC), (1, TERM)], [(1, TRUNC), (1, TERM), (1, TRUNC)]]
    run_and_check(make_env(layouts, mode, reward_seed=8), mode, layouts, rank=0, extra=0)


# ---------------------------------------------------------------------- chunks (steps_per_batch)
def _steps_of(source: ExperienceSource, batches: int) -> tuple[list[TransitionBatch], list[tuple]]:
    """``batches`` batches of ``source`` (each kept as yielded) and the episodes finished meanwhile."""
    out = [next(source) for _ in range(batches)]
    return out, [(e.env_id, e.ret, e.length, e.total_steps) for e in source.pop_episodes()]


@pytest.mark.parametrize("dict_obs", [False, True])
@pytest.mark.parametrize("chunk", [2, 3, 7])
@pytest.mark.parametrize("mode", MODES)
def test_a_chunk_is_k_consecutive_steps_of_the_one_step_stream(mode, chunk, dict_obs):
    """steps_per_batch=K yields, batch for batch, the rows of K consecutive one-step batches (themselves checked
    against the env's record above), with the same episodes, step counts and agent hooks."""
    layouts = SINGLE_LAYOUT if mode == "single" else LAYOUTS

    def source(k: int) -> tuple[ExperienceSource, ScriptedAgent]:
        env = make_env(layouts, mode, dict_obs=dict_obs, reward_seed=3)
        agent = ScriptedAgent(len(layouts), seed=5)  # its checks: reset_state and on_env_steps at every step
        return ExperienceSource(env, agent, seed=5, rank=1, steps_per_batch=k), agent

    (one, one_agent), (chunked, chunked_agent) = source(1), source(chunk)
    assert one.one_row_per_env and not chunked.one_row_per_env
    reference, reference_episodes = _steps_of(one, 4 * chunk)
    got, episodes = _steps_of(chunked, 4)
    for i, batch in enumerate(got):
        expected = concat_batches(reference[i * chunk : (i + 1) * chunk])
        assert set(batch.keys()) == set(expected)
        for name in expected:
            leaves = expected[name].items() if isinstance(expected[name], dict) else [(None, expected[name])]
            for path, leaf in leaves:
                ours = batch[name] if path is None else batch[name][path]
                np.testing.assert_array_equal(ours, leaf, err_msg=f"batch {i}, {name}")
                assert ours.dtype == leaf.dtype
    assert episodes == reference_episodes and chunked.total_steps == one.total_steps
    assert chunked_agent.env_steps == one_agent.env_steps and chunked.stream_seq == 1 + 4  # the first reset skips one
    # each yielded batch is the caller's to keep: later chunks write fresh arrays
    kept = got[0]["reward"].copy()
    next(chunked)
    np.testing.assert_array_equal(got[0]["reward"], kept)


def test_bad_steps_per_batch_is_refused():
    env = make_env(LAYOUTS, "NextStep")
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="steps_per_batch must be an integer >= 1"):
            ExperienceSource(env, ScriptedAgent(3), steps_per_batch=bad)


@pytest.mark.parametrize(("mode", "dict_obs"), [("SameStep", True), ("Disabled", False)])
def test_source_async_vector_env(mode, dict_obs):
    layouts = LAYOUTS[:2]
    env = make_env(layouts, mode, dict_obs=dict_obs, asynchronous=True, reward_seed=5)
    try:
        run_and_check(env, mode, layouts, dict_obs=dict_obs, rank=3, seed=100)
    finally:
        env.close()


def test_scripted_env_is_picklable():
    import pickle

    env = ScriptedEnv(1, [(2, TERM)], dict_obs=True)
    env.reset(seed=3)
    env.step(0)
    clone = pickle.loads(pickle.dumps(env))
    assert clone.record[0][0].tolist() == [1, 0, 0]
    assert clone.step(1)[2] is True


def test_unseeded_source_leaves_seeds_to_env():
    env = make_env([[(2, TERM)], [(1, TRUNC)]], "NextStep")
    source = ExperienceSource(env, ScriptedAgent(2), seed=None)
    next(source)
    assert env_attr(env, "reset_seeds") == [[None], [None]]


def test_agent_may_return_torch_tensors_and_plain_actions():
    env = make_env([[(2, TERM)], [(1, TRUNC)]], "SameStep")
    calls = []

    def agent(obs):
        calls.append(obs.shape)
        return torch.tensor([1, 2]), {"value": torch.tensor([[0.5], [1.5]])}

    batch = next(ExperienceSource(env, agent))
    assert calls == [(2, 3)]
    np.testing.assert_array_equal(batch["action"], [1, 2])
    assert isinstance(batch["value"], np.ndarray) and batch["value"].shape == (2, 1)
    batch = next(ExperienceSource(make_env([[(1, TERM)]], "single"), lambda obs: np.zeros(1, dtype=np.int64)))
    assert batch.extras == {} and len(batch) == 1


def test_load_state_dict_restarts_episodes_with_fresh_distinct_seeds():
    layouts = [[(3, TERM), (2, TRUNC)], [(4, TRUNC)]]
    env = make_env(layouts, "NextStep")
    agent = ScriptedAgent(2)
    source = ExperienceSource(env, agent, seed=1)
    for _ in range(6):
        next(source)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    restored = ExperienceSource(env, agent, seed=1)
    restored.load_state_dict(state)
    assert restored.total_steps == source.total_steps and restored.episodes_finished == source.episodes_finished
    batch = next(restored)
    assert (ids_of(batch["obs"])[:, 2] == 0).all(), "after a restore every sub-env starts a new episode"
    seeds = env_attr(env, "reset_seeds")
    assert seeds[0][-1] != seeds[0][0] and seeds[0][-1] != seeds[1][-1]


# ---------------------------------------------------------------------- bad input
class _OldStepEnv(ScriptedEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


class _OldResetEnv(ScriptedEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=options)[0]


@pytest.mark.parametrize("not_an_env", [3, object(), "CartPole-v1"])
def test_rejects_non_env(not_an_env):
    with pytest.raises(TypeError, match=r"needs a gymnasium\.Env or gymnasium\.vector\.VectorEnv"):
        ExperienceSource(not_an_env, lambda obs: obs)


def test_rejects_non_callable_agent_and_bad_gamma():
    env = ScriptedEnv(0, [])
    with pytest.raises(TypeError, match="agent must be callable"):
        ExperienceSource(env, 3)
    for gamma in (0.0, -0.5, 1.01, float("nan")):
        with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\]"):
            ExperienceSource(env, lambda obs: obs, gamma=gamma)


@pytest.mark.parametrize(
    ("mode", "box_action", "actions"),
    [
        ("NextStep", False, np.zeros(2, dtype=np.int64)),  # 3 envs, 2 actions
        ("NextStep", False, np.zeros((3, 1), dtype=np.int64)),  # extra action dim
        ("SameStep", True, np.zeros((3, 3), dtype=np.float32)),  # Box(2,) actions of shape 3
        ("Disabled", True, np.zeros(2, dtype=np.float32)),  # one action for 3 envs
        ("single", False, np.int64(1)),  # single env: a scalar instead of [1]
        ("single", True, np.zeros(2, dtype=np.float32)),  # single env: no leading env dim
    ],
)
def test_rejects_wrong_action_count_or_shape(mode, box_action, actions):
    layouts = [[(2, TERM)]] if mode == "single" else [[(2, TERM)]] * 3
    source = ExperienceSource(make_env(layouts, mode, box_action=box_action), lambda obs: actions)
    with pytest.raises(ValueError, match=r"agent returned actions of shape .*expected"):
        next(source)


def test_rejects_bad_extras():
    env = make_env([[(2, TERM)]] * 2, "NextStep")
    source = ExperienceSource(env, lambda obs: (np.zeros(2, np.int64), {"log_prob": np.zeros(3)}))
    with pytest.raises(ValueError, match="agent extra 'log_prob' has shape"):
        next(source)
    source = ExperienceSource(env, lambda obs: (np.zeros(2, np.int64), {"reward": np.zeros(2)}))
    with pytest.raises(ValueError, match="collides with a core field"):
        next(source)


@pytest.mark.parametrize("vector", [False, True])
def test_rejects_old_gym_step_api(vector):
    env = _OldStepEnv(0, [(2, TERM)])
    if vector:
        # a hand-rolled vector env that passes the 4-tuple through
        env = _PassThroughVector(env)
    source = ExperienceSource(env, lambda obs: np.zeros(1, dtype=np.int64))
    with pytest.raises(TypeError, match=r"returned 4 values.*old 4-tuple gym API"):
        next(source)


def test_rejects_old_gym_reset_api():
    source = ExperienceSource(_OldResetEnv(0, [(2, TERM)]), lambda obs: np.zeros(1, dtype=np.int64))
    with pytest.raises(TypeError, match=r"must return \(obs, info\)"):
        next(source)


def test_rejects_unknown_autoreset_mode():
    with pytest.raises(ValueError, match="unknown autoreset mode"):
        ExperienceSource(make_env([[(2, TERM)]], "NextStep"), lambda obs: obs, autoreset_mode="Sometimes")


class _PassThroughVector(gym.vector.VectorEnv):
    """A one-env VectorEnv that forwards step results unchanged (for the old-API check)."""

    def __init__(self, env):
        self.env = env
        self.num_envs = 1
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.observation_space = gym.vector.utils.batch_space(env.observation_space, 1)
        self.action_space = gym.vector.utils.batch_space(env.action_space, 1)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.DISABLED}

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=None if seed is None else seed[0])
        return obs[None], info

    def step(self, actions):
        obs, reward, done, info = self.env.step(actions[0])
        return obs[None], np.array([reward]), np.array([done]), info

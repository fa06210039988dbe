"""NStepTransform against a brute-force reference computed from a scripted env's own record."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nstep_reference import reference_nstep
from scripted_env import (
    BOTH,
    MODES,
    TERM,
    TRUNC,
    ScriptedAgent,
    concat_batches,
    env_attr,
    ids_of,
    make_env,
    obs_code,
    scripted_batches,
)

from ptl_rl import ExperienceSource, NStepTransform, TransitionBatch


def assert_matches_reference(outputs, reference, *, dict_obs=False):
    """``outputs``: the n-step batches emitted; compared with the reference as a multiset."""
    outputs = [b for b in outputs if b is not None]
    if reference is None:
        assert sum(len(b) for b in outputs) == 0
        return
    assert outputs, "nothing emitted"
    for b in outputs:
        assert b["reward"].dtype == np.float32 and b["discount"].dtype == np.float32
        assert b["terminated"].dtype == bool and b["truncated"].dtype == bool
        assert b["env_id"].dtype == np.int64
    got = concat_batches(outputs)
    obs_id, next_id = ids_of(got["obs"]), ids_of(got["next_obs"])
    code = obs_code(obs_id)
    order = np.argsort(code, kind="stable")
    assert len(np.unique(code)) == len(code), "a window was emitted twice"
    np.testing.assert_array_equal(code[order], reference["code"], err_msg="windows missing or extra")
    np.testing.assert_array_equal(got["env_id"][order], reference["env_id"])
    np.testing.assert_array_equal(got["action"][order], reference["action"])
    np.testing.assert_allclose(got["reward"][order], reference["reward"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["discount"][order], reference["discount"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(obs_code(next_id)[order], reference["next_code"])
    np.testing.assert_array_equal(got["terminated"][order], reference["terminated"])
    np.testing.assert_array_equal(got["truncated"][order], reference["truncated"])
    # extras come from the window's first step
    np.testing.assert_array_equal(got["log_prob"], -code.astype(np.float64))
    np.testing.assert_array_equal(got["hidden"], obs_id[:, 1:].astype(np.float32))
    if dict_obs:
        np.testing.assert_array_equal(got["obs"]["pos"], np.stack([obs_id[:, 1] * 0.5, obs_id[:, 2] * 0.25], 1))
        np.testing.assert_array_equal(got["next_obs"]["pos"], np.stack([next_id[:, 1] * 0.5, next_id[:, 2] * 0.25], 1))


def record_trajectory(layouts, mode, *, extra=0, dict_obs=False, seed=0, rank=0, first_episode=0):
    """Run a source over the script; returns (the 1-step batches as copies, the envs' records, source)."""
    env = make_env(layouts, mode, dict_obs=dict_obs, reward_seed=seed, first_episode=first_episode)
    source = ExperienceSource(env, ScriptedAgent(len(layouts), seed=seed), seed=seed, rank=rank)
    batches = [TransitionBatch(concat_batches([b])) for b in scripted_batches(source, layouts, extra)]
    return batches, env_attr(env, "record"), source


def interleave(trajectory, rng):
    """Shuffle the rows of a trajectory across envs while keeping each env's rows in time order."""
    env = trajectory["env_id"]
    slots = rng.permutation(len(env))
    order = np.empty(len(env), dtype=np.int64)
    for e in np.unique(env):
        rows = np.flatnonzero(env == e)
        order[np.sort(slots[rows])] = rows
    return TransitionBatch(trajectory).rows(order)


# ---------------------------------------------------------------------- hand-checked example
def test_hand_computed_example():
    # one env, rewards 1, 2, 4, 8, the episode terminates at the 4th step; n=3, gamma=0.5
    batch = TransitionBatch(
        obs=np.arange(4.0)[:, None],
        action=np.arange(4),
        reward=np.array([1, 2, 4, 8], dtype=np.float32),
        next_obs=np.arange(1.0, 5.0)[:, None],
        terminated=np.array([False, False, False, True]),
        truncated=np.zeros(4, dtype=bool),
        discount=np.full(4, 0.5, dtype=np.float32),
        env_id=np.zeros(4, dtype=np.int64),
    )
    nstep = NStepTransform(None, n=3, gamma=0.5)
    outs = [nstep.fold(batch.rows(slice(t, t + 1))) for t in range(4)]
    assert outs[0] is None and outs[1] is None
    out = TransitionBatch(concat_batches([o for o in outs if o is not None]))
    order = np.argsort(out["obs"][:, 0])
    np.testing.assert_array_equal(out["obs"][order, 0], [0, 1, 2, 3])
    np.testing.assert_allclose(out["reward"][order], [1 + 1 + 1, 2 + 2 + 2, 4 + 4, 8])
    np.testing.assert_allclose(out["discount"][order], [0.125, 0.125, 0.25, 0.5])
    np.testing.assert_array_equal(out["next_obs"][order, 0], [3, 4, 4, 4])
    np.testing.assert_array_equal(out["terminated"][order], [False, True, True, True])
    assert not out["truncated"].any()
    assert nstep.flush() is None
    # the same steps folded as one recorded batch (several rows of one env: the in-order path)
    whole = NStepTransform(None, n=3, gamma=0.5).fold(batch)
    assert_same_rows(whole, out)


def assert_same_rows(a, b):
    """Two n-step batches hold the same rows (any order); rows told apart by obs/code."""
    key_a, key_b = _key(a), _key(b)
    oa, ob = np.argsort(key_a), np.argsort(key_b)
    assert set(a.keys()) == set(b.keys())
    for name in a.keys():
        fa, fb = a[name], b[name]
        if isinstance(fa, dict):
            for k in fa:
                np.testing.assert_array_equal(np.asarray(fa[k])[oa], np.asarray(fb[k])[ob], err_msg=f"{name}.{k}")
        else:
            np.testing.assert_array_equal(np.asarray(fa)[oa], np.asarray(fb)[ob], err_msg=name)


def _key(batch):
    obs = batch["obs"]
    if isinstance(obs, dict):
        return obs_code(obs["id"])
    obs = np.asarray(obs)
    return obs_code(obs) if obs.ndim == 2 and obs.shape[1] == 3 else obs[:, 0]


# ---------------------------------------------------------------------- property test
episode_st = st.tuples(st.integers(1, 7), st.sampled_from([TERM, TRUNC, BOTH]))


@st.composite
def scenarios(draw):
    mode = draw(st.sampled_from(MODES))
    num_envs = 1 if mode == "single" else draw(st.integers(1, 4))
    layouts = draw(st.lists(st.lists(episode_st, max_size=4), min_size=num_envs, max_size=num_envs))
    return {
        "mode": mode,
        "layouts": layouts,
        "n": draw(st.integers(1, 5)),
        "gamma": draw(st.sampled_from([1.0, 0.5]) | st.floats(0.05, 1.0)),
        "extra": draw(st.integers(0, 6)),
        "feed": draw(st.sampled_from(["stream", "chunks"])),
        "dict_obs": draw(st.booleans()),
        "rank": draw(st.integers(0, 2)),
        "seed": draw(st.integers(0, 2**16)),
        "steps_per_batch": draw(st.sampled_from([1, 1, 2, 3, 5])),  # the source's chunks of K vector steps
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_nstep_matches_brute_force(s):
    n, gamma, layouts = s["n"], s["gamma"], s["layouts"]
    env = make_env(layouts, s["mode"], dict_obs=s["dict_obs"], reward_seed=s["seed"])
    agent = ScriptedAgent(len(layouts), seed=s["seed"])
    source = ExperienceSource(env, agent, seed=s["seed"], rank=s["rank"], steps_per_batch=s["steps_per_batch"])
    upstream = scripted_batches(source, layouts, s["extra"])
    if s["feed"] == "stream":
        # the pipeline path: iterate the stage until the upstream ends, then flush
        nstep = NStepTransform(upstream, n, gamma)
        outputs = list(nstep)
    else:
        # the recorded path: the whole trajectory, rows of different envs shuffled (each env in
        # time order), folded in random chunks, so one env's consecutive steps share a batch
        rng = np.random.default_rng(s["seed"])
        recorded = [concat_batches([b]) for b in upstream]
        nstep = NStepTransform(None, n, gamma)
        outputs = []
        if recorded:  # an empty script and no extra steps record nothing
            trajectory = interleave(concat_batches(recorded), rng)
            cuts = np.sort(rng.integers(0, len(trajectory) + 1, size=rng.integers(0, 4)))
            bounds = [0, *cuts.tolist(), len(trajectory)]
            outputs = [nstep.fold(trajectory.rows(slice(a, b))) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    outputs.append(nstep.flush())
    assert nstep.flush() is None, "flush() must empty the windows"
    reference = reference_nstep(env_attr(env, "record"), n, gamma, s["rank"] * len(layouts))
    assert_matches_reference(outputs, reference, dict_obs=s["dict_obs"])


def test_nstep_on_async_vector_env():
    n = 3
    layouts = [[(1, TERM), (4, TRUNC), (2, TERM)], [(3, TERM), (1, TRUNC)]]
    env = make_env(layouts, "NextStep", asynchronous=True, reward_seed=9)
    try:
        source = ExperienceSource(env, ScriptedAgent(2, seed=9), seed=9)
        nstep = NStepTransform(scripted_batches(source, layouts, 2), n, 0.9)
        outputs = [*nstep, nstep.flush()]
        assert_matches_reference(outputs, reference_nstep(env_attr(env, "record"), n, 0.9))
    finally:
        env.close()


# ---------------------------------------------------------------------- fold and flush
def test_fold_recorded_trajectory_in_one_batch():
    layouts = [[(5, TERM), (1, TRUNC), (6, TRUNC)], [(2, TERM), (7, TERM)], [(1, TERM)] * 3]
    batches, records, _ = record_trajectory(layouts, "SameStep", extra=4, seed=4)
    trajectory = TransitionBatch(concat_batches(batches))
    assert len(np.unique(trajectory["env_id"])) < len(trajectory)  # exercises the in-order path
    nstep = NStepTransform(None, n=4, gamma=0.8)
    out = nstep.fold(trajectory)
    flushed = nstep.flush()
    assert flushed is not None and flushed["truncated"].all() and not flushed["terminated"].any()
    assert_matches_reference([out, flushed], reference_nstep(records, 4, 0.8))


def test_fold_grows_window_storage_mid_episode():
    # env 2's steps arrive before env 3 is ever seen: the window storage grows with env 2 in flight
    layouts = [[(3, TERM), (4, TRUNC)], [(2, TRUNC), (1, TERM), (3, TERM)]]
    batches, records, _ = record_trajectory(layouts, "Disabled", extra=2, dict_obs=True, seed=6, rank=1)
    trajectory = TransitionBatch(concat_batches(batches))
    env_id = trajectory["env_id"]
    first_of_2, rest_of_2 = np.flatnonzero(env_id == 2)[:5], np.flatnonzero(env_id == 2)[5:]
    nstep = NStepTransform(None, n=3, gamma=0.95)
    outputs = [nstep.fold(trajectory.rows(rows)) for rows in (first_of_2, np.flatnonzero(env_id == 3), rest_of_2)]
    outputs.append(nstep.flush())
    assert_matches_reference(outputs, reference_nstep(records, 3, 0.95, env_id_offset=2), dict_obs=True)


def test_flush_emits_in_flight_windows_as_truncated():
    # one env stopped 3 steps into an episode, n = 5: the three windows are still in flight
    batches, records, _ = record_trajectory([[(2, TERM)]], "single", extra=3, seed=2)
    nstep = NStepTransform(None, n=5, gamma=0.5)
    emitted = [nstep.fold(b) for b in batches]
    flushed = nstep.flush()
    assert len(flushed) == 3 and flushed["truncated"].all() and not flushed["terminated"].any()
    np.testing.assert_array_equal(ids_of(flushed["next_obs"]), [[0, 1, 3]] * 3)
    np.testing.assert_allclose(np.sort(flushed["discount"]), [0.125, 0.25, 0.5])
    assert nstep.flush() is None
    assert_matches_reference([*emitted, flushed], reference_nstep(records, 5, 0.5))
    assert NStepTransform(None, 2, 0.9).flush() is None


def test_fold_empty_batch_and_no_upstream():
    nstep = NStepTransform(None, 2, 0.9)
    empty = TransitionBatch(
        obs=np.zeros((0, 3)),
        action=np.zeros(0),
        reward=np.zeros(0, np.float32),
        next_obs=np.zeros((0, 3)),
        terminated=np.zeros(0, bool),
        truncated=np.zeros(0, bool),
        discount=np.zeros(0, np.float32),
        env_id=np.zeros(0, np.int64),
    )
    assert nstep.fold(empty) is None
    with pytest.raises(TypeError, match="no upstream"):
        next(nstep)


# ---------------------------------------------------------------------- state
def _save_load(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("dict_obs", [False, True])
@pytest.mark.parametrize("restore_into", ["iterator", "fold"])
def test_state_dict_round_trip_flushes_windows_as_truncated(dict_obs, restore_into):
    n, gamma = 4, 0.7
    layouts = [[(6, TERM), (3, TRUNC)], [(2, TRUNC), (9, TERM)], [(5, TERM)]]
    # a run stopped mid-episodes: save the n-step state, then compare with what it would have flushed
    batches, _, _ = record_trajectory(layouts, "NextStep", extra=2, dict_obs=dict_obs, seed=1, rank=1)
    original = NStepTransform(iter(batches[:9]), n, gamma)
    emitted_before = list(original)
    state = _save_load(original.state_dict())
    expected_flush = original.flush()
    assert expected_flush is not None and len(expected_flush) > 0

    # the restored run: fresh episodes (numbered from 100, so their rows cannot pass for old ones)
    new_batches, new_records, _ = record_trajectory(
        layouts, "NextStep", extra=3, dict_obs=dict_obs, seed=2, rank=1, first_episode=100
    )
    restored = NStepTransform(iter(new_batches) if restore_into == "iterator" else None, n, gamma)
    restored.load_state_dict(state)
    if restore_into == "iterator":
        outputs = [*restored, restored.flush()]
    else:
        outputs = [restored.fold(b) for b in new_batches] + [restored.flush()]
    outputs = [o for o in outputs if o is not None]
    # the restored windows come out at once, in the first batch, exactly as the original would have flushed them
    old = [o.rows(ids_of(o["obs"])[:, 1] < 100) for o in outputs]
    assert len(old[0]) == len(expected_flush) and all(len(o) == 0 for o in old[1:])
    assert_same_rows(old[0], expected_flush)
    outputs = [o.rows(ids_of(o["obs"])[:, 1] >= 100) for o in outputs]
    # nothing after the restore mixes old windows with new episodes
    assert_matches_reference(outputs, reference_nstep(new_records, n, gamma, env_id_offset=3), dict_obs=dict_obs)
    assert emitted_before  # the first run did emit before the checkpoint


def test_state_dict_of_unused_transform():
    state = _save_load(NStepTransform(None, 3, 0.9).state_dict())
    nstep = NStepTransform(None, 3, 0.9)
    nstep.load_state_dict(state)
    assert nstep.flush() is None
    batches, records, _ = record_trajectory([[(2, TERM), (4, TRUNC)]], "single", seed=3)
    outputs = [nstep.fold(b) for b in batches]
    assert_matches_reference([*outputs, nstep.flush()], reference_nstep(records, 3, 0.9))


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("n", [0, -1, 2.5, "3", None])
def test_rejects_bad_n(n):
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        NStepTransform(None, n, 0.9)


@pytest.mark.parametrize("gamma", [0.0, -0.1, 1.0001, 2.0, float("nan")])
def test_rejects_bad_gamma(gamma):
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\]"):
        NStepTransform(None, 3, gamma)


def test_restored_windows_grow_for_a_source_with_more_envs() -> None:
    import gymnasium as gym

    import ptl_rl

    def pipeline(num_envs: int) -> ptl_rl.NStepTransform:
        env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
        agent = lambda obs: np.zeros(len(obs), dtype=np.int64)  # noqa: E731
        return ptl_rl.NStepTransform(ptl_rl.ExperienceSource(env, agent, seed=0), n=3, gamma=0.9)

    small = pipeline(2)
    for _ in range(4):
        next(small)
    large = pipeline(5)
    next(large)  # sized for its own 5 envs before the restore
    large.load_state_dict(small.state_dict())
    out = next(large)  # the 2 restored windows are flushed; envs 2..4 need new window rows
    assert set(out["env_id"].tolist()) <= set(range(5))
    for _ in range(5):
        assert set(next(large)["env_id"].tolist()) <= set(range(5))

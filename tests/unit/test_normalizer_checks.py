"""Normalization statistics refuse what would corrupt them (issue #33, defects 2 and 3).

* A row with a NaN or an inf is refused with a ``FloatingPointError`` that names the row, on every
  path that folds rows or merged moments into the statistics (``update``, the stages, rows from a
  remote collector, ``RunningStatistics``, a DDP sync, a restore); the statistics stay bit for bit
  as they were.
* Observations whose shape is not the statistics' are refused with a ``ValueError`` naming both
  shapes, on every apply path and at ``load_state_dict``, instead of numpy's broadcasting error or a
  silent broadcast of one dimension's moments over all of them.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ptl_rl
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.normalization.module import NormalizationModule
from ptl_rl.normalization.running_stats import Moments, RunningStatistics
from ptl_rl.stages.normalize import sync_statistics

# NaN and inf in the rows make numpy warn while the moments are computed; the refusal is what is tested
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|overflow) encountered:RuntimeWarning")

BAD = [float("nan"), float("inf"), float("-inf")]


def snapshot(stats: RunningStatistics) -> tuple:
    """Every part of the statistics as bytes: equal snapshots are bitwise-equal statistics."""

    def part(m: Moments | None) -> Any:
        return None if m is None else (m.count, np.asarray(m.mean).tobytes(), np.asarray(m.m2).tobytes())

    return part(stats.synced), part(stats.local), part(stats.moments)


def learned(rows: np.ndarray, **kw: Any) -> ptl_rl.ObservationNormalizer:
    norm = ptl_rl.ObservationNormalizer(**kw)
    norm.update(rows)
    return norm


# ---------------------------------------------------------------------------- a remote collector's rows
class Rows:
    """A per-step stream of given batches: what a remote collector's rows look like to the learner's stage."""

    one_row_per_env = True

    def __init__(self, batches: list[TransitionBatch]) -> None:
        self.batches = iter(batches)
        self.stream_seq = 0

    def __iter__(self) -> Rows:
        return self

    def __next__(self) -> TransitionBatch:
        self.stream_seq += 1
        return next(self.batches)


def rows_batch(obs: np.ndarray, reward: np.ndarray | None = None, done: bool = False) -> TransitionBatch:
    n = len(obs)
    return TransitionBatch(
        {
            "obs": obs,
            "next_obs": obs + 1.0,
            "reward": np.ones(n, np.float32) if reward is None else np.asarray(reward, np.float32),
            "env_id": np.arange(n, dtype=np.int64),
            "terminated": np.full(n, done),
            "truncated": np.zeros(n, bool),
        }
    )


# ---------------------------------------------------------------------------- an env with a bad value
class BadValueEnv(gym.Env):
    """Box float32 observations of 3 dims; ``value`` in the obs (dim 1) or the reward at step ``at``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, at: int = -1, field: str = "obs", value: float = float("nan")) -> None:
        self.at, self.field, self.value, self.t = at, field, value, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        obs, reward = np.array([self.t, -2.0 * self.t, 0.5], np.float32), 0.25 * self.t
        if self.t == self.at:
            obs[1] = self.value if self.field == "obs" else obs[1]
            reward = self.value if self.field == "reward" else reward
        return obs, reward, False, False, {}


def unchecked_source(
    field: str, value: float, at: int = 3, norm: ptl_rl.ObservationNormalizer | None = None
) -> ptl_rl.ExperienceSource:
    """Two envs, env 1 bad at its step ``at``; the source's own check is off, so the value reaches the stages.

    ``norm``: the normalizer the source shows its agent (for a NormalizeObservations after it).
    """
    fns = [functools.partial(BadValueEnv, at=at if i == 1 else -1, field=field, value=value) for i in range(2)]
    env = gym.vector.SyncVectorEnv(fns)
    return ptl_rl.ExperienceSource(
        env, lambda obs: np.zeros(len(obs), np.int64), seed=0, check_finite=False, observation_transform=norm
    )


# ============================================================================ defect 2: non-finite rows
@pytest.mark.parametrize("value", BAD)
def test_update_refuses_non_finite_rows_names_them_and_keeps_the_statistics_bitwise(value):
    rng = np.random.default_rng(0)
    norm = learned(rng.normal(2.0, 3.0, size=(10, 3)))
    before, moments = snapshot(norm.statistics), norm.statistics.moments
    mean, var = norm.mean.copy(), norm.var.copy()
    rows = rng.normal(size=(5, 3))
    rows[1, 2] = value
    rows[3, 0] = value
    with pytest.raises(
        FloatingPointError, match=r"non-finite observations \(NaN or inf\) in row\(s\) \[1, 3\] of 5"
    ) as e:
        norm.update(rows)
    assert "np.nan_to_num" in str(e.value) and "fix the env" in str(e.value)  # the fix
    assert snapshot(norm.statistics) == before and norm.statistics.moments is moments
    assert norm.count == 10 and norm.mean.tobytes() == mean.tobytes() and norm.var.tobytes() == var.tobytes()
    # the statistics still work: the finite rows alone go in, and normalized outputs are finite
    norm.update(np.delete(rows, [1, 3], axis=0))
    assert norm.count == 13 and np.isfinite(norm(rows[[0]])).all()


@pytest.mark.parametrize("value", BAD)
def test_a_first_update_with_a_non_finite_row_leaves_the_normalizer_empty(value):
    norm = ptl_rl.ObservationNormalizer()
    with pytest.raises(FloatingPointError, match=r"row\(s\) \[0\] of 1"):
        norm.update(np.array([[value, 1.0]]))
    assert norm.statistics.moments is None and norm.count == 0 and norm.mean is None


def test_running_statistics_add_and_with_rows_refuse_non_finite_rows():
    stats = RunningStatistics()
    stats.add(np.arange(6.0).reshape(3, 2))
    before = snapshot(stats)
    bad = np.array([[1.0, 2.0], [3.0, np.inf], [np.nan, 0.0]])
    with pytest.raises(FloatingPointError, match=r"row\(s\) \[1, 2\] of 3; refused: the statistics are unchanged"):
        stats.with_rows(bad)
    with pytest.raises(FloatingPointError, match=r"row\(s\) \[1, 2\] of 3"):
        stats.add(bad)
    assert snapshot(stats) == before
    # scalar rows (the shape ScaleRewards keeps)
    scalars = RunningStatistics()
    scalars.add(np.array([1.0, 2.0]))
    with pytest.raises(FloatingPointError, match=r"row\(s\) \[0\] of 2"):
        scalars.add(np.array([np.nan, 2.0]))
    assert scalars.moments.count == 2 and scalars.moments.is_finite()


def test_moments_that_overflow_float64_are_refused_too():
    stats = RunningStatistics()
    stats.add(np.zeros((2, 1)))
    before = snapshot(stats)
    with pytest.raises(FloatingPointError, match="are finite, but their moments overflow float64"):
        stats.add(np.array([[1e200], [-1e200]]))  # m2 overflows
    assert snapshot(stats) == before


@pytest.mark.parametrize("value", BAD)
def test_the_stage_refuses_non_finite_observations_that_pass_an_unchecked_source(value):
    norm = ptl_rl.ObservationNormalizer()
    stage = ptl_rl.NormalizeObservations(unchecked_source("obs", value, at=3, norm=norm), norm)
    for _ in range(3):  # step 3's next_obs holds the bad value: it is no row the statistics take in
        next(stage)
    before, count = snapshot(stage.normalizer.statistics), stage.normalizer.count
    with pytest.raises(FloatingPointError, match=r"non-finite observations .* row\(s\) \[1\] of 2"):
        next(stage)  # step 4 starts from it
    assert snapshot(stage.normalizer.statistics) == before and stage.normalizer.count == count == 6
    for _ in range(3):  # the stage carries on with the rows that follow
        batch = next(stage)
        assert np.isfinite(batch.obs).all()
    assert np.isfinite(stage.normalizer.mean).all() and stage.normalizer.count == 12


@pytest.mark.parametrize("value", BAD)
def test_scale_rewards_refuses_a_non_finite_reward_with_statistics_and_returns_unchanged(value):
    source = unchecked_source("reward", value, at=3)
    stage = ptl_rl.ScaleRewards(source, gamma=0.9)
    for _ in range(2):
        next(stage)
    before = snapshot(stage.statistics)
    ids, returns, var = stage._env_ids.copy(), stage._returns.copy(), stage.var
    assert returns.any()  # returns in flight, that a refused batch must not touch
    with pytest.raises(
        FloatingPointError, match=r"non-finite reward \(NaN or inf\) in row\(s\) \[1\] \(env_id \[1\]\)"
    ) as e:
        next(stage)
    assert "check_finite=True" in str(e.value)
    assert snapshot(stage.statistics) == before and stage.var == var
    assert stage._env_ids.tobytes() == ids.tobytes() and stage._returns.tobytes() == returns.tobytes()
    batch = next(stage)  # carries on (as after a cut: the returns restart)
    assert np.isfinite(batch.reward).all() and np.isfinite(stage.var)
    assert stage.statistics.moments.count == 6


def test_scale_rewards_refuses_returns_whose_moments_overflow():
    huge = rows_batch(np.zeros((2, 1)))
    huge["reward"] = np.array([1e200, -1e200])  # float64 rewards from a stage of one's own
    stage = ptl_rl.ScaleRewards(Rows([rows_batch(np.zeros((2, 1)), [1.0, 2.0]), huge]), gamma=1.0)
    next(stage)
    before, returns = snapshot(stage.statistics), stage._returns.copy()
    with pytest.raises(FloatingPointError, match="ScaleRewards' return statistics and the returns in flight are"):
        next(stage)  # finite rewards, but the squared spread of the returns overflows float64
    assert snapshot(stage.statistics) == before and stage._returns.tobytes() == returns.tobytes()


def test_a_frozen_scale_rewards_refuses_it_too_and_keeps_its_returns():
    stage = ptl_rl.ScaleRewards(Rows([rows_batch(np.zeros((2, 1)), [1.0, 2.0]),
                                      rows_batch(np.zeros((2, 1)), [np.inf, 1.0])]))  # fmt: skip
    next(stage)
    stage.frozen = True
    before, returns = snapshot(stage.statistics), stage._returns.copy()
    with pytest.raises(FloatingPointError, match=r"row\(s\) \[0\] \(env_id \[0\]\)"):
        next(stage)
    assert snapshot(stage.statistics) == before and stage._returns.tobytes() == returns.tobytes()


def test_rows_of_a_remote_collector_are_refused_before_the_statistics_and_the_module_change():
    # NormalizeObservations(remote, norm, apply_in="model", output="raw"): the learner's path for rows from
    # AsyncSource / RayWorkers, whose collectors may run with check_finite=False
    norm = ptl_rl.ObservationNormalizer(clip=None, shape=(3,))
    module = norm.module()
    good = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    bad = good.copy()
    bad[1, 0] = np.nan
    stage = ptl_rl.NormalizeObservations(Rows([rows_batch(good), rows_batch(bad), rows_batch(good + 1)]), norm,
                                         apply_in="model", output="raw")  # fmt: skip
    next(stage)
    before = snapshot(norm.statistics)
    shift, scale = module.shift.clone(), module.scale.clone()
    with pytest.raises(FloatingPointError, match=r"row\(s\) \[1\] of 2"):
        next(stage)
    assert snapshot(norm.statistics) == before
    assert torch.equal(module.shift, shift) and torch.equal(module.scale, scale)  # what the next push carries
    next(stage)
    assert norm.count == 4 and torch.isfinite(module.shift).all() and not torch.equal(module.shift, shift)


@pytest.fixture
def two_ranks(monkeypatch):
    """A fake 2-rank process group for ``RunningStatistics.sync``: rank 1's part is what the test sets."""
    other: dict[str, Any] = {}

    def all_gather_object(gathered: list, mine: Any) -> None:
        gathered[0], gathered[1] = mine, other["part"]

    import ptl_rl.normalization.running_stats as rs  # noqa: PLC0415 - the module whose torch.distributed is faked

    monkeypatch.setattr(rs.dist, "is_available", lambda: True)
    monkeypatch.setattr(rs.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(rs.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(rs.dist, "all_gather_object", all_gather_object)
    return other


def test_a_sync_refuses_merged_statistics_with_nan_on_every_rank_with_nothing_changed(two_ranks):
    norm = learned(np.arange(6.0).reshape(2, 3))
    module = norm.module()
    stage = ptl_rl.NormalizeObservations(Rows([]), norm, apply_in="model", output="raw")
    before, shift = snapshot(norm.statistics), module.shift.clone()
    two_ranks["part"] = (4, np.array([1.0, np.nan, 0.0]), np.ones(3))
    with pytest.raises(FloatingPointError, match=r"gathered from rank\(s\) \[1\] hold NaN or inf"):
        sync_statistics(stage)
    assert snapshot(norm.statistics) == before and torch.equal(module.shift, shift)
    # a good part merges as before
    two_ranks["part"] = (4, np.array([1.0, 2.0, 0.0]), np.ones(3))
    assert sync_statistics(stage) == 1 and norm.count == 6


class CutOnce(Rows):
    """Rows whose pull number ``at`` is cut short (a KeyboardInterrupt) before a batch leaves."""

    def __init__(self, batches: list[TransitionBatch], at: int) -> None:
        super().__init__(batches)
        self.at, self.pulls = at, 0

    def __next__(self) -> TransitionBatch:
        self.pulls += 1
        if self.pulls == self.at:
            raise KeyboardInterrupt
        return super().__next__()


def test_a_sync_between_a_cut_step_and_the_next_is_kept(two_ranks):
    # the guard rolls a cut step back before the next one; the merged statistics of a sync in between must stay
    # (put back, this rank's rows would count twice at the next sync)
    norm = ptl_rl.ObservationNormalizer(clip=None, shape=(3,))
    module = norm.module()
    rows = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    stage = ptl_rl.NormalizeObservations(CutOnce([rows_batch(rows), rows_batch(rows + 1)], at=2), norm,
                                         apply_in="model", output="raw")  # fmt: skip
    scaled = ptl_rl.ScaleRewards(CutOnce([rows_batch(rows), rows_batch(rows + 1)], at=2))
    for s in (stage, scaled):
        next(s)
        with pytest.raises(KeyboardInterrupt):
            next(s)
    two_ranks["part"] = (4, np.array([1.0, 2.0, 0.0]), np.ones(3))
    assert norm.sync()
    two_ranks["part"] = (4, np.array(1.0), np.array(1.0))
    assert scaled.sync()
    merged, returns = norm.statistics.moments, scaled.statistics.moments
    assert norm.statistics.local.count == 0 and merged.count == 6 and returns.count == 6
    next(stage), next(scaled)  # restores the cut steps' snapshots: older than the sync, so not put back
    assert norm.count == 8 and norm.statistics.local.count == 2 and scaled.statistics.moments.count == 8
    assert norm.statistics.synced is merged and torch.equal(
        module.shift, torch.as_tensor(norm.mean, dtype=torch.float32)
    )


def test_a_sync_refuses_statistics_of_another_shape(two_ranks):
    norm = ptl_rl.ObservationNormalizer(shape=(3,))  # nothing seen here: rank 1's rows alone would set the shape
    two_ranks["part"] = (4, np.zeros(6), np.ones(6))
    with pytest.raises(ValueError, match=r"of shape \(6,\), but these statistics are of shape \(3,\)"):
        norm.sync()
    assert norm.statistics.moments is None


def test_a_restore_refuses_statistics_with_nan():
    source = learned(np.arange(6.0).reshape(2, 3))
    state = source.state_dict()
    state["statistics"]["local"]["mean"][1] = float("nan")  # a checkpoint saved from poisoned statistics
    norm = learned(np.ones((2, 3)))
    before = snapshot(norm.statistics)
    with pytest.raises(FloatingPointError, match="the state holds statistics with NaN or inf"):
        norm.load_state_dict(state)
    assert snapshot(norm.statistics) == before
    scale = ptl_rl.ScaleRewards(Rows([]))
    rewards_state = scale.state_dict()
    poisoned = Moments(2, np.array(np.inf), np.array(1.0)).state_dict()
    rewards_state["statistics"] = {"synced": Moments.empty().state_dict(), "local": poisoned}
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        scale.load_state_dict(rewards_state)
    assert scale.statistics.moments is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 6), st.booleans(), st.integers(0, 2**31 - 1), st.sampled_from(BAD)),
        min_size=1,
        max_size=10,
    ),
    st.integers(1, 3),
)
def test_statistics_equal_those_of_the_finite_batches_alone(batches, width):
    norm = ptl_rl.ObservationNormalizer()
    finite = []
    for n, poisoned, seed, value in batches:
        rng = np.random.default_rng(seed)
        rows = rng.normal(rng.uniform(-50, 50), rng.uniform(0.1, 20), size=(n, width))
        if poisoned:
            hit = rng.random((n, width)) < 0.3
            hit[rng.integers(n), rng.integers(width)] = True
            rows[hit] = value
            before = snapshot(norm.statistics)
            bad = np.flatnonzero(hit.any(axis=1)).tolist()
            with pytest.raises(FloatingPointError, match=re.escape(f"row(s) {bad} of {n};")):
                norm.update(rows)
            assert snapshot(norm.statistics) == before
        else:
            norm.update(rows)
            finite.append(rows)
    if not finite:
        assert norm.statistics.moments is None
        return
    whole = np.concatenate(finite)
    assert norm.count == len(whole)
    np.testing.assert_allclose(norm.mean, whole.mean(axis=0), rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(norm.var, whole.var(axis=0), rtol=1e-9, atol=1e-9)


# ============================================================================ defect 3: shapes
SHAPES_3_AND_6 = r"observations of shape \(6,\) per row .*, but the statistics are of shape \(3,\)"


def test_statistics_of_3_dims_loaded_and_applied_to_6_dims_name_both_shapes():
    state = learned(np.random.default_rng(0).normal(size=(8, 3))).state_dict()
    norm = ptl_rl.ObservationNormalizer()
    norm.load_state_dict(state)  # a fresh normalizer: its shape is the state's
    obs = np.ones((2, 6), np.float32)
    for apply in (norm, norm.normalize, lambda x: norm.normalize_with(x, norm.statistics.moments)):
        with pytest.raises(ValueError, match=SHAPES_3_AND_6):
            apply(obs)
    with pytest.raises(ValueError, match=SHAPES_3_AND_6):
        norm(torch.ones(2, 6))  # the tensor path
    with pytest.raises(ValueError, match=SHAPES_3_AND_6):
        norm.wrap_agent(lambda x: x)(obs)  # evaluation
    with pytest.raises(ValueError, match=r"of shape \(6,\) per row .* statistics are of shape \(3,\).*do not match"):
        norm.update(obs)
    assert norm.count == 8
    with pytest.raises(ValueError, match=SHAPES_3_AND_6):
        norm.module()(torch.ones(2, 6))


@pytest.mark.parametrize("fixed", ["shape", "learned"])
def test_load_state_dict_refuses_statistics_of_another_shape_than_the_fixed_one(fixed):
    state = learned(np.random.default_rng(0).normal(size=(8, 3))).state_dict()
    norm = ptl_rl.ObservationNormalizer(shape=(6,)) if fixed == "shape" else learned(np.ones((2, 6)))
    before, clip = snapshot(norm.statistics), norm.clip
    state["clip"] = 3.0
    with pytest.raises(ValueError, match=r"state holds statistics of shape \(3,\), but .* are of shape \(6,\)"):
        norm.load_state_dict(state)
    assert snapshot(norm.statistics) == before and norm.clip == clip  # nothing of the state was taken


def test_statistics_of_shape_1_are_not_broadcast_over_6_dims():
    norm = learned(np.array([[1.0], [3.0]]))
    obs = np.ones((4, 6))
    with pytest.raises(ValueError, match=r"shape \(6,\) per row .* statistics are of shape \(1,\)"):
        norm(obs)
    with pytest.raises(ValueError, match=r"shape \(6,\) per row .* statistics are of shape \(1,\)"):
        norm(torch.ones(4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \(6,\) per row .* statistics are of shape \(1,\)"):
        norm.module()(torch.ones(4, 6))
    # a module of 6 dims given statistics of shape (1,): refused, not broadcast
    module = NormalizationModule((6,))
    with pytest.raises(
        ValueError, match=r"statistics of shape \(1,\) do not fit this NormalizationModule, of shape \(6,\)"
    ):
        module.load(np.zeros(1, np.float32), np.full(1, 2.0, np.float32))
    assert torch.equal(module.scale, torch.ones(6))


def test_a_shape_given_is_enforced_before_any_row_was_seen():
    norm = ptl_rl.ObservationNormalizer(shape=(3,))
    with pytest.raises(ValueError, match=SHAPES_3_AND_6):
        norm(np.zeros((2, 6)))
    with pytest.raises(ValueError, match=SHAPES_3_AND_6):
        norm.update(np.zeros((2, 6)))
    assert norm.statistics.moments is None


def test_the_module_fixes_the_shape_of_a_normalizer_without_one():
    norm = learned(np.ones((2, 3)))
    module = norm.module()
    norm.load_state_dict(ptl_rl.ObservationNormalizer().state_dict())  # empty statistics: the module keeps (3,)
    with pytest.raises(ValueError, match=SHAPES_3_AND_6):
        norm.update(np.zeros((2, 6)))
    norm.update(np.full((2, 3), 5.0))
    assert torch.equal(module.shift, torch.full((3,), 5.0))


def test_scale_rewards_refuses_a_state_of_non_scalar_statistics():
    stage = ptl_rl.ScaleRewards(Rows([]))
    state = stage.state_dict()
    state["statistics"] = learned(np.ones((2, 3))).statistics.state_dict()
    with pytest.raises(ValueError, match=r"statistics of shape \(3,\), but ScaleRewards keeps .* shape \(\)"):
        stage.load_state_dict(state)
    assert stage.statistics.moments is None


def test_the_shapes_that_worked_still_work():
    norm = learned(np.random.default_rng(0).normal(size=(8, 3)), clip=None)
    batch = np.random.default_rng(1).normal(size=(4, 3))
    out = norm(batch)
    assert out.shape == (4, 3)
    assert np.array_equal(norm(batch[0]), out[0])  # one unbatched observation
    assert np.array_equal(norm(batch.reshape(2, 2, 3)), out.reshape(2, 2, 3))  # [B, T, *obs_shape] sequences
    module = norm.module()
    torch.testing.assert_close(module(torch.as_tensor(batch.reshape(2, 2, 3), dtype=torch.float32)),
                               torch.as_tensor(out.reshape(2, 2, 3)))  # fmt: skip
    # before anything is known, nothing is fixed: mean 0, variance 1 for any shape
    assert ptl_rl.ObservationNormalizer(clip=None, epsilon=0.0)(np.full((2, 6), 3.0)).shape == (2, 6)

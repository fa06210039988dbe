"""Normalization stages against brute force over the scripted envs' own records, in every autoreset mode.

The reference recomputes everything from the raw rows, one at a time, in plain Python/numpy:
the mean and population variance of every observation a transition started from, and each
env's discounted return restarting after ``terminated`` or ``truncated``.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted_env import BOTH, MODES, TERM, TRUNC, make_env, raw_transitions, scripted_batches
from taps import Tap

import ptl_rl
from ptl_rl.normalization.running_stats import Moments

LAYOUTS = [
    [(1, TERM), (3, TRUNC), (1, TRUNC), (4, TERM), (2, TERM)],
    [(2, TRUNC), (2, BOTH), (5, TRUNC)],
    [(6, TERM), (1, BOTH)],
]
SINGLE_LAYOUT = [[(1, TERM), (3, TRUNC), (1, TRUNC), (4, TERM), (2, TRUNC)]]


class RecordingAgent:
    """Random actions; keeps a copy of every observation batch it was shown."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.seen: list[np.ndarray] = []

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        self.seen.append(np.array(obs, copy=True))
        return self.rng.integers(0, 5, size=len(obs))


class Driven:
    """A stage iterated by ``scripted_batches``, which reads the source's rank and env count."""

    def __init__(self, stage, source) -> None:
        self.stage, self.rank, self.num_envs = stage, source.rank, source.num_envs

    def __next__(self):
        return next(self.stage)


def run_script(stage, source, layouts, extra_steps=0):
    return list(scripted_batches(Driven(stage, source), layouts, extra_steps=extra_steps))


def reference_normalize(x: np.ndarray, prior: list[np.ndarray], clip: float | None, eps: float) -> np.ndarray:
    """Brute force: normalize ``x`` by the mean and population variance of every row in ``prior``."""
    if prior:
        rows = np.concatenate(prior).astype(np.float64)
        mean, var = rows.mean(axis=0), rows.var(axis=0)
    else:
        mean, var = 0.0, 1.0
    out = (x.astype(np.float64) - mean) / np.sqrt(var + eps)
    return out if clip is None else np.clip(out, -clip, clip)


def build(mode: str, layouts, clip=10.0, output="normalized"):
    env = make_env(layouts, mode)
    agent = RecordingAgent()
    norm = ptl_rl.ObservationNormalizer(clip=clip)
    source = ptl_rl.ExperienceSource(env, agent, seed=3, observation_transform=norm)
    tap = Tap(source)
    stage = ptl_rl.NormalizeObservations(tap, norm, output=output)
    return env, agent, source, tap, stage


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clip", [None, 1.5])
def test_observation_statistics_and_outputs_match_brute_force(mode, clip):
    layouts = SINGLE_LAYOUT if mode == "single" else LAYOUTS
    env, agent, source, tap, stage = build(mode, layouts, clip=clip)
    eps = stage.normalizer.epsilon
    out = run_script(stage, source, layouts, 2)
    prior: list[np.ndarray] = []
    for k, (batch, raw) in enumerate(zip(out, tap.raw, strict=True)):
        expected_obs = reference_normalize(raw["obs"], prior, clip, eps)
        np.testing.assert_allclose(batch.obs, expected_obs, rtol=1e-5, atol=1e-5)
        # what the agent acted on at this step, for the rows of this batch, bit for bit
        shown = agent.seen[len(agent.seen) - len(out) + k] if mode != "NextStep" else None
        if shown is not None:
            rows = raw["env_id"] - source.rank * source.num_envs
            assert np.array_equal(shown[rows], batch.obs)
        prior.append(raw["obs"])
        expected_next = reference_normalize(raw["next_obs"], prior, clip, eps)
        np.testing.assert_allclose(batch.next_obs, expected_next, rtol=1e-5, atol=1e-5)
        assert batch.obs.dtype == np.float32 and batch.next_obs.dtype == np.float32
    # the statistics are those of every observation a transition started from: the envs' own records
    records = raw_transitions([e for e in _records(env)])
    np.testing.assert_allclose(stage.normalizer.mean, records["obs"].mean(axis=0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(stage.normalizer.var, records["obs"].var(axis=0), rtol=1e-9, atol=1e-9)
    assert stage.normalizer.count == len(records["obs"])


def _records(env):
    if hasattr(env, "envs"):
        return [e.unwrapped.record for e in env.envs]
    return [env.unwrapped.record]


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_next_obs_of_a_step_is_the_next_obs_as_the_agent_sees_it(mode):
    env, agent, source, tap, stage = build(mode, LAYOUTS)
    out = run_script(stage, source, LAYOUTS)
    # per env, a step that did not end the episode is continued by the env's next row
    for env_id in range(source.num_envs):
        rows = [(b.obs[i], b.next_obs[i], bool(b.terminated[i] | b.truncated[i]))
                for b in out for i in np.nonzero(b.env_id == env_id + source.rank * source.num_envs)[0]]  # fmt: skip
        for (_, next_obs, done), (obs, _, _) in zip(rows, rows[1:], strict=False):
            if not done:
                assert np.array_equal(next_obs, obs)


@pytest.mark.parametrize("mode", MODES)
def test_raw_output_keeps_the_env_observations_and_the_agent_still_sees_normalized_ones(mode):
    layouts = SINGLE_LAYOUT if mode == "single" else LAYOUTS
    env, agent, source, tap, stage = build(mode, layouts, output="raw")
    out = run_script(stage, source, layouts)
    for batch, raw in zip(out, tap.raw, strict=True):
        assert np.array_equal(batch.obs, raw["obs"]) and np.array_equal(batch.next_obs, raw["next_obs"])
    records = raw_transitions(_records(env))
    np.testing.assert_allclose(stage.normalizer.mean, records["obs"].mean(axis=0), rtol=1e-12)
    # the agent's last view: the source's current observations under the statistics of the moment
    np.testing.assert_array_equal(agent.seen[-1].dtype, np.float32)


def reference_scaled_rewards(raw_batches, gamma, clip, eps):
    """Brute force, row by row in yield order: G = gamma G + r per env, reset after an episode end."""
    returns: dict[int, float] = {}
    seen: list[float] = []
    out = []
    for raw in raw_batches:
        gs = []
        for env_id, r in zip(raw["env_id"].tolist(), raw["reward"].tolist(), strict=True):
            g = returns.get(env_id, 0.0) * gamma + r
            gs.append(g)
        seen.extend(gs)
        var = float(np.var(np.array(seen, dtype=np.float64)))
        scaled = np.array(raw["reward"], dtype=np.float64) / np.sqrt(var + eps)
        out.append(scaled if clip is None else np.clip(scaled, -clip, clip))
        for env_id, g, d in zip(
            raw["env_id"].tolist(), gs, (raw["terminated"] | raw["truncated"]).tolist(), strict=True
        ):
            returns[env_id] = 0.0 if d else g
    return out, np.array(seen)


def episode_returns_from_records(records, gamma):
    """Every discounted return G_t along each env's episodes, straight from the env's own record."""
    values = []
    for record in records:
        g = 0.0
        for _, _, reward, _, term, trunc in record:
            g = g * gamma + reward
            values.append(g)
            if term or trunc:
                g = 0.0
    return np.array(values)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clip", [None, 0.8])
def test_reward_scaling_matches_brute_force(mode, clip):
    layouts = SINGLE_LAYOUT if mode == "single" else LAYOUTS
    env = make_env(layouts, mode)
    source = ptl_rl.ExperienceSource(env, RecordingAgent(), seed=5)
    tap = Tap(source)
    stage = ptl_rl.ScaleRewards(tap, gamma=0.9, clip=clip)
    out = run_script(stage, source, layouts, 3)
    expected, seen = reference_scaled_rewards(tap.raw, 0.9, clip, stage.epsilon)
    for batch, want in zip(out, expected, strict=True):
        np.testing.assert_allclose(batch.reward, want, rtol=1e-5, atol=1e-6)
        assert batch.reward.dtype == np.float32
    # the statistics hold exactly the returns the envs' records give, whatever the order of the rows
    from_records = episode_returns_from_records(_records(env), 0.9)
    assert stage.statistics.moments.count == len(from_records) == len(seen)
    np.testing.assert_allclose(stage.var, from_records.var(), rtol=1e-9)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_both_stages_chain_in_either_order_and_feed_an_nstep_stage(mode):
    env = make_env(LAYOUTS, mode)
    agent = RecordingAgent()
    source = ptl_rl.ExperienceSource(env, agent, seed=1, observation_transform=ptl_rl.ObservationNormalizer())
    scaled = ptl_rl.ScaleRewards(source, gamma=0.9)
    norm = ptl_rl.NormalizeObservations(scaled)  # the source's normalizer
    nstep = ptl_rl.NStepTransform(norm, n=3, gamma=0.9)
    rows = sum(len(next(nstep)) for _ in range(20))
    assert rows > 0 and agent.seen[-1].dtype == np.float32
    assert source.observation_transform is norm.normalizer
    with pytest.raises(ValueError, match="right after the ExperienceSource"):
        ptl_rl.ScaleRewards(nstep)
    with pytest.raises(ValueError, match="one NormalizeObservations per source"):
        ptl_rl.NormalizeObservations(norm)
    with pytest.raises(ValueError, match="must follow an ExperienceSource.*got NStepTransform"):
        ptl_rl.NormalizeObservations(nstep)
    assert scaled.num_envs == norm.num_envs == source.num_envs  # what a RolloutBuffer after them reads


def test_a_source_without_the_normalizer_is_refused_with_the_fix():
    """The agent must act on the statistics the stage updates: the source shows it the very normalizer."""
    fix = re.escape(
        "pass the normalizer to the source: norm = ptl_rl.ObservationNormalizer(); "
        "source = ptl_rl.ExperienceSource(env, agent, observation_transform=norm); "
        "ptl_rl.NormalizeObservations(source, norm)"
    )
    bare = ptl_rl.ExperienceSource(make_env(LAYOUTS, "SameStep"), RecordingAgent(), seed=0)
    with pytest.raises(ValueError, match="shows its agent the env's own observations.*" + fix):
        ptl_rl.NormalizeObservations(bare)
    with pytest.raises(ValueError, match=fix):
        ptl_rl.NormalizeObservations(Tap(bare), ptl_rl.ObservationNormalizer())  # also through per-step stages
    other = ptl_rl.ExperienceSource(make_env(LAYOUTS, "SameStep"), RecordingAgent(), observation_transform=np.tanh)
    with pytest.raises(ValueError, match="not an ObservationNormalizer.*" + fix):
        ptl_rl.NormalizeObservations(other)
    shown = ptl_rl.ObservationNormalizer()
    source = ptl_rl.ExperienceSource(make_env(LAYOUTS, "SameStep"), RecordingAgent(), observation_transform=shown)
    with pytest.raises(ValueError, match="not the one ExperienceSource shows its agent.*" + fix):
        ptl_rl.NormalizeObservations(source, ptl_rl.ObservationNormalizer())  # a different normalizer
    assert source.observation_transform is shown  # nothing written into the source
    assert ptl_rl.NormalizeObservations(source, shown).normalizer is shown


# ---------------------------------------------------------------------------- moments
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 7), min_size=1, max_size=8),
    st.integers(1, 3),
    st.integers(0, 2**31 - 1),
)
def test_moments_merge_in_any_split_equals_the_whole(sizes, width, seed):
    rng = np.random.default_rng(seed)
    parts = [rng.normal(3.0, 5.0, size=(n, width)) for n in sizes]
    folded = Moments.empty((width,))
    for part in parts:
        folded = folded.add(part)
    whole = np.concatenate(parts)
    assert folded.count == len(whole)
    np.testing.assert_allclose(folded.mean, whole.mean(axis=0), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(folded.var, whole.var(axis=0), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------- state, evaluation, faults
def test_checkpoint_round_trip_restores_the_statistics_exactly():
    env, agent, source, tap, stage = build("SameStep", LAYOUTS)
    scaled = ptl_rl.ScaleRewards(stage, gamma=0.9)
    for _ in range(12):
        next(scaled)
    state = ptl_rl.pipeline_state_dict(scaled)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)

    env2, agent2, source2, tap2, stage2 = build("SameStep", LAYOUTS)
    scaled2 = ptl_rl.ScaleRewards(stage2, gamma=0.9)
    ptl_rl.load_pipeline_state_dict(scaled2, loaded)
    a, b = stage.normalizer.statistics.moments, stage2.normalizer.statistics.moments
    assert a.count == b.count and np.array_equal(a.mean, b.mean) and np.array_equal(a.m2, b.m2)
    assert scaled.statistics.moments.count == scaled2.statistics.moments.count
    assert scaled.var == scaled2.var
    probe = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(stage.normalizer(probe), stage2.normalizer(probe))
    # a restore starts new episodes: the returns in flight restart at 0
    assert not scaled2._returns.any()


def test_evaluation_through_the_wrapped_agent_is_frozen_and_normalized():
    env, agent, source, tap, stage = build("SameStep", LAYOUTS)
    for _ in range(10):
        next(stage)
    before = stage.normalizer.statistics.moments
    shown = []

    def greedy(obs):
        shown.append(np.array(obs, copy=True))
        return np.zeros(len(obs), dtype=np.int64)

    eval_env = make_env([[(3, TERM)], [(2, TRUNC)]], "SameStep")
    returns = ptl_rl.evaluate(eval_env, stage.normalizer.wrap_agent(greedy), episodes=2, seed=0)
    assert len(returns) == 2
    assert stage.normalizer.statistics.moments is before  # nothing learned from evaluation episodes
    assert shown and all(s.dtype == np.float32 for s in shown)
    raw_first, _ = make_env([[(3, TERM)], [(2, TRUNC)]], "SameStep").reset(seed=0)  # a twin's first observations
    expected = reference_normalize(raw_first, [raw["obs"] for raw in tap.raw], 10.0, 1e-8)
    np.testing.assert_allclose(shown[0], expected, rtol=1e-5, atol=1e-5)


def test_frozen_normalizer_learns_nothing_but_still_normalizes():
    env, agent, source, tap, stage = build("NextStep", LAYOUTS)
    for _ in range(5):
        next(stage)
    stage.normalizer.frozen = True
    count = stage.normalizer.count
    batch = next(stage)
    assert stage.normalizer.count == count
    np.testing.assert_allclose(
        batch.obs, reference_normalize(tap.raw[-1]["obs"], [r["obs"] for r in tap.raw[:-1]], 10.0, 1e-8), atol=1e-5
    )


class Interrupting:
    """An agent that raises KeyboardInterrupt on the calls listed in ``at`` (a notebook's interrupt)."""

    def __init__(self, at) -> None:
        self.inner = RecordingAgent()
        self.at = set(at)
        self.calls = 0

    def __call__(self, obs):
        self.calls += 1
        if self.calls in self.at:
            raise KeyboardInterrupt
        return self.inner(obs)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_interrupts_and_peeks_leave_statistics_of_exactly_the_rows_yielded(mode):
    layouts = [[(50, TERM)] * 4, [(7, TRUNC)] * 30, [(3, BOTH)] * 60]
    env = make_env(layouts, mode)
    agent = Interrupting(at={4, 9, 10, 17})
    source = ptl_rl.ExperienceSource(env, agent, seed=2, observation_transform=ptl_rl.ObservationNormalizer())
    norm = ptl_rl.NormalizeObservations(source)
    scaled = ptl_rl.ScaleRewards(norm, gamma=0.9)
    yielded_raw_obs, seqs = [], []
    peeked = 0
    for call in range(40):
        try:
            if call % 11 == 5:
                next(source)  # a peek: these rows never reach the stages
                peeked += 1
                continue
            batch = next(scaled)
        except KeyboardInterrupt:
            continue
        seqs.append(scaled.stream_seq)
        # the raw observations of the rows yielded, recovered from the scripted ids via the env's ids
        yielded_raw_obs.append(batch.obs)
    assert peeked and len(seqs) > 20
    # every interrupt or peek shows downstream as a skipped number
    assert any(b - a > 1 for a, b in zip(seqs, seqs[1:], strict=False))
    assert norm.normalizer.count == sum(len(o) for o in yielded_raw_obs)
    # the interrupts land inside the source, before either stage commits: both counted exactly the rows yielded
    assert scaled.statistics.moments.count == norm.normalizer.count


class CutAfter:
    """Wraps ``fn``: runs it, then raises KeyboardInterrupt on the calls listed in ``at`` (a cut after a commit)."""

    def __init__(self, fn, at) -> None:
        self.fn, self.at, self.calls = fn, set(at), 0

    def __call__(self, *args):
        out = self.fn(*args)
        self.calls += 1
        if self.calls in self.at:
            raise KeyboardInterrupt
        return out


def test_a_step_cut_after_its_commit_is_rolled_back():
    """The guard puts a cut step back: the statistics count exactly the rows yielded, wherever the cut falls."""
    env, agent, source, tap, stage = build("SameStep", LAYOUTS)
    passed = Tap(stage)  # what NormalizeObservations yields: ScaleRewards loses one of these batches
    scaled = ptl_rl.ScaleRewards(passed, gamma=0.9)
    stage.normalizer.commit = CutAfter(stage.normalizer.commit, at={3, 7})  # the statistics changed, batch lost
    scaled.statistics.commit = CutAfter(scaled.statistics.commit, at={5})
    yielded = []
    for _ in range(14):
        try:
            yielded.append(next(scaled))
        except KeyboardInterrupt:
            continue
    assert len(passed.raw) == 12 and len(yielded) == 11
    assert stage.normalizer.count == sum(len(raw["obs"]) for raw in passed.raw)
    assert scaled.statistics.moments.count == sum(len(b) for b in yielded)
    lost = {2, 6}  # the raw batches whose normalization step was cut (0-based)
    kept = [raw["obs"] for i, raw in enumerate(tap.raw) if i not in lost]
    np.testing.assert_allclose(stage.normalizer.mean, np.concatenate(kept).mean(axis=0), rtol=1e-12)


def test_sampled_batches_are_normalized_with_the_statistics_at_sampling_time():
    env, agent, source, tap, stage = build("SameStep", LAYOUTS, output="raw")
    buffer = ptl_rl.ReplayBuffer(stage, 100, warmup=6, transitions_per_yield=3, seed=0)
    sampler = ptl_rl.BatchSampler(buffer, 4)
    sampled = ptl_rl.NormalizeSampledObservations(sampler, stage.normalizer)
    for _ in range(5):
        batch = next(sampled)
        # the buffer holds raw ids; the batch holds them normalized with every row collected so far
        raw = buffer.storage.fields["obs"][: len(buffer)]
        stats = Moments.of(np.concatenate([r["obs"] for r in tap.raw]))
        assert stats.count == stage.normalizer.count
        expected_mean = stats.mean
        # undo the normalization to find raw rows that are in the buffer
        std = np.sqrt(stats.var + stage.normalizer.epsilon)
        back = batch.obs.numpy().astype(np.float64) * std + expected_mean
        assert all((np.abs(raw - row).max(axis=1) < 1e-3).any() for row in back)
        assert batch.obs.dtype == torch.float32


def test_bad_input_is_refused_with_the_fix():
    env = make_env(LAYOUTS, "SameStep", dict_obs=True)
    norm = ptl_rl.ObservationNormalizer()
    stage = ptl_rl.NormalizeObservations(
        ptl_rl.ExperienceSource(env, RecordingAgent(), seed=0, observation_transform=norm)
    )
    with pytest.raises(TypeError, match="FlattenObservation"):
        next(stage)
    with pytest.raises(ValueError, match="clip must be > 0"):
        ptl_rl.ObservationNormalizer(clip=0)
    with pytest.raises(ValueError, match="output must be one of"):
        ptl_rl.NormalizeObservations(
            ptl_rl.ExperienceSource(make_env(LAYOUTS, "SameStep"), RecordingAgent()), output="x"
        )
    norm = ptl_rl.ObservationNormalizer()
    norm.update(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="do not match"):
        norm.update(np.zeros((2, 4)))
    assert norm.count == 2  # the refused rows changed nothing

"""The fast paths of the hot path against the same brute-force references as the general paths.

* NStepTransform's lockstep path (a source's full batches, no episode end, every window full)
  is only taken with a real ``one_row_per_env`` upstream, so these tests feed the scripted
  source's batches through such an upstream and compare with ``reference_nstep`` (the same
  reference and the same field checks as tests/property/test_nstep.py).
* ArrayStorage checks each batch layout once: a batch that changes a dtype or a shape after the
  first batches must still be refused with the full check's error, before anything is written.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nstep_reference import reference_nstep
from scripted_env import BOTH, TERM, TRUNC, ScriptedAgent, env_attr, ids_of, make_env, obs_code, scripted_batches

import ptl_rl
from ptl_rl import ExperienceSource, NStepTransform, ReplayBuffer, TransitionBatch
from ptl_rl.stages import nstep_lockstep


def assert_matches_reference(outputs, reference) -> None:
    """The emitted n-step rows equal the brute-force reference's, as a multiset keyed by the obs code."""
    outputs = [b for b in outputs if b is not None]
    if reference is None:
        assert sum(len(b) for b in outputs) == 0
        return
    assert outputs, "nothing emitted"
    got = TransitionBatch.concat(outputs)
    assert got["reward"].dtype == np.float32 and got["discount"].dtype == np.float32
    assert got["terminated"].dtype == bool and got["env_id"].dtype == np.int64
    obs_id = ids_of(got["obs"])
    code = obs_code(obs_id)
    order = np.argsort(code, kind="stable")
    assert len(np.unique(code)) == len(code), "a window was emitted twice"
    np.testing.assert_array_equal(code[order], reference["code"], err_msg="windows missing or extra")
    np.testing.assert_array_equal(got["env_id"][order], reference["env_id"])
    np.testing.assert_array_equal(got["action"][order], reference["action"])
    np.testing.assert_allclose(got["reward"][order], reference["reward"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["discount"][order], reference["discount"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(obs_code(got["next_obs"])[order], reference["next_code"])
    np.testing.assert_array_equal(got["terminated"][order], reference["terminated"])
    np.testing.assert_array_equal(got["truncated"][order], reference["truncated"])
    # extras come from the window's first step
    np.testing.assert_array_equal(got["log_prob"], -code.astype(np.float64))
    np.testing.assert_array_equal(got["hidden"], obs_id[:, 1:].astype(np.float32))


class SourceStream:
    """The scripted source's batches as a source-like upstream: one row per env, the source's stream_seq."""

    one_row_per_env = True

    def __init__(self, source: ExperienceSource, layouts, extra: int) -> None:
        self.source, self._batches = source, scripted_batches(source, layouts, extra)

    @property
    def stream_seq(self) -> int:
        return self.source.stream_seq

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._batches)


@pytest.fixture
def lockstep_calls(monkeypatch):
    """Counts the folds that took the lockstep path."""
    calls = []
    original = nstep_lockstep.fold

    def counted(self, batch, phase):
        calls.append(len(batch))
        return original(self, batch, phase)

    monkeypatch.setattr(nstep_lockstep, "fold", counted)
    return calls


episode_st = st.tuples(st.integers(1, 12), st.sampled_from([TERM, TRUNC, BOTH]))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    mode=st.sampled_from(["NextStep", "SameStep", "Disabled"]),
    layouts=st.integers(1, 4).flatmap(lambda k: st.lists(st.lists(episode_st, max_size=4), min_size=k, max_size=k)),
    n=st.integers(1, 5),
    gamma=st.sampled_from([1.0, 0.5, 0.9]),
    extra=st.integers(0, 12),
    rank=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_lockstep_nstep_matches_brute_force(lockstep_calls, mode, layouts, n, gamma, extra, rank, seed):
    env = make_env(layouts, mode, reward_seed=seed)
    source = ExperienceSource(env, ScriptedAgent(len(layouts), seed=seed), seed=seed, rank=rank)
    nstep = NStepTransform(SourceStream(source, layouts, extra), n, gamma)
    outputs = list(nstep)
    outputs.append(nstep.flush())
    reference = reference_nstep(env_attr(env, "record"), n, gamma, rank * len(layouts))
    assert_matches_reference(outputs, reference)


def test_lockstep_path_is_taken_and_matches_the_general_path(lockstep_calls) -> None:
    """Long episodes of 3 envs: most steps take the lockstep path; every row equals the general path's."""
    layouts = [[(40, TERM), (25, TRUNC)], [(33, TRUNC), (30, TERM)], [(50, BOTH)]]
    outputs = {}
    for route in ("lockstep", "general"):
        env = make_env(layouts, "NextStep", reward_seed=3)
        source = ExperienceSource(env, ScriptedAgent(3, seed=3), seed=3)
        if route == "lockstep":
            nstep = NStepTransform(SourceStream(source, layouts, 5), 3, 0.9)
            out = list(nstep)
        else:
            nstep = NStepTransform(None, 3, 0.9)
            out = [nstep.fold(b) for b in scripted_batches(source, layouts, 5)]
        out.append(nstep.flush())
        outputs[route] = TransitionBatch.concat([b for b in out if b is not None])
        if route == "lockstep":
            assert len(lockstep_calls) > 30, "the lockstep path was not taken"
            reference = reference_nstep(env_attr(env, "record"), 3, 0.9)
            assert_matches_reference([outputs[route]], reference)
    a, b = outputs["lockstep"], outputs["general"]
    key_a, key_b = np.argsort(a["obs"] @ [1e8, 1e4, 1]), np.argsort(b["obs"] @ [1e8, 1e4, 1])
    for name in a.keys():
        np.testing.assert_array_equal(a[name][key_a], b[name][key_b], err_msg=name)  # bit for bit


def test_lockstep_path_resumes_after_each_next_step_reset(lockstep_calls) -> None:
    """Staggered episode ends under next-step autoreset: each end leaves the lockstep path for at most n + 1 steps.

    The step after an end holds no row of the env that only resets; that env's window is empty, so
    the other envs stay in phase with it and the fast path resumes once its window is full again.
    """
    layouts = [[(40, TERM), (25, TRUNC), (60, TERM)], [(33, TRUNC), (30, TERM), (70, TRUNC)], [(50, BOTH), (80, TERM)]]
    n = 3
    env = make_env(layouts, "NextStep", reward_seed=5)
    source = ExperienceSource(env, ScriptedAgent(3, seed=5), seed=5)
    batches = list(scripted_batches(source, layouts, 30))
    ends = sum(int(np.count_nonzero(b["terminated"] | b["truncated"])) for b in batches)
    nstep = NStepTransform(None, n, 0.9)
    outputs = [nstep.fold(b, one_row_per_env=True) for b in batches]
    outputs.append(nstep.flush())
    assert_matches_reference(outputs, reference_nstep(env_attr(env, "record"), n, 0.9))
    general = len(batches) - len(lockstep_calls)
    assert general <= (n + 1) * (ends + 1), f"{general} of {len(batches)} steps off the lockstep path, {ends} ends"


def test_lockstep_path_survives_an_interrupt_and_a_restore(lockstep_calls) -> None:
    """An interrupt inside the lockstep fold, then a restore: the windows flush as truncated, no row is wrong."""
    layouts = [[(30, TERM)], [(30, TRUNC)]]
    env = make_env(layouts, "NextStep", reward_seed=1)
    source = ExperienceSource(env, ScriptedAgent(2, seed=1), seed=1)
    nstep = NStepTransform(source, 3, 0.5)
    for _ in range(10):
        next(nstep)
    assert lockstep_calls, "the lockstep path was not taken"
    original = nstep_lockstep.fold

    def interrupted(self, batch, phase):
        raise KeyboardInterrupt

    nstep_lockstep.fold = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            next(nstep)
    finally:
        nstep_lockstep.fold = original
    out = next(nstep)  # flushes every window as truncated, then folds a step of fresh episodes
    assert out["truncated"].sum() == 2 * 2  # two windows of 2 steps each per env, emitted as truncated tails
    state = nstep.state_dict()
    nstep.load_state_dict(state)
    for _ in range(10):
        out = next(nstep)
    assert (out["discount"] == np.float32(0.125)).all()


# ---------------------------------------------------------------------- storage layout cache
def _batch(rows: int, obs_dtype=np.float32, obs_shape=(4,)) -> TransitionBatch:
    rng = np.random.default_rng(rows)
    return TransitionBatch(
        obs=rng.random((rows, *obs_shape)).astype(obs_dtype),
        action=np.arange(rows, dtype=np.int64),
        reward=rng.random(rows).astype(np.float32),
        next_obs=rng.random((rows, *obs_shape)).astype(obs_dtype),
        terminated=np.zeros(rows, dtype=bool),
        truncated=np.zeros(rows, dtype=bool),
        discount=np.full(rows, 0.99, dtype=np.float32),
        env_id=np.arange(rows, dtype=np.int64),
    )


@pytest.mark.parametrize(
    "change",
    ["obs dtype", "obs shape", "action dtype", "missing field", "extra field", "ragged rows", "a list"],
)
def test_layout_cache_still_refuses_a_changed_batch_and_keeps_the_data(change) -> None:
    buffer = ReplayBuffer(None, 64, warmup=0)
    for _ in range(5):  # the layout is now remembered as checked
        buffer.add(_batch(8))
    before = {k: v.copy() for k, v in buffer.storage.fields.items()}
    bad = _batch(8)
    if change == "obs dtype":
        bad["obs"] = bad["obs"].astype(np.float64)
    elif change == "obs shape":
        bad["obs"] = np.zeros((8, 5), dtype=np.float32)
    elif change == "action dtype":
        bad["action"] = bad["action"].astype(np.float32)
    elif change == "missing field":
        del bad._fields["discount"]
    elif change == "extra field":
        bad["log_prob"] = np.zeros(8, dtype=np.float32)
    elif change == "ragged rows":
        bad["reward"] = np.zeros(7, dtype=np.float32)
    else:
        bad["action"] = list(range(8))
    with pytest.raises(ValueError, match="field|fields differ") as raised:
        buffer.add(bad)
    assert any(word in str(raised.value) for word in ("buffer stores", "missing", "rows but the batch has"))
    assert len(buffer) == 40 and buffer.storage.cursor == 40
    for k, v in buffer.storage.fields.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    buffer.add(_batch(8))  # the right layout still goes in
    assert len(buffer) == 48


def test_layout_cache_error_equals_the_full_check() -> None:
    """The error for a batch refused after the cache warmed up is the very message of a cold check."""
    bad = _batch(8, obs_dtype=np.float16)
    messages = []
    for warm in (0, 3):
        storage = ptl_rl.ArrayStorage(32)
        storage.add(_batch(8))
        for _ in range(warm):
            storage.add(_batch(8))
        with pytest.raises(ValueError) as raised:
            storage.add(bad)
        messages.append(str(raised.value))
    assert messages[0] == messages[1] and "'obs'" in messages[0] and "float16" in messages[0]

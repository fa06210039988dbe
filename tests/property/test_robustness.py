"""Data stays right when a user interrupts, peeks, or an env crashes (issue 8).

Every emitted row is checked against a brute-force reference computed from the
scripted envs' own records (see ``check_rows``): a row is an n-step window of
real, consecutive steps of one episode, with the right discounted reward,
discount, next observation and flags. Rows may be lost around an interruption
(at most a bounded number per fault), never wrong, and each window comes out
at most once.
"""

from __future__ import annotations

import collections
import functools
import importlib
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from faults import InjectedFault, Injector
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_env import (
    BOTH,
    TERM,
    TRUNC,
    ScriptedAgent,
    ScriptedEnv,
    concat_batches,
    env_attr,
    ids_of,
    make_env,
    obs_code,
)

import ptl_rl
from ptl_rl import ExperienceSource, NStepTransform, ReplayBuffer, TransitionBatch

STAGE_MODULES = (
    "ptl_rl.core.guard",
    "ptl_rl.core.stage",
    "ptl_rl.stages.source",
    "ptl_rl.stages.episodes",
    "ptl_rl.stages.finite",
    "ptl_rl.stages.env_arrays",
    "ptl_rl.stages.env_stepper",
    "ptl_rl.stages.agent_call",
    "ptl_rl.envs.failures",
    "ptl_rl.stages.nstep",
    "ptl_rl.stages.nstep_windows",
    "ptl_rl.stages.nstep_lockstep",
    "ptl_rl.core.batch",
    "ptl_rl.replay.buffer",
    "ptl_rl.replay.storage",
    "ptl_rl.replay.parts",
    "ptl_rl.replay.feedback",
    "ptl_rl.replay.prioritized",
    "ptl_rl.replay.draws",
    "ptl_rl.replay.priority_draws",
    "ptl_rl.replay.sumtree",
    "ptl_rl.replay.sequence",
    "ptl_rl.replay.windows",
    "ptl_rl.replay.sequence_links",
    "ptl_rl.replay.sampler",
)
STAGE_FILES = tuple(importlib.import_module(name).__file__ for name in STAGE_MODULES)


# ---------------------------------------------------------------------- reference
def check_rows(batches: Sequence[Any], records: Sequence[Sequence[tuple]], n: int, gamma: float, offset: int = 0):
    """Check every row of ``batches`` against the envs' records; returns the obs codes of the rows.

    Brute force, row by row: the row's ``obs`` names (env, episode, step); its ``next_obs`` must be
    ``k`` steps later in the same episode (1 <= k <= n), every one of those k steps must be in the
    env's record (a step lost to a crash cannot be summed over), and reward, discount, action,
    flags and extras must be those of that window. The flags: those of the window's last step if
    the episode ended there; else a window of n steps has none, and a shorter one was cut (a flush)
    and must be truncated.
    """
    batches = [b for b in batches if b is not None and len(b)]
    if not batches:
        return np.zeros(0, dtype=np.int64)
    got = concat_batches(batches)
    lookup = {}
    for e, record in enumerate(records):
        for p, step in enumerate(record):
            lookup[int(obs_code(step[0]))] = (e, p)
    obs_id, next_id = ids_of(got["obs"]), ids_of(got["next_obs"])
    codes = obs_code(obs_id)
    for r, code in enumerate(codes.tolist()):
        where = f"row {r} obs {obs_id[r].tolist()} next_obs {next_id[r].tolist()}"
        assert code in lookup, f"{where}: no such step in the env's record"
        e, p = lookup[code]
        assert got["env_id"][r] == e + offset, where
        k = int(next_id[r, 2] - obs_id[r, 2])
        assert next_id[r, 0] == obs_id[r, 0] and next_id[r, 1] == obs_id[r, 1], f"{where}: spans episodes"
        assert 1 <= k <= n, f"{where}: window of {k} steps, n={n}"
        window = records[e][p : p + k]
        assert len(window) == k, f"{where}: steps missing from the record"
        for j, step in enumerate(window):
            assert obs_code(step[0]) == code + j, f"{where}: step {j} of the window is not in the record"
            if j < k - 1:
                assert not (step[4] or step[5]), f"{where}: the episode ended inside the window"
        last = window[-1]
        assert obs_code(last[3]) == obs_code(next_id[r]), where
        expected_reward = sum(gamma**j * step[2] for j, step in enumerate(window))
        np.testing.assert_allclose(got["reward"][r], expected_reward, rtol=1e-5, atol=1e-5, err_msg=where)
        np.testing.assert_allclose(got["discount"][r], gamma**k, rtol=1e-6, err_msg=where)
        np.testing.assert_array_equal(got["action"][r], window[0][1], err_msg=where)
        if last[4] or last[5]:
            flags = (last[4], last[5])
        else:
            flags = (False, k < n)
        assert (bool(got["terminated"][r]), bool(got["truncated"][r])) == flags, f"{where}: flags"
    np.testing.assert_array_equal(got["log_prob"], -codes.astype(np.float64))
    np.testing.assert_array_equal(got["hidden"], obs_id[:, 1:].astype(np.float32))
    assert len(np.unique(codes)) == len(codes), "a window was emitted twice"
    return codes


def recorded_codes(records: Sequence[Sequence[tuple]]) -> set[int]:
    return {int(obs_code(step[0])) for record in records for step in record}


# ---------------------------------------------------------------------- fault injection
FIRED: collections.Counter[tuple[str, str, str]] = collections.Counter()  # (mode, kind of code, fault) -> faults


class Agent(ScriptedAgent):
    """ScriptedAgent without the per-step hook bookkeeping (an interrupted step skips the hook),
    but still checking that ``reset_state`` announces exactly the envs that start an episode."""

    def on_env_steps(self, total_steps: int) -> None:
        pass

    def __call__(self, obs: Any) -> Any:
        self.env_steps = [0] * self.calls  # keeps the parent's hook-order assertion satisfied
        return super().__call__(obs)


ENV_CODE = {ScriptedEnv.step.__code__, ScriptedEnv.reset.__code__, ScriptedEnv._obs.__code__}
AGENT_CODE = {ScriptedAgent.__call__.__code__, ScriptedAgent.reset_state.__code__, Agent.__call__.__code__}
TARGETS: dict[str, Callable[[CodeType], bool]] = {
    "stages": lambda code: code.co_filename in STAGE_FILES,
    "env": lambda code: code in ENV_CODE,
    "agent": lambda code: code in AGENT_CODE,
}


class Recorder:
    """Pass-through stage that keeps a copy of every batch it passes on."""

    def __init__(self, upstream: Any) -> None:
        self.upstream, self.batches = upstream, []

    def __iter__(self) -> Recorder:
        return self

    def __next__(self) -> TransitionBatch:
        out = next(self.upstream)
        self.batches.append(TransitionBatch(concat_batches([out])))
        return out


episode_st = st.tuples(st.integers(1, 6), st.sampled_from([TERM, TRUNC, BOTH]))
fault_st = st.tuples(
    st.sampled_from(["stages", "stages", "env", "agent"]),  # stages weighted: they have the most lines
    st.floats(0.0, 1.0),  # where in the call: a fraction of the target lines a clean call runs
    st.sampled_from(["interrupt", "exception"]),
)


@st.composite
def fault_scenarios(draw):
    num_envs = draw(st.integers(1, 3))
    return {
        "layouts": draw(st.lists(st.lists(episode_st, min_size=1, max_size=6), min_size=num_envs, max_size=num_envs)),
        "n": draw(st.integers(1, 4)),
        "gamma": draw(st.sampled_from([1.0, 0.5, 0.9])),
        # per next() call: None (a clean call) or a fault
        "calls": draw(st.lists(st.none() | fault_st, min_size=6, max_size=24)),
        "seed": draw(st.integers(0, 2**16)),
        "prioritized": draw(st.booleans()),
        "steps_per_batch": draw(st.sampled_from([1, 1, 2, 3])),  # chunks: K vector steps per source batch
    }


def _torch_rows(batch: Any) -> dict[str, Any]:
    """A sampled TorchBatch as numpy rows (stored fields only), for the reference check."""

    def to_numpy(value: Any) -> Any:
        return {k: to_numpy(v) for k, v in value.items()} if isinstance(value, dict) else value.numpy().copy()

    return {name: to_numpy(batch[name]) for name in batch.keys() if name not in ("indices", "generations", "weights")}


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled", "single"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=fault_scenarios())
def test_faults_inside_next_never_leave_wrong_rows(mode, s):
    """Exceptions and KeyboardInterrupts at random points of the env, the agent and the stages'
    own statements (source, n-step, uniform or prioritized replay, sampler): every row stays right, in
    the replay and in every batch the sampler hands out, and the pipeline keeps working."""
    layouts, n, gamma = s["layouts"], s["n"], s["gamma"]
    if mode == "single":  # a plain gymnasium.Env: the source resets it itself
        layouts = layouts[:1]
    num_envs = len(layouts)
    env = make_env(layouts, mode, reward_seed=s["seed"], dict_obs=s["seed"] % 4 == 0)
    chunk = s["steps_per_batch"]
    source = ExperienceSource(env, Agent(num_envs, seed=s["seed"]), seed=s["seed"], steps_per_batch=chunk)
    nstep = NStepTransform(source, n, gamma)
    recorder = Recorder(nstep)
    # a small ring, so that interrupted writes land in slots that hold visible rows
    buffer_type = ptl_rl.PrioritizedReplayBuffer if s["prioritized"] else ReplayBuffer
    replay = buffer_type(recorder, capacity=16, warmup=4, transitions_per_yield=1, seed=s["seed"])
    sampler = ptl_rl.BatchSampler(replay, batch_size=4)
    sampled = []

    def step() -> None:
        batch = next(sampler)
        sampled.append(_torch_rows(batch))
        if s["prioritized"]:
            batch.update_priorities(torch.rand(len(batch), generator=torch.Generator().manual_seed(len(sampled))))

    injector = Injector(TARGETS)
    lines = dict.fromkeys(TARGETS, 0)  # most lines of each kind seen in one clean call
    faults = 0
    for call in s["calls"]:
        if call is None or not lines[call[0]]:
            injector.run(step)
            lines = {kind: max(lines[kind], count) for kind, count in injector.counts.items()}
            continue
        target, where, kind = call
        exc = KeyboardInterrupt() if kind == "interrupt" else InjectedFault()
        try:
            injector.run(step, target, 1 + int(where * lines[target]), exc)
        except (KeyboardInterrupt, InjectedFault) as raised:
            assert raised is exc
            faults += 1
            FIRED[mode, target, kind] += 1
    # the pipeline keeps working: clean calls yield, and every source batch still reaches the buffer
    for _ in range(3):
        step()
    emitted = [*recorder.batches, nstep.flush()]
    records = env_attr(env, "record")
    codes = check_rows(emitted, records, n, gamma)
    missing = recorded_codes(records) - set(codes.tolist())
    # per fault, at most the rows of one source batch (K vector steps) and the windows one call emits are lost
    assert len(missing) <= faults * num_envs * (n + chunk), (len(missing), faults)
    if faults == 0:
        assert not missing
    stored = replay.storage.gather(np.arange(len(replay)))
    check_rows([stored], records, n, gamma)
    for batch in sampled:  # drawn with replacement: check each distinct row of each batch
        _, first = np.unique(obs_code(ids_of(batch["obs"])), return_index=True)
        check_rows([TransitionBatch(batch).rows(first)], records, n, gamma)
    env.close()


class SlowEnv(ScriptedEnv):
    """A ScriptedEnv whose step costs about ``cost_s`` of busy Python (a simulator's work)."""

    def __init__(self, *args: Any, cost_s: float = 0.0002, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cost_s = cost_s

    def step(self, action: Any) -> Any:
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return super().step(action)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer (POSIX)")
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize("cost_s", [0.0, 0.0002])
def test_real_keyboard_interrupts_inside_next_sampler(mode, cost_s):
    """The issue's experiment: a timer signal raises KeyboardInterrupt at a random moment of
    ``next(sampler)`` (as Jupyter's stop button does), then iteration goes on. Every row that left
    the n-step stage and every row in the replay buffer must be right."""
    rng = np.random.default_rng(8)
    layouts = [[(int(rng.integers(1, 6)), (TERM, TRUNC, BOTH)[rng.integers(3)]) for _ in range(30)] for _ in range(3)]
    fns = [functools.partial(SlowEnv, i, layout, reward_seed=8, cost_s=cost_s) for i, layout in enumerate(layouts)]
    env = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))
    n, gamma = 3, 0.9
    nstep = NStepTransform(ExperienceSource(env, Agent(3, seed=8), seed=8), n, gamma)
    recorder = Recorder(nstep)
    replay = ReplayBuffer(recorder, capacity=64, warmup=8, transitions_per_yield=2)
    sampler = ptl_rl.BatchSampler(replay, batch_size=4)
    armed = [False]

    def interrupt(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    interrupts = 0
    try:
        for _ in range(60):
            armed[0] = True
            try:  # the timer is set inside the try: it may fire as soon as setitimer returns
                signal.setitimer(signal.ITIMER_REAL, float(rng.uniform(1e-5, 2e-3)))
                for _ in range(40):
                    next(sampler)
                armed[0] = False
            except KeyboardInterrupt:
                interrupts += 1
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupts >= 30  # most trials were interrupted
    next(sampler)
    records = env_attr(env, "record")
    check_rows([*recorder.batches, nstep.flush()], records, n, gamma)
    check_rows([replay.storage.gather(np.arange(len(replay)))], records, n, gamma)


# ---------------------------------------------------------------------- peeking
@pytest.mark.parametrize("n", [1, 3])
def test_peeking_upstream_closes_windows_as_truncated(n):
    layouts = [[(9, TERM), (4, TRUNC)], [(8, TRUNC), (3, TERM)]]
    env = make_env(layouts, "NextStep", reward_seed=1)
    source = ExperienceSource(env, ScriptedAgent(2, seed=1), seed=1)
    nstep = NStepTransform(source, n, 0.5)
    emitted, peeked = [next(nstep)], []
    peeked.append(next(source))  # the user looks at the source in the middle of the pipeline
    after = next(nstep)
    emitted.append(after)
    for _ in range(12):
        emitted.append(next(nstep))
        if len(emitted) % 4 == 0:
            peeked.append(next(source))
    emitted.append(nstep.flush())
    records = env_attr(env, "record")
    codes = check_rows(emitted, records, n, 0.5)
    # only the peeked rows are missing from the n-step output; nothing spans the gap
    peeked_codes = obs_code(ids_of(concat_batches(peeked)["obs"]))
    assert recorded_codes(records) - set(codes.tolist()) == set(peeked_codes.tolist())
    if n > 1:  # the windows in flight at the peek came out at once, truncated at the step before it
        cut = after.rows(after["truncated"] & ~after["terminated"])
        assert len(cut) == 2 * (n - 1)
        np.testing.assert_array_equal(
            np.sort(obs_code(ids_of(cut["next_obs"]))),
            np.sort(np.repeat(obs_code(ids_of(emitted[0]["next_obs"])), n - 1)),
        )


# ---------------------------------------------------------------------- env crashes
class CrashingEnv(ScriptedEnv):
    """Raises in its ``crash_at``-th step() call (counted over its lifetime), after its state moved on."""

    def __init__(self, *args: Any, crash_at: int = -1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.crash_at, self.calls = crash_at, 0

    def step(self, action: Any) -> Any:
        self.calls += 1
        out = super().step(action)
        if self.calls == self.crash_at:
            raise ValueError(f"env {self.index} broke")
        return out


def crashing_vector_env(layouts, mode, crash_env, crash_at, asynchronous=False):
    fns = [
        functools.partial(CrashingEnv, i, layout, reward_seed=4, crash_at=crash_at if i == crash_env else -1)
        for i, layout in enumerate(layouts)
    ]
    cls = gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    return cls(fns, autoreset_mode=gym.vector.AutoresetMode(mode))


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize("n", [1, 3])
def test_sync_env_crash_names_sub_env_and_next_resynchronises(mode, n):
    layouts = [[(4, TERM), (3, TRUNC)], [(2, TRUNC), (6, TERM)], [(5, BOTH)]]
    env = crashing_vector_env(layouts, mode, crash_env=1, crash_at=5)
    source = ExperienceSource(env, Agent(3, seed=2), seed=2, rank=1)
    nstep = NStepTransform(source, n, 0.9)
    emitted = []
    with pytest.raises(ValueError, match="env 1 broke") as info:
        for _ in range(10):
            emitted.append(next(nstep))
    note = " ".join(getattr(info.value, "__notes__", []))
    assert "sub-env 1 (env_id 4)" in note and "resets every sub-env" in note
    resets_before = [len(seeds) for seeds in env_attr(env, "reset_seeds")]
    emitted += [next(nstep) for _ in range(10)]  # iterating again resynchronises
    assert [len(seeds) for seeds in env_attr(env, "reset_seeds")] > resets_before
    assert all(len(seeds) >= 2 for seeds in env_attr(env, "reset_seeds")), "every sub-env was reset"
    emitted.append(nstep.flush())
    records = env_attr(env, "record")
    codes = check_rows(emitted, records, n, 0.9, offset=3)
    # only the crashed vector step is lost: env 0 and 2 stepped in it, env 1 raised after stepping
    assert len(recorded_codes(records) - set(codes.tolist())) <= 3


@pytest.mark.filterwarnings("ignore:.*(error from Worker|Traceback|Raising the last exception):UserWarning")
@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_async_env_crash_names_sub_env_then_asks_to_rebuild(mode):
    layouts = [[(4, TERM)], [(2, TRUNC), (6, TERM)]]
    env = crashing_vector_env(layouts, mode, crash_env=1, crash_at=3, asynchronous=True)
    try:
        source = ExperienceSource(env, Agent(2, seed=3), seed=3)
        nstep = NStepTransform(source, 2, 0.9)
        emitted = []
        with pytest.raises(ValueError, match="env 1 broke") as info:
            for _ in range(6):
                emitted.append(next(nstep))
        note = " ".join(getattr(info.value, "__notes__", []))
        assert "sub-env 1" in note and "build a new env" in note
        with pytest.raises(
            RuntimeError, match=r"closed.*sub-env\(s\) \[1\].*Build a new env and a new ExperienceSource"
        ):
            next(nstep)
        with pytest.raises(RuntimeError, match="Build a new env"):  # and again: no AttributeError
            next(nstep)
    finally:
        env.close(terminate=True)


def test_closed_env_asks_to_rebuild():
    env = make_env([[(3, TERM)]], "NextStep")
    source = ExperienceSource(env, Agent(1), seed=0)
    next(source)
    env.close()
    source.load_state_dict(source.state_dict())  # forces a reset on the next call
    with pytest.raises(RuntimeError, match="closed and cannot be stepped again. Build a new env"):
        next(source)


def test_async_interrupt_between_step_calls_is_drained():
    """A KeyboardInterrupt after step_async, before step_wait: the late answers must not be read as the next step's."""
    layouts = [[(5, TERM), (3, TRUNC)], [(4, TRUNC), (2, TERM)]]
    env = make_env(layouts, "NextStep", asynchronous=True, reward_seed=7)
    try:
        source = ExperienceSource(env, Agent(2, seed=7), seed=7)
        nstep = NStepTransform(source, 3, 0.8)
        emitted = [next(nstep) for _ in range(2)]
        real_wait = env.step_wait

        def interrupted_wait(*args: Any, **kwargs: Any) -> Any:
            env.step_wait = real_wait
            raise KeyboardInterrupt

        env.step_wait = interrupted_wait
        with pytest.raises(KeyboardInterrupt):
            next(nstep)
        emitted += [next(nstep) for _ in range(8)]
        emitted.append(nstep.flush())
        records = env_attr(env, "record")
        codes = check_rows(emitted, records, 3, 0.8)
        assert len(recorded_codes(records) - set(codes.tolist())) <= 2
    finally:
        env.close()


# ---------------------------------------------------------------------- non-finite values
class NonFiniteEnv(ScriptedEnv):
    """Returns ``value`` as the reward, or in the float observation field, at its ``at``-th step."""

    def __init__(self, *args: Any, at: int = -1, field: str = "reward", value: float = float("nan"), **kw: Any):
        super().__init__(*args, **kw)
        self.at, self.field, self.value, self.calls = at, field, value, 0

    def step(self, action: Any) -> Any:
        self.calls += 1
        obs, reward, term, trunc, info = super().step(action)
        if self.calls == self.at:
            if self.field == "reward":
                reward = self.value
            else:
                obs = {"id": obs["id"], "pos": np.array([self.value, 0.0], dtype=np.float32)}
        return obs, reward, term, trunc, info


def non_finite_env(field, value, mode="SameStep"):
    fns = [
        functools.partial(
            NonFiniteEnv, i, [(3, TERM), (9, TRUNC)], dict_obs=True, at=4 if i == 2 else -1, field=field, value=value
        )
        for i in range(3)
    ]
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))


@pytest.mark.parametrize(
    ("field", "value", "name"),
    [
        ("reward", float("nan"), "reward"),
        ("reward", float("inf"), "reward"),
        ("obs", float("-inf"), "next_obs.pos"),
        ("obs", float("nan"), "next_obs.pos"),
    ],
)
def test_non_finite_values_raise_naming_field_and_sub_env(field, value, name):
    env = non_finite_env(field, value)
    source = ExperienceSource(env, Agent(3), seed=0)
    nstep = NStepTransform(source, 2, 0.9)
    with pytest.raises(FloatingPointError, match=rf"non-finite {name} .* sub-env\(s\) \[2\].*check_finite=False"):
        for _ in range(6):
            next(nstep)
    for _ in range(4):  # the pipeline carries on (every sub-env reset)
        out = next(nstep)
        assert np.isfinite(out["reward"]).all() and np.isfinite(out["next_obs"]["pos"]).all()


class FloatObsEnv(gym.Env):
    """Box float32 observations (the fast path of the check); ``value`` in the obs or reward at step ``at``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, at: int = -1, field: str = "obs", value: float = float("nan")) -> None:
        self.at, self.field, self.value, self.t = at, field, value, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        obs, reward = np.full(3, self.t, np.float32), 1.0
        if self.t == self.at:
            obs[1] = self.value if self.field == "obs" else obs[1]
            reward = self.value if self.field == "reward" else reward
        return obs, reward, self.t % 7 == 0, False, {}


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize(("field", "name"), [("obs", "next_obs"), ("reward", "reward")])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_in_float_array_observations(mode, field, name, value):
    fns = [functools.partial(FloatObsEnv, at=5 if i == 1 else -1, field=field, value=value) for i in range(2)]
    env = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))
    source = ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0, rank=1)
    for _ in range(4):
        next(source)
    with pytest.raises(FloatingPointError, match=rf"non-finite {name} .*sub-env\(s\) \[1\] \(env_id \[3\]\)"):
        next(source)
    assert np.isfinite(next(source)["next_obs"]).all()


def test_non_finite_check_can_be_turned_off():
    env = non_finite_env("reward", float("nan"))
    source = ExperienceSource(env, Agent(3), seed=0, check_finite=False)
    rewards = np.concatenate([next(source)["reward"] for _ in range(6)])
    assert np.isnan(rewards).sum() == 1


def test_huge_finite_values_pass_the_check():
    # huge but finite observations are no error (and give no overflow warning)
    env = non_finite_env("obs", 1e30)
    source = ExperienceSource(env, Agent(3), seed=0)
    assert sum(len(next(source)) for _ in range(6)) > 0


# ---------------------------------------------------------------------- bounded bookkeeping
def test_pending_episodes_are_bounded():
    env = make_env([[(1, TERM)] * 400, [(1, TRUNC)] * 400], "SameStep")
    source = ExperienceSource(env, ScriptedAgent(2), seed=0, max_pending_episodes=50)
    for _ in range(300):
        next(source)
        assert len(source._episodes._pending) <= 50
    assert source.episodes_finished == 600
    episodes = source.pop_episodes()
    assert len(episodes) == 50 and episodes[-1].total_steps == source.total_steps  # the newest are kept
    assert source.pop_episodes() == []
    assert ExperienceSource(env, ScriptedAgent(2))._episodes._pending.maxlen == 10_000
    with pytest.raises(ValueError, match="max_pending_episodes"):
        ExperienceSource(env, ScriptedAgent(2), max_pending_episodes=0)


# ---------------------------------------------------------------------- n = 1
def test_n1_is_a_pass_through_with_the_transform_gamma():
    layouts = [[(3, TERM), (2, TRUNC)], [(4, BOTH)]]
    env = make_env(layouts, "NextStep", reward_seed=5)
    source = ExperienceSource(env, ScriptedAgent(2, seed=5), gamma=0.9, seed=5)
    nstep = NStepTransform(source, 1, 0.5)
    emitted = []
    for _ in range(4):
        batch = next(nstep)
        assert batch["discount"].dtype == np.float32 and (batch["discount"] == 0.5).all()
        emitted.append(batch)
    state = nstep.state_dict()
    next(source)  # a peek: nothing to close with n=1
    restored = NStepTransform(source, 1, 0.5)
    restored.load_state_dict(state)
    emitted += [next(restored) for _ in range(4)]
    emitted.append(restored.flush())
    check_rows(emitted, env_attr(env, "record"), 1, 0.5)
    # recorded input: float64 rewards become float32
    rec = TransitionBatch(concat_batches(emitted[:2]))
    rec["reward"] = rec["reward"].astype(np.float64)
    out = NStepTransform(None, 1, 0.25).fold(rec)
    assert out["reward"].dtype == np.float32 and (out["discount"] == 0.25).all()
    assert ptl_rl.NStepTransform(None, 1, 0.25).flush() is None


# ---------------------------------------------------------------------- replay buffer writes
def _rows(ids: Sequence[int]) -> TransitionBatch:
    """Rows whose every field holds the row's id, so a row mixed from two writes shows."""
    ids = np.asarray(ids, dtype=np.int64)
    return TransitionBatch(
        obs=np.stack([ids, ids], 1).astype(np.float32),
        action=ids.copy(),
        reward=ids.astype(np.float32),
        next_obs=np.stack([ids, ids], 1).astype(np.float32),
        terminated=ids % 2 == 0,
        truncated=ids % 3 == 0,
        discount=ids.astype(np.float32),
        env_id=ids.copy(),
    )


@pytest.mark.parametrize("then", ["add", "sample"])
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_replay_add_interrupted_between_fields_is_redone_in_full(kind, then):
    import ptl_rl

    ReplayBuffer = ptl_rl.ReplayBuffer if kind == "uniform" else ptl_rl.PrioritizedReplayBuffer  # noqa: N806
    storage_file = sys.modules["ptl_rl.replay.storage"].__file__
    injector = Injector({"storage": lambda code: code.co_filename == storage_file})
    clean = ReplayBuffer(None, capacity=4)
    clean.add(_rows([1, 2, 3, 4]))
    injector.run(lambda: clean.add(_rows([5, 6, 7])))
    lines = injector.counts["storage"]
    assert lines > 5
    for k in range(1, lines + 1):  # every line of a wrapped add
        buffer = ReplayBuffer(None, capacity=4)
        buffer.add(_rows([1, 2, 3, 4]))
        with pytest.raises(KeyboardInterrupt):
            injector.run(lambda: buffer.add(_rows([5, 6, 7])), "storage", k, KeyboardInterrupt())  # noqa: B023
        if then == "add":
            buffer.add(_rows([8]))  # smaller than the interrupted batch: cannot hide a mixed row by overwriting it
        else:  # a buffer filled by hand in a notebook, sampled right after the interrupted add
            buffer.sample(2)
        stored = buffer.storage.gather(np.arange(len(buffer)))
        ids = stored["env_id"]
        for name in ("action", "reward", "discount"):
            np.testing.assert_array_equal(stored[name], ids, err_msg=f"line {k}: {name}")
        np.testing.assert_array_equal(stored["obs"], np.stack([ids, ids], 1), err_msg=f"line {k}")
        np.testing.assert_array_equal(stored["next_obs"], np.stack([ids, ids], 1), err_msg=f"line {k}")
        np.testing.assert_array_equal(stored["terminated"], ids % 2 == 0, err_msg=f"line {k}")
        np.testing.assert_array_equal(stored["truncated"], ids % 3 == 0, err_msg=f"line {k}")
        # nothing of the interrupted batch is lost, and the ring order is kept
        assert sorted(ids.tolist()) == ([5, 6, 7, 8] if then == "add" else [4, 5, 6, 7]), f"line {k}"


# ---------------------------------------------------------------------- sequence replay
def check_windows_continuous(buffer: Any) -> int:
    """Every window the buffer can sample is consecutive steps of one episode; returns how many there are.

    A ScriptedEnv's observation names (env, episode, step), so inside an episode the ``next_obs`` of a
    step is the ``obs`` of the next one; across a cut (a reset without an episode end, or lost steps) it is not.
    """
    starts = np.flatnonzero(buffer.draws.tree.leaves[: len(buffer)] > 0)
    slots, mask = buffer.draws.window_slots(starts)
    stored = buffer.storage.gather(slots.reshape(-1))
    obs = obs_code(ids_of(stored["obs"])).reshape(slots.shape)
    next_obs = obs_code(ids_of(stored["next_obs"])).reshape(slots.shape)
    done = (stored["terminated"] | stored["truncated"]).reshape(slots.shape)
    pairs = mask[:, :-1] & mask[:, 1:]  # positions t and t+1 both hold real steps
    assert (next_obs[:, :-1] == obs[:, 1:])[pairs].all(), "a window joins steps that do not follow each other"
    assert not done[:, :-1][pairs].any(), "a window continues past an episode end"
    return len(starts)


@pytest.mark.parametrize(("via_nstep", "fault_in"), [(False, "env"), (True, "env"), (True, "stages")])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_sequence_windows_never_span_a_cut_upstream(mode, via_nstep, fault_in):
    """Peeks at the source and interrupts (inside the env, or anywhere in the source, n-step and buffer code)
    cut the envs' streams or lose pulled batches; windows must not span a cut."""
    layouts = [[(40, TERM), (30, TRUNC)], [(25, TRUNC), (50, TERM)], [(60, BOTH)]]
    env = make_env(layouts, mode, reward_seed=3)
    source = ExperienceSource(env, Agent(3, seed=3), seed=3)
    upstream = NStepTransform(source, 1, 0.9) if via_nstep else source
    # 3 rows a yield: every next() pulls a vector step
    buffer = ptl_rl.SequenceReplayBuffer(upstream, capacity=512, length=4, burn_in=2, warmup=0, transitions_per_yield=3)
    injector = Injector(TARGETS)
    rng = np.random.default_rng(3)
    cuts = 0
    for i in range(150):
        if i % 15 == 5:
            next(source)  # a peek: the buffer never sees that step
            cuts += 1
        elif i % 15 == 12:
            with pytest.raises(KeyboardInterrupt):
                # a few next() calls: one of them pulls from upstream (the others spend credit)
                calls = lambda: [next(buffer) for _ in range(6)]  # noqa: E731, B023
                if fault_in == "env":
                    where = int(rng.integers(1, 4))
                else:  # anywhere in the lines a clean call runs
                    injector.run(calls)
                    where = 1 + int(rng.integers(injector.counts["stages"]))
                injector.run(calls, fault_in, where, KeyboardInterrupt())
            cuts += 1
        else:
            next(buffer)
    assert cuts == 20
    assert check_windows_continuous(buffer) > 100


def _sequence_batches() -> list[TransitionBatch]:
    """Steps of 3 envs with episode ends, in batches of one row per env and of several rows per env."""
    rng = np.random.default_rng(5)
    step, episode = np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64)
    batches = []
    for b in range(14):
        envs = np.array([0, 1, 2]) if b % 3 else rng.integers(0, 3, size=5)  # repeated envs: the grouped path
        ids, next_ids, term, trunc = [], [], [], []
        for e in envs:
            ids.append((e, episode[e], step[e]))
            end = rng.random() < 0.15
            next_ids.append((e, episode[e], step[e] + 1))
            term.append(end and rng.random() < 0.5)
            trunc.append(end and not term[-1])
            step[e], episode[e] = (0, episode[e] + 1) if end else (step[e] + 1, episode[e])
        count = len(envs)
        batches.append(
            TransitionBatch(
                obs=np.array(ids, dtype=np.int64),
                action=np.arange(count, dtype=np.int64),
                reward=rng.random(count).astype(np.float32),
                next_obs=np.array(next_ids, dtype=np.int64),
                terminated=np.array(term),
                truncated=np.array(trunc),
                discount=np.full(count, 0.9, dtype=np.float32),
                env_id=envs.astype(np.int64),
            )
        )
    return batches


def _sequence_state(buffer: Any) -> dict[str, np.ndarray]:
    stored = buffer.storage.gather(np.arange(len(buffer)))
    return {
        **{name: np.asarray(stored[name]) for name in stored.keys()},
        "next_slot": buffer.draws.next_slot,
        "prev_slot": buffer.draws.prev_slot,
        "leaves": buffer.draws.tree.leaves[: buffer.capacity],
        "generations": buffer.draws.generations,
        "env_steps": buffer.draws._env_steps,
        "episode_start": buffer.draws._episode_start,
    }


@pytest.mark.parametrize(("prioritized", "pad_end"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize(
    "target", ["ptl_rl.replay.windows", "ptl_rl.replay.buffer", "ptl_rl.replay.sequence_links", "ptl_rl.replay.storage"]
)
def test_sequence_add_interrupted_anywhere_is_redone_in_full(target, prioritized, pad_end):
    """An interrupt at any line of an add (storage write or linking) changes nothing once the next add ran."""
    batches = _sequence_batches()
    target_file = sys.modules[target].__file__
    injector = Injector({"target": lambda code: code.co_filename == target_file})

    def build() -> Any:
        return ptl_rl.SequenceReplayBuffer(
            None, capacity=16, length=3, burn_in=1, pad_end=pad_end, prioritized=prioritized, warmup=0
        )

    clean = build()
    for batch in batches:
        clean.add(batch)
    ends = [bool((b["terminated"] | b["truncated"]).any()) for b in batches]
    # with pad_end, an add that ends an episode (its tail starts are added then)
    wrap = next(
        i
        for i in range(len(batches))
        if sum(map(len, batches[: i + 1])) > 16 and (ends[i] if pad_end else len(batches[i]) == 5)
    )
    reference = build()
    for batch in batches[:wrap]:
        reference.add(batch)
    injector.run(lambda: reference.add(batches[wrap]))
    lines = injector.counts["target"]
    assert lines >= 8  # (the add and its write in buffer.py; the linking and the storage write in their modules)
    # an interrupt before the add has recorded anything leaves it undone, as if it had never been called
    never_called = build()
    for batch in batches[:wrap] + batches[wrap + 1 :]:
        never_called.add(batch)
    outcomes = {"done": _sequence_state(clean), "undone": _sequence_state(never_called)}
    seen = []
    for k in range(1, lines + 1):
        buffer = build()
        for batch in batches[:wrap]:
            buffer.add(batch)
        with pytest.raises(KeyboardInterrupt):
            injector.run(lambda: buffer.add(batches[wrap]), "target", k, KeyboardInterrupt())  # noqa: B023
        for batch in batches[wrap + 1 :]:
            buffer.add(batch)
        got = _sequence_state(buffer)
        same = [name for name, state in outcomes.items() if all(np.array_equal(got[f], v) for f, v in state.items())]
        assert same, f"line {k}: the interrupted add was neither completed nor left undone"
        seen.append(same[0])
    # only the first lines of add (argument checks, before the record) may leave it undone
    undone = [k for k, outcome in enumerate(seen, 1) if outcome == "undone"]
    first_lines = 20 if target.endswith(("windows", "buffer")) else 0  # (the strategy's checks, the buffer's add)
    assert undone == list(range(1, len(undone) + 1)) and len(undone) <= first_lines, seen


def test_an_add_interrupted_while_allocating_allocates_again():
    """The first add allocates the ring; an interrupt there must not leave a half-built storage for good."""
    target_file = importlib.import_module("ptl_rl.replay.storage").__file__
    injector = Injector({"target": lambda code: code.co_filename == target_file})
    clean = ReplayBuffer(None, capacity=4, warmup=0)
    injector.run(lambda: clean.add(_rows([1, 2])))
    assert injector.counts["target"] > 10
    for k in range(1, injector.counts["target"] + 1):
        buffer = ReplayBuffer(None, capacity=4, warmup=0)
        with pytest.raises(KeyboardInterrupt):
            injector.run(lambda: buffer.add(_rows([1, 2])), "target", k, KeyboardInterrupt())  # noqa: B023
        buffer.add(_rows([3]))
        stored = buffer.storage.gather(np.arange(len(buffer)))
        assert sorted(stored["env_id"].tolist()) == [1, 2, 3], f"line {k}"
        np.testing.assert_array_equal(stored["action"], stored["env_id"], err_msg=f"line {k}")

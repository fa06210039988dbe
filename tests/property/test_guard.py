"""The one safety mechanism (``ptl_rl.core.guard``): a stage written naively gets every guarantee.

The stage below changes its state in several statements, takes no care about
interrupts, numbers nothing and knows no rule: it subclasses ``ptl_rl.Stage``
and implements ``step()``. Faults (``KeyboardInterrupt`` and other exceptions)
at every line of its step, of the guard and of the stages around it must leave
(1) its own state consistent, as if each step had run whole or not at all,
and (2) every n-step row downstream right, checked row by row against the
scripted envs' records, because a batch it lost is a cut in its stream. The
same stage written as a plain iterator, without the base class, is shown to
break both, so the checks can fail.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import CodeType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_env import TERM, TRUNC, env_attr, make_env
from test_robustness import Agent, InjectedFault, Injector, Recorder, check_rows

import ptl_rl
from ptl_rl import ExperienceSource, NStepTransform, TransitionBatch


class NaiveTally(ptl_rl.Stage[TransitionBatch]):
    """Passes batches on and tallies them, in four statements a cut could separate (no safety code at all)."""

    def __init__(self, upstream: Any) -> None:
        super().__init__(upstream)
        self.batches = 0
        self.sizes: list[int] = []
        self.rows = 0
        self.reward = 0.0

    def step(self) -> TransitionBatch:
        batch = self.pull()
        self.batches += 1
        self.sizes.append(len(batch))
        self.rows += len(batch)
        self.reward += float(np.asarray(batch.reward, dtype=np.float64).sum())
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "sizes": list(self.sizes), "rows": self.rows, "reward": self.reward}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches, self.sizes = state["batches"], list(state["sizes"])
        self.rows, self.reward = state["rows"], state["reward"]


class PlainTally:
    """The same tally as a plain iterator with an ``upstream``: walked by the chain, but no guard."""

    def __init__(self, upstream: Any) -> None:
        self.upstream = upstream
        self.batches, self.sizes, self.rows, self.reward = 0, [], 0, 0.0

    def __iter__(self) -> PlainTally:
        return self

    def __next__(self) -> TransitionBatch:
        return NaiveTally.step(self)  # type: ignore[arg-type]  # the very same statements

    def pull(self) -> TransitionBatch:
        return next(self.upstream)


def consistent(tally: Any) -> bool:
    """Whether the four tallies agree: no step was half recorded."""
    return tally.batches == len(tally.sizes) and tally.rows == sum(tally.sizes)


GUARD_FILES = tuple(importlib.import_module(m).__file__ for m in ("ptl_rl.core.guard", "ptl_rl.core.stage"))
STAGE_FILES = tuple(
    importlib.import_module(m).__file__
    for m in ("ptl_rl.stages.source", "ptl_rl.stages.nstep", "ptl_rl.stages.nstep_windows", "ptl_rl.core.batch")
)
TALLY_CODE = {NaiveTally.step.__code__}
TARGETS: dict[str, Callable[[CodeType], bool]] = {
    "tally": lambda code: code in TALLY_CODE,
    "guard": lambda code: code.co_filename in GUARD_FILES,
    "stages": lambda code: code.co_filename in STAGE_FILES,
}

episode_st = st.tuples(st.integers(1, 5), st.sampled_from([TERM, TRUNC]))
fault_st = st.tuples(st.sampled_from(["tally", "guard", "stages"]), st.floats(0.0, 1.0), st.booleans())


def run_with_faults(tally_class: type, layouts: list, n: int, calls: list, seed: int) -> tuple[Any, Any, list, int]:
    """Source -> tally -> n-step -> recorder, a fault (or none) per call; returns (tally, env, emitted, faults)."""
    env = make_env(layouts, "NextStep", reward_seed=seed)
    source = ExperienceSource(env, Agent(len(layouts), seed=seed), seed=seed)
    tally = tally_class(source)
    nstep = NStepTransform(tally, n, 0.9)
    recorder = Recorder(nstep)
    injector = Injector(TARGETS)
    lines = dict.fromkeys(TARGETS, 0)
    faults = 0
    for call in calls:
        if call is None or not lines[call[0]]:
            injector.run(functools.partial(next, recorder))
            lines = {kind: max(lines[kind], count) for kind, count in injector.counts.items()}
            continue
        target, where, interrupt = call
        exc = KeyboardInterrupt() if interrupt else InjectedFault()
        try:
            injector.run(functools.partial(next, recorder), target, 1 + int(where * lines[target]), exc)
        except (KeyboardInterrupt, InjectedFault) as raised:
            assert raised is exc
            faults += 1
    for _ in range(3):  # the chain keeps working after the faults
        next(recorder)
    return tally, env, [*recorder.batches, nstep.flush()], faults


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layouts=st.lists(st.lists(episode_st, min_size=2, max_size=6), min_size=1, max_size=3),
    n=st.integers(2, 4),
    calls=st.lists(st.none() | fault_st, min_size=4, max_size=20),
    seed=st.integers(0, 2**16),
)
def test_a_naive_stage_gets_every_guarantee(layouts, n, calls, seed) -> None:
    tally, env, emitted, faults = run_with_faults(NaiveTally, layouts, n, calls, seed)
    assert consistent(tally), (tally.batches, tally.sizes, tally.rows)
    check_rows(emitted, env_attr(env, "record"), n, 0.9)  # a batch the tally lost never joins two windows
    assert tally.stream_seq >= tally.batches  # numbered by the guard, skipping one per cut
    env.close()


def test_every_line_of_the_naive_step_and_of_the_guard() -> None:
    """Deterministic sweep: a KeyboardInterrupt at each line, in turn, of the tally's step and of the guard."""
    layouts = [[(3, TERM), (4, TRUNC), (2, TERM)], [(5, TERM), (1, TERM), (3, TRUNC)]]
    for target, lines in (("tally", 6), ("guard", 30)):
        for k in range(1, lines + 1):
            calls = [None, None, (target, k / lines, True), None, None]
            tally, env, emitted, _ = run_with_faults(NaiveTally, layouts, 3, calls, seed=k)
            assert consistent(tally), (target, k)
            check_rows(emitted, env_attr(env, "record"), 3, 0.9)
            env.close()


def test_without_the_base_class_the_same_stage_breaks() -> None:
    """The control: the plain-iterator tally, cut between two of its statements, is left inconsistent."""
    env = make_env([[(6, TERM), (6, TRUNC)], [(6, TERM), (6, TERM)]], "NextStep", reward_seed=0)
    tally = PlainTally(ExperienceSource(env, Agent(2, seed=0), seed=0))
    injector = Injector({"tally": lambda code: code in TALLY_CODE})
    next(tally)
    with pytest.raises(KeyboardInterrupt):  # after the pull and the first tally: half counted
        injector.run(functools.partial(next, tally), "tally", 3, KeyboardInterrupt())
    assert not consistent(tally)
    env.close()


@pytest.mark.parametrize("tally_class", [NaiveTally, PlainTally])
def test_a_peek_at_the_stage_is_a_cut_downstream_only_with_the_base_class(tally_class: type) -> None:
    """``next()`` on the tally behind the n-step's back (a notebook peek) loses a batch for the n-step: the
    guard numbers the tally's outputs, so the n-step sees the skipped number and closes its windows. Without
    the base class nothing tells it, and its windows join steps across the missing one: wrong rows."""
    env = make_env([[(7, TERM), (7, TRUNC)], [(7, TERM), (7, TERM)]], "NextStep", reward_seed=0)
    tally = tally_class(ExperienceSource(env, Agent(2, seed=0), seed=0))
    recorder = Recorder(NStepTransform(tally, 3, 0.9))
    for _ in range(2):
        next(recorder)
    next(tally)  # the peek, mid-episode
    for _ in range(4):
        next(recorder)
    records = env_attr(env, "record")
    if tally_class is NaiveTally:
        check_rows(recorder.batches, records, 3, 0.9)
    else:
        with pytest.raises(AssertionError):
            check_rows(recorder.batches, records, 3, 0.9)
    env.close()


def test_the_guard_restores_a_step_cut_inside_a_restore() -> None:
    """A cut inside the restore itself leaves the record open: the restore runs again on the next call."""
    env = make_env([[(4, TERM), (4, TERM)]], "NextStep")
    tally = NaiveTally(ExperienceSource(env, Agent(1), seed=0))
    next(tally)
    injector = Injector({"tally": lambda code: code in TALLY_CODE})
    with pytest.raises(KeyboardInterrupt):
        injector.run(functools.partial(next, tally), "tally", 4, KeyboardInterrupt())
    restore_code = {NaiveTally.load_state_dict.__code__}
    cut_restore = Injector({"restore": lambda code: code in restore_code})
    with pytest.raises(KeyboardInterrupt):  # the restore of that step, cut after its first statement
        cut_restore.run(functools.partial(next, tally), "restore", 2, KeyboardInterrupt())
    before = tally.stream_seq
    next(tally)  # restores again (whole this time), then steps
    assert consistent(tally) and tally.batches == 2
    assert tally.stream_seq == before + 2  # the output after the cut skips a number
    env.close()

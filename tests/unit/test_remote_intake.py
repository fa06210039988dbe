"""The learner's intake of collector messages: a message is counted whole or not at all, whatever cuts its intake."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from faults import InjectedFault, Injector

from ptl_rl import TransitionBatch
from ptl_rl.core.episode import Episode
from ptl_rl.distributed.intake import Intake

FILES = tuple(importlib.import_module(m).__file__ for m in ("ptl_rl.distributed.intake", "ptl_rl.core.guard"))


def message(i: int) -> tuple[TransitionBatch, int, list[Episode]]:
    """Message ``i``: 3 rows of versions 0..2, ``i + 1`` env steps, an episode every other message."""
    batch = TransitionBatch(policy_version=np.array([0, 1, 2]) + i // 4, reward=np.full(3, float(i), np.float32))
    episodes = [Episode(float(i), i + 1, i % 3, 0)] if i % 2 else []
    return batch, i + 1, episodes


def state(intake: Intake, popped: list[Episode]) -> tuple[object, ...]:
    counters = intake.counters
    return (
        counters.total_steps,
        counters.episodes_finished,
        counters.recent_episodes(),
        popped + counters.pop_episodes(),
        intake.staleness.stats(),
    )


@pytest.mark.parametrize("fault", [KeyboardInterrupt, InjectedFault])
def test_a_message_whose_intake_is_cut_anywhere_is_counted_once_whole(fault: type[BaseException]) -> None:
    """Cut at every line of take() (and of the journal under it), then read: the counters are those of every
    message counted exactly once, the cut one whole (or, cut before its write began, not at all); the next
    message is taken in as usual."""
    expected = {}
    for counted in (True, False):
        clean = Intake(stats_window=4, max_staleness=1)
        for i in range(6):
            if i != 3 or counted:
                clean.take(*message(i), version=2)
        expected[counted] = state(clean, [])
    outcomes = []
    injector = Injector({"intake": lambda code: code.co_filename in FILES})
    probe = Intake(stats_window=4, max_staleness=1)
    injector.run(lambda: probe.take(*message(1), version=2))
    lines = injector.counts["intake"]
    assert lines > 5
    for k in range(1, lines + 1):
        intake, popped = Intake(stats_window=4, max_staleness=1), []
        for i in range(6):
            if i == 3:
                with pytest.raises(fault):
                    injector.run(lambda: intake.take(*message(3), version=2), "intake", k, fault())  # noqa: B023
                popped += intake.counters.pop_episodes()  # a read between the cut and the next message
            else:
                kept = intake.take(*message(i), version=2)
                assert np.asarray(kept["policy_version"]).min() >= 1  # rows two versions behind are dropped
        got = state(intake, popped)
        assert got in expected.values(), f"cut at line {k}"
        outcomes.append(got == expected[True])
    # uncounted only when cut before the journal opened its write: the first few lines, then counted for good
    assert outcomes == sorted(outcomes) and sum(outcomes) > len(outcomes) // 2, outcomes


def test_a_load_replaces_a_cut_intake() -> None:
    """A state loaded after a cut intake is what the counters hold: the cut message is not counted over it."""
    intake = Intake(stats_window=4, max_staleness=None)
    intake.take(*message(0), version=0)
    saved = intake.state_dict()
    injector = Injector({"intake": lambda code: code.co_filename in FILES})
    with pytest.raises(KeyboardInterrupt):
        injector.run(lambda: intake.take(*message(1), version=0), "intake", 4, KeyboardInterrupt())
    intake.load_state_dict(saved)
    assert intake.state_dict() == saved

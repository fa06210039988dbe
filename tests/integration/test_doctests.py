"""Runs the ``Examples:`` sections of the public docstrings as doctests.

Each example is a test of its own (``-k ReplayBuffer`` selects one), so the README's test command runs them and a
failure names the object whose example broke. The examples use tiny envs and few steps; their outputs are exact
(seeded), with ``NORMALIZE_WHITESPACE`` so long outputs can wrap.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

# The modules whose public docstrings carry examples. A module added here has all its examples run.
MODULES = [
    "ptl_rl.agents.dqn",
    "ptl_rl.core.batch",
    "ptl_rl.replay.her",
    "ptl_rl.replay.prioritized",
    "ptl_rl.replay.buffer",
    "ptl_rl.replay.rollout",
    "ptl_rl.replay.sequence",
    "ptl_rl.replay.draws",
    "ptl_rl.replay.priority_draws",
    "ptl_rl.replay.windows",
    "ptl_rl.replay.hindsight",
    "ptl_rl.lightning.adapter",
    "ptl_rl.stages.nstep",
    "ptl_rl.agents.recurrent",
    "ptl_rl.replay.sampler",
    "ptl_rl.stages.source",
    "ptl_rl.lightning.video_recording",
    "ptl_rl.normalization.normalizer",
    "ptl_rl.stages.normalize",
]

# Objects that must keep an example: losing one (a docstring rewritten during a merge) fails the suite.
REQUIRED = {
    "ptl_rl.agents.dqn.DQNAgent",
    "ptl_rl.core.batch.TransitionBatch",
    "ptl_rl.replay.her.HERReplayBuffer",
    "ptl_rl.replay.prioritized.PrioritizedReplayBuffer",
    "ptl_rl.replay.buffer.ReplayBuffer",
    "ptl_rl.replay.rollout.RolloutBuffer",
    "ptl_rl.replay.sequence.SequenceReplayBuffer",
    "ptl_rl.replay.draws.UniformDraws",
    "ptl_rl.replay.priority_draws.PrioritizedDraws",
    "ptl_rl.replay.windows.SequenceWindows",
    "ptl_rl.replay.hindsight.HindsightGoals",
    "ptl_rl.lightning.adapter.to_dataloader",
    "ptl_rl.stages.nstep.NStepTransform",
    "ptl_rl.agents.recurrent.RecurrentCore",
    "ptl_rl.replay.sampler.BatchSampler",
    "ptl_rl.stages.source.ExperienceSource",
    "ptl_rl.lightning.video_recording.record_episodes",
    "ptl_rl.normalization.normalizer.ObservationNormalizer",
    "ptl_rl.stages.normalize.NormalizeObservations",
}

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _examples() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = []
    for name in MODULES:
        module = importlib.import_module(name)
        tests += [t for t in finder.find(module, name) if t.examples]
    return sorted(tests, key=lambda t: t.name)


EXAMPLES = _examples()


def test_every_main_class_has_an_example():
    missing = REQUIRED - {t.name for t in EXAMPLES}
    assert not missing, f"these docstrings lost their Examples: section: {sorted(missing)}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[t.name for t in EXAMPLES])
def test_docstring_example(example: doctest.DocTest) -> None:
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    output: list[str] = []
    # a fresh namespace per example: examples import what they use and share nothing
    example.globs = {}
    result = runner.run(example, out=output.append)
    assert result.failed == 0, f"{result.failed} of {result.attempted} lines of the example failed:\n" + "".join(output)

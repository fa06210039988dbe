"""EpisodeIndex: a loaded state replaces every array and counter, and a plan applied twice is applied once."""

from __future__ import annotations

import numpy as np

from ptl_rl.replay.episodes import _INDEX_STATE, EpisodeIndex
from ptl_rl.replay.sumtree import SumTree


def _filled(capacity: int, steps: int, seed: int) -> tuple[EpisodeIndex, SumTree]:
    """An index of ``capacity`` slots after ``steps`` adds of 2 envs whose episodes end at random."""
    index, tree, rng = EpisodeIndex(capacity), SumTree(capacity), np.random.default_rng(seed)
    env = np.arange(2)
    for t in range(steps):
        slots = (2 * t + env) % capacity
        index.apply(index.plan_add(slots, env, rng.random(2) < 0.3), tree)
    return index, tree


def _fields(index: EpisodeIndex) -> dict[str, object]:
    return {name: np.asarray(value).copy() for name, value in vars(index).items()}


def test_the_loaded_state_names_every_attribute_but_the_capacity() -> None:
    assert set(vars(EpisodeIndex(4))) == {"capacity", *_INDEX_STATE}


def test_a_loaded_state_replaces_everything_the_index_held() -> None:
    source, _ = _filled(16, 30, seed=1)
    target, _ = _filled(16, 7, seed=2)
    target.load_state_dict(source.state_dict(size=16))
    got, want = _fields(target), _fields(source)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_plan_applied_again_after_a_cut_changes_nothing_more() -> None:
    once, tree = _filled(16, 12, seed=3)
    twice, tree2 = _filled(16, 12, seed=3)
    slots, env, done = np.array([8, 9]), np.arange(2), np.array([True, False])
    once.apply(once.plan_add(slots, env, done), tree)
    plan = twice.plan_add(slots, env, done)
    twice.apply(plan, tree2)
    twice.apply(plan, tree2)  # the journal's redo after a cut anywhere inside the first apply
    for name, value in _fields(once).items():
        np.testing.assert_array_equal(_fields(twice)[name], value, err_msg=name)
    np.testing.assert_array_equal(tree2.leaves, tree.leaves)

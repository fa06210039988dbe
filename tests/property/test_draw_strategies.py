"""A replay buffer is a storage and a draw strategy: the named buffers are that composition, and any strategy with
the members of ``ptl_rl.core.protocols.DrawStrategy`` works, a user's own included."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch
from replay_checkpoint import reward, rows
from stats import SIGNIFICANCE, chi_square_quantile, chi_square_statistic

import ptl_rl
from ptl_rl.core.protocols import (
    DrawStrategy,
    EpisodeDrawStrategy,
    EpochDrawStrategy,
    PriorityDrawStrategy,
    Storage,
)


def same(a: Any, b: Any, path: str = "") -> None:
    """Deep equality of batches and states: dicts, lists, tensors, arrays, plain values."""
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping) and sorted(a) == sorted(b), path
        for key in a:
            same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, (torch.Tensor, np.ndarray)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
        assert np.asarray(a).dtype == np.asarray(b).dtype, path
    else:
        assert a == b, path


def run(buffer: ptl_rl.ReplayBuffer, prioritized: bool) -> list[Any]:
    """Adds that wrap the ring, samples, priority feedback; every batch and the final state."""
    feedback = np.random.default_rng(1)
    out: list[Any] = []
    for start, count in ((0, 15), (15, 12), (27, 9), (36, 30)):
        buffer.add(rows(start, count))
        for _ in range(3):
            batch = buffer.sample(5)
            out.append(dict(batch.items()))
            if prioritized:
                out.append(batch.update_priorities(feedback.standard_normal(len(batch))))
    out.append(buffer.state_dict())
    return out


#: name -> (the named constructor, the composition it stands for, whether it takes priorities)
PAIRS: dict[str, tuple[Callable[[], ptl_rl.ReplayBuffer], Callable[[], ptl_rl.ReplayBuffer], bool]] = {
    "prioritized": (
        lambda: ptl_rl.PrioritizedReplayBuffer(None, 24, alpha=0.7, beta=0.5, eps=1e-3, warmup=0, seed=3),
        lambda: ptl_rl.ReplayBuffer(
            None, 24, warmup=0, seed=3, draws=ptl_rl.PrioritizedDraws(alpha=0.7, beta=0.5, eps=1e-3)
        ),
        True,
    ),
    "sequence": (
        lambda: ptl_rl.SequenceReplayBuffer(None, 24, length=3, burn_in=1, warmup=0, seed=4),
        lambda: ptl_rl.ReplayBuffer(None, 24, warmup=0, seed=4, draws=ptl_rl.SequenceWindows(length=3, burn_in=1)),
        False,
    ),
    "sequence prioritized": (
        lambda: ptl_rl.SequenceReplayBuffer(
            None, 24, length=2, pad_end=True, prioritized=True, alpha=0.5, beta=0.6, warmup=0, seed=5
        ),
        lambda: ptl_rl.ReplayBuffer(
            None,
            24,
            warmup=0,
            seed=5,
            draws=ptl_rl.SequenceWindows(length=2, pad_end=True, draws=ptl_rl.PrioritizedDraws(alpha=0.5, beta=0.6)),
        ),
        True,
    ),
    "her": (
        lambda: ptl_rl.HERReplayBuffer(None, 24, compute_reward=reward, strategy="episode", warmup=0, seed=6),
        lambda: ptl_rl.ReplayBuffer(
            None, 24, warmup=0, seed=6, draws=ptl_rl.HindsightGoals(reward, strategy="episode")
        ),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_a_named_buffer_is_the_composition_it_stands_for(name):
    named, composed, prioritized = PAIRS[name]
    same(run(named(), prioritized), run(composed(), prioritized))
    # and the states load across: a checkpoint of one is a checkpoint of the other
    source, target = named(), composed()
    run(source, prioritized)
    source.end_episodes()  # (a restore ends the episodes in flight)
    target.load_state_dict(source.state_dict())
    same(dict(target.sample(7).items()), dict(source.sample(7).items()))


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_named_buffers_and_their_strategies_declare_their_capabilities(name):
    buffer = PAIRS[name][0]()
    assert isinstance(buffer.draws, DrawStrategy)
    assert isinstance(buffer.draws, EpisodeDrawStrategy) == name.startswith(("sequence", "her"))
    assert isinstance(buffer.draws, PriorityDrawStrategy)  # (a uniform one says why it takes none)
    assert not isinstance(buffer.draws, EpochDrawStrategy)
    assert isinstance(ptl_rl.UniformDraws(), EpochDrawStrategy)


def test_a_strategy_serves_one_buffer_and_replacement_is_a_uniform_option():
    draws = ptl_rl.PrioritizedDraws()
    ptl_rl.ReplayBuffer(None, 8, draws=draws)
    with pytest.raises(ValueError, match="create one per buffer"):
        ptl_rl.ReplayBuffer(None, 8, draws=draws)
    with pytest.raises(ValueError, match=r"draws=UniformDraws\(replacement=False\)"):
        ptl_rl.ReplayBuffer(None, 8, replacement=False, draws=ptl_rl.PrioritizedDraws())
    with pytest.raises(ValueError, match="drawn with replacement"):
        ptl_rl.ReplayBuffer(None, 8, draws=ptl_rl.SequenceWindows(2, draws=ptl_rl.UniformDraws(replacement=False)))
    with pytest.raises(TypeError, match="UniformDraws or a PrioritizedDraws"):
        ptl_rl.SequenceWindows(2, draws=ptl_rl.SequenceWindows(2))  # type: ignore[arg-type]


def test_a_uniform_buffer_has_no_priorities_and_the_others_no_passes():
    buffer = ptl_rl.ReplayBuffer(None, 8, warmup=0)
    buffer.add(rows(0, 4))
    with pytest.raises(TypeError, match="PrioritizedDraws"):
        buffer.update_priorities([0], [1.0])
    assert "indices" not in buffer.sample(2)  # uniform rows: the stored fields only
    prioritized = ptl_rl.ReplayBuffer(None, 8, warmup=0, draws=ptl_rl.PrioritizedDraws())
    prioritized.add(rows(0, 4))
    with pytest.raises(TypeError, match="replacement=False"):
        prioritized.epoch(2)
    buffer.end_episodes()  # a no-op for a strategy that follows no episodes


def test_an_object_that_is_no_strategy_is_refused_naming_what_it_lacks():
    class Half:
        def sample(self, rng: np.random.Generator, batch_size: int) -> ptl_rl.TransitionBatch: ...

    with pytest.raises(TypeError, match=r"lacks bind, check, added, ready, snapshot, restore"):
        ptl_rl.ReplayBuffer(None, 8, draws=Half())  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy_draws", ["uniform", "prioritized"])
def test_hindsight_goals_draw_only_steps_of_complete_episodes_by_either_strategy(strategy_draws):
    inner = ptl_rl.PrioritizedDraws(alpha=1.0, beta=1.0) if strategy_draws == "prioritized" else None
    goals = ptl_rl.HindsightGoals(reward, strategy="future", draws=inner)
    buffer = ptl_rl.ReplayBuffer(None, 40, warmup=0, seed=0, draws=goals)
    buffer.add(rows(0, 26))  # 3 envs, episodes of 4 steps: 6 complete, 2 running
    drawable = np.flatnonzero(goals.episodes.length[: len(buffer)] > 0)
    assert len(drawable) == goals.num_sampleable == 24
    batch = buffer.sample(200)
    assert set(batch.indices.tolist()) <= set(drawable.tolist())
    if inner is None:
        assert "weights" not in batch
        return
    assert batch.weights.dtype == np.float32 and batch.weights.max() == pytest.approx(1.0)
    # all the mass on one step: it is drawn (almost) always
    target = int(drawable[5])
    priorities = np.where(drawable == target, 1e3, 0.0)
    assert buffer.update_priorities(drawable, priorities) == 0
    assert np.mean(buffer.sample(100).indices == target) > 0.9
    with pytest.raises(ValueError, match="not steps of complete episodes"):
        buffer.update_priorities([25], [1.0])  # a step of an episode still running
    # a step that became drawable later gets the largest priority kept
    buffer.end_episodes()
    assert inner.priorities([25])[0] == pytest.approx(inner.priorities([target])[0])


def test_uniform_draws_stratified_draw_every_row_equally_often():
    buffer = ptl_rl.ReplayBuffer(None, 50, warmup=0, seed=2, draws=ptl_rl.UniformDraws(stratified=True))
    buffer.add(rows(0, 37))
    counts = np.zeros(37)
    segment = np.arange(16) * 37 / 16
    for _ in range(400):
        ids = buffer.sample(16)["action"]
        np.add.at(counts, ids, 1)
        assert ((ids >= np.floor(segment)) & (ids < segment + 37 / 16)).all()  # row k from the k-th segment
    stat, dof = chi_square_statistic(counts, np.full(37, 1 / 37))
    assert stat < chi_square_quantile(dof, SIGNIFICANCE)


# ---------------------------------------------------------------------- a strategy of one's own
class RecentDraws:
    """A user's strategy: rows drawn with probability proportional to how recently they were written.

    It keeps one int64 array per slot (the write number) and nothing else: the protocol's members, each short.
    """

    def __init__(self, horizon: float) -> None:
        self.horizon = float(horizon)
        self.bound = False

    def bind(self, storage: Storage, upstream: Iterator[ptl_rl.TransitionBatch] | None) -> None:
        assert not self.bound
        self.bound, self.storage = True, storage
        self.written = np.full(storage.capacity, -1, dtype=np.int64)

    def check(self, batch: ptl_rl.TransitionBatch) -> None:
        if "age" in batch:
            raise ValueError("'age' is added to sampled batches")

    def added(self, slots: np.ndarray, old_size: int, batch: ptl_rl.TransitionBatch, advance: Any) -> None:
        total = self.storage.total_added
        self.written[slots] = np.arange(total - len(slots), total)

    def ready(self) -> bool:
        return True

    def sample(self, rng: np.random.Generator, batch_size: int) -> ptl_rl.TransitionBatch:
        size = len(self.storage)
        age = self.storage.total_added - 1 - self.written[:size]
        weights = np.exp(-age / self.horizon)
        slots = rng.choice(size, batch_size, p=weights / weights.sum())
        batch = self.storage.gather(slots)
        batch["age"] = age[slots]
        return batch

    def snapshot(self) -> object:
        return None  # an add's writes are rewritten in full by its redo

    def restore(self, snapshot: Any) -> None:
        pass

    def counters(self) -> dict[str, object]:
        return {"horizon": self.horizon}

    def state_dict(self) -> dict[str, Any]:
        return {"written": torch.from_numpy(self.written[: len(self.storage)].copy())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        written = state["written"].numpy()
        self.written[:] = -1
        self.written[: len(written)] = written


def test_a_strategy_of_ones_own_works_as_a_stage_under_a_sampler_and_in_a_checkpoint():
    draws = RecentDraws(horizon=5.0)
    assert isinstance(draws, DrawStrategy) and not isinstance(draws, PriorityDrawStrategy)
    buffer = ptl_rl.ReplayBuffer(iter([rows(s, 6) for s in range(0, 600, 6)]), 60, warmup=30, draws=draws, seed=0)
    sampler = ptl_rl.BatchSampler(buffer, batch_size=16)
    assert "horizon=5" in repr(sampler) and "ReplayBuffer(size=0/60, warmup=30, horizon=5" in repr(buffer)
    batch = next(sampler)
    assert batch["age"].float().mean() < 10  # the newest rows dominate
    state = copy.deepcopy(buffer.state_dict())
    restored = ptl_rl.ReplayBuffer(None, 60, draws=RecentDraws(horizon=5.0))
    restored.load_state_dict(state)
    same(dict(restored.sample(8).items()), dict(buffer.sample(8).items()))
    with pytest.raises(ValueError, match="'age' is added"):
        buffer.add(ptl_rl.TransitionBatch({**dict(rows(0, 1).items()), "age": np.zeros(1)}))


def test_an_add_cut_inside_a_strategy_of_ones_own_is_redone_in_full():
    class Flaky(RecentDraws):
        calls = 0

        def added(self, slots: np.ndarray, old_size: int, batch: ptl_rl.TransitionBatch, advance: Any) -> None:
            self.written[slots] = -7  # half done, then cut (in the second add only)
            self.calls += 1
            if self.calls == 2:
                raise KeyboardInterrupt
            super().added(slots, old_size, batch, advance)

    buffer = ptl_rl.ReplayBuffer(None, 10, warmup=0, draws=Flaky(3.0))
    buffer.add(rows(0, 8))
    with pytest.raises(KeyboardInterrupt):
        buffer.add(rows(8, 4))
    buffer.sample(2)  # finishes the add first: the same rows into the same slots, and the strategy's part
    assert len(buffer) == 10 and buffer.storage.total_added == 12
    np.testing.assert_array_equal(np.sort(buffer.draws.written), np.arange(2, 12))

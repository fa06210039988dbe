"""Sampling without replacement: shuffled passes in which every stored transition comes once."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptl_rl import BatchSampler, PrioritizedReplayBuffer, ReplayBuffer, SequenceReplayBuffer, TransitionBatch


def transitions(n: int, start: int = 0) -> TransitionBatch:
    ids = np.arange(start, start + n)
    return TransitionBatch(
        obs=ids[:, None].astype(np.float32),
        action=ids.astype(np.int64),
        reward=np.zeros(n, dtype=np.float32),
        next_obs=np.zeros((n, 1), dtype=np.float32),
        terminated=np.zeros(n, dtype=bool),
        truncated=np.zeros(n, dtype=bool),
        discount=np.ones(n, dtype=np.float32),
        env_id=np.zeros(n, dtype=np.int64),
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 200), added=st.integers(1, 400), batch_size=st.integers(1, 64), passes=st.integers(1, 3))
def test_every_stored_transition_comes_once_per_pass(capacity, added, batch_size, passes) -> None:
    buffer = ReplayBuffer(capacity=capacity, warmup=0, replacement=False, seed=0)
    buffer.add(transitions(added))
    stored = np.sort(buffer.storage.fields["action"][: len(buffer)])
    batch_size = min(batch_size, len(buffer))
    per_pass = -(-len(buffer) // batch_size)
    orders = []
    for _ in range(passes):
        batches = [buffer.sample(batch_size)["action"] for _ in range(per_pass)]
        assert [len(b) for b in batches[:-1]] == [batch_size] * (per_pass - 1)
        assert 1 <= len(batches[-1]) <= batch_size  # the remainder closes the pass
        seen = np.concatenate(batches)
        np.testing.assert_array_equal(np.sort(seen), stored)
        orders.append(seen)
    assert buffer.draws.passes.passes == passes
    if len(buffer) >= 8 and passes > 1:
        assert not np.array_equal(orders[0], orders[1]), "each pass is shuffled anew"


def test_epoch_iterates_one_fresh_pass() -> None:
    buffer = ReplayBuffer(capacity=100, warmup=0, seed=1)  # a with-replacement buffer can still do passes
    buffer.add(transitions(37))
    batches = list(buffer.epoch(10))
    assert [len(b) for b in batches] == [10, 10, 10, 7]
    np.testing.assert_array_equal(np.sort(np.concatenate([b["action"] for b in batches])), np.arange(37))
    again = np.concatenate([b["action"] for b in buffer.epoch(64)])
    np.testing.assert_array_equal(np.sort(again), np.arange(37))
    assert not np.array_equal(again, np.concatenate([b["action"] for b in batches]))
    with pytest.raises(ValueError, match="batch_size"):
        next(buffer.epoch(0))
    with pytest.raises(ValueError):
        next(ReplayBuffer(capacity=4, warmup=0).epoch(2))  # empty


def test_items_added_during_a_pass_join_the_next_one() -> None:
    buffer = ReplayBuffer(capacity=100, warmup=0, replacement=False, seed=0)
    buffer.add(transitions(10))
    first = buffer.sample(6)["action"]
    buffer.add(transitions(5, 10))
    rest = buffer.sample(6)["action"]
    assert len(rest) == 4
    np.testing.assert_array_equal(np.sort(np.concatenate([first, rest])), np.arange(10))
    next_pass = np.concatenate([buffer.sample(15)["action"]])
    np.testing.assert_array_equal(np.sort(next_pass), np.arange(15))


def test_a_pass_through_the_pipeline_sampler() -> None:
    def upstream():
        step = 0
        while True:
            yield transitions(1, step)
            step += 1

    buffer = ReplayBuffer(upstream(), capacity=50, warmup=20, replacement=False, seed=0)
    sampler = BatchSampler(buffer, batch_size=8)
    first = next(sampler).action  # the stage fills to the warm-up size; the pass covers those 20
    assert len(buffer) == 20
    rest = [next(sampler).action for _ in range(2)]  # one more transition per yield joins the next pass
    assert [len(first)] + [len(b) for b in rest] == [8, 8, 4]
    np.testing.assert_array_equal(np.sort(torch.cat([first, *rest]).numpy()), np.arange(20))
    np.testing.assert_array_equal(np.sort(torch.cat([next(sampler).action for _ in range(3)]).numpy()), np.arange(23))


def test_state_round_trip_mid_pass_gives_the_same_remaining_batches() -> None:
    buffer = ReplayBuffer(capacity=64, warmup=0, replacement=False, seed=3)
    buffer.add(transitions(64))
    buffer.sample(20)
    blob = io.BytesIO()
    torch.save(buffer.state_dict(), blob)
    blob.seek(0)
    restored = ReplayBuffer(capacity=64, warmup=0, replacement=False, seed=0)
    restored.load_state_dict(torch.load(blob, weights_only=True))
    for _ in range(6):  # the rest of this pass and the start of the next
        np.testing.assert_array_equal(buffer.sample(20)["action"], restored.sample(20)["action"])


def test_default_buffer_state_is_unchanged_by_the_new_mode() -> None:
    buffer = ReplayBuffer(capacity=8, warmup=0)
    buffer.add(transitions(4))
    state = buffer.state_dict()
    assert set(state) == {"storage", "rng", "credit", "draws", "state_version"} and state["draws"] == {}


def test_prioritized_and_sequence_buffers_do_not_offer_passes() -> None:
    prioritized = PrioritizedReplayBuffer(capacity=8, warmup=0)
    prioritized.add(transitions(8))
    with pytest.raises(TypeError, match="replacement=False"):
        prioritized.epoch(4)
    sequence = SequenceReplayBuffer(capacity=8, length=2, warmup=0)
    with pytest.raises(TypeError, match="replacement=False"):
        sequence.epoch(4)

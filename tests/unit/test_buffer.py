"""ReplayBuffer and its storage: ring semantics, dtypes, uniform sampling, state, bad input."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from stats import SIGNIFICANCE, chi_square_quantile, chi_square_statistic

from ptl_rl import ReplayBuffer, TransitionBatch
from ptl_rl.replay import ArrayStorage


def make_batch(start: int, rows: int, obs_dim: int = 3) -> TransitionBatch:
    """Transitions numbered start..start+rows-1; every field encodes the number."""
    ids = np.arange(start, start + rows)
    return TransitionBatch(
        obs=np.repeat(ids[:, None], obs_dim, axis=1).astype(np.float32),
        action=ids.astype(np.int64),
        reward=ids.astype(np.float32),
        next_obs=np.repeat(ids[:, None] + 0.5, obs_dim, axis=1).astype(np.float32),
        terminated=(ids % 7 == 0),
        truncated=(ids % 11 == 0),
        discount=np.full(rows, 0.99, dtype=np.float32),
        env_id=(ids % 4).astype(np.int64),
        log_prob=-ids.astype(np.float32),
    )


def stored_ids(buffer: ReplayBuffer) -> np.ndarray:
    return buffer.storage.fields["action"][: len(buffer)]


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 40), chunks=st.lists(st.integers(0, 25), min_size=1, max_size=12))
def test_ring_keeps_exactly_the_newest_transitions(capacity: int, chunks: list[int]) -> None:
    buffer = ReplayBuffer(None, capacity, warmup=0)
    total = 0
    for rows in chunks:
        slots = buffer.add(make_batch(total, rows))
        assert len(slots) == min(rows, capacity)
        total += rows
    expected = np.arange(max(0, total - capacity), total)
    assert len(buffer) == min(total, capacity)
    assert sorted(stored_ids(buffer).tolist()) == expected.tolist()
    # every field of a slot belongs to the same transition
    f = buffer.storage.fields
    n = len(buffer)
    ids = f["action"][:n]
    np.testing.assert_array_equal(f["obs"][:n, 0], ids)
    np.testing.assert_array_equal(f["reward"][:n], ids)
    np.testing.assert_array_equal(f["log_prob"][:n], -ids)
    np.testing.assert_array_equal(f["terminated"][:n], ids % 7 == 0)


def test_sample_keeps_shapes_dtypes_and_row_alignment() -> None:
    buffer = ReplayBuffer(None, 50, warmup=0, seed=0)
    buffer.add(make_batch(0, 70))
    batch = buffer.sample(32)
    assert batch["obs"].shape == (32, 3) and batch["obs"].dtype == np.float32
    assert batch["action"].shape == (32,) and batch["action"].dtype == np.int64
    assert batch["terminated"].dtype == np.bool_
    assert batch["log_prob"].dtype == np.float32
    ids = batch["action"]
    assert ((ids >= 20) & (ids < 70)).all()
    np.testing.assert_array_equal(batch["next_obs"][:, 1], ids + 0.5)
    np.testing.assert_array_equal(batch["truncated"], ids % 11 == 0)


def test_dict_observations_are_stored_per_key() -> None:
    buffer = ReplayBuffer(None, 10, warmup=0, seed=0)
    rows = 6
    base = make_batch(0, rows)
    batch = TransitionBatch({**dict(base.items()), "obs": {"pos": base["obs"], "img": np.ones((rows, 2, 2), np.uint8)}})
    buffer.add(batch)
    sample = buffer.sample(4)
    assert sample["obs"]["img"].shape == (4, 2, 2) and sample["obs"]["img"].dtype == np.uint8
    np.testing.assert_array_equal(sample["obs"]["pos"][:, 0], sample["action"])


def test_uniform_sampling_frequencies_chi_square() -> None:
    capacity, draws = 64, 64_000
    buffer = ReplayBuffer(None, capacity, warmup=0, seed=123)
    buffer.add(make_batch(0, 100))  # wraps: slots hold transitions 36..99
    counts = np.zeros(capacity)
    for _ in range(draws // 64):
        np.add.at(counts, buffer.sample(64)["action"] - 36, 1)
    chi2, dof = chi_square_statistic(counts, np.full(capacity, 1.0 / capacity))
    assert dof == capacity - 1
    assert chi2 < chi_square_quantile(dof, SIGNIFICANCE), chi2  # a biased sampler lands far above it
    assert counts.min() > 0


def test_sampling_is_reproducible_from_the_seed() -> None:
    a, b = ReplayBuffer(None, 20, warmup=0, seed=5), ReplayBuffer(None, 20, warmup=0, seed=5)
    a.add(make_batch(0, 20))
    b.add(make_batch(0, 20))
    np.testing.assert_array_equal(a.sample(16)["action"], b.sample(16)["action"])


def test_state_dict_round_trip_through_weights_only_load() -> None:
    buffer = ReplayBuffer(None, 30, warmup=0, seed=7)
    buffer.add(make_batch(0, 45))
    buffer.sample(8)
    blob = io.BytesIO()
    torch.save(buffer.state_dict(), blob)
    blob.seek(0)
    state = torch.load(blob, weights_only=True)

    restored = ReplayBuffer(None, 30, warmup=0, seed=999)
    restored.load_state_dict(state)
    assert len(restored) == len(buffer)
    np.testing.assert_array_equal(stored_ids(restored), stored_ids(buffer))
    np.testing.assert_array_equal(restored.sample(16)["action"], buffer.sample(16)["action"])
    # the write position survives too: the next add overwrites the same slots in both
    restored.add(make_batch(100, 5))
    buffer.add(make_batch(100, 5))
    np.testing.assert_array_equal(stored_ids(restored), stored_ids(buffer))


def test_state_of_an_empty_buffer_round_trips() -> None:
    buffer = ReplayBuffer(None, 5, warmup=0)
    restored = ReplayBuffer(None, 5, warmup=0)
    restored.load_state_dict(buffer.state_dict())
    assert len(restored) == 0
    restored.add(make_batch(0, 2))
    assert len(restored) == 2


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: {**b, "obs": b["obs"].astype(np.float64)}, "field 'obs'.*float64.*astype"),
        (lambda b: {**b, "obs": b["obs"][:, :2]}, r"field 'obs' has rows of shape \(2,\).*stores rows of shape \(3,\)"),
        (lambda b: {**b, "reward": b["reward"][:3]}, "field 'reward' has 3 rows but the batch has"),
        (lambda b: {k: v for k, v in b.items() if k != "log_prob"}, r"missing \['log_prob'\]"),
        (lambda b: {**b, "value": b["reward"]}, r"unexpected \['value'\]"),
    ],
)
def test_mismatched_batches_are_rejected_without_losing_data(change, message) -> None:
    buffer = ReplayBuffer(None, 8, warmup=0)
    buffer.add(make_batch(0, 8))  # full: a partial write would destroy stored transitions
    before = {k: v.copy() for k, v in buffer.storage.fields.items()}
    bad = TransitionBatch(change(dict(make_batch(100, 5).items())))
    with pytest.raises(ValueError, match=message):
        buffer.add(bad)
    assert len(buffer) == 8
    for k, v in before.items():
        np.testing.assert_array_equal(buffer.storage.fields[k], v)


def test_sampling_more_than_stored_names_the_fix() -> None:
    buffer = ReplayBuffer(None, 100, warmup=0)
    buffer.add(make_batch(0, 10))
    with pytest.raises(ValueError, match="batch of 64 from a buffer holding 10.*warmup >= 64"):
        buffer.sample(64)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        buffer.sample(0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity": 0}, "capacity must be an integer >= 1"),
        ({"capacity": 10, "warmup": 11}, "warmup must be in"),
        ({"capacity": 10, "transitions_per_yield": 0}, "transitions_per_yield must be >= 1"),
    ],
)
def test_bad_buffer_arguments(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(None, **kwargs)


def counting_upstream(rows: int, pulls: list[int]):
    """Endless batches of ``rows`` numbered transitions; appends each pull's first number to ``pulls``."""
    start = 0
    while True:
        pulls.append(start)
        yield make_batch(start, rows)
        start += rows


def test_stage_waits_for_warmup_then_yields_once_per_transitions_per_yield() -> None:
    pulls: list[int] = []
    buffer = ReplayBuffer(counting_upstream(3, pulls), 100, warmup=10, transitions_per_yield=5)
    assert next(buffer) is buffer
    assert len(buffer) == 12  # 4 pulls of 3 reach the warm-up of 10 and pay for the first yield
    yields = 0
    while len(pulls) < 4 + 50:
        next(buffer)
        yields += 1
    # then on average one yield per 5 collected transitions (3 per pull)
    assert abs(yields - 50 * 3 / 5) <= 1


def test_several_yields_per_pull_when_a_pull_brings_more_than_transitions_per_yield() -> None:
    pulls: list[int] = []
    buffer = ReplayBuffer(counting_upstream(8, pulls), 100, warmup=0, transitions_per_yield=2)
    for _ in range(12):
        next(buffer)
    assert len(pulls) == 3  # 8 transitions per pull pay for 4 yields


def test_gather_from_an_empty_storage_says_to_add_first() -> None:
    storage = ArrayStorage(4)
    with pytest.raises(ValueError, match="add a batch before gathering"):
        storage.gather(np.zeros(1, dtype=np.int64))

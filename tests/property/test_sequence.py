"""SequenceReplayBuffer: windows stay inside one stored episode of one env, for random layouts."""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stats import SIGNIFICANCE, chi_square_quantile, chi_square_statistic

from ptl_rl import BatchSampler, ExperienceSource, SequenceReplayBuffer, TransitionBatch

EPS = 1e-6


# ---------------------------------------------------------------------- random layouts
def build_rows(episode_lengths: list[list[int]], open_last: list[bool], order_seed: int) -> list[dict]:
    """Rows of several envs, interleaved at random (time order kept per env).

    Each row knows its env, a unique episode id, its step ``t`` in the episode and
    whether the episode ends there; the last episode of an env stays open when asked.
    """
    per_env = []
    episode_id = 0
    for env, lengths in enumerate(episode_lengths):
        rows = []
        for j, n in enumerate(lengths):
            ends = not (open_last[env] and j == len(lengths) - 1)
            rows += [dict(env=env, episode=episode_id, t=t, done=ends and t == n - 1) for t in range(n)]
            episode_id += 1
        per_env.append(rows)
    rng = np.random.default_rng(order_seed)
    turns = np.concatenate([np.full(len(rows), env) for env, rows in enumerate(per_env)])
    rng.shuffle(turns)
    position = [0] * len(per_env)
    out = []
    for env in turns:
        out.append(per_env[env][position[env]])
        position[env] += 1
    for order, row in enumerate(out):
        row["order"] = order
    return out


def as_batch(rows: list[dict], flip: np.random.Generator) -> TransitionBatch:
    n = len(rows)
    order = np.array([r["order"] for r in rows], dtype=np.int64)
    done = np.array([r["done"] for r in rows])
    truncated = done & (flip.random(n) < 0.5)
    return TransitionBatch(
        obs=np.stack([order, order + 0.5], axis=1).astype(np.float32),
        action=order.copy(),
        reward=np.zeros(n, dtype=np.float32),
        next_obs=np.zeros((n, 2), dtype=np.float32),
        terminated=done & ~truncated,
        truncated=truncated,
        discount=np.full(n, 0.99, dtype=np.float32),
        env_id=np.array([r["env"] for r in rows], dtype=np.int64) * 3 + 1,  # sparse ids
        order=order,
        episode=np.array([r["episode"] for r in rows], dtype=np.int64),
        t=np.array([r["t"] for r in rows], dtype=np.int64),
        hidden=np.stack([order * 2.0, -order], axis=1).astype(np.float32),
    )


def reference_starts(rows: list[dict], stored: set[int], length: int, pad_end: bool = False) -> set[int]:
    """Orders of the steps that may start a window: brute force over the rows added so far."""
    episodes: dict[int, list[dict]] = {}
    for r in rows:
        episodes.setdefault(r["episode"], []).append(r)
    starts = set()
    for steps in episodes.values():
        ended = steps[-1]["done"]
        for i, r in enumerate(steps):
            if r["order"] not in stored:
                continue
            if i + length - 1 < len(steps):  # the whole window is stored (later steps are newer)
                starts.add(r["order"])
            elif ended and len(steps) < length and i == 0:  # a short, finished episode from its first step
                starts.add(r["order"])
            elif ended and pad_end:  # pad_end: every step of a finished episode, its window padded at the end
                starts.add(r["order"])
    return starts


layouts = st.fixed_dictionaries(
    {
        "lengths": st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=6), min_size=1, max_size=4),
        "open_last": st.lists(st.booleans(), min_size=4, max_size=4),
        "order_seed": st.integers(0, 2**16),
        "batch_sizes": st.lists(st.integers(1, 9), min_size=1, max_size=30),
        "capacity": st.integers(5, 90),
        "length": st.integers(1, 6),
        "burn_in": st.integers(0, 4),
        "prioritized": st.booleans(),
        "pad_end": st.booleans(),
    }
)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts)
def test_windows_never_cross_episode_ends_or_the_write_head(layout) -> None:
    rows = build_rows(layout["lengths"], layout["open_last"], layout["order_seed"])
    capacity, length, burn_in = layout["capacity"], layout["length"], layout["burn_in"]
    pad_end = layout["pad_end"]
    buffer = SequenceReplayBuffer(
        capacity=capacity,
        length=length,
        burn_in=burn_in,
        pad_end=pad_end,
        prioritized=layout["prioritized"],
        warmup=0,
        seed=1,
    )
    flip = np.random.default_rng(layout["order_seed"])
    sizes = layout["batch_sizes"]
    added: list[dict] = []
    calls = 0
    while len(added) < len(rows):
        chunk = rows[len(added) : len(added) + sizes[calls % len(sizes)]]
        calls += 1
        buffer.add(as_batch(chunk, flip))
        added += chunk
        stored = {r["order"] for r in added[-capacity:]}
        starts = buffer.storage.fields["order"][np.flatnonzero(buffer.draws.tree.leaves[: len(buffer)] > 0)]
        assert set(starts.tolist()) == reference_starts(added, stored, length, pad_end)
    if buffer.draws.num_windows:
        check_windows(buffer.sample(64), rows, stored, length, burn_in, pad_end)


def check_windows(
    batch: TransitionBatch, rows: list[dict], stored: set[int], length: int, burn_in: int, pad_end: bool = False
) -> None:
    steps = burn_in + length
    by_order = {r["order"]: r for r in rows}
    mask = batch["mask"]
    assert mask.shape == (64, steps) and mask.dtype == bool
    assert batch["obs"].shape == (64, steps, 2) and batch["hidden"].shape == (64, steps, 2)
    assert mask[:, burn_in].all()
    for b in range(64):
        real = np.flatnonzero(mask[b])
        first, last = real[0], real[-1]
        assert (real == np.arange(first, last + 1)).all(), "padding only at the front of the burn-in and the end"
        order = batch["order"][b]
        assert batch["indices"][b] >= 0 and order[burn_in] in stored
        # real steps: stored, one env, one episode, consecutive in time
        assert all(o in stored for o in order[real])
        assert len({by_order[o]["episode"] for o in order[real]}) == 1
        assert len(set(batch["env_id"][b][real].tolist())) == 1
        np.testing.assert_array_equal(batch["t"][b][real], batch["t"][b][first] + np.arange(len(real)))
        assert (np.diff(order[real]) > 0).all()
        # no step of the episode after the window's end that could have been included is missing
        start = by_order[order[burn_in]]
        episode = [r for r in rows if r["episode"] == start["episode"]]
        if last < steps - 1:  # padded at the end: only where the episode ended (short, or with pad_end any)
            assert by_order[order[last]]["done"] and len(episode) - start["t"] < length
            assert pad_end or (start["t"] == 0 and len(episode) < length)
        stored_before = sum(1 for r in episode if r["t"] < start["t"] and r["order"] in stored)
        assert burn_in - first == min(burn_in, stored_before)
        # padding repeats the nearest real step, so position 0 holds the first real step's state
        np.testing.assert_array_equal(
            batch["hidden"][b][:first], np.repeat(batch["hidden"][b][first : first + 1], first, 0)
        )
        np.testing.assert_array_equal(
            batch["obs"][b][last + 1 :], np.repeat(batch["obs"][b][last : last + 1], steps - 1 - last, 0)
        )
        np.testing.assert_array_equal(batch["hidden"][b][real], np.stack([order[real] * 2.0, -order[real]], 1))


# ---------------------------------------------------------------------- sampling distributions
def env_rows(num_envs: int, steps: int, episode_length: int, start: int = 0) -> TransitionBatch:
    """A vector-env-like stream: ``steps`` rounds of one row per env, episodes of fixed length."""
    t = np.repeat(np.arange(start, start + steps), num_envs)
    env = np.tile(np.arange(num_envs), steps)
    order = t * num_envs + env
    done = (t % episode_length) == episode_length - 1
    n = len(t)
    return TransitionBatch(
        obs=order[:, None].astype(np.float32),
        action=order.astype(np.int64),
        reward=np.zeros(n, dtype=np.float32),
        next_obs=np.zeros((n, 1), dtype=np.float32),
        terminated=done,
        truncated=np.zeros(n, dtype=bool),
        discount=np.full(n, 0.99, dtype=np.float32),
        env_id=env.astype(np.int64),
    )


def test_uniform_windows_are_drawn_uniformly_over_the_window_starts() -> None:
    buffer = SequenceReplayBuffer(capacity=400, length=4, warmup=0, seed=0, stratified=False)
    buffer.add(env_rows(3, 60, 10))
    starts = np.flatnonzero(buffer.draws.tree.leaves > 0)
    assert len(starts) == buffer.draws.num_windows == 3 * 6 * 7  # 6 episodes of 10 per env, 7 starts each
    counts = np.zeros(400)
    for _ in range(100):
        np.add.at(counts, buffer.sample(256)["indices"], 1)
    probs = np.zeros(400)
    probs[starts] = 1.0 / len(starts)
    assert counts[probs == 0].sum() == 0
    stat, dof = chi_square_statistic(counts, probs)
    assert stat < chi_square_quantile(dof, SIGNIFICANCE)
    assert "weights" not in buffer.sample(4)


def test_prioritized_windows_follow_the_priority_of_their_start() -> None:
    buffer = SequenceReplayBuffer(capacity=300, length=5, prioritized=True, alpha=0.5, beta=1.0, warmup=0, seed=0)
    buffer.add(env_rows(2, 100, 25))
    starts = np.flatnonzero(buffer.draws.tree.leaves > 0)
    priorities = np.random.default_rng(0).random(len(starts)) * 10
    buffer.update_priorities(starts, priorities)
    leaves = np.zeros(300)
    leaves[starts] = (priorities + EPS) ** 0.5
    counts = np.zeros(300)
    for _ in range(100):
        batch = buffer.sample(256)
        np.add.at(counts, batch["indices"], 1)
    stat, dof = chi_square_statistic(counts, leaves / leaves.sum())
    assert stat < chi_square_quantile(dof, SIGNIFICANCE)
    w = (leaves[batch["indices"]] / leaves.sum()) ** -1.0
    np.testing.assert_allclose(batch["weights"], w / w.max(), rtol=1e-5)


def test_sequence_priority_feedback_and_stale_windows() -> None:
    buffer = SequenceReplayBuffer(capacity=45, length=3, burn_in=2, prioritized=True, alpha=1.0, warmup=0, seed=0)
    buffer.add(env_rows(2, 20, 7))
    batch = buffer.sample(8).to_torch().to("cpu")
    assert batch.obs.shape == (8, 5, 1) and batch.mask.dtype == torch.bool
    assert batch.update_priorities(torch.arange(8, dtype=torch.float32)) == 0
    np.testing.assert_allclose(buffer.draws.draws.priorities(batch.indices.numpy()[-1:]), 7.0 + EPS)
    batch = buffer.sample(8)
    buffer.add(env_rows(2, 15, 7, start=20))  # overwrites the oldest 25 slots (and some sampled starts)
    before = buffer.draws.tree.sums.copy()
    gone = buffer.draws.generations[batch["indices"]] != batch["generations"]
    assert batch.update_priorities(np.full(8, 3.0)) == gone.sum()
    np.testing.assert_array_equal(
        buffer.draws.tree.get(batch["indices"][gone]), before[buffer.draws.tree.width + batch["indices"][gone]]
    )
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        batch.update_priorities(np.ones((8, 5)))


def test_updates_for_slots_that_are_no_window_start_raise_and_change_nothing() -> None:
    buffer = SequenceReplayBuffer(capacity=40, length=4, prioritized=True, warmup=0)
    buffer.add(env_rows(1, 10, 10))  # one finished episode of 10 steps: window starts at steps 0..6
    before = buffer.draws.tree.sums.copy()
    with pytest.raises(ValueError, match="not window starts"):
        buffer.update_priorities([0, 8], [1.0, 1.0])
    np.testing.assert_array_equal(before, buffer.draws.tree.sums)


def test_uniform_mode_has_no_priorities_to_update() -> None:
    buffer = SequenceReplayBuffer(capacity=40, length=2, warmup=0)
    buffer.add(env_rows(1, 10, 5))
    with pytest.raises(TypeError, match="prioritized=True"):
        buffer.update_priorities([0], [1.0])
    with pytest.raises(TypeError, match="not sampled from a prioritized buffer"):
        buffer.sample(2).update_priorities(np.ones(2))


def test_sampling_before_any_window_is_complete_raises() -> None:
    buffer = SequenceReplayBuffer(capacity=40, length=8, warmup=0)
    buffer.add(env_rows(2, 5, 100))
    with pytest.raises(ValueError, match="no window of 8 steps"):
        buffer.sample(4)


def test_missing_fields_and_bad_arguments_raise() -> None:
    buffer = SequenceReplayBuffer(capacity=10, length=2, warmup=0)
    with pytest.raises(ValueError, match="env_id"):
        buffer.add(TransitionBatch(obs=np.zeros((2, 1)), terminated=np.zeros(2, bool), truncated=np.zeros(2, bool)))
    with pytest.raises(ValueError, match="length"):
        SequenceReplayBuffer(capacity=10, length=0, warmup=0)
    with pytest.raises(ValueError, match="burn_in"):
        SequenceReplayBuffer(capacity=10, length=2, burn_in=-1, warmup=0)


# ---------------------------------------------------------------------- real envs, recurrent state
class RecurrentRandomAgent:
    """Random CartPole actions; its 'hidden state' is a running sum of observations, reset at episode starts."""

    def __init__(self, num_envs: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.hidden = np.zeros((num_envs, 4), dtype=np.float32)

    def reset_state(self, mask: np.ndarray) -> None:
        self.hidden[mask] = 0.0

    def __call__(self, obs: np.ndarray):
        state = self.hidden.copy()  # the state the action is taken from
        self.hidden = self.hidden + obs
        return self.rng.integers(0, 2, len(obs)), {"hidden": state}


def test_windows_from_a_vector_env_are_contiguous_episodes_with_their_hidden_state() -> None:
    env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    source = ExperienceSource(env, RecurrentRandomAgent(3), seed=0)
    buffer = SequenceReplayBuffer(source, capacity=600, length=12, burn_in=6, warmup=500, seed=0)
    sampler = BatchSampler(buffer, batch_size=32)
    for _ in range(5):
        batch = next(sampler)
        assert batch.obs.shape == (32, 18, 4) and batch.hidden.shape == (32, 18, 4) and batch.mask.shape == (32, 18)
        mask = batch.mask.numpy()
        obs, next_obs, hidden = batch.obs.numpy(), batch.next_obs.numpy(), batch.hidden.numpy()
        pairs = mask[:, 1:] & mask[:, :-1]
        # consecutive real steps are consecutive env steps: next_obs of one is obs of the next
        np.testing.assert_array_equal(next_obs[:, :-1][pairs], obs[:, 1:][pairs])
        # the recurrent state carries over: hidden[t+1] = hidden[t] + obs[t]
        np.testing.assert_allclose(hidden[:, 1:][pairs], (hidden[:, :-1] + obs[:, :-1])[pairs], rtol=1e-5, atol=1e-5)
        done = (batch.terminated | batch.truncated).numpy()
        assert not (done[:, :-1] & pairs).any(), "a window continued past an episode end"
        assert (batch.env_id.numpy() == batch.env_id.numpy()[:, 6:7]).all()
    env.close()


# ---------------------------------------------------------------------- state
def test_state_round_trip_gives_identical_windows() -> None:
    buffer = SequenceReplayBuffer(capacity=120, length=5, burn_in=3, prioritized=True, alpha=0.7, warmup=0, seed=4)
    buffer.add(env_rows(3, 50, 9))
    rng = np.random.default_rng(0)
    for _ in range(4):
        batch = buffer.sample(16)
        batch.update_priorities(rng.random(16))
    blob = io.BytesIO()
    torch.save(buffer.state_dict(), blob)
    blob.seek(0)
    restored = SequenceReplayBuffer(capacity=120, length=5, burn_in=3, prioritized=True, alpha=0.7, warmup=0, seed=0)
    restored.load_state_dict(torch.load(blob, weights_only=True))
    np.testing.assert_array_equal(restored.draws.tree.sums, buffer.draws.tree.sums)
    np.testing.assert_array_equal(restored.draws.generations, buffer.draws.generations)
    for _ in range(3):
        a, b = buffer.sample(16), restored.sample(16)
        for name in ("indices", "generations", "weights", "mask", "obs"):
            np.testing.assert_array_equal(a[name], b[name])


def test_after_a_restore_new_steps_do_not_join_the_episodes_in_flight() -> None:
    buffer = SequenceReplayBuffer(capacity=100, length=3, warmup=0, seed=0)
    buffer.add(env_rows(2, 5, 100))  # episodes still running
    restored = SequenceReplayBuffer(capacity=100, length=3, warmup=0, seed=0)
    restored.load_state_dict(buffer.state_dict())
    slots = restored.add(env_rows(2, 4, 100, start=5))
    assert (restored.draws.prev_slot[slots[:2]] == slots[:2]).all()  # first new step of each env: no predecessor
    np.testing.assert_array_equal(restored.draws.prev_slot[slots[2:]], slots[:-2])

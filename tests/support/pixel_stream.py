"""Pixel transition streams for the tests of pixel rows on the wire to replay shards.

``catch_rows``: stacked Catch frames (``[4, 14, 14]`` uint8) from a vector env of 6 envs with autoreset, episodes
that terminate (the ball lands after 6 steps) or are truncated (time limits of 3, 4 and 5 steps on half of the
envs), through ``ExperienceSource`` and ``NStepTransform``: every case of a real stream. ``noise_rows``: 84x84
frames of random bytes stacked 4, Atari-shaped. Each row carries ``code``, its number in the stream.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
from catch_env import Catch
from gymnasium import spaces

import ptl_rl
from ptl_rl.replay.frames import FrameStorage

LIMITS = (3, 100, 4, 100, 5, 100)  # per env: truncated before the ball lands (3, 4, 5) or terminated (100)


class NoiseFrames(gym.Env):
    """84x84 uint8 frames of random bytes; an episode ends at random (1 in 50 steps)."""

    observation_space = spaces.Box(0, 255, shape=(84, 84), dtype=np.uint8)
    action_space = spaces.Discrete(4)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return self._frame(), 1.0, bool(self.np_random.random() < 1 / 50), False, {}

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, size=(84, 84), dtype=np.uint8)


def _rows(env: gym.vector.VectorEnv, steps: int, n: int, seed: int) -> list[ptl_rl.TransitionBatch]:
    rng = np.random.default_rng(seed)
    source = ptl_rl.ExperienceSource(env, lambda obs: rng.integers(0, 3, len(obs)), seed=seed)
    stream = iter(ptl_rl.NStepTransform(source, n=n, gamma=0.9))
    batches, code = [], 0
    for _ in range(steps):
        batch = next(stream)
        if len(batch):
            batch["code"] = np.arange(code, code + len(batch), dtype=np.int64)
            code += len(batch)
            batches.append(batch)
    return batches


def catch_rows(steps: int, n: int = 3, seed: int = 0, layout: str = "stack0") -> list[ptl_rl.TransitionBatch]:
    """``steps`` vector steps of 6 Catch envs as ``n``-step pipeline batches, observations laid out as
    ``layout``: ``"stack0"`` (``[4, 14, 14]``), ``"channel_last"`` (``[14, 14, 4]``) or ``"single"`` (the newest
    frame, ``[14, 14]``)."""

    def make(limit: int) -> gym.Env:
        return gym.wrappers.FrameStackObservation(gym.wrappers.TimeLimit(Catch(), limit), 4)

    env = gym.vector.SyncVectorEnv([functools.partial(make, limit) for limit in LIMITS])
    batches = _rows(env, steps, n, seed)
    for batch in batches:
        for key in ("obs", "next_obs"):
            if layout == "channel_last":
                batch[key] = np.ascontiguousarray(np.moveaxis(batch[key], 1, -1))
            elif layout == "single":
                batch[key] = np.ascontiguousarray(batch[key][:, -1])
    return batches


def noise_rows(steps: int, envs: int = 8, n: int = 3, seed: int = 0) -> list[ptl_rl.TransitionBatch]:
    """``steps`` vector steps of ``envs`` envs of 84x84 noise frames stacked 4, as ``n``-step pipeline batches."""

    def make() -> gym.Env:
        return gym.wrappers.FrameStackObservation(NoiseFrames(), 4)

    return _rows(gym.vector.SyncVectorEnv([make for _ in range(envs)]), steps, n, seed)


STACK_AXIS = {"stack0": 0, "channel_last": -1, "single": None}


def frame_buffer(capacity: int, n: int = 3, layout: str = "stack0") -> ptl_rl.ReplayBuffer:
    """A uniform replay over a ``FrameStorage`` of ``layout``'s stack axis (a shard's factory, with partial)."""
    storage = functools.partial(FrameStorage, stack_axis=STACK_AXIS[layout], n_step=n)
    return ptl_rl.ReplayBuffer(capacity=capacity, storage=storage)


def assert_same_storage(got: ptl_rl.ReplayBuffer, want: ptl_rl.ReplayBuffer) -> None:
    """Both buffers' frame storages hold the same bytes: every array of their saved parts, the counters, and
    every sampleable row gathered (brute force over all slots)."""
    a, b = got.storage, want.storage
    assert (len(a), a.total_added, a.frames_written) == (len(b), b.total_added, b.frames_written)
    meta_a, arrays_a = a.saved_parts()
    meta_b, arrays_b = b.saved_parts()
    assert meta_a == meta_b
    assert arrays_a.keys() == arrays_b.keys()
    for key in arrays_b:
        assert arrays_a[key].dtype == arrays_b[key].dtype and np.array_equal(arrays_a[key], arrays_b[key]), key
    slots = np.arange(len(b))
    sampleable = b.sampleable(slots)
    assert np.array_equal(a.sampleable(slots), sampleable)
    assert sampleable.sum() > 0
    rows_a, rows_b = a.gather(slots[sampleable]), b.gather(slots[sampleable])
    assert rows_a.keys() == rows_b.keys()
    for key in rows_b.keys():
        assert rows_a[key].dtype == rows_b[key].dtype and rows_a[key].tobytes() == rows_b[key].tobytes(), key

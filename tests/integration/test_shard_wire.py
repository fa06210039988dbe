"""Pixel rows to replay shards through Ray, each frame once: the bytes sent, the rows stored, a lost add.

Each shard's ``FrameStorage`` is saved by the shard and loaded here, then compared (every array, every
sampleable row) with a local buffer fed the same rows whole. The bytes are the pickled size of every message
the writer hands Ray, recorded by a proxy of each shard's handle.
"""

from __future__ import annotations

import functools
import pickle
import time

import numpy as np
import pytest
from pixel_stream import assert_same_storage, catch_rows, frame_buffer, noise_rows

import ptl_rl
from ptl_rl.distributed import ReplayShards
from ptl_rl.distributed.frame_wire import DEFAULT_WINDOW, FrameWire
from ptl_rl.distributed.shard_writer import split_by_shard
from ptl_rl.replay.persist import load_buffer, save_buffer

ray = pytest.importorskip("ray")

FRAME_BYTES = 84 * 84


class Recording:
    """A shard's handle that records the pickled size of every frame message sent through it."""

    def __init__(self, handle: object, sizes: list[int]) -> None:
        self.handle, self.sizes = handle, sizes

    @property
    def add_frames(self) -> Recording:
        return self

    def remote(self, message: object, grant: object, priorities: object = None) -> object:
        self.sizes.append(len(pickle.dumps((message, priorities), protocol=5)))
        return self.handle.add_frames.remote(message, grant, priorities)  # type: ignore[attr-defined]


def stored(shards: ReplayShards, shard: int, factory: functools.partial, directory: str) -> ptl_rl.ReplayBuffer:
    """Shard ``shard``'s buffer as it is now: saved by the shard, loaded here into a buffer of the factory."""
    ray.get(shards.handles[shard].save.remote(directory))
    buffer = factory()
    load_buffer(buffer, directory)
    return buffer


def saved_and_loaded(reference: ptl_rl.ReplayBuffer, factory: functools.partial, directory: str) -> ptl_rl.ReplayBuffer:
    """``reference`` through the same save and load as a shard's rows (a load leaves no env state trusted)."""
    save_buffer(reference, directory)
    buffer = factory()
    load_buffer(buffer, directory)
    return buffer


def wait_for_restart(shards: ReplayShards, shard: int, incarnation: int, timeout: float = 60.0) -> None:
    """Return once shard ``shard`` answers from a process other than ``incarnation``'s."""
    deadline = time.monotonic() + timeout
    while shards.stats()[shard].incarnation == incarnation:
        assert time.monotonic() < deadline, f"shard {shard} did not restart within {timeout} s of its kill"
        time.sleep(0.05)


def test_pixel_rows_send_each_frame_once_and_store_what_full_rows_store(ray_session, tmp_path) -> None:
    K = 2
    factory = functools.partial(frame_buffer, 1000)  # ~1,200 rows per shard: the ring wraps
    shards = ReplayShards(factory, K)
    try:
        writer = shards.writer()
        assert writer.frames == FrameWire(0, DEFAULT_WINDOW)  # on by itself: the shards store frames
        sizes: list[int] = []
        writer.handles = [Recording(handle, sizes) for handle in shards.handles]
        references = [factory() for _ in range(K)]
        full_bytes = rows = 0
        for batch in noise_rows(300):  # 8 envs of 84x84 frames stacked 4, 3-step windows
            writer.add(batch)
            for shard, part in split_by_shard(batch, K):
                references[shard].add(part)
                full_bytes += len(pickle.dumps(part, protocol=5))
            rows += len(batch)
        writer.flush()
        assert writer.rows_stored == rows and writer.rows_dropped == 0
        for shard in range(K):
            reference = saved_and_loaded(references[shard], factory, str(tmp_path / f"r{shard}"))
            assert_same_storage(stored(shards, shard, factory, str(tmp_path / f"s{shard}")), reference)
        # full rows carry 2 stacks of 4 frames; each frame once is one frame a row, plus the references
        assert full_bytes / rows > 7.9 * FRAME_BYTES
        assert sum(sizes) / rows < 1.2 * FRAME_BYTES
    finally:
        shards.close()


def test_a_shard_killed_drops_the_adds_after_it_until_the_writer_starts_again(ray_session, tmp_path) -> None:
    K = 2
    factory = functools.partial(frame_buffer, 1000)  # (no ring wrap: the new life's rows are a run of adds)
    shards = ReplayShards(factory, K)
    try:
        writer = shards.writer(max_in_flight=2)
        batches = catch_rows(120)
        parts: list[list[ptl_rl.TransitionBatch]] = [[] for _ in range(K)]
        for batch in batches[:60]:
            writer.add(batch)
            for shard, part in split_by_shard(batch, K):
                parts[shard].append(part)
        writer.flush()
        incarnation = shards.stats()[1].incarnation
        ray.kill(shards.handles[1], no_restart=False)  # its rows are lost; the adds after it find a gap
        wait_for_restart(shards, 1, incarnation)  # (the kill is asynchronous: an add sent at once may land before it)
        killed_at = len(parts[1])
        for batch in batches[60:]:
            writer.add(batch)
            for shard, part in split_by_shard(batch, K):
                parts[shard].append(part)
        writer.flush()
        assert writer.rows_stored + writer.rows_dropped == writer.rows_written == sum(len(b) for b in batches)
        # shard 0 holds all its rows, byte for byte
        reference = factory()
        for part in parts[0]:
            reference.add(part)
        reference = saved_and_loaded(reference, factory, str(tmp_path / "r0"))
        assert_same_storage(stored(shards, 0, factory, str(tmp_path / "s0")), reference)
        # shard 1's new life holds every add from the writer's new start on, and nothing before
        new_life = stored(shards, 1, factory, str(tmp_path / "s1"))
        first_code = int(new_life.storage.gather(np.arange(len(new_life)))["code"].min())
        first = next(i for i, part in enumerate(parts[1]) if part["code"][0] == first_code)
        assert first > killed_at  # at least the first add after the kill was lost
        assert writer.rows_dropped == sum(len(part) for part in parts[1][killed_at:first])
        reference = factory()
        for part in parts[1][first:]:
            reference.add(part)
        assert_same_storage(new_life, saved_and_loaded(reference, factory, str(tmp_path / "r1")))
    finally:
        shards.close()


def test_the_writer_sends_frames_for_frame_storages_only(ray_session) -> None:
    plain = ReplayShards(functools.partial(ptl_rl.ReplayBuffer, capacity=10), 1)
    frames = ReplayShards(functools.partial(frame_buffer, 10, 1, "channel_last"), 1)
    try:
        assert plain.writer().frames is None
        with pytest.raises(ValueError, match="do not store pixel rows in a FrameStorage"):
            plain.writer(dedup_frames=True)
        assert frames.writer(frame_window=64).frames == FrameWire(-1, 64)
        assert frames.writer(dedup_frames=False).frames is None
        writer = frames.writer()
        copy = pickle.loads(pickle.dumps(writer))  # a collector's copy: a channel of its own
        assert copy.frames == writer.frames
        assert copy._encoders[0].channel != writer._encoders[0].channel
    finally:
        plain.close()
        frames.close()

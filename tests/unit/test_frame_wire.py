"""Pixel rows on the wire, in one process: frame messages rebuilt by a shard store what the full rows store.

A shard (``ReplayShard``, no Ray) fed ``FrameMessage``s from two writers' encoders is compared, every array
of its ``FrameStorage`` and every sampleable row, with a local buffer fed the same rows whole; a lost message
drops the rows after it until the writer starts a new epoch.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from pixel_stream import STACK_AXIS, assert_same_storage, catch_rows, frame_buffer

from ptl_rl.distributed.frame_wire import FrameDecoder, FrameEncoder, frame_hashes
from ptl_rl.distributed.replay_shard import ReplayShard
from ptl_rl.distributed.shard_writer import split_by_shard

K = 2
CAPACITY = 150  # rows per shard: the ring wraps (~600 rows per shard are written)


@pytest.mark.parametrize("layout", ["stack0", "channel_last", "single"])
def test_a_shard_fed_frame_messages_stores_what_full_rows_store(layout: str) -> None:
    factory = functools.partial(frame_buffer, CAPACITY, 3, layout)
    shards = [ReplayShard(factory, k) for k in range(K)]
    references = [factory() for _ in range(K)]
    # two writers (envs 0-2 and 3-5), each with an encoder per shard
    encoders = {(w, k): FrameEncoder(10 + w, STACK_AXIS[layout], window=16) for w in range(2) for k in range(K)}
    frames = rows = 0
    for batch in catch_rows(200, layout=layout):
        for writer in range(2):
            part = batch.rows((batch.env_id >= 3) == bool(writer))
            for shard, rows_ in split_by_shard(part, K):
                message = encoders[writer, shard].encode(rows_)
                assert shards[shard].add_frames(message).dropped == 0
                references[shard].add(rows_)
                frames, rows = frames + len(message.frames), rows + len(rows_)
    for shard, reference in zip(shards, references, strict=True):
        assert_same_storage(shard.buffer, reference)
    # at most ~1 new frame a row (full rows: 2 stacks), though the window of 16 frames holds fewer than the
    # n + S = 7 rows of 3 envs that a frame is referenced in: some frames are sent again
    assert frames / rows < 1.2


def test_a_gap_drops_the_rows_after_it_until_the_writer_starts_a_new_epoch() -> None:
    factory = functools.partial(frame_buffer, CAPACITY)
    batches = [b.rows(b.env_id % K == 0) for b in catch_rows(60)]  # shard 0's rows
    batches = [b for b in batches if len(b)]
    encoder = FrameEncoder(7, 0)
    messages = [encoder.encode(b) for b in batches[:3]]
    old_life, new_life = ReplayShard(factory), ReplayShard(factory)
    assert old_life.add_frames(messages[0]).dropped == 0
    # messages[1] is lost with the shard's old life; the restarted shard gets messages[2]: a gap
    answer = new_life.add_frames(messages[2])
    assert answer.dropped == len(batches[2]) and answer.stats.size == 0
    encoder.reset()  # (the writer, told so by the answer)
    reference = factory()
    for batch in batches[3:]:
        message = encoder.encode(batch)
        assert new_life.add_frames(message).dropped == 0
        reference.add(batch)
    assert new_life.dropped_rows == len(batches[2])
    assert_same_storage(new_life.buffer, reference)
    # a later message of the epoch found broken is dropped too; the first of the new epoch sent every frame
    assert messages[2].epoch == 0 and encoder.epoch == 1


def test_a_message_after_a_lost_one_of_the_same_epoch_is_dropped_whole() -> None:
    batches = catch_rows(20)
    encoder, decoder = FrameEncoder(3, 0), FrameDecoder()
    messages = [encoder.encode(b) for b in batches[:4]]
    assert decoder.decode(messages[0]) is not None
    assert decoder.decode(messages[2]) is None  # messages[1] lost
    assert decoder.decode(messages[3]) is None  # the epoch stays broken: its frames are missing
    encoder.reset()
    rebuilt = decoder.decode(encoder.encode(batches[4]))
    assert rebuilt is not None and all(np.array_equal(rebuilt[k], batches[4][k]) for k in batches[4].keys())


def test_frames_with_one_hash_and_other_bytes_are_both_sent() -> None:
    """The hash only proposes a match; bytes decide (here every frame's hash is forced equal)."""
    batches = catch_rows(30)
    encoder, decoder = FrameEncoder(5, 0, window=64), FrameDecoder()
    import ptl_rl.distributed.frame_wire as wire

    original = wire.frame_hashes
    wire.frame_hashes = lambda frames: np.zeros(len(frames), dtype=np.uint64)  # type: ignore[assignment]
    try:
        for batch in batches:
            rebuilt = decoder.decode(encoder.encode(batch))
            assert rebuilt is not None
            for key in batch.keys():
                assert rebuilt[key].tobytes() == batch[key].tobytes(), key
    finally:
        wire.frame_hashes = original


def test_frame_hashes_are_equal_for_equal_bytes_and_handle_any_length() -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(6, 13), dtype=np.uint8)  # 13 bytes: not a multiple of 8
    frames[3] = frames[1]
    hashes = frame_hashes(frames)
    assert hashes[3] == hashes[1]
    assert len(set(hashes.tolist())) == 5

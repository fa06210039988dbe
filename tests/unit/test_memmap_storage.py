"""MemmapStorage: an ArrayStorage whose rings are memory-mapped .npy files, against an in-RAM twin."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

from ptl_rl import PrioritizedReplayBuffer, ReplayBuffer, TransitionBatch
from ptl_rl.replay import MemmapStorage, load_buffer, save_buffer


def rows(start: int, count: int) -> TransitionBatch:
    """Rows numbered ``start ..``: every field a function of the row number (Dict obs and an extra included)."""
    i = np.arange(start, start + count)
    return TransitionBatch(
        obs={"pixels": (i[:, None, None] + np.arange(12).reshape(3, 4)).astype(np.uint8), "state": i[:, None] * 0.5},
        action=i % 5,
        reward=i * 1.0,  # float64: stored as the contract's float32
        next_obs={"pixels": (i[:, None, None] + 1 + np.arange(12).reshape(3, 4)).astype(np.uint8), "state": i[:, None]},
        terminated=i % 7 == 0,
        truncated=i % 11 == 0,
        discount=np.full(count, 0.9, np.float32),
        env_id=i % 3,
        log_prob=-i.astype(np.float32),
    )


def npy_data_offset(path: str) -> int:
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        read_header(f)
        return f.tell()


def fill(buffer, batches: int = 9) -> None:
    for k in range(batches):  # 9 * 5 = 45 rows into 17 slots: the ring wraps twice
        buffer.add(rows(5 * k, 5))


def assert_same(a, b) -> None:
    every = np.arange(len(a))
    x, y = a.storage.gather(every), b.storage.gather(every)
    for name in y.keys():
        if isinstance(y[name], dict):
            for key in y[name]:
                np.testing.assert_array_equal(x[name][key], y[name][key], err_msg=f"{name}.{key}")
        else:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def test_contents_live_in_files_of_the_expected_size(tmp_path):
    buffer = ReplayBuffer(None, 17, storage=functools.partial(MemmapStorage, memmap_dir=tmp_path / "mm"))
    twin = ReplayBuffer(None, 17)
    fill(buffer)
    fill(twin)
    assert_same(buffer, twin)
    storage = buffer.storage
    assert isinstance(storage.fields["obs"]["pixels"], np.memmap)
    storage.flush()
    expected = {
        "obs.pixels": (np.uint8, (17, 3, 4)),
        "obs.state": (np.float64, (17, 1)),
        "reward": (np.float32, (17,)),
        "terminated": (np.bool_, (17,)),
        "env_id": (np.int64, (17,)),
        "log_prob": (np.float32, (17,)),
    }
    for name, (dtype, shape) in expected.items():
        path = os.path.join(tmp_path, "mm", f"{name}.npy")
        on_disk = np.load(path, mmap_mode="r")
        assert on_disk.dtype == dtype and on_disk.shape == shape, name
        # the data, in the file: what the ring holds, slot for slot
        leaf = storage.fields
        for key in name.split("."):
            leaf = leaf[key]
        np.testing.assert_array_equal(on_disk, leaf)
        assert os.path.getsize(path) == npy_data_offset(path) + np.dtype(dtype).itemsize * int(np.prod(shape))
    assert npy_data_offset(os.path.join(tmp_path, "mm", "reward.npy")) == 128  # numpy's usual .npy header


def test_state_dict_round_trip_into_a_fresh_and_the_same_storage(tmp_path):
    make = lambda d: PrioritizedReplayBuffer(None, 17, seed=0, storage=functools.partial(MemmapStorage, memmap_dir=d))  # noqa: E731
    buffer = make(tmp_path / "a")
    fill(buffer)
    blob = tmp_path / "state.pt"
    torch.save(buffer.state_dict(), blob)
    state = torch.load(blob, weights_only=True)
    restored = make(tmp_path / "b")
    restored.load_state_dict(state)
    assert_same(restored, buffer)
    assert isinstance(restored.storage.fields["reward"], np.memmap)
    np.testing.assert_array_equal(restored.draws.priorities(), buffer.draws.priorities())
    buffer.load_state_dict(state)  # into itself: its own files are reused
    assert_same(restored, buffer)
    buffer.load_state_dict(buffer.state_dict())  # its own views (no copy in between): the files stay valid
    assert_same(restored, buffer)
    fill(restored, 3)
    fill(buffer, 3)
    assert_same(restored, buffer)


@pytest.mark.parametrize("memmap", [True, False])
def test_directory_save_and_load(tmp_path, memmap):
    storage = functools.partial(MemmapStorage, memmap_dir=tmp_path / "mm") if memmap else None
    buffer = ReplayBuffer(None, 17, seed=3, storage=storage)
    fill(buffer)
    save_buffer(buffer, tmp_path / "save")
    restored_storage = functools.partial(MemmapStorage, memmap_dir=tmp_path / "mm2") if memmap else None
    restored = ReplayBuffer(None, 17, seed=5, storage=restored_storage)
    load_buffer(restored, tmp_path / "save")
    assert_same(restored, buffer)
    assert restored.rng.bit_generator.state == buffer.rng.bit_generator.state
    assert (restored.storage.cursor, restored.storage.total_added) == (
        buffer.storage.cursor,
        buffer.storage.total_added,
    )
    np.testing.assert_array_equal(restored.sample(8)["action"], buffer.sample(8)["action"])
    from ptl_rl import FrameStorage

    wrong = ReplayBuffer(None, 17, storage=functools.partial(FrameStorage, stack_axis=0))
    with pytest.raises(ValueError, match="storage= it was saved with"):
        load_buffer(wrong, tmp_path / "save")


def test_a_directory_holds_one_storage(tmp_path):
    first = ReplayBuffer(None, 17, storage=functools.partial(MemmapStorage, memmap_dir=tmp_path))
    first.add(rows(0, 3))
    second = ReplayBuffer(None, 17, storage=functools.partial(MemmapStorage, memmap_dir=tmp_path))
    with pytest.raises(FileExistsError, match="fresh directory per buffer"):
        second.add(rows(0, 3))

"""BatchSampler and the torch batch: names, shapes, dtypes, zero copy, devices, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ptl_rl
from ptl_rl import BatchSampler, ReplayBuffer, TorchBatch, TransitionBatch


def filled_buffer(rows: int = 40) -> ReplayBuffer:
    ids = np.arange(rows)
    buffer = ReplayBuffer(None, 64, warmup=0, seed=0)
    buffer.add(
        TransitionBatch(
            obs={"pos": np.stack([ids, -ids], 1).astype(np.float32), "flag": (ids % 2 == 0)},
            action=ids.astype(np.int64),
            reward=ids.astype(np.float32),
            next_obs={"pos": np.stack([ids + 1, -ids], 1).astype(np.float32), "flag": (ids % 3 == 0)},
            terminated=ids % 5 == 0,
            truncated=ids % 7 == 0,
            discount=np.full(rows, 0.9, np.float32),
            env_id=np.zeros(rows, np.int64),
            value=ids.astype(np.float64) * 2,
        )
    )
    return buffer


def test_sampler_yields_torch_batches_with_the_same_fields() -> None:
    buffer = filled_buffer()
    sampler = BatchSampler(iter(lambda: buffer, None), batch_size=12)
    batch = next(sampler)
    assert isinstance(batch, TorchBatch) and len(batch) == 12
    assert set(batch.keys()) == set(buffer.storage.fields)
    assert batch.obs["pos"].shape == (12, 2) and batch.obs["pos"].dtype == torch.float32
    assert batch.obs["flag"].dtype == torch.bool
    assert batch.action.dtype == torch.int64 and batch.value.dtype == torch.float64
    # rows stay aligned across fields, including nested ones
    torch.testing.assert_close(batch.obs["pos"][:, 0], batch.action.float())
    torch.testing.assert_close(batch.next_obs["pos"][:, 0], batch.action.float() + 1)
    torch.testing.assert_close(batch.value, batch.action.double() * 2)
    assert batch.extras.keys() == {"value"}


def test_torch_batch_shares_memory_with_the_gathered_arrays() -> None:
    numpy_batch = filled_buffer().sample(8)
    torch_batch = numpy_batch.to_torch()
    numpy_batch["reward"][0] = 123.0
    assert torch_batch.reward[0].item() == 123.0


def test_torch_batch_moves_with_to_and_lightning_transfer() -> None:
    from lightning_fabric.utilities.apply_func import move_data_to_device

    batch = filled_buffer().sample(4).to_torch()
    moved = move_data_to_device(batch, torch.device("cpu"))
    assert isinstance(moved, TorchBatch)
    assert moved.obs["pos"].device.type == "cpu"
    meta = batch.to("meta")
    assert meta.obs["pos"].device.type == "meta" and meta.action.device.type == "meta"


def test_sampler_device_argument() -> None:
    buffer = filled_buffer()
    batch = next(BatchSampler(iter(lambda: buffer, None), 4, device="cpu"))
    assert batch.reward.device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_batches_reach_the_gpu() -> None:
    buffer = filled_buffer()
    batch = next(BatchSampler(iter(lambda: buffer, None), 4, pin_memory=True))
    assert batch.reward.is_pinned()
    cuda = batch.to("cuda", non_blocking=True)
    torch.testing.assert_close(cuda.reward.cpu(), batch.reward)


def test_pin_memory_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    with pytest.raises(ValueError, match="pin_memory=True needs a CUDA device"):
        BatchSampler(iter([]), 4, pin_memory=True)


def test_batch_larger_than_buffer_before_warmup_is_reported() -> None:
    buffer = ReplayBuffer(None, 1000, warmup=0)
    buffer.add(filled_buffer(10).sample(10))
    sampler = BatchSampler(iter(lambda: buffer, None), batch_size=32)
    with pytest.raises(ValueError, match="batch of 32 from a buffer holding 10"):
        next(sampler)
    assert len(buffer) == 10


def test_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        BatchSampler(iter([]), 0)


def test_public_api_is_importable_from_the_package() -> None:
    for name in ptl_rl.__all__:
        assert getattr(ptl_rl, name) is not None

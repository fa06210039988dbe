"""BatchSampler: draws batches from a replay stage and hands them over as torch tensors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch

from ptl_rl.batch import TorchBatch, TransitionBatch


class Sampleable(Protocol):
    """Anything with ``sample(batch_size) -> TransitionBatch`` (a replay buffer)."""

    def sample(self, batch_size: int) -> TransitionBatch: ...


class BatchSampler:
    """Yields one :class:`TorchBatch` of ``batch_size`` transitions per upstream yield.

    Args:
        upstream: iterator yielding something to sample from (a
            :class:`~ptl_rl.buffers.ReplayBuffer` stage yields itself).
        batch_size: rows per batch; every tensor has leading dimension ``batch_size``.
        device: move the tensors there (default: stay on the CPU and let
            Lightning move the batch to the module's device).
        pin_memory: copy into page-locked memory first, so the host-to-GPU copy
            is asynchronous. Only useful with a CUDA device.

    Without ``device``/``pin_memory`` the tensors share memory with the freshly
    gathered numpy arrays (no copy beyond the gather itself). Field names,
    shapes and dtypes are those of the buffer: ``obs`` [B, *obs_shape],
    ``action`` [B, *action_shape], ``reward``/``discount`` float32 [B],
    ``terminated``/``truncated`` bool [B], ``env_id`` int64 [B], extras.
    """

    def __init__(
        self,
        upstream: Iterator[Sampleable],
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        pin_memory: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if pin_memory and not torch.cuda.is_available():
            raise ValueError("pin_memory=True needs a CUDA device, and torch sees none; drop pin_memory")
        self.upstream = upstream
        self.batch_size = int(batch_size)
        self.device = torch.device(device) if device is not None else None
        self.pin_memory = bool(pin_memory)

    def __iter__(self) -> BatchSampler:
        return self

    def __next__(self) -> TorchBatch:
        source = next(self.upstream)
        return source.sample(self.batch_size).to_torch(self.device, pin_memory=self.pin_memory)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

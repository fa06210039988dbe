"""BatchSampler: draws batches from a replay stage and hands them over as torch tensors."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TorchBatch
from ptl_rl.core.clock import SETTINGS, StageClock, perf_counter_ns
from ptl_rl.core.protocols import Sampleable
from ptl_rl.core.stage import Stage
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.replay.buffer import ReplayBuffer
from ptl_rl.replay.rollout import RolloutBuffer
from ptl_rl.replay.windows import SequenceWindows
from ptl_rl.stages.nstep import NStepTransform
from ptl_rl.stages.source import ExperienceSource


class BatchSampler(Stage[TorchBatch]):
    """Yields one :class:`TorchBatch` of ``batch_size`` transitions per upstream yield.

    Args:
        upstream: a replay buffer stage (a :class:`~ptl_rl.replay.ReplayBuffer`
            stage yields itself once per ``transitions_per_yield`` collected
            transitions), any iterator yielding something with
            ``sample(batch_size)``, or a standalone buffer (``upstream=None``,
            filled with ``add()``), which is sampled as it is on every ``next()``.
        batch_size: rows per batch; every tensor has leading dimension ``batch_size``.
        device: move the tensors there (default: stay on the CPU and let
            Lightning move the batch to the module's device).
        pin_memory: copy into page-locked memory first, so the host-to-GPU copy
            is asynchronous. Only useful with a CUDA device, and only when that
            copy can overlap GPU work: pinning is one more host copy per batch,
            and a batch used at once is slower pinned (on an H200, batch 256 of
            CartPole 0.79x and batch 32 of 4x84x84 uint8 0.86x the pageable
            ``device="cuda"`` path, ``benchmarks/device_transfer.py``).

    Without ``device``/``pin_memory`` the tensors share memory with the freshly
    gathered numpy arrays (no copy beyond the gather itself). Field names,
    shapes and dtypes are those of the buffer: ``obs`` ``[B, *obs_shape]``,
    ``action`` ``[B, *action_shape]``, ``reward``/``discount`` float32 [B],
    ``terminated``/``truncated`` bool [B], ``env_id`` int64 [B], extras.

    Wiring mistakes are reported here rather than at the first ``next()``: a
    stage that yields transition batches (a source, an n-step stage) instead
    of a buffer, a :class:`~ptl_rl.replay.RolloutBuffer` (which batches by
    itself), and a ``batch_size`` larger than the buffer's ``warmup`` (the
    first sample would fail only after the whole warm-up).

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
        >>> buffer = ptl_rl.ReplayBuffer(ptl_rl.NStepTransform(source, n=3, gamma=0.99), 1_000, warmup=16, seed=0)
        >>> sampler = ptl_rl.BatchSampler(buffer, batch_size=8)
        >>> batch = next(sampler)
        >>> type(batch).__name__, batch.obs.shape, batch.obs.dtype, batch.terminated.dtype
        ('TorchBatch', torch.Size([8, 4]), torch.float32, torch.bool)
        >>> batch.discount.unique()  # gamma**3 (gamma**k, k < 3, for windows cut short by an episode end)
        tensor([0.9703])
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
        _check_upstream(upstream, int(batch_size))
        super().__init__(upstream)
        # a buffer without an upstream is filled with add(): sample it as it is instead of pulling from it
        self._standalone = isinstance(upstream, ReplayBuffer) and upstream.upstream is None
        self.batch_size = int(batch_size)
        self.device = torch.device(device) if device is not None else None
        self.pin_memory = bool(pin_memory)
        # time accounting (ptl_rl.profile): drawing and gathering rows, tensors (and a device copy), and the
        # moves of its batches to another device (Lightning's batch transfer calls TorchBatch.to)
        self._sample_clock = StageClock("sample", "rows")
        self._torch_clock = StageClock("conversion to torch", "rows")
        self._transfer_clock = StageClock("host-to-device copy", "rows", optional=True)
        self.clock = StageClock("sampler", "batches", (self._sample_clock, self._torch_clock, self._transfer_clock))

    def step(self) -> TorchBatch:
        """Pull the buffer (or take the standalone one) and draw one batch of ``batch_size`` rows as tensors."""
        # standalone: the upstream is the ReplayBuffer itself (a Sampleable as well as an iterator)
        source = cast(Sampleable, self.upstream) if self._standalone else self.pull()
        try:  # a Sampleable; checked here, as what a plain iterator yields is only known now
            sample = source.sample
        except AttributeError:
            raise TypeError(
                _nothing_to_sample(f"its upstream yielded a {type(source).__name__}", self.batch_size)
            ) from None
        if not SETTINGS.profiling:
            return sample(self.batch_size).to_torch(self.device, pin_memory=self.pin_memory)
        t0 = perf_counter_ns()
        batch = sample(self.batch_size)
        t1 = perf_counter_ns()
        out = batch.to_torch(self.device, pin_memory=self.pin_memory).time_transfers(self._transfer_clock)
        t2 = perf_counter_ns()
        rows = len(batch)
        self._sample_clock.add(t1 - t0, rows)
        self._torch_clock.add(t2 - t1, rows)
        return out

    def snapshot(self) -> object:
        return None  # no state of its own: the sampling RNG lives in the buffer

    def restore(self, snapshot: object) -> None:
        pass

    def count(self, out: object) -> int:
        return 1  # batches

    def __repr__(self) -> str:
        """``BatchSampler(batch_size=..., [device=...])`` and the chain upstream."""
        placement: dict[str, object] = {"device": self.device} if self.device is not None else {}
        if self.pin_memory:
            placement["pin_memory"] = True
        return stage_repr(self, batch_size=self.batch_size, **placement)

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """Nothing but the format version: the sampling RNG lives in the buffer."""
        return versioned({}, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)


def _check_upstream(upstream: Any, batch_size: int) -> None:
    """Raise, naming the fix, for an upstream that cannot feed a sampler (see the class docstring)."""
    if upstream is None:
        raise TypeError(
            "BatchSampler needs a buffer to draw from, got None; pass a ReplayBuffer (a pipeline stage, or a "
            "standalone buffer filled with add())"
        )
    if isinstance(upstream, RolloutBuffer):
        raise TypeError(
            "a RolloutBuffer yields its own minibatches (TorchBatch); do not wrap it in a BatchSampler. Pass it "
            "to to_dataloader(rollout, steps_per_epoch=rollout.batches_per_rollout)"
        )
    if isinstance(upstream, (ExperienceSource, NStepTransform)):
        raise TypeError(
            _nothing_to_sample(f"its upstream {type(upstream).__name__} yields transition batches", batch_size)
        )
    if isinstance(upstream, ReplayBuffer) and not isinstance(upstream.draws, SequenceWindows):
        _check_fits(upstream, batch_size)


def _check_fits(buffer: ReplayBuffer, batch_size: int) -> None:
    """A batch needs ``batch_size`` stored transitions: the warm-up must store that many before the first yield.

    (A buffer of :class:`~ptl_rl.replay.SequenceWindows` draws windows with replacement and has no such bound.)
    """
    name = type(buffer).__name__
    if batch_size > buffer.capacity:
        raise ValueError(
            f"batch_size={batch_size} exceeds the {name}'s capacity={buffer.capacity}; lower batch_size or raise "
            "capacity"
        )
    if buffer.upstream is not None and batch_size > buffer.warmup:
        raise ValueError(
            f"batch_size={batch_size} exceeds the {name}'s warmup={buffer.warmup}: the first batch would fail "
            f"right after the warm-up. Create the buffer with warmup >= {batch_size} (e.g. "
            f"{name}(upstream, capacity, warmup={batch_size})), or lower batch_size"
        )


def _nothing_to_sample(problem: str, batch_size: int) -> str:
    return (
        f"BatchSampler draws batches from a replay buffer, but {problem}, which have no sample(). Put a buffer "
        f"in between: BatchSampler(ReplayBuffer(upstream, capacity=100_000), batch_size={batch_size})"
    )

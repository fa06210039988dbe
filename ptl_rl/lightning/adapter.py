"""The DataLoader adapter: a live pipeline as the ``train_dataloaders`` of ``trainer.fit``.

Everything here works with the Trainer of either Lightning package
(``pytorch_lightning`` or ``lightning.pytorch``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import torch
from torch.utils.data import DataLoader, IterableDataset

from ptl_rl.core.batch import TorchBatch, TransitionBatch
from ptl_rl.core.chain import holds_replay
from ptl_rl.core.protocols import OnPolicyStage
from ptl_rl.core.ranks import assign_rank, distributed_rank
from ptl_rl.lightning.checkpoint import is_checkpointed, note_checkpointed
from ptl_rl.lightning.stops import stop_known
from ptl_rl.stages.nstep import NStepTransform
from ptl_rl.stages.source import ExperienceSource

__all__ = ["BatchGroup", "PipelineDataset", "PipelineLoader", "check_last_stage", "to_dataloader"]

# The adapter always uses num_workers=0, on purpose (the agent must act with the learner's current weights,
# in this process), and with one worker a length on an IterableDataset is exact. Lightning warns about both while
# it sets the loader up, before the loader runs any code, so these two messages are silenced when a ptl_rl loader
# is made (not at import): Lightning gives no per-loader way.


class _Epoch:
    """``steps`` batches of ``take()`` (``None``: endless); a call that raises does not count as a batch."""

    def __init__(self, take: Callable[[], Any], steps: int | None) -> None:
        self.take, self.remaining = take, steps

    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> Any:
        if self.remaining is None:
            return self.take()
        if self.remaining <= 0:
            raise StopIteration
        batch = self.take()
        self.remaining -= 1
        return batch


class BatchGroup:
    """The next ``size`` batches of a pipeline, for a ``training_step`` that takes several gradient steps.

    What :func:`to_dataloader` hands over with ``batches_per_step=K > 1``.
    Iterate ``group.batches()`` in ``training_step`` and take one gradient step
    per batch (manual optimization)::

        def training_step(self, group, batch_idx):
            optimizer = self.optimizers()
            for batch in group.batches():  # each batch is pulled only now, after the previous gradient step
                loss = self.loss(batch)
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()

    Each batch is pulled from the pipeline when the loop asks for it, so the
    env steps behind batch ``i + 1`` are taken with the weights that batch
    ``i`` produced: the data is exactly what K Lightning steps of one batch
    would see (fresher, even: Lightning prefetches one batch, and only the
    empty group is prefetched here). Lightning's per-step work (its loop,
    hooks, callbacks, logging) then runs once per K gradient steps.

    Fewer than ``size`` batches come when the pipeline ends. The group is not
    an ``Iterable`` on purpose: Lightning's batch-size inference iterates
    iterable batches, which would pull data behind the loop's back.
    ``Trainer(max_steps=...)`` counts optimizer steps and is checked between
    groups, like :class:`~ptl_rl.callbacks.EnvStepLimit`: a run may end up to
    ``K - 1`` batches after the limit.
    """

    def __init__(self, take: Callable[[], Any], size: int) -> None:
        self._take, self.size = take, int(size)
        self.taken = 0  # batches pulled so far
        self._device: torch.device | None = None
        self._to_kwargs: dict[str, Any] = {}

    def to(self, device: torch.device | str, **kwargs: Any) -> BatchGroup:
        """Move every batch to ``device`` as it is pulled (Lightning calls this for the group)."""
        self._device, self._to_kwargs = torch.device(device), kwargs
        return self

    def batches(self) -> Iterator[Any]:
        """The group's batches, each pulled from the pipeline when asked for."""
        return _GroupBatches(self)

    def _next(self) -> Any:
        if self.taken >= self.size:
            raise StopIteration
        batch = self._take()  # a call that raises (an interrupt) takes nothing
        self.taken += 1
        if self._device is None:
            return batch
        if isinstance(batch, tuple):
            return tuple(field.to(self._device, **self._to_kwargs) for field in batch)
        return batch.to(self._device, **self._to_kwargs)

    def __repr__(self) -> str:
        return f"BatchGroup(size={self.size}, taken={self.taken})"

    # Neither __iter__ (which would make the group an Iterable for Lightning's batch-size inference) nor a
    # length (fewer batches come when the pipeline ends); a loop or len() on the group gets the way to use it.
    def __getitem__(self, index: Any) -> Any:
        raise TypeError(self._how_to_use("cannot be indexed or iterated"))

    def __len__(self) -> int:
        raise TypeError(self._how_to_use("has no length"))

    def __bool__(self) -> bool:
        return True  # without it, bool(group) would call __len__

    def _how_to_use(self, problem: str) -> str:
        return (
            f"a BatchGroup {problem}: it pulls its batches from the pipeline one by one, each after the previous "
            "gradient step. Loop over group.batches() (one gradient step per batch); group.size is the most it "
            "yields (fewer when the pipeline ends)."
        )


class _GroupBatches:
    """Iterator over a :class:`BatchGroup` (an object, not a generator: an interrupt inside must not close it)."""

    def __init__(self, group: BatchGroup) -> None:
        self.group = group

    def __iter__(self) -> _GroupBatches:
        return self

    def __next__(self) -> Any:
        return self.group._next()


#: What the adapter's loader yields: a torch batch, the tuple of its ``as_tuple`` fields, or a :class:`BatchGroup`.
LoaderItem: TypeAlias = "TorchBatch | tuple[Any, ...] | BatchGroup"


class PipelineDataset(IterableDataset[LoaderItem]):
    """An IterableDataset over a live pipeline, ``steps_per_epoch`` batches per epoch.

    Every epoch continues the same pipeline iterator: environments, windows
    and buffers carry over between epochs. Without ``steps_per_epoch`` the
    dataset has no length and Lightning sees one endless epoch (stop it with
    ``Trainer(max_steps=...)`` or :class:`~ptl_rl.callbacks.EnvStepLimit`).
    With ``as_tuple`` each batch is handed over as the tuple of those fields.
    With ``batches_per_step=K > 1`` each item is a :class:`BatchGroup` of the
    next K batches (``steps_per_epoch`` then counts groups).

    When it starts iterating inside ``torch.distributed`` (a DDP run), it gives
    every stage the process's rank first (:func:`~ptl_rl.core.ranks.assign_rank`),
    so ranks collect and sample different data.
    """

    def __init__(
        self,
        pipeline: Iterator[TorchBatch],
        steps_per_epoch: int | None = None,
        as_tuple: Sequence[str] | None = None,
        batches_per_step: int = 1,
    ) -> None:
        super().__init__()
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1 or None, got {steps_per_epoch}")
        if int(batches_per_step) != batches_per_step or batches_per_step < 1:
            raise ValueError(f"batches_per_step must be an integer >= 1, got {batches_per_step!r}")
        self.pipeline = pipeline
        self.batches_per_step = int(batches_per_step)
        self.steps_per_epoch = steps_per_epoch
        self.as_tuple = tuple(as_tuple) if as_tuple is not None else None
        self.stop_condition_checked = False  # set by a callback that saw the Trainer's limits
        self._iterator: Iterator[TorchBatch] | None = None
        self._first = True

    def __iter__(self) -> Iterator[Any]:
        if self._iterator is None:
            self._start()
        # an iterator object, not a generator: an exception inside next() (a notebook interrupt) would close a
        # generator, and every later next() on the same loader iterator would end the epoch without a word
        return _Epoch(self._next if self.batches_per_step == 1 else self._group, self.steps_per_epoch)

    def _start(self) -> None:
        rank, world_size = distributed_rank()
        if world_size > 1:
            assign_rank(self.pipeline, rank)
        if self.steps_per_epoch is None and not (self.stop_condition_checked or stop_known(self.pipeline)):
            warnings.warn(
                "this ptl_rl loader has no length (steps_per_epoch=None), so Lightning runs one endless epoch: "
                "training ends only at Trainer(max_steps=...), an EnvStepLimit callback or an interrupt, and "
                "max_epochs never stops it. Pass steps_per_epoch to to_dataloader for finite epochs.",
                UserWarning,
                stacklevel=3,
            )
        self._iterator = iter(self.pipeline)

    def _group(self) -> BatchGroup:
        return BatchGroup(self._next, self.batches_per_step)

    def _next(self) -> Any:
        batch = next(self._iterator)  # type: ignore[arg-type]  # set by _start, which __iter__ runs before any _next
        if self._first:
            self._first = False
            _check_first_batch(self.pipeline, batch)
        if self.as_tuple is not None:
            return batch.as_tuple(self.as_tuple)
        return batch

    def __len__(self) -> int:
        if self.steps_per_epoch is None:
            raise TypeError("this PipelineDataset is endless (steps_per_epoch=None)")
        return self.steps_per_epoch


class PipelineLoader(DataLoader[LoaderItem]):
    """The DataLoader :func:`to_dataloader` returns.

    It has ``state_dict`` only to notice checkpoints: Lightning asks every
    stateful loader for its state when it writes one. If no
    :class:`PipelineCheckpoint` (or :class:`RLDataModule`) saves this
    pipeline, it warns once: resuming from that checkpoint would start with an
    empty replay and fresh counters.
    """

    dataset: PipelineDataset

    def state_dict(self) -> dict[str, Any]:
        if not is_checkpointed(self.dataset.pipeline):
            warnings.warn(
                "a Lightning checkpoint is being written without the ptl_rl pipeline's state (replay, n-step "
                "windows, RNG, epsilon, env-step counters): resuming from it restarts collection from scratch. "
                "Add ptl_rl.PipelineCheckpoint(loader) to the Trainer's callbacks, or use ptl_rl.RLDataModule.",
                UserWarning,
                stacklevel=2,
            )
            note_checkpointed(self.dataset.pipeline)  # warn once per pipeline
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass  # the pipeline's state is restored by PipelineCheckpoint


def _as_is(batch: Any) -> Any:
    return batch


def _check_first_batch(pipeline: object, batch: object) -> None:
    """Stages ``check_last_stage`` cannot know by type (a user's, a dataset reader) show it in their first batch."""
    if isinstance(batch, TransitionBatch):
        raise TypeError(
            f"the last stage, {type(pipeline).__name__}, yields numpy TransitionBatches, not torch batches: put a "
            "replay buffer and a sampler behind it, ptl_rl.BatchSampler(ptl_rl.ReplayBuffer(stage, capacity=...), "
            "batch_size=...), or convert with batch.to_torch() in a stage of your own"
        )


def check_last_stage(pipeline: object) -> None:
    """Raise, naming the fix, for a last stage that yields no torch batches (a buffer, a source, an n-step stage)."""
    if holds_replay(pipeline) or isinstance(pipeline, (ExperienceSource, NStepTransform)):
        kind = type(pipeline).__name__
        raise TypeError(
            f"to_dataloader got a {kind}, which yields "
            + ("the buffer itself" if holds_replay(pipeline) else "numpy TransitionBatches")
            + ", not torch batches: end the pipeline with a sampler, "
            f"to_dataloader(ptl_rl.BatchSampler({'buffer' if holds_replay(pipeline) else 'replay_buffer'}, "
            "batch_size=...)), or with a RolloutBuffer for on-policy training"
        )


def to_dataloader(
    pipeline: Iterator[TorchBatch],
    steps_per_epoch: int | None = None,
    *,
    as_tuple: Sequence[str] | None = None,
    batches_per_step: int = 1,
) -> PipelineLoader:
    """Wrap the last pipeline stage as a DataLoader for ``trainer.fit``.

    ``batch_size=None`` (the pipeline already batches), ``num_workers=0`` (the
    agent must act with the learner's current weights, in this process), and
    batches are passed through unchanged. ``steps_per_epoch`` sets
    ``len(loader)``; ``None`` makes one endless epoch, except for an on-policy
    stage with ``batches_per_rollout`` (a :class:`~ptl_rl.replay.RolloutBuffer`),
    which gets one Lightning epoch per rollout: a sized loader keeps Lightning
    from prefetching, so a rollout is collected only after the last update on
    the previous one.

    ``as_tuple`` hands each batch over as a tuple of those fields instead of a
    :class:`~ptl_rl.core.batch.TorchBatch`, for modules that unpack tuples, e.g.
    ``as_tuple=ptl_rl.BOLTS_FIELDS`` gives ``(states, actions, rewards, dones,
    next_states)`` with ``dones = terminated``. Such modules bootstrap with a
    fixed gamma, which is right only for 1-step data; with n-step returns add
    ``"discount"`` to the tuple and use it in place of gamma.

    ``batches_per_step=K > 1`` (opt-in, for small networks) hands over a
    :class:`BatchGroup` of the next K batches per Lightning step, for a
    ``training_step`` that takes K gradient steps by hand: Lightning's fixed
    cost per step is then paid once per K gradient steps, and every batch is
    still pulled after the previous gradient step. ``steps_per_epoch`` counts
    groups; an on-policy stage's ``batches_per_rollout`` must be a multiple of K.

    The pipeline's state is checkpointed only with a :class:`PipelineCheckpoint`
    callback (or through :class:`RLDataModule`); the loader warns when a
    checkpoint is written without one.

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
        >>> sampler = ptl_rl.BatchSampler(ptl_rl.ReplayBuffer(source, 1_000, warmup=16), batch_size=8)
        >>> loader = ptl_rl.to_dataloader(sampler, steps_per_epoch=3)  # trainer.fit(model, train_dataloaders=loader)
        >>> len(loader), [batch.reward.shape for batch in loader]
        (3, [torch.Size([8]), torch.Size([8]), torch.Size([8])])
    """
    check_last_stage(pipeline)
    if steps_per_epoch is None:
        steps_per_epoch = _rollout_groups(pipeline, batches_per_step)
    dataset = PipelineDataset(pipeline, steps_per_epoch, as_tuple, batches_per_step)
    return PipelineLoader(dataset, batch_size=None, num_workers=0, collate_fn=_as_is)


def _rollout_groups(pipeline: object, batches_per_step: int) -> int | None:
    """Loader items per rollout of an on-policy stage (``None`` for others): one Lightning epoch per rollout."""
    if not isinstance(pipeline, OnPolicyStage):
        return None
    per_rollout = pipeline.batches_per_rollout
    if per_rollout % batches_per_step:
        raise ValueError(
            f"batches_per_step={batches_per_step} does not divide the {per_rollout} batches of a rollout: a group "
            "would span two rollouts; pick a divisor of batches_per_rollout"
        )
    return per_rollout // batches_per_step

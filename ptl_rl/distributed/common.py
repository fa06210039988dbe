"""What the collectors of every engine share: the factory protocol, worker ranks, version stamps, weights.

A collector (a background process, a Ray actor) builds its own pipeline by
calling a user factory, so that nothing unpicklable (an env, a CUDA module, an
open file) crosses a process boundary: only the factory itself (a module-level
function or a ``functools.partial`` of one) and plain numpy/tensor data do. What the learner keeps
of the messages it receives (counters, staleness) is in :mod:`ptl_rl.distributed.intake`.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.chain import pipeline_stages
from ptl_rl.stages.source import Episode, ExperienceSource

VERSION_FIELD = "policy_version"


class WorkerInfo(NamedTuple):
    """What a factory is told about the collector it builds for.

    Attributes:
        rank: pass it as ``ExperienceSource(..., rank=info.rank)``: it offsets
            the env seeds and ``env_id``. It is distinct for every worker,
            every restart of a worker and every DDP rank (see
            ``ptl_rl.distributed.common.worker_rank``), so a restarted worker is seeded afresh and
            its episodes never share an ``env_id`` with the episodes its
            predecessor left unfinished, nor with another DDP rank's workers.
        worker: index of the worker, ``0 .. num_workers - 1``.
        incarnation: how many times this worker was (re)started before, 0 at first.
        num_workers: how many workers there are.
    """

    rank: int
    worker: int
    incarnation: int
    num_workers: int


def worker_rank(worker: int, incarnation: int, num_workers: int, ddp_rank: int = 0, world_size: int = 1) -> int:
    """The rank (of env seeds and ``env_id``) of one incarnation of one worker of one DDP rank.

    ``ddp_rank + world_size * (worker + num_workers * incarnation)``: the DDP
    ranks interleave, each owning the ranks congruent to it modulo
    ``world_size``, and within a DDP rank the incarnations follow each other
    in blocks of ``num_workers``. So ranks are disjoint across DDP ranks,
    workers and incarnations, with no bound on the number of restarts, and a
    single process (``world_size`` 1) gets ``worker + num_workers * incarnation``.
    """
    if not 0 <= ddp_rank < world_size:
        raise ValueError(f"the DDP rank must be in [0, world_size = {world_size}), got {ddp_rank}")
    if not 0 <= worker < num_workers or incarnation < 0:
        raise ValueError(
            f"need 0 <= worker < num_workers = {num_workers} and incarnation >= 0, got {worker}, {incarnation}"
        )
    return int(ddp_rank) + int(world_size) * (int(worker) + int(num_workers) * int(incarnation))


class Collector(NamedTuple):
    """What a factory returns: the pipeline to iterate and the module the learner's weights go into.

    Attributes:
        pipeline: the last stage of the collector's chain, an iterator of
            :class:`~ptl_rl.core.batch.TransitionBatch` (an :class:`ExperienceSource`
            or an :class:`~ptl_rl.stages.nstep.NStepTransform` over one). It must
            contain an ``ExperienceSource`` (its agent is wrapped to stamp versions).
        policy: anything with ``load_state_dict`` (an ``nn.Module`` the agent
            acts with), or ``None`` when the collector never takes weights.
    """

    pipeline: Iterator[TransitionBatch]
    policy: Any = None


Factory = Callable[[WorkerInfo], Collector | tuple[Any, Any]]


class VersionStampingAgent:
    """Wraps an agent so every step's extras hold ``policy_version`` (int64 [N]).

    The version is the one of the weights that chose the action, so after an
    :class:`~ptl_rl.stages.nstep.NStepTransform` (which keeps the extras of a window's
    first step) each transition carries the version of the policy that took its
    action. Hooks of the wrapped agent (``reset_state``, ``on_env_steps``,
    ``state_dict``, ...) are forwarded.
    """

    def __init__(self, agent: Callable[[Any], Any], num_envs: int) -> None:
        self.agent = agent
        self.version = 0
        self._stamp = np.zeros(num_envs, dtype=np.int64)

    def set_version(self, version: int) -> None:
        self.version = int(version)
        self._stamp = np.full(len(self._stamp), self.version, dtype=np.int64)

    def __call__(self, obs: Any) -> tuple[Any, dict[str, Any]]:
        out = self.agent(obs)
        actions, extras = out if isinstance(out, tuple) else (out, None)
        extras = dict(extras) if extras else {}
        if VERSION_FIELD in extras:
            raise ValueError(f"the agent returns an extra named {VERSION_FIELD!r}; the collector adds that field")
        extras[VERSION_FIELD] = self._stamp  # a fresh array per version: batches already sent keep theirs
        return actions, extras

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["agent"], name)


class BuiltCollector:
    """A factory's collector made ready to run: version stamping installed, weights loadable."""

    def __init__(self, factory: Factory, info: WorkerInfo) -> None:
        built = factory(info)
        if not isinstance(built, tuple):
            built = Collector(built, None)
        self.pipeline, self.policy = built[0], built[1]
        sources = [s for s in pipeline_stages(self.pipeline) if isinstance(s, ExperienceSource)]
        if not sources:
            raise TypeError(
                f"the collector factory returned {type(self.pipeline).__name__}, whose chain has no "
                "ExperienceSource; return Collector(pipeline=<ExperienceSource or NStepTransform over one>, policy=...)"
            )
        self.source: ExperienceSource = sources[0]
        if self.source.rank != info.rank:
            raise ValueError(
                f"the factory built ExperienceSource(rank={self.source.rank}) for a worker of rank {info.rank}; "
                "pass rank=info.rank so every worker (and every restart) has its own env ids and seeds"
            )
        self.stamper = VersionStampingAgent(self.source.agent, self.source.num_envs)
        # the source looks its agent up at every step; its hooks were bound at construction and stay valid
        self.source.agent = self.stamper
        self.version = -1  # no weights yet: the factory's own initial weights

    def set_weights(self, version: int, state_dict: Mapping[str, Any] | None) -> None:
        if state_dict is not None:
            if self.policy is None:
                raise RuntimeError(
                    "weights were pushed but the collector factory returned no policy to load them into; "
                    "return Collector(pipeline, policy=<the nn.Module the agent acts with>)"
                )
            with torch.no_grad():
                self.policy.load_state_dict(state_dict)
        self.version = int(version)
        self.stamper.set_version(max(self.version, 0))

    def restore_counters(self, total_steps: int, episodes_finished: int) -> None:
        """Continue the learner's env-step count (exploration schedules read it), with fresh episodes."""
        state = self.source.state_dict()
        state.update(total_steps=int(total_steps), episodes_finished=int(episodes_finished), recent=[])
        self.source.load_state_dict(state)

    def next_batch(self) -> tuple[TransitionBatch, int, list[Episode]]:
        """One batch of the pipeline, the source's env-step count after it and the episodes it finished."""
        batch = next(self.pipeline)
        return batch, self.source.total_steps, self.source.pop_episodes()


def weights_of(policy: Any) -> dict[str, torch.Tensor]:
    """A CPU snapshot of ``policy.state_dict()`` (detached copies: later optimizer steps do not change it)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}


def factory_name(factory: Callable[..., Any]) -> str:
    """How errors and reprs name a collector factory: its function's name (through ``functools.partial``)."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    if isinstance(factory, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return factory.__name__
    return type(factory).__name__

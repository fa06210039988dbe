"""The Ray actor a :class:`~ptl_rl.distributed.RayWorkers` worker runs: a collector built by the factory, stepped
per call, its rows returned to the learner or written into replay shards."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.distributed.common import BuiltCollector, Factory, WorkerInfo
from ptl_rl.distributed.shard_writer import ShardWriter
from ptl_rl.stages.source import Episode


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError naming the extra that installs it."""
    try:
        import ray  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise ImportError(
            "RayWorkers needs Ray, which ptl_rl does not install by default: pip install 'ptl_rl[ray]'"
        ) from exc
    return ray


class CollectorActor:
    """The body of one Ray actor: a collector built by the factory, stepped ``steps`` pipeline batches per call."""

    def __init__(
        self, factory: Factory, info: WorkerInfo, counters: tuple[int, int] | None, writer: ShardWriter | None = None
    ) -> None:
        torch.set_num_threads(1)
        self.collector = BuiltCollector(factory, info)
        self.writer = writer
        if counters is not None:
            self.collector.restore_counters(*counters)
        self.last_steps = self.collector.source.total_steps

    def collect(
        self, version: int, weights: Mapping[str, torch.Tensor] | None, steps: int
    ) -> tuple[TransitionBatch | None, int, list[Episode]]:
        """``steps`` pipeline batches as one batch (rows of all of them), env steps taken, episodes finished."""
        if weights is not None or self.collector.version < 0:
            self.collector.set_weights(version, weights)
        batches, episodes = [], []
        for _ in range(steps):  # a loop over vector steps, each a whole batch of rows
            batch, _, finished = self.collector.next_batch()
            if len(batch):
                batches.append(batch)
            episodes.extend(finished)
        total = self.collector.source.total_steps
        taken, self.last_steps = total - self.last_steps, total
        return (TransitionBatch.concat(batches) if batches else None), taken, episodes

    def collect_into_shards(
        self, version: int, weights: Mapping[str, torch.Tensor] | None, steps: int
    ) -> tuple[tuple[int, int], int, list[Episode]]:
        """As :meth:`collect`, but the rows go into the replay shards through this actor's writer, each pipeline
        batch as it comes; returns ``(rows stored, rows dropped)`` (every add answered before the call returns;
        dropped: in flight to a shard that died), env steps taken, episodes finished."""
        writer = self.writer
        assert writer is not None  # (RayWorkers calls this only with shards)
        batch, taken, episodes = self.collect(version, weights, steps)
        stored, dropped = writer.rows_stored, writer.rows_dropped
        if batch is not None:
            writer.add(batch)
        writer.flush()  # the learner counts only rows stored: a call that fails here counts none
        return (writer.rows_stored - stored, writer.rows_dropped - dropped), taken, episodes

    def pid(self) -> int:
        import os  # noqa: PLC0415

        return os.getpid()


_ACTOR_CLASS: Any = None


def collector_actor_class(ray: Any) -> Any:
    """The Ray actor class of :class:`CollectorActor` (made once per process, when Ray is first needed)."""
    global _ACTOR_CLASS  # noqa: PLW0603 - one remote class per process, made when Ray is first needed
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(CollectorActor)
    return _ACTOR_CLASS

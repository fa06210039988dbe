"""ReplayShards: K Ray actors, each holding a ptl_rl replay buffer, that writers fill and the learner samples.

::

    ray.init(num_cpus=...)      # ray.init(address="auto") on a cluster
    shards = ReplayShards(functools.partial(ptl_rl.ReplayBuffer, capacity=100_000,
                                            draws=ptl_rl.PrioritizedDraws()), num_shards=4)
    writer = shards.writer()    # picklable: hand it to collectors, they write directly
    replay = ShardedReplay(shards, warmup=1_000)
    to_dataloader(BatchSampler(replay, batch_size=256), steps_per_epoch=1_000)

Ray is imported when the shards start (``pip install 'ptl_rl[ray]'``). See ``docs/design/replay-service.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptl_rl.distributed.common import factory_name
from ptl_rl.distributed.replay_shard import BufferFactory, ReplayShard, ShardInfo, ShardStats
from ptl_rl.distributed.shard_writer import ShardWriter, ray_module

_ACTOR_CLASS: Any = None


def _actor_class(ray: Any) -> Any:
    global _ACTOR_CLASS  # noqa: PLW0603 - one remote class per process, made when Ray is first needed
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(ReplayShard)
    return _ACTOR_CLASS


class ReplayShards:
    """``num_shards`` Ray actors, each a :class:`~ptl_rl.distributed.replay_shard.ReplayShard` over ``factory()``.

    Args:
        factory: ``factory() -> ReplayBuffer`` (no upstream), pickled into
            each actor, which calls it once: every shard has its own storage
            and draw strategy, of the same configuration. ``capacity`` is per
            shard. E.g. ``functools.partial(ptl_rl.ReplayBuffer, capacity=100_000,
            draws=ptl_rl.PrioritizedDraws(alpha=0.6, beta=0.4))``.
        num_shards: ``K``; rows of env ``env_id`` live in shard ``env_id % K``.
        seed: seeds shard ``k``'s sampling generator with ``(seed, k)``
            (``None``: the factory's seed, the same in every shard).
        actor_options: passed to ``.options(...)`` of each actor; default
            ``{"num_cpus": 0}``: a shard mostly waits, so it reserves no CPU
            from the collectors (as RLlib's replay actors); give
            ``{"resources": ...}`` or a scheduling strategy to place shards.

    Ray must be initialised. The actors start at once; their first answer
    waits until each has imported ptl_rl.
    """

    def __init__(
        self,
        factory: BufferFactory,
        num_shards: int,
        *,
        seed: int | None = None,
        actor_options: Mapping[str, object] | None = None,
    ) -> None:
        if not callable(factory):
            raise TypeError(f"factory must be callable as factory() -> ReplayBuffer, got {type(factory).__name__}")
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        ray = self._ray = ray_module()
        if not ray.is_initialized():
            raise RuntimeError(
                "Ray is not initialised: call ray.init(num_cpus=...) on a single machine, or "
                "ray.init(address='auto') on a cluster node, before building ReplayShards"
            )
        self.factory = factory
        self.num_shards = int(num_shards)
        self.seed = seed
        self.actor_options = dict(actor_options or {"num_cpus": 0})
        cls = _actor_class(ray).options(**self.actor_options)
        self.handles: list[Any] = [cls.remote(factory, shard, seed) for shard in range(self.num_shards)]

    def __len__(self) -> int:
        return self.num_shards

    def writer(self, max_in_flight: int = 8) -> ShardWriter:
        """A :class:`~ptl_rl.distributed.ShardWriter` to these shards (picklable: give one to each collector)."""
        return ShardWriter(self.handles, max_in_flight)

    def info(self) -> ShardInfo:
        """How the shards draw (uniform or prioritized, beta), read from shard 0 (one factory makes them all)."""
        info: ShardInfo = self._ray.get(self.handles[0].info.remote())
        return info

    def stats(self) -> list[ShardStats]:
        """Each shard's size, draw mass and rows ever added, in shard order (waits for every shard)."""
        stats: list[ShardStats] = self._ray.get([handle.stats.remote() for handle in self.handles])
        return stats

    def close(self) -> None:
        """Kill the actors (their rows are lost)."""
        for handle in self.handles:
            self._ray.kill(handle, no_restart=True)
        self.handles = []

    def __repr__(self) -> str:
        return f"ReplayShards(num_shards={self.num_shards}, factory={factory_name(self.factory)})"

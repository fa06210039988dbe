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

import os
import time
from collections.abc import Mapping
from typing import Any

from ptl_rl.core.versions import check_version, versioned
from ptl_rl.distributed.common import factory_name
from ptl_rl.distributed.frame_wire import DEFAULT_WINDOW, FrameWire
from ptl_rl.distributed.rate_limit import RateLimit, RateLimiter
from ptl_rl.distributed.replay_shard import BufferFactory, ReplayShard, ShardInfo, ShardStats
from ptl_rl.distributed.shard_writer import ShardWriter, ray_module

_ACTOR_CLASSES: dict[type, Any] = {}

#: How long :meth:`ReplayShards.stats` waits for a restarting shard to answer again.
RESTART_WAIT_S = 60.0


def _actor_class(ray: Any, body: type) -> Any:
    """One remote class per body per process, made when Ray is first needed."""
    if body not in _ACTOR_CLASSES:
        _ACTOR_CLASSES[body] = ray.remote(body)
    return _ACTOR_CLASSES[body]


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
        rate_limit: a :class:`~ptl_rl.distributed.RateLimit` over the rows of
            all shards (Reverb's ``MinSize`` or ``SampleToInsertRatio``), kept
            by one more actor (:attr:`limiter`): writers' adds wait in Ray until
            their rows may be written, the learner's samples until their rows
            may be drawn. ``None``: no limit (the learner's ``warmup`` only).
        max_restarts: how many times Ray restarts a shard whose actor died
            (``-1``: always). A restarted shard is empty, with a new
            ``incarnation``: the learner goes on sampling the other shards,
            writers drop the adds that were in flight to it (counted in
            ``ShardWriter.rows_dropped``) and fill it again, and a priority
            update for a row of its earlier life is ignored.
        checkpoint_dir: where :meth:`state_dict` has each shard save its
            buffer (``<checkpoint_dir>/shard-<k>``, written by the shard's own
            process: a filesystem the shards and the learner share). ``None``:
            :meth:`state_dict` is refused.

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
        rate_limit: RateLimit | None = None,
        max_restarts: int = 10,
        checkpoint_dir: str | os.PathLike[str] | None = None,
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
        self.max_restarts = int(max_restarts)
        self.checkpoint_dir = None if checkpoint_dir is None else os.path.abspath(os.fspath(checkpoint_dir))
        # a call in flight when a shard dies fails (max_task_retries=0): an add retried on the new shard could
        # run after adds sent later, out of its env's order; calls sent while it restarts wait for it
        restart = {"max_restarts": self.max_restarts, "max_task_retries": 0}
        cls = _actor_class(ray, ReplayShard).options(**{**restart, **self.actor_options})
        self.handles: list[Any] = [cls.remote(factory, shard, seed) for shard in range(self.num_shards)]
        self._info: ShardInfo | None = None
        self.rate_limit = rate_limit
        self.limiter: Any = None
        if rate_limit is not None:
            self.limiter = _actor_class(ray, RateLimiter).options(num_cpus=0).remote(rate_limit)

    def __len__(self) -> int:
        return self.num_shards

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (the actor handles, not the module): another process connected to the same Ray cluster
        (``ray.init(address=...)``), e.g. each DDP rank's learner, samples these very shards."""
        state = dict(self.__dict__)
        del state["_ray"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ray = ray_module()

    def writer(
        self, max_in_flight: int = 8, *, dedup_frames: bool | None = None, frame_window: int = DEFAULT_WINDOW
    ) -> ShardWriter:
        """A :class:`~ptl_rl.distributed.ShardWriter` to these shards (picklable: give one to each collector).

        ``dedup_frames``: send each pixel frame once per shard (see
        :mod:`~ptl_rl.distributed.frame_wire`). ``None`` (default): when the
        shards' storage is a ``FrameStorage``; ``False``: full rows (as many
        bytes as the rows); ``True`` is refused for other storages.
        ``frame_window``: frames the writer and each shard keep per channel (a
        frame sent more than that many frames ago on the channel is sent again).
        """
        info = self.info() if dedup_frames is not False else None
        if dedup_frames and info is not None and not info.frames:
            raise ValueError(
                "dedup_frames=True sends frames that a shard's FrameStorage rebuilds stacks from, but these shards "
                "do not store pixel rows in a FrameStorage; leave dedup_frames=None"
            )
        frames = FrameWire(info.stack_axis, frame_window) if info is not None and info.frames else None
        return ShardWriter(self.handles, max_in_flight, self.limiter, frames)

    def info(self) -> ShardInfo:
        """How the shards draw (uniform or prioritized, beta), read from shard 0 (one factory makes them all)."""
        if self._info is None:
            self._info = self._ray.get(self.handles[0].info.remote())
        return self._info

    def stats(self) -> list[ShardStats]:
        """Each shard's size, draw mass, rows ever added and incarnation, in shard order (waits for every shard;
        a shard that died while answering is asked again until its restart answers, for at most
        ``RESTART_WAIT_S`` seconds; a shard out of restarts raises Ray's ``ActorDiedError``)."""
        ray = self._ray
        refs = [handle.stats.remote() for handle in self.handles]
        try:
            stats: list[ShardStats] = ray.get(refs)
        except ray.exceptions.RayActorError:
            stats = []
            for handle, ref in zip(self.handles, refs, strict=True):
                try:
                    stats.append(ray.get(ref))
                except ray.exceptions.RayActorError:
                    stats.append(self._stats_after_restart(handle))
        return stats

    def _stats_after_restart(self, handle: Any) -> ShardStats:
        # A call made while Ray restarts the actor fails at once (ActorUnavailableError) rather than waiting.
        ray = self._ray
        # (an older Ray without ActorUnavailableError: any actor error is waited out until the deadline)
        unavailable = getattr(ray.exceptions, "ActorUnavailableError", ray.exceptions.RayActorError)
        deadline = time.monotonic() + RESTART_WAIT_S
        while True:
            try:
                answer: ShardStats = ray.get(handle.stats.remote())
                return answer
            except unavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def rate_counts(self) -> dict[str, int]:
        """The rate limiter's counts: rows granted to writers (``inserts``) and to the learner (``samples``), and
        the calls that had to wait (``blocked_inserts``, ``blocked_samples``); empty without a rate limit."""
        if self.limiter is None:
            return {}
        counts: dict[str, int] = self._ray.get(self.limiter.counts.remote())
        return counts

    STATE_VERSION = 2  # 2: the rate limiter's counts

    def save(self, root: str | os.PathLike[str]) -> dict[str, Any]:
        """Have every shard save its buffer to ``root/shard-<k>`` (in its own process, all at once); returns
        what a checkpoint keeps: the directories and save ids and, with a rate limit, the limiter's counts
        (read once the saves are done), plain strings and ints (no arrays), so ``torch.load(weights_only=True)``
        reads it. A later save to the same root replaces these saves."""
        root = os.path.abspath(os.fspath(root))
        refs = [h.save.remote(os.path.join(root, f"shard-{k:03d}")) for k, h in enumerate(self.handles)]
        saves: list[dict[str, str]] = self._ray.get(refs)
        state = {"num_shards": self.num_shards, "saves": saves, "rate_counts": self.rate_counts() or None}
        return versioned(state, self.STATE_VERSION)

    def state_dict(self) -> dict[str, Any]:
        """:meth:`save` to ``checkpoint_dir``: a reference to each shard's save, no rows."""
        if self.checkpoint_dir is None:
            raise ValueError(
                "the shards' rows are saved by the shards themselves, into directories the checkpoint refers to; "
                "build ReplayShards(..., checkpoint_dir=<a directory the shards and the learner share>)"
            )
        return self.save(self.checkpoint_dir)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load every shard from the save the checkpoint refers to (a save replaced since is refused, naming
        it); each shard takes a new incarnation. The rate limiter, if both these shards and the saved ones have
        one, continues from the saved counts."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        if int(state["num_shards"]) != self.num_shards:
            raise ValueError(
                f"the checkpoint holds {state['num_shards']} shards, these are {self.num_shards}: rows are placed "
                "by env_id % num_shards, so build ReplayShards with the saved num_shards"
            )
        refs = [h.load.remote(s["directory"], s["save_id"]) for h, s in zip(self.handles, state["saves"], strict=True)]
        self._ray.get(refs)
        counts = state.get("rate_counts")  # (version 1 has none: the limiter's counts stay)
        if counts is not None and self.limiter is not None:
            self._ray.get(self.limiter.load_counts.remote(counts))

    def close(self) -> None:
        """Kill the actors (their rows are lost)."""
        for handle in [*self.handles, *([self.limiter] if self.limiter is not None else [])]:
            self._ray.kill(handle, no_restart=True)
        self.handles, self.limiter = [], None

    def __repr__(self) -> str:
        return f"ReplayShards(num_shards={self.num_shards}, factory={factory_name(self.factory)})"

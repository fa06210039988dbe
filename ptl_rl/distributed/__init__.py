"""Scale-out: a background collector process (:class:`AsyncSource`), Ray workers (:class:`RayWorkers`), and a
sharded replay on Ray (:class:`ReplayShards`, :class:`ShardWriter`, :class:`ShardedReplay`).

Importable without Ray: :mod:`ray` is imported only when a :class:`RayWorkers`
stage or the shards start (``pip install ptl_rl[ray]``). See ``docs/design/scale-out.md`` and
``docs/design/replay-service.md``.
"""

from ptl_rl.distributed.async_source import AsyncSource, CollectorError
from ptl_rl.distributed.callbacks import WeightSync
from ptl_rl.distributed.common import VERSION_FIELD, Collector, WorkerInfo
from ptl_rl.distributed.frame_wire import FrameAnswer, FrameMessage, FrameWire
from ptl_rl.distributed.rate_limit import RateLimit
from ptl_rl.distributed.ray_workers import RayWorkers
from ptl_rl.distributed.replay_shard import ReplayShard, ShardInfo, ShardSample, ShardStats
from ptl_rl.distributed.replay_shards import ReplayShards
from ptl_rl.distributed.shard_writer import INITIAL_PRIORITY_FIELD, ShardWriter, ShardWrites, shard_of
from ptl_rl.distributed.sharded_replay import ShardedReplay

__all__ = [
    "INITIAL_PRIORITY_FIELD",
    "VERSION_FIELD",
    "AsyncSource",
    "Collector",
    "CollectorError",
    "FrameAnswer",
    "FrameMessage",
    "FrameWire",
    "RateLimit",
    "RayWorkers",
    "ReplayShard",
    "ReplayShards",
    "ShardInfo",
    "ShardSample",
    "ShardStats",
    "ShardWriter",
    "ShardWrites",
    "ShardedReplay",
    "WeightSync",
    "WorkerInfo",
    "shard_of",
]

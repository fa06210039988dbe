"""Scale-out collection: a background collector process (:class:`AsyncSource`) and Ray workers (:class:`RayWorkers`).

Importable without Ray: :mod:`ray` is imported only when a :class:`RayWorkers`
stage starts (``pip install ptl_rl[ray]``). See ``docs/design/scale-out.md``.
"""

from ptl_rl.distributed.async_source import AsyncSource, CollectorError
from ptl_rl.distributed.callbacks import WeightSync
from ptl_rl.distributed.common import VERSION_FIELD, Collector, WorkerInfo
from ptl_rl.distributed.ray_workers import RayWorkers

__all__ = ["VERSION_FIELD", "AsyncSource", "Collector", "CollectorError", "RayWorkers", "WeightSync", "WorkerInfo"]

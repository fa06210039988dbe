"""The Lightning callbacks, under their short import path ``ptl_rl.callbacks``.

They are defined in :mod:`ptl_rl.lightning.callbacks` (and
:class:`EnvStepLimit` in :mod:`ptl_rl.lightning.stops`); this module only
names them, so ``from ptl_rl.callbacks import EpisodeStatsLogger`` keeps working.
"""

from ptl_rl.lightning.callbacks import (
    EnvStepLimit,
    EpisodeStatsLogger,
    NormalizationSync,
    PeriodicEvaluation,
    PipelineProfiler,
)

__all__ = ["EnvStepLimit", "EpisodeStatsLogger", "NormalizationSync", "PeriodicEvaluation", "PipelineProfiler"]

"""The Lightning side of ptl_rl: the DataLoader adapter, checkpoints of a pipeline, a DataModule and callbacks.

One module per concept, each importing only the ones below it (no cycles,
checked by ``tests/unit/test_import_layers.py``):

* :mod:`~ptl_rl.lightning._compat`: base classes for both Lightning packages
  (``pytorch_lightning`` and ``lightning.pytorch``), and the protocols of what
  the callbacks use of their Trainer and module (:class:`TrainerLike`, :class:`ModuleLike`);
* :mod:`~ptl_rl.lightning.stops`: :class:`EnvStepLimit` and the record of
  Trainers that stop an endless loader by themselves;
* :mod:`~ptl_rl.lightning.checkpoint`: :class:`PipelineCheckpoint`;
* :mod:`~ptl_rl.lightning.adapter`: :func:`to_dataloader` and its dataset,
  loader and :class:`BatchGroup`;
* :mod:`~ptl_rl.lightning.datamodule`: :class:`RLDataModule`;
* :mod:`~ptl_rl.lightning.callbacks`: the other callbacks;
* :mod:`~ptl_rl.lightning.validation`: :class:`EvaluationMixin`.

Everything public is importable from here and from ``ptl_rl``.
"""

from ptl_rl.core.chain import find_stage, load_pipeline_state_dict, pipeline_stages, pipeline_state_dict
from ptl_rl.lightning._compat import LoggerLike, ModuleLike, StrategyLike, TrainerLike
from ptl_rl.lightning.adapter import BatchGroup, PipelineDataset, PipelineLoader, to_dataloader
from ptl_rl.lightning.callbacks import (
    EnvStepLimit,
    EpisodeStatsLogger,
    NormalizationSync,
    PeriodicEvaluation,
    PipelineProfiler,
)
from ptl_rl.lightning.checkpoint import CHECKPOINT_KEY, PipelineCheckpoint
from ptl_rl.lightning.datamodule import RLDataModule
from ptl_rl.lightning.validation import EvaluationMixin

__all__ = [
    "CHECKPOINT_KEY",
    "BatchGroup",
    "EnvStepLimit",
    "EpisodeStatsLogger",
    "EvaluationMixin",
    "LoggerLike",
    "ModuleLike",
    "NormalizationSync",
    "PeriodicEvaluation",
    "PipelineCheckpoint",
    "PipelineDataset",
    "PipelineLoader",
    "PipelineProfiler",
    "RLDataModule",
    "StrategyLike",
    "TrainerLike",
    "find_stage",
    "load_pipeline_state_dict",
    "pipeline_stages",
    "pipeline_state_dict",
    "to_dataloader",
]

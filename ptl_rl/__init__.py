# ruff: noqa: F401 - _import_public_api binds its imports through locals(), which ruff cannot follow
"""ptl_rl: composable experience pipelines that feed PyTorch Lightning.

ExperienceSource -> NStepTransform -> ReplayBuffer -> BatchSampler -> to_dataloader

The names below are imported on first use (PEP 562 ``__getattr__``), not by
``import ptl_rl``: importing them loads torch and Lightning, about 10 s on a
busy CPU, and a command line such as ``python -m ptl_rl.examples.dqn --help``
(whose parent package is this one) should answer before that.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "BOLTS_FIELDS",
    "CHECKPOINT_KEY",
    "CORE_FIELDS",
    "EvaluationDataset",
    "EvaluationMixin",
    "PipelineCheckpoint",
    "PipelineLoader",
    "assign_rank",
    "evaluation_dataloader",
    "rank_seed",
    "run_episodes",
    "ActionRescaler",
    "ActorCriticAgent",
    "DeterministicActorAgent",
    "RolloutBuffer",
    "StochasticPolicyAgent",
    "action_head",
    "compute_gae",
    "ArgmaxSelector",
    "ArrayStorage",
    "FrameStorage",
    "BatchSampler",
    "DQNAgent",
    "EnvStepLimit",
    "Episode",
    "EpisodeStatsLogger",
    "EpsilonGreedySelector",
    "ExperienceSource",
    "LinearSchedule",
    "MinariRecorder",
    "MinariSource",
    "NStepTransform",
    "PeriodicEvaluation",
    "PipelineDataset",
    "PolicyAgent",
    "PrioritizedReplayBuffer",
    "SequenceReplayBuffer",
    "SumTree",
    "RLDataModule",
    "ReplayBuffer",
    "TargetNet",
    "TorchBatch",
    "TransitionBatch",
    "evaluate",
    "find_stage",
    "load_pipeline_state_dict",
    "minari_replay_buffer",
    "open_minari_dataset",
    "obs_to_tensor",
    "pipeline_stages",
    "pipeline_state_dict",
    "to_dataloader",
]


def __getattr__(name: str) -> Any:
    """Import the public API on the first access to any of its names (see the module docstring)."""
    if name not in __all__:
        raise AttributeError(f"module 'ptl_rl' has no attribute {name!r}")
    _import_public_api()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _import_public_api() -> None:
    """Bind every name of ``__all__`` in this module (once; later accesses find them in the globals)."""
    # the imports as they were at the top of this module, now run on first use
    from ptl_rl.agents import (
        ActorCriticAgent,
        DeterministicActorAgent,
        DQNAgent,
        PolicyAgent,
        StochasticPolicyAgent,
        TargetNet,
        obs_to_tensor,
    )
    from ptl_rl.batch import BOLTS_FIELDS, CORE_FIELDS, TorchBatch, TransitionBatch
    from ptl_rl.buffers import (
        ArrayStorage,
        FrameStorage,
        PrioritizedReplayBuffer,
        ReplayBuffer,
        RolloutBuffer,
        SequenceReplayBuffer,
        SumTree,
    )
    from ptl_rl.callbacks import EnvStepLimit, EpisodeStatsLogger, PeriodicEvaluation
    from ptl_rl.distributions import ActionRescaler, action_head
    from ptl_rl.evaluation import EvaluationDataset, evaluate, evaluation_dataloader, run_episodes
    from ptl_rl.gae import compute_gae
    from ptl_rl.lightning import (
        CHECKPOINT_KEY,
        EvaluationMixin,
        PipelineCheckpoint,
        PipelineDataset,
        PipelineLoader,
        RLDataModule,
        to_dataloader,
    )
    from ptl_rl.nstep import NStepTransform
    from ptl_rl.offline import MinariRecorder, MinariSource, minari_replay_buffer, open_minari_dataset
    from ptl_rl.ranks import assign_rank, rank_seed
    from ptl_rl.sampler import BatchSampler
    from ptl_rl.schedules import LinearSchedule
    from ptl_rl.selectors import ArgmaxSelector, EpsilonGreedySelector
    from ptl_rl.source import Episode, ExperienceSource
    from ptl_rl.stages import find_stage, load_pipeline_state_dict, pipeline_stages, pipeline_state_dict

    namespace = locals()
    globals().update({name: namespace[name] for name in __all__})

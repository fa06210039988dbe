"""ptl_rl: composable experience pipelines that feed PyTorch Lightning.

ExperienceSource -> NStepTransform -> ReplayBuffer -> BatchSampler -> to_dataloader

The public names below are imported on first use (PEP 562 ``__getattr__``),
not by ``import ptl_rl``: they load torch and Lightning, about 10 s on a busy
CPU, and a command line such as ``python -m ptl_rl.examples.dqn --help``
(whose parent package is this one) should answer before that. Type checkers
and IDEs see them through the ``TYPE_CHECKING`` imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC_API: dict[str, str] = {
    "ActorCriticAgent": "ptl_rl.agents",
    "DeterministicActorAgent": "ptl_rl.agents",
    "DQNAgent": "ptl_rl.agents",
    "PolicyAgent": "ptl_rl.agents",
    "StochasticPolicyAgent": "ptl_rl.agents",
    "TargetNet": "ptl_rl.agents",
    "obs_to_tensor": "ptl_rl.agents",
    "check_version": "ptl_rl._state",
    "versioned": "ptl_rl._state",
    "BOLTS_FIELDS": "ptl_rl.batch",
    "CORE_FIELDS": "ptl_rl.batch",
    "TorchBatch": "ptl_rl.batch",
    "TransitionBatch": "ptl_rl.batch",
    "ArrayStorage": "ptl_rl.buffers",
    "FrameStorage": "ptl_rl.buffers",
    "HERReplayBuffer": "ptl_rl.buffers",
    "MemmapStorage": "ptl_rl.buffers",
    "PrioritizedReplayBuffer": "ptl_rl.buffers",
    "ReplayBuffer": "ptl_rl.buffers",
    "RolloutBuffer": "ptl_rl.buffers",
    "SequenceReplayBuffer": "ptl_rl.buffers",
    "SumTree": "ptl_rl.buffers",
    "ActionRescaler": "ptl_rl.distributions",
    "action_head": "ptl_rl.distributions",
    "EvaluationDataset": "ptl_rl.evaluation",
    "evaluate": "ptl_rl.evaluation",
    "evaluation_dataloader": "ptl_rl.evaluation",
    "run_episodes": "ptl_rl.evaluation",
    "compute_gae": "ptl_rl.gae",
    "BatchGroup": "ptl_rl.lightning",
    "CHECKPOINT_KEY": "ptl_rl.lightning",
    "EnvStepLimit": "ptl_rl.lightning",
    "EpisodeStatsLogger": "ptl_rl.lightning",
    "EvaluationMixin": "ptl_rl.lightning",
    "NormalizationSync": "ptl_rl.lightning",
    "PeriodicEvaluation": "ptl_rl.lightning",
    "PipelineCheckpoint": "ptl_rl.lightning",
    "PipelineDataset": "ptl_rl.lightning",
    "PipelineLoader": "ptl_rl.lightning",
    "PipelineProfiler": "ptl_rl.lightning",
    "RLDataModule": "ptl_rl.lightning",
    "to_dataloader": "ptl_rl.lightning",
    "NStepTransform": "ptl_rl.nstep",
    "NormalizationModule": "ptl_rl.normalization",
    "NormalizeObservations": "ptl_rl.normalization",
    "NormalizeSampledObservations": "ptl_rl.normalization",
    "NormalizedAgent": "ptl_rl.normalization",
    "ObservationNormalizer": "ptl_rl.normalization",
    "ScaleRewards": "ptl_rl.normalization",
    "MinariRecorder": "ptl_rl.offline",
    "MinariSource": "ptl_rl.offline",
    "minari_replay_buffer": "ptl_rl.offline",
    "open_minari_dataset": "ptl_rl.offline",
    "PipelineProfile": "ptl_rl.profiling",
    "profile": "ptl_rl.profiling",
    "set_profiling": "ptl_rl.profiling",
    "assign_rank": "ptl_rl.ranks",
    "rank_seed": "ptl_rl.ranks",
    "BatchSampler": "ptl_rl.sampler",
    "LinearSchedule": "ptl_rl.schedules",
    "ArgmaxSelector": "ptl_rl.selectors",
    "EpsilonGreedySelector": "ptl_rl.selectors",
    "Episode": "ptl_rl.source",
    "ExperienceSource": "ptl_rl.source",
    "find_stage": "ptl_rl.stages",
    "write_video": "ptl_rl.video",
    "EvaluationVideo": "ptl_rl.lightning.video_recording",
    "RecordedEpisode": "ptl_rl.lightning.video_recording",
    "record_episodes": "ptl_rl.lightning.video_recording",
    "load_pipeline_state_dict": "ptl_rl.stages",
    "pipeline_stages": "ptl_rl.stages",
    "pipeline_state_dict": "ptl_rl.stages",
    "RecurrentCore": "ptl_rl.recurrent",
    "RecurrentDQNAgent": "ptl_rl.recurrent",
    "RecurrentQNet": "ptl_rl.recurrent",
    "PerEnvState": "ptl_rl.recurrent",
    "RecurrentActorCritic": "ptl_rl.recurrent_policy",
    "RecurrentActorCriticAgent": "ptl_rl.recurrent_policy",
    "RecurrentActorCriticNet": "ptl_rl.recurrent_policy",
    "sequence_nstep_targets": "ptl_rl.recurrent",
}

__all__ = [
    "ActionRescaler",
    "ActorCriticAgent",
    "ArgmaxSelector",
    "ArrayStorage",
    "BOLTS_FIELDS",
    "BatchGroup",
    "BatchSampler",
    "CHECKPOINT_KEY",
    "CORE_FIELDS",
    "DQNAgent",
    "DeterministicActorAgent",
    "EnvStepLimit",
    "Episode",
    "EpisodeStatsLogger",
    "EpsilonGreedySelector",
    "EvaluationDataset",
    "EvaluationMixin",
    "EvaluationVideo",
    "ExperienceSource",
    "FrameStorage",
    "HERReplayBuffer",
    "LinearSchedule",
    "MemmapStorage",
    "MinariRecorder",
    "MinariSource",
    "NStepTransform",
    "NormalizationSync",
    "NormalizationModule",
    "NormalizeObservations",
    "NormalizeSampledObservations",
    "NormalizedAgent",
    "ObservationNormalizer",
    "PeriodicEvaluation",
    "PipelineCheckpoint",
    "PipelineDataset",
    "PipelineLoader",
    "PipelineProfile",
    "PipelineProfiler",
    "PolicyAgent",
    "PrioritizedReplayBuffer",
    "RLDataModule",
    "RecordedEpisode",
    "PerEnvState",
    "RecurrentActorCritic",
    "RecurrentActorCriticAgent",
    "RecurrentActorCriticNet",
    "RecurrentCore",
    "RecurrentDQNAgent",
    "RecurrentQNet",
    "ReplayBuffer",
    "RolloutBuffer",
    "ScaleRewards",
    "SequenceReplayBuffer",
    "StochasticPolicyAgent",
    "SumTree",
    "TargetNet",
    "TorchBatch",
    "TransitionBatch",
    "action_head",
    "assign_rank",
    "check_version",
    "compute_gae",
    "evaluate",
    "evaluation_dataloader",
    "find_stage",
    "load_pipeline_state_dict",
    "minari_replay_buffer",
    "obs_to_tensor",
    "open_minari_dataset",
    "pipeline_stages",
    "pipeline_state_dict",
    "profile",
    "rank_seed",
    "record_episodes",
    "run_episodes",
    "sequence_nstep_targets",
    "set_profiling",
    "to_dataloader",
    "versioned",
    "write_video",
]

if TYPE_CHECKING:
    from ptl_rl._state import check_version, versioned
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
        HERReplayBuffer,
        MemmapStorage,
        PrioritizedReplayBuffer,
        ReplayBuffer,
        RolloutBuffer,
        SequenceReplayBuffer,
        SumTree,
    )
    from ptl_rl.distributions import ActionRescaler, action_head
    from ptl_rl.evaluation import EvaluationDataset, evaluate, evaluation_dataloader, run_episodes
    from ptl_rl.gae import compute_gae
    from ptl_rl.lightning import (
        CHECKPOINT_KEY,
        BatchGroup,
        EnvStepLimit,
        EpisodeStatsLogger,
        EvaluationMixin,
        NormalizationSync,
        PeriodicEvaluation,
        PipelineCheckpoint,
        PipelineDataset,
        PipelineLoader,
        PipelineProfiler,
        RLDataModule,
        to_dataloader,
    )
    from ptl_rl.lightning.video_recording import EvaluationVideo, RecordedEpisode, record_episodes
    from ptl_rl.normalization import (
        NormalizationModule,
        NormalizedAgent,
        NormalizeObservations,
        NormalizeSampledObservations,
        ObservationNormalizer,
        ScaleRewards,
    )
    from ptl_rl.nstep import NStepTransform
    from ptl_rl.offline import MinariRecorder, MinariSource, minari_replay_buffer, open_minari_dataset
    from ptl_rl.profiling import PipelineProfile, profile, set_profiling
    from ptl_rl.ranks import assign_rank, rank_seed
    from ptl_rl.recurrent import PerEnvState, RecurrentCore, RecurrentDQNAgent, RecurrentQNet, sequence_nstep_targets
    from ptl_rl.recurrent_policy import RecurrentActorCritic, RecurrentActorCriticAgent, RecurrentActorCriticNet
    from ptl_rl.sampler import BatchSampler
    from ptl_rl.schedules import LinearSchedule
    from ptl_rl.selectors import ArgmaxSelector, EpsilonGreedySelector
    from ptl_rl.source import Episode, ExperienceSource
    from ptl_rl.stages import find_stage, load_pipeline_state_dict, pipeline_stages, pipeline_state_dict
    from ptl_rl.video import write_video


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first access (see the module docstring)."""
    module = _PUBLIC_API.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("_"):  # a subpackage or module, as `import ptl_rl` once loaded them: ptl_rl.buffers
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise  # the module exists but one of its own imports failed
            raise AttributeError(f"module 'ptl_rl' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'ptl_rl' has no attribute {name!r}")
    globals()[name] = value  # later accesses find it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

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
    "ActorCriticAgent": "ptl_rl.agents.policies",
    "DeterministicActorAgent": "ptl_rl.agents.policies",
    "DQNAgent": "ptl_rl.agents.policies",
    "PolicyAgent": "ptl_rl.agents.policies",
    "StochasticPolicyAgent": "ptl_rl.agents.policies",
    "TargetNet": "ptl_rl.agents.policies",
    "obs_to_tensor": "ptl_rl.agents.policies",
    "check_version": "ptl_rl.core.versions",
    "versioned": "ptl_rl.core.versions",
    "BOLTS_FIELDS": "ptl_rl.core.batch",
    "CORE_FIELDS": "ptl_rl.core.batch",
    "TorchBatch": "ptl_rl.core.batch",
    "TransitionBatch": "ptl_rl.core.batch",
    "ArrayStorage": "ptl_rl.replay",
    "FrameStorage": "ptl_rl.replay",
    "HERReplayBuffer": "ptl_rl.replay",
    "MemmapStorage": "ptl_rl.replay",
    "PrioritizedReplayBuffer": "ptl_rl.replay",
    "ReplayBuffer": "ptl_rl.replay",
    "RolloutBuffer": "ptl_rl.replay",
    "SequenceReplayBuffer": "ptl_rl.replay",
    "SumTree": "ptl_rl.replay",
    "ActionRescaler": "ptl_rl.agents.distributions",
    "action_head": "ptl_rl.agents.distributions",
    "EvaluationDataset": "ptl_rl.evaluation",
    "evaluate": "ptl_rl.evaluation",
    "evaluation_dataloader": "ptl_rl.evaluation",
    "run_episodes": "ptl_rl.evaluation",
    "compute_gae": "ptl_rl.replay.gae",
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
    "NStepTransform": "ptl_rl.stages.nstep",
    "NormalizationModule": "ptl_rl.stages.normalize",
    "NormalizeObservations": "ptl_rl.stages.normalize",
    "NormalizeSampledObservations": "ptl_rl.stages.normalize",
    "NormalizedAgent": "ptl_rl.stages.normalize",
    "ObservationNormalizer": "ptl_rl.stages.normalize",
    "ScaleRewards": "ptl_rl.stages.normalize",
    "MinariRecorder": "ptl_rl.offline.datasets",
    "MinariSource": "ptl_rl.offline.datasets",
    "minari_replay_buffer": "ptl_rl.offline.datasets",
    "open_minari_dataset": "ptl_rl.offline.datasets",
    "PipelineProfile": "ptl_rl.core.profiling",
    "profile": "ptl_rl.core.profiling",
    "set_profiling": "ptl_rl.core.profiling",
    "assign_rank": "ptl_rl.core.ranks",
    "rank_seed": "ptl_rl.core.ranks",
    "BatchSampler": "ptl_rl.stages.sampler",
    "LinearSchedule": "ptl_rl.core.schedules",
    "ArgmaxSelector": "ptl_rl.agents.selectors",
    "EpsilonGreedySelector": "ptl_rl.agents.selectors",
    "Episode": "ptl_rl.stages.source",
    "ExperienceSource": "ptl_rl.stages.source",
    "find_stage": "ptl_rl.core.chain",
    "write_video": "ptl_rl.video",
    "EvaluationVideo": "ptl_rl.lightning.video_recording",
    "RecordedEpisode": "ptl_rl.lightning.video_recording",
    "record_episodes": "ptl_rl.lightning.video_recording",
    "load_pipeline_state_dict": "ptl_rl.core.chain",
    "pipeline_stages": "ptl_rl.core.chain",
    "pipeline_state_dict": "ptl_rl.core.chain",
    "RecurrentCore": "ptl_rl.agents.recurrent",
    "RecurrentDQNAgent": "ptl_rl.agents.recurrent",
    "RecurrentQNet": "ptl_rl.agents.recurrent",
    "PerEnvState": "ptl_rl.agents.recurrent",
    "RecurrentActorCritic": "ptl_rl.agents.recurrent_policy",
    "RecurrentActorCriticAgent": "ptl_rl.agents.recurrent_policy",
    "RecurrentActorCriticNet": "ptl_rl.agents.recurrent_policy",
    "sequence_nstep_targets": "ptl_rl.agents.recurrent",
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
    from ptl_rl.core.versions import check_version, versioned
    from ptl_rl.agents.policies import (
        ActorCriticAgent,
        DeterministicActorAgent,
        DQNAgent,
        PolicyAgent,
        StochasticPolicyAgent,
        TargetNet,
        obs_to_tensor,
    )
    from ptl_rl.core.batch import BOLTS_FIELDS, CORE_FIELDS, TorchBatch, TransitionBatch
    from ptl_rl.replay import (
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
    from ptl_rl.agents.distributions import ActionRescaler, action_head
    from ptl_rl.evaluation import EvaluationDataset, evaluate, evaluation_dataloader, run_episodes
    from ptl_rl.replay.gae import compute_gae
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
    from ptl_rl.stages.normalize import (
        NormalizationModule,
        NormalizedAgent,
        NormalizeObservations,
        NormalizeSampledObservations,
        ObservationNormalizer,
        ScaleRewards,
    )
    from ptl_rl.stages.nstep import NStepTransform
    from ptl_rl.offline.datasets import MinariRecorder, MinariSource, minari_replay_buffer, open_minari_dataset
    from ptl_rl.core.profiling import PipelineProfile, profile, set_profiling
    from ptl_rl.core.ranks import assign_rank, rank_seed
    from ptl_rl.agents.recurrent import PerEnvState, RecurrentCore, RecurrentDQNAgent, RecurrentQNet, sequence_nstep_targets
    from ptl_rl.agents.recurrent_policy import RecurrentActorCritic, RecurrentActorCriticAgent, RecurrentActorCriticNet
    from ptl_rl.stages.sampler import BatchSampler
    from ptl_rl.core.schedules import LinearSchedule
    from ptl_rl.agents.selectors import ArgmaxSelector, EpsilonGreedySelector
    from ptl_rl.stages.source import Episode, ExperienceSource
    from ptl_rl.core.chain import find_stage, load_pipeline_state_dict, pipeline_stages, pipeline_state_dict
    from ptl_rl.video import write_video


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first access (see the module docstring)."""
    module = _PUBLIC_API.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("_"):  # a subpackage or module, as `import ptl_rl` once loaded them: ptl_rl.replay
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

"""ptl_rl: composable experience pipelines that feed PyTorch Lightning.

ExperienceSource -> NStepTransform -> ReplayBuffer -> BatchSampler -> to_dataloader
"""

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
from ptl_rl.callbacks import EnvStepLimit, EpisodeStatsLogger, PeriodicEvaluation, PipelineProfiler
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
from ptl_rl.profiling import PipelineProfile, profile, set_profiling
from ptl_rl.ranks import assign_rank, rank_seed
from ptl_rl.sampler import BatchSampler
from ptl_rl.schedules import LinearSchedule
from ptl_rl.selectors import ArgmaxSelector, EpsilonGreedySelector
from ptl_rl.source import Episode, ExperienceSource
from ptl_rl.stages import find_stage, load_pipeline_state_dict, pipeline_stages, pipeline_state_dict

__version__ = "0.1.0"

__all__ = [
    "BOLTS_FIELDS",
    "CHECKPOINT_KEY",
    "CORE_FIELDS",
    "EvaluationDataset",
    "EvaluationMixin",
    "PipelineCheckpoint",
    "PipelineLoader",
    "PipelineProfile",
    "PipelineProfiler",
    "profile",
    "set_profiling",
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

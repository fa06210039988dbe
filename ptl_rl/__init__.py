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
from ptl_rl.batch import CORE_FIELDS, TorchBatch, TransitionBatch
from ptl_rl.buffers import (
    ArrayStorage,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    RolloutBuffer,
    SequenceReplayBuffer,
    SumTree,
)
from ptl_rl.distributions import ActionRescaler, action_head
from ptl_rl.evaluation import evaluate
from ptl_rl.gae import compute_gae
from ptl_rl.lightning import (
    EnvStepLimit,
    EpisodeStatsLogger,
    PeriodicEvaluation,
    PipelineDataset,
    RLDataModule,
    find_stage,
    load_pipeline_state_dict,
    pipeline_stages,
    pipeline_state_dict,
    to_dataloader,
)
from ptl_rl.nstep import NStepTransform
from ptl_rl.sampler import BatchSampler
from ptl_rl.selectors import ArgmaxSelector, EpsilonGreedySelector, LinearSchedule
from ptl_rl.source import Episode, ExperienceSource

__version__ = "0.1.0"

__all__ = [
    "CORE_FIELDS",
    "ActionRescaler",
    "ActorCriticAgent",
    "DeterministicActorAgent",
    "RolloutBuffer",
    "StochasticPolicyAgent",
    "action_head",
    "compute_gae",
    "ArgmaxSelector",
    "ArrayStorage",
    "BatchSampler",
    "DQNAgent",
    "EnvStepLimit",
    "Episode",
    "EpisodeStatsLogger",
    "EpsilonGreedySelector",
    "ExperienceSource",
    "LinearSchedule",
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
    "obs_to_tensor",
    "pipeline_stages",
    "pipeline_state_dict",
    "to_dataloader",
]

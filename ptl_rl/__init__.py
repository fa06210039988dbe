"""ptl_rl: composable experience pipelines that feed PyTorch Lightning.

    ExperienceSource -> NStepTransform -> ReplayBuffer -> BatchSampler -> to_dataloader

The public API is the list of imports under ``if TYPE_CHECKING:`` below, and
only that list: type checkers and IDEs read it as imports, and at run time
:func:`_public_api` reads the same lines to import each name from its module
on first use (PEP 562 ``__getattr__``). ``import ptl_rl`` itself loads
nothing heavy: the names load torch and Lightning, about 10 s on a busy CPU,
and a command line such as ``python -m ptl_rl.examples.plot --help`` (whose
parent package is this one) should answer before that.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def _public_api() -> dict[str, str]:
    """Public name -> its module, read from this file's ``if TYPE_CHECKING:`` imports (about 1 ms)."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    return {alias.asname or alias.name: str(node.module) for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}  # fmt: skip


_PUBLIC_API = _public_api()
__all__ = sorted(_PUBLIC_API)  # derived from the one list: the imports below

if TYPE_CHECKING:
    from ptl_rl.agents.deterministic import DeterministicActorAgent
    from ptl_rl.agents.distributions import ActionRescaler, action_head
    from ptl_rl.agents.dqn import DQNAgent, TargetNet
    from ptl_rl.agents.recurrent import PerEnvState, RecurrentCore, RecurrentDQNAgent
    from ptl_rl.agents.recurrent_policy import RecurrentActorCritic, RecurrentActorCriticAgent
    from ptl_rl.agents.recurrent_targets import sequence_nstep_targets
    from ptl_rl.agents.selectors import ArgmaxSelector, EpsilonGreedySelector
    from ptl_rl.agents.stochastic import ActorCriticAgent, PolicyAgent, StochasticPolicyAgent
    from ptl_rl.agents.tensors import obs_to_tensor
    from ptl_rl.core.batch import BOLTS_FIELDS, CORE_FIELDS, TorchBatch, TransitionBatch
    from ptl_rl.core.chain import find_stage, load_pipeline_state_dict, pipeline_stages, pipeline_state_dict
    from ptl_rl.core.profile import PipelineProfile, profile
    from ptl_rl.core.protocols import RecurrentActorCriticNet, RecurrentQNet
    from ptl_rl.core.ranks import assign_rank, rank_seed
    from ptl_rl.core.schedules import LinearSchedule
    from ptl_rl.core.settings import set_profiling
    from ptl_rl.core.stage import Stage
    from ptl_rl.core.versions import check_version, versioned
    from ptl_rl.evaluation import EvaluationDataset, evaluate, evaluation_dataloader, run_episodes
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
    from ptl_rl.normalization.module import NormalizationModule
    from ptl_rl.normalization.normalizer import NormalizedAgent, ObservationNormalizer
    from ptl_rl.offline.buffer import minari_replay_buffer
    from ptl_rl.offline.reader import open_minari_dataset
    from ptl_rl.offline.recorder import MinariRecorder
    from ptl_rl.offline.source import MinariSource
    from ptl_rl.replay import (
        ArrayStorage,
        FrameStorage,
        HERReplayBuffer,
        HindsightGoals,
        MemmapStorage,
        PrioritizedDraws,
        PrioritizedReplayBuffer,
        ReplayBuffer,
        RolloutBuffer,
        SequenceReplayBuffer,
        SequenceWindows,
        SumTree,
        UniformDraws,
    )
    from ptl_rl.replay.gae import compute_gae
    from ptl_rl.replay.sampler import BatchSampler
    from ptl_rl.stages.normalize import NormalizeObservations, NormalizeSampledObservations, ScaleRewards
    from ptl_rl.stages.nstep import NStepTransform
    from ptl_rl.stages.source import Episode, ExperienceSource
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

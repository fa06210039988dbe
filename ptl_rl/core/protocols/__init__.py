"""The extension points: what a stage, a storage and an agent of your own must have to work in a chain.

The chain's code checks these protocols (``isinstance(obj, Protocol)``,
structural: no base class to inherit), and nothing else, when it walks a
pipeline, checkpoints it, gives it a rank or stores into a buffer. Each
concept has one required protocol and a few optional capabilities; an object
that has a capability's members is treated as having it.

* A **stage** (:class:`StageLike`) is an iterator with an ``upstream`` attribute.
  Optional: :class:`Stateful` (saved in checkpoints), :class:`RankAware`
  (DDP ranks), :class:`NumberedStream`, :class:`NStepStream` and
  :class:`PerEnvStream` (stream facts that stages downstream rely on),
  :class:`EpisodeCounter` (stands in for a source in the episode callbacks),
  :class:`ReplayStage` (holds replay contents), :class:`OnPolicyStage` (one
  Lightning epoch per rollout).
* A **storage** (:class:`Storage`) is what a
  :class:`~ptl_rl.replay.ReplayBuffer` keeps its transitions in. Optional:
  :class:`RollbackStorage`, :class:`JournaledStorage`,
  :class:`PartlySampleableStorage`, :class:`StreamBoundStorage`,
  :class:`PartsStorage`.
* A **draw strategy** (:class:`DrawStrategy`) is what decides which rows a
  :class:`~ptl_rl.replay.ReplayBuffer`'s batches hold (``draws=``). Optional:
  :class:`PriorityDrawStrategy`, :class:`EpisodeDrawStrategy`,
  :class:`EpochDrawStrategy`.
* An **agent** (:class:`Agent`) is a callable from observations to actions.
  Optional: :class:`RecurrentAgent`, :class:`EnvStepAware`,
  :class:`RankAware`, :class:`Stateful`, :class:`Critic`.

See the "Extending ptl_rl" page of the documentation for a worked example.
This module imports nothing heavy, so a stage of your own can import it
without pulling torch in.

The protocols live one concept a module (:mod:`~ptl_rl.core.protocols.stages`,
:mod:`~ptl_rl.core.protocols.storages`, :mod:`~ptl_rl.core.protocols.draws`, :mod:`~ptl_rl.core.protocols.agents`,
:mod:`~ptl_rl.core.protocols.envs`) and are all importable from here.
"""

from ptl_rl.core.protocols.agents import (
    Agent,
    Critic,
    EnvStepAware,
    ObsTree,
    RecurrentActorCriticNet,
    RecurrentAgent,
    RecurrentQNet,
    TransitionCritic,
)
from ptl_rl.core.protocols.checks import implements, missing_members
from ptl_rl.core.protocols.draws import DrawStrategy, EpisodeDrawStrategy, EpochDrawStrategy, PriorityDrawStrategy
from ptl_rl.core.protocols.envs import Env, EnvLike, VectorEnv
from ptl_rl.core.protocols.stages import (
    ActingStage,
    EpisodeCounter,
    NStepStream,
    NumberedStream,
    OnPolicyStage,
    PerEnvStream,
    Pipeline,
    RankAware,
    ReplayStage,
    Sampleable,
    StageLike,
    Stateful,
    SyncedStatistics,
    Timed,
)
from ptl_rl.core.protocols.storages import (
    JournaledStorage,
    PartlySampleableStorage,
    PartsStorage,
    RollbackStorage,
    Storage,
    StreamBoundStorage,
)

__all__ = [
    "ActingStage",
    "Agent",
    "Critic",
    "DrawStrategy",
    "Env",
    "EnvLike",
    "EnvStepAware",
    "EpisodeDrawStrategy",
    "EpochDrawStrategy",
    "EpisodeCounter",
    "JournaledStorage",
    "NStepStream",
    "NumberedStream",
    "ObsTree",
    "OnPolicyStage",
    "PartlySampleableStorage",
    "PartsStorage",
    "PerEnvStream",
    "Pipeline",
    "PriorityDrawStrategy",
    "RankAware",
    "RecurrentActorCriticNet",
    "RecurrentAgent",
    "RecurrentQNet",
    "ReplayStage",
    "RollbackStorage",
    "Sampleable",
    "StageLike",
    "Stateful",
    "Storage",
    "StreamBoundStorage",
    "SyncedStatistics",
    "Timed",
    "TransitionCritic",
    "VectorEnv",
    "implements",
    "missing_members",
]

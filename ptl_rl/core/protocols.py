"""The extension points: what a stage, a storage and an agent of your own must have to work in a chain.

The chain's code checks these protocols (``isinstance(obj, Protocol)``,
structural: no base class to inherit), and nothing else, when it walks a
pipeline, checkpoints it, gives it a rank or stores into a buffer. Each
concept has one required protocol and a few optional capabilities; an object
that has a capability's members is treated as having it.

* A **stage** (:class:`StageLike`) is an iterator with an ``upstream`` attribute.
  Optional: :class:`Stateful` (saved in checkpoints), :class:`RankAware`
  (DDP ranks), :class:`NumberedStream` and :class:`PerEnvStream` (stream
  facts that stages downstream rely on), :class:`EpisodeCounter` (stands in
  for a source in the episode callbacks), :class:`ReplayStage` (holds replay
  contents), :class:`OnPolicyStage` (one Lightning epoch per rollout).
* A **storage** (:class:`Storage`) is what a
  :class:`~ptl_rl.replay.ReplayBuffer` keeps its transitions in. Optional:
  :class:`RollbackStorage`, :class:`PartlySampleableStorage`,
  :class:`StreamBoundStorage`.
* An **agent** (:class:`Agent`) is a callable from observations to actions.
  Optional: :class:`RecurrentAgent`, :class:`EnvStepAware`,
  :class:`RankAware`, :class:`Stateful`, :class:`Critic`.

See the "Extending ptl_rl" page of the documentation for a worked example.
This module imports nothing heavy, so a stage of your own can import it
without pulling torch in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

    from ptl_rl.core.batch import TransitionBatch
    from ptl_rl.core.clock import StageClock
    from ptl_rl.core.episode import Episode

__all__ = [
    "ActingStage",
    "JournaledStorage",
    "SyncedStatistics",
    "Agent",
    "ObsTree",
    "Critic",
    "EnvStepAware",
    "EpisodeCounter",
    "NumberedStream",
    "OnPolicyStage",
    "PartlySampleableStorage",
    "PerEnvStream",
    "RankAware",
    "RecurrentAgent",
    "ReplayStage",
    "RollbackStorage",
    "Sampleable",
    "StageLike",
    "Stateful",
    "Storage",
    "StreamBoundStorage",
    "Timed",
    "TransitionCritic",
    "implements",
    "missing_members",
]


T_co = TypeVar("T_co", covariant=True)

#: A batch of observations: an array ``[N, *obs_shape]`` (numpy from a source; torch in a learner, from a
#: :class:`~ptl_rl.core.batch.TorchBatch`), or a (nested) dict of such arrays, as a ``Dict`` observation space gives.
#: (A string: the alias refers to itself, and torch is imported for the checker only.)
ObsTree: TypeAlias = "np.ndarray | torch.Tensor | Mapping[str, ObsTree]"


# ---------------------------------------------------------------------------- stages
@runtime_checkable
class StageLike(Protocol[T_co]):
    """What the chain walks: an iterator over what it yields, which knows the stage it pulls from.

    ``upstream`` is the previous stage (any iterator; ``None`` for a source,
    which pulls from nothing). :func:`~ptl_rl.core.chain.pipeline_stages`
    follows it to find every stage of a chain, so a stage of your own between
    two of ptl_rl's is checkpointed, given its rank and shown in the chain's
    ``repr`` like theirs. Subclass :class:`ptl_rl.Stage` to write one: it
    implements this protocol and adds the interrupt and stream guarantees. A
    stage that yields :class:`~ptl_rl.core.batch.TransitionBatch` es keeps the
    field contract (the same field names, dtypes and meaning as its upstream's).
    """

    upstream: Iterator[Any] | None

    def __iter__(self) -> Iterator[T_co]: ...

    def __next__(self) -> T_co: ...


@runtime_checkable
class Timed(Protocol):
    """A stage that keeps time (``clock``, a :class:`~ptl_rl.core.clock.StageClock`) for :func:`ptl_rl.profile`."""

    clock: StageClock


@runtime_checkable
class Stateful(Protocol):
    """Something whose state is saved in checkpoints: a stage, an agent, a storage.

    :class:`~ptl_rl.lightning.PipelineCheckpoint` saves the ``state_dict`` of
    every stage that has one, keyed ``"<position>:<class name>"``, and gives
    it back to ``load_state_dict`` on resume. Hold tensors and plain
    containers (``int``, ``float``, ``str``, ``None``, lists, dicts) only, so
    the checkpoint loads with ``torch.load(..., weights_only=True)``; tag the
    format with :func:`~ptl_rl.versioned` and read it back with
    :func:`~ptl_rl.check_version`.
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class RankAware(Protocol):
    """Something seeded per DDP rank (or remote worker): a stage, an agent.

    :func:`~ptl_rl.assign_rank` calls ``set_rank`` on every stage of a chain
    when the Trainer's rank is known (and the source calls its agent's).
    Re-seed with :func:`~ptl_rl.rank_seed` and do nothing when the rank is
    already the one held, so a restored RNG state is never re-seeded.
    """

    def set_rank(self, rank: int) -> None: ...


@runtime_checkable
class NumberedStream(Protocol):
    """A stage that numbers the batches it yields, so that stages downstream see where its env streams were cut.

    ``stream_seq`` is the number of the last batch yielded (or ``None`` before
    any): it grows by one per batch and skips a number where the envs'
    streams were cut (a reset, an interrupted step, a restore). A stage that
    joins steps across batches (:class:`~ptl_rl.stages.nstep.NStepTransform`, a
    sequence replay) starts over at a skip instead of joining steps that do
    not follow each other. A pass-through stage of your own can forward its
    upstream's number (a property returning ``self.upstream.stream_seq``).
    """

    stream_seq: int | None


@runtime_checkable
class PerEnvStream(Protocol):
    """A stage that says whether each batch it yields holds at most one step per env, in time order.

    ``one_row_per_env = True`` lets :class:`~ptl_rl.stages.nstep.NStepTransform` skip
    a per-batch check, and is required upstream of the normalization stages.
    A pass-through stage of your own can forward its upstream's value.
    """

    one_row_per_env: bool


@runtime_checkable
class ActingStage(Protocol):
    """A stage that steps envs with an agent: an ExperienceSource (or a stage standing in for one).

    ``agent`` acts on ``observation_transform(obs)`` (the env's own observations when it is ``None``, e.g.
    an :class:`~ptl_rl.ObservationNormalizer` handed to the source) for its ``num_envs`` sub-envs. Stages
    downstream read these, never write them: a :class:`~ptl_rl.RolloutBuffer` bootstraps from the agent's
    critic, :class:`~ptl_rl.NormalizeObservations` updates the normalizer the source shows its agent.
    """

    agent: Any
    observation_transform: Callable[[Any], Any] | None
    num_envs: int


@runtime_checkable
class SyncedStatistics(Protocol):
    """A stage whose running statistics are merged across DDP ranks: ``sync()`` (collective) returns whether
    a merge happened. :func:`ptl_rl.stages.normalize.sync_statistics` calls it on every such stage."""

    def sync(self) -> bool: ...


@runtime_checkable
class EpisodeCounter(Protocol):
    """A stage that counts env steps and finished episodes: an ExperienceSource, or a stage standing in for one.

    The episode callbacks (:class:`~ptl_rl.callbacks.EpisodeStatsLogger`,
    :class:`~ptl_rl.callbacks.EnvStepLimit`,
    :class:`~ptl_rl.callbacks.PeriodicEvaluation`) use the first stage of a
    chain that has these members; a remote collector keeps the learner's copy
    of the counters under the same names.
    """

    total_steps: int
    episodes_finished: int

    def recent_episodes(self) -> list[Episode]: ...

    def pop_episodes(self) -> list[Episode]: ...

    def episode_stats(self) -> dict[str, float]: ...


@runtime_checkable
class Sampleable(Protocol):
    """Anything with ``sample(batch_size) -> TransitionBatch`` (a replay buffer): what a BatchSampler draws from."""

    def sample(self, batch_size: int) -> TransitionBatch: ...


@runtime_checkable
class ReplayStage(Protocol):
    """A stage that holds replay contents: a ``storage`` it samples from.

    Such a stage yields itself, not torch batches (``to_dataloader`` refuses it
    as the last stage and names the sampler to add), and
    ``PipelineCheckpoint(include_replay=False)`` leaves its state out.
    """

    storage: Storage

    def sample(self, batch_size: int) -> TransitionBatch: ...


@runtime_checkable
class OnPolicyStage(Protocol):
    """A last stage that serves each rollout as ``batches_per_rollout`` batches (a RolloutBuffer).

    :func:`~ptl_rl.to_dataloader` without ``steps_per_epoch`` then makes one
    Lightning epoch per rollout.
    """

    batches_per_rollout: int


# ---------------------------------------------------------------------------- storages
@runtime_checkable
class Storage(Protocol):
    """Where a replay buffer keeps its transitions: a ring of ``capacity`` slots.

    ``add`` writes the ``B`` rows of a batch into the next slots (the oldest
    are overwritten once full) and returns them (int64 [B]); ``gather``
    returns the rows of the given slots (int [R]) as a
    :class:`~ptl_rl.core.batch.TransitionBatch` [R, ...]. ``len()`` is the number
    of slots holding data, ``size`` the same, ``cursor`` the next slot to
    write and ``total_added`` the rows ever added. A storage must refuse a
    batch it cannot store (``ValueError``/``TypeError``) *before* writing
    anything. Its state is saved with the buffer's (:class:`Stateful`).

    Pass ``storage=lambda capacity: MyStorage(capacity)`` to a replay buffer.
    """

    capacity: int
    cursor: int
    size: int
    total_added: int

    def __len__(self) -> int: ...

    def add(self, batch: TransitionBatch) -> np.ndarray: ...

    def gather(self, indices: np.ndarray) -> TransitionBatch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class RollbackStorage(Protocol):
    """A storage whose ``add`` changes more than its counters (per-env bookkeeping): it takes its own snapshots.

    An interrupted ``add`` is redone in full by the buffer: it restores the
    snapshot taken before the add, then adds the batch again. Without these
    methods the buffer rolls back ``cursor``, ``size`` and ``total_added``,
    which suffices for a storage that rewrites whole rows.
    """

    def snapshot(self) -> Any: ...

    def restore(self, snapshot: Any) -> None: ...


@runtime_checkable
class JournaledStorage(Protocol):
    """A storage whose ``add`` is safe against cuts by itself (a FrameStorage, whose compiled insert commits whole).

    A buffer adds to it directly instead of journaling the add (see
    :class:`~ptl_rl.core.guard.WriteJournal`), and calls ``settle()`` before
    every read: it finishes an add a cut left half done (a no-op when none is).
    """

    def settle(self) -> None: ...


@runtime_checkable
class PartlySampleableStorage(Protocol):
    """A storage some of whose slots cannot be sampled yet (a frame stack still incomplete).

    ``sampleable(slots)`` returns a bool array [R]: the buffers draw again
    where it is ``False``, and passes without replacement skip those slots.
    """

    def sampleable(self, indices: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class StreamBoundStorage(Protocol):
    """A storage that follows its buffer's upstream stream (which stage feeds it, and the number of each batch).

    The buffer calls ``bind_upstream(upstream)`` once when it is built and
    ``note_stream_seq(batch, seq)`` before adding each pulled batch, with the
    upstream's :class:`NumberedStream` number (or ``None``).
    """

    def bind_upstream(self, upstream: Any) -> None: ...

    def note_stream_seq(self, batch: TransitionBatch, seq: int | None) -> None: ...


# ---------------------------------------------------------------------------- agents
@runtime_checkable
class Agent(Protocol):
    """What an :class:`~ptl_rl.stages.source.ExperienceSource` acts with: a callable from observations to actions.

    ``agent(obs)`` gets the batch of observations of all sub-envs (numpy
    ``[N, *obs_shape]``, or a dict of such arrays) and returns the actions
    ``[N, *action_shape]``, or ``(actions, extras)`` with ``extras`` a dict of
    arrays ``[N, ...]`` (``log_prob``, ``value``) stored as fields of the
    transitions. Any function or lambda is an agent. The source calls it once
    per vector step, with the learner's current weights.
    """

    # positional-only: the source passes obs by position, so any one-argument callable (a lambda) is an agent
    def __call__(self, obs: Any, /) -> Any: ...


@runtime_checkable
class RecurrentAgent(Protocol):
    """An agent with a hidden state per env: ``reset_state(mask)`` clears it for the envs that start an episode.

    ``mask`` is bool [N]; the source calls it before acting whenever some
    env's observation is the first of an episode.
    """

    def reset_state(self, mask: np.ndarray) -> None: ...


@runtime_checkable
class EnvStepAware(Protocol):
    """An agent (or selector) whose behaviour follows the env-step count (an epsilon schedule, a noise scale).

    The source calls ``on_env_steps(total_steps)`` after every vector step.
    """

    def on_env_steps(self, total_steps: int) -> None: ...


@runtime_checkable
class Critic(Protocol):
    """An agent that estimates state values: ``value(obs) -> float32 [N]``.

    A :class:`~ptl_rl.replay.RolloutBuffer` bootstraps its last step from the
    critic of the first agent upstream that has one.
    """

    def value(self, obs: Any) -> np.ndarray: ...


@runtime_checkable
class TransitionCritic(Protocol):
    """An agent whose values need more than an observation (a recurrent state): ``next_value(rows) -> float32 [R]``.

    ``rows`` maps each field of a rollout (``obs``, ``next_obs``, the agent's
    extras such as ``hidden``) to the arrays of ``R`` rows; the result is
    ``V(next_obs)`` of each row. A :class:`~ptl_rl.replay.RolloutBuffer`
    bootstraps through it in preference to :class:`Critic`.
    """

    def next_value(self, rows: Mapping[str, Any]) -> np.ndarray: ...


# ---------------------------------------------------------------------------- checks
def implements(obj: Any, protocol: type) -> bool:
    """``isinstance(obj, protocol)`` for a protocol of methods only, decided once per class of ``obj``.

    ``isinstance`` against a runtime protocol looks every member up each time
    (about 20 us on Python 3.11), too slow for a per-step check; the class
    decides for methods, so the answer is cached per class. An object that
    gains methods per instance (``__getattr__`` forwarding, as a wrapped
    agent does) needs ``isinstance`` instead.
    """
    # (annotated as plain `type`: mypy checks `type[X]` against the cache's Hashable key through X's unbound
    # __hash__ and refuses it, though every class is hashable)
    kind: type = type(obj)
    return _class_implements(kind, protocol)


@functools.cache
def _class_implements(kind: type, protocol: type) -> bool:
    return issubclass(kind, protocol)


# ---------------------------------------------------------------------------- messages
_CALLED_DUNDERS = ("__call__", "__iter__", "__len__", "__next__")


def missing_members(obj: Any, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``obj`` lacks, for an error message (empty when ``obj`` has them all)."""
    members = list(getattr(protocol, "__annotations__", {}))
    members += [
        name
        for name, value in vars(protocol).items()
        if callable(value) and (not name.startswith("_") or name in _CALLED_DUNDERS)
    ]
    return [name for name in members if not hasattr(obj, name)]

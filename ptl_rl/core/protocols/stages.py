"""What the chain reads off a stage: the protocol it walks, and the capabilities stages downstream rely on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from ptl_rl.core.batch import TransitionBatch
    from ptl_rl.core.clock import StageClock
    from ptl_rl.core.episode import Episode
    from ptl_rl.core.protocols.storages import Storage

T_co = TypeVar("T_co", covariant=True)

#: The end of a pipeline, as the functions that walk one take it (:func:`~ptl_rl.pipeline_stages`, the callbacks):
#: its last stage (any iterator; a :class:`StageLike` is followed upstream) or the DataLoader that
#: :func:`~ptl_rl.to_dataloader` made over it.
Pipeline: TypeAlias = Iterable[object]


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
class NStepStream(Protocol):
    """A stage whose transitions span ``n`` env steps: ``next_obs`` is the ``obs`` of the same env ``n`` steps later.

    :class:`~ptl_rl.stages.nstep.NStepTransform` is one. A
    :class:`~ptl_rl.replay.FrameStorage` fed by it takes its ``n`` (a transition's
    ``next_obs`` is stored as a link to the observation ``n`` rows later); an
    upstream without ``n`` delivers 1-step transitions.
    """

    n: int


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

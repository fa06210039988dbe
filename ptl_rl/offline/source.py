"""The :class:`MinariSource` stage: a Minari dataset's episodes yielded as 1-step batches, as a vector env's would be.

Rows follow the field contract of live data (``docs/contract.rst``); how an
episode maps to rows is in :mod:`ptl_rl.offline.reader`.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import numpy as np
from gymnasium import spaces

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core._trees import tree_map, tree_take
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.protocols import ReplayStage
from ptl_rl.core.ranks import distributed_rank, rank_seed
from ptl_rl.core.stage import Stage
from ptl_rl.offline.reader import (
    check_expected_space,
    check_space_kind,
    episode_rows,
    leaf_shapes,
    open_minari_dataset,
    read_episodes,
)
from ptl_rl.stages.nstep import NStepTransform

if TYPE_CHECKING:
    from minari import MinariDataset


class _Fillable(Protocol):
    """What :meth:`MinariSource.fill` fills: anything with ``add(batch)`` (a replay buffer)."""

    def add(self, batch: TransitionBatch, /) -> object: ...


FillableT = TypeVar("FillableT", bound=_Fillable)

__all__ = ["MinariSource"]

_ROW_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def _concat(parts: list[Any]) -> Any:
    return tree_map(lambda *leaves: np.concatenate(leaves), parts[0], *parts[1:])


class MinariSource(Stage[TransitionBatch]):
    """Reads the episodes of a Minari dataset and yields 1-step :class:`TransitionBatch` es, like a source.

    Each of ``lanes`` lanes plays one dataset episode at a time, step by step,
    and takes the next unread episode when its own ends, the way a vector
    env's sub-env starts a new episode. Each ``next()`` yields one row per
    busy lane (so at most ``lanes`` rows, ``one_row_per_env`` like an
    :class:`~ptl_rl.stages.source.ExperienceSource`), with ``env_id`` = the lane
    (offset by ``rank * lanes``): rows of one ``env_id`` are consecutive steps
    of one episode in time order, then of the next episode after an episode
    end, which is what :class:`~ptl_rl.stages.nstep.NStepTransform` and the buffers
    need. Iteration stops (``StopIteration``) after ``epochs`` passes over the
    episodes.

    Args:
        dataset: a ``minari.MinariDataset``, a local dataset id, or a dataset
            directory (see :func:`open_minari_dataset`; nothing is downloaded).
        lanes: episodes read side by side (the ``N`` of a vector env).
        gamma: the ``discount`` of the yielded 1-step rows.
        episode_indices: which episodes to read (default: all), e.g. a shard per DDP rank.
        shuffle: read the episodes in a random order, a new one each pass (``seed``).
        epochs: passes over the episodes; ``None`` reads them endlessly.
        seed: seed of the episode order.
        rank: offsets ``env_id`` by ``rank * lanes``; ``None``: 0 unless the
            Lightning adapter assigns the DDP rank (:meth:`set_rank`, which also
            splits the episodes across ranks).
        cast_float64: float64 observations become float32, as in ExperienceSource.
        observation_space, action_space: the spaces the consumer expects (e.g.
            the env a model is built for); a dataset with other spaces
            (kind, shape, dtype kind, number of actions) raises ValueError.
        episode_id: add an extra field ``episode_id`` (int64 [B]), the Minari
            id of the episode each row comes from; it is carried through n-step
            and replay like any agent extra.
        episodes_per_read: episodes read from disk at a time (memory holds
            about this many episodes plus the ones in progress).

    Each batch: ``obs [B, *obs_shape]`` (dtype as stored), ``action [B, *action_shape]``,
    ``reward`` float32 [B], ``next_obs`` like ``obs`` (at an episode end the
    final observation), ``terminated``/``truncated`` bool [B] exactly as stored
    (an episode whose last step has neither flag, cut when recording stopped,
    is read as truncated there), ``discount`` float32 [B] = gamma, ``env_id`` int64 [B].

    A ``next()`` cut short (an interrupt, an error while reading) is rolled
    back whole: the next ``next()`` yields the rows it would have yielded
    (only a cut as the finished step returns loses them, as in any stage).
    """

    one_row_per_env = True  # each yielded batch holds at most one transition per lane

    def __init__(
        self,
        dataset: MinariDataset | str | os.PathLike[str],
        *,
        lanes: int = 16,
        gamma: float = 0.99,
        episode_indices: Iterable[int] | None = None,
        shuffle: bool = False,
        epochs: int | None = 1,
        seed: int | None = None,
        rank: int | None = None,
        cast_float64: bool = True,
        observation_space: spaces.Space[Any] | None = None,
        action_space: spaces.Space[Any] | None = None,
        episode_id: bool = False,
        episodes_per_read: int = 64,
    ) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1 or None (endless), got {epochs}")
        if episodes_per_read < 1:
            raise ValueError(f"episodes_per_read must be >= 1, got {episodes_per_read}")
        super().__init__(None)  # a source: it pulls from no stage
        self.dataset = open_minari_dataset(dataset)
        self.dataset_id = str(self.dataset.id)
        self.observation_space = self.dataset.observation_space
        self.action_space = self.dataset.action_space
        check_space_kind(self.observation_space, "observation", self.dataset_id)
        check_space_kind(self.action_space, "action", self.dataset_id)
        check_expected_space(self.dataset_id, "observation", self.observation_space, observation_space)
        check_expected_space(self.dataset_id, "action", self.action_space, action_space)
        self._obs_shapes = leaf_shapes(self.observation_space)
        self._action_shapes = leaf_shapes(self.action_space)

        indices = self.dataset.episode_indices if episode_indices is None else episode_indices
        self.episode_indices = np.asarray(list(indices), dtype=np.int64)
        self._shard_by_rank = episode_indices is None  # explicit indices are the user's own sharding
        self._sharded = False
        if len(self.episode_indices) == 0:
            raise ValueError(f"dataset {self.dataset_id!r}: no episodes to read (episode_indices is empty)")
        self.num_envs = int(lanes)
        self.gamma = float(gamma)
        self.shuffle = bool(shuffle)
        self.epochs = epochs
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.rank = int(rank or 0)
        self._rank_is_explicit = rank is not None
        self.cast_float64 = bool(cast_float64)
        self.with_episode_id = bool(episode_id)
        self.episodes_per_read = int(episodes_per_read)

        self.total_steps = 0  # rows yielded
        self.episodes_finished = 0
        self.passes_started = 0
        self._order = np.zeros(0, dtype=np.int64)  # episode indices of the current pass
        self._read = 0  # episodes of the current pass read from disk
        self._rows: dict[str, Any] | None = None  # the loaded rows, all lanes' episodes back to back
        self._pos = np.zeros(lanes, dtype=np.int64)  # next row of each lane
        self._end = np.zeros(lanes, dtype=np.int64)  # one past the last row of each lane's episode
        self._busy = np.zeros(lanes, dtype=bool)
        self._queue = np.zeros((0, 2), dtype=np.int64)  # loaded episodes not yet in a lane: (start, end) rows
        self._steps_per_pass: int | None = None
        self._set_env_ids()
        if epochs is None and self.steps_per_pass() == 0:  # else reading endlessly would spin without a row
            raise ValueError(f"dataset {self.dataset_id!r}: the episodes to read hold no steps, nothing to yield")

    # ------------------------------------------------------------------ stage
    def step(self) -> TransitionBatch:
        """One row per busy lane (idle lanes take the next episodes first); ``StopIteration`` after the last pass."""
        if not self._busy.all():
            self._fill_lanes()
        lanes = np.flatnonzero(self._busy)
        if len(lanes) == 0:
            raise StopIteration
        rows = self._pos[lanes]
        loaded = self._rows
        assert loaded is not None  # a busy lane reads rows that _fill_lanes loaded
        fields = {name: tree_take(loaded[name], rows) for name in _ROW_FIELDS}
        batch = TransitionBatch(
            {
                **fields,
                "discount": np.full(len(lanes), self.gamma, dtype=np.float32),
                "env_id": self._env_ids[lanes],
            }
        )
        if self.with_episode_id:
            batch["episode_id"] = loaded["episode_id"].take(rows)
        self._pos[lanes] += 1
        ended = lanes[self._pos[lanes] == self._end[lanes]]
        self._busy[ended] = False
        self.total_steps += len(lanes)
        self.episodes_finished += len(ended)
        return batch

    def snapshot(self) -> object:
        """The lanes' positions (copies: [lanes] each), references to what a step replaces, and the counters."""
        return (
            self._pos.copy(),
            self._end.copy(),
            self._busy.copy(),
            self._queue,
            self._rows,
            self._order,
            self.rng,
            self._read,
            self.passes_started,
            self.total_steps,
            self.episodes_finished,
        )

    def restore(self, snapshot: object) -> None:
        """Put the lanes, the loaded rows and the reading order back as the cut step found them."""
        (
            self._pos,
            self._end,
            self._busy,
            self._queue,
            self._rows,
            self._order,
            self.rng,
            self._read,
            self.passes_started,
            self.total_steps,
            self.episodes_finished,
        ) = cast(tuple[Any, ...], snapshot)

    def fill(self, buffer: FillableT, nstep: int = 1) -> FillableT:
        """Add every remaining transition to ``buffer`` (anything with ``add(batch)``) and return it.

        With ``nstep > 1`` the rows go through an :class:`~ptl_rl.stages.nstep.NStepTransform`
        with this source's ``gamma`` first. Needs a finite number of ``epochs``.
        """
        if self.epochs is None:
            raise ValueError("fill() reads the dataset to its end, but this MinariSource is endless (epochs=None)")
        capacity = buffer.storage.capacity if isinstance(buffer, ReplayStage) else None
        remaining = self.epochs * self.steps_per_pass() if self.total_steps == 0 else 0
        if capacity is not None and remaining > capacity:
            warnings.warn(
                f"filling a buffer of capacity {capacity} with {remaining} transitions of dataset "
                f"{self.dataset_id!r}: the oldest {remaining - capacity} are overwritten. Raise capacity to keep "
                "them all",
                UserWarning,
                stacklevel=2,
            )
        stage: Iterator[TransitionBatch] = self if nstep == 1 else NStepTransform(self, nstep, self.gamma)
        for batch in stage:
            buffer.add(batch)
        return buffer

    # ------------------------------------------------------------------ rank
    def set_rank(self, rank: int) -> None:
        """Take DDP rank ``rank`` (called by the Lightning adapter before the first batch).

        ``env_id`` is offset by ``rank * lanes`` and the shuffle seed made
        rank-distinct. Under ``torch.distributed`` the episodes are split too,
        ``episode_indices[rank::world_size]``, unless ``episode_indices`` was
        given (then each rank reads what it was given). Only before reading.
        """
        if self._rank_is_explicit:
            return
        _, world_size = distributed_rank()
        shard = self._shard_by_rank and world_size > 1 and not self._sharded
        if int(rank) == self.rank and not shard:
            return
        if self.total_steps or self.passes_started:
            raise RuntimeError(
                f"this MinariSource has already read episodes as rank {self.rank}; it cannot become rank {rank}. "
                "Build the pipeline inside each process, or pass rank= explicitly"
            )
        self.rank = int(rank)
        self._set_env_ids()
        self.rng = np.random.default_rng(rank_seed(self.seed, self.rank))
        if shard:
            self.episode_indices = self.episode_indices[self.rank :: world_size]
            self._steps_per_pass = None
            self._sharded = True
            if len(self.episode_indices) == 0:
                raise ValueError(
                    f"dataset {self.dataset_id!r} has fewer episodes than the {world_size} ranks reading it: "
                    f"rank {self.rank} gets none. Use fewer processes, or pass episode_indices per rank"
                )

    def _set_env_ids(self) -> None:
        self._env_ids = np.arange(self.num_envs, dtype=np.int64) + self.rank * self.num_envs
        self._env_ids.flags.writeable = False

    # ------------------------------------------------------------------ reading
    def steps_per_pass(self) -> int:
        """Transitions in one pass over ``episode_indices`` (from the episodes' metadata, no data read)."""
        if self._steps_per_pass is None:
            metadata = self.dataset.storage.get_episode_metadata(self.episode_indices.tolist())
            self._steps_per_pass = sum(int(m["total_steps"]) for m in metadata)
        return self._steps_per_pass

    def _next_indices(self) -> np.ndarray:
        """The next episodes to read from disk (empty when every pass is done)."""
        if self._read == len(self._order):
            if self.epochs is not None and self.passes_started >= self.epochs:
                return self._order[:0]
            if self.shuffle:  # a new generator, not the one changed in place: a restore puts the old one back
                self.rng = copy.deepcopy(self.rng)
                self._order = self.rng.permutation(self.episode_indices)
            else:
                self._order = self.episode_indices
            self._read = 0
            self.passes_started += 1
        chosen = self._order[self._read : self._read + self.episodes_per_read]
        self._read += len(chosen)
        return chosen

    def _fill_lanes(self) -> None:
        """Give every idle lane the next episode, reading more episodes from disk when none is loaded."""
        while True:
            idle = np.flatnonzero(~self._busy)
            if len(idle) == 0:
                return
            if len(self._queue) == 0 and not self._load():
                return
            take = min(len(idle), len(self._queue))
            lanes, (starts, ends) = idle[:take], self._queue[:take].T
            self._pos[lanes], self._end[lanes] = starts, ends
            self._busy[lanes] = True
            self._queue = self._queue[take:]

    def _load(self) -> bool:
        """Read the next episodes into the row store; ``False`` when there are none left.

        The rows the busy lanes still need are kept (compacted to the front),
        the rest of the old store is dropped, so memory holds only the episodes
        in progress and the ones just read.
        """
        parts: list[dict[str, Any]] = []
        while not parts:
            indices = self._next_indices()
            if len(indices) == 0:
                return False
            for episode in read_episodes(self.dataset, indices.tolist()):
                rows = episode_rows(self.dataset_id, episode, self._obs_shapes, self._action_shapes, self.cast_float64)
                if len(rows["reward"]):  # an episode of 0 steps has no transition
                    parts.append(rows)
        lengths = np.array([len(p["reward"]) for p in parts], dtype=np.int64)
        busy = np.flatnonzero(self._busy)
        if self._rows is not None and len(busy):
            left = self._end[busy] - self._pos[busy]
            keep = np.concatenate([np.arange(p, e) for p, e in zip(self._pos[busy], self._end[busy], strict=True)])
            parts.insert(0, {name: tree_take(store, keep) for name, store in self._rows.items()})
            self._pos[busy] = np.cumsum(left) - left
            self._end[busy] = np.cumsum(left)
            kept = int(left.sum())
        else:
            kept = 0
        try:
            self._rows = {name: _concat([p[name] for p in parts]) for name in parts[0]}
        except ValueError as error:  # np.concatenate: episodes whose arrays do not stack
            raise ValueError(
                f"dataset {self.dataset_id!r}: its episodes hold arrays of different shapes and cannot be "
                f"batched together ({error})"
            ) from None
        ends = kept + np.cumsum(lengths)
        self._queue = np.stack([ends - lengths, ends], axis=1)
        return True

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``MinariSource(<dataset id> x<lanes>, steps=..., episodes=.../<episodes per pass>)``."""
        return stage_repr(
            self,
            f"{self.dataset_id} x{self.num_envs}",
            steps=self.total_steps,
            episodes=f"{self.episodes_finished}/{len(self.episode_indices)}",
        )

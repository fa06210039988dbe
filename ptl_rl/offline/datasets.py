"""Offline data: Minari datasets in and out of the pipeline.

Two stages and a helper, all with the field contract of live data (``docs/contract.rst``):

* :class:`MinariSource` reads the episodes of a Minari dataset and yields the
  :class:`~ptl_rl.core.batch.TransitionBatch` es an :class:`~ptl_rl.stages.source.ExperienceSource`
  would: one row per *lane* and batch, like a vector env with one sub-env per
  lane, so an :class:`~ptl_rl.stages.nstep.NStepTransform` or a replay buffer
  downstream works on it unchanged.
* :func:`minari_replay_buffer` (or :meth:`MinariSource.fill`) fills a replay
  buffer with a whole dataset in one call: fill once, then sample epochs.
* :class:`MinariRecorder` passes a source's batches through unchanged and
  writes them as Minari episodes, in every autoreset mode.

How a Minari episode of ``T`` steps maps to rows (Minari >= 0.4 format)::

    observations  [T + 1, ...]   row t: obs = observations[t], next_obs = observations[t + 1]
    actions       [T, ...]       action
    rewards       [T]            reward (float32)
    terminations  [T]  bool      terminated
    truncations   [T]  bool      truncated

so ``next_obs`` of the last row is the real final observation, never a reset
observation. Minari is an optional dependency (``pip install ptl_rl[offline]``),
imported only when one of these is used. See ``docs/design/offline.md``.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np
from gymnasium import spaces

from ptl_rl.core._grouping import rank_within_group
from ptl_rl.core._reprs import stage_repr
from ptl_rl.core._trees import tree_assign, tree_leaves, tree_map, tree_take
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.protocols import NumberedStream, PerEnvStream
from ptl_rl.core.ranks import distributed_rank, rank_seed

__all__ = ["MinariRecorder", "MinariSource", "minari_replay_buffer", "open_minari_dataset"]

_INSTALL_HINT = "pip install 'ptl_rl[offline]'  (or: pip install 'minari[hdf5]>=0.5')"
_ROW_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def _episode_buffer_class() -> type:
    from minari.data_collector.episode_buffer import EpisodeBuffer

    return EpisodeBuffer


def _minari() -> Any:
    """The ``minari`` module, or an ImportError that says how to install it."""
    try:
        import minari
    except ImportError as error:  # the optional extra is not installed
        raise ImportError(
            f"ptl_rl's offline data support (MinariSource, MinariRecorder) needs Minari, which is not installed "
            f"({error}). Install the extra: {_INSTALL_HINT}"
        ) from error
    return minari


# ---------------------------------------------------------------------------- opening datasets
def open_minari_dataset(dataset: Any) -> Any:
    """A ``minari.MinariDataset`` from a dataset object, a local dataset id, or a directory path.

    ``dataset`` may be:

    * a ``minari.MinariDataset`` (returned as is);
    * a directory: a dataset's own directory (holding ``data/metadata.json``)
      or its ``data`` directory, e.g. one copied from another machine;
    * a dataset id such as ``"cartpole/expert-v0"`` or ``"D4RL/door/human-v2"``,
      looked up under ``$MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``).

    Nothing is ever downloaded: a dataset id that is not stored locally raises
    FileNotFoundError naming the download command to run first.
    """
    minari = _minari()
    if isinstance(dataset, minari.MinariDataset):
        return dataset
    if not isinstance(dataset, (str, os.PathLike)):
        raise TypeError(
            f"expected a minari.MinariDataset, a dataset id or a dataset directory, got {type(dataset).__name__}"
        )
    path = pathlib.Path(dataset)
    if path.is_dir():
        for data_dir in (path, path / "data"):
            if (data_dir / "metadata.json").is_file():
                return minari.MinariDataset(data_dir)
        raise FileNotFoundError(
            f"{path} is a directory but holds no Minari dataset (no metadata.json in it or in its data/ "
            "subdirectory); pass the dataset's directory, e.g. ~/.minari/datasets/<namespace>/<name>-v0"
        )
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        return minari.load_dataset(str(dataset), download=False)
    except FileNotFoundError:
        root = get_dataset_path().resolve()
        raise FileNotFoundError(
            f"Minari dataset {str(dataset)!r} is not stored locally (looked in {root}, set by "
            "$MINARI_DATASETS_PATH). ptl_rl never downloads: fetch it first where there is internet with "
            f"`minari download {dataset}` (or minari.download_dataset({str(dataset)!r})), copy it under "
            "$MINARI_DATASETS_PATH, or pass the dataset's directory path instead of its id"
        ) from None


# ---------------------------------------------------------------------------- checks
_UNSUPPORTED_SPACES = (spaces.Tuple, spaces.Text, spaces.Sequence, spaces.Graph)


def _check_space_kind(space: spaces.Space, what: str, dataset_id: str) -> None:
    """Transition fields are arrays or dicts of arrays: reject the spaces Minari stores otherwise."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _check_space_kind(sub, f"{what}[{key!r}]", dataset_id)
    elif isinstance(space, _UNSUPPORTED_SPACES):
        raise TypeError(
            f"dataset {dataset_id!r}: its {what} space is {space}, which ptl_rl cannot hold in a TransitionBatch "
            "(fields are arrays or dicts of arrays). Record the env with a flattening wrapper, e.g. "
            "gymnasium.wrappers.FlattenObservation, or convert the dataset's episodes yourself"
        )


def _same_space(a: spaces.Space, b: spaces.Space) -> bool:
    """Same kind, shape and dtype (and ``n`` of Discrete, keys of Dict); bounds are not compared."""
    if type(a) is not type(b):
        return False
    # (b's kind is tested too, though it is a's: `type(a) is type(b)` narrows a only)
    if isinstance(a, spaces.Dict) and isinstance(b, spaces.Dict):
        return a.spaces.keys() == b.spaces.keys() and all(_same_space(a[k], b[k]) for k in a.spaces)
    if isinstance(a, spaces.Discrete) and isinstance(b, spaces.Discrete):
        return int(a.n) == int(b.n) and int(a.start) == int(b.start)
    return a.shape == b.shape and np.dtype(a.dtype).kind == np.dtype(b.dtype).kind


def _check_expected_space(dataset_id: str, what: str, stored: spaces.Space, expected: spaces.Space | None) -> None:
    if expected is not None and not _same_space(stored, expected):
        raise ValueError(
            f"dataset {dataset_id!r} has {what} space {stored}, but the pipeline expects {expected}. "
            f"Load a dataset recorded from this env, or build the model for the dataset's {what} space "
            f"(MinariDataset.{what}_space)"
        )


def _leaf_shapes(space: spaces.Space) -> Any:
    """The per-step shape of each leaf of ``space`` (a dict for Dict spaces)."""
    if isinstance(space, spaces.Dict):
        return {k: _leaf_shapes(s) for k, s in space.spaces.items()}
    return tuple(space.shape) if space.shape is not None else ()


def _check_leaves(dataset_id: str, episode_id: int, what: str, data: Any, shapes: Any, length: int) -> None:
    """Every leaf of ``data`` is an array of ``length`` entries of the space's shape."""
    if isinstance(shapes, dict):
        if not isinstance(data, Mapping) or set(data) != set(shapes):
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                f"dataset {dataset_id!r}, episode {episode_id}: {what} hold {got}, but the dataset's {what} "
                f"space has the keys {sorted(shapes)}; the stored data does not match its space"
            )
        for key, shape in shapes.items():
            _check_leaves(dataset_id, episode_id, f"{what}[{key!r}]", data[key], shape, length)
        return
    array = np.asarray(data)
    if array.shape != (length, *shapes):
        raise ValueError(
            f"dataset {dataset_id!r}, episode {episode_id}: {what} have shape {array.shape}, expected "
            f"{(length, *shapes)} ({length} entries of the space's shape {shapes}). Minari episodes of T steps "
            "store T + 1 observations (the last is the final observation) and T actions, rewards, terminations "
            "and truncations; this dataset does not, or does not match its declared spaces"
        )


_EPISODE_FIELDS = ("observations", "actions", "rewards", "terminations", "truncations")


def _read_episodes(dataset: Any, indices: Sequence[int]) -> Iterator[Any]:
    """Minari's episodes ``indices``, with a missing stored field reported by name."""
    episodes = dataset.iterate_episodes(indices)
    for index in indices:
        try:
            episode = next(episodes)
        except KeyError as error:  # h5py (or arrow): the episode's group lacks a field every Minari episode has
            missing = [name for name in _EPISODE_FIELDS if repr(name) in str(error) or f'"{name}"' in str(error)]
            what = f"the field {missing[0]!r}" if missing else f"a field ({error})"
            raise ValueError(
                f"dataset {dataset.id!r}, episode {index}: the stored episode lacks {what}; every Minari episode "
                f"needs {', '.join(_EPISODE_FIELDS)}. The dataset is incomplete or was not written by Minari: "
                "re-create it (e.g. with ptl_rl.MinariRecorder) or fetch it again"
            ) from None
        yield episode


def _episode_rows(dataset_id: str, episode: Any, obs_shapes: Any, action_shapes: Any, cast_float64: bool) -> dict:
    """The ``T`` transitions of one Minari episode as field arrays (see the module docstring)."""
    episode_id = int(episode.id)
    rewards = np.asarray(episode.rewards)
    length = len(rewards)
    for what in ("terminations", "truncations"):
        if np.asarray(getattr(episode, what)).shape != (length,):
            raise ValueError(
                f"dataset {dataset_id!r}, episode {episode_id}: {what} have shape "
                f"{np.asarray(getattr(episode, what)).shape}, expected ({length},) like rewards"
            )
    _check_leaves(dataset_id, episode_id, "observations", episode.observations, obs_shapes, length + 1)
    _check_leaves(dataset_id, episode_id, "actions", episode.actions, action_shapes, length)
    terminated = np.asarray(episode.terminations, dtype=bool)
    truncated = np.asarray(episode.truncations, dtype=bool)
    ended = terminated | truncated
    if length and ended[:-1].any():
        step = int(np.flatnonzero(ended[:-1])[0])
        raise ValueError(
            f"dataset {dataset_id!r}, episode {episode_id}: step {step} of {length} is terminated/truncated, "
            "but only an episode's last step may end it; the episode spans a reset, so its next_obs would be "
            "wrong. Re-record the data one episode per Minari episode"
        )
    if length and not ended[-1]:
        # an episode cut short when recording stopped: truncated, so that a learner bootstraps from its
        # final observation and an NStepTransform does not join it to the next episode (Minari's own
        # DataCollector marks such episodes the same way)
        truncated = truncated.copy()
        truncated[-1] = True

    def own(a: Any) -> np.ndarray:
        a = np.asarray(a)
        return a.astype(np.float32) if cast_float64 and a.dtype == np.float64 else a

    observations = tree_map(own, episode.observations)
    return {
        "obs": tree_map(lambda a: a[:-1], observations),
        "action": np.asarray(episode.actions),
        "reward": rewards.astype(np.float32),
        "next_obs": tree_map(lambda a: a[1:], observations),
        "terminated": terminated,
        "truncated": truncated,
        "episode_id": np.full(length, episode_id, dtype=np.int64),
    }


def _concat(parts: list[Any]) -> Any:
    return tree_map(lambda *leaves: np.concatenate(leaves), parts[0], *parts[1:])


# ---------------------------------------------------------------------------- loading
class MinariSource:
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
    """

    upstream = None  # a source: it pulls from no stage (ptl_rl.core.protocols.Stage)
    one_row_per_env = True  # each yielded batch holds at most one transition per lane

    def __init__(
        self,
        dataset: Any,
        *,
        lanes: int = 16,
        gamma: float = 0.99,
        episode_indices: Iterable[int] | None = None,
        shuffle: bool = False,
        epochs: int | None = 1,
        seed: int | None = None,
        rank: int | None = None,
        cast_float64: bool = True,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
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
        self.dataset = open_minari_dataset(dataset)
        self.dataset_id = str(self.dataset.id)
        self.observation_space = self.dataset.observation_space
        self.action_space = self.dataset.action_space
        _check_space_kind(self.observation_space, "observation", self.dataset_id)
        _check_space_kind(self.action_space, "action", self.dataset_id)
        _check_expected_space(self.dataset_id, "observation", self.observation_space, observation_space)
        _check_expected_space(self.dataset_id, "action", self.action_space, action_space)
        self._obs_shapes = _leaf_shapes(self.observation_space)
        self._action_shapes = _leaf_shapes(self.action_space)

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

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> MinariSource:
        return self

    def __next__(self) -> TransitionBatch:
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

    def fill(self, buffer: Any, nstep: int = 1) -> Any:
        """Add every remaining transition to ``buffer`` (anything with ``add(batch)``) and return it.

        With ``nstep > 1`` the rows go through an :class:`~ptl_rl.stages.nstep.NStepTransform`
        with this source's ``gamma`` first. Needs a finite number of ``epochs``.
        """
        from ptl_rl.stages.nstep import NStepTransform

        if self.epochs is None:
            raise ValueError("fill() reads the dataset to its end, but this MinariSource is endless (epochs=None)")
        capacity = getattr(buffer, "capacity", None)
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
            self._order = self.rng.permutation(self.episode_indices) if self.shuffle else self.episode_indices
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
            for episode in _read_episodes(self.dataset, indices.tolist()):
                rows = _episode_rows(self.dataset_id, episode, self._obs_shapes, self._action_shapes, self.cast_float64)
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


def minari_replay_buffer(
    dataset: Any,
    *,
    nstep: int = 1,
    gamma: float = 0.99,
    capacity: int | None = None,
    seed: int | None = None,
    replacement: bool = True,
    lanes: int = 256,
    **source_kwargs: Any,
) -> Any:
    """A standalone :class:`~ptl_rl.replay.ReplayBuffer` holding a whole Minari dataset, filled in one call.

    For offline RL and behaviour cloning: fill once, then sample, e.g.
    ``to_dataloader(BatchSampler(buffer, batch_size=256), steps_per_epoch=...)``.
    ``nstep > 1`` folds n-step returns first (``gamma`` per step).
    ``capacity`` defaults to the dataset's number of steps (every n-step
    window starts at one step, so that holds them all). ``replacement=False``
    samples shuffled passes (epochs) over the data. Other keyword arguments go
    to :class:`MinariSource` (``episode_indices``, ``observation_space``, ...).
    """
    from ptl_rl.replay import ReplayBuffer

    source = MinariSource(dataset, lanes=lanes, gamma=gamma, epochs=1, **source_kwargs)
    if capacity is None:
        capacity = max(1, source.steps_per_pass())
    buffer = ReplayBuffer(None, capacity=capacity, warmup=0, seed=seed, replacement=replacement)
    return source.fill(buffer, nstep=nstep)


# ---------------------------------------------------------------------------- recording
def _space_as_stored(space: spaces.Space, sample: Any) -> spaces.Space:
    """``space`` with the dtype of the arrays that are stored (an ExperienceSource casts float64 to float32)."""
    if isinstance(space, spaces.Dict):
        return spaces.Dict({k: _space_as_stored(s, sample[k]) for k, s in space.spaces.items()})
    dtype = np.asarray(sample).dtype
    if isinstance(space, spaces.Box) and dtype != space.dtype and dtype.kind == np.dtype(space.dtype).kind:
        return spaces.Box(space.low.astype(dtype), space.high.astype(dtype), space.shape, dtype)
    return space


def _spec_of(env: Any) -> Any:
    sub_envs = getattr(env, "envs", None)
    if sub_envs:  # a sync vector env: its first sub-env has the single env's spec
        return getattr(sub_envs[0], "spec", None)
    return getattr(env, "spec", None)


_RECORDED_FIELDS = ("obs", "action", "reward", "terminated", "truncated")


def rows_equal_nan_as_equal(a: Any, b: Any, rows: int) -> np.ndarray:
    """Row-wise equality of two (dicts of) arrays [B, ...] (``rows`` = B) by value -> bool [B]; NaN equals NaN.

    Values, not bytes (as ``frames.pool.rows_bitwise_equal`` compares): a recorded observation and the next
    step's are the same observation whatever NaN payload or zero sign they carry. ``rows`` is passed, not read
    from a leaf: a tree without leaves (an empty Dict observation) has B rows that are all equal.
    """
    result = np.ones(rows, dtype=bool)
    for (_, x), (_, y) in zip(tree_leaves(a), tree_leaves(b), strict=True):
        same = x == y
        if x.dtype.kind in "fc":
            same |= np.isnan(x) & np.isnan(y)
        result &= same.reshape(len(same), -1).all(axis=1)
    return result


class MinariRecorder:
    """Passes 1-step batches through unchanged and writes their episodes to a new Minari dataset.

    Put it right after an :class:`~ptl_rl.stages.source.ExperienceSource` (before any
    :class:`~ptl_rl.stages.nstep.NStepTransform`): ``ExperienceSource -> MinariRecorder
    -> NStepTransform -> ...``, or iterate it alone to only record. It groups
    rows by ``env_id`` into episodes and writes an episode when its last row
    (terminated or truncated) passes, with ``observations`` = the rows' ``obs``
    followed by the last row's ``next_obs`` (the real final observation, which
    the source provides in every autoreset mode). So what is stored is exactly
    what the source yielded, whatever the env's autoreset mode; loading it with
    :class:`MinariSource` gives the same rows back.

    Args:
        upstream: an iterator of 1-step batches whose rows of one ``env_id``
            are consecutive steps in time order (an ExperienceSource), or
            ``None`` to feed :meth:`record` by hand.
        dataset_id: the new dataset's id, ``(namespace/)name-v<version>``,
            created under ``$MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``).
        env: the env whose spaces and spec are recorded; default ``upstream.env``.
            A vector env's single-env spaces are used.
        observation_space, action_space: override the spaces (default: the env's;
            a float64 Box becomes float32 when the stored observations are float32).
        partial_episodes: what happens to episodes still running at :meth:`close`
            and where the upstream's streams are cut (:meth:`end_episodes`):
            ``"truncate"`` (default) writes them with ``truncated`` set on their
            last step (bootstrap from its ``next_obs``, as Minari's DataCollector
            and :meth:`NStepTransform.flush` do); ``"drop"`` discards them.
        flush_every: finished episodes kept in memory before they are written.
        **metadata: passed to ``minari.create_dataset_from_buffers``
            (``author``, ``author_email``, ``code_permalink``, ``description``,
            ``algorithm_name``, ``eval_env``, ``requirements``, ...).

    A skipped ``stream_seq`` number upstream (the source reset every sub-env
    after a crash, an interrupt or a restore, or a batch was pulled past the
    recorder) cuts every running episode there, and recording goes on; the
    recorder's own ``stream_seq`` (the upstream's number of the batch it passed
    on last) lets the stages behind it see the cut too.

    Agent extras are not recorded (Minari has no per-transition slot for them
    besides ``infos``). Image observations are stored losslessly
    (``jpeg_encoding=False``). Call :meth:`close` (or use ``with``) at the end:
    it writes what is left and returns the ``minari.MinariDataset``.
    """

    one_row_per_env = True  # passes its upstream's batches through unchanged

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None,
        dataset_id: str,
        *,
        env: Any = None,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
        partial_episodes: str = "truncate",
        flush_every: int = 32,
        **metadata: Any,
    ) -> None:
        minari = _minari()
        if partial_episodes not in ("truncate", "drop"):
            raise ValueError(f"partial_episodes must be 'truncate' or 'drop', got {partial_episodes!r}")
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every}")
        self.upstream = upstream
        self.one_row_per_env = isinstance(upstream, PerEnvStream) and bool(upstream.one_row_per_env)
        self._upstream_numbered = isinstance(upstream, NumberedStream)  # its stream_seq is read at every pull
        self.dataset_id = str(dataset_id)
        self.partial_episodes = partial_episodes
        self.flush_every = int(flush_every)
        self._minari = minari
        self._env = env = env if env is not None else getattr(upstream, "env", None)
        # `is None`, not `or`: a space can be falsy (an empty Dict has len 0) and is still the one asked for
        if observation_space is None or action_space is None:
            if env is None:
                raise ValueError(
                    "MinariRecorder needs the env's spaces: pass env=..., or observation_space= and action_space=, "
                    "or record an ExperienceSource (its env is used)"
                )
            vector = hasattr(env, "single_observation_space")
            if observation_space is None:
                observation_space = env.single_observation_space if vector else env.observation_space
            if action_space is None:
                action_space = env.single_action_space if vector else env.action_space
        self._observation_space: spaces.Space = observation_space
        self._action_space: spaces.Space = action_space
        _check_space_kind(self._observation_space, "observation", self.dataset_id)
        _check_space_kind(self._action_space, "action", self.dataset_id)
        self._metadata = {"algorithm_name": "ptl_rl.MinariRecorder", **metadata}
        self._check_dataset_id()

        self.dataset: Any = None  # created with the first written episodes (their dtypes fix the spaces)
        self.episodes_written = 0
        self.steps_written = 0
        self.closed = False
        self._finished: list[Any] = []  # minari EpisodeBuffers not yet written
        self._steps: dict[str, Any] | None = None  # field -> [E, capacity, ...]: each env's episode so far
        self._last_next_obs: Any = None  # [E, ...]: next_obs of each env's last row
        self._length = np.zeros(0, dtype=np.int64)  # steps of each env's running episode
        self._upstream_seq: int | None = None  # stream_seq of the last upstream batch recorded
        # the upstream's number of the batch passed on last, so that a stage behind the recorder (an
        # NStepTransform) sees the cuts in the envs' streams too; None if the upstream has no numbers
        self.stream_seq: int | None = None

    def _check_dataset_id(self) -> None:
        from minari.dataset.minari_dataset import parse_dataset_id
        from minari.storage.datasets_root_dir import get_dataset_path

        try:
            parse_dataset_id(self.dataset_id)
        except ValueError:
            raise ValueError(
                f"invalid Minari dataset id {self.dataset_id!r}; ids look like '(namespace/)name-v<version>', "
                "e.g. 'cartpole/expert-v0'"
            ) from None
        path = get_dataset_path(self.dataset_id)
        if path.exists():
            raise FileExistsError(
                f"a Minari dataset {self.dataset_id!r} already exists at {path}; pick another id or version, or "
                f"delete it first (minari.delete_dataset({self.dataset_id!r}))"
            )

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> MinariRecorder:
        return self

    def __next__(self) -> TransitionBatch:
        if self.upstream is None:
            raise TypeError("this MinariRecorder has no upstream; call record(batch) instead")
        batch = next(self.upstream)
        seq = cast(NumberedStream, self.upstream).stream_seq if self._upstream_numbered else None
        # a skipped number: the envs' streams were cut (a resync after a crash or interrupt, a restore) or
        # someone else pulled batches (a peek); the running episodes cannot be continued by this batch
        if seq is not None and self._upstream_seq is not None and seq != self._upstream_seq + 1:
            self.end_episodes()
        self.record(batch, one_row_per_env=self.one_row_per_env)
        # set only once the batch is recorded: a batch lost to an error shows up as a gap next time
        self._upstream_seq = self.stream_seq = seq
        return batch

    def __enter__(self) -> MinariRecorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.closed:
            self.close()

    # ------------------------------------------------------------------ recording
    def record(self, batch: TransitionBatch, one_row_per_env: bool = False) -> None:
        """Add the rows of ``batch``; episodes that end in it are queued for writing.

        Rows of one ``env_id`` must continue that env's episode: a row's ``obs``
        must equal the previous row's ``next_obs``, else ValueError (the batches
        are not consecutive 1-step transitions, e.g. n-step output). ``batch``
        may hold several steps of one env, in time order; ``one_row_per_env=True``
        promises it holds at most one, which skips a check.
        """
        if self.closed:
            raise RuntimeError(f"MinariRecorder for {self.dataset_id!r} is closed; record into a new one")
        if not len(batch):
            return
        env_id = np.asarray(batch["env_id"])
        if one_row_per_env or len(np.unique(env_id)) == len(env_id):
            self._record_unique(batch, env_id)
        else:  # several steps of one env in one batch: add them occurrence by occurrence, in time order
            occurrence = rank_within_group(env_id)
            for k in range(int(occurrence.max()) + 1):
                rows = np.flatnonzero(occurrence == k)
                self._record_unique(batch.rows(rows), env_id[rows])
        if len(self._finished) >= self.flush_every:
            self._write()

    def _record_unique(self, batch: TransitionBatch, env: np.ndarray) -> None:
        self._ensure_capacity(batch, int(env.max()) + 1)
        length = self._length[env]
        running = np.flatnonzero(length > 0)
        if len(running):
            same = rows_equal_nan_as_equal(
                tree_take(self._last_next_obs, env[running]), tree_take(batch["obs"], running), len(running)
            )
            if not same.all():
                bad = int(env[running[~same][0]])
                raise ValueError(
                    f"MinariRecorder: the obs of env_id {bad}'s new row differs from the next_obs of its previous "
                    "row, so the rows are not consecutive 1-step transitions of one episode. Record the batches of "
                    "an ExperienceSource directly (ExperienceSource -> MinariRecorder -> NStepTransform), not "
                    "n-step or sampled batches"
                )
        steps = self._grow_steps(int(length.max()) + 1)
        for name in _RECORDED_FIELDS:
            tree_assign(steps[name], (env, length), batch[name])
        tree_assign(self._last_next_obs, env, batch["next_obs"])
        self._length[env] = length + 1
        ended = np.flatnonzero(np.asarray(batch["terminated"]) | np.asarray(batch["truncated"]))
        for e in env[ended].tolist():  # one Python step per finished episode, not per transition
            self._finish(e, truncate=False)

    def end_episodes(self) -> None:
        """Cut every running episode, as ``partial_episodes`` says: queue it as truncated, or drop it.

        Called by the recorder itself when its upstream's ``stream_seq`` skips a
        number (the source reset its envs after a crash, an interrupt or a
        restore, or its batches were pulled elsewhere); public for a recorder
        fed by hand with :meth:`record`, whose caller knows where its streams
        were cut. The next row of each ``env_id`` starts a new episode.
        """
        if self.closed:
            raise RuntimeError(f"MinariRecorder for {self.dataset_id!r} is closed; record into a new one")
        if self._steps is not None and self.partial_episodes == "truncate":
            for env in np.flatnonzero(self._length > 0).tolist():
                self._finish(env, truncate=True)
        self._length[:] = 0

    def _finish(self, env: int, truncate: bool) -> None:
        """Queue env ``env``'s episode (copies of its steps and final observation) and empty its slot."""
        length = int(self._length[env])
        recorded = self._steps
        assert recorded is not None  # an episode to finish has steps, recorded into the allocated arrays
        steps = {name: tree_map(lambda a: a[env, :length].copy(), s) for name, s in recorded.items()}
        final = tree_map(lambda a: a[env : env + 1].copy(), self._last_next_obs)
        if truncate:
            steps["truncated"][-1] = True
        observations = tree_map(lambda o, f: np.concatenate([o, f]), steps["obs"], final)
        self._finished.append(
            _episode_buffer_class()(
                observations=observations,
                actions=steps["action"],
                rewards=steps["reward"],
                terminations=steps["terminated"],
                truncations=steps["truncated"],
            )
        )
        self._length[env] = 0

    def close(self) -> Any:
        """Write the finished episodes, handle the running ones (``partial_episodes``); return the dataset.

        Returns the ``minari.MinariDataset`` (``None`` if not a single step was
        recorded: Minari has no empty datasets).
        """
        if self.closed:
            return self.dataset
        self.end_episodes()
        self._write()
        self.closed = True
        return self.dataset

    def _write(self) -> None:
        if not self._finished:
            return
        episodes, self._finished = self._finished, []
        if self.dataset is None:
            first = episodes[0]
            observation_space = _space_as_stored(self._observation_space, tree_map(lambda a: a[0], first.observations))
            with warnings.catch_warnings():
                # Minari nudges towards author/email/permalink metadata; the user passes them via **metadata
                warnings.filterwarnings("ignore", message=r".*is set to None", category=UserWarning)
                warnings.filterwarnings("ignore", message=r"env_spec is None", category=UserWarning)
                # env=None: Minari would otherwise gym.make the env from its spec just to read spaces we pass
                self.dataset = self._minari.create_dataset_from_buffers(
                    self.dataset_id,
                    [],
                    env=None,
                    observation_space=observation_space,
                    action_space=self._action_space,
                    jpeg_encoding=False,  # lossless: the stored rows must equal the ones the source yielded
                    **self._metadata,
                )
            self._add_env_spec()
        self.dataset.storage.update_episodes(episodes)
        self.dataset.episode_indices = np.arange(self.dataset.storage.total_episodes)
        self.episodes_written += len(episodes)
        self.steps_written += sum(len(e.rewards) for e in episodes)

    def _add_env_spec(self) -> None:
        """Store the env's spec, so that ``MinariDataset.recover_environment()`` can make the env again."""
        spec = _spec_of(self._env) if self._env is not None else None
        if spec is None:
            return
        try:
            self.dataset.storage.update_metadata({"env_spec": spec.to_json()})
        except (TypeError, ValueError) as error:  # a wrapper or kwarg that gymnasium cannot serialize
            warnings.warn(
                f"the spec of env {spec.id!r} cannot be stored ({error}); dataset {self.dataset_id!r} is written "
                "without it, so MinariDataset.recover_environment() will not work for it",
                UserWarning,
                stacklevel=4,
            )
            return
        self.dataset = self._minari.MinariDataset(self.dataset.storage.data_path)

    # ------------------------------------------------------------------ storage
    def _ensure_capacity(self, batch: TransitionBatch, num_envs: int) -> None:
        steps = self._steps
        if steps is None:
            self._steps = steps = {
                name: tree_map(lambda a: np.zeros((0, 0, *a.shape[1:]), dtype=a.dtype), batch[name])
                for name in _RECORDED_FIELDS
            }
            self._last_next_obs = tree_map(lambda a: np.zeros((0, *a.shape[1:]), dtype=a.dtype), batch["next_obs"])
        if num_envs <= len(self._length):
            return
        grow = num_envs - len(self._length)
        self._steps = {
            name: tree_map(lambda a: np.concatenate([a, np.zeros((grow, *a.shape[1:]), a.dtype)]), s)
            for name, s in steps.items()
        }
        self._last_next_obs = tree_map(
            lambda a: np.concatenate([a, np.zeros((grow, *a.shape[1:]), a.dtype)]), self._last_next_obs
        )
        self._length = np.concatenate([self._length, np.zeros(grow, dtype=np.int64)])

    def _grow_steps(self, needed: int) -> dict[str, Any]:
        """Room for ``needed`` steps per env; returns the step arrays (``_ensure_capacity`` allocated them)."""
        steps = self._steps
        assert steps is not None  # allocated by _ensure_capacity, which runs first
        capacity = steps["reward"].shape[1]
        if needed <= capacity:
            return steps
        size = max(needed, 2 * capacity, 64)  # doubling: an episode of T steps costs O(log T) copies
        self._steps = steps = {
            name: tree_map(
                lambda a: np.concatenate([a, np.zeros((a.shape[0], size - a.shape[1], *a.shape[2:]), a.dtype)], 1), s
            )
            for name, s in steps.items()
        }
        return steps

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``MinariRecorder(<dataset id>, episodes_written=..., steps_written=..., running=...)``."""
        running = int(np.count_nonzero(self._length))
        return stage_repr(
            self,
            self.dataset_id,
            episodes_written=self.episodes_written,
            steps_written=self.steps_written,
            running=running,
        )

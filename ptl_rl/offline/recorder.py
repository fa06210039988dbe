"""The :class:`MinariRecorder` stage: a source's 1-step batches passed on unchanged and written as Minari episodes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import numpy as np
from gymnasium import spaces

from ptl_rl.core._grouping import rank_within_group
from ptl_rl.core._reprs import stage_repr
from ptl_rl.core._trees import tree_assign, tree_leaves, tree_map, tree_take
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.chain import pipeline_stages
from ptl_rl.core.protocols import EnvLike, PerEnvStream, VectorEnv
from ptl_rl.core.stage import Stage
from ptl_rl.offline.reader import check_space_kind, import_minari
from ptl_rl.offline.writer import check_new_dataset_id, create_dataset, store_env_spec
from ptl_rl.stages.source import ExperienceSource

__all__ = ["MinariRecorder"]


# per env and step: the step's obs, and at slot t + 1 its next_obs (the next step's obs, or the final observation)
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


class MinariRecorder(Stage[TransitionBatch]):
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

    A cut in the stream (a skipped ``stream_seq`` number upstream: the source
    reset every sub-env after a crash, an interrupt or a restore, or a batch
    was pulled past the recorder; or a ``next()`` of the recorder cut short,
    whose batch is lost) ends every running episode there, as
    ``partial_episodes`` says, and recording goes on: no stored episode joins
    steps across a cut. The recorder's own ``stream_seq`` skips a number there
    too (:class:`~ptl_rl.Stage`), so the stages behind it see the cut.

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
        env: EnvLike | None = None,
        observation_space: spaces.Space[Any] | None = None,
        action_space: spaces.Space[Any] | None = None,
        partial_episodes: str = "truncate",
        flush_every: int = 32,
        **metadata: object,
    ) -> None:
        import_minari()  # fail here, with the install hint, when Minari is missing
        if partial_episodes not in ("truncate", "drop"):
            raise ValueError(f"partial_episodes must be 'truncate' or 'drop', got {partial_episodes!r}")
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every}")
        super().__init__(upstream)
        self.one_row_per_env = isinstance(upstream, PerEnvStream) and bool(upstream.one_row_per_env)
        self.dataset_id = str(dataset_id)
        self.partial_episodes = partial_episodes
        self.flush_every = int(flush_every)
        self._env = env = env if env is not None else _source_env(upstream)
        # `is None`, not `or`: a space can be falsy (an empty Dict has len 0) and is still the one asked for
        if observation_space is None or action_space is None:
            if env is None:
                raise ValueError(
                    "MinariRecorder needs the env's spaces: pass env=..., or observation_space= and action_space=, "
                    "or record an ExperienceSource (its env is used)"
                )
            vector = hasattr(env, "single_observation_space")
            if observation_space is None:
                observation_space = cast(VectorEnv, env).single_observation_space if vector else env.observation_space
            if action_space is None:
                action_space = cast(VectorEnv, env).single_action_space if vector else env.action_space
        self._observation_space: spaces.Space[Any] = observation_space
        self._action_space: spaces.Space[Any] = action_space
        check_space_kind(self._observation_space, "observation", self.dataset_id)
        check_space_kind(self._action_space, "action", self.dataset_id)
        self._metadata = {"algorithm_name": "ptl_rl.MinariRecorder", **metadata}
        check_new_dataset_id(self.dataset_id)

        self.dataset: Any = None  # created with the first written episodes (their dtypes fix the spaces)
        self.episodes_written = 0
        self.steps_written = 0
        self.closed = False
        self._finished: list[Any] = []  # minari EpisodeBuffers not yet written
        # field -> [E, capacity, ...]: each env's episode so far; "obs" holds one slot more, the last next_obs
        self._steps: dict[str, Any] | None = None
        self._length = np.zeros(0, dtype=np.int64)  # steps of each env's running episode
        self._visible = self._length  # _length when the step began: the slots a restore must find unchanged
        self._reused = False  # an episode ended in this step: its env's slots may be written again
        self._undo: list[tuple[dict[str, Any], Any, dict[str, Any]]] = []  # such slots the step overwrote

    # ------------------------------------------------------------------ stage
    def step(self) -> TransitionBatch:
        """Pull a batch, record it (after ending the running episodes at a cut), pass it on unchanged."""
        if self.upstream is None:
            raise TypeError("this MinariRecorder has no upstream; call record(batch) instead")
        self._flush_due()
        batch: TransitionBatch = self.pull()
        self._record(batch, self.one_row_per_env)
        return batch

    def snapshot(self) -> object:
        """The running episodes' lengths (a copy, [E]) and references: the step writes only past those lengths,
        or logs the slots it overwrites (an episode that ended earlier in the step reuses its env's slots)."""
        self._visible = visible = self._length.copy()
        undo: list[tuple[dict[str, Any], Any, dict[str, Any]]] = []
        self._undo, self._reused = undo, False
        return self._steps, visible, self._finished, len(self._finished), undo

    def restore(self, snapshot: object) -> None:
        """Put the running episodes back as the cut step found them; drop what it finished."""
        steps, length, finished, count, undo = cast(tuple[Any, ...], snapshot)
        for store, slots, rows in reversed(undo):
            for name, values in rows.items():
                tree_assign(store[name], slots, values)
        self._steps, self._length = steps, length.copy()
        if self._finished is finished:
            del finished[count:]
        else:  # the step wrote the earlier episodes (it flushes first): the list it began holds its own only
            self._finished = []

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
        promises it holds at most one, which skips a check. A call cut short
        (an interrupt) is rolled back before the next call, which ends the
        running episodes first.
        """

        def body() -> None:
            self._flush_due()
            self._record(batch, one_row_per_env)

        self.transaction(body)

    def _record(self, batch: TransitionBatch, one_row_per_env: bool) -> None:
        if self.closed:
            raise RuntimeError(f"MinariRecorder for {self.dataset_id!r} is closed; record into a new one")
        if self.consume_cut():  # the envs' streams were cut: this batch cannot continue the running episodes
            self._end_episodes()
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

    def _flush_due(self) -> None:
        """Write the finished episodes once ``flush_every`` wait (before a step records: a step cut short is rolled
        back, and what it finished must not be on disk already)."""
        if len(self._finished) >= self.flush_every:
            self._write()

    def _record_unique(self, batch: TransitionBatch, env: np.ndarray) -> None:
        self._ensure_capacity(batch, int(env.max()) + 1)
        length = self._length[env]
        running = np.flatnonzero(length > 0)
        steps = self._steps
        assert steps is not None  # allocated by _ensure_capacity
        if len(running):
            last = (env[running], length[running])  # the slot of each running episode's last next_obs
            same = rows_equal_nan_as_equal(
                tree_map(lambda a: a[last], steps["obs"]), tree_take(batch["obs"], running), len(running)
            )
            if not same.all():
                bad = int(env[running[~same][0]])
                raise ValueError(
                    f"MinariRecorder: the obs of env_id {bad}'s new row differs from the next_obs of its previous "
                    "row, so the rows are not consecutive 1-step transitions of one episode. Record the batches of "
                    "an ExperienceSource directly (ExperienceSource -> MinariRecorder -> NStepTransform), not "
                    "n-step or sampled batches"
                )
        steps = self._grow_steps(int(length.max()) + 2)
        if self._reused:
            self._keep_visible(steps, env, length)
        first = np.flatnonzero(length == 0)  # a new episode's first obs (a running one's is its last next_obs)
        if len(first):
            tree_assign(steps["obs"], (env[first], 0), tree_take(batch["obs"], first))
        tree_assign(steps["obs"], (env, length + 1), batch["next_obs"])
        for name in _RECORDED_FIELDS[1:]:
            tree_assign(steps[name], (env, length), batch[name])
        self._length[env] = length + 1
        ended = np.flatnonzero(np.asarray(batch["terminated"]) | np.asarray(batch["truncated"]))
        for e in env[ended].tolist():  # one Python step per finished episode, not per transition
            self._finish(e, truncate=False)

    def _keep_visible(self, steps: dict[str, Any], env: np.ndarray, length: np.ndarray) -> None:
        """Before a row is written at slot ``length`` of each env (its next_obs at ``length + 1``), after an
        episode ended in this step: log the slots that held a step of an episode running when the step began
        (the ended episode's, which a restore makes running again)."""
        visible = np.zeros(len(env), dtype=np.int64)
        known = env < len(self._visible)
        visible[known] = self._visible[env[known]]
        row, final = length < visible, length + 1 <= visible  # a step's slot, the slot of its final observation
        if row.any():
            where = (np.concatenate([env[row], env[final]]), np.concatenate([length[row], length[final] + 1]))
            self._undo.append((steps, where, {name: tree_map(lambda a: a[where], s) for name, s in steps.items()}))

    def end_episodes(self) -> None:
        """Cut every running episode, as ``partial_episodes`` says: queue it as truncated, or drop it.

        Called by the recorder itself where its stream is cut (its upstream's
        ``stream_seq`` skips a number: the source reset its envs after a crash,
        an interrupt or a restore, or its batches were pulled elsewhere; or a
        ``next()`` of the recorder was cut short); public for a recorder fed by
        hand with :meth:`record`, whose caller knows where its streams were
        cut. The next row of each ``env_id`` starts a new episode.
        """
        self.transaction(self._end_episodes)

    def _end_episodes(self) -> None:
        if self.closed:
            raise RuntimeError(f"MinariRecorder for {self.dataset_id!r} is closed; record into a new one")
        if self._steps is not None and self.partial_episodes == "truncate":
            for env in np.flatnonzero(self._length > 0).tolist():
                self._finish(env, truncate=True)
        self._length[:] = 0

    def _finish(self, env: int, truncate: bool) -> None:
        """Queue env ``env``'s episode (copies of its steps and final observation) and empty its slot."""
        from minari.data_collector.episode_buffer import EpisodeBuffer  # optional dependency: imported on use

        length = int(self._length[env])
        recorded = self._steps
        assert recorded is not None  # an episode to finish has steps, recorded into the allocated arrays
        steps = {name: recorded[name][env, :length].copy() for name in _RECORDED_FIELDS[1:]}
        if truncate:
            steps["truncated"][-1] = True
        observations = tree_map(lambda a: a[env, : length + 1].copy(), recorded["obs"])  # the steps', the final
        self._finished.append(
            EpisodeBuffer(
                observations=observations,
                actions=steps["action"],
                rewards=steps["reward"],
                terminations=steps["terminated"],
                truncations=steps["truncated"],
            )
        )
        self._length[env] = 0
        self._reused = True  # the env's slots are free: a row recorded next overwrites the episode just queued

    def close(self) -> Any:
        """Write the finished episodes, handle the running ones (``partial_episodes``); return the dataset.

        Returns the ``minari.MinariDataset`` (``None`` if not a single step was
        recorded: Minari has no empty datasets).
        """
        if not self.closed:
            self.transaction(self._end_episodes)
            self.transaction(self._write_all)  # apart: a cut after the write must not roll back what ended
        return self.dataset

    def _write_all(self) -> None:
        self._write()
        self.closed = True

    def _write(self) -> None:
        if not self._finished:
            return
        episodes, self._finished = self._finished, []
        if self.dataset is None:
            self.dataset = create_dataset(
                self.dataset_id, episodes[0], self._observation_space, self._action_space, self._metadata
            )
            self.dataset = store_env_spec(self.dataset, self._env, self.dataset_id)
        self.dataset.storage.update_episodes(episodes)
        self.dataset.episode_indices = np.arange(self.dataset.storage.total_episodes)
        self.episodes_written += len(episodes)
        self.steps_written += sum(len(e.rewards) for e in episodes)

    # ------------------------------------------------------------------ storage
    def _ensure_capacity(self, batch: TransitionBatch, num_envs: int) -> None:
        """Room for ``num_envs`` envs (new arrays, never grown in place: a restore puts the old ones back)."""
        steps = self._steps
        if steps is None:
            self._steps = steps = {
                name: tree_map(lambda a: np.zeros((0, 0, *a.shape[1:]), dtype=a.dtype), batch[name])
                for name in _RECORDED_FIELDS
            }
        if num_envs <= len(self._length):
            return
        grow = num_envs - len(self._length)
        self._steps = {
            name: tree_map(lambda a: np.concatenate([a, np.zeros((grow, *a.shape[1:]), a.dtype)]), s)
            for name, s in steps.items()
        }
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


def _source_env(upstream: Iterator[TransitionBatch] | None) -> EnvLike | None:
    """The env of the ExperienceSource at the head of ``upstream``'s chain (``None``: another kind of source)."""
    if upstream is None:
        return None
    return next((stage.env for stage in pipeline_stages(upstream) if isinstance(stage, ExperienceSource)), None)

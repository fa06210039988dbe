"""FrameStorage: replay storage for pixel observations, with every frame stored once.

A drop-in for :class:`~ptl_rl.buffers.ArrayStorage` (same ``add`` / ``gather`` /
state API) that keeps ``obs`` and ``next_obs`` out of the per-transition ring:

* **Frame pool.** Observations are split into frames along the stack axis
  (``stack_axis``; ``None``: the whole observation is one frame) and frames go
  into one ring, the *pool*, of ``capacity + extra_frames`` frames. Every
  stored observation is a row of ``S`` absolute frame positions (int64), so a
  stack is rebuilt at sample time with one ``take``.
* **Stacks stored as single frames.** A new observation of an env whose
  ``S - 1`` oldest frames are bit-identical to the ``S - 1`` newest frames of
  the env's previous observation (what ``FrameStackObservation`` does inside an
  episode) writes only its newest frame. Any other observation (an episode
  start, any data that does not shift) writes its frames, except that a frame
  equal to the next one in the stack is stored once (``"reset"`` padding
  repeats the first frame: one frame written). Because reuse is decided by
  comparing bytes, a rebuilt stack is bit-identical to what was added, for any
  padding and any data.
* **next_obs never stored twice.** A transition without an episode end has as
  ``next_obs`` the ``obs`` of the same env ``n_step`` transitions later (the
  data contract of :class:`~ptl_rl.nstep.NStepTransform` and of 1-step
  sources); it points to that observation's frames once it arrives and is
  *not sampleable* until then. A transition with ``terminated | truncated``
  has a final observation; it is stored on the side in the same pool (its
  stack shares frames with the episode's last observation; the tails of one
  episode share it).
* **Validity.** A transition is sampleable when its ``next_obs`` has arrived
  and every frame it refers to is still in the pool (a pool that overflows,
  with many short episodes and small ``extra_frames``, evicts frames of the
  oldest transitions). Buffers draw only sampleable transitions (see
  :meth:`sampleable`).

Memory per transition: one frame, ``2 * S`` int64 frame references, and the
other fields; with 84x84x4 uint8 Atari stacks about 0.13x of storing ``obs``
and ``next_obs`` in full.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ptl_rl.batch import TransitionBatch
from ptl_rl.buffers.storage import ArrayStorage

_OBS_FIELDS = ("obs", "next_obs")


class FrameStorage:
    """A ring of ``capacity`` transitions whose observations live in a shared frame pool.

    Args:
        capacity: transitions kept; the oldest are overwritten.
        stack_axis: the axis of an observation (not of the batch) along which
            frames are stacked, oldest first, as ``FrameStackObservation``
            stacks them (axis 0). ``None``: observations are single frames
            (still stored once for ``obs`` and ``next_obs``).
        n_step: how many transitions ahead ``next_obs`` of a transition
            without an episode end is the ``obs`` (the ``n`` of the upstream
            :class:`~ptl_rl.nstep.NStepTransform`, 1 for 1-step data).
            ``None``: taken from the buffer's upstream (its ``n``, else 1).
        extra_frames: pool frames beyond ``capacity``, for final
            observations and for the frames of episode starts. Default
            ``max(capacity // 32, 64)``; raise it for short episodes (each
            episode adds about 1 to 2 frames beyond its steps).
        memmap_dir: keep the pool and the frame references in memory-mapped
            files in this directory (created; must not hold an earlier
            buffer's files), so a replay larger than RAM lives on disk.
        checkpoint_dir: when set, :meth:`state_dict` saves the storage to a
            fresh subdirectory of it (see :meth:`save`) and returns only a
            reference to it: a Lightning checkpoint then holds the path, not
            the data, and no copy of the replay is made in RAM.

    Observation leaves must be arrays (not ``Dict`` spaces). Rows of one env
    must arrive in time order (any interleaving across envs), every step of
    an env exactly once, as an ``ExperienceSource`` (optionally followed by an
    ``NStepTransform``) delivers them.
    """

    def __init__(
        self,
        capacity: int,
        *,
        stack_axis: int | None = None,
        n_step: int | None = None,
        extra_frames: int | None = None,
        memmap_dir: str | os.PathLike | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
    ) -> None:
        self._fields = ArrayStorage(capacity)  # every field but obs / next_obs
        self.capacity = self._fields.capacity
        if n_step is not None and (not isinstance(n_step, (int, np.integer)) or n_step < 1):
            raise ValueError(f"n_step must be an integer >= 1 (the upstream NStepTransform's n), got {n_step!r}")
        if extra_frames is None:
            extra_frames = max(self.capacity // 32, 64)
        if extra_frames < 0:
            raise ValueError(f"extra_frames must be >= 0, got {extra_frames}")
        self.stack_axis = stack_axis
        self.n_step = None if n_step is None else int(n_step)
        self.pool_size = self.capacity + int(extra_frames)
        self.memmap_dir = None if memmap_dir is None else os.fspath(memmap_dir)
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.pool: np.ndarray | None = None  # [pool_size, *frame]
        self.frames_written = 0  # absolute position of the next frame; frame p lives at p % pool_size
        self.obs_dtype: np.dtype | None = None
        self.obs_shape: tuple[int, ...] = ()
        self.stack = 1
        self._allocate_env_state(0)

    # ------------------------------------------------------------------ counters (the ArrayStorage API)
    def __len__(self) -> int:
        return len(self._fields)

    @property
    def size(self) -> int:
        return self._fields.size

    @property
    def cursor(self) -> int:
        return self._fields.cursor

    @property
    def total_added(self) -> int:
        return self._fields.total_added

    def bind_upstream(self, upstream: Any) -> None:
        """Take ``n_step`` from the upstream stage when it was not given (an ``NStepTransform``'s ``n``, else 1)."""
        if self.n_step is None:
            self.n_step = int(getattr(upstream, "n", 1) or 1)

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage's arrays (pool, references, other fields; memory-mapped ones included)."""
        total = sum(a.nbytes for a in (self.pool, self._obs_refs, self._next_refs) if a is not None)
        if self._fields.fields is not None:
            total += sum(a.nbytes for a in _leaves(self._fields.fields))
        return int(total)

    # ------------------------------------------------------------------ writing
    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` rows of ``batch``; returns the slots written (int64 [B])."""
        if len(batch) > self.capacity:  # only the newest `capacity` rows survive: add them chunk by chunk
            chunks = [batch.rows(slice(lo, lo + self.capacity)) for lo in range(0, len(batch), self.capacity)]
            return [self.add(chunk) for chunk in chunks][-1]
        obs, next_obs = self._checked_obs(batch)
        rest = TransitionBatch({k: v for k, v in batch.items() if k not in _OBS_FIELDS})
        slots = self._fields.add(rest)
        if len(slots) == 0:
            return slots
        if self.n_step is None:
            self.n_step = 1
        env = np.asarray(batch["env_id"], dtype=np.int64)
        done = np.asarray(batch["terminated"], dtype=bool) | np.asarray(batch["truncated"], dtype=bool)
        self._grow_envs(int(env.max()) + 1)
        self._gen[slots] = np.arange(self.total_added - len(slots), self.total_added)
        self._next_refs[slots] = -1  # pending until the next observation arrives
        obs_frames, next_frames = self._as_frames(obs), self._as_frames(next_obs)
        groups = _occurrence_groups(env)
        for rows in groups:  # obs first, in time order per env (a loop over rows of one env in a batch)
            self._add_obs(rows, env, slots, obs_frames, next_frames, done)
        ended = np.flatnonzero(done)
        if len(ended):
            for rows in _occurrence_groups(env[ended]):
                self._add_finals(ended[rows], env, slots, next_frames)
            # an env whose last row in this batch ended its episode: its newest observation is the final one
            last_row = np.zeros(len(self._last), dtype=np.int64) - 1
            last_row[env] = np.arange(len(env))  # later rows win
            envs = np.flatnonzero(last_row >= 0)
            finished = envs[done[last_row[envs]]]
            self._last[finished] = self._final[finished]
        return slots

    def _checked_obs(self, batch: TransitionBatch) -> tuple[np.ndarray, np.ndarray]:
        """``obs`` and ``next_obs`` of ``batch``, after checking they are arrays of the stored shape and dtype."""
        for name in (*_OBS_FIELDS, "env_id", "terminated", "truncated"):
            if name not in batch:
                raise ValueError(
                    f"FrameStorage needs the field {name!r} (it links observations per env and episode); add "
                    "transitions as an ExperienceSource / NStepTransform produces them"
                )
        obs, next_obs = batch["obs"], batch["next_obs"]
        if isinstance(obs, dict) or isinstance(next_obs, dict):
            raise ValueError(
                "FrameStorage stores array observations; for Dict observation spaces use the default ArrayStorage "
                "(drop storage=) or wrap the env so observations are one pixel array"
            )
        obs, next_obs = np.asarray(obs), np.asarray(next_obs)
        if self.pool is None:
            self._allocate(obs)
        for name, value in (("obs", obs), ("next_obs", next_obs)):
            if value.shape[1:] != self.obs_shape or value.dtype != self.obs_dtype or len(value) != len(batch):
                raise ValueError(
                    f"field {name!r} has shape {value.shape} and dtype {value.dtype}; the FrameStorage stores "
                    f"[{len(batch)}, *{self.obs_shape}] {self.obs_dtype} (allocated from the first batch). Every "
                    "batch added to one buffer must carry observations of one shape and dtype."
                )
        return obs, next_obs

    def _allocate(self, obs: np.ndarray) -> None:
        self.obs_dtype, self.obs_shape = obs.dtype, tuple(obs.shape[1:])
        if self.stack_axis is None:
            self._axis, self.stack, frame = None, 1, self.obs_shape
        else:
            ndim = len(self.obs_shape)
            if not -ndim <= self.stack_axis < ndim:
                raise ValueError(
                    f"stack_axis={self.stack_axis} is not an axis of observations of shape {self.obs_shape}; pass "
                    "the axis along which frames are stacked (0 for gymnasium's FrameStackObservation), or None"
                )
            self._axis = self.stack_axis % ndim
            self.stack = self.obs_shape[self._axis]
            frame = self.obs_shape[: self._axis] + self.obs_shape[self._axis + 1 :]
        self.frame_shape = tuple(frame)
        self.pool = self._array("pool", (self.pool_size, *frame), self.obs_dtype, 0)
        self._obs_refs = self._array("obs_refs", (self.capacity, self.stack), np.int64, -1)
        self._next_refs = self._array("next_refs", (self.capacity, self.stack), np.int64, -1)
        self._gen = np.full(self.capacity, -1, dtype=np.int64)
        self._allocate_env_state(0)  # shaped for this stack and frame now

    def _array(self, name: str, shape: tuple[int, ...], dtype: Any, fill: int) -> np.ndarray:
        """A zero/``fill`` array, in RAM or as a memory-mapped file ``memmap_dir/name.npy``."""
        if self.memmap_dir is None:
            return np.full(shape, fill, dtype=dtype) if fill else np.zeros(shape, dtype=dtype)
        os.makedirs(self.memmap_dir, exist_ok=True)
        path = os.path.join(self.memmap_dir, f"{name}.npy")
        if os.path.exists(path):
            raise FileExistsError(
                f"{path} exists: memmap_dir must be a fresh directory per buffer (it is scratch space, overwritten "
                "as the buffer runs); to keep a buffer use save(), to restore one use load()"
            )
        array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
        if fill:
            array[:] = fill
        return array

    def _as_frames(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` [B, *obs_shape] as ``[B, S, *frame]`` (a view)."""
        if self._axis is None:
            return obs[:, None]
        return np.moveaxis(obs, 1 + self._axis, 1) if self._axis else obs

    def _add_obs(
        self,
        rows: np.ndarray,
        env: np.ndarray,
        slots: np.ndarray,
        obs_frames: np.ndarray,
        next_frames: np.ndarray,
        done: np.ndarray,
    ) -> None:
        """Store the observations of ``rows`` (at most one per env) and resolve what they are ``next_obs`` of."""
        all_rows = len(rows) == len(env)
        e = env if all_rows else env[rows]
        s = slots if all_rows else slots[rows]
        frames = obs_frames if all_rows else obs_frames[rows]
        refs = self._insert_stacks(self._last[e], frames)
        self._obs_refs[s] = refs
        self._last[e] = refs
        # the transition n_step rows back of each env has this observation as next_obs (if it did not end)
        n = self.n_step
        pos = self._count[e] % n
        old_slot, old_gen = self._recent_slot[e, pos], self._recent_gen[e, pos]
        waiting = self._recent_pending[e, pos] & (self._gen[old_slot] == old_gen)
        if waiting.any():
            w = np.flatnonzero(waiting)
            expected = self._pending_frame[e[w], pos[w]]
            matches = _rows_equal(expected, frames[:, -1] if len(w) == len(e) else frames[w, -1])
            if not matches.all():
                raise ValueError(
                    f"next_obs of a stored transition of env {int(e[w][~matches][0])} is not the obs {n} transition(s) "
                    f"later: this FrameStorage has n_step={n}. Set n_step to the n of the NStepTransform that feeds "
                    "the buffer (1 for 1-step data), and add every step of each env once, in time order."
                )
            self._next_refs[old_slot[w]] = refs[w]
        ended = done if all_rows else done[rows]
        self._recent_slot[e, pos] = s
        self._recent_gen[e, pos] = self._gen[s]
        self._recent_pending[e, pos] = ~ended
        self._pending_frame[e, pos] = next_frames[:, -1] if all_rows else next_frames[rows, -1]
        self._count[e] += 1

    def _add_finals(self, rows: np.ndarray, env: np.ndarray, slots: np.ndarray, next_frames: np.ndarray) -> None:
        """Store the final observations of the ended ``rows`` (at most one per env): shared by one episode's tails."""
        e, finals = env[rows], next_frames[rows]
        cached = self._final[e]
        same = np.zeros(len(rows), dtype=bool)
        alive = self._alive(cached, len(rows) * self.stack)
        if alive.any():
            a = np.flatnonzero(alive)
            same[a] = _rows_equal(self.pool.take(cached[a] % self.pool_size, axis=0), finals[a])
        refs = cached
        if not same.all():
            new = np.flatnonzero(~same)
            refs = cached.copy()
            refs[new] = self._insert_stacks(self._last[e[new]], finals[new])
        self._next_refs[slots[rows]] = refs
        self._final[e] = refs

    def _insert_stacks(self, prev: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Write the frames of stacks ``frames`` [R, S, *frame] not already pooled; their references int64 [R, S].

        A stack whose ``S - 1`` oldest frames equal the newest ones of ``prev``
        (the env's previous stack, int64 [R, S], -1 for none) continues it and
        writes one frame; any other stack writes each frame that differs from
        the next one in the stack.
        """
        count, stack = frames.shape[0], self.stack
        if stack == 1:  # nothing to share between consecutive observations
            return self._write_frames(frames[:, 0])[:, None]
        cont = np.zeros(count, dtype=bool)
        alive = self._alive(prev, count * stack)
        if alive.all():  # the common step: no row selection (each would copy the stacks)
            cont = _rows_equal(self.pool.take(prev[:, 1:] % self.pool_size, axis=0), frames[:, :-1])
        elif alive.any():
            a = np.flatnonzero(alive)
            old = self.pool.take(prev[a, 1:] % self.pool_size, axis=0)
            cont[a] = _rows_equal(old, frames[a, :-1])
        if cont.all():  # the common step: one new frame per stack
            newest = self._write_frames(frames[:, -1])
            return np.concatenate([prev[:, 1:], newest[:, None]], axis=1)
        written = np.ones((count, stack), dtype=bool)
        frame = self.frame_shape
        repeats = _rows_equal(frames[:, :-1].reshape(-1, *frame), frames[:, 1:].reshape(-1, *frame))
        written[:, :-1] = ~repeats.reshape(count, stack - 1)
        written[cont, :-1] = False
        positions = np.full((count, stack), np.iinfo(np.int64).max, dtype=np.int64)
        positions[written] = self._write_frames(frames[written])
        # each frame refers to the nearest written frame at or after it in its stack (an equal one)
        refs = np.minimum.accumulate(positions[:, ::-1], axis=1)[:, ::-1].copy()
        refs[cont, :-1] = prev[cont, 1:]
        return refs

    def _alive(self, refs: np.ndarray, writes_ahead: int) -> np.ndarray:
        """Rows of ``refs`` [R, S] whose frames survive ``writes_ahead`` more frame writes (bool [R])."""
        floor = max(self.frames_written + writes_ahead - self.pool_size, 0)
        return refs.min(axis=1) >= floor

    def _write_frames(self, frames: np.ndarray) -> np.ndarray:
        """Append ``frames`` [m, *frame] to the pool ring; returns their absolute positions (int64 [m])."""
        count = len(frames)
        if count > self.pool_size:
            raise ValueError(
                f"a batch needs {count} new frames but the pool holds {self.pool_size}; raise capacity or extra_frames"
            )
        start = self.frames_written % self.pool_size
        first = min(count, self.pool_size - start)
        self.pool[start : start + first] = frames[:first]
        if first < count:
            self.pool[: count - first] = frames[first:]
        positions = np.arange(self.frames_written, self.frames_written + count)
        self.frames_written += count
        return positions

    def _allocate_env_state(self, num_envs: int) -> None:
        self._last = np.full((num_envs, self.stack), -1, dtype=np.int64)  # newest stack per env
        self._final = np.full((num_envs, self.stack), -1, dtype=np.int64)  # newest final stack per env
        self._count = np.zeros(num_envs, dtype=np.int64)  # observations stored per env
        n = self.n_step or 1
        self._recent_slot = np.zeros((num_envs, n), dtype=np.int64)  # slot of the env's observation k at k % n
        self._recent_gen = np.full((num_envs, n), -1, dtype=np.int64)
        self._recent_pending = np.zeros((num_envs, n), dtype=bool)  # that transition waits for its next_obs
        frame = getattr(self, "frame_shape", ())
        self._pending_frame = np.zeros((num_envs, n, *frame), dtype=self.obs_dtype or np.uint8)

    def _grow_envs(self, num_envs: int) -> None:
        have = len(self._count)
        if num_envs <= have:
            return
        old = {k: getattr(self, k) for k in _ENV_STATE}
        self._allocate_env_state(max(num_envs, 2 * have))
        for k, value in old.items():
            getattr(self, k)[:have] = value

    # ------------------------------------------------------------------ reading
    def sampleable(self, indices: np.ndarray) -> np.ndarray:
        """Whether each slot in ``indices`` (int, any shape) may be sampled: ``next_obs`` arrived, frames kept."""
        if self.pool is None:
            return np.zeros(np.shape(indices), dtype=bool)
        floor = max(self.frames_written - self.pool_size, 0)
        obs_ok = self._obs_refs[indices].min(axis=-1) >= floor
        return obs_ok & (self._next_refs[indices].min(axis=-1) >= floor)

    @property
    def num_sampleable(self) -> int:
        """Stored transitions that can be sampled now."""
        return int(np.count_nonzero(self.sampleable(np.arange(len(self))))) if len(self) else 0

    def gather(self, indices: np.ndarray) -> TransitionBatch:
        """The transitions at ``indices`` (int, shape ``I``) as a batch ``[*I, ...]``; ``obs``/``next_obs`` rebuilt.

        Only meaningful for sampleable slots (see :meth:`sampleable`); buffers draw only those.
        """
        indices = np.asarray(indices)
        batch = self._fields.gather(indices)
        batch["obs"] = self._stacks(self._obs_refs.take(indices, axis=0))
        batch["next_obs"] = self._stacks(self._next_refs.take(indices, axis=0))
        return batch

    def _stacks(self, refs: np.ndarray) -> np.ndarray:
        """Observations ``[*I, *obs_shape]`` from frame references ``[*I, S]``."""
        frames = self.pool.take(refs % self.pool_size, axis=0)  # [*I, S, *frame]
        lead = refs.ndim - 1
        if self._axis is None:
            return frames.reshape(*refs.shape[:-1], *self.frame_shape)
        return np.moveaxis(frames, lead, lead + self._axis) if self._axis else frames

    # ------------------------------------------------------------------ state
    def _arrays(self) -> dict[str, np.ndarray]:
        """Every array of the storage's state, by name (views, no copies)."""
        size = len(self)
        kept = min(self.frames_written, self.pool_size)
        arrays = {
            "pool": self.pool[:kept],
            "obs_refs": self._obs_refs[:size],
            "next_refs": self._next_refs[:size],
            "gen": self._gen[:size],
        }
        arrays.update({k.lstrip("_"): getattr(self, k) for k in _ENV_STATE})
        for path, leaf in _named_leaves(self._fields.fields):
            arrays[f"field.{path}"] = leaf[:size]
        return arrays

    def _meta(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "pool_size": self.pool_size,
            "stack_axis": self.stack_axis,
            "n_step": self.n_step,
            "frames_written": self.frames_written,
            "cursor": self.cursor,
            "size": self.size,
            "total_added": self.total_added,
        }

    def state_dict(self) -> dict[str, Any]:
        """The storage as tensors (views of its arrays, ``weights_only``-safe), or a reference to a saved directory.

        With ``checkpoint_dir`` set the storage is saved there (see :meth:`save`)
        and the state is ``{"directory": path, "save_id": ...}``.
        """
        if self.pool is None:
            return {"capacity": self.capacity, "fields": None}
        if self.checkpoint_dir is not None:
            from ptl_rl.buffers.persist import save_to_checkpoint_dir

            return save_to_checkpoint_dir(self, self.checkpoint_dir)
        state = self._meta()
        state["arrays"] = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self._arrays().items()}
        state["fields"] = list(self._fields.fields)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state (or the directory it refers to); transitions waiting for ``next_obs`` stay unsampleable."""
        if "directory" in state:
            from ptl_rl.buffers.persist import load_directory

            load_directory(self, state["directory"], expected_save_id=state.get("save_id"))
            return
        if state.get("fields") is None:
            if self.pool is not None:
                raise ValueError("the state holds an empty storage; load it into a fresh FrameStorage")
            return
        self._restore(state, {k: v.numpy() for k, v in state["arrays"].items()})

    def _restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Fill this storage from ``meta`` and ``arrays`` (as :meth:`_meta` and :meth:`_arrays` give them)."""
        if int(meta["capacity"]) != self.capacity or int(meta["pool_size"]) != self.pool_size:
            raise ValueError(
                f"the saved storage has capacity {meta['capacity']} and a pool of {meta['pool_size']} frames; this "
                f"one has {self.capacity} and {self.pool_size}. Create it with the same capacity and extra_frames."
            )
        if meta["stack_axis"] != self.stack_axis:
            raise ValueError(
                f"the saved storage has stack_axis={meta['stack_axis']}, this one {self.stack_axis}; use the same"
            )
        size = int(meta["size"])
        self.n_step = meta["n_step"]
        fields = {}
        for name, value in arrays.items():
            if name.startswith("field."):
                _set_path(fields, name[len("field.") :].split("."), value)
        self._fields.load_state_dict(
            {
                "capacity": self.capacity,
                "fields": {k: _tree_to_torch(v) for k, v in fields.items()},
                "cursor": int(meta["cursor"]),
                "size": size,
                "total_added": int(meta["total_added"]),
            }
        )
        pool = arrays["pool"]
        sample_obs = np.zeros((1, *self._obs_shape_from(pool.shape[1:], arrays["obs_refs"].shape[1])), pool.dtype)
        if self.pool is None:
            self._allocate(sample_obs)
        self.pool[: len(pool)] = pool
        self.frames_written = int(meta["frames_written"])
        self._obs_refs[:size] = arrays["obs_refs"]
        self._next_refs[:size] = arrays["next_refs"]
        self._gen[:size] = arrays["gen"]
        num_envs = len(arrays["count"])
        self._allocate_env_state(num_envs)
        for k in _ENV_STATE:
            getattr(self, k)[:] = arrays[k.lstrip("_")]
        # the envs start new episodes after a restore: no stored transition may take a later observation as next_obs
        self._recent_pending[:] = False

    def _obs_shape_from(self, frame: tuple[int, ...], stack: int) -> tuple[int, ...]:
        if self.stack_axis is None:
            return tuple(frame)
        axis = self.stack_axis % (len(frame) + 1)
        return (*frame[:axis], stack, *frame[axis:])

    def save(self, directory: str | os.PathLike) -> str:
        """Write the storage to ``directory`` atomically (see :func:`ptl_rl.buffers.persist.save_directory`)."""
        from ptl_rl.buffers.persist import save_directory

        return save_directory(self, directory)

    def load(self, directory: str | os.PathLike) -> None:
        """Fill this storage from a directory written by :meth:`save`; a half-written one is refused."""
        from ptl_rl.buffers.persist import load_directory

        load_directory(self, directory)

    def __repr__(self) -> str:
        return (
            f"FrameStorage(size={len(self)}/{self.capacity}, stack={self.stack}, n_step={self.n_step}, "
            f"pool={self.pool_size}, frames_written={self.frames_written})"
        )


_ENV_STATE = ("_last", "_final", "_count", "_recent_slot", "_recent_gen", "_recent_pending", "_pending_frame")


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise equality of each row of ``a`` and ``b`` (same shape and dtype, [R, ...]) as bool [R]."""
    rows = a.shape[0]
    # (copying strided inputs to contiguous ones first is faster than comparing strided word views)
    a = np.ascontiguousarray(a).reshape(rows, -1).view(np.uint8)
    b = np.ascontiguousarray(b).reshape(rows, -1).view(np.uint8)
    width = a.shape[1]
    for word in (np.uint64, np.uint32, np.uint16):  # compare wide words: 8x fewer elements for uint8 frames
        if width % np.dtype(word).itemsize == 0:
            a, b = a.view(word), b.view(word)
            break
    return (a == b).all(axis=1)


def _occurrence_groups(env: np.ndarray) -> list[np.ndarray]:
    """Row sets in which each env occurs at most once, in time order (row ``k`` of an env is in group ``k``)."""
    if len(env) <= 1 or len(np.unique(env)) == len(env):
        return [np.arange(len(env))]
    order = np.argsort(env, kind="stable")
    sorted_env = env[order]
    group_start = np.searchsorted(sorted_env, sorted_env, side="left")
    occurrence = np.empty(len(env), dtype=np.int64)
    occurrence[order] = np.arange(len(env)) - group_start
    return [np.flatnonzero(occurrence == k) for k in range(int(occurrence.max()) + 1)]


def _leaves(tree: Any) -> Iterator[np.ndarray]:
    for _, leaf in _named_leaves(tree):
        yield leaf


def _named_leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _named_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif tree is not None:
        yield prefix, tree


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _tree_to_torch(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _tree_to_torch(v) for k, v in tree.items()}
    return torch.from_numpy(np.array(tree))  # a copy: saved arrays are read-only memory maps (small fields only)


def redraw_unsampleable(
    sampleable: Any, drawn: tuple[np.ndarray, ...], draw: Any, max_rounds: int = 100
) -> tuple[np.ndarray, ...]:
    """Replace the rows of ``drawn`` (arrays [B], the first the slots) that ``sampleable`` rejects by fresh draws.

    ``draw(count)`` returns ``count`` new rows as a tuple like ``drawn``. Rejection
    keeps each buffer's sampling distribution, restricted to sampleable slots.
    """
    drawn = tuple(np.array(a, copy=True) for a in drawn)
    for _ in range(max_rounds):
        bad = np.flatnonzero(~sampleable(drawn[0]))
        if len(bad) == 0:
            return drawn
        fresh = draw(len(bad))
        for array, new in zip(drawn, fresh, strict=True):
            array[bad] = new
    raise ValueError(
        f"after {max_rounds} redraws some sampled transitions still wait for their next_obs or lost their frames: "
        "the buffer holds too few sampleable transitions. Raise warmup (so sampling starts once more than "
        "num_envs * n_step transitions are stored) or FrameStorage's extra_frames"
    )

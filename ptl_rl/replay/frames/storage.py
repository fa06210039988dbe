"""FrameStorage: replay storage for pixel observations, with every frame stored once.

A drop-in for :class:`~ptl_rl.replay.ArrayStorage` (same ``add`` / ``gather`` /
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
  data contract of :class:`~ptl_rl.stages.nstep.NStepTransform` and of 1-step
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
from typing import Any

import numpy as np

from ptl_rl.core._trees import tree_leaves
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.frames.checkpoint import FrameCheckpoint
from ptl_rl.replay.frames.compiled import COMPILED_INSERT
from ptl_rl.replay.memmap import MemmapStorage
from ptl_rl.replay.storage import ArrayStorage
from ptl_rl.replay.unfinished import UnfinishedAdd


class FrameStorage(FrameCheckpoint):
    """A ring of ``capacity`` transitions whose observations live in a shared frame pool.

    Args:
        capacity: transitions kept; the oldest are overwritten.
        stack_axis: the axis of an observation (not of the batch) along which
            frames are stacked, oldest first, as ``FrameStackObservation``
            stacks them (axis 0). ``None``: observations are single frames
            (still stored once for ``obs`` and ``next_obs``).
        n_step: how many transitions ahead ``next_obs`` of a transition
            without an episode end is the ``obs`` (the ``n`` of the upstream
            :class:`~ptl_rl.stages.nstep.NStepTransform`, 1 for 1-step data).
            ``None``: taken from the buffer's upstream (its ``n``, else 1).
        extra_frames: pool frames beyond ``capacity``, for final
            observations and for the frames of episode starts. Default
            ``max(capacity // 32, 64)``; raise it for short episodes (each
            episode adds about 1 to 2 frames beyond its steps).
        memmap_dir: keep the pool, the frame references and the other fields
            (in ``memmap_dir/fields``, a :class:`~ptl_rl.replay.MemmapStorage`)
            in memory-mapped files in this directory (created; must not hold
            an earlier buffer's files), so a replay larger than RAM lives on disk.
        checkpoint_dir: when set, :meth:`state_dict` saves the storage to a
            fresh subdirectory of it (see :meth:`save`) and returns only a
            reference to it: a Lightning checkpoint then holds the path, not
            the data, and no copy of the replay is made in RAM.
        check: whether a new observation's ``S - 1`` oldest frames are
            compared with the env's previous stack before only its newest
            frame is stored. ``None`` (default): compare unless the storage is
            fed by a numbered upstream (a buffer whose ``upstream`` is an
            ``ExperienceSource`` or ``NStepTransform``): there a stack inside an
            episode is trusted to shift by one frame once the episode's first
            shift was seen (every episode start, episode end and cut in the
            stream is still compared). ``True``: always compare (foreign
            data); ``False``: trust also without such an upstream. Whenever
            it compares, it also refuses (``ValueError``, nothing stored) a
            batch in which an ``obs`` is not, whole stack, the ``next_obs`` of
            its env's transition ``n_step`` rows earlier, which it is stored as.
        frame_key: for ``Dict`` observations, the key whose observations are
            (stacks of) frames, stored once as above; the other keys are
            stored per transition like any other field. Default: the only key
            with two or more dims per observation.

    Rows of one env must arrive in time order (any interleaving across envs),
    every step of an env exactly once, as an ``ExperienceSource`` (optionally
    followed by an ``NStepTransform``) delivers them.
    """

    def __init__(
        self,
        capacity: int,
        *,
        stack_axis: int | None = None,
        n_step: int | None = None,
        extra_frames: int | None = None,
        memmap_dir: str | os.PathLike[str] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        check: bool | None = None,
        frame_key: str | None = None,
    ) -> None:
        # every field but obs / next_obs (and the non-frame keys of Dict ones), on disk too with memmap_dir
        self._fields = (
            ArrayStorage(capacity)
            if memmap_dir is None
            else MemmapStorage(capacity, memmap_dir=os.path.join(os.fspath(memmap_dir), "fields"))
        )
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
        self.pool = None  # [pool_size, *frame], allocated by the first batch
        self._written = np.zeros(1, dtype=np.int64)  # frames_written: frame p lives at p % pool_size
        self.obs_dtype = None
        self.obs_shape = ()
        self.stack = 1
        self.check = check
        self.frame_key = frame_key
        self._obs_keys = None
        self._upstream = None
        self._seen_seq = None
        self._journal = UnfinishedAdd()  # the storage's own record of an add under way (see add): none yet
        self._numbered = ()
        self._retained = ()
        self._kernel = None
        self._compiled = COMPILED_INSERT
        self._allocate_env_state(0)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / deepcopy without the compiled insert's hold on the arrays (rebound by the next add)."""
        state = self.__dict__.copy()
        state["_kernel"] = None
        return state

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage's arrays (pool, references, other fields; memory-mapped ones included)."""
        total = sum(a.nbytes for a in (self.pool, self._obs_refs, self._next_refs) if a is not None)
        if self._fields.fields is not None:
            total += sum(leaf.nbytes for _, leaf in tree_leaves(self._fields.fields))
        return int(total)

    # ------------------------------------------------------------------ reading
    def sampleable(self, indices: np.ndarray) -> np.ndarray:
        """Whether each slot in ``indices`` (int, any shape) may be sampled: ``next_obs`` arrived, frames kept."""
        if self.pool is None:
            return np.zeros(np.shape(indices), dtype=bool)
        floor = max(self.frames_written - self.pool_size, 0)
        obs_ok = self._obs_refs[indices].min(axis=-1) >= floor
        sampleable: np.ndarray = obs_ok & (self._next_refs[indices].min(axis=-1) >= floor)
        return sampleable

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
        obs: Any = self._stacks(self._obs_refs.take(indices, axis=0))
        next_obs: Any = self._stacks(self._next_refs.take(indices, axis=0))
        if self._obs_keys is not None:  # Dict observations: the frames beside the per-transition keys
            obs = {**batch["obs"], self.frame_key: obs}
            next_obs = {**batch["next_obs"], self.frame_key: next_obs}
            obs, next_obs = ({k: d[k] for k in self._obs_keys} for d in (obs, next_obs))
        batch["obs"], batch["next_obs"] = obs, next_obs
        return batch

    def __repr__(self) -> str:
        return (
            f"FrameStorage(size={len(self)}/{self.capacity}, stack={self.stack}, n_step={self.n_step}, "
            f"pool={self.pool_size}, frames_written={self.frames_written})"
        )

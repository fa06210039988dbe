"""FrameStorage, the facade: it owns its parts (frame pool, links, per-env table, stream numbers, the inserts)
and its journal, and is the storage API (``add``, ``gather``, counters, state).
How the frames are stored is the package's docstring (:mod:`ptl_rl.replay.frames`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ptl_rl.core._trees import tree_leaves
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.guard import WriteJournal
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.replay.frames.checkpoint import load_parts, saved_arrays, saved_meta, tensor_state
from ptl_rl.replay.frames.checks import ObsLayout
from ptl_rl.replay.frames.compiled import COMPILED_INSERT, CompiledInsert, _frame_insert
from ptl_rl.replay.frames.env_state import EnvState, EnvTable
from ptl_rl.replay.frames.insert import PythonInsert
from ptl_rl.replay.frames.links import FrameLinks
from ptl_rl.replay.frames.pool import FramePool
from ptl_rl.replay.frames.stream import StreamNumbers
from ptl_rl.replay.memmap import MemmapStorage
from ptl_rl.replay.storage import ArrayStorage

#: what :meth:`FrameStorage.snapshot` returns: cursor, size, total_added, the per-env state (held by
#: reference: an add never changes it in place), the last stream number seen, the retained batches
Bookkeeping = tuple[int, int, int, EnvState, int | None, tuple[Any, ...]]


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
        fields = (
            ArrayStorage(capacity)
            if memmap_dir is None
            else MemmapStorage(capacity, memmap_dir=os.path.join(os.fspath(memmap_dir), "fields"))
        )
        self.capacity = fields.capacity
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
        self.check = check
        # the parts, each with its own arrays; the inserts are handed the parts they write
        self._fields = fields
        self._layout = layout = ObsLayout(stack_axis, frame_key)
        self._pool = pool = FramePool(self.pool_size, self.memmap_dir)
        self._links = links = FrameLinks(self.capacity)
        self._envs = envs = EnvTable()
        self._stream = stream = StreamNumbers()
        self._python = PythonInsert(layout, fields, pool, links, envs, stream, self.memmap_dir)
        self._kernel: CompiledInsert | None = None
        self.compiled = COMPILED_INSERT  # (sets the kernel and the writer an add calls: the kernel's, or Python's)
        # every add is a write of the guard: one cut short is done again, in full, before the storage is used
        self._journal = WriteJournal(self._bookkeeping, self._put_back)

    # ------------------------------------------------------------------ counters and layout
    def __len__(self) -> int:
        return self._fields.size

    @property
    def size(self) -> int:
        return self._fields.size

    @property
    def cursor(self) -> int:
        return self._fields.cursor

    @property
    def total_added(self) -> int:
        return self._fields.total_added

    @property
    def pool(self) -> np.ndarray | None:
        """The frame pool ``[pool_size, *frame_shape]`` (``None`` until the first batch allocates it)."""
        return self._pool.frames

    @property
    def frames_written(self) -> int:
        """Frames written to the pool since it was allocated: frame ``p`` is pooled iff ``p >= this - pool_size``."""
        return self._pool.written

    @property
    def stack(self) -> int:
        """Frames per observation (S; 1 before the first batch and for ``stack_axis=None``)."""
        return self._pool.stack

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return self._pool.frame_shape

    @property
    def obs_shape(self) -> tuple[int, ...]:  # (of the frame key's for Dict observations; () before the first batch)
        return self._layout.shape

    @property
    def obs_dtype(self) -> np.dtype | None:
        return self._layout.dtype

    @property
    def frame_key(self) -> str | None:
        """For Dict observations, the key stored as frames (given, or chosen by the first batch)."""
        return self._layout.frame_key

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage's arrays (pool, references, other fields; memory-mapped ones included)."""
        links = self._links
        total = self._pool.nbytes() + links.obs_refs.nbytes + links.next_refs.nbytes
        if self._fields.fields is not None:
            total += sum(leaf.nbytes for _, leaf in tree_leaves(self._fields.fields))
        return int(total)

    # ------------------------------------------------------------------ the stream
    def bind_upstream(self, upstream: Iterator[TransitionBatch] | None) -> None:
        """Take ``n_step`` from the upstream stage when it was not given (an ``NStepTransform``'s ``n``, else 1).

        A numbered upstream (:class:`~ptl_rl.core.protocols.NumberedStream`) also lets ``check=None`` trust
        the stacks' structure. Raises ``ValueError`` for an ``n_step`` the numbered upstream contradicts.
        """
        self.n_step = self._stream.bind(upstream, self.n_step)

    def note_stream_seq(self, batch: TransitionBatch, seq: int | None) -> None:
        """Record the upstream's number of ``batch``, read when it was pulled (a buffer calls it from its pull).

        An add cut short is done again when the *next* batch is added, after the
        upstream numbered that one: the number must come from the pull, or a
        batch lost to a second cut during the redo would leave no gap.
        """
        self._stream.note(batch, seq)

    @property
    def trusted(self) -> bool:
        """Whether stacks of an env inside an episode are taken to shift by one frame without comparing them.

        ``check=None`` trusts the structure when the storage is fed by an
        upstream that numbers its batches (an ``ExperienceSource`` or
        ``NStepTransform``, through a buffer's ``upstream``); ``check=True``
        always compares, ``check=False`` always trusts.
        """
        if self.check is None:
            return self._stream.numbered
        return not self.check

    @property
    def compiled(self) -> bool:
        """Whether adds may take the compiled insert; ``False`` forces the Python path.

        ``True`` by default when the extension ``ptl_rl.replay._frame_insert`` is built and
        ``PTL_RL_PURE_PYTHON`` is not set. Both paths leave the storage bit-identical.
        """
        return self._kernel is not None

    @compiled.setter
    def compiled(self, value: bool) -> None:
        if value and _frame_insert is None:
            raise ValueError("the compiled insert ptl_rl.replay._frame_insert is not built (see docs/pixels.rst)")
        if not value:
            self._kernel, self._writer = None, self._python_write
        elif self._kernel is None:
            parts = self._layout, self._fields, self._pool, self._links, self._envs, self._stream
            self._kernel = CompiledInsert(*parts, self.check, self._python_write)
            self._writer = self._kernel.add

    # ------------------------------------------------------------------ writing
    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` rows of ``batch``; returns the slots written (int64 [B]).

        A write of the guard (:class:`~ptl_rl.core.guard.WriteJournal`): an add
        cut short anywhere is restored to :meth:`snapshot` and done again, in
        full, by the next :meth:`add` or :meth:`settle` (a buffer settles before
        every read). Frames go only to pool positions already counted as
        written and a slot is unsampleable until complete, so nothing half
        written is ever sampled, and the add done again equals one that was not
        cut.

        A refused batch (``ValueError``/``TypeError``: a wrong shape, dtype or
        field, a stack that does not match what the storage holds, see
        :mod:`~ptl_rl.replay.frames.checks`) leaves the storage as it was: every
        check runs before the first write, and the batch is not done again.
        """
        return self._journal.write(self._writer, batch)  # (the compiled insert, or the Python path)

    def write(self, batch: TransitionBatch) -> np.ndarray:
        """:meth:`add` without its own journal, for a caller whose journal holds the add (slots int64 [B])."""
        return self._writer(batch)

    def _python_write(self, batch: TransitionBatch) -> np.ndarray:
        slots = self._python.add(batch, self.n_step or 1, self.trusted)
        if self.n_step is None and len(batch):
            self.n_step = 1
        return slots

    def settle(self) -> None:
        """Finish an add a cut left (done again from the snapshot before it; a no-op when none is): a buffer
        calls it before every read (:class:`~ptl_rl.core.protocols.JournaledStorage`), the next add does too."""
        self._journal.settle()

    def snapshot(self) -> Bookkeeping:
        """What an add changes besides whole rows, for :meth:`restore` to roll it back (an add a cut left is
        finished first).

        The counters, the stream number seen last, the retained batches and the
        per-env state, by reference: an add writes the next state into a spare
        array and swaps it in, so the state held stays as it was through the add
        that follows (the one a journal's write rolls back), and :meth:`restore`
        installs a copy of it (a snapshot may be restored twice). No frame array
        is copied: the slots and pool frames a cut add wrote were unsampleable
        while written, and the add done again rewrites them.
        """
        self._journal.settle()
        return self._bookkeeping()

    def restore(self, snapshot: Bookkeeping) -> None:
        """Roll the bookkeeping back to ``snapshot`` (taken before an add that was cut short); drops the add.

        ``frames_written`` is not rolled back: pool positions a cut add may have
        overwritten stay counted as written, so no stored stack can refer to a
        frame that changed.
        """
        self._put_back(snapshot)
        self._journal.forget()

    def _bookkeeping(self) -> Bookkeeping:
        f = self._fields
        return f.cursor, f.size, f.total_added, self._envs.state, self._stream.seen, self._links.retained

    def _put_back(self, snapshot: Bookkeeping) -> None:
        cursor, size, total_added, state, seen, retained = snapshot
        self._envs.restore(state, total_added)
        self._stream.seen, self._links.retained = seen, retained
        fields = self._fields
        fields.cursor, fields.size, fields.total_added = cursor, size, total_added

    # ------------------------------------------------------------------ reading
    def sampleable(self, indices: np.ndarray) -> np.ndarray:
        """Whether each slot in ``indices`` (int, any shape) may be sampled: ``next_obs`` arrived, frames kept."""
        if self._pool.frames is None:
            return np.zeros(np.shape(indices), dtype=bool)
        return self._links.sampleable(indices, self._pool.floor())

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
        pool, links, layout = self._pool, self._links, self._layout
        obs: Any = pool.stacks(links.obs_refs.take(indices, axis=0))
        next_obs: Any = pool.stacks(links.next_refs.take(indices, axis=0))
        if layout.keys is not None:  # Dict observations: the frames beside the per-transition keys
            obs = {**batch["obs"], layout.frame_key: obs}
            next_obs = {**batch["next_obs"], layout.frame_key: next_obs}
            obs, next_obs = ({k: d[k] for k in layout.keys} for d in (obs, next_obs))
        batch["obs"], batch["next_obs"] = obs, next_obs
        return batch

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """The storage as tensors (views of its arrays, ``weights_only``-safe), or a reference to a saved directory.

        With ``checkpoint_dir`` set the storage is saved there (see :meth:`save`)
        and the state is ``{"directory": path, "save_id": ...}``.
        """
        self._journal.settle()
        if self._pool.frames is None:
            return versioned({"capacity": self.capacity, "fields": None}, self.STATE_VERSION)
        if self.checkpoint_dir is not None:
            from ptl_rl.replay.persist import save_to_checkpoint_dir

            return versioned(save_to_checkpoint_dir(self, self.checkpoint_dir), self.STATE_VERSION)
        return versioned(tensor_state(*self.saved_parts(), list(self._fields.fields or ())), self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state (or the directory it refers to); transitions waiting for ``next_obs`` stay unsampleable."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        if "directory" in state:
            from ptl_rl.replay.persist import load_directory

            load_directory(self, state["directory"], expected_save_id=state.get("save_id"))
            return
        if state.get("fields") is None:
            if self._pool.frames is not None:
                raise ValueError("the state holds an empty storage; load it into a fresh FrameStorage")
            return
        self.load_parts(state, {k: v.numpy() for k, v in state["arrays"].items()})

    def saved_parts(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The storage as metadata (counters, layout) and named arrays (views): what a save holds.

        A :class:`~ptl_rl.core.protocols.PartsStorage`; only for an allocated storage.
        """
        self._journal.settle()
        meta = saved_meta(self._fields, self._pool, self._layout, self.stack_axis, self.n_step)
        return meta, saved_arrays(self._fields, self._pool, self._links, self._envs)

    def load_parts(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Fill this storage from ``meta`` and ``arrays`` (as :meth:`saved_parts` gives them)."""
        self._journal.forget()  # (the loaded state replaces whatever an add cut short was writing)
        self.n_step = load_parts(
            meta, arrays, fields=self._fields, pool=self._pool, links=self._links, envs=self._envs,
            layout=self._layout, stack_axis=self.stack_axis, memmap_dir=self.memmap_dir,
        )  # fmt: skip
        self._stream.seen = None
        if self._kernel is not None:
            self._kernel.drop()  # (it holds the arrays replaced here)

    def save(self, directory: str | os.PathLike[str]) -> str:
        """Write the storage to ``directory`` atomically (see :func:`ptl_rl.replay.persist.save_directory`)."""
        from ptl_rl.replay.persist import save_directory

        return save_directory(self, directory)

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Fill this storage from a directory written by :meth:`save`; a half-written one is refused."""
        from ptl_rl.replay.persist import load_directory

        load_directory(self, directory)

    def __repr__(self) -> str:
        return (
            f"FrameStorage(size={len(self)}/{self.capacity}, stack={self.stack}, n_step={self.n_step}, "
            f"pool={self.pool_size}, frames_written={self.frames_written})"
        )

"""FrameStorage: replay storage for pixel observations, every frame stored once.

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
  :meth:`FrameStorage.sampleable`).

Memory per transition: one frame, ``2 * S`` int64 frame references, and the
other fields; with 84x84x4 uint8 Atari stacks about 0.13x of storing ``obs``
and ``next_obs`` in full.

The storage is composed of parts, one concern a module, each an object with its own arrays that is handed
the others it needs (see ``docs/design/pixel-replay.md``):

* ``storage.py``: :class:`FrameStorage`, the facade: it owns the parts and its journal (a
  :class:`~ptl_rl.core.guard.WriteJournal`: every add is a write that a cut leaves to be done again);
* ``pool.py``: :class:`~ptl_rl.replay.frames.pool.FramePool`, the frame ring, frame writes and stack
  deduplication, stacks rebuilt from references;
* ``links.py``: :class:`~ptl_rl.replay.frames.links.FrameLinks`, the obs/next_obs references, final
  observations, resolving what waits at a cut;
* ``env_state.py``: :class:`~ptl_rl.replay.frames.env_state.EnvTable`, the per-env state, its spare and the
  pending stacks;
* ``stream.py``: :class:`~ptl_rl.replay.frames.stream.StreamNumbers`, the upstream's ``n`` and batch numbers;
* ``checks.py``: every check of an add, before its first write, and the observations' layout;
* ``insert.py``: :class:`~ptl_rl.replay.frames.insert.PythonInsert`, the Python insert (the reference);
* ``compiled.py``: the C kernel's loader (``ptl_rl.replay._frame_insert``, optional) and
  :class:`~ptl_rl.replay.frames.compiled.CompiledInsert`;
* ``checkpoint.py``: the storage's parts as metadata and arrays (``state_dict``, directories), and back.
"""

from ptl_rl.replay.draws import redraw_unsampleable
from ptl_rl.replay.frames.compiled import COMPILED_INSERT, PURE_PYTHON, _frame_insert
from ptl_rl.replay.frames.storage import FrameStorage

__all__ = ["COMPILED_INSERT", "PURE_PYTHON", "FrameStorage", "_frame_insert", "redraw_unsampleable"]

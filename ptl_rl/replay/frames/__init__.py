"""FrameStorage: replay storage for pixel observations, every frame stored once (a package, one concern a module).

* ``storage.py``: :class:`FrameStorage`, the facade (construction, counters, ``gather``, ``sampleable``);
* ``pool.py``: the frame ring, frame writes and stack deduplication, stacks rebuilt from references;
* ``links.py``: obs/next_obs references, the per-env state, stream numbers, final observations;
* ``env_state.py``: the per-env state array and the row grouping helpers;
* ``checks.py``: every check of an add, before its first write;
* ``insert.py``: the Python insert (the reference);
* ``compiled.py``: the C kernel's loader (``ptl_rl.replay._frame_insert``, optional) and its commit;
* ``journal.py``: snapshot / restore, and adds that redo one cut short;
* ``checkpoint.py``: ``state_dict`` / ``load_state_dict`` / ``save`` / ``load``.

The class is one object built in layers (``FramePool`` <- ``FrameLinks`` <- ``FrameChecks`` <-
``FrameInsert`` <- ``CompiledInsert`` <- ``FrameJournal`` <- ``FrameCheckpoint`` <- ``FrameStorage``),
each layer a module that calls only the layers below it; see ``docs/design/pixel-replay.md``.
"""

from ptl_rl.replay.draws import redraw_unsampleable
from ptl_rl.replay.frames.compiled import COMPILED_INSERT, PURE_PYTHON, _frame_insert
from ptl_rl.replay.frames.storage import FrameStorage

__all__ = ["COMPILED_INSERT", "PURE_PYTHON", "FrameStorage", "_frame_insert", "redraw_unsampleable"]

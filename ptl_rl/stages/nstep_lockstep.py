"""The lockstep fast path of n-step windows: every env of a source stepped, none ended, every window full.

A source's batch holding every one of its envs, in order, is the same read-only
``env_id`` array each time. While every env of it writes at the same ring
position (the phase), a step is a few strided slice copies of the window
arrays viewed as ``[E, n, ...]`` instead of gathers and scatters; the rows
are bit for bit those of the general path (:class:`~ptl_rl.stages.nstep_windows.Windows`).
These functions change only the lockstep state of a ``Windows``
(``_lock_ids``, ``_lock_range``, ``_lock_phase``, ``_quiet``, ``_views``) and
the head it writes. The snapshot saves the head; a restore forgets the
lockstep state, which the next full steps find again (``Windows.restore``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptl_rl.core.batch import TransitionBatch

# (``w`` is the Windows whose lockstep state these functions read and write; annotated Any: the Windows module
# imports this one, and a type-only import back would be a cycle of the design)
Windows = Any


def adopt_ids(w: Windows, env_id: np.ndarray) -> None:
    """Take ``env_id`` as the lockstep batch's ids if it is a read-only run ``lo, lo+1, ..`` (a source's)."""
    flat = w._window is not None and all(isinstance(v, np.ndarray) for v in w._window.values())
    flat = flat and isinstance(w._next_obs, np.ndarray)
    lo = int(env_id[0])
    if flat and not env_id.flags.writeable and np.array_equal(env_id, np.arange(lo, lo + len(env_id))):
        w._lock_ids, w._lock_range = env_id, (lo, lo + len(env_id))


def resync(w: Windows) -> None:
    """After a general fold of a source's batch: bring the lockstep envs back to one ring phase if possible.

    An env whose window is empty may move its head anywhere (nothing is held), so the envs with
    an empty window take the head of the others. Changes nothing any window holds.
    """
    lo, hi = w._lock_range
    heads, lengths = w._head[lo:hi], w._length[lo:hi]
    held = np.flatnonzero(lengths)
    phase = int(heads[held[0]]) if len(held) else int(heads[0])
    if len(held) and not (heads[held] == phase).all():
        return  # out of step (a window continued over a dropped row): the general path until a flush
    heads[:] = phase
    # the shortest window: from n - 1 on, the next step fills every window
    w._lock_phase, w._quiet = phase, int(lengths.min())


def absent_are_empty(w: Windows, env_id: np.ndarray) -> bool:
    """Whether a batch with the rows ``env_id`` (some of the lockstep envs) leaves out only envs whose window is empty.

    Such an env holds nothing, so its head may move on with the others' (:func:`advance`): a next-step
    autoreset drops exactly the rows of the envs whose episode ended the step before.
    """
    lo, hi = w._lock_range
    if not len(env_id) or int(env_id.min()) < lo or int(env_id.max()) >= hi:
        return False
    held = w._length[lo:hi] > 0
    held[env_id - lo] = False
    return not held.any()


def advance(w: Windows, phase: int, quiet: bool) -> None:
    """After a general fold of a batch in phase (every env, or all but envs whose window is empty): the next
    step of every env goes to the next ring position.

    ``quiet``: no env ended, so every window holds one step more (up to ``n - 1``): ``_quiet`` stays a lower
    bound of the steps every window holds, and the fast path starts once it reaches ``n - 1``.
    """
    lo, hi = w._lock_range
    nxt = int(w._next_position[phase])
    w._head[lo:hi] = nxt
    w._lock_phase = nxt
    w._quiet = w._quiet + 1 if quiet else 0


def fold(w: Windows, batch: TransitionBatch, phase: int) -> TransitionBatch:
    """Every env of the source stepped, none ended, every window full: strided copies, no gathers.

    The ring slot of env ``e``'s step at ``phase`` is row ``e * n + phase``: a strided view of
    the window arrays viewed as ``[E, n, ...]``. The slot at ``phase`` is free (a window holds
    at most ``n - 1`` steps between calls), so a step written there changes no window held.
    """
    lo, hi = w._lock_range
    views = w._views
    if views is None:
        views = w._views = _views(w)
    for name, store in views.items():
        store[lo:hi, phase] = batch[name]
    oldest = int(w._next_position[phase])  # the full window's oldest step sits where the next write goes
    out: dict[str, Any] = {}
    for name, store in views.items():
        if name != "reward" and name != "next_obs":
            out[name] = store[lo:hi, oldest].copy()
    # the window's steps oldest first, then the same dot as _emit_full: the same float32 sums, bit for bit
    # (ndarray.dot: a third of the cost of @ for these small operands)
    out["reward"] = views["reward"][lo:hi].take(w._positions[oldest], axis=1).dot(w._fold[0])
    out["next_obs"] = batch["next_obs"]
    rows = hi - lo
    out["terminated"] = out["truncated"] = w._no_end[:rows]
    out["discount"] = w._full_discount[:rows]
    out["env_id"] = w._lock_ids
    # every window stays full (n - 1 held after emitting its oldest step)
    w._head[lo:hi] = oldest
    w._lock_phase = oldest
    return TransitionBatch.wrap(out)


def _views(w: Windows) -> dict[str, np.ndarray]:
    """The window arrays (and the next_obs ring) as ``[E, n, ...]`` views."""
    window = w._window
    assert window is not None  # sized by the first batch, before any fold or emit

    def view(a: np.ndarray) -> np.ndarray:
        return a.reshape(len(w._length), w.n, *a.shape[1:])

    views = {name: view(store) for name, store in window.items()}
    views["next_obs"] = view(w._next_obs)
    return views

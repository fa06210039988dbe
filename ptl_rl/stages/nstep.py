"""NStepTransform: folds 1-step transitions into n-step transitions, per env.

One discount rule covers every episode end. For a window of steps
``t .. t+k-1`` of one env (``k <= n``)::

    reward   = sum_{i<k} gamma**i * r_{t+i}
    discount = gamma**k
    next_obs = next_obs_{t+k-1}

A window is emitted when it holds ``n`` steps, or when its episode ends inside
it: then every shorter tail window is emitted as well, carrying the
``terminated`` / ``truncated`` flags of the last step. A learner's target is
always ``reward + discount * (1 - terminated) * V(next_obs)``. ``n=1`` is a
pass-through.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.clock import StageClock
from ptl_rl.core.protocols import PerEnvStream
from ptl_rl.core.stage import Stage
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.stages.nstep_windows import Windows


class NStepTransform(Stage[TransitionBatch]):
    """Turn a stream of 1-step :class:`TransitionBatch` into n-step transitions.

    The specification, straight from one env's steps (the brute-force reference
    the tests compare with, row by row)::

        for each episode e = steps s_0 .. s_{m-1} of one env (ended, or still running):
            for t in 0 .. m-1:
                k = min(n, m - t)                       # steps in the window from s_t
                if k < n and e is still running: wait   # emitted later, or by a flush as truncated
                row.obs, row.action, extras = those of s_t
                row.reward     = sum(gamma**i * s_{t+i}.reward for i < k)
                row.discount   = gamma**k
                row.next_obs   = s_{t+k-1}.next_obs
                row.terminated, row.truncated = s_{t+k-1}'s flags if t + k == m and e ended, else
                                                (False, k < n)   # a flush cuts a running episode
                emit row as soon as s_{t+k-1} has arrived

    Everything that makes it fast lives in :mod:`ptl_rl.stages.nstep_windows`.

    Args:
        upstream: an iterator of 1-step batches (an :class:`ExperienceSource`),
            or ``None`` to use :meth:`fold` on recorded data.
        n: window length, ``n >= 1`` (read by stages downstream: an
            :class:`~ptl_rl.core.protocols.NStepStream`).
        gamma: discount per step, in ``(0, 1]``.

    Input rows may come from any number of envs (``env_id``, int64 >= 0) in any
    interleaving; rows of the same env must arrive in time order. Fields other
    than ``next_obs``, ``terminated``, ``truncated``, ``discount`` and ``env_id``
    (``obs``, ``action``, agent extras) are taken from the first step of the
    window; ``reward`` becomes the discounted sum (float32). The incoming
    ``discount`` is replaced by ``gamma**k`` (float32).

    With ``n=1`` every row is emitted at once: the output shares the input's
    arrays (no copy) except ``reward`` (cast to float32 where needed) and
    ``discount`` (set to ``gamma``).

    At a cut in the stream (:meth:`~ptl_rl.Stage.consume_cut`: a stream number
    skipped upstream, a call of this stage cut short, a restore) the windows in
    flight are emitted as truncated, ahead of the rows of the batch that
    follows, so no window joins steps across rows that were lost.

    Examples:
        Four steps of one env, the episode terminating at the last, folded into 2-step transitions:

        >>> import numpy as np
        >>> import ptl_rl
        >>> steps = ptl_rl.TransitionBatch({
        ...     "obs": np.arange(4, dtype=np.float32)[:, None],
        ...     "action": np.zeros(4, dtype=np.int64),
        ...     "reward": np.ones(4, dtype=np.float32),
        ...     "next_obs": np.arange(1, 5, dtype=np.float32)[:, None],
        ...     "terminated": np.array([False, False, False, True]),
        ...     "truncated": np.zeros(4, dtype=bool),
        ...     "discount": np.full(4, 0.5, dtype=np.float32),
        ...     "env_id": np.zeros(4, dtype=np.int64),
        ... })
        >>> out = ptl_rl.NStepTransform(None, n=2, gamma=0.5).fold(steps)
        >>> out.obs[:, 0], out.next_obs[:, 0]  # the last window holds one step: the episode ended
        (array([0., 1., 2., 3.], dtype=float32), array([2., 3., 4., 4.], dtype=float32))
        >>> out.reward  # 1 + 0.5 * 1 over two steps
        array([1.5, 1.5, 1.5, 1. ], dtype=float32)
        >>> out.discount, out.terminated  # gamma**k for the k steps summed
        (array([0.25, 0.25, 0.25, 0.5 ], dtype=float32), array([False, False,  True,  True]))

        As a stage: ``ptl_rl.NStepTransform(source, n=3, gamma=0.99)`` yields the
        n-step transitions of each batch the source yields.
    """

    n: int  # the window length: what makes it an NStepStream (a FrameStorage downstream links next_obs by it)

    def __init__(self, upstream: Iterator[TransitionBatch] | None, n: int, gamma: float) -> None:
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        super().__init__(upstream)
        # an ExperienceSource yields at most one row per env and batch: no need to check each batch
        self._upstream_one_row_per_env = isinstance(upstream, PerEnvStream) and bool(upstream.one_row_per_env)
        self.n = int(n)
        self.gamma = float(gamma)
        self.windows = Windows(self.n, self.gamma)
        self.clock = StageClock("n-step", "transitions")

    # ------------------------------------------------------------------ stage
    def step(self) -> TransitionBatch:
        """Pull 1-step batches until one completes n-step rows; those rows."""
        if self.upstream is None:
            raise TypeError("this NStepTransform has no upstream; call fold(batch) instead")
        while True:
            out = self._fold(self.pull(), self._upstream_one_row_per_env)
            if out is not None:
                return out

    def snapshot(self) -> object:
        return self.windows.snapshot()

    def restore(self, snapshot: object) -> None:
        self.windows.restore(cast(tuple[Any, ...], snapshot))  # what snapshot() returned

    # ------------------------------------------------------------------ folding
    def fold(self, batch: TransitionBatch, one_row_per_env: bool = False) -> TransitionBatch | None:
        """Add 1-step transitions and return the n-step transitions they complete (or ``None``).

        ``batch`` may hold several consecutive steps of one env (in time order);
        ``one_row_per_env=True`` promises it holds at most one, which skips a check.
        After :meth:`load_state_dict` (or a cut call) the windows in flight are
        emitted first, as truncated: the rows of ``batch`` start new episodes.
        """
        return self.transaction(lambda: self._fold(batch, one_row_per_env))

    def flush(self) -> TransitionBatch | None:
        """Emit every window still in flight as truncated (bootstrap from its last ``next_obs``).

        Use at the end of a recorded trajectory that stops mid-episode. The
        windows are then empty.
        """
        return self.transaction(self.windows.flush)

    def _fold(self, batch: TransitionBatch, one_row_per_env: bool) -> TransitionBatch | None:
        # at a cut the windows cannot be continued by this batch: emitted as truncated, ahead of its rows
        flushed = self.windows.flush() if self.consume_cut() else None
        out = self.windows.fold(batch, one_row_per_env)
        if flushed is None:
            return out
        return flushed if out is None else TransitionBatch.concat([flushed, out])

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """In-flight windows as tensors (``weights_only``-safe).

        After :meth:`load_state_dict` they are emitted as truncated by the next
        ``next()`` or ``fold()``, ahead of what that step's batch completes,
        because the environments (whose state is not checkpointed) start new
        episodes: a restored window is never continued with new steps.
        """
        return versioned(self.windows.state_dict(), self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.windows.load_state_dict(state)
        self.state_replaced()

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``NStepTransform(n=3, gamma=0.99, windows_in_flight=5)``: envs whose window holds steps not yet emitted."""
        return stage_repr(self, n=self.n, gamma=self.gamma, windows_in_flight=len(self.windows))

"""NStepTransform: folds 1-step transitions into n-step transitions, per env.

One discount rule covers every episode end. For a window of steps
``t .. t+k-1`` of one env (``k <= n``)::

    reward   = sum_{i<k} gamma**i * r_{t+i}
    discount = gamma**k
    next_obs = next_obs_{t+k-1}

A window is emitted when it holds ``n`` steps, or when its episode ends inside
it: then every shorter tail window is emitted as well, carrying the
``terminated`` / ``truncated`` flags of the last step. A learner's target is
always ``reward + discount * (1 - terminated) * V(next_obs)``.

Robustness (see docs/design/robustness.md): the windows only change in one
statement at the end of a fold (the commit), so an interrupted ``next()`` or
``fold()`` leaves them as they were before or after it. Steps may still be
lost (the batch being folded, the rows being emitted), so the next call first
flushes every window as truncated: it bootstraps from the real ``next_obs`` of
the window's last step, and no window is ever continued across lost steps.
The same happens when the upstream's ``stream_seq`` skips a number (an
:class:`~ptl_rl.stages.source.ExperienceSource` that reset its envs, or batches
pulled from it by someone else). ``n=1`` is a pass-through.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch

from ptl_rl.core._grouping import rank_within_group
from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.core._trees import tree_assign, tree_map, tree_take
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.profiling import SWITCH, StageClock, perf_counter_ns
from ptl_rl.core.protocols import NumberedStream, PerEnvStream

# Fields that describe the end of a step rather than its start: they are not kept in the window.
_STEP_END_FIELDS = ("next_obs", "terminated", "truncated", "discount", "env_id")


class NStepTransform:
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

    Everything below that is speed: each env keeps its last ``n - 1`` steps in a
    ring, and a vector step folds every env's window at once through
    precomputed tables of discounts (one matrix product instead of a loop over
    ``k``), with a lockstep path when every env of a source steps together.

    Args:
        upstream: an iterator of 1-step batches (an :class:`ExperienceSource`),
            or ``None`` to use :meth:`fold` on recorded data.
        n: window length, ``n >= 1``.
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

    If the upstream has a ``stream_seq`` attribute (an ExperienceSource), a
    batch whose number is not one more than the previous one's means steps are
    missing between them: the windows in flight are then emitted as truncated
    before that batch is folded. The transform numbers its own batches the same
    way (``stream_seq``, skipping a number after such a cut, an interrupted
    call or a restore), for stages downstream that link steps across batches.

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

    def __init__(self, upstream: Iterator[TransitionBatch] | None, n: int, gamma: float) -> None:
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.upstream = upstream
        # an ExperienceSource yields at most one row per env and batch: no need to check each batch
        self._upstream_one_row_per_env = isinstance(upstream, PerEnvStream) and bool(upstream.one_row_per_env)
        self._upstream_numbered = isinstance(upstream, NumberedStream)  # its stream_seq is read at every pull
        self.n = int(n)
        self.gamma = float(gamma)
        k = np.arange(self.n)
        # _fold[j, k] = gamma**(k - j) for k >= j: row j sums the window tail that starts at step j
        self._fold = np.where(k[None, :] >= k[:, None], self.gamma ** (k[None, :] - k[:, None]), 0.0).astype(np.float32)
        self._discounts = (self.gamma ** np.arange(self.n + 1)).astype(np.float32)
        self._positions = (k[:, None] + k[None, :]) % self.n  # [oldest, j] -> ring position of window step j
        self._next_position = (k + 1) % self.n
        held = k[None, :] < np.arange(self.n + 1)[:, None]  # [length, j]: step j is in a window of that length
        self._held = held.astype(np.float32)
        # [whole, length, j]: which window starts j are emitted: every tail at an episode end, else the oldest
        self._starts = np.stack([held & (k[None, :] == 0), held])
        # field -> [E * n, ...] arrays: step j of env e's ring sits in row e * n + j (one flat index per
        # row makes every gather a single ndarray.take)
        self._window: dict[str, Any] | None = None
        # [E * n, ...]: next_obs of each step held, so a window can be flushed from its own last step
        self._next_obs: Any = None
        self._head = np.zeros(0, dtype=np.int64)  # next write position per env
        self._length = np.zeros(0, dtype=np.int64)  # steps held per env
        # sized with the windows by _ensure_capacity: a scratch row per env and the tables of _constants
        self._scratch = np.zeros(0, dtype=np.int64)
        self._window_rows, self._no_end, self._full_discount = self._constants(0)
        self._flush_on_next = False
        self._sized_for_source = False
        # set while a fold is under way: still set on entry means the previous call was interrupted
        self._in_fold = False
        self._upstream_seq: int | None = None  # stream_seq of the last upstream batch folded
        self.stream_seq = 0  # number of the last batch yielded; skips one where the env streams were cut
        self._in_next = False  # set while __next__ runs (see _next)
        self._gamma_column = _read_only(np.zeros(0, dtype=np.float32))  # n=1: the discount column
        self.clock = StageClock("n-step", "transitions")  # time accounting (ptl_rl.profile)
        # Lockstep fast path (see _fold_lockstep): a source's batch that holds every one of its envs, in
        # order, is the same read-only env_id array each time. While every env of it writes at the same
        # ring position (the phase), a step is a few strided slice copies instead of gathers and scatters.
        # _quiet is the fewest steps a window of those envs holds: from n - 1 on, a step fills every window.
        self._lock_ids: np.ndarray | None = None  # the source's env_id array of a full batch
        self._lock_range = (0, 0)
        self._lock_phase: int | None = None  # ring position every lockstep env writes next; None: out of step
        self._quiet = 0
        self._views: dict[str, np.ndarray] | None = None  # [E, n, ...] views of the window arrays

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> NStepTransform:
        return self

    def __next__(self) -> TransitionBatch:
        if self.upstream is None:
            raise TypeError("this NStepTransform has no upstream; call fold(batch) instead")
        if not SWITCH.on:
            return self._next()
        start = perf_counter_ns()
        out = self._next()
        self.clock.add(perf_counter_ns() - start, len(out))
        return out

    def _next(self) -> TransitionBatch:
        # a cut in the streams (a gap upstream, an interrupted call, a restore) skips a number of our own
        # stream_seq, so that a stage downstream that continues episodes across batches sees it too;
        # _in_next still set on entry means the last call was cut short, maybe after its rows were folded
        upstream = self.upstream
        assert upstream is not None  # __next__ raised already
        cut = self._in_next
        self._in_next = True
        while True:
            batch = next(upstream)
            seq = cast(NumberedStream, upstream).stream_seq if self._upstream_numbered else None
            # a skipped number: steps between the last batch folded and this one never reached us
            gap = seq is not None and self._upstream_seq is not None and seq != self._upstream_seq + 1
            cut = cut or gap or self._in_fold or self._flush_on_next
            out = self._fold_step(batch, self._upstream_one_row_per_env, gap, seq)
            if out is not None:
                self.stream_seq += 2 if cut else 1
                self._in_next = False
                return out

    # ------------------------------------------------------------------ folding
    def fold(self, batch: TransitionBatch, one_row_per_env: bool = False) -> TransitionBatch | None:
        """Add 1-step transitions and return the n-step transitions they complete (or ``None``).

        ``batch`` may hold several consecutive steps of one env (in time order);
        ``one_row_per_env=True`` promises it holds at most one, which skips a check.
        After :meth:`load_state_dict` the restored windows are emitted first, as
        truncated (see :meth:`flush`): the rows of ``batch`` start new episodes.
        """
        return self._fold_step(batch, one_row_per_env, False, None)

    def _fold_step(
        self, batch: TransitionBatch, one_row_per_env: bool, gap: bool, seq: int | None
    ) -> TransitionBatch | None:
        # The windows are flushed (emitted as truncated) when they cannot be continued by this
        # batch: after a restore, after a gap upstream, and after an interrupted call (its commits
        # are atomic, so the windows are consistent, but the steps that followed them are lost).
        # The flag is set before anything changes, so an interruption from here on is seen next time.
        must_flush = self._in_fold or self._flush_on_next or gap
        self._in_fold = True
        if seq is not None:
            self._upstream_seq = seq
        flushed = self.flush() if must_flush else None
        self._flush_on_next = False
        if not len(batch):
            out = None
        elif self.n == 1:
            out = self._pass_through(batch)
        else:
            out = self._fold_batch(batch, one_row_per_env)
        if flushed is not None and out is not None:
            out = TransitionBatch.concat([flushed, out])
        elif out is None:
            out = flushed
        self._in_fold = False
        return out

    def _pass_through(self, batch: TransitionBatch) -> TransitionBatch:
        """n=1: every step is its own window; only ``reward`` (float32) and ``discount`` (gamma) change."""
        rows = len(batch)
        if len(self._gamma_column) < rows:
            self._gamma_column = _read_only(np.full(max(rows, 2 * len(self._gamma_column)), self.gamma, np.float32))
        fields = dict(batch.items())
        reward = fields["reward"]
        if type(reward) is not np.ndarray or reward.dtype != np.float32:
            fields["reward"] = np.asarray(reward, dtype=np.float32)
        fields["discount"] = self._gamma_column[:rows]
        return TransitionBatch.wrap(fields)

    def _fold_batch(self, batch: TransitionBatch, one_row_per_env: bool) -> TransitionBatch | None:
        env_id = np.asarray(batch["env_id"])
        if not (one_row_per_env and self._sized_for_source):
            self._ensure_capacity(batch, int(env_id.max()) + 1)
            # a source's batches hold (a subset of) the env ids of its first batch: only other input can grow
            self._sized_for_source = one_row_per_env
            if one_row_per_env and self._lock_ids is None:
                self._adopt_lock_ids(env_id)
        if not one_row_per_env:
            self._lock_phase = None  # rows of any envs: the heads may leave the lockstep phase
            if not self._unique(env_id):
                return self._fold_in_order(batch, env_id)
            return self._fold_unique(batch, env_id)
        full_batch = env_id is self._lock_ids
        if full_batch:
            ended = np.count_nonzero(batch["terminated"]) or np.count_nonzero(batch["truncated"])
            phase = self._lock_phase
            if not ended and phase is not None and self._quiet >= self.n - 1:
                return self._fold_lockstep(batch, phase)
        elif self._lock_ids is None:
            if not env_id.flags.writeable:  # a full batch of a source (after a restore, say)
                self._adopt_lock_ids(env_id)
            return self._fold_unique(batch, env_id)
        # a step with an episode end, windows not yet full, or a batch without some envs (next-step resets)
        self._lock_phase, self._quiet = None, 0
        out = self._fold_unique(batch, env_id)
        if full_batch and not ended:
            # only a step that ends no episode can lead to the lockstep path (the windows must fill up
            # first), so only such a step looks for the common phase: none of this while episodes end often
            self._resync()
        return out

    def _adopt_lock_ids(self, env_id: np.ndarray) -> None:
        """Take ``env_id`` as the lockstep batch's ids if it is a read-only run ``lo, lo+1, ..`` (a source's)."""
        flat = self._window is not None and all(isinstance(v, np.ndarray) for v in self._window.values())
        flat = flat and isinstance(self._next_obs, np.ndarray)
        lo = int(env_id[0])
        if flat and not env_id.flags.writeable and np.array_equal(env_id, np.arange(lo, lo + len(env_id))):
            self._lock_ids, self._lock_range = env_id, (lo, lo + len(env_id))

    def _resync(self) -> None:
        """After a general fold of a source's batch: bring the lockstep envs back to one ring phase if possible.

        An env whose window is empty may move its head anywhere (nothing is held), so the envs with
        an empty window take the head of the others. Changes nothing any window holds.
        """
        lo, hi = self._lock_range
        heads, lengths = self._head[lo:hi], self._length[lo:hi]
        held = np.flatnonzero(lengths)
        phase = int(heads[held[0]]) if len(held) else int(heads[0])
        if len(held) and not (heads[held] == phase).all():
            return  # out of step (a window continued over a dropped row): the general path until a flush
        heads[:] = phase
        # the shortest window: from n - 1 on, the next step fills every window
        self._lock_phase, self._quiet = phase, int(lengths.min())

    def _fold_lockstep(self, batch: TransitionBatch, phase: int) -> TransitionBatch:
        """Every env of the source stepped, none ended, every window full: strided copies, no gathers.

        The ring slot of env ``e``'s step at ``phase`` is row ``e * n + phase``: a strided view of
        the window arrays viewed as ``[E, n, ...]``. The slot at ``phase`` is free (a window holds
        at most ``n - 1`` steps between calls), so the writes change nothing a window holds until
        the commit.
        """
        lo, hi = self._lock_range
        views = self._views
        if views is None:
            views = self._views = self._make_views()
        for name, store in views.items():
            store[lo:hi, phase] = batch[name]
        oldest = int(self._next_position[phase])  # the full window's oldest step sits where the next write goes
        out: dict[str, Any] = {}
        for name, store in views.items():
            if name != "reward" and name != "next_obs":
                out[name] = store[lo:hi, oldest].copy()
        # the window's steps oldest first, then the same dot as _emit_full: the same float32 sums, bit for bit
        # (ndarray.dot: a third of the cost of @ for these small operands)
        out["reward"] = views["reward"][lo:hi].take(self._positions[oldest], axis=1).dot(self._fold[0])
        out["next_obs"] = batch["next_obs"]
        rows = hi - lo
        out["terminated"] = out["truncated"] = self._no_end[:rows]
        out["discount"] = self._full_discount[:rows]
        out["env_id"] = self._lock_ids
        # The commit, one statement: every window stays full (n - 1 held after emitting its oldest step)
        self._head[lo:hi], self._lock_phase = oldest, oldest
        return TransitionBatch.wrap(out)

    def _make_views(self) -> dict[str, np.ndarray]:
        """The window arrays (and the next_obs ring) as ``[E, n, ...]`` views."""
        window = self._window
        assert window is not None  # sized by the first batch, before any fold or emit

        def view(a: np.ndarray) -> np.ndarray:
            return a.reshape(len(self._length), self.n, *a.shape[1:])

        views = {name: view(store) for name, store in window.items()}
        views["next_obs"] = view(self._next_obs)
        return views

    def flush(self) -> TransitionBatch | None:
        """Emit every window still in flight as truncated (bootstrap from its last ``next_obs``).

        Use at the end of a recorded trajectory that stops mid-episode. The
        windows are then empty.
        """
        if self._window is None:
            return None
        envs = np.flatnonzero(self._length > 0)
        if len(envs) == 0:
            return None
        self._quiet = 0  # the windows empty: the lockstep path waits until they are full again
        zeros = np.zeros(len(envs), dtype=bool)
        head = self._head[envs]
        last = envs * self.n + (head - 1) % self.n  # the slot of each window's last step
        ends = {"next_obs": tree_take(self._next_obs, last), "terminated": zeros, "truncated": ~zeros}
        out = self._emit(envs, head, self._length[envs], ~zeros, ends, np.arange(len(envs)))
        self._length[envs] = 0  # the commit: one statement
        return out

    def _fold_unique(self, batch: TransitionBatch, env: np.ndarray) -> TransitionBatch | None:
        window = self._window
        assert window is not None  # sized by the first batch, before any fold or emit
        n = self.n
        head = self._head[env]
        slots = env * n + head
        # The slot at head is free (a window holds at most n - 1 steps between calls), so these
        # writes change nothing a window holds until head and length are committed below.
        for name, store in window.items():
            tree_assign(store, slots, batch[name])
        tree_assign(self._next_obs, slots, batch["next_obs"])
        head = self._next_position[head]
        length = self._length[env] + 1

        done = batch["terminated"] | batch["truncated"]
        if not np.count_nonzero(done):  # the common step: only full windows, no tails
            full = length == n
            emitting = np.count_nonzero(full)
            if emitting == len(env):
                out = self._emit_full(env, head, batch["next_obs"])
                length -= 1  # a full window drops its oldest step
            elif not emitting:
                out = None
            else:
                rows = full.nonzero()[0]
                out = self._emit_full(env[rows], head[rows], tree_take(batch["next_obs"], rows))
                length -= full
        else:
            full = length == n
            rows = (done | full).nonzero()[0]
            if len(rows) < len(env):
                out = self._emit(env[rows], head[rows], length[rows], done[rows], batch, rows)
            else:
                out = self._emit(env, head, length, done, batch, rows)
            # a full window drops its oldest step; an ended episode empties its window
            length = np.where(done, 0, length - full)
        # The commit, in one statement without Python calls in between: an interrupt lands before
        # it (this step is lost, the windows are as they were) or after it (all is recorded).
        self._head[env], self._length[env] = head, length
        return out

    def _emit_full(self, env: np.ndarray, head: np.ndarray, next_obs: Any) -> TransitionBatch:
        """The full oldest window of each env in ``env`` (none of them ended); ``head`` is after this step."""
        window = self._window
        assert window is not None  # sized by the first batch, before any fold or emit
        first = env * self.n + head  # a full window's oldest step sits where the next write goes
        rows = len(env)
        out: dict[str, Any] = {}
        for name, store in window.items():
            out[name] = tree_take(store, first)
        out["reward"] = window["reward"].take(self._window_rows[first]).dot(self._fold[0])
        out["next_obs"] = next_obs
        out["terminated"] = out["truncated"] = self._no_end[:rows]
        out["discount"] = self._full_discount[:rows]
        out["env_id"] = env
        return TransitionBatch.wrap(out)

    def _emit(
        self,
        env: np.ndarray,
        head: np.ndarray,
        length: np.ndarray,
        whole: np.ndarray,
        ends: Any,
        end_rows: np.ndarray,
    ) -> TransitionBatch:
        """Emit windows of the envs ``env`` holding ``length`` steps each, ending before ``head``.

        Where ``whole`` is true every tail window is emitted (an episode end);
        elsewhere only the full oldest window. ``ends[k][end_rows]`` holds the
        ``next_obs``/``terminated``/``truncated`` of each env's last step.
        Changes no state.
        """
        window = self._window
        assert window is not None  # sized by the first batch, before any fold or emit
        oldest = (head - length) % self.n
        slots = (env * self.n)[:, None] + self._positions[oldest]  # [R, n] window rows, oldest first
        rewards = window["reward"].take(slots) * self._held[length]
        tail_sums = rewards @ self._fold.T  # [R, n]: discounted sum of the window tail starting at step j
        row, start = self._starts[whole.view(np.uint8), length].nonzero()
        src_env, src_slot = env[row], slots[row, start]
        out: dict[str, Any] = {}
        for name, store in window.items():
            out[name] = tree_take(store, src_slot)
        out["reward"] = tail_sums[row, start]
        last = end_rows[row]
        for name in ("next_obs", "terminated", "truncated"):
            out[name] = tree_take(ends[name], last)
        out["discount"] = self._discounts[length[row] - start]
        out["env_id"] = src_env
        return TransitionBatch.wrap(out)

    def _fold_in_order(self, batch: TransitionBatch, env_id: np.ndarray) -> TransitionBatch | None:
        """Several rows of one env in one batch: fold them occurrence by occurrence, keeping time order."""
        occurrence = rank_within_group(env_id)
        outputs = []
        for k in range(int(occurrence.max()) + 1):
            rows = np.flatnonzero(occurrence == k)
            out = self._fold_unique(batch.rows(rows), env_id[rows])
            if out is not None:
                outputs.append(out)
        return TransitionBatch.concat(outputs) if outputs else None

    def _unique(self, env_id: np.ndarray) -> bool:
        if len(env_id) == 1:
            return True
        marks = self._scratch[: len(self._length)]
        positions = np.arange(len(env_id))
        marks[env_id] = positions
        return bool((marks[env_id] == positions).all())

    # ------------------------------------------------------------------ storage
    def _ensure_capacity(self, batch: TransitionBatch, num_envs: int) -> None:
        # Everything is built in locals and assigned in one statement: an interrupt during a
        # growth leaves the old, consistent storage (window, head, length and the tables sized alike).
        window, next_obs = self._window, self._next_obs
        if window is None:
            names = [name for name in batch.keys() if name not in _STEP_END_FIELDS]
            window = {
                name: tree_map(lambda a: np.zeros((0, *a.shape[1:]), dtype=a.dtype), batch[name]) for name in names
            }
            next_obs = tree_map(lambda a: np.zeros((0, *a.shape[1:]), dtype=a.dtype), batch["next_obs"])
        elif num_envs <= len(self._length):
            return
        size = max(num_envs, 2 * len(self._length))
        grow = size - len(self._length)

        def grown(a: np.ndarray, rows_per_env: int = 1) -> np.ndarray:
            return np.concatenate([a, np.zeros((grow * rows_per_env, *a.shape[1:]), dtype=a.dtype)])

        window = {name: tree_map(lambda a: grown(a, self.n), store) for name, store in window.items()}
        next_obs = tree_map(lambda a: grown(a, self.n), next_obs)
        head, length = grown(self._head), grown(self._length)
        window_rows, no_end, full_discount = self._constants(size)
        self._lock_phase, self._quiet, self._views = None, 0, None
        # one C-level call: the attributes change together or not at all
        self.__dict__.update(
            _window=window,
            _next_obs=next_obs,
            _head=head,
            _length=length,
            _scratch=np.zeros(size, dtype=np.int64),
            _window_rows=window_rows,
            _no_end=no_end,
            _full_discount=full_discount,
        )

    def _constants(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tables for ``size`` envs: window rows by first slot, the no-end flags and the full discount."""
        # [e * n + oldest] -> the window's rows, oldest first
        window_rows = (np.arange(size)[:, None, None] * self.n + self._positions[None]).reshape(size * self.n, self.n)
        # shared by every emitted batch, so read-only: a consumer that writes to one fails loudly
        no_end = _read_only(np.zeros(size, dtype=bool))
        full_discount = _read_only(np.full(size, self._discounts[self.n], dtype=np.float32))
        return window_rows, no_end, full_discount

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """In-flight windows as tensors (``weights_only``-safe).

        After :meth:`load_state_dict` they are emitted as truncated by the next
        ``next()`` or ``fold()``, ahead of what that step's batch completes,
        because the environments (whose state is not checkpointed) start new
        episodes: a restored window is never continued with new steps.
        """
        if self._window is None:
            return versioned({"window": None}, self.STATE_VERSION)
        to_t = lambda a: torch.from_numpy(a.copy())  # noqa: E731
        state = {
            "window": {name: tree_map(to_t, store) for name, store in self._window.items()},
            "last_next_obs": tree_map(to_t, tree_take(self._next_obs, self._last_slots())),
            "head": to_t(self._head),
            "length": to_t(self._length),
        }
        return versioned(state, self.STATE_VERSION)

    def _last_slots(self) -> np.ndarray:
        """[E]: the ring slot of each env's most recent step."""
        return np.arange(len(self._head)) * self.n + (self._head - 1) % self.n

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self._sized_for_source = False  # the restored windows may be sized for fewer envs than the upstream has
        self._lock_ids, self._lock_phase, self._quiet, self._views = None, None, 0, None
        self._upstream_seq = None  # the next upstream batch is no gap: there is nothing to continue
        self._in_fold = False
        if state["window"] is None:
            self._window = None
            self._flush_on_next = False
            self._head = np.zeros(0, dtype=np.int64)
            self._length = np.zeros(0, dtype=np.int64)
            return
        to_np = lambda t: t.numpy().copy()  # noqa: E731
        self._window = {name: tree_map(to_np, store) for name, store in state["window"].items()}
        self._head = to_np(state["head"])
        self._length = to_np(state["length"])
        last_next_obs = tree_map(to_np, state["last_next_obs"])
        self._next_obs = tree_map(lambda a: np.zeros((len(a) * self.n, *a.shape[1:]), a.dtype), last_next_obs)
        tree_assign(self._next_obs, self._last_slots(), last_next_obs)
        self._scratch = np.zeros(len(self._length), dtype=np.int64)
        self._window_rows, self._no_end, self._full_discount = self._constants(len(self._length))
        self._flush_on_next = True

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``NStepTransform(n=3, gamma=0.99, windows_in_flight=5)``: envs whose window holds steps not yet emitted."""
        in_flight = int(np.count_nonzero(self._length))
        return stage_repr(self, n=self.n, gamma=self.gamma, windows_in_flight=in_flight)


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a

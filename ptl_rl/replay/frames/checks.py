"""Every check of a FrameStorage add, before its first write: a refused batch leaves the storage as it was.

Functions of what they are handed (the observations' layout, the other fields' storage, the per-env table):
they read, raise ``ValueError`` for a batch the storage cannot store as given, and write nothing (but the
other fields' storage, which allocates from a first batch and undoes it when that batch is refused).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ptl_rl.core._grouping import rank_within_group
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.frames.env_state import EnvTable, each_once
from ptl_rl.replay.frames.pool import frame_layout, rows_bitwise_equal
from ptl_rl.replay.storage import ArrayStorage

OBS_FIELDS = ("obs", "next_obs")


class ObsLayout:
    """How a FrameStorage's observations are laid out: given (``stack_axis``, ``frame_key``) or set by the first batch.

    Attributes:
        stack_axis: the axis of an observation along which frames are stacked (``None``: single frames).
        frame_key: for Dict observations, the key stored as frames (given, or chosen by the first batch).
        keys: the sorted keys of Dict observations (``None``: array observations).
        shape: the shape of one observation's frame part (``obs[frame_key]`` for Dict ones).
        dtype: its dtype (``None`` until the first batch).
    """

    def __init__(self, stack_axis: int | None, frame_key: str | None) -> None:
        self.stack_axis = stack_axis
        self.frame_key = frame_key
        self.keys: tuple[str, ...] | None = None
        self.shape: tuple[int, ...] = ()
        self.dtype: np.dtype | None = None


class Checked(NamedTuple):
    """A batch's parts that passed :func:`checked_parts` (rows first; ``rest`` last)."""

    obs: np.ndarray  # the framed part of obs [B, *obs_shape]
    next_obs: np.ndarray  # [B, *obs_shape]
    env: np.ndarray  # int64 [B], >= 0
    done: np.ndarray  # bool [B]: terminated | truncated
    rest: TransitionBatch  # the other fields (and the other keys of Dict observations)
    keys: tuple[str, ...] | None  # sorted observation keys (Dict observations), chosen by a first batch
    frame_key: str | None  # the frame key among them


def chunk_rows(count: int, stack: int, capacity: int, pool_size: int) -> int:
    """Rows of a batch of ``count`` added at once: all, or chunks if it could overflow the ring or the pool.

    A batch of more than ``capacity`` rows, or whose ``count * S`` frames could exceed the pool in one
    write, goes in chunks of at most ``capacity`` rows whose observation and final stacks (``2 S`` frames
    a row) fit the pool together.
    """
    if count <= capacity and count * stack <= pool_size:
        return count
    return min(capacity, max(pool_size // (2 * stack), 1))


def checked_parts(
    batch: TransitionBatch, layout: ObsLayout, fields: ArrayStorage, first: bool, pool_size: int
) -> Checked:
    """The parts of ``batch`` to store, checked: the observations (see :func:`checked_obs`), the other
    fields (the inner storage's check, which allocates from a ``first`` batch), ``env_id >= 0``."""
    obs, next_obs, keys, frame_key = checked_obs(batch, layout, first, pool_size)
    rest = TransitionBatch({k: v for k, v in batch.items() if k not in OBS_FIELDS})
    if keys is not None:  # Dict observations: the keys that are not frames are plain fields
        rest["obs"] = {k: v for k, v in batch["obs"].items() if k != frame_key}
        rest["next_obs"] = {k: v for k, v in batch["next_obs"].items() if k != frame_key}
    fields.check(rest)
    env = np.asarray(batch["env_id"], dtype=np.int64)  # (int64 [B] now: the inner check passed)
    if len(env) and env.min() < 0:
        raise ValueError(f"env_id must be >= 0, got {env.min()}; number the envs 0, 1, ...")
    done = np.asarray(batch["terminated"], dtype=bool) | np.asarray(batch["truncated"], dtype=bool)
    return Checked(obs, next_obs, env, done, rest, keys, frame_key)


def checked_obs(
    batch: TransitionBatch, layout: ObsLayout, first: bool, pool_size: int
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None, str | None]:
    """The framed part of ``obs`` and ``next_obs`` of ``batch``, checked to have the stored shape and dtype.

    Also the sorted observation keys and the frame key (``None, None`` for array observations); for a
    ``first`` batch they are chosen here (and set when the storage allocates).
    """
    for name in (*OBS_FIELDS, "env_id", "terminated", "truncated"):
        if name not in batch:
            raise ValueError(
                f"FrameStorage needs the field {name!r} (it links observations per env and episode); add "
                "transitions as an ExperienceSource / NStepTransform produces them"
            )
    obs, next_obs = batch["obs"], batch["next_obs"]
    keys, frame_key = choose_frame_key(obs, layout.frame_key) if first else (layout.keys, layout.frame_key)
    if (keys is None) != (not isinstance(obs, dict)) or isinstance(obs, dict) != isinstance(next_obs, dict):
        raise ValueError(
            "obs and next_obs must both be arrays or both be dicts, as in the first batch this FrameStorage stored"
        )
    if keys is not None:
        for name, value in (("obs", obs), ("next_obs", next_obs)):
            if tuple(sorted(value)) != keys:
                raise ValueError(
                    f"field {name!r} has the keys {sorted(value)}; the FrameStorage stores {list(keys)} "
                    "(from the first batch). Every batch must carry the same observation keys."
                )
        obs, next_obs = obs[frame_key], next_obs[frame_key]
    obs, next_obs = np.asarray(obs), np.asarray(next_obs)
    shape, dtype = (obs.shape[1:], obs.dtype) if first else (layout.shape, layout.dtype)
    if first:
        frame_layout(layout.stack_axis, shape, pool_size)  # (refuses a stack_axis the observations do not have)
    for name, value in (("obs", obs), ("next_obs", next_obs)):
        if value.shape[1:] != shape or value.dtype != dtype or len(value) != len(batch):
            where = name if keys is None else f"{name}.{frame_key}"
            raise ValueError(
                f"field {where!r} has shape {value.shape} and dtype {value.dtype}; the FrameStorage stores "
                f"{len(batch)} rows (one per transition) of shape {shape} and dtype {dtype} "
                "(allocated from the first batch). Every batch added to one buffer must carry observations of "
                "one shape and dtype."
            )
    return obs, next_obs, keys, frame_key


def check_next_obs(
    env: np.ndarray,
    obs_frames: np.ndarray,
    next_frames: np.ndarray,
    done: np.ndarray,
    *,
    envs: EnvTable,
    n: int,
    cut: bool,
    total_added: int,
    capacity: int,
    chunk: int,
) -> None:
    """Checked mode: refuse a batch unless each observation equals the ``next_obs`` it will be stored as.

    An observation of env ``e`` (frames [B, S, *frame]) is stored once and is the ``next_obs`` of the env's
    transition ``n`` rows earlier that still waits for one (stored before, its whole stack kept in the
    env table's ``pending`` ring, or a row of this batch). Both stacks are compared whole, for every row,
    before anything is written: the rows of one env in time order, as the writes would resolve them (chunk
    by chunk for a batch of more than ``chunk`` rows). ``n``: the storage's n-step; ``cut``: the batch does
    not follow the one added last (then nothing stored waits); ``total_added``: transitions added before it.
    """
    count, state, pending = len(env), envs.state, envs.pending
    total = total_added
    if not cut and count <= chunk and len(state.array) > env.max() and each_once(env):
        # the common step: each row resolves the oldest stored stack of its env, if that one still waits
        gen = state.recent[env, 0]
        waiting = gen >= max(total + count - capacity, 0)
        r = np.arange(count) if waiting.all() else np.flatnonzero(waiting)
        want = pending[env[r], state.head[env[r]]]
        if len(r) and not rows_bitwise_equal(want, obs_frames if len(r) == count else obs_frames[r]).all():
            bad = int(np.flatnonzero(~rows_bitwise_equal(want, obs_frames[r]))[0])
            refuse_next_obs(int(r[bad]), int(env[r[bad]]), int(gen[r[bad]]), want[bad], obs_frames[r[bad]], n)
        return
    rows = np.arange(count)
    # transitions still stored when a row is written: the row's chunk is stored by then
    if count <= chunk:
        floor = np.full(count, max(total + count - capacity, 0))
    else:
        floor = np.maximum(total + np.minimum((rows // chunk + 1) * chunk, count) - capacity, 0)
    once = each_once(env)
    occurrence = np.zeros(count, dtype=np.int64) if once else rank_within_group(env)
    checks = []  # (rows, the stacks they must equal, those stacks' transition numbers)
    if not cut:
        r = np.flatnonzero((occurrence < n) & (env < len(state.array)))
        gen = state.recent[env[r], occurrence[r]]
        r, gen = r[gen >= floor[r]], gen[gen >= floor[r]]
        position = (state.head[env[r]] + occurrence[r]) % (n + 1)  # (the k-th oldest of the env's ring)
        checks.append((r, pending[env[r], position], gen))
    if not once:  # an env's row k resolves its row k - n of this batch
        order = np.argsort(env, kind="stable")
        position = np.empty(count, dtype=np.int64)
        position[order] = rows
        r = np.flatnonzero(occurrence >= n)
        back = order[position[r] - n]
        gen = np.where(done[back], -1, total + back)
        keep = gen >= floor[r]
        checks.append((r[keep], next_frames[back[keep]], gen[keep]))
    refused = []  # (row, transition number, the stack it had to equal) of each mismatch
    for r, want, gen in checks:
        if len(r):
            refused += [(r[b], gen[b], want[b]) for b in np.flatnonzero(~rows_bitwise_equal(want, obs_frames[r]))]
    if refused:
        row, number, want = min(refused, key=lambda bad: bad[0])  # (the earliest row)
        refuse_next_obs(int(row), int(env[row]), int(number), want, obs_frames[row], n)


def refuse_next_obs(row: int, env: int, number: int, want: np.ndarray, got: np.ndarray, n: int) -> None:
    """Raise for row ``row`` (env ``env``) whose obs stack ``got`` is not the next_obs ``want`` of ``number``."""
    where = (
        f"row {row} of the batch (env {env}): its obs is not the next_obs of env {env}'s transition number "
        f"{number} (counted from 0 over all adds), {n} step(s) earlier"
    )
    if not rows_bitwise_equal(want[-1:], got[-1:])[0]:
        raise ValueError(
            f"{where}. This FrameStorage has n_step={n}: set n_step to the n of the NStepTransform that "
            "feeds the buffer (1 for 1-step data), and add every step of each env once, in time order."
        )
    differ = [j for j in range(len(want) - 1) if not rows_bitwise_equal(want[j : j + 1], got[j : j + 1])[0]]
    raise ValueError(
        f"{where}: their newest frames agree, but frame(s) {differ} of the stack (oldest first) differ. "
        "FrameStorage stores that obs once, also as the earlier transition's next_obs, so the batch is refused. "
        "Give each transition the next_obs its env returned, or mark a step whose next_obs is not the next "
        "obs (a reset) as terminated or truncated."
    )


def choose_frame_key(obs: Any, frame_key: str | None) -> tuple[tuple[str, ...] | None, str | None]:
    """For Dict observations: the sorted keys and the frame key, checked or chosen (``None, None`` for arrays)."""
    if not isinstance(obs, dict):
        if frame_key is not None:
            raise ValueError(f"frame_key={frame_key!r} is for Dict observations; these are arrays: drop it")
        return None, None
    keys = tuple(sorted(obs))
    if any(isinstance(v, dict) for v in obs.values()):
        raise ValueError("FrameStorage stores Dict observations one level deep; flatten nested dicts first")
    if frame_key is None:
        pixels = [k for k in keys if np.ndim(obs[k]) >= 3]  # [B, ...] with at least two dims per observation
        if len(pixels) != 1:
            raise ValueError(
                f"Dict observations with keys {list(keys)}: pass frame_key= naming the key whose observations "
                f"are frames to store once (found {len(pixels)} keys with 2+ dims per observation: {pixels})"
            )
        return keys, pixels[0]
    if frame_key not in obs:
        raise ValueError(f"frame_key={frame_key!r} is not a key of the observations {list(keys)}")
    return keys, frame_key

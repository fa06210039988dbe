"""The n-step windows' snapshot: a restore puts back everything a fold changed, or rebuilds it.

``Windows.snapshot`` saves only what the windows hold (heads, lengths, the rings); the restore rebuilds
the views and sized tables and forgets the lockstep phase. These tests name that rule: an attribute a
fold changes that is neither saved nor rebuilt fails them.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from ptl_rl import TransitionBatch
from ptl_rl.stages.nstep_windows import Windows

# what a restore sets to "unknown" (found again by the next full steps, as after a load) or a per-snapshot log
FOUND_AGAIN = {"_lock_ids", "_lock_range", "_lock_phase", "_quiet", "_views", "_sized_for_source", "_undo"}


def steps(env_id: np.ndarray, t: int, ended: tuple[int, ...] = ()) -> TransitionBatch:
    rows = len(env_id)
    terminated = np.isin(env_id, ended)
    return TransitionBatch(
        obs=np.stack([env_id * 100.0 + t, -env_id - t], axis=1).astype(np.float32),
        action=(env_id + t) % 2,
        reward=(env_id + t + 1).astype(np.float32),
        next_obs=np.stack([env_id * 100.0 + t + 1, -env_id - t - 1], axis=1).astype(np.float32),
        terminated=terminated,
        truncated=np.zeros(rows, dtype=bool),
        discount=np.full(rows, 0.9, dtype=np.float32),
        env_id=env_id,
    )


def source_ids(num_envs: int) -> np.ndarray:
    ids = np.arange(num_envs, dtype=np.int64)
    ids.flags.writeable = False  # a source's env_id array: what the lockstep path recognises
    return ids


def in_lockstep(ids: np.ndarray | None = None) -> tuple[Windows, np.ndarray]:
    windows, ids = Windows(3, 0.9), source_ids(4) if ids is None else ids
    for t in range(4):
        windows.fold(steps(ids, t), one_row_per_env=True)
    assert windows._lock_phase is not None and windows._quiet >= 2  # the next full step takes the lockstep path
    return windows, ids


def held_slots(windows: Windows | dict[str, object]) -> np.ndarray:
    """The ring rows the windows hold (a fold writes only into the others, which a restore need not undo)."""
    state = vars(windows) if isinstance(windows, Windows) else windows
    head, length, n = state["_head"], state["_length"], state["n"]
    pairs = enumerate(zip(head, length, strict=True))
    return np.array([e * n + (h - k + j) % n for e, (h, k) in pairs for j in range(k)], dtype=np.int64)


def assert_same(restored: Windows, saved: dict[str, object]) -> None:
    assert set(vars(restored)) == set(saved)
    held = held_slots(saved)
    np.testing.assert_array_equal(held_slots(restored), held)
    for name, value in saved.items():
        if name in FOUND_AGAIN:
            continue
        got = vars(restored)[name]
        if name == "_window":
            assert value.keys() == got.keys(), name
            for key in value:
                np.testing.assert_array_equal(got[key][held], value[key][held], err_msg=f"{name}[{key}]")
        elif name == "_next_obs":
            np.testing.assert_array_equal(got[held], value[held], err_msg=name)
        else:
            np.testing.assert_array_equal(got, value, err_msg=name)


FOLDS = {
    "lockstep": lambda ids: (steps(ids, 4), True),
    "an episode end": lambda ids: (steps(ids, 4, ended=(1, 2)), True),
    "growth to more envs": lambda ids: (steps(np.arange(9, dtype=np.int64), 4), False),
    "several steps of one env": lambda ids: (
        TransitionBatch.concat([steps(ids[:2].copy(), 4), steps(ids[:2].copy(), 5, ended=(0,))]),
        False,
    ),
}


@pytest.mark.parametrize("fold", list(FOLDS))
def test_a_restore_after_a_fold_puts_back_every_attribute(fold: str) -> None:
    windows, ids = in_lockstep()
    saved = copy.deepcopy(vars(windows))
    snapshot = windows.snapshot()
    batch, one_row_per_env = FOLDS[fold](ids)
    windows.fold(batch, one_row_per_env)
    windows.restore(snapshot)
    assert_same(windows, saved)


@pytest.mark.parametrize("fold", list(FOLDS))
def test_after_a_restore_the_same_steps_give_the_rows_of_an_uncut_run(fold: str) -> None:
    cut, ids = in_lockstep()
    uncut, _ = in_lockstep(ids)  # the same env_id array: the lockstep path knows a source's batch by identity
    batch, one_row_per_env = FOLDS[fold](ids)
    snapshot = cut.snapshot()
    cut.fold(batch, one_row_per_env)
    cut.restore(snapshot)
    for t, (b, one) in enumerate([(batch, one_row_per_env), *((steps(ids, 6 + k), True) for k in range(5))]):
        got, want = cut.fold(b, one), uncut.fold(b, one)
        assert (got is None) == (want is None), t
        if want is not None:
            for name in want.keys():
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"step {t}: {name}")
    # the lockstep phase is found again wherever the uncut run has it
    assert (cut._lock_phase is None) == (uncut._lock_phase is None)
    assert fold != "lockstep" or cut._lock_phase is not None

"""Replay buffer checkpoints kept as a file, to prove that states saved before the composed buffers still load.

``python tests/support/replay_checkpoint.py`` writes ``tests/support/data/replay_states_v1.pt``: for each
buffer of :data:`BUILDERS` (prioritized, sequence windows uniform and prioritized, hindsight, uniform without
replacement), its ``state_dict`` after a deterministic fill that wraps the ring and updates priorities, and
what it sampled right after the save (``expected``). The file in the repository was written by the code of
commit 4448689 (the buffers as subclasses of ``IndexedReplayBuffer``, the draw strategy's entries at the top
level of the state, format 1); ``tests/unit/test_replay_checkpoint.py`` loads it into today's code and
compares the samples.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ptl_rl import HERReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer, SequenceReplayBuffer, TransitionBatch

DATA = Path(__file__).resolve().parent / "data" / "replay_states_v1.pt"
CAPACITY, SAMPLE = 24, 6


def rows(start: int, count: int, num_envs: int = 3) -> TransitionBatch:
    """``count`` steps numbered from ``start``, envs in turn; every 4th step of an env ends its episode."""
    ids = np.arange(start, start + count)
    env = ids % num_envs
    goals = np.stack([ids, -ids], 1).astype(np.float32)
    return TransitionBatch(
        obs={"achieved_goal": goals, "desired_goal": goals + 1, "state": ids[:, None].astype(np.float32)},
        action=ids.astype(np.int64),
        reward=ids.astype(np.float32) / 10,
        next_obs={"achieved_goal": goals + 1, "desired_goal": goals + 1, "state": ids[:, None].astype(np.float32)},
        terminated=(ids // num_envs) % 4 == 3,
        truncated=np.zeros(count, dtype=bool),
        discount=np.full(count, 0.9, dtype=np.float32),
        env_id=env.astype(np.int64),
    )


def reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    """0 where the goal is reached, else -1 (float32 [R])."""
    return ((achieved == desired).all(-1) - 1.0).astype(np.float32)


#: name -> (build, whether it takes priorities): the buffers whose states the file holds
BUILDERS: dict[str, tuple[Callable[[], Any], bool]] = {
    "prioritized": (lambda: PrioritizedReplayBuffer(None, CAPACITY, alpha=0.7, beta=0.5, warmup=0, seed=1), True),
    "sequence": (lambda: SequenceReplayBuffer(None, CAPACITY, length=3, burn_in=1, warmup=0, seed=2), False),
    "sequence_prioritized": (
        lambda: SequenceReplayBuffer(None, CAPACITY, length=2, pad_end=True, prioritized=True, warmup=0, seed=3),
        True,
    ),
    "her": (lambda: HERReplayBuffer(None, CAPACITY, compute_reward=reward, strategy="future", warmup=0, seed=4), False),
    "uniform_passes": (lambda: ReplayBuffer(None, CAPACITY, warmup=0, replacement=False, seed=5), False),
}


def fill(buffer: Any, prioritized: bool) -> None:
    """Three adds that wrap the ring, a sample (and a priority update) in between."""
    rng = np.random.default_rng(0)
    for start, count in ((0, 15), (15, 12), (27, 9)):
        buffer.add(rows(start, count))
        batch = buffer.sample(4)
        if prioritized:
            batch.update_priorities(rng.standard_normal(len(batch)))


def as_torch(batch: TransitionBatch) -> dict[str, Any]:
    def leaf(x: Any) -> Any:
        return {k: leaf(v) for k, v in x.items()} if isinstance(x, dict) else torch.from_numpy(np.array(x))

    return {k: leaf(v) for k, v in batch.items()}


def write(path: Path = DATA) -> None:
    saved = {}
    for name, (build, prioritized) in BUILDERS.items():
        buffer = build()
        fill(buffer, prioritized)
        state = buffer.state_dict()
        saved[name] = {"state": state, "expected": as_torch(buffer.sample(SAMPLE))}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, path)


if __name__ == "__main__":
    write()
    print(f"wrote {DATA} ({DATA.stat().st_size} bytes)")

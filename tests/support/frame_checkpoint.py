"""A small FrameStorage checkpoint kept as a file, to prove that older saves still load.

``python tests/support/frame_checkpoint.py`` writes ``tests/support/data/frame_storage_v1.pt``: the
``state_dict`` of two ``ReplayBuffer``s over a ``FrameStorage`` (array observations, and Dict
observations with a frame key), filled by a deterministic stream that wraps the ring, ends episodes and
restarts stacks, plus what the buffer sampled right after the save (``expected``). The file in the
repository was written by the code of commit 7044503 (``frames.py`` as one module, before issue #22's
split); ``tests/unit/test_frame_checkpoint.py`` loads it into today's code and compares the samples.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ptl_rl import FrameStorage, NStepTransform, ReplayBuffer, TransitionBatch

DATA = Path(__file__).resolve().parent / "data" / "frame_storage_v1.pt"
NUM_ENVS, STACK, SIDE, N_STEP, CAPACITY, EXTRA, SAMPLE = 3, 3, 4, 2, 24, 16, 8


def make_storage(dict_obs: bool) -> Any:
    """The storage factory both the writer and the test use (the same capacity, pool and layout)."""
    return functools.partial(
        FrameStorage,
        stack_axis=0,
        n_step=N_STEP,
        extra_frames=EXTRA,
        check=True,
        frame_key="pixels" if dict_obs else None,
    )


def stream(steps: int, dict_obs: bool, seed: int = 0) -> list[TransitionBatch]:
    """``steps`` 1-step vector steps of frame stacks that shift by one frame, episodes ending at random.

    (An ``NStepTransform`` makes them ``N_STEP``-step transitions.)
    """
    rng = np.random.default_rng(seed)
    new = lambda count: rng.integers(0, 256, (count, SIDE, SIDE), dtype=np.uint8)  # noqa: E731
    stacks = np.repeat(new(NUM_ENVS)[:, None], STACK, axis=1)
    batches = []
    for _ in range(steps):
        nxt = np.concatenate([stacks[:, 1:], new(NUM_ENVS)[:, None]], axis=1)
        end = rng.random(NUM_ENVS) < 0.15
        trunc = end & (rng.random(NUM_ENVS) < 0.5)
        obs, next_obs = stacks, nxt
        if dict_obs:
            speed = rng.standard_normal((NUM_ENVS, 2)).astype(np.float32)
            obs = {"pixels": stacks, "speed": speed}
            next_obs = {"pixels": nxt, "speed": speed + 1}
        batches.append(
            TransitionBatch(
                obs=obs,
                action=rng.integers(0, 4, NUM_ENVS),
                reward=rng.standard_normal(NUM_ENVS).astype(np.float32),
                next_obs=next_obs,
                terminated=end & ~trunc,
                truncated=trunc,
                env_id=np.arange(NUM_ENVS),
            )
        )
        stacks = nxt.copy()
        if end.any():  # "reset" padding: a new episode repeats its first frame
            stacks[end] = np.repeat(new(int(end.sum()))[:, None], STACK, axis=1)
    return batches


def _as_torch(batch: TransitionBatch) -> dict[str, Any]:
    def leaf(x: Any) -> Any:
        return {k: leaf(v) for k, v in x.items()} if isinstance(x, dict) else torch.from_numpy(np.array(x))

    return {k: leaf(v) for k, v in batch.items()}


def write(path: Path = DATA) -> None:
    """Fill both buffers (the ring wraps twice), save their state and what they sample next."""
    saved = {}
    for name, dict_obs in (("array", False), ("dict", True)):
        buffer = ReplayBuffer(None, CAPACITY, seed=3, storage=make_storage(dict_obs))
        nstep = NStepTransform(iter(stream(24, dict_obs)), n=N_STEP, gamma=0.9)
        for _ in range(20):
            buffer.add(next(nstep))
        state = buffer.state_dict()
        saved[name] = {"state": state, "expected": _as_torch(buffer.sample(SAMPLE))}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, path)


if __name__ == "__main__":
    write()
    print(f"wrote {DATA} ({DATA.stat().st_size} bytes)")

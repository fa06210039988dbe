"""Bytes on the wire per Atari-shaped transition written to replay shards: full rows against each frame once.

A collector writing pixel rows to ``ReplayShards`` sends, per shard, either
the rows whole (``obs`` and ``next_obs``, each a stack of 4 frames: ~8 frames
a transition) or a ``FrameMessage`` of the frames the shard's channel has not
had yet plus each stack's frame numbers (``ptl_rl/distributed/frame_wire.py``).
Both are measured as what Ray ships, the pickled size of each shard's call
argument (``pickle`` protocol 5), over the same stream:

* synthetic 84x84 uint8 frames (random bytes: no frame repeats by chance),
  stacked 4 by gymnasium's ``FrameStackObservation``, in a ``SyncVectorEnv``
  of ``--envs`` envs (autoreset, episodes ending at random, 1 in 200 steps,
  or truncated at 500 steps) through ``ExperienceSource`` and
  ``NStepTransform(n)``, as a ``RayWorkers`` worker builds its rows;
* each vector step's rows split by ``env_id % K`` into one call per shard,
  ``--steps-per-add`` vector steps per add.

Every message is decoded as the shard decodes it and compared with the full
rows, byte for byte. Bytes are deterministic (seeded), so one run is the
record; it appends one to ``benchmarks/results/shard_wire.json``
(``_records.py``).

    python benchmarks/shard_wire.py [--envs 8] [--steps 2000]
    python benchmarks/shard_wire.py --table
"""

from __future__ import annotations

import argparse
import pickle
from typing import Any

import _records
import gymnasium as gym
import numpy as np
from gymnasium import spaces

import ptl_rl
from ptl_rl.distributed.frame_wire import FrameDecoder, FrameEncoder
from ptl_rl.distributed.shard_writer import split_by_shard

SIDE = 84
FRAME_BYTES = SIDE * SIDE
STACK = 4
CONFIGS = {  # name: (n-step n, shards K)
    "n1_k1": (1, 1),
    "n3_k1": (3, 1),
    "n3_k4": (3, 4),
}


class NoiseFrames(gym.Env):
    """84x84 uint8 frames of random bytes; an episode ends at random (1 in 200 steps)."""

    observation_space = spaces.Box(0, 255, shape=(SIDE, SIDE), dtype=np.uint8)
    action_space = spaces.Discrete(4)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return self._frame(), 1.0, bool(self.np_random.random() < 1 / 200), False, {}

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, size=(SIDE, SIDE), dtype=np.uint8)


def atari_shaped(envs: int, n: int, seed: int) -> ptl_rl.NStepTransform:
    def make() -> gym.Env:
        return gym.wrappers.FrameStackObservation(gym.wrappers.TimeLimit(NoiseFrames(), 500), STACK)

    env = gym.vector.SyncVectorEnv([make for _ in range(envs)])
    rng = np.random.default_rng(seed)
    source = ptl_rl.ExperienceSource(env, lambda obs: rng.integers(0, 4, len(obs)), seed=seed)
    return ptl_rl.NStepTransform(source, n=n, gamma=0.99)


def measure(envs: int, steps: int, steps_per_add: int, n: int, shards: int, window: int, seed: int) -> dict:
    """Bytes per transition of full rows and of frame messages over one stream (and the check that they agree)."""
    stream = iter(atari_shaped(envs, n, seed))
    encoders = [FrameEncoder(1, 0, window) for _ in range(shards)]
    decoders = [FrameDecoder() for _ in range(shards)]
    full = dedup = rows = frames = 0
    for _ in range(steps // steps_per_add):
        batch = ptl_rl.TransitionBatch.concat([next(stream) for _ in range(steps_per_add)])
        for shard, part in split_by_shard(batch, shards):
            message = encoders[shard].encode(part)
            rebuilt = decoders[shard].decode(message)
            assert rebuilt is not None and all(np.array_equal(rebuilt[k], part[k]) for k in part.keys())
            full += len(pickle.dumps(part, protocol=5))
            dedup += len(pickle.dumps(message, protocol=5))
            rows, frames = rows + len(part), frames + len(message.frames)
    return {
        "transitions": rows,
        "full_bytes": full / rows,
        "dedup_bytes": dedup / rows,
        "frames_sent": frames / rows,
        "dedup_per_frame": dedup / rows / FRAME_BYTES,
        "full_per_dedup": full / dedup,
    }


def table(records: list[dict]) -> str:
    cell, out = _records.cell, []
    for name, (n, shards) in CONFIGS.items():
        held = _records.having(records, name)
        if not held:
            continue
        envs = {r["config"]["envs"] for r in held}
        out.append([
            f"{'/'.join(map(str, sorted(envs)))} envs, n = {n}, {shards} shard{'s' if shards > 1 else ''}",
            cell(held, (name, "full_bytes"), "{:,.0f}"),
            cell(held, (name, "dedup_bytes"), "{:,.0f}"),
            cell(held, (name, "frames_sent"), "{:.3f}"),
            cell(held, (name, "dedup_per_frame"), "{:.3f}"),
            cell(held, (name, "full_per_dedup"), "{:.2f}"),
            _records.runs(held),
        ])  # fmt: skip
    return _records.rst_table(
        [
            "84x84x4 uint8 rows to shards",
            "full rows, B/transition",
            "each frame once, B/transition",
            "frames sent/transition",
            "once / one frame (7,056 B)",
            "full / once",
            "run (UTC)",
        ],
        out,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000, help="vector steps per configuration")
    parser.add_argument("--steps-per-add", type=int, default=1, help="vector steps per writer add")
    parser.add_argument("--window", type=int, default=256, help="frames each side keeps per channel")
    parser.add_argument("--seed", type=int, default=0)
    _records.add_options(parser, "shard_wire")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("shard_wire", args, args.results)
    medians = {}
    for name, (n, shards) in CONFIGS.items():
        medians[name] = measure(args.envs, args.steps, args.steps_per_add, n, shards, args.window, args.seed)
        print(name, {k: round(v, 3) for k, v in medians[name].items()})
    run.save(medians, {name: [value] for name, value in medians.items()})


if __name__ == "__main__":
    main()

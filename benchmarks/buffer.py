"""Replay throughput: ReplayBuffer + BatchSampler path vs a bare preallocated numpy ring buffer.

Both store CartPole-shaped 3-step transitions (obs/next_obs float32 [4],
action int64, reward/discount float32, terminated/truncated bool, env_id int64).
Measured: add in chunks of 8 rows (one vector step of 8 envs), and uniform
sampling of 256 rows converted to torch tensors. The bare ring gathers with
``v[idx]``, the usual idiom; a second bare variant gathers with
``ndarray.take`` (what ptl_rl does) and is printed too, for a fair limit. Prints operations/s of each
and the ratios of the medians (goals: add >= 0.9, sample >= 1.0); each repeat
interleaves all of them. Rates use the process's CPU time (single-threaded:
torch uses one thread), so other load on the machine skews the ratio less.
Each run appends a record (date, commit, load, machine, arguments, medians,
every repeat: ``_records.py``) to ``benchmarks/results/buffer.json``.

    python benchmarks/buffer.py [--capacity 100000] [--ops 20000] [--repeats 5]
    python benchmarks/buffer.py --table      # the docs' table, from the records
"""

from __future__ import annotations

import argparse
import time

import _records
import numpy as np
import torch

import ptl_rl

FIELDS = {  # name: (trailing shape, dtype)
    "obs": ((4,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((4,), np.float32),
    "terminated": ((), np.bool_),
    "truncated": ((), np.bool_),
    "discount": ((), np.float32),
    "env_id": ((), np.int64),
}


class BareRing:
    """The hand-written limit: one preallocated array per field, slice writes, fancy-index reads."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.cursor, self.size = capacity, 0, 0
        self.data = {k: np.zeros((capacity, *shape), dtype=dt) for k, (shape, dt) in FIELDS.items()}
        self.rng = np.random.default_rng(0)

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        n, c = len(chunk["reward"]), self.cursor
        if c + n <= self.capacity:
            for k, v in chunk.items():
                self.data[k][c : c + n] = v
        else:
            first = self.capacity - c
            for k, v in chunk.items():
                self.data[k][c:] = v[:first]
                self.data[k][: n - first] = v[first:]
        self.cursor = (c + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        idx = self.rng.integers(0, self.size, batch_size)
        return {k: torch.from_numpy(v[idx]) for k, v in self.data.items()}

    def sample_take(self, batch_size: int) -> dict[str, torch.Tensor]:
        """The same with ndarray.take, several times faster than v[idx] on 2-D fields."""
        idx = self.rng.integers(0, self.size, batch_size)
        return {k: torch.from_numpy(v.take(idx, axis=0)) for k, v in self.data.items()}


def make_chunks(count: int, rows: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [
        {
            k: rng.random((rows, *shape)).astype(dt) if dt != np.bool_ else rng.random(rows) < 0.05
            for k, (shape, dt) in FIELDS.items()
        }
        for _ in range(count)
    ]


def rate(fn, ops: int) -> float:
    start = time.process_time()
    for _ in range(ops):
        fn()
    return ops / (time.process_time() - start)


def measure(capacity: int, ops: int) -> dict[str, float]:
    chunks = make_chunks(256, 8)
    batches = [ptl_rl.TransitionBatch(c) for c in chunks]
    bare, ours = BareRing(capacity), ptl_rl.ReplayBuffer(None, capacity, warmup=0, seed=0)
    sampler = ptl_rl.BatchSampler(iter(lambda: ours, None), batch_size=256)
    for i in range(capacity // 8):  # fill both so sampling reads the whole capacity
        bare.add(chunks[i % 256])
        ours.add(batches[i % 256])
    it = iter(range(10**12))
    return {
        "bare_add": rate(lambda: bare.add(chunks[next(it) % 256]), ops),
        "ours_add": rate(lambda: ours.add(batches[next(it) % 256]), ops),
        "bare_sample": rate(lambda: bare.sample(256), ops),
        "bare_take_sample": rate(lambda: bare.sample_take(256), ops),
        "ours_sample": rate(lambda: next(sampler), ops),
    }


ROWS = {  # the docs' rows: (label, limit, ptl_rl, goal)
    "add": ("add 8 rows (one vector step of 8 envs)", "bare_add", "ours_add", ">= 0.9"),
    "sample": ("sample 256 to torch, limit gathers with ``v[idx]``", "bare_sample", "ours_sample", ">= 1.0"),
    "sample_take": ("sample 256 to torch, limit gathers with ``take``", "bare_take_sample", "ours_sample", "-"),
}


def table(records: list[dict]) -> str:
    """The docs' table: operations/s of the bare ring and of ptl_rl, and their ratio, from the records."""
    rows = []
    for key, (label, limit, ours, goal) in ROWS.items():
        held = _records.having(records, key)
        if held:
            cell = _records.cell
            rows.append([
                label, cell(held, limit, "{:,.0f}"), cell(held, ours, "{:,.0f}"), cell(held, (key, "ratio"), "{:.2f}"),
                goal, _records.runs(held),
            ])  # fmt: skip
    slots = "/".join(sorted({f"{r['config']['capacity']:,}" for r in records}))
    header = [f"CartPole-shaped rows, {slots} slots (ops/s)", "bare ring", "ptl_rl", "ratio", "goal", "run (UTC)"]
    return _records.rst_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    _records.add_options(parser, "buffer")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("buffer", args, args.results)
    runs = [measure(args.capacity, args.ops) for _ in range(args.repeats)]  # each run interleaves bare and ours
    best = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}  # the median of each
    medians: dict = dict(best)
    for key, (_, limit, ours, _) in ROWS.items():
        medians[key] = {"ratio": best[ours] / best[limit]}
    print(
        f"add 8 rows      : bare {best['bare_add']:9.0f}/s  ptl_rl {best['ours_add']:9.0f}/s  "
        f"ratio {medians['add']['ratio']:.3f} (goal >= 0.9)"
    )
    print(
        f"sample 256->torch: bare {best['bare_sample']:9.0f}/s  ptl_rl {best['ours_sample']:9.0f}/s  "
        f"ratio {medians['sample']['ratio']:.3f} (goal >= 1.0)"
    )
    print(
        f"  vs a bare ring that gathers with ndarray.take: {best['bare_take_sample']:9.0f}/s  "
        f"ratio {medians['sample_take']['ratio']:.3f}"
    )
    run.save(medians, {k: [r[k] for r in runs] for k in runs[0]})


if __name__ == "__main__":
    main()

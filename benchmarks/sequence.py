"""Sequence sampling: time per batch of B=32 windows of L=80 steps, at 100k and at 1M stored steps.

The buffer holds CartPole-shaped steps of an 8-env vector env (interleaved in
the ring, episodes of random length, a 16-float recurrent state per step as an
agent extra), filled past capacity so that the ring has wrapped. Reported per
size: uniform and prioritized windows, with and without a burn-in of 40, and
the hand-written limit: a bare numpy gather of 32 contiguous windows of 80
rows of one env's arrays (no episodes, no envs, no padding). The per-batch
time should not grow with the buffer size: the ratio 1M / 100k is printed.
Also reported: the cost of adding one vector step (8 rows) with its links.
Times are the CPU time of this process per call, the median of ``--rounds``
rounds of ``--calls`` calls. Each run appends a record (date, commit, load,
machine, arguments, medians, every round: ``_records.py``) to
``benchmarks/results/sequence.json``.

    python benchmarks/sequence.py [--batch 32] [--length 80] [--sizes 100000 1000000]
    python benchmarks/sequence.py --table      # the docs' table, from the records
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import _records
import numpy as np

from ptl_rl import SequenceReplayBuffer, TransitionBatch

NUM_ENVS = 8


def vector_env_steps(steps: int, rng: np.random.Generator) -> TransitionBatch:
    """``steps`` vector steps of ``NUM_ENVS`` envs (rows in time order), episodes ending with probability 1/200."""
    n = steps * NUM_ENVS
    done = rng.random(n) < 1 / 200
    return TransitionBatch(
        obs=rng.standard_normal((n, 4)).astype(np.float32),
        action=rng.integers(0, 2, n).astype(np.int64),
        reward=np.ones(n, dtype=np.float32),
        next_obs=rng.standard_normal((n, 4)).astype(np.float32),
        terminated=done,
        truncated=np.zeros(n, dtype=bool),
        discount=np.full(n, 0.99, dtype=np.float32),
        env_id=np.tile(np.arange(NUM_ENVS, dtype=np.int64), steps),
        hidden=rng.standard_normal((n, 16), dtype=np.float32),
    )


def filled(size: int, length: int, burn_in: int, prioritized: bool) -> SequenceReplayBuffer:
    rng = np.random.default_rng(0)
    buffer = SequenceReplayBuffer(
        capacity=size, length=length, burn_in=burn_in, prioritized=prioritized, warmup=0, seed=0
    )
    while buffer.storage.total_added < int(size * 1.1):  # wrap around once
        buffer.add(vector_env_steps(1000, rng))
    if prioritized:
        starts = np.flatnonzero(buffer.draws.tree.leaves > 0)
        buffer.update_priorities(starts, rng.exponential(size=len(starts)))
    return buffer


def bare_numpy_windows(size: int, batch: int, length: int) -> Callable[[], None]:
    """The limit: windows of consecutive rows of a single env's arrays, no bookkeeping at all."""
    rng = np.random.default_rng(0)
    fields = {
        "obs": rng.standard_normal((size, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size),
        "reward": np.ones(size, dtype=np.float32),
        "next_obs": rng.standard_normal((size, 4)).astype(np.float32),
        "terminated": np.zeros(size, dtype=bool),
        "truncated": np.zeros(size, dtype=bool),
        "discount": np.ones(size, dtype=np.float32),
        "env_id": np.zeros(size, dtype=np.int64),
        "hidden": rng.standard_normal((size, 16)).astype(np.float32),
    }
    offsets = np.arange(length)

    def sample() -> None:
        rows = rng.integers(0, size - length, batch)[:, None] + offsets
        _ = {name: value.take(rows, axis=0) for name, value in fields.items()}

    return sample


ROUNDS: dict[str, list[float]] = {}  # every round's CPU us per call, by measurement: the record's "repeats"


def per_call(step: Callable[[], None], calls: int, rounds: int, key: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds per call, each the median of ``rounds`` rounds; the CPU of each round kept under ``key``."""
    wall, cpu = [], []
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        for _ in range(calls):
            step()
        wall.append((time.perf_counter() - w) / calls)
        cpu.append((time.process_time() - c) / calls)
    if key is not None:
        ROUNDS[key] = [x * 1e6 for x in cpu]
    return statistics.median(wall), statistics.median(cpu)


def components(buffer: SequenceReplayBuffer, batch: int, calls: int, rounds: int) -> tuple[float, float, float]:
    """CPU seconds of the three parts of a sample: the tree draw (O(log N)), the link hops for fixed
    starts (O(B (burn_in + L))) and the gather of fixed windows (O(B (burn_in + L)) rows), the last two
    cache-warm, so that only the work the buffer does is measured, not the memory's latency."""
    windows = buffer.draws  # the strategy: its weighted draws of window starts, and its links
    starts = windows.draws.draw_slots(buffer.rng, batch)[0]
    slots, _ = windows.window_slots(starts)
    draw = per_call(lambda: windows.draws.draw_slots(buffer.rng, batch), calls, rounds)[1]
    hops = per_call(lambda: windows.window_slots(starts), calls, rounds)[1]
    gather = per_call(lambda: buffer.storage.gather(slots), calls, rounds)[1]
    return draw, hops, gather


def short(size: int) -> str:
    """100000 -> 100k, 1000000 -> 1M."""
    return f"{size // 1_000_000}M" if size % 1_000_000 == 0 else f"{size // 1000}k" if size % 1000 == 0 else str(size)


def table(records: list[dict]) -> str:
    """The docs' table: CPU us per batch at each size, the ratio to the bare gather, and 1M / 100k."""
    cell, rows = _records.cell, []
    sizes = sorted({int(size) for r in records for case in r["medians"]["sample"].values() for size in case})
    for case in dict.fromkeys(case for r in records for case in r["medians"]["sample"]):
        held = _records.having(records, "sample", case)
        cells = []
        for size in map(str, sizes):
            us, times = cell(held, ("sample", case, size, "cpu_us"), "{:.0f}"), ""
            if case != "bare numpy":
                times = f" ({cell(held, ('sample', case, size, 'x_bare'), '{:.1f}')}x)"
            cells.append(us + times)
        growth = cell(held, ("growth", case), "{:.2f}") if len(sizes) > 1 else "-"
        rows.append([case, *cells, growth, _records.runs(held)])
    held = _records.having(records, "add_us")
    if held:  # measured at the smallest size
        add = cell(held, "add_us", "{:.0f}")
        rows.append(["add one vector step (8 rows)", add, *(["-"] * len(sizes)), _records.runs(held)])
    first = records[0]["config"] if records else {"batch": 32, "length": 80}
    header = [
        f"{first['batch']} windows of {first['length']} steps",
        *(f"{size:,} stored: CPU us (x bare)" for size in sizes),
        f"{short(sizes[-1])} / {short(sizes[0])}" if len(sizes) > 1 else "-",
        "run (UTC)",
    ]
    return _records.rst_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=80)
    parser.add_argument("--burn-in", type=int, default=40)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    _records.add_options(parser, "sequence")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("sequence", args, args.results)

    cases = [
        ("uniform", 0, False),
        (f"uniform, burn-in {args.burn_in}", args.burn_in, False),
        ("prioritized", 0, True),
        (f"prioritized, burn-in {args.burn_in}", args.burn_in, True),
    ]
    results: dict[str, dict[int, float]] = {}
    medians: dict[str, dict[str, dict[str, float]]] = {}
    parts: dict[int, tuple[float, float, float]] = {}
    print(f"sequence sampling: B={args.batch}, L={args.length}, {NUM_ENVS} interleaved envs, median of {args.rounds}")
    print(f"{'case':<28}{'stored':>10}{'wall us':>10}{'cpu us':>10}{'x bare numpy':>14}")
    for size in args.sizes:
        _, bare = per_call(
            bare_numpy_windows(size, args.batch, args.length), args.calls, args.rounds, f"bare numpy {size}"
        )
        results.setdefault("bare numpy", {})[size] = bare
        medians.setdefault("bare numpy", {})[str(size)] = {"cpu_us": bare * 1e6, "x_bare": 1.0}
        print(f"{'bare numpy (limit)':<28}{size:>10,}{'':>10}{bare * 1e6:>10.1f}{1.0:>13.2f}x")
        for name, burn_in, prioritized in cases:
            buffer = filled(size, args.length, burn_in, prioritized)
            wall, cpu = per_call(lambda b=buffer: b.sample(args.batch), args.calls, args.rounds, f"{name} {size}")
            results.setdefault(name, {})[size] = cpu
            medians.setdefault(name, {})[str(size)] = {"cpu_us": cpu * 1e6, "wall_us": wall * 1e6, "x_bare": cpu / bare}
            print(f"{name:<28}{size:>10,}{wall * 1e6:>10.1f}{cpu * 1e6:>10.1f}{cpu / bare:>13.2f}x")
            if burn_in and not prioritized:
                parts[size] = components(buffer, args.batch, args.calls, args.rounds)
            del buffer
    if len(args.sizes) > 1:
        small, large = min(args.sizes), max(args.sizes)
        print(f"time per batch at {large:,} / at {small:,} stored steps (CPU time):")
        for name, by_size in results.items():
            print(f"  {name:<28}{by_size[large] / by_size[small]:.2f}")
    print(f"parts of a uniform sample with burn-in {args.burn_in} (CPU us; hops and gather cache-warm, fixed windows):")
    print(f"{'stored':>12}{'tree draw':>12}{'link hops':>12}{'gather':>10}")
    for size, (draw, hops, gather) in parts.items():
        print(f"{size:>12,}{draw * 1e6:>12.1f}{hops * 1e6:>12.1f}{gather * 1e6:>10.1f}")

    rng = np.random.default_rng(1)
    buffer = filled(min(args.sizes), args.length, 0, True)
    steps = [vector_env_steps(1, rng) for _ in range(2000)]
    it = iter(steps * 3)
    wall, cpu = per_call(lambda: buffer.add(next(it)), 1000, 5, "add")
    print(f"add one vector step ({NUM_ENVS} rows, links and window starts included): {cpu * 1e6:.1f} us CPU")
    growth = {}
    if len(args.sizes) > 1:
        growth = {name: by_size[max(args.sizes)] / by_size[min(args.sizes)] for name, by_size in results.items()}
    run.save(
        {
            "sample": medians,
            "growth": growth,
            "parts_us": {str(size): dict(zip(("tree_draw", "link_hops", "gather"), (x * 1e6 for x in p), strict=True))
                         for size, p in parts.items()},
            "add_us": cpu * 1e6,
        },
        ROUNDS,
    )  # fmt: skip


if __name__ == "__main__":
    main()

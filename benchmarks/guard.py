"""What the one safety mechanism costs: a step through the guard, a snapshot, a journaled write, against none.

Measured in one process, interleaved repeat by repeat (CPU time; the median
over ``--repeats`` of ``--calls`` calls each), every pair doing the same work
with and without the mechanism (``ptl_rl/core/guard.py``):

* ``step``: ``next()`` of a pass-through ``ptl_rl.Stage`` (its ``step`` pulls
  a prebuilt batch and returns it) against a plain iterator doing the same:
  the guard's record, the stream numbering and the stage's clock.
* ``n-step snapshot``: ``Windows.snapshot()`` of an ``NStepTransform(n=3)``
  holding the windows of 8 CartPole envs (head and length [8] as bytes,
  references to the rest): what every n-step step pays to be undone.
* ``add``: ``ReplayBuffer.add`` of 8 CartPole-shaped 3-step rows (a journaled
  write: the storage's snapshot, the record) against ``ArrayStorage.add`` of
  the same rows, no journal.

A vector step of 8 CartPole envs costs about 100-200 us (``collection.py``),
so the absolute microseconds are the figure to read. Each run appends a
record (``_records.py``) to ``benchmarks/results/guard.json``.

    python benchmarks/guard.py [--calls 20000] [--repeats 7]
    python benchmarks/guard.py --table
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import _records
import numpy as np

import ptl_rl

ROWS = 8


def rows(count: int = ROWS, start: int = 0) -> ptl_rl.TransitionBatch:
    """CartPole-shaped 3-step transitions of ``count`` envs (env ids ``0 .. count - 1``)."""
    return ptl_rl.TransitionBatch(
        obs=np.full((count, 4), start, np.float32),
        action=np.zeros(count, np.int64),
        reward=np.ones(count, np.float32),
        next_obs=np.full((count, 4), start + 1, np.float32),
        terminated=np.zeros(count, bool),
        truncated=np.zeros(count, bool),
        discount=np.full(count, 0.97, np.float32),
        env_id=np.arange(count, dtype=np.int64),
    )


class Forever:
    """An endless upstream of the same batch (no cost of its own worth measuring)."""

    def __init__(self, batch: ptl_rl.TransitionBatch) -> None:
        self.batch = batch

    def __iter__(self) -> Forever:
        return self

    def __next__(self) -> ptl_rl.TransitionBatch:
        return self.batch


class Guarded(ptl_rl.Stage[ptl_rl.TransitionBatch]):
    def step(self) -> ptl_rl.TransitionBatch:
        return self.pull()


class Plain:
    def __init__(self, upstream: Forever) -> None:
        self.upstream = upstream

    def __iter__(self) -> Plain:
        return self

    def __next__(self) -> ptl_rl.TransitionBatch:
        return next(self.upstream)


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return 1e6 * (time.process_time() - start) / calls


def nstep_windows() -> ptl_rl.NStepTransform:
    nstep = ptl_rl.NStepTransform(None, n=3, gamma=0.99)
    for step in range(5):
        nstep.fold(rows(start=step))
    return nstep


def measure(calls: int) -> dict[str, float]:
    batch = rows()
    guarded, plain = Guarded(Forever(batch)), Plain(Forever(batch))
    windows = nstep_windows().windows
    buffer = ptl_rl.ReplayBuffer(None, 100_000)
    storage = ptl_rl.ArrayStorage(100_000)
    buffer.add(batch), storage.add(batch)  # (allocated outside the timing)
    return {
        "step_guarded_us": per_call_us(lambda: next(guarded), calls),
        "step_plain_us": per_call_us(lambda: next(plain), calls),
        "snapshot_us": per_call_us(windows.snapshot, calls),
        "add_journaled_us": per_call_us(lambda: buffer.add(batch), calls),
        "add_plain_us": per_call_us(lambda: storage.add(batch), calls),
    }


LABELS = {
    "step": ("``next()`` of a pass-through stage", "step_guarded_us", "step_plain_us"),
    "snapshot": ("n-step snapshot, 8 envs, n = 3", "snapshot_us", None),
    "add": ("add of 8 rows", "add_journaled_us", "add_plain_us"),
}


def table(records: list[dict]) -> str:
    """The docs' table, from the latest record (the code measured changes between runs: a range over them
    would mix versions; earlier records stay in the file as history)."""
    records = records[-1:]
    rows_, cell = [], _records.cell
    for key, (label, guarded, plain) in LABELS.items():
        held = _records.having(records, guarded)
        if not held:
            continue
        rows_.append([
            label,
            cell(held, guarded, "{:.2f}"),
            cell(held, plain, "{:.2f}") if plain else "-",
            cell(held, f"{key}_extra_us", "{:.2f}") if plain else cell(held, guarded, "{:.2f}"),
            _records.runs(held),
        ])  # fmt: skip
    return _records.rst_table(
        ["what, us per call", "with the guard", "without", "the guard's cost", "run (UTC)"], rows_
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    _records.add_options(parser, "guard")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("guard", args, args.results)
    repeats = [measure(args.calls) for _ in range(args.repeats)]
    medians = {key: statistics.median(r[key] for r in repeats) for key in repeats[0]}
    medians["step_extra_us"] = medians["step_guarded_us"] - medians["step_plain_us"]
    medians["add_extra_us"] = medians["add_journaled_us"] - medians["add_plain_us"]
    for key, value in medians.items():
        print(f"{key:20} {value:8.2f} us")
    run.save(medians, {key: [r[key] for r in repeats] for key in repeats[0]})


if __name__ == "__main__":
    main()

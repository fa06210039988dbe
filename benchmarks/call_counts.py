"""Two checkouts of ptl_rl side by side: the Python work of each operation before a change and after it, counted.

    python benchmarks/call_counts.py --before PATH [--after .]
    python benchmarks/call_counts.py --table

The speed figures of ``before_after.py`` move by 10-40 % between processes on
a shared machine (the same command, run twice). Counts do not: each operation
below runs under ``cProfile`` in a child process on each checkout (that
checkout's package and benchmark helpers, ``PYTHONPATH=<checkout>``, the same
seeds), and the record holds, per operation, the function calls it makes:

* ``python``: calls of Python functions (the interpreter's work per call);
* ``builtin``: calls into C (numpy, torch, builtins): the same number on both
  sides means the same numeric work, whatever the machine did meanwhile.

Operations (the same set-ups as the speed scripts, from the checkout's own
``benchmarks/``): a step of source + 3-step n-step (``collection.py``, 8 and
1 CartPole envs, long and ~10-step episodes), ``ReplayBuffer.add`` of 8 rows
and a ``BatchSampler`` batch of 256 (``buffer.py``), a prioritized sample of
256 + update (``prioritized.py``, numpy and torch), and a gradient step in a
Trainer (``lightning_overhead.py``: manual, automatic, ``batches_per_step=10``;
the calls of a 600-step fit minus those of a 200-step fit, over 400), and
the examples as ``e2e.py`` runs them (DQN with 1 and 8 envs, PPO with 4: the
calls of a 20,000-step run minus those of a 12,000-step run, over 8,000).
Each run appends a record (``_records.py``) to ``benchmarks/results/call_counts.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import pstats
import runpy
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _records


def counted(fn: Callable[[], Any], times: int) -> dict[str, float]:
    """Calls per ``fn()`` (Python functions and calls into C), over ``times`` calls."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(times):
        fn()
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    builtin = sum(calls for (filename, _, _), (_, calls, *_) in stats.items() if filename == "~")
    python = sum(calls for (filename, _, _), (_, calls, *_) in stats.items() if filename != "~")
    return {"python": python / times, "builtin": builtin / times}


def collection_counts() -> dict[str, dict[str, float]]:
    import collection  # noqa: PLC0415  (the checkout's own helper)
    import torch  # noqa: PLC0415

    import ptl_rl  # noqa: PLC0415

    torch.set_num_threads(1)
    out = {}
    for envs in (8, 1):
        for balancing, episodes in ((True, "long episodes"), (False, "~10-step episodes")):
            env, net = collection.make_env(envs), collection.make_net(balancing)
            source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector()), seed=0)
            nstep = ptl_rl.NStepTransform(source, n=3, gamma=0.99)
            for _ in range(200):
                next(nstep)
            steps = source.total_steps
            counts = counted(lambda: next(nstep), 2000)  # noqa: B023  (called here, in this iteration)
            per_env_step = 2000 / (source.total_steps - steps)  # a step of 8 envs is 8 env steps
            out[f"collection, {envs} env{'s' if envs > 1 else ''}, {episodes} (per env step)"] = {
                k: v * per_env_step for k, v in counts.items()
            }
    return out


def replay_counts() -> dict[str, dict[str, float]]:
    import buffer  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import prioritized  # noqa: PLC0415

    import ptl_rl  # noqa: PLC0415

    chunks = [ptl_rl.TransitionBatch(c) for c in buffer.make_chunks(256, 8)]
    ours = ptl_rl.ReplayBuffer(None, 100_000, warmup=0, seed=0)
    for i in range(100_000 // 8):
        ours.add(chunks[i % 256])
    sampler = ptl_rl.BatchSampler(iter(lambda: ours, None), batch_size=256)
    it = iter(range(10**12))
    out = {
        "ReplayBuffer.add, 8 rows": counted(lambda: ours.add(chunks[next(it) % 256]), 2000),
        "BatchSampler, 256 rows to torch": counted(lambda: next(sampler), 500),
    }
    steps = prioritized.make_ptl_rl(100_000, 256, np.random.default_rng(0))
    for variant in ("numpy", "torch"):
        out[f"prioritized sample 256 + update, {variant}"] = counted(steps[variant], 300)
    return out


def lightning_counts() -> dict[str, dict[str, float]]:
    import lightning_overhead  # noqa: PLC0415
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    out = {}
    for name, options in (
        ("manual optimization", {}),
        ("automatic optimization", {"automatic": True}),
        ("batches_per_step=10", {"group": 10}),
    ):
        short = counted(lambda: lightning_overhead.lightning(200, usual=False, **options), 1)  # noqa: B023
        long = counted(lambda: lightning_overhead.lightning(600, usual=False, **options), 1)  # noqa: B023
        out[f"Lightning gradient step, {name}"] = {k: (long[k] - short[k]) / 400 for k in long}
    return out


def example_counts() -> dict[str, dict[str, float]]:
    import e2e  # noqa: PLC0415

    out = {}
    with tempfile.TemporaryDirectory() as runs:
        for workload, label in (("dqn", "DQN, 1 env"), ("dqn-8", "DQN, 8 envs"), ("ppo", "PPO, 4 envs")):
            _, example, envs, extra = e2e.WORKLOADS[workload]
            calls = {}
            for steps in (2_000, SHORT, LONG):  # the first run imports what the others find imported
                command = e2e.ptl_rl_command(example, envs, extra, steps, 1, runs)
                calls[steps] = counted(functools.partial(run_module, command[2], command[3:]), 1)
            out[f"{label} example (per env step)"] = {
                k: (calls[LONG][k] - calls[SHORT][k]) / (LONG - SHORT) for k in calls[LONG]
            }
    return out


SHORT, LONG = 12_000, 20_000  # env steps of the two example runs (DQN learns from 10k)


def run_module(module: str, argv: list[str]) -> None:
    """``python -m module *argv`` in this process, its output discarded."""
    sys.argv = [module, *argv]
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        with contextlib.suppress(SystemExit):
            runpy.run_module(module, run_name="__main__", alter_sys=True)


def count_all() -> dict[str, dict[str, float]]:
    """Every operation's calls, in this process (run on one checkout by :func:`main`)."""
    return {**collection_counts(), **replay_counts(), **lightning_counts(), **example_counts()}


def run_side(tree: Path) -> dict[str, dict[str, float]]:
    environ = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'benchmarks'}"}
    command = [sys.executable, str(Path(__file__).resolve()), "_count"]
    done = subprocess.run(command, cwd=tree, env=environ, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"counting on {tree} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def table(records: list[dict]) -> str:
    """The design record's table: Python calls and calls into C per operation, before and after, and the change."""
    rows = []
    for record in records[-1:]:
        for operation, sides in record["medians"].items():
            before, after = sides["before"], sides["after"]
            rows.append([
                operation, f"{before['python']:,.1f}", f"{after['python']:,.1f}",
                f"{after['python'] / before['python']:.2f}", f"{before['builtin']:,.1f}", f"{after['builtin']:,.1f}",
                f"{after['builtin'] / before['builtin']:.2f}", _records.runs([record]),
            ])  # fmt: skip
    header = ["calls per operation", "Python before", "after", "ratio", "C before", "after", "ratio", "run (UTC)"]
    return _records.rst_table(header, rows)


def main() -> None:
    if sys.argv[1:] == ["_count"]:  # a child, in a checkout: its own helpers before this script's folder
        sys.path.insert(0, str(Path.cwd() / "benchmarks"))
        print(json.dumps(count_all()))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _records.add_checkouts(parser)
    _records.add_options(parser, "call_counts")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    _records.require_before(parser, args)
    config = {"before": str(args.before), "after": str(args.after)}
    run = _records.Run("call_counts", config, args.results)
    sides = {side: run_side(path.resolve()) for side, path in (("before", args.before), ("after", args.after))}
    medians = {op: {side: sides[side][op] for side in sides} for op in sides["after"] if op in sides["before"]}
    for operation, values in medians.items():
        b, a = values["before"], values["after"]
        python, builtin = f"{b['python']:8.1f} -> {a['python']:8.1f}", f"{b['builtin']:8.1f} -> {a['builtin']:8.1f}"
        print(f"{operation:58} python {python}   C {builtin}")
    run.save(medians, sides)


if __name__ == "__main__":
    main()

"""Two checkouts of ptl_rl side by side: each benchmark run on the code before a change and after it, interleaved.

    python benchmarks/before_after.py --before PATH [--after .] [--rounds 3] [--cleanrl PATH] [--only ...]
    python benchmarks/before_after.py --table

``--before`` is a checkout of the earlier code (a ``git worktree`` of the
commit, its compiled modules built with ``setup.py build_ext --inplace``).
Round by round, and in alternating order, every benchmark script below runs
once on each checkout (the checkout's own script and package:
``PYTHONPATH=<checkout>``), each writing its record to a temporary file, so a
change of the machine's load hits both sides alike. Printed per figure: the
median over the rounds before and after, and after / before oriented so that
above 1 is better. The record (``_records.py``) holds every round of both
sides and goes to ``benchmarks/results/before_after.json``.

The figures, each its script's own median over its repeats:

* ``collection.py``: source + 3-step against a raw loop (8 and 1 CartPole envs,
  long and ~10-step episodes), and ``ReplayBuffer.add`` against a bare ring;
* ``buffer.py``: replay add and sample to torch (ops/s);
* ``prioritized.py``: sample(256) + update(256) at 100k, numpy and torch (us);
* ``pixels.py --only insert``: the Atari-shaped insert (steps/s), trusted and
  through ``ReplayBuffer.add``; memory and sampling with ``pixels.py``;
* ``lightning_overhead.py``: a DQN gradient step in a Trainer (steps/s);
* ``e2e.py`` (with ``--cleanrl``): CPU per env step of the DQN (1 and 8 envs)
  and PPO examples.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _records

# (name, script, arguments, [(figure, key path in the record's medians, higher is better)])
SPECS: list[tuple[str, str, list[str], list[tuple[str, str, bool]]]] = [
    (
        "collection",
        "collection.py",
        ["--repeats", "5"],
        [
            ("collection, 8 envs, long episodes (x raw loop)", "8 envs, long episodes.ratio", True),
            ("collection, 8 envs, ~10-step episodes (x raw loop)", "8 envs, ~10-step episodes.ratio", True),
            ("collection, 1 env, long episodes (x raw loop)", "1 env, long episodes.ratio", True),
            ("collection, 1 env, ~10-step episodes (x raw loop)", "1 env, ~10-step episodes.ratio", True),
            ("ReplayBuffer.add, 8 rows (x bare ring)", "add.ratio", True),
        ],
    ),
    (
        "buffer",
        "buffer.py",
        ["--repeats", "5"],
        [
            ("replay add, 8 rows (ops/s)", "ours_add", True),
            ("replay sample 256 to torch (ops/s)", "ours_sample", True),
            ("replay sample 256 to torch (x bare ring)", "sample.ratio", True),
        ],
    ),
    (
        "prioritized",
        "prioritized.py",
        ["--rounds", "5"],
        [
            ("prioritized sample + update, numpy (us)", "numpy.ptl_rl.cpu_us", False),
            ("prioritized sample + update, torch (us)", "torch.ptl_rl.cpu_us", False),
        ],
    ),
    (
        "pixels",
        "pixels.py",
        ["--repeats", "5", "--no-install"],
        [
            ("pixel insert, trusted (steps/s)", "insert.ptl_rl trusted.steps_per_s", True),
            ("pixel insert, ReplayBuffer.add (steps/s)", "insert.buffer.add trusted.steps_per_s", True),
            ("pixel insert, checked (steps/s)", "insert.ptl_rl checked.steps_per_s", True),
            ("pixel sample 256 stacked to torch (batches/s)", "sample.ptl_rl.batches_per_s", True),
            ("pixel memory (bytes per transition)", "memory.ptl_rl FrameStorage.bytes", False),
        ],
    ),
    (
        "lightning",
        "lightning_overhead.py",
        ["--repeats", "3"],
        [
            ("Lightning step, manual optimization (steps/s)", "bare.steps_per_s", True),
            ("Lightning step, automatic optimization (steps/s)", "auto.steps_per_s", True),
            ("Lightning step, batches_per_step=10 (steps/s)", "grouped.steps_per_s", True),
            ("plain PyTorch loop, same pipeline (steps/s)", "plain.steps_per_s", True),
            ("Lightning step, manual optimization (x plain loop)", "bare.vs_plain", True),
            ("Lightning step, automatic optimization (x plain loop)", "auto.vs_plain", True),
            ("Lightning step, batches_per_step=10 (x plain loop)", "grouped.vs_plain", True),
        ],
    ),
    (
        "e2e",
        "e2e.py",
        ["--workloads", "dqn", "dqn-8", "ppo", "--repeats", "1"],
        [
            ("DQN example, 1 env (us per env step)", "dqn.ptl_rl_us", False),
            ("DQN example, 8 envs (us per env step)", "dqn-8.ptl_rl_us", False),
            ("PPO example, 4 envs (us per env step)", "ppo.ptl_rl_us", False),
        ],
    ),
]


def dig(medians: dict[str, Any], path: str) -> float | None:
    """``medians["a"]["b"]`` for the path ``"a.b"`` (keys may hold dots themselves: the longest match first)."""
    if path in medians:
        return float(medians[path])
    head, _, rest = path.partition(".")
    for cut in range(path.count("."), 0, -1):
        head, rest = ".".join(path.split(".")[:cut]), ".".join(path.split(".")[cut:])
        if head in medians and isinstance(medians[head], dict):
            return dig(medians[head], rest)
    return None


HIGHER = {figure: up for *_, figures in SPECS for figure, _, up in figures}  # higher is better, per figure


def run_one(tree: Path, script: str, arguments: Sequence[str], results: Path) -> dict[str, Any]:
    """Run ``tree``'s ``benchmarks/<script>`` on ``tree``'s package; its record's medians."""
    environ = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(tree / "benchmarks" / script), *arguments, "--results", str(results)]
    done = subprocess.run(command, cwd=tree, env=environ, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{script} on {tree} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(results.read_text())[-1]["medians"]


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"


def per_round(record: dict[str, Any], figure: str) -> str:
    """The range of after / before over the rounds (above 1: better), each round's pair run back to back."""
    values = record.get("repeats", {}).get(figure)
    higher = record["medians"][figure].get("higher", HIGHER.get(figure))
    if not values or higher is None:
        return "-"
    pairs = zip(values["before"], values["after"], strict=False)
    ratios = sorted(after / before if higher else before / after for before, after in pairs)
    return f"{ratios[0]:.2f}-{ratios[-1]:.2f}" if len(ratios) > 1 else f"{ratios[0]:.2f}"


def table(records: list[dict]) -> str:
    """The design record's table: each figure before and after, the change (above 1: better), per round too."""
    rows = []
    for record in records[-1:]:
        for figure, values in record["medians"].items():
            rows.append([
                figure, _number(values["before"]), _number(values["after"]), f"{values['better']:.2f}",
                per_round(record, figure), f"{values['rounds']}", _records.runs([record]),
            ])  # fmt: skip
    header = ["figure", "before", "after", "after vs before", "per round", "rounds", "run (UTC)"]
    return _records.rst_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _records.add_checkouts(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cleanrl", type=Path, default=None, help="CleanRL checkout: also run e2e.py")
    parser.add_argument("--only", nargs="+", default=None, choices=[name for name, *_ in SPECS])
    _records.add_options(parser, "before_after")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    _records.require_before(parser, args)
    run = _records.Run("before_after", {**vars(args), "before": str(args.before), "after": str(args.after)},
                       args.results)  # fmt: skip
    specs = [s for s in SPECS if (args.only is None or s[0] in args.only) and (s[0] != "e2e" or args.cleanrl)]
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    rounds: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for k in range(args.rounds):
            for name, script, arguments, figures in specs:
                extra = ["--cleanrl", str(args.cleanrl)] if name == "e2e" else []
                order = ["before", "after"] if k % 2 == 0 else ["after", "before"]
                for side in order:
                    results = Path(scratch) / f"{side}-{name}-{k}.json"
                    medians = run_one(sides[side], script, [*arguments, *extra], results)
                    for figure, path, _ in figures:
                        value = dig(medians, path)
                        if value is not None:
                            rounds.setdefault(figure, {"before": [], "after": []})[side].append(value)
                    print(f"round {k + 1}, {name}, {side}: done", flush=True)
    medians: dict[str, Any] = {}
    higher = {figure: up for *_, figures in specs for figure, _, up in figures}
    for figure, values in rounds.items():
        if not values["before"] or not values["after"]:
            continue
        before, after = statistics.median(values["before"]), statistics.median(values["after"])
        better = after / before if higher[figure] else before / after
        rounds_run = len(values["after"])
        medians[figure] = {
            "before": before,
            "after": after,
            "better": better,
            "rounds": rounds_run,
            "higher": higher[figure],
        }
        print(f"{figure:55} {before:12,.4g} {after:12,.4g} {better:6.2f}")
    run.save(medians, rounds)


if __name__ == "__main__":
    main()

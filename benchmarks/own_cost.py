"""ptl_rl's own cost per operation on two checkouts, paired: the env and the agent replayed from a recording.

    python benchmarks/own_cost.py --before PATH [--after .] [--rounds 25] [--steps 2000]
    python benchmarks/own_cost.py --table

The figures of ``before_after.py`` include the env step and the network (and,
for the examples, Lightning and the optimizer): on this machine their time
swings by 10-40 % between identical runs, more than a change to the pipeline
moves it. This script times only the pipeline's own code, and times the two
checkouts in alternation, so that a slow period of the machine hits both:

* two worker processes, one per checkout (``PYTHONPATH=<checkout>``), each
  running this file's harness, so that only ptl_rl differs between them;
* the collection operations step a *replayed* vector env: the CartPole-v1
  steps (gymnasium ``SyncVectorEnv``, next-step autoreset) that a fresh and a
  balancing 4-64-2 MLP took, recorded once in each worker from the same seeds,
  returned by a stub env at the cost of a few array copies; the agent returns
  the recorded actions. What is left is what ptl_rl adds to a step: the
  source's checks, episode bookkeeping and batches, the n-step fold, the
  guard's transaction, the replay's insert and sampling;
* round by round the parent asks each worker in turn (the order alternating)
  for one repeat of each operation; a figure is the median over the rounds of
  each side's microseconds, and ``before / after`` is the median of the
  per-round quotients (above 1: the later code is cheaper).

Each run appends a record (``_records.py``) to ``benchmarks/results/own_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _records

CONFIG = ("before", "after", "rounds", "processes", "steps")
OPERATIONS = [
    *(
        f"{stages}, {envs}, {episodes} (us per vector step)"
        for envs in ("8 envs", "1 env")
        for episodes in ("~10-step episodes", "long episodes")
        for stages in ("source", "source + n-step(3)")
    ),
    "ReplayBuffer.add, 8 rows (us)",
    "BatchSampler, 256 rows to torch (us)",
    "prioritized sample 256 + update (us)",
]


# ---------------------------------------------------------------------------- the worker: one checkout
def record_steps(num_envs: int, balancing: bool, steps: int) -> tuple[Any, Any, list[Any], list[Any]]:
    """The env, its reset obs, ``steps`` recorded ``env.step`` results and the actions that produced them."""
    import torch  # noqa: PLC0415  (the worker's imports, after PYTHONPATH chose the checkout)
    from collection import make_env, make_net  # noqa: PLC0415  (this script's folder: the same in both workers)

    env, net = make_env(num_envs), make_net(balancing)
    first, _ = env.reset(seed=0)
    obs, results, actions = first, [], []
    with torch.no_grad():
        for _ in range(steps + 64):  # (an n-step call may pull a few steps past the last one timed)
            action = net(torch.as_tensor(obs)).argmax(-1).numpy()
            result = env.step(action)
            actions.append(action)
            results.append(result)
            obs = result[0]
    return env, first, results, actions


def replay_pipeline(recorded: tuple[Any, Any, list[Any], list[Any]], steps: int, nstep: bool) -> float:
    """One repeat: microseconds per vector step of a fresh source (+ n-step) over the recorded steps."""
    import gymnasium as gym  # noqa: PLC0415

    import ptl_rl  # noqa: PLC0415

    env, first, results, actions = recorded

    class ReplayedEnv(gym.vector.VectorEnv):  # type: ignore[misc]  # (gymnasium's generics, not checked here)
        def __init__(self) -> None:
            self.num_envs, self.metadata = env.num_envs, env.metadata
            self.single_observation_space, self.single_action_space = (
                env.single_observation_space,
                env.single_action_space,
            )
            self.observation_space, self.action_space = env.observation_space, env.action_space
            self.step_count = 0

        def reset(self, *, seed: Any = None, options: Any = None) -> tuple[Any, dict]:
            return first.copy(), {}

        def step(self, action: Any) -> tuple[Any, ...]:
            obs, reward, terminated, truncated, _ = results[self.step_count]
            self.step_count += 1
            return obs.copy(), reward.copy(), terminated.copy(), truncated.copy(), {}

    replayed = ReplayedEnv()
    agent = lambda obs: actions[replayed.step_count].copy()  # noqa: E731
    source = ptl_rl.ExperienceSource(replayed, agent, seed=0)
    stage = ptl_rl.NStepTransform(source, n=3, gamma=0.99) if nstep else source
    next(stage)  # the reset: not part of the steady state
    start_step, start = replayed.step_count, time.perf_counter()
    while replayed.step_count < steps:
        next(stage)
    return (time.perf_counter() - start) / (replayed.step_count - start_step) * 1e6


def cartpole_chunk(rows: int, rng: Any) -> Any:
    import numpy as np  # noqa: PLC0415

    import ptl_rl  # noqa: PLC0415

    return ptl_rl.TransitionBatch(
        obs=rng.standard_normal((rows, 4)).astype(np.float32),
        action=rng.integers(0, 2, rows),
        reward=np.ones(rows, np.float32),
        next_obs=rng.standard_normal((rows, 4)).astype(np.float32),
        terminated=rng.random(rows) < 0.05,
        truncated=np.zeros(rows, bool),
        discount=np.full(rows, 0.99**3, np.float32),
        env_id=np.arange(rows, dtype=np.int64),
    )


def timed(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def replay_operations() -> dict[str, Callable[[], float]]:
    import numpy as np  # noqa: PLC0415

    import ptl_rl  # noqa: PLC0415

    rng = np.random.default_rng(0)
    chunks = [cartpole_chunk(8, rng) for _ in range(64)]
    buffer = ptl_rl.ReplayBuffer(None, 100_000, warmup=0, seed=0)
    for i in range(100_000 // 8):
        buffer.add(chunks[i % 64])
    sampler = ptl_rl.BatchSampler(iter(lambda: buffer, None), batch_size=256)
    prioritized = ptl_rl.PrioritizedReplayBuffer(capacity=100_000, alpha=0.6, beta=0.4, warmup=0, seed=0)
    for _ in range(100):
        prioritized.add(cartpole_chunk(1000, rng))
    prioritized.update_priorities(np.arange(100_000), rng.exponential(size=100_000))
    td = np.abs(rng.standard_normal(256))
    count = iter(range(10**12))
    return {
        "ReplayBuffer.add, 8 rows (us)": lambda: timed(lambda: buffer.add(chunks[next(count) % 64]), 2000),
        "BatchSampler, 256 rows to torch (us)": lambda: timed(lambda: next(sampler), 200),
        "prioritized sample 256 + update (us)": lambda: timed(
            lambda: prioritized.sample(256).update_priorities(td), 200
        ),
    }


def worker(steps: int) -> None:
    """Answer the parent: one line per operation name read, the microseconds of one repeat."""
    import torch  # noqa: PLC0415

    import ptl_rl  # noqa: PLC0415

    torch.set_num_threads(1)
    ptl_rl.set_profiling(True)  # the default a user runs with
    operations: dict[str, Callable[[], float]] = {}
    for envs, label in ((8, "8 envs"), (1, "1 env")):
        for balancing, episodes in ((False, "~10-step episodes"), (True, "long episodes")):
            recorded = record_steps(envs, balancing, steps)
            for nstep, stages in ((False, "source"), (True, "source + n-step(3)")):
                name = f"{stages}, {label}, {episodes} (us per vector step)"
                operations[name] = lambda r=recorded, n=nstep: replay_pipeline(r, steps, n)  # type: ignore[misc]
    operations.update(replay_operations())
    print(json.dumps({"ready": sorted(operations), "ptl_rl": ptl_rl.__file__}), flush=True)
    for line in sys.stdin:
        print(json.dumps(operations[line.strip()]()), flush=True)


# ---------------------------------------------------------------------------- the parent: two workers, paired
class Worker:
    """A worker process on one checkout, asked for one repeat of an operation at a time."""

    def __init__(self, tree: Path, steps: int) -> None:
        environ = {**os.environ, "PYTHONPATH": str(tree)}
        command = [sys.executable, str(Path(__file__).resolve()), "_worker", str(steps)]
        self.process = subprocess.Popen(
            command, cwd=tree, env=environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        hello = json.loads(self._line())
        if hello["ready"] != sorted(OPERATIONS):
            raise RuntimeError(f"the worker on {tree} offers {hello['ready']}")
        if not Path(hello["ptl_rl"]).resolve().is_relative_to(tree.resolve()):
            raise RuntimeError(f"the worker on {tree} imported ptl_rl from {hello['ptl_rl']}")

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker ended (exit code {self.process.wait()})")
        return line

    def repeat(self, operation: str) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write(operation + "\n")
        self.process.stdin.flush()
        value: float = json.loads(self._line())
        return value

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def measure(before: Path, after: Path, rounds: int, steps: int, processes: int) -> dict[str, dict[str, list[float]]]:
    """``rounds`` paired rounds, spread over ``processes`` fresh pairs of workers: one process's memory layout
    moves a small operation's time by up to ~9 % (two workers on the same checkout differ that much), so each
    side's figure is taken across several processes."""
    repeats: dict[str, dict[str, list[float]]] = {op: {"before": [], "after": []} for op in OPERATIONS}
    for r in range(rounds):
        if r % -(-rounds // processes) == 0:
            workers = {"before": Worker(before, steps), "after": Worker(after, steps)}
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for operation in OPERATIONS:
            for side in order:
                repeats[operation][side].append(workers[side].repeat(operation))
        if (r + 1) % -(-rounds // processes) == 0 or r + 1 == rounds:
            for w in workers.values():
                w.close()
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return repeats


def summary(repeats: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    out = {}
    for operation, sides in repeats.items():
        ratios = [b / a for b, a in zip(sides["before"], sides["after"], strict=True)]
        out[operation] = {
            "before_us": statistics.median(sides["before"]),
            "after_us": statistics.median(sides["after"]),
            "before_over_after": statistics.median(ratios),
            "rounds_after_cheaper": sum(r > 1 for r in ratios) / len(ratios),
        }
    return out


def table(records: list[dict]) -> str:
    """The design record's tables, from the records: the latest comparison of two checkouts, per operation each
    side's microseconds and before / after; then the latest run of one checkout against itself (the harness's
    resolution: the same code on both sides)."""
    header = ["own cost", "before", "after", "before / after", "rounds after cheaper", "run (UTC)"]
    tables = []
    for same in (False, True):
        chosen = [r for r in records if (r.get("before_commit") == r.get("after_commit")) == same][-1:]
        for record in chosen:
            rows = [
                [
                    operation,
                    f"{m['before_us']:.1f}",
                    f"{m['after_us']:.1f}",
                    f"{m['before_over_after']:.2f}",
                    f"{m['rounds_after_cheaper']:.0%}",
                    _records.runs([record]),
                ]  # fmt: skip
                for operation, m in record["medians"].items()
            ]
            sides = f"{record['before_commit']} on both sides" if same else (
                f"before: {record['before_commit']}, after: {record['after_commit']}"
            )  # fmt: skip
            tables.append(f"{sides}\n\n{_records.rst_table(header, rows)}")
    return "\n\n".join(tables)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "_worker":
        worker(int(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _records.add_checkouts(parser, "checkout of the code before the change (kernels built)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--processes", type=int, default=6, help="fresh worker pairs the rounds are spread over")
    parser.add_argument("--steps", type=int, default=2000, help="vector steps replayed per collection repeat")
    _records.add_options(parser, "own_cost")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    _records.require_before(parser, args)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k in CONFIG}
    run = _records.Run("own_cost", config, args.results)
    repeats = measure(args.before, args.after, args.rounds, args.steps, args.processes)
    medians = summary(repeats)
    for operation, m in medians.items():
        print(
            f"{operation:58s} before {m['before_us']:8.1f}  after {m['after_us']:8.1f}  "
            f"before/after {m['before_over_after']:.2f}  ({m['rounds_after_cheaper']:.0%} of rounds after cheaper)"
        )
    sides = {f"{side}_commit": _records.commit(root=getattr(args, side)) for side in ("before", "after")}
    run.save(medians, repeats, **sides)


if __name__ == "__main__":
    main()

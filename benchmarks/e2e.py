"""End to end: ptl_rl's examples against CleanRL's hand-written loops, same recipe, CPU per env step.

    python benchmarks/e2e.py --cleanrl /path/to/cleanrl [--repeats 3] [--workloads dqn dqn-4 dqn-8 ppo]
    python benchmarks/e2e.py --table      # the docs' table, from benchmarks/results/e2e.json

A user who moves from a hand-written loop to ptl_rl should not pay for it. Each
workload runs CleanRL's single file (``dqn.py``, ``ppo.py``, read from the
checkout given, patched in memory for gymnasium 1.x: see ``cleanrl_files.py``)
and ptl_rl's example (``python -m ptl_rl.examples.dqn`` / ``ppo``, through
Lightning, as a user runs it) with the same recipe:

* ``dqn``: CleanRL's ``dqn.py`` defaults on CartPole-v1: 1 env, 120-84 MLP,
  buffer 10k, batch 128, Adam lr 2.5e-4, one gradient step per 10 env steps
  after 10k, target copy every 500 env steps, 1-step targets (no double DQN),
  epsilon 1 -> 0.05 over half the run, a logged loss every 100 env steps.
  ``dqn-4`` and ``dqn-8`` are ptl_rl's with 4 and 8 envs, same replay ratio
  (CleanRL's file takes one env only), against CleanRL's 1-env cost.
  ``-k10`` adds ``--batches-per-step 10`` (opt-in: ten gradient steps per
  Lightning step, a ``ptl_rl.BatchGroup``) with a log point every Lightning
  step, which keeps CleanRL's logging cadence of one per 100 env steps.
* ``ppo``: CleanRL's ``ppo.py`` defaults on CartPole-v1: 4 envs x 128 steps,
  4 epochs of 4 minibatches, lr 2.5e-4 annealed, gamma 0.99, lambda 0.95,
  clip 0.2 (value clipping too), entropy 0.01, grad norm 0.5, 64-64 tanh.

The cost of a run is the CPU time (user + system) of its process. A workload's
cost per env step is ``(CPU of a --long run - CPU of a --short run) / (long -
short)``: imports, start-up and the final evaluation cancel, and the measured
span is all training (DQN learns from 10k). Both sides run torch on one thread
and log as they do by default (CleanRL: TensorBoard; ptl_rl: TensorBoard when
installed, CSV otherwise); ptl_rl's periodic evaluation is off (CleanRL has
none). Repeats interleave the two sides; the ratio is CleanRL's cost over
ptl_rl's in the same repeat, so above 1 means ptl_rl is faster. Printed and
recorded: the median cost of each side and the median of the per-repeat
ratios (which need not equal the quotient of the two medians), with every
repeat. Each run appends a record (date, commit, load, machine, CleanRL's
commit, arguments, medians, repeats: ``_records.py``) to
``benchmarks/results/e2e.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _records
import cleanrl_files

REPO = Path(__file__).resolve().parents[1]

DQN_RECIPE = [
    "--n-step", "1", "--no-double", "--hidden", "120", "84", "--lr", "2.5e-4", "--batch-size", "128",
    "--buffer-size", "10000", "--learning-starts", "10000", "--target-sync-every", "50", "--train-freq", "10",
    "--gradient-steps", "1", "--gamma", "0.99", "--eps-start", "1", "--eps-end", "0.05", "--log-every", "10",
]  # fmt: skip
PPO_RECIPE = [
    "--recipe", "classic", "--num-envs", "4", "--steps-per-env", "128", "--update-epochs", "4",
    "--num-minibatches", "4", "--gamma", "0.99", "--gae-lambda", "0.95", "--lr", "2.5e-4", "--anneal",
    "--clip-coef", "0.2", "--clip-vloss", "--ent-coef", "0.01", "--vf-coef", "0.5", "--norm-adv", "minibatch",
    "--hidden", "64", "--grad-clip", "0.5", "--no-norm-obs", "--no-norm-reward",
]  # fmt: skip

# K gradient steps per Lightning step (ptl_rl.BatchGroup); logging every Lightning step keeps CleanRL's cadence
GROUPED = ["--batches-per-step", "10", "--log-every", "1"]

# workload: (CleanRL's file, ptl_rl example, ptl_rl's envs, ptl_rl's extra flags)
WORKLOADS = {
    "dqn": ("dqn.py", "dqn", 1, []),
    "dqn-k10": ("dqn.py", "dqn", 1, GROUPED),
    "dqn-4": ("dqn.py", "dqn", 4, []),
    "dqn-8": ("dqn.py", "dqn", 8, []),
    "dqn-8-k10": ("dqn.py", "dqn", 8, GROUPED),
    "ppo": ("ppo.py", "ppo", 4, []),
}
LABELS = {  # the docs' name of each workload
    "dqn": "DQN, 1 env (``dqn.py`` recipe)",
    "dqn-k10": "the same, ``--batches-per-step 10``",
    "dqn-4": "DQN, 4 envs",
    "dqn-8": "DQN, 8 envs",
    "dqn-8-k10": "DQN, 8 envs, ``--batches-per-step 10``",
    "ppo": "PPO, 4 envs (``ppo.py`` recipe)",
}


def ptl_rl_command(example: str, envs: int, extra: list[str], steps: int, seed: int, runs_dir: str) -> list[str]:
    recipe = DQN_RECIPE + ["--eps-decay-steps", str(steps // 2)] if example == "dqn" else PPO_RECIPE
    return [
        sys.executable, "-m", f"ptl_rl.examples.{example}", "--env-id", "CartPole-v1", "--env-steps", str(steps),
        "--seed", str(seed), "--num-envs", str(envs), "--threads", "1", "--no-progress-bar", "--eval-every", "0",
        "--final-eval-episodes", "0", "--runs-dir", runs_dir, *recipe, *extra,
    ]  # fmt: skip


def cpu_of_run(side: str, workload: str, steps: int, seed: int, cleanrl: str, scratch: Path) -> float:
    """CPU seconds of one run of ``side`` (``cleanrl`` or ``ptl_rl``) for ``steps`` env steps."""
    filename, example, envs, extra = WORKLOADS[workload]
    log = scratch / f"{side}_{workload}_{steps}.log"
    if side == "cleanrl":
        overrides = {"env_id": "CartPole-v1", "seed": seed, "total_timesteps": steps}
        cmd = [sys.executable, str(Path(__file__).resolve()), "_cleanrl", cleanrl, filename, json.dumps(overrides)]
        with tempfile.TemporaryDirectory() as cwd:  # CleanRL writes runs/ into its working directory
            code, cpu, _ = cleanrl_files.child(cmd, cwd, log)
    else:
        cmd = ptl_rl_command(example, envs, extra, steps, seed, str(scratch / "runs"))
        code, cpu, _ = cleanrl_files.child(cmd, str(REPO), log)
    if code != 0:
        raise SystemExit(f"{side} {workload} run failed ({code}); see {log}:\n{log.read_text()[-3000:]}")
    return cpu


def cost_us(side: str, workload: str, args: argparse.Namespace, seed: int, scratch: Path) -> float:
    """CPU microseconds per env step between the short and the long run."""
    short = cpu_of_run(side, workload, args.short, seed, args.cleanrl, scratch)
    long = cpu_of_run(side, workload, args.long, seed, args.cleanrl, scratch)
    return (long - short) / (args.long - args.short) * 1e6


def table(records: list[dict]) -> str:
    """The docs' table: per workload, CPU us per env step of both sides and the ratio, from the records."""
    rows = []
    for w, label in LABELS.items():
        held = _records.having(records, w)
        if not held:
            continue
        every_ratio = [x for r in held for x in r["repeats"][w]["ratio"]]
        rows.append([
            label,
            _records.column(held, _records.get(w, "cleanrl_us"), "{:.0f}") + " us",
            _records.column(held, _records.get(w, "ptl_rl_us"), "{:.0f}") + " us",
            f"{_records.column(held, _records.get(w, 'ratio'), '{:.2f}')} ({_records.span(every_ratio)})",
            _records.runs(held),
        ])  # fmt: skip
    header = ["workload (CartPole-v1)", "CleanRL", "ptl_rl", "ratio (repeats)", "run (UTC)"]
    return _records.rst_table(header, rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_cleanrl":  # the child process of a CleanRL run
        cleanrl_files.run_inline(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cleanrl", help="path of a CleanRL checkout (its cleanrl/ and cleanrl_utils/)")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--short", type=int, default=15_000, help="env steps of the short run")
    p.add_argument("--long", type=int, default=45_000, help="env steps of the long run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", default=None, help="keep the logs and run directories here")
    _records.add_options(p, "e2e")
    args = p.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    if not args.cleanrl or not (Path(args.cleanrl) / "cleanrl" / "dqn.py").exists():
        raise SystemExit(f"--cleanrl {args.cleanrl}: no cleanrl/dqn.py there; pass the path of a CleanRL checkout")
    run = _records.Run("e2e", args, args.results, peers=["tensorboard"])
    cleanrl_commit = subprocess.run(
        ["git", "-C", args.cleanrl, "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    costs: dict[tuple[str, str], list[float]] = {}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(args.keep or tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        cleanrl_workloads = {WORKLOADS[w][0] for w in args.workloads}
        for repeat in range(args.repeats):
            seed = args.seed + repeat
            for filename in sorted(cleanrl_workloads):  # CleanRL's arm once per file, then each ptl_rl workload
                workload = next(w for w in WORKLOADS if WORKLOADS[w][0] == filename)
                costs.setdefault(("cleanrl", filename), []).append(cost_us("cleanrl", workload, args, seed, scratch))
                for w in args.workloads:
                    if WORKLOADS[w][0] == filename:
                        costs.setdefault(("ptl_rl", w), []).append(cost_us("ptl_rl", w, args, seed, scratch))
            loads.append(os.getloadavg()[0])
            print(f"repeat {repeat + 1}/{args.repeats} done (load {loads[-1]:.2f})", flush=True)
    print(f"\nCPU us per env step, median of {args.repeats} (runs of {args.short} and {args.long} steps), "
          f"load {min(loads):.1f}-{max(loads):.1f}")  # fmt: skip
    print(f"{'workload':10} {'CleanRL':>10} {'ptl_rl':>10} {'ratio':>8}  (CleanRL / ptl_rl: > 1 is ptl_rl faster)")
    medians, repeats = {}, {}
    for w in args.workloads:
        reference = costs[("cleanrl", WORKLOADS[w][0])]
        ours = costs[("ptl_rl", w)]
        ratios = [r / o for r, o in zip(reference, ours, strict=True)]
        print(f"{w:10} {statistics.median(reference):10.0f} {statistics.median(ours):10.0f} "
              f"{statistics.median(ratios):8.2f}  (repeats: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
        medians[w] = {
            "cleanrl_us": statistics.median(reference), "ptl_rl_us": statistics.median(ours),
            "ratio": statistics.median(ratios),
        }  # fmt: skip
        repeats[w] = {"cleanrl_us": reference, "ptl_rl_us": ours, "ratio": ratios}
    run.save(medians, repeats, cleanrl_commit=cleanrl_commit or None)


if __name__ == "__main__":
    main()

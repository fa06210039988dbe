"""Recurrent PPO on CartPole without velocities, against the same network with its memory cut, over several seeds.

    .venv/bin/python benchmarks/recurrent_ppo_cartpole.py                       # LSTM and feed-forward, seeds 0-2
    .venv/bin/python benchmarks/recurrent_ppo_cartpole.py --arms lstm --seeds 3 4
    .venv/bin/python benchmarks/recurrent_ppo_cartpole.py --table               # the table of the recorded runs

Both arms run ``ptl_rl/examples/recurrent_ppo.py`` with its defaults (the flags are in
each record) on ``CartPoleNoVelocity-v1`` (cart position and pole angle only):
``--core lstm`` and ``--core mlp`` (``--feed-forward``: the LSTM cell replaced
by a ReLU layer of the same width; the same pipeline, rollouts, loss and
budget). Training stops early once a greedy evaluation (20 episodes) reaches
475 and 20 fresh episodes confirm it; the score is the final greedy mean
return over 20 fresh episodes. Each run appends one record to
``benchmarks/results/recurrent_ppo_cartpole.json`` (the run's summary, the commit and
the load average); runs already recorded for the same commit are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ptl_rl
RESULTS = ROOT / "benchmarks" / "results" / "recurrent_ppo_cartpole.json"
KEEP = (
    "final_eval_return",
    "final_eval_return_std",
    "env_steps",
    "episodes",
    "gradient_steps",
    "stopped",
    "solved_at_env_steps",
    "eval_history",
    "confirmations",
    "train_return_last10",
    "wall_time_s",
    "cpu_time_s",
)


def commit() -> str:
    """The checkout's short commit, with ``-dirty`` when tracked files have changes not committed."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=ROOT, capture_output=True, text=True)
    return (out.stdout.strip() or "unknown") + ("-dirty" if dirty.stdout.strip() else "")


def load(path: Path = RESULTS) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def table(records: list[dict]) -> str:
    """Final greedy returns per (arm, env steps): every seed, the seeds that reached 475, and the mean."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["config"]["core"], r["config"]["env_steps"]), []).append(r)
    lines = [f"{'core':<5}  {'budget':>8}  {'seeds':<7}  {'final return per seed':<26}  solved  mean    cpu s/run"]
    for (core, steps), runs in sorted(groups.items()):
        runs = sorted(runs, key=lambda r: r["config"]["seed"])
        seeds = ",".join(str(r["config"]["seed"]) for r in runs)
        finals = " ".join(f"{r['final_eval_return']:.1f}" for r in runs)
        solved = sum(r["solved_at_env_steps"] is not None for r in runs)
        mean = sum(r["final_eval_return"] for r in runs) / len(runs)
        cpu = sum(r["cpu_time_s"] for r in runs) / len(runs)
        solved_of = f"{solved}/{len(runs)}"
        lines.append(f"{core:<5}  {steps:>8,}  {seeds:<7}  {finals:<26}  {solved_of:<6}  {mean:6.1f}  {cpu:.0f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=["lstm", "mlp"], choices=["lstm", "gru", "mlp"])
    p.add_argument("--env-steps", type=int, default=100_000)
    p.add_argument("--table", action="store_true", help="print the table of the recorded runs and exit")
    p.add_argument("--results", type=Path, default=RESULTS, help="the JSON file of records (one per process)")
    p.add_argument("--runs-dir", default="", help="also write each run's directory here (evaluations as they come)")
    args = p.parse_args()
    if args.table:
        print(table(load(args.results)))
        return

    from ptl_rl.examples import recurrent_ppo  # noqa: PLC0415 - after the arguments, so --help answers at once

    here = commit()
    for seed in args.seeds:
        for arm in args.arms:  # interleaved: the machine's load drifts, and both arms see the same drift
            argv = ["--core", arm, "--seed", str(seed), "--env-steps", str(args.env_steps), "--runs-dir", "",
                    "--no-progress-bar", "--no-tensorboard"]  # fmt: skip
            config = vars(recurrent_ppo.parse_args(argv))  # without the run directory: one config wherever written
            argv[argv.index("--runs-dir") + 1] = args.runs_dir
            if any(r["commit"] == here and r["config"] == config for r in load(args.results)):
                continue
            summary = recurrent_ppo.train(recurrent_ppo.parse_args(argv))
            record = {"config": config, **{k: summary[k] for k in KEEP}, "commit": here}
            record["load_average"] = os.getloadavg()[0]
            print(f"{arm:<4} seed {seed}: final {summary['final_eval_return']:.1f}, {summary['stopped']}", flush=True)
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps([*load(args.results), record], indent=1, default=str) + "\n")
    print(table(load(args.results)))


if __name__ == "__main__":
    main()

"""A recurrent example against the same network with its memory cut, over several seeds: the shared runner.

``r2d2_cartpole.py`` and ``recurrent_ppo_cartpole.py`` are thin callers that
name the example module (in ``ptl_rl/examples``) and the results file. Each
arm runs the example with its defaults and ``--core lstm|gru|mlp`` (``mlp``:
the recurrent cell replaced by a ReLU layer of the same width). Each run
appends one record (the run's summary, the commit and the load average, and
since issue #33 the date and the machine: ``_records.py``) to the results
file; runs already recorded for the same commit and config are skipped.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

import _records

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ptl_rl
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


def load(path: Path) -> list[dict]:
    return _records.load(path)


def table(records: list[dict]) -> str:
    """Final greedy returns per (arm, env steps): every seed, the seeds that reached 475, and the mean."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["config"]["core"], r["config"]["env_steps"]), []).append(r)
    lines = [
        f"{'core':<5}  {'budget':>8}  {'seeds':<7}  {'final return per seed':<26}  solved  mean    cpu s/run  runs"
    ]
    for (core, steps), runs in sorted(groups.items()):
        runs = sorted(runs, key=lambda r: r["config"]["seed"])
        seeds = ",".join(str(r["config"]["seed"]) for r in runs)
        finals = " ".join(f"{r['final_eval_return']:.1f}" for r in runs)
        solved = sum(r["solved_at_env_steps"] is not None for r in runs)
        mean = sum(r["final_eval_return"] for r in runs) / len(runs)
        cpu = sum(r["cpu_time_s"] for r in runs) / len(runs)
        solved_of = f"{solved}/{len(runs)}"
        row = f"{core:<5}  {steps:>8,}  {seeds:<7}  {finals:<26}  {solved_of:<6}  {mean:6.1f}  {cpu:<9.0f}  "
        lines.append(row + _records.runs(runs))
    return "\n".join(lines)


def run_arm(example: str, arm: str, seed: int, env_steps: int, runs_dir: str, results: Path, here: str) -> None:
    """Train one (arm, seed) with ``ptl_rl.examples.<example>`` and append its record, unless already recorded."""
    module = importlib.import_module(f"ptl_rl.examples.{example}")
    argv = ["--core", arm, "--seed", str(seed), "--env-steps", str(env_steps), "--runs-dir", "",
            "--no-progress-bar", "--no-tensorboard"]  # fmt: skip
    config = vars(module.parse_args(argv))  # without the run directory: the same config wherever it is written
    argv[argv.index("--runs-dir") + 1] = runs_dir
    if any(r["commit"] == here and r["config"] == config for r in load(results)):
        return
    date = _records.utc_now()
    summary = module.train(module.parse_args(argv))
    record = {"config": config, **{k: summary[k] for k in KEEP}, "commit": here, "load_average": os.getloadavg()[0]}
    record.update(date=date, machine=_records.machine())
    print(f"{arm:<4} seed {seed}: final {summary['final_eval_return']:.1f}, {summary['stopped']}", flush=True)
    _records.append(results, record)


def main(example: str, results: Path, doc: str | None, env_steps: int) -> None:
    """The command line of a caller: ``example`` names the module, ``results`` the default records file."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=["lstm", "mlp"], choices=["lstm", "gru", "mlp"])
    p.add_argument("--env-steps", type=int, default=env_steps)
    p.add_argument("--table", action="store_true", help="print the table of the recorded runs and exit")
    p.add_argument("--results", type=Path, default=results, help="the JSON file of records (one per process)")
    p.add_argument("--runs-dir", default="", help="also write each run's directory here (evaluations as they come)")
    args = p.parse_args()
    if not args.table:
        here = _records.commit()
        for seed in args.seeds:
            for arm in args.arms:  # interleaved: the machine's load drifts, and both arms see the same drift
                run_arm(example, arm, seed, args.env_steps, args.runs_dir, args.results, here)
    print(table(load(args.results)))

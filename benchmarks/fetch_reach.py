"""SAC on gymnasium-robotics' FetchReach, with and without hindsight relabeling, beside SB3-zoo's published result.

    benchmarks/fetch_reach.py --python /path/to/venv/bin/python           # seeds 0-2, both arms, 20k env steps
    benchmarks/fetch_reach.py --table                                     # the recorded runs and SB3-zoo's row

Each run is ``python -m ptl_rl.examples.sac --env-id gymnasium_robotics:FetchReach-v4``
(SB3-zoo's ``her.yml`` recipe: 20k env steps, gamma 0.95, 64x64 networks,
``n_sampled_goal=4``, ``future``), with ``--no-her`` for the arm without
relabeling, run by ``--python`` with this checkout first on ``PYTHONPATH``:
that interpreter needs gymnasium-robotics and a MuJoCo it works with.
gymnasium-robotics 1.4.2 cannot build the Fetch envs on MuJoCo 4.0.1 (the
version the constraints pin for gymnasium's own MuJoCo envs): its
``set_joint_qpos`` compares ``mjtJoint`` members with numpy ints, which
MuJoCo 4's enums no longer equal. The records were made in a venv with
``mujoco==3.3.7``. The score is the final greedy evaluation (100 fresh
episodes): the mean return (-1 per step off the goal, 50 steps) and the share
of episodes that end on the goal. Records go to
``benchmarks/results/fetch_reach.json`` with the commit and load, and since
issue #33 the date and the machine (``_records.py``; older records are shown
as ``undated``).

SB3-zoo's benchmark table has FetchReach with TQC + HER (the same recipe):
-1.659 +- 0.873 after 20k steps, one run; with SAC + HER on PandaReach
-1.734 +- 0.835.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _records

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fetch_reach.json"
ENV_ID = "gymnasium_robotics:FetchReach-v4"
SB3_ZOO = "SB3-zoo (TQC + HER, 20k steps, 1 run): return -1.659 +- 0.873"


def load() -> list[dict]:
    return _records.load(RESULTS)


def run(python: str, seed: int, her: bool, env_steps: int) -> dict:
    """One training run of the SAC example; returns its record."""
    with tempfile.TemporaryDirectory() as runs:
        argv = [python, "-m", "ptl_rl.examples.sac", "--env-id", ENV_ID, "--seed", str(seed), "--runs-dir", runs]
        argv += ["--env-steps", str(env_steps), "--no-progress-bar", "--her" if her else "--no-her"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        start, date = time.time(), _records.utc_now()
        subprocess.run(argv, check=True, env=env, capture_output=True, text=True)
        summary = json.loads(next(Path(runs).glob("*/summary.json")).read_text())
    return {
        "seed": seed,
        "her": her,
        "env_steps": summary["env_steps"],
        "final_eval_return": summary["final_eval_return"],
        "success_rate": summary["success_rate"],
        "wall_s": round(time.time() - start, 1),
        "commit": _records.commit(),
        "load_average": os.getloadavg()[0],
        "date": date,
        "machine": machine_of(python),
    }


VERSIONS = """
import json, platform
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
names = ("numpy", "torch", "mujoco", "gymnasium-robotics")
print(json.dumps({"python": platform.python_version(), **{name: version(name) for name in names}}))
"""


def machine_of(python: str) -> dict:
    """The machine's facts, with the versions of the interpreter that ran the example (``--python``)."""
    done = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True, check=True)
    return {**_records.machine(), **json.loads(done.stdout)}


def table(records: list[dict]) -> str:
    lines = [
        f"{'arm':<10} {'seeds':<8} {'return per seed':<26} {'success per seed':<20} mean return  mean success  runs"
    ]
    for her in (True, False):
        runs = sorted((r for r in records if r["her"] == her), key=lambda r: r["seed"])
        if not runs:
            continue
        returns = [r["final_eval_return"] for r in runs]
        rates = [r["success_rate"] for r in runs]
        lines.append(
            f"{'SAC + HER' if her else 'SAC':<10} {','.join(str(r['seed']) for r in runs):<8} "
            f"{' '.join(f'{x:.2f}' for x in returns):<26} {' '.join(f'{x:.2f}' for x in rates):<20} "
            f"{sum(returns) / len(returns):11.2f}  {sum(rates) / len(rates):12.2f}  {_records.runs(runs)}"
        )
    return "\n".join([*lines, SB3_ZOO])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=sys.executable, help="interpreter with gymnasium-robotics and a working MuJoCo")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--env-steps", type=int, default=20_000)
    p.add_argument("--arms", nargs="+", default=["her", "plain"], choices=["her", "plain"])
    p.add_argument("--table", action="store_true", help="print the table of the recorded runs and exit")
    args = p.parse_args()
    if not args.table:
        for seed in args.seeds:
            for arm in args.arms:
                here = (seed, arm == "her", _records.commit())
                done = [r for r in load() if (r["seed"], r["her"], r["commit"]) == here]
                if done:
                    continue
                record = run(args.python, seed, arm == "her", args.env_steps)
                print(f"{arm:<5} seed {seed}: return {record['final_eval_return']:.2f}, "
                      f"success {record['success_rate']:.2f} ({record['wall_s']:.0f} s)", flush=True)  # fmt: skip
                _records.append(RESULTS, record)
    print(table(load()))


if __name__ == "__main__":
    main()

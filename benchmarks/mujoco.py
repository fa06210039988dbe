"""MuJoCo at published scale: ptl_rl's examples against CleanRL's single files, run here, side by side.

    python benchmarks/mujoco.py --algo ppo --env-id Hopper-v5 HalfCheetah-v5 Walker2d-v5 --seeds 1 2 3 \\
        --env-steps 1000000 --cleanrl /path/to/cleanrl            # add the CleanRL arm (one seed per env)

Each run is a child process; its CPU time (user + system, from the kernel's
accounting of the child) over its env steps is the cost reported. torch runs on
one thread in both arms. Every finished run is appended to
``benchmarks/results/mujoco.json`` at once, and a run already recorded there
(same lib, algo, env, seed and budget) is skipped: a long benchmark killed half
way resumes at the first run it had not finished.

The record of a run: ``algo``, ``env_id``, ``seed``, ``env_steps``,
``final_return`` (mean of the last 10 training episodes), ``greedy_return``
(10 fresh greedy episodes; CleanRL's files have none: ``null``), ``cpu_s``,
``cpu_us_per_env_step``, ``lib`` (``ptl_rl`` or ``cleanrl``),
``ptl_rl_commit`` (``-dirty`` when ``ptl_rl/`` differed from it), the machine
load at start and end and the run directory; since issue #33 also ``date``
(UTC, ISO 8601, when the run started) and ``machine`` (cores, CPU model,
Python, numpy, torch, ptl_rl versions: ``_records.py``). Older records have
neither: the table counts them as ``undated``.

``--table`` prints the results table from the records: a cell with several
seeds gives their mean +- the sample standard deviation (``statistics.stdev``),
one run its value alone.

CleanRL's files are read from the checkout given with ``--cleanrl`` and patched
in memory for gymnasium 1.x, never copied here: ``cleanrl_files.py`` lists the
patches.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import _records
import cleanrl_files

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "mujoco.json"

# Open RL Benchmark (CleanRL's published table, v4 envs, 1M steps): mean +- std over seeds
PUBLISHED = {
    ("ppo", "HalfCheetah"): (1442.64, 46.03),
    ("ppo", "Hopper"): (2382.86, 271.74),
    ("ppo", "Walker2d"): (2287.95, 571.78),
}

CLEANRL_FILES = {"ppo": "ppo_continuous_action.py", "sac": "sac_continuous_action.py"}


def run_cleanrl_inline(path: str, algo: str, env_id: str, seed: int, env_steps: int) -> None:
    """In this (child) process: execute the patched CleanRL file as ``__main__``."""
    cleanrl_files.run_inline(path, CLEANRL_FILES[algo], {"env_id": env_id, "seed": seed, "total_timesteps": env_steps})


def run_ptl_rl(algo: str, env_id: str, seed: int, env_steps: int, runs_dir: Path, extra: list[str]) -> dict[str, Any]:
    runs_dir.mkdir(parents=True, exist_ok=True)
    log = runs_dir / f"{algo}_{env_id}_{seed}.log"
    cmd = [sys.executable, "-m", f"ptl_rl.examples.{algo}", "--env-id", env_id, "--seed", str(seed),
           "--env-steps", str(env_steps), "--runs-dir", str(runs_dir), "--no-progress-bar", "--threads", "1",
           *extra]  # fmt: skip
    before = set(glob.glob(str(runs_dir / f"{algo}_{env_id}_{seed}_*")))
    code, cpu, wall = cleanrl_files.child(cmd, str(REPO), log)
    if code != 0:
        raise SystemExit(f"ptl_rl run failed ({code}); see {log}")
    (run_dir,) = set(glob.glob(str(runs_dir / f"{algo}_{env_id}_{seed}_*"))) - before
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    return {
        "final_return": summary["train_return_last10"],
        "greedy_return": summary["final_eval_return"],
        "env_steps_done": summary["env_steps"],
        "cpu_s": cpu,
        "wall_s": wall,
        "run_dir": os.path.relpath(run_dir, REPO),
    }


def run_cleanrl(path: str, algo: str, env_id: str, seed: int, env_steps: int, runs_dir: Path) -> dict[str, Any]:
    runs_dir.mkdir(parents=True, exist_ok=True)
    log = runs_dir / f"cleanrl_{algo}_{env_id}_{seed}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "_cleanrl", path, algo, env_id, str(seed), str(env_steps)]
    with tempfile.TemporaryDirectory() as cwd:  # CleanRL writes runs/ into its working directory
        code, cpu, wall = cleanrl_files.child(cmd, cwd, log)
    if code != 0:
        raise SystemExit(f"CleanRL run failed ({code}); see {log}")
    run_dir = cleanrl_run_directory(log, runs_dir / f"cleanrl_{algo}_{env_id}_{seed}", algo, env_id, seed)
    returns = [float(r) for r in json.loads((run_dir / "summary.json").read_text())["returns"]]
    last = returns[-10:]
    return {
        "final_return": sum(last) / len(last) if last else None,
        "greedy_return": None,
        "env_steps_done": env_steps,
        "cpu_s": cpu,
        "wall_s": wall,
        "run_dir": os.path.relpath(run_dir, REPO),
    }


def cleanrl_run_directory(log: Path, run_dir: Path, algo: str, env_id: str, seed: int) -> Path:
    """A run directory from a CleanRL log (its ``global_step=..., episodic_return=...`` lines), for the plot command."""
    found = re.findall(r"global_step=(\d+), episodic_return=([-\d.eE+]+)", log.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = ["env_steps,return,length,env_id,wall_time_s"] + [f"{step},{ret},0,0,0" for step, ret in found]
    (run_dir / "episodes.csv").write_text("\n".join(rows) + "\n")
    (run_dir / "config.json").write_text(json.dumps({"algo": f"{algo} (CleanRL)", "env_id": env_id, "seed": seed}))
    (run_dir / "summary.json").write_text(json.dumps({"returns": [float(r) for _, r in found]}))
    return run_dir


def load_results() -> list[dict[str, Any]]:
    return _records.load(RESULTS)


def _done(lib: str, algo: str, env_id: str, seed: int, env_steps: int) -> bool:
    return any(
        (r["lib"], r["algo"], r["env_id"], r["seed"], r["env_steps"]) == (lib, algo, env_id, seed, env_steps)
        for r in load_results()
    )


def table() -> str:
    """Per algo and env: ptl_rl's mean over seeds, CleanRL measured here, CleanRL published."""
    rows, results = [], load_results()
    keys = sorted({(r["algo"], r["env_id"], r["env_steps"]) for r in results})
    for algo, env_id, steps in keys:

        def pick(lib: str, a: str = algo, e: str = env_id, s: int = steps) -> list[dict[str, Any]]:
            return [r for r in results if (r["lib"], r["algo"], r["env_id"], r["env_steps"]) == (lib, a, e, s)]

        ours, theirs = pick("ptl_rl"), pick("cleanrl")
        published = PUBLISHED.get((algo, env_id.split("-")[0]))

        def mean(rs: list[dict[str, Any]], key: str) -> str:
            values = [r[key] for r in rs if r[key] is not None]
            return f"{sum(values) / len(values):.0f} (n={len(values)})" if values else "-"

        rows.append(
            f"{algo} {env_id} {steps}: ptl_rl final {mean(ours, 'final_return')}, "
            f"greedy {mean(ours, 'greedy_return')}, "
            f"{mean(ours, 'cpu_us_per_env_step')} us/step | CleanRL here {mean(theirs, 'final_return')}, "
            f"{mean(theirs, 'cpu_us_per_env_step')} us/step | published "
            + (f"{published[0]:.0f} +- {published[1]:.0f}" if published else "-")
        )
    return "\n".join(rows)


def cpu_side_by_side(rows: list[dict[str, Any]]) -> str:
    """CPU per env step, ptl_rl / CleanRL, of the latest commit that has runs of both (side by side, same code).

    Runs of different sessions ran under different machine load, which moves CPU per step by up to 2x, so
    only runs recorded with the same ptl_rl commit (one benchmark invocation, or queues started together)
    are compared.
    """
    for commit in reversed(list(dict.fromkeys(r["ptl_rl_commit"] for r in rows))):
        same = [r for r in rows if r["ptl_rl_commit"] == commit]
        ours = [r["cpu_us_per_env_step"] for r in same if r["lib"] == "ptl_rl"]
        theirs = [r["cpu_us_per_env_step"] for r in same if r["lib"] == "cleanrl"]
        if ours and theirs:
            a, b = sum(ours) / len(ours), sum(theirs) / len(theirs)
            return f"{a:.0f} / {b:.0f} us ({a / b:.2f}x; {commit}, runs {len(ours)} / {len(theirs)})"
    return "-"


def rst_table() -> str:
    """The results table (README, docs): per algo, env and budget, ptl_rl's seeds and CleanRL here and published.

    A cell with several runs gives mean +- sample SD (``statistics.stdev``) and n; one run, its value alone.
    """
    results = load_results()
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - algo, env, env steps",
        "     - ptl_rl: last 10 training episodes, mean +- sample SD",
        "     - ptl_rl: 10 greedy episodes",
        "     - CleanRL here (last 10)",
        "     - CleanRL published",
        "     - CPU per env step: ptl_rl / CleanRL",
        "     - runs (UTC)",
    ]
    for algo, env_id, steps in sorted({(r["algo"], r["env_id"], r["env_steps"]) for r in results}):
        rows = [r for r in results if (r["algo"], r["env_id"], r["env_steps"]) == (algo, env_id, steps)]

        def pick(lib: str, key: str, rows: list[dict[str, Any]] = rows) -> list[float]:
            return [r[key] for r in rows if r["lib"] == lib and r[key] is not None]

        published = PUBLISHED.get((algo, env_id.split("-")[0])) if steps == 1_000_000 else None
        lines += [
            f"   * - {algo.upper()}, {env_id}, {steps:,}",
            f"     - {_records.mean_sd(pick('ptl_rl', 'final_return'))}",
            f"     - {_records.mean_sd(pick('ptl_rl', 'greedy_return'))}",
            f"     - {_records.mean_sd(pick('cleanrl', 'final_return'))}",
            f"     - {f'{published[0]:.0f} +- {published[1]:.0f} (v4)' if published else '-'}",
            f"     - {cpu_side_by_side(rows)}",
            f"     - {_records.runs(rows)}",
        ]
    return "\n".join(lines)


def main() -> None:
    global RESULTS  # noqa: PLW0603 - one results file per invocation
    if len(sys.argv) > 1 and sys.argv[1] == "_cleanrl":  # the child process of a CleanRL run
        # this script's folder is first on sys.path, and this file is named mujoco.py: `import mujoco` must
        # find the MuJoCo package, not this script
        here = str(Path(__file__).resolve().parent)
        sys.path[:] = [entry for entry in sys.path if str(Path(entry or ".").resolve()) != here]
        path, algo, env_id, seed, steps = sys.argv[2:7]
        run_cleanrl_inline(path, algo, env_id, int(seed), int(steps))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=["ppo", "sac"], default="ppo")
    p.add_argument("--env-id", nargs="+", default=["Hopper-v5", "HalfCheetah-v5", "Walker2d-v5"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--env-steps", type=int, default=1_000_000)
    p.add_argument("--cleanrl", default=None, help="path of a CleanRL checkout: also run its file (first seed only)")
    p.add_argument("--cleanrl-seeds", type=int, nargs="+", default=None, help="CleanRL's seeds (default: the first)")
    p.add_argument("--no-ptl-rl", action="store_true", help="run only the CleanRL arm")
    p.add_argument("--runs-dir", default=str(REPO / "runs" / "mujoco"), help="run directories and logs")
    p.add_argument("--table", action="store_true", help="only print the table of the recorded results")
    p.add_argument("--results", default=str(RESULTS), help="the JSON file of records (read, then appended to)")
    p.add_argument("example_args", nargs="*", help="after --: extra flags for ptl_rl's example")
    args = p.parse_args()
    RESULTS = Path(args.results)
    if args.table:
        print(rst_table())
        return
    runs_dir = Path(args.runs_dir)
    plan = []
    for env_id in args.env_id:
        for seed in args.seeds if not args.no_ptl_rl else []:
            plan.append(("ptl_rl", env_id, seed))
        if args.cleanrl:
            for seed in args.cleanrl_seeds or args.seeds[:1]:
                plan.append(("cleanrl", env_id, seed))
    for lib, env_id, seed in plan:
        if _done(lib, args.algo, env_id, seed, args.env_steps):
            print(f"skip {lib} {args.algo} {env_id} seed {seed}: already in {RESULTS.name}", flush=True)
            continue
        load, commit, date = os.getloadavg()[0], _records.commit(("ptl_rl",)), _records.utc_now()  # at the start
        print(f"run {lib} {args.algo} {env_id} seed {seed}, {args.env_steps} steps (load {load:.2f})", flush=True)
        if lib == "ptl_rl":
            out = run_ptl_rl(args.algo, env_id, seed, args.env_steps, runs_dir, args.example_args)
        else:
            out = run_cleanrl(args.cleanrl, args.algo, env_id, seed, args.env_steps, runs_dir)
        record = {
            "algo": args.algo, "env_id": env_id, "seed": seed, "env_steps": args.env_steps,
            "final_return": out["final_return"], "greedy_return": out["greedy_return"],
            "cpu_s": round(out["cpu_s"], 1), "cpu_us_per_env_step": round(out["cpu_s"] / args.env_steps * 1e6, 1),
            "lib": lib, "ptl_rl_commit": commit, "wall_s": round(out["wall_s"], 1),
            "load_at_start": round(load, 2), "load_at_end": round(os.getloadavg()[0], 2), "run": out["run_dir"],
            "date": date, "machine": _records.machine(),
        }  # fmt: skip
        _records.append(RESULTS, record)
        print(json.dumps(record), flush=True)
    print(table())


if __name__ == "__main__":
    main()

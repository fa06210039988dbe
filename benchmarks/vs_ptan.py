"""Collection beside Ptan's vector source: raw loop, ptl_rl (source + 3-step) and Ptan (3-step), one run.

The three run the same work on 8 CartPole-v1 envs (gymnasium ``SyncVectorEnv``)
with the same 4-64-2 MLP (argmax, torch on the CPU, one thread), in two regimes
(a fresh MLP: episodes of ~10 steps; a balancing one: hundreds of steps; see
``collection.py``), interleaved repeat by repeat:

* the raw loop: step and act, nothing else (the limit);
* ptl_rl: ``ExperienceSource`` -> ``NStepTransform(n=3)``, every batch consumed;
* Ptan: ``VectorExperienceSourceFirstLast(steps_count=3, unnest_data=False)``
  with ``ptan.agent.DQNAgent`` and ``ArgmaxActionSelector``, one list of
  ``ExperienceFirstLast`` per vector step consumed.

They do not do the same bookkeeping: ptl_rl also checks the agent's output and
the env's values, keeps the real final observations and per-env episode
statistics, honours gymnasium's next-step autoreset (Ptan's vector source
makes a transition of the reset step) and numbers the stream for the interrupt
rules; Ptan yields Python objects per env. The figure is what each costs per
env step, as a ratio of the raw loop's rate in the same repeat (CPU time).

Ptan is read from a directory that holds its ``ptan`` package (``--ptan``: an
unpacked wheel or a checkout), never installed from this repository; run the
script with a Python where ``import ptan`` works (ptan's own imports need
``stable-baselines3``; ptan pins old torch, so install it with ``--no-deps``),
and with this checkout on ``PYTHONPATH``. Each run appends a record
(``_records.py``) to ``benchmarks/results/vs_ptan.json``.

    PYTHONPATH=. python benchmarks/vs_ptan.py --ptan PATH [--steps 16000] [--repeats 7]
    python benchmarks/vs_ptan.py --table
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import _records
import numpy as np
import torch
from collection import make_env, make_net, raw_loop

import ptl_rl

REGIMES = {"8 envs, ~10-step episodes": False, "8 envs, long episodes": True}  # name -> balancing MLP
NUM_ENVS = 8


def ptl_rl_rate(vector_steps: int, balancing: bool) -> float:
    """Env steps/s of ExperienceSource -> NStepTransform(3), after the first (resetting) step."""
    env, net = make_env(NUM_ENVS), make_net(balancing)
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector()), seed=0)
    nstep = ptl_rl.NStepTransform(source, n=3, gamma=0.99)
    next(nstep)
    first = source.total_steps
    start = time.process_time()
    while source.total_steps - first < NUM_ENVS * vector_steps:
        next(nstep)
    elapsed = time.process_time() - start
    env.close()
    return (source.total_steps - first) / elapsed


def ptan_rate(ptan: Any, vector_steps: int, balancing: bool) -> float:
    """Env steps/s of Ptan's VectorExperienceSourceFirstLast(steps_count=3), one yield per vector step."""
    env, net = make_env(NUM_ENVS), make_net(balancing)
    agent = ptan.agent.DQNAgent(net, ptan.actions.ArgmaxActionSelector())
    source = ptan.experience.VectorExperienceSourceFirstLast(env, agent, gamma=0.99, steps_count=3, env_seed=0,
                                                             unnest_data=False)  # fmt: skip
    stream = iter(source)
    next(stream)  # the first yield comes after 3 vector steps: not part of the steady state
    start = time.process_time()
    for _ in itertools.islice(stream, vector_steps):
        pass
    elapsed = time.process_time() - start
    env.close()
    return NUM_ENVS * vector_steps / elapsed


def import_ptan(path: Path) -> Any:
    sys.path.insert(0, str(path))
    try:
        import ptan  # noqa: PLC0415  # a peer, read from the path given, not a dependency
    except ImportError as error:
        raise SystemExit(
            f"cannot import ptan from {path}: {error}. Point --ptan at the directory that holds the ptan package, "
            "and run with a Python that has ptan's imports (pip install --no-deps ptan stable-baselines3)."
        ) from error
    return ptan


def measure(ptan: Any, vector_steps: int, repeats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per regime: the rates of every repeat, and the medians of the rates and of the per-repeat ratios."""
    torch.set_num_threads(1)
    repeats_out: dict[str, Any] = {}
    medians: dict[str, Any] = {}
    for regime, balancing in REGIMES.items():
        rows: dict[str, list[float]] = {"raw": [], "ptl_rl": [], "ptan": []}
        for _ in range(repeats):
            rows["raw"].append(raw_loop(NUM_ENVS, vector_steps, balancing))
            rows["ptl_rl"].append(ptl_rl_rate(vector_steps, balancing))
            rows["ptan"].append(ptan_rate(ptan, vector_steps, balancing))
        raw = np.array(rows["raw"])
        medians[regime] = {
            **{name: float(np.median(values)) for name, values in rows.items()},
            "ptl_rl_ratio": float(np.median(np.array(rows["ptl_rl"]) / raw)),
            "ptan_ratio": float(np.median(np.array(rows["ptan"]) / raw)),
            "ptl_rl_vs_ptan": float(np.median(np.array(rows["ptl_rl"]) / np.array(rows["ptan"]))),
        }
        repeats_out[regime] = rows
        m = medians[regime]
        print(f"{regime:28} raw {m['raw']:8,.0f}/s  ptl_rl {m['ptl_rl']:8,.0f}/s ({m['ptl_rl_ratio']:.2f}x raw)  "
              f"ptan {m['ptan']:8,.0f}/s ({m['ptan_ratio']:.2f}x raw)  ptl_rl/ptan {m['ptl_rl_vs_ptan']:.2f}",
              flush=True)  # fmt: skip
    return medians, repeats_out


def table(records: list[dict[str, Any]]) -> str:
    """The docs' table: each regime's rates as ratios of the raw loop, and ptl_rl against Ptan, from the latest
    record (the code measured changes between runs: a range over them would mix versions)."""
    records = records[-1:]
    cell, rows = _records.cell, []
    for regime in REGIMES:
        held = _records.having(records, regime)
        if held:
            rows.append([
                f"source + n-step(3), {regime}", cell(held, (regime, "raw"), "{:,.0f}"),
                cell(held, (regime, "ptl_rl_ratio"), "{:.2f}"), cell(held, (regime, "ptan_ratio"), "{:.2f}"),
                cell(held, (regime, "ptl_rl_vs_ptan"), "{:.2f}"), _records.runs(held),
            ])  # fmt: skip
    header = ["measured", "raw loop (env steps/s)", "ptl_rl (x raw)", "Ptan (x raw)", "ptl_rl / Ptan", "run (UTC)"]
    return _records.rst_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ptan", type=Path, help="directory holding the ptan package (unpacked wheel or checkout)")
    parser.add_argument("--steps", type=int, default=2_000, help="vector steps per measurement")
    parser.add_argument("--repeats", type=int, default=7)
    _records.add_options(parser, "vs_ptan")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    if args.ptan is None:
        parser.error("--ptan PATH is required (the directory that holds the ptan package)")
    ptan = import_ptan(args.ptan)
    run = _records.Run("vs_ptan", {**vars(args), "ptan": str(args.ptan)}, args.results, peers=("ptan",))
    medians, repeats = measure(ptan, args.steps, args.repeats)
    run.save(medians, repeats)


if __name__ == "__main__":
    main()

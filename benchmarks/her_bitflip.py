"""DQN on the HER paper's bit-flipping env, with and without hindsight relabeling, over several seeds.

    .venv/bin/python benchmarks/her_bitflip.py                       # 10 bits, 20k env steps, seeds 0-4
    .venv/bin/python benchmarks/her_bitflip.py --n-bits 15 --env-steps 60000 --seeds 0 1 2
    .venv/bin/python benchmarks/her_bitflip.py --table               # the table of the recorded runs
    .venv/bin/python benchmarks/her_bitflip.py --cost                # add and sample time beside ReplayBuffer

Both arms run the same pipeline (``tests/support/her_bitflip.py``): 16
bit-flip envs, a ``HERReplayBuffer`` (``strategy="future"``,
``n_sampled_goal=4``; the arm without HER has ``n_sampled_goal=0``, so the
same episodes are drawn and none is relabeled), one DQN gradient step per 4
env steps, torch on one thread. The score is the share of 200 greedy
episodes on fresh envs that reach their goal. Each run appends one record to
``benchmarks/results/her_bitflip.json`` (with the commit, the load average,
and since issue #33 the date and the machine: ``_records.py``); runs already
recorded for the same commit are skipped. The table's last column names the
runs' dates (``undated`` for records from before dates).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import _records

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ptl_rl
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the bit-flip env and the training loop
RESULTS = ROOT / "benchmarks" / "results" / "her_bitflip.json"


def load() -> list[dict]:
    return _records.load(RESULTS)


def table(records: list[dict]) -> str:
    """Success rates per (bits, env steps, arm): every seed, and their mean."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        c = r["config"]
        groups.setdefault((c["n_bits"], c["env_steps"], "DQN + HER" if c["her"] else "DQN"), []).append(r)
    lines = [
        f"{'bits':>4}  {'env steps':>9}  {'arm':<9}  {'seeds':<11}  {'success per seed':<32}  mean   cpu s/run  runs"
    ]
    for (bits, steps, arm), runs in sorted(groups.items()):
        runs = sorted(runs, key=lambda r: r["config"]["seed"])
        seeds = ",".join(str(r["config"]["seed"]) for r in runs)
        rates = " ".join(f"{r['success_rate']:.2f}" for r in runs)
        mean = sum(r["success_rate"] for r in runs) / len(runs)
        cpu = sum(r["cpu_s"] for r in runs) / len(runs)
        row = f"{bits:>4}  {steps:>9,}  {arm:<9}  {seeds:<11}  {rates:<32}  {mean:.2f}   {cpu:<9.0f}  "
        lines.append(row + _records.runs(runs))
    return "\n".join(lines)


def cost(repeats: int = 5) -> None:
    """Time ``add`` (16 rows, one vector step) and ``sample(256)`` of ``HERReplayBuffer`` and ``ReplayBuffer``.

    The same bit-flip rows (dict observations of 10 bits, episodes of up to 10 steps) in both, 100k slots,
    full ring; CPU time of this process, the best of ``repeats`` rounds (the machine is shared).
    """
    import numpy as np  # noqa: PLC0415
    from bit_flip import BitFlipEnv, bit_flip_vector_env  # noqa: PLC0415

    import ptl_rl  # noqa: PLC0415

    env = bit_flip_vector_env(16, 10)
    rng = np.random.default_rng(0)
    source = ptl_rl.ExperienceSource(env, lambda obs: rng.integers(0, 10, len(obs["observation"])), seed=0)
    batches = [next(source) for _ in range(8_000)]  # 128k rows: the ring wraps
    buffers = {
        "ReplayBuffer": lambda: ptl_rl.ReplayBuffer(None, 100_000, seed=0),
        "HERReplayBuffer": lambda: ptl_rl.HERReplayBuffer(
            None, 100_000, compute_reward=BitFlipEnv.compute_reward, compute_terminated=BitFlipEnv.compute_terminated
        ),
    }
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeats):
        for name, make in buffers.items():
            buffer = make()
            start = time.process_time()
            for batch in batches:
                buffer.add(batch)
            add_s = (time.process_time() - start) / len(batches)
            start = time.process_time()
            for _ in range(2_000):
                buffer.sample(256)
            sample_s = (time.process_time() - start) / 2_000
            old = best.get(name, (float("inf"), float("inf")))
            best[name] = (min(old[0], add_s), min(old[1], sample_s))
    for name, (add_s, sample_s) in best.items():
        print(f"{name:<16} add(16 rows) {add_s * 1e6:6.1f} us   sample(256) {sample_s * 1e6:6.1f} us")
    (plain_add, plain_sample), (her_add, her_sample) = best["ReplayBuffer"], best["HERReplayBuffer"]
    print(
        f"HER / plain: add {her_add / plain_add:.2f}x, sample {her_sample / plain_sample:.2f}x; load {os.getloadavg()}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-bits", type=int, default=10)
    p.add_argument("--env-steps", type=int, default=20_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--arms", nargs="+", default=["her", "plain"], choices=["her", "plain"])
    p.add_argument("--table", action="store_true", help="print the table of the recorded runs and exit")
    p.add_argument("--cost", action="store_true", help="time add and sample beside a ReplayBuffer and exit")
    args = p.parse_args()
    if args.table:
        print(table(load()))
        return
    if args.cost:
        cost()
        return

    import torch  # noqa: PLC0415 - after the arguments, so --help answers at once
    from her_bitflip import Config, train  # noqa: PLC0415

    torch.set_num_threads(1)
    here = _records.commit()
    for seed in args.seeds:
        for arm in args.arms:  # interleaved: the machine's load drifts, and both arms see the same drift
            config = Config(n_bits=args.n_bits, env_steps=args.env_steps, seed=seed, her=arm == "her")
            done = [r for r in load() if r["commit"] == here and r["config"] == vars(config)]
            if done:
                continue
            date = _records.utc_now()
            result = train(config)
            result.update(commit=here, load_average=os.getloadavg()[0], date=date, machine=_records.machine())
            print(
                f"{arm:<5} seed {seed}: success {result['success_rate']:.2f} ({result['cpu_s']:.0f} s CPU)", flush=True
            )
            _records.append(RESULTS, result)
    print(table(load()))


if __name__ == "__main__":
    main()

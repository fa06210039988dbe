"""Hot-path throughput: the three ratios of issue #9, the per-stage profile and the accounting's cost, in one run.

1. Collection: ExperienceSource + NStepTransform(3) vs a hand-written loop, with 8 and with 1
   CartPole-v1 envs (gymnasium SyncVectorEnv) and the same 4-64-2 MLP (argmax, torch on the CPU,
   one thread). The raw loop only steps and acts; the pipeline also checks the agent's output,
   tracks episodes, folds 3-step returns and emits transition batches (goals: 8 envs >= 0.95,
   1 env >= 0.9). Two regimes: a fresh MLP (episodes of ~10 steps, an episode ends at almost
   every vector step) and a balancing MLP (episodes of hundreds of steps, as late in training).
2. ReplayBuffer.add of the rows of one vector step (8 CartPole-shaped 3-step transitions) vs a
   bare numpy ring (goal >= 0.9); see benchmarks/buffer.py for sampling.
3. ptl_rl.profile's stage breakdown of the pipeline (us per vector step), and the cost of the
   accounting itself: the same pipeline with ptl_rl.set_profiling(False) vs on (goal < 2%).

Rates use the process's CPU time (single-threaded: torch uses one thread), so other load on the
machine skews the ratios less; every ratio is the median over interleaved repeats of the per-repeat
ratio (the limit and ours alternate, so drifts of the machine hit both alike). Each run appends a
record (date, commit, load, machine, arguments, medians, every repeat, the last repeat's profile:
``_records.py``) to ``benchmarks/results/collection.json``.

    python benchmarks/collection.py [--steps 16000] [--repeats 7]
    python benchmarks/collection.py --table      # the docs' tables, from the records
"""

from __future__ import annotations

import argparse
import os
import time

import _records
import gymnasium as gym
import numpy as np
import torch
from buffer import BareRing, make_chunks
from torch import nn

import ptl_rl


def make_env(num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")


def make_net(balancing: bool = False) -> nn.Module:
    """The 4-64-2 MLP. Freshly initialised it loses CartPole in ~10 steps, so
    episode ends (the slow path) come at almost every vector step; with
    ``balancing`` its weights encode "push towards where the pole falls"
    (argmax of +-(angle + angular velocity)), which keeps episodes hundreds of
    steps long, as late in training."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2))
    if balancing:
        with torch.no_grad():
            for p in net.parameters():
                p.zero_()
            net[0].weight[0, 2:] = 1.0  # h0 = relu(angle + angular velocity)
            net[0].weight[1, 2:] = -1.0  # h1 = relu(-(angle + angular velocity))
            net[2].weight[1, 0] = net[2].weight[0, 1] = 1.0  # right if h0 wins, left if h1 wins
    return net


def raw_loop(num_envs: int, vector_steps: int, balancing: bool) -> float:
    """Env steps/s of the hand-written limit: step, act, nothing else."""
    env, net = make_env(num_envs), make_net(balancing)
    obs, _ = env.reset(seed=0)
    start = time.process_time()
    with torch.no_grad():
        for _ in range(vector_steps):
            actions = net(torch.as_tensor(obs)).argmax(-1).numpy()
            obs, _, _, _, _ = env.step(actions)
    elapsed = time.process_time() - start
    env.close()
    return num_envs * vector_steps / elapsed


def pipeline(num_envs: int, vector_steps: int, balancing: bool, profiled: bool = True, chunk: int = 1):
    """Env steps/s of ExperienceSource(steps_per_batch=chunk) -> NStepTransform(n=3), every emitted batch consumed;
    and the profile."""
    env, net = make_env(num_envs), make_net(balancing)
    agent = ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector())
    source = ptl_rl.ExperienceSource(env, agent, seed=0, steps_per_batch=chunk)
    nstep = ptl_rl.NStepTransform(source, n=3, gamma=0.99)
    ptl_rl.set_profiling(profiled)
    target = num_envs * vector_steps
    try:
        next(nstep)  # the first step resets the envs: not part of the steady state
        ptl_rl.profile(nstep).reset()
        first = source.total_steps
        start = time.process_time()
        while source.total_steps - first < target:
            next(nstep)
        elapsed = time.process_time() - start
    finally:
        ptl_rl.set_profiling(True)
    env.close()
    return (source.total_steps - first) / elapsed, ptl_rl.profile(nstep), source._env.clock.calls


def add_rates(ops: int) -> tuple[float, float]:
    """Adds/s of 8-row chunks: the bare ring, then ReplayBuffer.add (both full, so writes wrap)."""
    capacity = 100_000
    chunks = make_chunks(256, 8)
    batches = [ptl_rl.TransitionBatch(c) for c in chunks]
    bare, ours = BareRing(capacity), ptl_rl.ReplayBuffer(None, capacity, warmup=0, seed=0)
    for i in range(256):
        bare.add(chunks[i]), ours.add(batches[i])
    rates = []
    for add, items in ((bare.add, chunks), (ours.add, batches)):
        start = time.process_time()
        for i in range(ops):
            add(items[i & 255])
        rates.append(ops / (time.process_time() - start))
    return rates[0], rates[1]


def accounting_us(repeats: int = 20_000) -> float:
    """Microseconds per vector step of the accounting alone, as source + n-step run it.

    Per vector step: four timed calls (n-step, source, agent, env step), each two
    ``perf_counter_ns`` reads and one ``StageClock.add``, plus two ``len(batch)``.
    A deterministic bound next to the on/off comparison, which the machine's noise can swamp.
    """
    from ptl_rl.core.clock import SETTINGS, StageClock, perf_counter_ns  # noqa: PLC0415

    clocks = [StageClock(str(i), "items") for i in range(4)]
    batch = ptl_rl.TransitionBatch(obs=np.zeros((8, 4), np.float32))
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(repeats):
            for clock in clocks:
                if SETTINGS.profiling:
                    t = perf_counter_ns()
                    clock.add(perf_counter_ns() - t, 8)
            len(batch), len(batch)
        best = min(best, (time.process_time() - start) / repeats * 1e6)
    return best


def median_ratio(ours: list[float], limit: list[float]) -> float:
    return float(np.median(np.array(ours) / np.array(limit)))


CASES = {  # record key: (envs, balancing MLP, goal)
    "8 envs, long episodes": (8, True, 0.95),
    "8 envs, ~10-step episodes": (8, False, 0.95),
    "1 env, long episodes": (1, True, 0.9),
    "1 env, ~10-step episodes": (1, False, 0.9),
}


def table(records: list[dict]) -> str:
    """The docs' tables: collection and add ratios; the profile's stage shares and the accounting's cost."""
    cell, rows = _records.cell, []
    for case, (_, _, goal) in CASES.items():
        held = _records.having(records, case)
        if held:
            rows.append([
                f"source + n-step(3), {case}", cell(held, (case, "raw"), "{:,.0f}"),
                cell(held, (case, "pipeline"), "{:,.0f}"), cell(held, (case, "ratio"), "{:.2f}"),
                cell(held, (case, "chunked_ratio"), "{:.2f}"), f">= {goal}", _records.runs(held),
            ])  # fmt: skip
    held = _records.having(records, "add")
    if held:
        rows.append([
            "``ReplayBuffer.add``, 8 rows (adds/s)", cell(held, ("add", "bare"), "{:,.0f}"),
            cell(held, ("add", "ptl_rl"), "{:,.0f}"), cell(held, ("add", "ratio"), "{:.2f}"), "-", ">= 0.9",
            _records.runs(held),
        ])  # fmt: skip
    header = ["measured (env steps/s)", "limit", "ptl_rl", "ratio", "chunks of 8", "goal", "run (UTC)"]
    out = [_records.rst_table(header, rows)]
    profiled = [r for r in records if r.get("profile")]
    if profiled:
        # the last repeat's profile as {case: {stage: share}}, so that _records.cell reads it like the medians
        shares = [{"medians": {k: {row["stage"]: row["share"] for row in v} for k, v in r["profile"].items()}}
                  for r in profiled]  # fmt: skip
        stages = list(dict.fromkeys(stage for r in shares for case in r["medians"].values() for stage in case))
        prof = [
            [case, *(cell(shares, (case, stage), "{:.0f}%", 100) for stage in stages),
             cell(profiled, (case, "accounting_on_off"), "{:+.1f}%", 100),
             cell(profiled, (case, "accounting_own"), "{:.2f}%", 100), _records.runs(profiled)]
            for case in CASES
        ]  # fmt: skip
        header = ["profile (share of wall time)", *stages, "accounting on/off", "its operations", "run (UTC)"]
        out.append(_records.rst_table(header, prof))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16_000, help="env steps per collection measurement")
    parser.add_argument("--add-ops", type=int, default=20_000, help="adds per replay measurement")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=8, help="also measure the source in chunks of this many steps")
    _records.add_options(parser, "collection")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("collection", args, args.results)
    torch.set_num_threads(1)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    profiles, medians, repeats = {}, {}, {}
    for case, (num_envs, balancing, goal) in CASES.items():
        # fewer env steps with one env: the same number of vector steps would take 8x as long
        vector_steps = args.steps // num_envs if num_envs > 1 else args.steps // 4
        raw_loop(num_envs, 200, balancing), pipeline(num_envs, 200, balancing)  # warm up both paths
        raw, ours, off, chunked = [], [], [], []
        for _ in range(args.repeats):  # interleaved, so drifts of the machine hit both alike
            raw.append(raw_loop(num_envs, vector_steps, balancing))
            rate, table_, calls = pipeline(num_envs, vector_steps, balancing)
            ours.append(rate)
            off.append(pipeline(num_envs, vector_steps, balancing, profiled=False)[0])
            chunked.append(pipeline(num_envs, vector_steps, balancing, chunk=args.chunk)[0])
        profiles[case] = (table_, calls)
        print(f"{case}:")
        print(f"  raw env+policy loop  : {np.median(raw):9.0f} env steps/s (median of {args.repeats})")
        print(f"  source + n-step(3)   : {np.median(ours):9.0f} env steps/s")
        print(f"  ratio (goal >= {goal}): {median_ratio(ours, raw):.3f} median of interleaved pairs")
        print(f"  in chunks of {args.chunk:<3d}     : {median_ratio(chunked, raw):.3f} of the raw loop")
        cost = 1 - median_ratio(ours, off)
        bound = accounting_us() / (1e6 * num_envs / np.median(ours))
        print(
            f"  accounting cost      : {100 * cost:+.2f}% profile on vs off (noisy), "
            f"{100 * bound:.2f}% its own operations per vector step (goal < 2%)"
        )
        medians[case] = {
            "raw": np.median(raw), "pipeline": np.median(ours), "ratio": median_ratio(ours, raw),
            "chunked_ratio": median_ratio(chunked, raw), "accounting_on_off": cost, "accounting_own": bound,
        }  # fmt: skip
        repeats[case] = {"raw": raw, "pipeline": ours, "profile_off": off, "chunked": chunked}
    bare, ours = [], []
    for _ in range(args.repeats):
        b, o = add_rates(args.add_ops)
        bare.append(b), ours.append(o)
    print(
        f"ReplayBuffer.add, 8 rows: bare {np.median(bare):9.0f}/s  ptl_rl {np.median(ours):9.0f}/s  "
        f"ratio {median_ratio(ours, bare):.3f} (goal >= 0.9)"
    )
    medians["add"] = {
        "bare": float(np.median(bare)),
        "ptl_rl": float(np.median(ours)),
        "ratio": median_ratio(ours, bare),
    }
    repeats["add"] = {"bare": bare, "ptl_rl": ours}
    profile = {}
    for case, (table_, calls) in profiles.items():
        print(f"\nprofile of the last repeat, {case}, us per vector step (wall time):")
        profile[case] = []
        for row in table_.rows:
            print(f"  {row.stage:22s} {1e6 * row.own_s / calls:8.2f} us  {100 * row.share:5.1f}%")
            profile[case].append({"stage": row.stage, "us": 1e6 * row.own_s / calls, "share": row.share})
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    run.save(medians, repeats, profile=profile)


if __name__ == "__main__":
    main()

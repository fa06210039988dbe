"""Scale-out benchmarks: async vs in-process DQN, collection throughput, the learner's ingest limit.

    python benchmarks/scaleout.py dqn [--seeds 0 1 2 3 4] [--env-steps 30000] [--steps-per-message 4 --queue-size 2]
    python benchmarks/scaleout.py throughput [--seconds 4]
    python benchmarks/scaleout.py ingest [--repeats 3] [--seconds 3] [--ray --actors 8]
    python benchmarks/scaleout.py envpool [--repeats 5] [--steps 2000]
    python benchmarks/scaleout.py all      # the four above, one run, their defaults

``dqn``: the same DQN (plain torch loop over ``ReplayBuffer -> BatchSampler``,
the hyper-parameters and fused Adam of ptl_rl.examples.dqn) with the in-process
``ExperienceSource -> NStepTransform`` and with ``AsyncSource`` (weights pushed
every K gradient steps), same replay ratio and env-step budget. Both arms run
the whole budget; a snapshot of the weights every 2,500 env steps is
evaluated greedily after the timed run, so evaluation costs neither arm wall
time. Reports, per seed, the wall time of the budget and its ratio, and the
env steps (and wall time) to a greedy mean return of 475.

``throughput``: env steps/s of collection alone (the consumer takes batches
and drops them) with an env that burns 1 ms of CPU per step (4 sub-envs):
in-process source, AsyncSource, RayWorkers with 1 and 2 workers.

``ingest``: transitions/s the learner side takes in (receive, staleness
check, ReplayBuffer.add) from an AsyncSource whose collector sends a
precomputed batch (no env work), through the pickled queue and through the
shared-memory ring (interleaved, median of repeats), and with ``--ray`` from
lightweight Ray actors; for CartPole-sized rows (obs float32 [4]) and
Atari-sized rows (obs uint8 [4, 84, 84]); with a projection to 100 and 1,000
workers.

``envpool``: env steps/s of CartPole through ``ExperienceSource`` (random
actions) with gymnasium's ``SyncVectorEnv`` and with EnvPool (through
``ptl_rl.envs.envpool.EnvPoolVectorEnv``) at 8 and 64 sub-envs, next to the limit:
the same EnvPool pool stepped in a bare loop with the same actions. The
three run interleaved, several repeats, median.

Wall times depend on the load of the machine: the script prints the load
average next to every result. Timings live here, never in tests. Each part
appends a record (``benchmark``: ``scaleout dqn``, ``scaleout throughput``,
...; date, commit, load, machine, arguments, medians, every repeat:
``_records.py``) to ``benchmarks/results/scaleout.json``;
``python benchmarks/scaleout.py --table`` prints the docs' tables from them.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's ptl_rl, also in the collector processes (they inherit sys.path)

import _records  # noqa: E402

import ptl_rl  # noqa: E402
from ptl_rl.distributed import AsyncSource, Collector, RayWorkers, WorkerInfo  # noqa: E402


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# ---------------------------------------------------------------------------- DQN
GAMMA, N_STEP, NUM_ENVS, BATCH, TRAIN_EVERY, LR, SYNC_EVERY = 0.99, 3, 4, 128, 4, 5e-3, 50
EPS_DECAY, WARMUP, EVAL_EVERY, EVAL_EPISODES, SOLVED = 10_000, 1_000, 2_500, 20, 475.0


def q_network() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def dqn_collector(info: WorkerInfo, seed: int) -> Collector:
    """The DQN collection side: 4 CartPole envs, epsilon-greedy on a Q-network copy, 3-step returns."""
    torch.manual_seed(seed)
    net = q_network()
    env = gym.make_vec("CartPole-v1", num_envs=NUM_ENVS, vectorization_mode="sync")
    epsilon = ptl_rl.LinearSchedule(1.0, 0.05, EPS_DECAY)
    agent = ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(epsilon, seed=seed))
    source = ptl_rl.ExperienceSource(env, agent, gamma=GAMMA, seed=seed, rank=info.rank)
    return Collector(ptl_rl.NStepTransform(source, N_STEP, GAMMA), net)


def run_dqn(
    seed: int,
    use_async: bool,
    env_steps: int,
    push_every: int,
    steps_per_message: int = 1,
    queue_size: int = 8,
) -> dict[str, Any]:
    """Train for ``env_steps`` env steps; the greedy evaluations run afterwards, on weight snapshots.

    A snapshot of the Q-network is taken every ``EVAL_EVERY`` env steps (a
    copy of 4.6k floats, with its wall-clock time) and evaluated once training
    is over, so the timed part holds only what differs between the two arms:
    collection, in the learner's process or beside it.
    """
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    start = time.perf_counter()
    net, target = q_network(), q_network()
    if use_async:
        upstream: Any = AsyncSource(
            functools.partial(dqn_collector, seed=seed),
            policy=net,
            queue_size=queue_size,
            steps_per_message=steps_per_message,
        )
    else:
        upstream = dqn_collector(WorkerInfo(0, 0, 0, 1), seed)
        net = upstream.policy  # the in-process agent acts with the learner's network itself
        upstream = upstream.pipeline
    target.load_state_dict(net.state_dict())
    counter = upstream if use_async else ptl_rl.find_stage(upstream, ptl_rl.ExperienceSource)
    buffer = ptl_rl.ReplayBuffer(upstream, 50_000, warmup=WARMUP, transitions_per_yield=TRAIN_EVERY, seed=seed)
    sampler = ptl_rl.BatchSampler(buffer, BATCH)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, fused=True)  # as ptl_rl.examples.dqn
    snapshots: list[tuple[int, float, dict[str, torch.Tensor]]] = []  # (env steps, wall s, weights)
    next_snapshot, steps, waited = EVAL_EVERY, 0, 0.0
    try:
        while counter.total_steps < env_steps:
            tick = time.perf_counter()
            batch = next(sampler)
            waited += time.perf_counter() - tick
            q = net(batch.obs).gather(1, batch.action.long()[:, None]).squeeze(1)
            with torch.no_grad():
                next_value = target(batch.next_obs).gather(1, net(batch.next_obs).argmax(1, keepdim=True)).squeeze(1)
                y = batch.reward + batch.discount * (1.0 - batch.terminated.float()) * next_value
            loss = F.smooth_l1_loss(q, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if steps % SYNC_EVERY == 0:
                target.load_state_dict(net.state_dict())
            if use_async and steps % push_every == 0:
                upstream.push_weights()
            if counter.total_steps >= next_snapshot:
                next_snapshot += EVAL_EVERY
                weights = {k: v.clone() for k, v in net.state_dict().items()}
                snapshots.append((counter.total_steps, time.perf_counter() - start, weights))
    finally:
        if use_async:
            upstream.close()
    wall = time.perf_counter() - start
    out: dict[str, Any] = {"env_steps": counter.total_steps, "grad_steps": steps, "wall_s": wall}
    out["ms_per_env_step"] = 1e3 * wall / max(counter.total_steps, 1)
    out["in_next_s"] = waited
    out["solved_at"], out["wall_to_solved_s"] = first_solved(snapshots, seed)
    if use_async:
        out.update({k: v for k, v in upstream.staleness_stats().items() if k != "staleness_last"})
    return out


def first_solved(snapshots: list[tuple[int, float, dict[str, torch.Tensor]]], seed: int) -> tuple[Any, Any]:
    """(env steps, wall s) of the first snapshot whose greedy mean return over EVAL_EPISODES is >= SOLVED."""
    net = q_network()
    greedy = ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector())
    eval_env = gym.make_vec("CartPole-v1", num_envs=EVAL_EPISODES, vectorization_mode="sync")
    try:
        for number, (env_steps, wall, weights) in enumerate(snapshots, start=1):
            net.load_state_dict(weights)
            if float(ptl_rl.evaluate(eval_env, greedy, EVAL_EPISODES, seed=seed + 10_000 + number).mean()) >= SOLVED:
                return env_steps, wall
    finally:
        eval_env.close()
    return None, None


def bench_dqn(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    # the forkserver imports torch once per learner process; pay it before timing (it is printed, not hidden)
    start = time.perf_counter()
    with AsyncSource(functools.partial(dqn_collector, seed=0)) as warm:
        next(warm)
    print(
        f"first collector start (forkserver imports torch, once per learner process): "
        f"{time.perf_counter() - start:.1f} s  ({load()})",
        flush=True,
    )
    rows = []
    for seed in args.seeds:
        arms = (False, True) if seed % 2 == 0 else (True, False)  # alternate which arm runs first
        for use_async in arms:
            result = run_dqn(seed, use_async, args.env_steps, args.push_every, args.steps_per_message, args.queue_size)
            rows.append((seed, use_async, result))
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
            print(f"seed {seed} {'async' if use_async else 'sync '}: {shown}  ({load()})", flush=True)
    ratios, repeats = [], {}
    for seed in args.seeds:
        sync = next(r for s, a, r in rows if s == seed and not a)
        asy = next(r for s, a, r in rows if s == seed and a)
        ratios.append(sync["wall_s"] / asy["wall_s"])
        repeats[str(seed)] = {"sync": sync, "async": asy, "ratio": ratios[-1]}
        print(
            f"seed {seed}: wall time of the {args.env_steps} env-step budget sync/async = {ratios[-1]:.2f}; "
            f"steps to {SOLVED:.0f}: sync {sync['solved_at']}, async {asy['solved_at']}"
        )
    sync_t = [r["wall_s"] for _, a, r in rows if not a]
    async_t = [r["wall_s"] for _, a, r in rows if a]
    print(
        f"median wall time of the budget: sync {statistics.median(sync_t):.2f} s, "
        f"async {statistics.median(async_t):.2f} s; median of the per-seed ratios "
        f"{statistics.median(ratios):.2f} (goal >= 1.4)  ({load()})"
    )
    medians: dict[str, Any] = {"ratio": statistics.median(ratios)}
    for use_async in (False, True):
        solved = [r["solved_at"] for _, a, r in rows if a == use_async]
        reached = [s for s in solved if s is not None]
        median = statistics.median(reached) if reached else None
        print(
            f"{'async' if use_async else 'sync '}: reached {SOLVED:.0f} in {len(reached)}/{len(solved)} seeds "
            f"within the budget; steps to {SOLVED:.0f} {solved} (median of those reached: {median})"
        )
        medians["async" if use_async else "sync"] = {
            "wall_s": statistics.median(sync_t if not use_async else async_t),
            "reached": len(reached),
            "seeds": len(solved),
            "solved_at": median,
        }
    return medians, repeats


# ---------------------------------------------------------------------------- throughput
class BusyEnv(gym.Env):
    """CartPole-sized observations; every step burns ``cost`` seconds of CPU (a busy wait, not a sleep)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, cost: float = 1e-3, length: int = 200) -> None:
        self.cost, self.length, self.t = cost, length, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        end = time.perf_counter() + self.cost
        while time.perf_counter() < end:
            pass
        self.t += 1
        return np.full(4, self.t / self.length, np.float32), 1.0, False, self.t >= self.length, {}


def busy_collector(info: WorkerInfo, num_envs: int = 4, cost: float = 1e-3) -> Collector:
    env = gym.vector.SyncVectorEnv([functools.partial(BusyEnv, cost) for _ in range(num_envs)])
    net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2))
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector()), seed=0, rank=info.rank)
    return Collector(ptl_rl.NStepTransform(source, N_STEP, GAMMA), net)


def steps_per_second(stage: Any, counter: Any, seconds: float) -> float:
    next(stage)  # started, first batch in
    start_steps, start = counter.total_steps, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(stage)
    return (counter.total_steps - start_steps) / (time.perf_counter() - start)


def ray_init() -> Any:
    import ray  # noqa: PLC0415

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, single-user Ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    return ray


def bench_throughput(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    torch.set_num_threads(1)
    results = {}
    inproc = busy_collector(WorkerInfo(0, 0, 0, 1))
    results["in-process"] = steps_per_second(inproc.pipeline, inproc.pipeline.upstream, args.seconds)
    with AsyncSource(busy_collector) as source:
        results["AsyncSource"] = steps_per_second(source, source, args.seconds)
    ray = ray_init()
    try:
        for workers in (1, 2):
            stage = RayWorkers(busy_collector, workers, steps_per_call=8)
            try:
                # actors import torch on start: wait for every worker's first call before timing
                while stage.total_steps < 2 * workers * 8 * 4:
                    next(stage)
                results[f"Ray x{workers}"] = steps_per_second(stage, stage, args.seconds)
            finally:
                stage.close()
    finally:
        ray.shutdown()
    base = results["in-process"]
    for name, rate in results.items():
        print(f"{name:12s} {rate:8.0f} env steps/s  ({rate / base:.2f}x in-process)")
    print(f"(env: 4 sub-envs x 1 ms of CPU per step; {load()})")
    medians = {name: {"steps_per_s": rate, "x_in_process": rate / base} for name, rate in results.items()}
    return medians, {}  # one measurement of each


# ---------------------------------------------------------------------------- ingest
class Precomputed:
    """A stage standing in for a fast collector: the same ready batch on every ``next()``, no env work."""

    def __init__(self, source: Any, batch: ptl_rl.TransitionBatch) -> None:
        self.upstream, self.batch = source, batch

    def __iter__(self) -> Precomputed:
        return self

    def __next__(self) -> ptl_rl.TransitionBatch:
        return self.batch


def precomputed_collector(info: WorkerInfo, rows: int, atari: bool) -> Collector:
    env = gym.vector.SyncVectorEnv([functools.partial(BusyEnv, 0.0)])
    source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(1, np.int64), rank=info.rank)
    shape, dtype = ((4, 84, 84), np.uint8) if atari else ((4,), np.float32)
    rng = np.random.default_rng(info.rank)
    obs = rng.integers(0, 255, (rows, *shape)).astype(dtype)
    batch = ptl_rl.TransitionBatch(
        obs=obs,
        action=np.zeros(rows, np.int64),
        reward=np.ones(rows, np.float32),
        next_obs=obs.copy(),
        terminated=np.zeros(rows, bool),
        truncated=np.zeros(rows, bool),
        discount=np.full(rows, 0.99, np.float32),
        env_id=np.full(rows, info.rank, np.int64),
        policy_version=np.zeros(rows, np.int64),
    )
    return Collector(Precomputed(source, batch), None)


def _ingest_rate(stage: Any, rows_per_message: int, atari: bool, seconds: float, warm_messages: int) -> float:
    """Transitions/s the learner takes from ``stage`` into a ReplayBuffer (receive, staleness check, add)."""
    buffer = ptl_rl.ReplayBuffer(stage, 4_000 if atari else 200_000, warmup=0, transitions_per_yield=1)
    for _ in range(warm_messages):  # every collector started and delivered
        buffer.add(next(stage))
    start, stored = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        stored += len(buffer.add(next(stage)))
    return stored / (time.perf_counter() - start)


def bench_ingest(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    rows, per_message = 32, 8  # 256 rows per message (AsyncSource) or per call (Ray)
    rates: dict[tuple[str, bool], float] = {}
    for atari in (False, True):
        for _ in range(args.repeats):  # AsyncSource, both transports, interleaved
            for shm in (False, True):
                factory = functools.partial(precomputed_collector, rows=rows, atari=atari)
                with AsyncSource(
                    factory, steps_per_message=per_message, queue_size=4, shared_memory_mb=64 if shm else None
                ) as stage:
                    rate = _ingest_rate(stage, rows * per_message, atari, args.seconds, 8)
                rates.setdefault((f"AsyncSource {'shared-memory ring' if shm else 'pickled queue'}", atari), [])
                rates[(f"AsyncSource {'shared-memory ring' if shm else 'pickled queue'}", atari)].append(rate)
    if args.ray:
        ray = ray_init()
        try:
            for atari in (False, True):
                factory = functools.partial(precomputed_collector, rows=rows, atari=atari)
                stage = RayWorkers(factory, args.actors, steps_per_call=per_message, actor_options={"num_cpus": 0.1})
                try:
                    rate = _ingest_rate(stage, rows * per_message, atari, args.seconds, 3 * args.actors)
                finally:
                    stage.close()
                rates[(f"RayWorkers x{args.actors}", atari)] = [rate]
        finally:
            ray.shutdown()
    medians: dict[str, Any] = {"cartpole": {}, "atari": {}}
    repeats: dict[str, Any] = {"cartpole": {}, "atari": {}}
    for atari in (False, True):
        kind = "Atari-sized (uint8 [4,84,84] obs+next_obs, 56 KB/row)" if atari else "CartPole-sized (float32 [4])"
        print(f"{kind}, {rows * per_message} rows per message, median of repeats  ({load()})")
        per_worker = args.worker_rate_atari if atari else args.worker_rate
        for (name, is_atari), values in rates.items():
            if is_atari != atari:
                continue
            rate = statistics.median(values)
            medians["atari" if atari else "cartpole"][name] = {"per_s": rate, "workers": rate / per_worker}
            repeats["atari" if atari else "cartpole"][name] = values
            gbs = f" ({rate * 56_448 / 1e9:.2f} GB/s)" if atari else ""
            print(f"  {name:36s} learner ingest {rate:12,.0f} transitions/s{gbs}")
            print(
                f"    saturates at ~{rate / per_worker:,.0f} workers of {per_worker:,} env steps/s; "
                + ", ".join(f"{n:,} workers need {n * per_worker / rate:.1f}x this" for n in (100, 1000))
            )
    return medians, repeats


# ---------------------------------------------------------------------------- envpool
def bench_envpool(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    import envpool  # noqa: PLC0415

    from ptl_rl.envs.envpool import EnvPoolVectorEnv  # noqa: PLC0415

    def random_agent(n: int) -> Any:
        rng = np.random.default_rng(0)
        return lambda obs: rng.integers(0, 2, n)

    def through_source(env: Any, n: int) -> float:
        source = ptl_rl.ExperienceSource(env, random_agent(n), seed=0)
        next(source)
        start = time.perf_counter()
        for _ in range(args.steps):
            next(source)
        return source.total_steps / (time.perf_counter() - start)

    def bare_loop(pool: Any, n: int) -> float:  # the limit: EnvPool alone, no transitions built
        agent = random_agent(n)
        obs, _ = pool.reset()
        start = time.perf_counter()
        for _ in range(args.steps):
            obs, *_ = pool.step(agent(obs))
        return n * args.steps / (time.perf_counter() - start)

    medians: dict[str, Any] = {}
    repeats: dict[str, Any] = {}
    for n in (8, 64):
        gym_env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync")
        pool = EnvPoolVectorEnv("CartPole-v1", num_envs=n)
        bare = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=n)
        rates: dict[str, list[float]] = {"gymnasium SyncVectorEnv": [], "EnvPool": [], "EnvPool bare loop": []}
        for _ in range(args.repeats):  # interleaved: a change of load hits all three alike
            rates["gymnasium SyncVectorEnv"].append(through_source(gym_env, n))
            rates["EnvPool"].append(through_source(pool, n))
            rates["EnvPool bare loop"].append(bare_loop(bare, n))
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"CartPole-v1 x{n}, ExperienceSource, median of {args.repeats}  ({load()})")
        for name, rate in med.items():
            print(f"  {name:24s} {rate:10,.0f} env steps/s")
        print(
            f"  EnvPool / SyncVectorEnv through the source: {med['EnvPool'] / med['gymnasium SyncVectorEnv']:.2f}x; "
            f"source over EnvPool at {med['EnvPool'] / med['EnvPool bare loop']:.2f} of the bare loop"
        )
        for env in (gym_env, pool, bare):
            env.close()
        medians[str(n)] = {
            **med,
            "envpool_over_sync": med["EnvPool"] / med["gymnasium SyncVectorEnv"],
            "source_over_bare": med["EnvPool"] / med["EnvPool bare loop"],
        }
        repeats[str(n)] = rates
    return medians, repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _records.add_options(parser, "scaleout")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("dqn")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--env-steps", type=int, default=30_000)
    p.add_argument("--push-every", type=int, default=10, help="gradient steps between weight pushes (K)")
    p.add_argument("--steps-per-message", type=int, default=4, help="vector steps per AsyncSource message")
    p.add_argument("--queue-size", type=int, default=2, help="AsyncSource messages the collector may run ahead")
    p = sub.add_parser("throughput")
    p.add_argument("--seconds", type=float, default=4.0)
    p = sub.add_parser("ingest")
    p.add_argument("--actors", type=int, default=8)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ray", action=argparse.BooleanOptionalAction, default=False, help="also from Ray actors")
    p.add_argument("--worker-rate", type=int, default=5_000, help="env steps/s of one CartPole worker (projection)")
    p.add_argument("--worker-rate-atari", type=int, default=1_000, help="env steps/s of one Atari worker")
    p = sub.add_parser("envpool")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=2_000, help="vector steps per measurement")
    sub.add_parser("all", help="the four measurements in one run, each with its defaults (ingest with --ray)")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    if args.command is None:
        parser.error("name a measurement (dqn, throughput, ingest, envpool, all) or pass --table")
    commands = {"dqn": bench_dqn, "throughput": bench_throughput, "ingest": bench_ingest, "envpool": bench_envpool}
    if args.command != "all":
        measure(args.command, commands[args.command], args)
        return
    for name, command in commands.items():
        print(f"\n==== {name} ({load()})", flush=True)
        part = parser.parse_args([name, "--ray"] if name == "ingest" else [name])
        part.results = args.results
        measure(name, command, part)


def measure(name: str, command: Any, args: argparse.Namespace) -> None:
    """Run one part and append its record (``benchmark``: ``scaleout <name>``)."""
    run = _records.Run(f"scaleout {name}", args, args.results, peers=["ray", "envpool"])
    medians, repeats = command(args)
    run.save(medians, repeats)


def table(records: list[dict[str, Any]]) -> str:
    """The docs' tables, one per part, from the records of each part."""
    cell, runs, out = _records.cell, _records.runs, []
    dqn = [r for r in records if r["benchmark"] == "scaleout dqn"]
    if dqn:
        rows = []
        for arm, label in (("sync", "in-process source"), ("async", "``AsyncSource``")):
            reached = _records.span([r["medians"][arm]["reached"] for r in dqn], "{:.0f}")
            seeds = _records.span([r["medians"][arm]["seeds"] for r in dqn], "{:.0f}")
            ratio = "-" if arm == "sync" else cell(dqn, "ratio", "{:.2f}")
            every = [r["repeats"][seed]["ratio"] for r in dqn for seed in r["repeats"]] if arm == "async" else []
            rows.append([
                label, cell(dqn, (arm, "wall_s"), "{:.1f}"), ratio + (f" ({_records.span(every)})" if every else ""),
                f"{reached}/{seeds}", cell(dqn, (arm, "solved_at"), "{:,.0f}"), runs(dqn),
            ])  # fmt: skip
        steps = "/".join(sorted({f"{r['config']['env_steps']:,}" for r in dqn}))
        header = [f"DQN, CartPole, {steps} env steps", "wall s", "speed-up (seeds)", "reached 475", "at env step",
                  "run (UTC)"]  # fmt: skip
        out.append(_records.rst_table(header, rows))
    held = [r for r in records if r["benchmark"] == "scaleout throughput"]
    if held:
        rows = [
            [
                name,
                cell(held, (name, "steps_per_s"), "{:,.0f}"),
                cell(held, (name, "x_in_process"), "{:.2f}"),
                runs(held),
            ]
            for name in dict.fromkeys(k for r in held for k in r["medians"])
        ]
        header = ["collection, 4 envs x 1 ms/step", "env steps/s", "x in-process", "run (UTC)"]
        out.append(_records.rst_table(header, rows))
    held = [r for r in records if r["benchmark"] == "scaleout ingest"]
    if held:
        rows = []
        for kind, label in (("cartpole", "CartPole rows"), ("atari", "Atari rows")):
            for name in dict.fromkeys(k for r in held for k in r["medians"][kind]):
                mine = _records.having(held, kind, name)
                per_s, workers = (
                    cell(mine, (kind, name, "per_s"), "{:,.0f}"),
                    cell(mine, (kind, name, "workers"), "{:,.0f}"),
                )
                rows.append([f"{label}, {name}", per_s, workers, runs(mine)])
        header = ["learner ingest, 256 rows a message", "transitions/s", "saturated by workers", "run (UTC)"]
        out.append(_records.rst_table(header, rows))
    held = [r for r in records if r["benchmark"] == "scaleout envpool"]
    if held:
        rates = ("gymnasium SyncVectorEnv", "EnvPool", "EnvPool bare loop")
        rows = []
        for n in dict.fromkeys(k for r in held for k in r["medians"]):
            ratios = [cell(held, (n, "envpool_over_sync"), "{:.2f}"), cell(held, (n, "source_over_bare"), "{:.2f}")]
            rows.append([f"CartPole x{n}", *(cell(held, (n, k), "{:,.0f}") for k in rates), *ratios, runs(held)])
        header = ["through ExperienceSource, env steps/s", "SyncVectorEnv", "EnvPool", "EnvPool bare loop",
                  "EnvPool / Sync", "source / bare", "run (UTC)"]  # fmt: skip
        out.append(_records.rst_table(header, rows))
    return "\n\n".join(out)


if __name__ == "__main__":
    main()

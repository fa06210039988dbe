"""Prioritized replay throughput: sample(256) + update_priorities(256) at 100k stored CartPole transitions.

Side by side in one run, interleaved round by round so that load from other
processes hits every implementation alike:

* ``ptl_rl``: :class:`ptl_rl.PrioritizedReplayBuffer`, the learner's path:
  ``batch = buffer.sample(256)`` then ``batch.update_priorities(td)``, with the
  sum-tree's compiled loops when they are built (the default install).
* ``ptl_rl-numpy``: the same with the tree's numpy loops (``SumTree.compiled =
  False``), what an install without a C compiler runs.
* ``cpprb``: cpprb's ``PrioritizedReplayBuffer`` (C++ segment tree), skipped when
  cpprb is not installed (``pip install cpprb``).
* ``tianshou``: Tianshou's ``PrioritizedReplayBuffer`` (numpy segment tree),
  ``batch, indices = buffer.sample(256)`` then ``buffer.update_weight(indices, td)``;
  filled as its own ``ReplayBuffer.from_data`` does (``set_batch``: adding 100k
  rows one by one takes minutes); skipped when Tianshou is not installed.
* ``numpy``: the plain numpy implementation without a tree: a cumulative sum
  over all priorities and ``searchsorted`` per sample, O(N) per batch.

All of them store the same fields (obs [4] f32, action i64, reward f32,
next_obs [4] f32, terminated, truncated, discount f32, env_id i64), return
them with the sampled slots and importance weights, and take |td| + eps as the
new priority with alpha = 0.6, beta = 0.4.

    python benchmarks/prioritized.py [--size 100000] [--batch 256] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from ptl_rl import PrioritizedReplayBuffer, TransitionBatch

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6


def cartpole_rows(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, n).astype(np.int64),
        "reward": np.ones(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
        "terminated": rng.random(n) < 0.01,
        "truncated": np.zeros(n, dtype=bool),
        "discount": np.full(n, 0.99, dtype=np.float32),
        "env_id": rng.integers(0, 8, n).astype(np.int64),
    }


def make_ptl_rl(size: int, batch: int, rng: np.random.Generator, compiled: bool = True) -> Callable[[], None] | None:
    buffer = PrioritizedReplayBuffer(capacity=size, alpha=ALPHA, beta=BETA, eps=EPS, warmup=0, seed=0)
    if compiled and not buffer.tree.compiled:
        return None
    buffer.tree.compiled = compiled
    for _ in range(size // 1000):
        buffer.add(TransitionBatch(cartpole_rows(1000, rng)))
    buffer.update_priorities(np.arange(size), rng.exponential(size=size))
    td = rng.standard_normal(batch)

    def step() -> None:
        sampled = buffer.sample(batch)
        sampled.update_priorities(td)

    return step


def make_cpprb(size: int, batch: int, rng: np.random.Generator) -> Callable[[], None] | None:
    try:
        import cpprb
    except ImportError:
        return None
    env_dict = {
        "obs": {"shape": 4, "dtype": np.float32},
        "action": {"dtype": np.int64},
        "reward": {"dtype": np.float32},
        "next_obs": {"shape": 4, "dtype": np.float32},
        "terminated": {"dtype": np.bool_},
        "truncated": {"dtype": np.bool_},
        "discount": {"dtype": np.float32},
        "env_id": {"dtype": np.int64},
    }
    buffer = cpprb.PrioritizedReplayBuffer(size, env_dict, alpha=ALPHA, eps=EPS)
    for _ in range(size // 1000):
        buffer.add(**cartpole_rows(1000, rng))
    buffer.update_priorities(np.arange(size), rng.exponential(size=size))
    td = rng.standard_normal(batch)

    def step() -> None:
        sampled = buffer.sample(batch, beta=BETA)
        buffer.update_priorities(sampled["indexes"], np.abs(td))

    return step


def make_tianshou(size: int, batch: int, rng: np.random.Generator) -> Callable[[], None] | None:
    try:
        from tianshou.data import Batch, PrioritizedReplayBuffer
    except ImportError:
        return None
    rows = cartpole_rows(size, rng)
    buffer = PrioritizedReplayBuffer(size, alpha=ALPHA, beta=BETA)
    data = Batch(
        obs=rows["obs"],
        act=rows["action"],
        rew=rows["reward"],
        terminated=rows["terminated"],
        truncated=rows["truncated"],
        done=rows["terminated"] | rows["truncated"],
        obs_next=rows["next_obs"],
        info=Batch(discount=rows["discount"], env_id=rows["env_id"]),
    )
    buffer.set_batch(data)
    buffer._size = size  # what Tianshou's ReplayBuffer.from_data does after set_batch
    buffer.update_weight(np.arange(size), rng.exponential(size=size))
    td = rng.standard_normal(batch)

    def step() -> None:
        _, indices = buffer.sample(batch)
        buffer.update_weight(indices, np.abs(td) + EPS)

    return step


def make_numpy(size: int, batch: int, rng: np.random.Generator) -> Callable[[], None]:
    fields = cartpole_rows(size, rng)
    priorities = (rng.exponential(size=size) + EPS) ** ALPHA
    sampler = np.random.default_rng(0)
    td = rng.standard_normal(batch)

    def step() -> None:
        cum = np.cumsum(priorities)
        indices = np.searchsorted(cum, sampler.random(batch) * cum[-1], side="right")
        probs = priorities[indices] / cum[-1]
        weights = (size * probs) ** -BETA
        weights /= weights.max()
        _ = {name: value[indices] for name, value in fields.items()}
        priorities[indices] = (np.abs(td) + EPS) ** ALPHA

    return step


def time_per_call(step: Callable[[], None], calls: int) -> tuple[float, float]:
    """Wall-clock and CPU (process) seconds per call."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        step()
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300, help="sample+update calls per round and implementation")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    impls = {"ptl_rl": make_ptl_rl(args.size, args.batch, rng)}
    if impls["ptl_rl"] is None:
        print("ptl_rl's compiled sum-tree loops are not built: 'ptl_rl' below is its numpy path")
        impls["ptl_rl"] = make_ptl_rl(args.size, args.batch, rng, compiled=False)
    else:
        impls["ptl_rl-numpy"] = make_ptl_rl(args.size, args.batch, rng, compiled=False)
    impls["cpprb"] = make_cpprb(args.size, args.batch, rng)
    impls["tianshou"] = make_tianshou(args.size, args.batch, rng)
    impls["numpy"] = make_numpy(args.size, args.batch, rng)
    for peer in ("cpprb", "tianshou"):
        if impls[peer] is None:
            print(f"{peer} is not installed: skipping it (pip install {peer})")
            del impls[peer]
    for step in impls.values():  # warm caches and allocators
        time_per_call(step, 20)
    wall: dict[str, list[float]] = {name: [] for name in impls}
    cpu: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(args.rounds):
        for name, step in impls.items():
            w, c = time_per_call(step, args.calls)
            wall[name].append(w)
            cpu[name].append(c)

    # On a shared machine wall time includes time spent waiting for a core; CPU time does not.
    print(f"prioritized sample({args.batch}) + update({args.batch}) at {args.size:,} stored transitions")
    print(f"median over {args.rounds} interleaved rounds of {args.calls} calls")
    print(f"{'implementation':<16}{'wall us':>10}{'cpu us':>10}{'batches/s (cpu)':>18}{'ptl_rl speed-up':>18}")
    ours = statistics.median(cpu["ptl_rl"])
    for name in impls:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:<16}{w * 1e6:>10.1f}{c * 1e6:>10.1f}{1 / c:>18.0f}{c / ours:>17.2f}x")
    for name in ("ptl_rl", "ptl_rl-numpy"):
        for peer in ("cpprb", "tianshou"):
            if name in impls and peer in impls:
                by_cpu = statistics.median(cpu[peer]) / statistics.median(cpu[name])
                by_wall = statistics.median(wall[peer]) / statistics.median(wall[name])
                print(f"{name} throughput / {peer} throughput: {by_cpu:.2f} (CPU time), {by_wall:.2f} (wall)")
    try:  # Linux: how busy the machine was (1, 5, 15 min load averages)
        with open("/proc/loadavg") as handle:
            print(f"load average after the run: {' '.join(handle.read().split()[:3])}")
    except OSError:
        pass


if __name__ == "__main__":
    main()

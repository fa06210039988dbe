"""Prioritized replay throughput: sample(256) + update(256) at 100k stored CartPole transitions, beside its peers.

What is timed, the same for every implementation, one call at a time (CPU time
of this process, the median of ``--rounds`` rounds of ``--calls`` calls; the
rounds interleave every implementation and both variants, so load from other
processes hits all alike; filling the buffers is not timed):

* ``numpy`` variant: draw 256 slots with probability proportional to priority
  ** alpha, gather every stored field of those rows (obs [4] f32, action i64,
  reward f32, next_obs [4] f32, terminated, truncated, discount f32, env_id
  i64) and the importance weights (beta = 0.4) as numpy arrays, then set
  those 256 slots' priorities from a float64 numpy array (``|td|``, computed
  in the call; each library adds its eps and raises to alpha = 0.6 itself).
* ``torch`` variant, the learner's path: the same, and every returned field
  and the weights become torch tensors, and the priorities come from a
  float32 torch tensor (a loss's TD errors, ``td.abs()``), handed over as the
  implementation takes them.

Implementations:

* ``ptl_rl``: :class:`ptl_rl.PrioritizedReplayBuffer` (stratified draws, its
  default), ``batch = buffer.sample(256)``, then ``batch.update_priorities(|td|)``
  (which also checks that no slot was overwritten since the draw); ``torch``:
  ``buffer.sample(256).to_torch()`` (what ``BatchSampler`` hands a
  ``training_step``) and the tensor given as is. The sum-tree's compiled loops
  when they are built (the default install).
* ``ptl_rl-numpy``: the same with the tree's numpy loops (``SumTree.compiled =
  False``), what an install without a C compiler runs.
* ``cpprb``: cpprb's ``PrioritizedReplayBuffer`` (C++ segment trees):
  ``sample(256, beta)`` returns every field, ``weights`` and ``indexes``;
  ``update_priorities(indexes, |td|)``; ``torch``: ``torch.from_numpy`` of every
  field and the weights, ``td.abs().numpy()``.
* ``tianshou``: Tianshou's ``PrioritizedReplayBuffer`` (numpy segment tree):
  ``batch, indices = sample(256)`` (a ``Batch`` with every field, ``weight``,
  and the ``done`` flag and empty ``policy`` it always stores: its API gives no
  leaner sample), ``update_weight(indices, |td|)``; ``torch``: its own
  ``batch.to_torch_()``, ``td.abs().numpy()``. Filled as its own
  ``ReplayBuffer.from_data`` does (``set_batch``: adding 100k rows one by one
  takes minutes).
* ``numpy``: no tree: a cumulative sum over all priorities and
  ``searchsorted`` per batch, O(N), fancy-index gathers.

cpprb and Tianshou are skipped when they are not installed (``pip install
cpprb tianshou``). Printed: per variant and implementation the CPU and wall
microseconds per call (medians), and ptl_rl's throughput over each peer's:
the median over the rounds of the peer's CPU time over ptl_rl's in the same
round (the table adds the range over the rounds). Each run
appends a record (date, commit, load, machine with the peers' versions,
arguments, medians, every round: ``_records.py``) to
``benchmarks/results/prioritized.json``.

    python benchmarks/prioritized.py [--size 100000] [--batch 256] [--rounds 7] [--calls 300]
    python benchmarks/prioritized.py --table      # the docs' table, from the records
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import _records
import numpy as np
import torch

from ptl_rl import PrioritizedReplayBuffer, TransitionBatch

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
VARIANTS = ("numpy", "torch")
PEERS = ("cpprb", "tianshou")
Step = Callable[[], None]


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


def make_ptl_rl(size: int, batch: int, rng: np.random.Generator, compiled: bool = True) -> dict[str, Step] | None:
    buffer = PrioritizedReplayBuffer(capacity=size, alpha=ALPHA, beta=BETA, eps=EPS, warmup=0, seed=0)
    if compiled and not buffer.draws.tree.compiled:
        return None
    buffer.draws.tree.compiled = compiled
    for _ in range(size // 1000):
        buffer.add(TransitionBatch(cartpole_rows(1000, rng)))
    buffer.update_priorities(np.arange(size), rng.exponential(size=size))
    td = rng.standard_normal(batch)
    td_torch = torch.as_tensor(td, dtype=torch.float32)

    def as_numpy() -> None:
        buffer.sample(batch).update_priorities(np.abs(td))

    def as_torch() -> None:
        buffer.sample(batch).to_torch().update_priorities(td_torch.abs())

    return {"numpy": as_numpy, "torch": as_torch}


def make_cpprb(size: int, batch: int, rng: np.random.Generator) -> dict[str, Step] | None:
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
    td_torch = torch.as_tensor(td, dtype=torch.float32)

    def as_numpy() -> None:
        sampled = buffer.sample(batch, beta=BETA)
        buffer.update_priorities(sampled["indexes"], np.abs(td))

    def as_torch() -> None:
        sampled = buffer.sample(batch, beta=BETA)
        _ = {k: torch.from_numpy(v) for k, v in sampled.items() if k != "indexes"}
        buffer.update_priorities(sampled["indexes"], td_torch.abs().numpy())

    return {"numpy": as_numpy, "torch": as_torch}


def make_tianshou(size: int, batch: int, rng: np.random.Generator) -> dict[str, Step] | None:
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
    td_torch = torch.as_tensor(td, dtype=torch.float32)

    def as_numpy() -> None:
        _, indices = buffer.sample(batch)
        buffer.update_weight(indices, np.abs(td))  # it adds its eps and raises to alpha itself

    def as_torch() -> None:
        sampled, indices = buffer.sample(batch)
        sampled.to_torch_()
        buffer.update_weight(indices, td_torch.abs().numpy())

    return {"numpy": as_numpy, "torch": as_torch}


def make_numpy(size: int, batch: int, rng: np.random.Generator) -> dict[str, Step]:
    fields = cartpole_rows(size, rng)
    priorities = (rng.exponential(size=size) + EPS) ** ALPHA
    sampler = np.random.default_rng(0)
    td = rng.standard_normal(batch)
    td_torch = torch.as_tensor(td, dtype=torch.float32)

    def sample() -> tuple[dict[str, np.ndarray], np.ndarray]:
        cum = np.cumsum(priorities)
        indices = np.searchsorted(cum, sampler.random(batch) * cum[-1], side="right")
        weights = (size * priorities[indices] / cum[-1]) ** -BETA
        weights /= weights.max()
        return {**{name: value[indices] for name, value in fields.items()}, "weights": weights}, indices

    def as_numpy() -> None:
        _, indices = sample()
        priorities[indices] = (np.abs(td) + EPS) ** ALPHA

    def as_torch() -> None:
        sampled, indices = sample()
        _ = {k: torch.from_numpy(v) for k, v in sampled.items()}
        priorities[indices] = (td_torch.abs().numpy() + EPS) ** ALPHA

    return {"numpy": as_numpy, "torch": as_torch}


def time_per_call(step: Step, calls: int) -> tuple[float, float]:
    """Wall-clock and CPU (process) seconds per call."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        step()
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


OURS = ("ptl_rl", "ptl_rl-numpy")


def speedups(cpu: dict[str, list[float]], name: str) -> dict[str, float]:
    """Each of ours' throughput over ``name``'s: the median over the rounds of ``name``'s CPU time over ours.

    Within a round the implementations run one right after the other, so a burst of load from other
    processes hits a round's ratio less than it hits the ratio of two medians taken over all rounds.
    """
    return {
        ours: statistics.median(theirs / own for theirs, own in zip(cpu[name], cpu[ours], strict=True))
        for ours in OURS
        if ours in cpu
    }


def table(records: list[dict]) -> str:
    """The docs' table: per variant and implementation, CPU us per call and ptl_rl's speed-up over it."""
    rows = []
    for variant in VARIANTS:
        for name in dict.fromkeys(n for r in records for n in r.get("medians", {}).get(variant, {})):
            held = _records.having(records, variant, name)
            speedup = []
            for ours in OURS:
                mine = _records.having(held, variant, ours)
                if name == ours or not mine or (name in OURS and ours != "ptl_rl"):
                    speedup.append("-")
                    continue
                rounds = [r["repeats"][variant] for r in mine]  # the ratio within each interleaved round:
                per_round = [a / b for r in rounds for a, b in zip(r[name]["cpu_us"], r[ours]["cpu_us"], strict=True)]
                ratio = _records.cell(mine, (variant, name, "speedup", ours), "{:.2f}")
                speedup.append(f"{ratio} ({_records.span(per_round)})")
            label = name if variant == "numpy" else f"{name}, to torch"
            cpu_us = _records.cell(held, (variant, name, "cpu_us"), "{:.0f}")
            rows.append([label, cpu_us, *speedup, _records.runs(held)])
    sizes = "/".join(sorted({f"{r['config']['size']:,}" for r in records}))
    header = [f"sample + update at {sizes}", "CPU us", "ptl_rl faster (rounds)", "ptl_rl-numpy faster", "run (UTC)"]
    return _records.rst_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300, help="sample+update calls per round and implementation")
    _records.add_options(parser, "prioritized")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("prioritized", args, args.results, peers=PEERS)
    torch.set_num_threads(1)

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
    for peer in PEERS:
        if impls[peer] is None:
            print(f"{peer} is not installed: skipping it (pip install {peer})")
            del impls[peer]
    steps: dict[str, dict[str, Step]] = {name: steps for name, steps in impls.items() if steps is not None}
    for by_variant in steps.values():  # warm caches and allocators
        for step in by_variant.values():
            time_per_call(step, 20)
    rounds = {v: {name: {"wall_us": [], "cpu_us": []} for name in steps} for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            for name, by_variant in steps.items():
                w, c = time_per_call(by_variant[variant], args.calls)
                rounds[variant][name]["wall_us"].append(w * 1e6)
                rounds[variant][name]["cpu_us"].append(c * 1e6)

    # On a shared machine wall time includes time spent waiting for a core; CPU time does not.
    print(f"prioritized sample({args.batch}) + update({args.batch}) at {args.size:,} stored transitions")
    print(f"median over {args.rounds} interleaved rounds of {args.calls} calls; speed-up: median over the rounds")
    print("of its CPU time / ptl_rl's in the same round")
    medians: dict = {}
    for variant, by_name in rounds.items():
        cpu = {name: times["cpu_us"] for name, times in by_name.items()}
        medians[variant] = {
            name: {
                "wall_us": statistics.median(times["wall_us"]),
                "cpu_us": statistics.median(times["cpu_us"]),
                "speedup": speedups(cpu, name),
            }
            for name, times in by_name.items()
        }
        print(
            f"\n[{variant}]{'implementation':<16}{'wall us':>10}{'cpu us':>10}{'batches/s (cpu)':>18}{'speed-up':>10}"
        )
        for name, m in medians[variant].items():
            line = f"{m['wall_us']:>10.1f}{m['cpu_us']:>10.1f}{1e6 / m['cpu_us']:>18.0f}{m['speedup']['ptl_rl']:>9.2f}x"
            print(f"{'':{len(variant) + 2}}{name:<16}{line}")
        for ours in OURS:
            for peer in PEERS:
                if ours in by_name and peer in by_name:
                    by_cpu = medians[variant][peer]["speedup"][ours]
                    print(f"{ours} throughput / {peer} throughput ({variant}): {by_cpu:.2f} (CPU time)")
    run.save(medians, rounds)


if __name__ == "__main__":
    main()

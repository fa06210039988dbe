"""Pixel-scale replay side by side: memory, sample speed and insert speed of Atari-shaped transitions.

One run measures, interleaved round by round (so load from other processes hits
every implementation alike), medians over ``--repeats`` rounds:

* **Memory** (bytes per transition, and the ratio to the naive ring that stores
  ``obs`` and ``next_obs`` [4, 84, 84] uint8 in full): ptl_rl's
  ``FrameStorage`` filled with ``--capacity`` 3-step transitions of 8
  interleaved envs (``NStepTransform`` output, episode ends included), the
  naive ring, Tianshou's ``VectorReplayBuffer(stack_num=4,
  save_only_last_obs=True, ignore_obs_next=True)``, cpprb's ``ReplayBuffer``
  (``next_of="obs", stack_compress="obs"``), SB3's ``ReplayBuffer`` with and
  without ``optimize_memory_usage`` (allocated bytes), and Ptan (quoted, not
  measured: Ptan is not installed here).
* **Sampling**: ``sample(256)`` of stacked ``obs`` and ``next_obs``, converted to
  torch tensors; goals ptl_rl >= 0.9x cpprb and >= 1.5x Tianshou.
* **Insert**: one vector step of 8 envs (3-step transitions from
  ``NStepTransform``, prepared beforehand) into ``FrameStorage.add``, trusted
  (``check=False``: what a buffer fed by an ``NStepTransform`` does) and
  checked (``check=True``: every stack compared, for foreign data), through
  ``ReplayBuffer.add`` (its interrupt record included) and into the storage
  alone, against a bare numpy ring copying the same 8 new 84x84 frames (the
  goal: >= 0.9x; once from compact copies of them, once read out of the
  batches' own ``obs`` as the storage reads them), and against a naive ring
  copying ``obs`` and ``next_obs`` in full. ``--only insert`` runs this part alone.

cpprb, Tianshou and SB3 are installed when the benchmark runs (``pip install
--no-deps --target`` into ``--peers-dir``, so the project's environment is not
changed; Tianshou's package ``__init__`` pulls a long list of dependencies, so
only its buffer modules are imported); a peer that cannot be installed or
imported is skipped. With the peers installed in the running environment
(say a venv of their own), pass ``--no-install --peers-dir`` that venv's
``site-packages``.

Each run appends a record (date, commit, load, machine with the peers'
versions, arguments, medians, every round: ``_records.py``) to
``benchmarks/results/pixels.json``; ``--only insert`` records the insert part
alone. The Ptan figure is quoted, not measured: it is printed, never recorded.

    python benchmarks/pixels.py [--capacity 100000] [--repeats 7] [--no-install] [--only insert]
    python benchmarks/pixels.py --table      # the docs' tables, from the records
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import _records
import numpy as np
import torch

import ptl_rl
from ptl_rl import FrameStorage, NStepTransform, ReplayBuffer, TransitionBatch
from ptl_rl.replay.frames import COMPILED_INSERT

NUM_ENVS, STACK, SIDE, N_STEP, GAMMA, BATCH = 8, 4, 84, 3, 0.99, 256
FRAME_BYTES = SIDE * SIDE
NAIVE_OBS_BYTES = 2 * STACK * FRAME_BYTES  # obs + next_obs per transition
PEERS = ("cpprb==11.0.0", "tianshou==2.0.1", "stable-baselines3==2.9.2")
PEER_NAMES = tuple(peer.split("==")[0] for peer in PEERS)
PTAN_QUOTED = 0.51  # the side-by-side measurement of Ptan (ptan is not installed here)


# ---------------------------------------------------------------------------- the stream
class AtariLikeStream:
    """1-step vector transitions of ``NUM_ENVS`` envs with 4-frame stacks, as FrameStackObservation returns them.

    Frames are drawn from a bank of random 84x84 uint8 frames; episodes end
    with probability ``1 / mean_episode`` per step (terminated or truncated
    alike), and a new episode's stack repeats its first frame ("reset" padding).
    """

    def __init__(self, seed: int = 0, mean_episode: int = 800, bank: int = 512) -> None:
        self.rng = np.random.default_rng(seed)
        self.bank = self.rng.integers(0, 256, (bank, SIDE, SIDE), dtype=np.uint8)
        self.p_end = 1.0 / mean_episode
        self.stacks = np.repeat(self._frames()[:, None], STACK, axis=1)
        self.env_id = np.arange(NUM_ENVS)

    def _frames(self) -> np.ndarray:
        return self.bank[self.rng.integers(0, len(self.bank), NUM_ENVS)]

    def __iter__(self) -> Iterator[TransitionBatch]:
        return self

    def __next__(self) -> TransitionBatch:
        obs = self.stacks
        nxt = np.concatenate([obs[:, 1:], self._frames()[:, None]], axis=1)
        end = self.rng.random(NUM_ENVS) < self.p_end
        trunc = end & (self.rng.random(NUM_ENVS) < 0.5)
        batch = TransitionBatch(
            obs=obs,
            action=self.rng.integers(0, 6, NUM_ENVS),
            reward=self.rng.standard_normal(NUM_ENVS).astype(np.float32),
            next_obs=nxt,
            terminated=end & ~trunc,
            truncated=trunc,
            discount=np.full(NUM_ENVS, GAMMA, np.float32),
            env_id=self.env_id,
        )
        self.stacks = nxt.copy()
        if end.any():  # reset: the first frame repeated
            self.stacks[end] = np.repeat(self._frames()[end][:, None], STACK, axis=1)
        return batch


def nstep_batches(count: int, seed: int = 0) -> Iterator[TransitionBatch]:
    """``count`` NStepTransform outputs (3-step transitions, about 8 per batch)."""
    nstep = NStepTransform(AtariLikeStream(seed), n=N_STEP, gamma=GAMMA)
    for _ in range(count):
        yield next(nstep)


# ---------------------------------------------------------------------------- peers
def install_peers(directory: str) -> None:
    """pip-install the peers without dependencies into ``directory`` (appended to sys.path: ours win)."""
    if not all(os.path.exists(os.path.join(directory, p.split("==")[0].replace("-", "_"))) for p in ("cpprb",)):
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", directory, *PEERS]
        cmd += ["pandas", "deepdiff", "orderly_set", "cachebox", "sensai-utils", "overrides", "numba", "llvmlite"]
        subprocess.run(cmd, check=False)
    if directory not in sys.path:
        sys.path.append(directory)


def import_tianshou_buffers(directory: str) -> Any:
    """Tianshou's VectorReplayBuffer, importing only its data modules (its package __init__ needs tensorboard & co)."""
    root = os.path.join(directory, "tianshou")
    if not os.path.isdir(root):
        raise ImportError("tianshou is not installed")
    for name, path in (("tianshou", root), ("tianshou.data", os.path.join(root, "data"))):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module
    import importlib

    data = sys.modules["tianshou.data"]
    # what tianshou/data/__init__.py would export, in dependency order (only the buffer's needs)
    for module, names in (
        ("tianshou.data.batch", ("Batch",)),
        ("tianshou.data.utils.converter", ("to_numpy", "to_torch")),
        ("tianshou.data.utils.segtree", ("SegmentTree",)),
        ("tianshou.data.buffer.buffer_base", ("ReplayBuffer",)),
        ("tianshou.data.buffer.prio", ("PrioritizedReplayBuffer",)),
        ("tianshou.data.buffer.her", ("HERReplayBuffer",)),
        ("tianshou.data.buffer.manager", ("ReplayBufferManager", "PrioritizedReplayBufferManager")),
        ("tianshou.data.buffer.manager", ("HERReplayBufferManager",)),
    ):
        loaded = importlib.import_module(module)
        for name in names:
            setattr(data, name, getattr(loaded, name))
    from tianshou.data.buffer.vecbuf import VectorReplayBuffer

    return data.Batch, VectorReplayBuffer


def _batch_nbytes(batch: Any) -> int:
    """Bytes of the numpy arrays in a Tianshou Batch (recursively)."""
    total = 0
    for value in batch.__dict__.values():
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif hasattr(value, "__dict__") and type(value).__name__ == "Batch":
            total += _batch_nbytes(value)
    return total


def cpprb_rss_per_transition(capacity: int, steps: int, directory: str) -> float:
    """cpprb keeps its arrays in C++: measure the resident-memory growth of a fresh process that fills one."""
    code = (
        f"import sys; sys.path.append({directory!r}); sys.path.insert(0, {os.path.dirname(__file__)!r});"
        f"import pixels; pixels.print_cpprb_rss({capacity}, {steps})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1]) / capacity


def print_cpprb_rss(capacity: int, steps: int) -> None:
    stream = AtariLikeStream(seed=3)
    next(stream)  # allocate the stream's arrays before the baseline
    before = rss_bytes()
    impl = Cpprb(capacity)
    impl.fill(stream, steps)
    print(rss_bytes() - before)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------- implementations
class Impl:
    """One replay implementation: ``fill(batches)``, ``sample()`` -> torch tensors, and its bytes."""

    name = ""
    nbytes: int = 0

    def sample(self) -> Any:
        raise NotImplementedError


class PtlRl(Impl):
    name = "ptl_rl"

    def __init__(self, capacity: int) -> None:
        self.buffer = ReplayBuffer(
            None, capacity, seed=0, storage=functools.partial(FrameStorage, stack_axis=0, n_step=N_STEP, check=False)
        )

    def fill(self, batches: list[TransitionBatch]) -> None:
        for b in batches:
            self.buffer.add(b)
        self.nbytes = self.buffer.storage.nbytes

    def sample(self) -> Any:
        return self.buffer.sample(BATCH).to_torch()


class Tianshou(Impl):
    name = "tianshou"

    def __init__(self, capacity: int, directory: str) -> None:
        self.Batch, vector_buffer = import_tianshou_buffers(directory)
        self.buffer = vector_buffer(capacity, NUM_ENVS, stack_num=STACK, ignore_obs_next=True, save_only_last_obs=True)

    def fill(self, stream: AtariLikeStream, steps: int) -> None:
        for _ in range(steps):
            b = next(stream)
            self.buffer.add(
                self.Batch(
                    obs=b["obs"],
                    act=b["action"],
                    rew=b["reward"],
                    terminated=b["terminated"],
                    truncated=b["truncated"],
                    obs_next=b["next_obs"],
                    info={},
                ),  # fmt: skip
                buffer_ids=np.arange(NUM_ENVS),
            )
        self.nbytes = _batch_nbytes(self.buffer._meta)

    def sample(self) -> Any:
        batch, _ = self.buffer.sample(BATCH)
        return torch.from_numpy(batch.obs), torch.from_numpy(batch.obs_next)


class Cpprb(Impl):
    """cpprb has no vector envs: it is fed env 0's steps only, in order, 8 vector steps per 8 transitions."""

    name = "cpprb"

    def __init__(self, capacity: int) -> None:
        import cpprb

        env_dict = {
            "obs": {"shape": (STACK, SIDE, SIDE), "dtype": np.uint8},
            "act": {"dtype": np.int64},
            "rew": {"dtype": np.float32},
            "done": {"dtype": np.float32},
        }
        self.buffer = cpprb.ReplayBuffer(capacity, env_dict, next_of="obs", stack_compress="obs")

    def fill(self, stream: AtariLikeStream, steps: int) -> None:
        for _ in range(steps * NUM_ENVS):  # consecutive rows must be consecutive steps of one env
            b = next(stream)
            self.buffer.add(
                obs=b["obs"][0], act=b["action"][0], rew=b["reward"][0], next_obs=b["next_obs"][0],
                done=float(b["terminated"][0]),
            )  # fmt: skip
            if b["terminated"][0] or b["truncated"][0]:
                self.buffer.on_episode_end()

    def sample(self) -> Any:
        s = self.buffer.sample(BATCH)
        return torch.from_numpy(s["obs"]), torch.from_numpy(s["next_obs"])


def sb3_bytes(capacity: int) -> dict[str, float] | None:
    """Allocated bytes per transition of SB3's ReplayBuffer, default and optimize_memory_usage (no fill needed)."""
    try:
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
    except Exception:  # noqa: BLE001 - any import failure means: skip the peer
        return None
    obs_space = spaces.Box(0, 255, (STACK, SIDE, SIDE), np.uint8)
    out = {}
    for optimize in (False, True):
        buffer = SB3Buffer(
            capacity, obs_space, spaces.Discrete(6), device="cpu", n_envs=NUM_ENVS,
            optimize_memory_usage=optimize, handle_timeout_termination=not optimize,
        )  # fmt: skip
        arrays = [v for v in vars(buffer).values() if isinstance(v, np.ndarray)]
        out["sb3_optimized" if optimize else "sb3"] = sum(a.nbytes for a in arrays) / capacity
        del buffer
    return out


# ---------------------------------------------------------------------------- timing
def _prefault(*arrays: np.ndarray) -> None:
    """Write every page once: time the steady state of a filled replay, not first-touch page faults."""
    for a in arrays:
        flat = a.reshape(-1).view(np.uint8)
        flat[::4096] = flat[::4096].copy()  # one real write per 4 KiB page (a copy: numpy skips self-assignment)


def median_rate(fn: Callable[[], Any], calls: int) -> float:
    """Calls per second of one round (CPU time of this process: single-threaded, robust to other load)."""
    start = time.process_time()
    for _ in range(calls):
        fn()
    return calls / max(time.process_time() - start, 1e-9)


def calls_per_s(fn: Callable[..., Any], arguments: list[tuple[Any, ...]]) -> float:
    """Calls per second of ``fn(*args)`` over ``arguments`` (CPU time)."""
    start = time.process_time()
    for args in arguments:
        fn(*args)
    return len(arguments) / max(time.process_time() - start, 1e-9)


class Ring:
    """The hand-written limit: slice writes of each step's rows into preallocated arrays (wrapping)."""

    def __init__(self, *arrays: np.ndarray) -> None:
        self.arrays, self.cursor = arrays, 0
        _prefault(*arrays)

    def add(self, *values: np.ndarray) -> None:
        count = len(values[0])
        if self.cursor + count > len(self.arrays[0]):
            self.cursor = 0
        for array, value in zip(self.arrays, values, strict=True):
            array[self.cursor : self.cursor + count] = value
        self.cursor += count


def insert_rates(capacity: int, rounds: int, calls: int) -> dict[str, list[float]]:
    """Per round: vector steps/s into FrameStorage (trusted, checked, through a buffer), a bare ring, a naive ring."""
    prepared = list(nstep_batches(calls + 64, seed=1))
    stream = AtariLikeStream(seed=1)
    new_frames = [next(stream)["next_obs"][:, -1].copy() for _ in range(calls)]  # 8 new frames a vector step
    naive_capacity = min(capacity, 20_000)  # the full naive ring of 100k would need 5.6 GB
    bare = Ring(np.zeros((capacity, SIDE, SIDE), np.uint8))
    bare_batch = Ring(np.zeros((capacity, SIDE, SIDE), np.uint8))
    naive = Ring(*(np.zeros((naive_capacity, STACK, SIDE, SIDE), np.uint8) for _ in range(2)))
    rates: dict[str, list[float]] = {
        "ptl_rl trusted": [],
        "ptl_rl checked": [],
        "buffer.add trusted": [],
        "bare_frames": [],
        "bare_from_batch": [],
        "naive_obs_next_obs": [],
    }
    timed = prepared[64:]
    for _ in range(rounds):
        for name, check, through_buffer in (
            ("ptl_rl trusted", False, False),
            ("ptl_rl checked", True, False),
            ("buffer.add trusted", False, True),
        ):
            make = functools.partial(FrameStorage, stack_axis=0, n_step=N_STEP, check=check)
            buffer = ReplayBuffer(None, capacity, warmup=0, storage=make)
            storage = buffer.storage
            for b in prepared[:64]:  # warm up (untimed): allocate, and give every env a previous stack
                storage.add(b)
            links = storage._links
            _prefault(storage.pool, links.obs_refs, links.next_refs, *storage._fields.fields.values())
            add = buffer.add if through_buffer else storage.add
            rates[name].append(calls_per_s(add, [(b,) for b in timed]))
        rates["bare_frames"].append(calls_per_s(bare.add, [(f,) for f in new_frames]))
        # the same limit reading the 8 new frames where the storage reads them: out of the batch's own obs
        rates["bare_from_batch"].append(calls_per_s(bare_batch.add, [(b["obs"][:, -1],) for b in timed]))
        rates["naive_obs_next_obs"].append(calls_per_s(naive.add, [(b["obs"], b["next_obs"]) for b in timed]))
    return rates


# ---------------------------------------------------------------------------- the docs' tables
INSERT_LABELS = {
    "ptl_rl trusted": "``FrameStorage.add``, trusted (``check=False``)",
    "buffer.add trusted": "``ReplayBuffer.add``, trusted",
    "ptl_rl checked": "``FrameStorage.add``, checked (``check=True``)",
    "bare_frames": "bare ring, 8 new frames from compact copies",
    "bare_from_batch": "bare ring, 8 new frames read from the batch",
    "naive_obs_next_obs": "naive ring, obs and next_obs in full",
}


def table(records: list[dict[str, Any]]) -> str:
    """The docs' tables: bytes per transition, sample(256) speed, insert speed, from the records."""
    cell, runs, out = _records.cell, _records.runs, []
    memory = []
    for label in dict.fromkeys(k for r in records for k in r["medians"].get("memory", {})):
        held = _records.having(records, "memory", label)
        memory.append([label, cell(held, ("memory", label, "bytes"), "{:,.0f}"),
                       cell(held, ("memory", label, "x_naive"), "{:.3f}"), runs(held)])  # fmt: skip
    if memory:
        slots = "/".join(sorted({f"{r['config']['capacity']:,}" for r in records if r["medians"].get("memory")}))
        header = [f"{slots} transitions, [4, 84, 84] uint8", "B per transition", "x naive", "run (UTC)"]
        out.append(_records.rst_table(header, memory))
    sample = []
    for name in dict.fromkeys(k for r in records for k in r["medians"].get("sample", {})):
        held = _records.having(records, "sample", name)
        over = "-" if name == "ptl_rl" else cell(held, ("sample", name, "ptl_rl_over"), "{:.2f}")
        goal = {"cpprb": ">= 0.9", "tianshou": ">= 1.5"}.get(name, "-")
        sample.append([name, cell(held, ("sample", name, "batches_per_s"), "{:,.0f}"), over, goal, runs(held)])
    if sample:
        header = ["sample 256 obs + next_obs to torch", "batches/s", "ptl_rl / it", "goal", "run (UTC)"]
        out.append(_records.rst_table(header, sample))
    insert = []
    for name, label in INSERT_LABELS.items():
        held = _records.having(records, "insert", name)
        if held:
            insert.append([label, cell(held, ("insert", name, "steps_per_s"), "{:,.0f}"),
                           *(cell(held, ("insert", name, f"over_{k}"), "{:.2f}")
                             for k in ("bare_frames", "bare_from_batch", "naive_obs_next_obs")),
                           runs(held)])  # fmt: skip
    if insert:
        header = ["insert one vector step (8 envs)", "steps/s", "/ compact", "/ from batch", "/ naive", "run (UTC)"]
        out.append(_records.rst_table(header, insert))
    return "\n\n".join(out)


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--sample-calls", type=int, default=200)
    p.add_argument("--insert-calls", type=int, default=2000)
    p.add_argument("--peers-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "ptl_rl_bench_peers"))
    p.add_argument("--no-install", action="store_true", help="use only peers already in --peers-dir")
    p.add_argument("--only", choices=["all", "insert"], default="all", help="insert: only the insert rates")
    _records.add_options(p, "pixels")
    args = p.parse_args(argv)
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("pixels", args, args.results, peers=PEER_NAMES if args.only == "all" else ())
    medians: dict[str, Any] = {"compiled_insert": bool(COMPILED_INSERT)}
    repeats: dict[str, Any] = {}
    torch.set_num_threads(1)
    print(f"ptl_rl {ptl_rl.__version__}, numpy {np.__version__}, torch {torch.__version__}")
    print(f"load average at start: {os.getloadavg()}")
    print(f"FrameStorage insert: {'compiled (_frame_insert)' if COMPILED_INSERT else 'pure Python'}")
    if args.only == "insert":
        print_insert(args, medians, repeats)
        run.save(medians, repeats)
        return
    if not args.no_install:
        install_peers(args.peers_dir)
    elif args.peers_dir not in sys.path:
        sys.path.append(args.peers_dir)

    steps = args.capacity // NUM_ENVS + 8  # vector steps that fill the capacity (about 1 transition per env step)
    impls: dict[str, Impl] = {}
    ours = PtlRl(args.capacity)
    t = time.perf_counter()
    ours.fill(list(nstep_batches(steps + N_STEP)))
    impls["ptl_rl"] = ours
    print(f"filled ptl_rl with {len(ours.buffer)} transitions in {time.perf_counter() - t:.1f} s")
    for name, make in (
        ("tianshou", lambda: Tianshou(args.capacity, args.peers_dir)),
        ("cpprb", lambda: Cpprb(args.capacity)),
    ):
        try:
            impl = make()
        except Exception as error:  # noqa: BLE001 - a peer that fails to import is skipped
            print(f"skipping {name}: {type(error).__name__}: {error}")
            continue
        t = time.perf_counter()
        impl.fill(AtariLikeStream(seed=3), steps)
        impls[name] = impl
        print(f"filled {name} in {time.perf_counter() - t:.1f} s")

    # ------------------------------------------------------------- memory
    print(f"\nmemory at {args.capacity} transitions (84x84x4 uint8, 8 envs, 3-step returns), bytes per transition:")
    naive = NAIVE_OBS_BYTES + 8 + 4 + 4 + 1 + 1 + 8  # + action, reward, discount, flags, env_id
    rows = {"naive ring (obs + next_obs in full)": naive, "ptl_rl FrameStorage": ours.nbytes / args.capacity}
    if "tianshou" in impls:
        rows["tianshou (stack dedup, its arrays)"] = impls["tianshou"].nbytes / args.capacity
    if "cpprb" in impls:
        cpprb_bytes = cpprb_rss_per_transition(args.capacity, steps, args.peers_dir)
        rows["cpprb (next_of + stack_compress, RSS growth of a fresh process)"] = cpprb_bytes
    sb3 = sb3_bytes(args.capacity)
    if sb3 is None:
        print("  skipping SB3: not importable")
    else:
        rows["SB3 ReplayBuffer (allocated)"] = sb3["sb3"]
        rows["SB3 optimize_memory_usage (allocated; no truncation handling)"] = sb3["sb3_optimized"]
    medians["memory"] = {label: {"bytes": value, "x_naive": value / naive} for label, value in rows.items()}
    rows["Ptan (quoted from the issue, not measured)"] = PTAN_QUOTED * naive
    for label, value in rows.items():
        print(f"  {label:64s} {value:9.0f} B  {value / naive:6.3f}x naive")
    ratio = ours.nbytes / args.capacity / naive
    print(f"  goal: ptl_rl <= 0.135x naive -> {ratio:.4f}x ({'met' if ratio <= 0.135 else 'NOT met'});")
    per_million = ours.nbytes / args.capacity * 1e6 / 2**30
    print(f"  1M transitions would need {per_million:.2f} GiB (goal: fit in 8 GB)")

    # ------------------------------------------------------------- sampling, interleaved rounds
    rates: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(args.repeats):
        for name, impl in impls.items():
            rates[name].append(median_rate(impl.sample, args.sample_calls))
    med = {name: statistics.median(r) for name, r in rates.items()}
    medians["sample"] = {
        name: {"batches_per_s": value, "ptl_rl_over": med["ptl_rl"] / value} for name, value in med.items()
    }
    repeats["sample"] = rates
    print(f"\nsample({BATCH}) of stacked obs + next_obs -> torch, median of {args.repeats} rounds (CPU time):")
    for name, value in med.items():
        print(f"  {name:10s} {value:9.1f} batches/s")
    if "cpprb" in med:
        r = med["ptl_rl"] / med["cpprb"]
        print(f"  ptl_rl / cpprb    = {r:.3f} (goal >= 0.9: {'met' if r >= 0.9 else 'NOT met'})")
    if "tianshou" in med:
        r = med["ptl_rl"] / med["tianshou"]
        print(f"  ptl_rl / tianshou = {r:.3f} (goal >= 1.5: {'met' if r >= 1.5 else 'NOT met'})")

    print_insert(args, medians, repeats)
    run.save(medians, repeats)


def print_insert(args: argparse.Namespace, medians: dict[str, Any], repeats: dict[str, Any]) -> None:
    """The insert part: vector steps/s of each insert and the ratios to the hand-written limits."""
    ins = insert_rates(args.capacity, args.repeats, args.insert_calls)
    im = {name: statistics.median(r) for name, r in ins.items()}
    limits = ("bare_frames", "bare_from_batch", "naive_obs_next_obs")
    medians["insert"] = {
        name: {"steps_per_s": value, **{f"over_{k}": value / im[k] for k in limits}} for name, value in im.items()
    }
    repeats["insert"] = ins
    print(f"\ninsert of one vector step of {NUM_ENVS} envs (3-step transitions), median of {args.repeats} rounds:")
    for name, value in im.items():
        print(f"  {name:20s} {value:10.0f} steps/s")
    for name in ("ptl_rl trusted", "ptl_rl checked", "buffer.add trusted"):
        r = im[name] / im["bare_frames"]
        verdict = "met" if r >= 0.9 else "NOT met"
        print(f"  {name:18s} / bare ring of the 8 new frames = {r:.3f} (goal >= 0.9: {verdict})")
        print(f"  {name:18s} / bare ring, frames read from the batch = {im[name] / im['bare_from_batch']:.3f}")
        print(f"  {name:18s} / naive obs+next_obs ring       = {im[name] / im['naive_obs_next_obs']:.3f}")
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

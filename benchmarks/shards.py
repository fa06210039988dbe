"""The sharded replay service on a local two-node Ray cluster: the cost of each operation, the learner's sample
rate, ingest as shards are added, the rate limiter's achieved ratio, and a projection to 100 and 1,000 workers.

    python benchmarks/shards.py [--repeats 3] [--seconds 1.5]        # one record, ~4-5 minutes on 2 cores
    python benchmarks/shards.py --table                               # the docs' tables from the records

The cluster is ``ray.cluster_utils.Cluster``: two raylets ("nodes") of one CPU
each on this machine. The shards split each node's CPU between them (``num_cpus``
``1 / ceil(K / 2)``), which places them evenly on the two nodes (the record holds
how many shards landed on each node); writer actors reserve none and are spread
with the ``SPREAD`` strategy. Ray reserves CPUs, it does not pin processes, so
on 2 cores every part shares the same two cores: the learner (this process),
the shards, the writers, the limiter.

``ops``: the cost of each operation, median over repeats, each timed over
``--seconds``. *insert*: a ``ShardWriter`` in this process adds batches of
``--rows`` rows into one shard, ``max_in_flight`` 8, flushed at the end: us
per add and rows/s. CartPole-shaped rows (obs float32 [4]) and Atari-shaped
full rows (obs and next_obs uint8 [4, 84, 84], random bytes) into a shard of
``ArrayStorage``, one batch added again and again; Atari rows *each frame
once*: consecutive ``--rows``-row batches of a frame-stacked stream (below)
into a shard of ``FrameStorage`` (``stack_axis=0``, ``n_step``), whose writer
(``shards.writer()``) sends each frame once by itself
(``ptl_rl/distributed/frame_wire.py``). The stream is ``shard_wire.py``'s:
``--atari-envs`` envs of 84x84 random-byte frames stacked 4 by
``FrameStackObservation`` (autoreset, episodes ending at random, 1 in 200
steps, here truncated at 250) through ``ExperienceSource`` and
``NStepTransform(--n-step)``; every env's rows up to the end of its last
finished episode are taken once and played again and again (each round a new
episode of every env, its frames out of the writer's 256-frame window long
before), so every add is the next of a real stream. Its bytes on the wire
(``row_bytes``): the pickled size of each add's ``FrameMessage`` over two
rounds into one shard, per row, as ``shard_wire.py`` measures them. Where
such an add spends its time, in this process without Ray (one round of the
stream per repeat): the writer's encoding, the shard's decoding (the message
pickled and unpickled between them) and its ``FrameStorage`` insert.
*sample*: ``next()`` of ``BatchSampler(ShardedReplay(shards, prefetch=1),
256)`` over 2 shards (uniform CartPole rows, prioritized
CartPole rows, uniform Atari rows): us per batch. *priority update*:
``batch.update_priorities`` of 256 rows, sent asynchronously (the learner's
cost, the flush at the end included) and with ``sync_updates=True`` (a round
trip). *limiter*: grants of one row (``RateLimiter.insert``, a limit that
never blocks), each waited for (us per round trip) and 100 sent at once (us
per grant: what one limiter actor serves).

``learner``: batches/s of 256 CartPole rows through ``ShardedReplay`` (2
uniform shards, prefetch 1) + ``BatchSampler`` while 0, 1, 2 and 4 writer
actors add to the same shards as fast as they can.

``ingest``: rows/s stored by ``--writers`` writer actors adding as fast as they
can (each batch spread over the shards by env id), with 1, 2 and 4 shards:
CartPole rows, Atari full rows (``ArrayStorage``) and Atari rows each frame
once (``FrameStorage``, each writer its own envs of the stream above).

``limiter``: ``RateLimit.sample_to_insert_ratio(--spi, --min-size,
--error-buffer)``; two writer actors add ``--rows``-row batches, one sleeping
``--sleep`` s per add and the other 4x that, swapping speeds every
``--phase`` s, while the learner samples 256-row batches as fast as the limit
allows; the achieved samples per insert (after ``min_size``) against the
target, and the largest deviation of ``inserts * spi - samples`` from its
target seen at each look at the counts, against the error buffer.

The projection (``--table``) is computed from a record's medians and the
per-worker collection rates of the scale-out records (``--worker-rate``,
``--worker-rate-atari``: env steps/s of one worker, one transition each); its
Atari rows each frame once use the measured insert rate and bytes on the wire;
its assumptions are printed under it and stated in
``docs/design/replay-service.md``. Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import pickle
import sys
import textwrap
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import _records  # noqa: E402

import ptl_rl  # noqa: E402
from ptl_rl.distributed import RateLimit, ReplayShards, ShardedReplay  # noqa: E402

SAMPLE_BATCH = 256
ATARI_SHAPE = (4, 84, 84)
EPISODE_CAP = 250  # steps: the frame-stacked stream's episodes are truncated there (each env ends one)


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# ---------------------------------------------------------------------------- rows, shards, writers
def make_batch(rows: int, atari: bool, env_ids: np.ndarray, seed: int = 0) -> ptl_rl.TransitionBatch:
    """``rows`` transitions, CartPole-shaped (obs float32 [4]) or Atari-shaped (obs uint8 [4, 84, 84])."""
    rng = np.random.default_rng(seed)
    shape, dtype = (ATARI_SHAPE, np.uint8) if atari else ((4,), np.float32)
    obs = rng.integers(0, 255, (rows, *shape)).astype(dtype)
    return ptl_rl.TransitionBatch(
        obs=obs,
        action=np.zeros(rows, np.int64),
        reward=np.ones(rows, np.float32),
        next_obs=obs.copy(),
        terminated=np.zeros(rows, bool),
        truncated=np.zeros(rows, bool),
        discount=np.full(rows, 0.99, np.float32),
        env_id=np.asarray(env_ids, np.int64),
        policy_version=np.zeros(rows, np.int64),
    )


def row_bytes(atari: bool) -> int:
    batch = make_batch(1, atari, np.zeros(1))
    return int(sum(np.asarray(batch[k]).nbytes for k in batch.keys()))


def atari_stream(envs: int, n_step: int, cap: int = EPISODE_CAP) -> ptl_rl.TransitionBatch:
    """Whole episodes of ``envs`` envs of 84x84 frames stacked 4: ``shard_wire.py``'s stream (random-byte frames,
    ``FrameStackObservation``, autoreset, episodes ending at random, 1 in 200 steps) with episodes truncated at
    ``cap`` steps, through ``ExperienceSource`` and ``NStepTransform(n_step)``; every env's rows up to the end of
    its last finished episode (so the rows can be replayed: each round starts a new episode of every env). obs and
    next_obs uint8 [4, 84, 84] share frames across steps as a real stream's do; env ids 0 .. envs - 1."""
    import gymnasium as gym  # noqa: PLC0415
    import shard_wire  # noqa: PLC0415 - beside this script

    def make() -> gym.Env:
        return gym.wrappers.FrameStackObservation(gym.wrappers.TimeLimit(shard_wire.NoiseFrames(), cap), 4)

    rng = np.random.default_rng(0)
    source = ptl_rl.ExperienceSource(
        gym.vector.SyncVectorEnv([make for _ in range(envs)]), lambda obs: rng.integers(0, 4, len(obs)), seed=0
    )
    stream = iter(ptl_rl.NStepTransform(source, n=n_step, gamma=0.99))
    whole = ptl_rl.TransitionBatch.concat([next(stream) for _ in range(cap + n_step + 1)])  # every env ended one
    env_id, ended = np.asarray(whole["env_id"]), np.asarray(whole["terminated"]) | np.asarray(whole["truncated"])
    last = {int(e): int(np.flatnonzero(ended & (env_id == e))[-1]) for e in range(envs)}
    keep = np.arange(len(env_id)) <= np.asarray([last[int(e)] for e in env_id])
    return whole.rows(np.flatnonzero(keep))


def replayed(stream: ptl_rl.TransitionBatch, rows: int, first_env: int = 0) -> Any:
    """Consecutive ``rows``-row adds of ``stream`` (:func:`atari_stream`) played again and again, env ids
    ``first_env`` higher: an endless iterator. Each round starts a new episode of every env, as autoreset does;
    the adds are views of ``stream`` (the one that wraps round a copy)."""
    if first_env:
        fields = dict(stream.items())
        fields["env_id"] = np.asarray(stream["env_id"]) + first_env
        stream = ptl_rl.TransitionBatch.wrap(fields)
    total, start = len(stream), 0
    while True:
        end = start + rows
        if end <= total:
            yield stream.rows(slice(start, end))
        else:
            yield ptl_rl.TransitionBatch.concat([stream.rows(slice(start, total)), stream.rows(slice(0, end - total))])
        start = end % total


def wire_bytes(stream: ptl_rl.TransitionBatch, rows: int, rounds: int = 2) -> dict[str, float]:
    """What a writer into one ``FrameStorage`` shard sends per row of the replayed stream, ``rows`` rows an add:
    the pickled size of each add's ``FrameMessage`` (``pickle`` protocol 5, what Ray ships) and the frames sent,
    over ``rounds`` of the stream."""
    from ptl_rl.distributed.frame_wire import DEFAULT_WINDOW, FrameEncoder  # noqa: PLC0415

    encoder, sent, frames, count = FrameEncoder(0, 0, DEFAULT_WINDOW), 0, 0, 0
    adds = replayed(stream, rows)
    while count < rounds * len(stream):
        message = encoder.encode(next(adds))
        sent += len(pickle.dumps(message, protocol=5))
        frames, count = frames + len(message.frames), count + message.rows
    return {"bytes": sent / count, "frames": frames / count}


def dedup_parts(stream: ptl_rl.TransitionBatch, rows: int, n_step: int, repeats: int) -> dict[str, list[float]]:
    """Where an add of ``rows`` rows each frame once spends its time, in this process, no Ray: the writer's
    encoding, the shard's decoding (the message pickled and unpickled in between, as Ray ships it) and its
    ``FrameStorage`` insert of the rebuilt rows; us per add, ``repeats`` times over one round of the stream."""
    from ptl_rl.distributed.frame_wire import FrameDecoder, FrameEncoder  # noqa: PLC0415

    out: dict[str, list[float]] = {}
    adds = replayed(stream, rows)
    count = max(1, len(stream) // rows)
    storage = functools.partial(ptl_rl.FrameStorage, stack_axis=0, n_step=n_step)
    encoder, decoder, buffer = FrameEncoder(0, 0), FrameDecoder(), ptl_rl.ReplayBuffer(2_048, storage=storage)
    for _ in range(repeats):
        batches = [next(adds) for _ in range(count)]
        tick = time.perf_counter()
        messages = [pickle.dumps(encoder.encode(b), protocol=5) for b in batches]
        encoded = time.perf_counter()
        rebuilt = [decoder.decode(pickle.loads(m)) for m in messages]
        decoded = time.perf_counter()
        for batch in rebuilt:
            buffer.add(batch)
        stored = time.perf_counter()
        for key, spent in (("encode", encoded - tick), ("decode", decoded - encoded), ("store", stored - decoded)):
            out.setdefault(f"dedup {key} us_per_add", []).append(1e6 * spent / count)
    return out


def shards_of(
    num_shards: int, atari: bool, prioritized: bool, rate_limit: RateLimit | None = None, n_step: int | None = None
) -> ReplayShards:
    """Shards of ``ArrayStorage`` rows, or of a ``FrameStorage`` (stacks on axis 0, ``n_step``) when ``n_step``
    is given: its writers then send each frame once by themselves."""
    draws = ptl_rl.PrioritizedDraws(alpha=0.6, beta=0.4) if prioritized else None
    capacity = 2_048 if atari else 100_000
    storage = None if n_step is None else functools.partial(ptl_rl.FrameStorage, stack_axis=0, n_step=n_step)
    factory = functools.partial(ptl_rl.ReplayBuffer, capacity=capacity, draws=draws, storage=storage)
    # the shards split each node's CPU between them, which places them evenly on the two nodes (zero-CPU actors
    # may all land on one); Ray reserves, it does not pin: every process still runs on any core
    options = {"num_cpus": 1.0 / math.ceil(num_shards / 2), "scheduling_strategy": "SPREAD"}
    shards = ReplayShards(factory, num_shards, seed=0, actor_options=options, rate_limit=rate_limit)
    shards.stats()  # every shard started (its process imported ptl_rl): not timed
    shards.rate_counts()
    return shards


class WriterBody:
    """A collector stand-in (the body of a Ray actor): adds ready batches again and again, no env work."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.writer: Any = None
        self.adds: Any = None

    def target(self, writer: Any, rows: int, atari: bool, stream: Any = None, shift: int = 0) -> None:
        """Write with ``writer`` from now on: one batch of ``rows`` rows of 64 envs (so every shard gets some),
        or consecutive adds of ``stream`` (:func:`atari_stream`) replayed, env ids ``rank * shift`` higher."""
        self.writer = writer
        if stream is None:
            self.adds = itertools.repeat(make_batch(rows, atari, self.rank * 64 + np.arange(rows) % 64, self.rank))
        else:
            self.adds = replayed(stream, rows, self.rank * shift)

    def run(self, seconds: float, sleeps: list[float] | None = None, phase: float = 1.0) -> int:
        """Add for ``seconds``; ``sleeps[i]``: seconds slept after each add in phase ``i`` (cycled). Rows stored."""
        start = time.perf_counter()
        stored = self.writer.rows_stored
        while (now := time.perf_counter()) - start < seconds:
            self.writer.add(next(self.adds))
            if sleeps:
                time.sleep(sleeps[int((now - start) // phase) % len(sleeps)])
        self.writer.flush()
        return int(self.writer.rows_stored - stored)


WRITERS: list[Any] = []  # started once and pointed at each part's shards: an actor's start costs seconds


def writers_of(
    ray: Any, shards: ReplayShards, count: int, rows: int, atari: bool, stream: Any = None, shift: int = 0
) -> list[Any]:
    """``count`` writer actors pointed at ``shards`` (each with a writer of its own: a frame channel of its own),
    adding one batch again and again, or the batches of ``stream`` (an object ref) replayed."""
    cls = ray.remote(WriterBody).options(num_cpus=0, scheduling_strategy="SPREAD")
    WRITERS.extend(cls.remote(rank) for rank in range(len(WRITERS), count))
    handles = WRITERS[:count]
    ray.get([h.target.remote(shards.writer(), rows, atari, stream, shift) for h in handles])
    return handles


def fill(shards: ReplayShards, rows: int, atari: bool, total: int) -> None:
    writer = shards.writer()
    batch = make_batch(rows, atari, np.arange(rows) % 64)
    for _ in range(max(1, total // rows)):
        writer.add(batch)
    writer.flush()


def node_counts(ray: Any, shards: ReplayShards) -> list[int]:
    """How many shards run on each node (the placement the SPREAD strategy gave)."""
    nodes = ray.get(
        [h.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for h in shards.handles]
    )
    return sorted((nodes.count(n) for n in set(nodes)), reverse=True)


def timed(seconds: float, call: Any) -> tuple[float, int]:
    """Call ``call()`` for ``seconds`` (after one untimed call): (elapsed s, calls)."""
    call()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    return time.perf_counter() - start, calls


# ---------------------------------------------------------------------------- the parts
def bench_ops(ray: Any, args: argparse.Namespace, stream: ptl_rl.TransitionBatch) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for kind in ("cartpole", "atari", "atari dedup"):  # insert: one writer, one shard
        atari, dedup = kind != "cartpole", kind == "atari dedup"
        shards = shards_of(1, atari, False, n_step=args.n_step if dedup else None)
        writer = shards.writer()  # (over a FrameStorage: each frame once, by itself)
        adds = replayed(stream, args.rows) if dedup else itertools.repeat(
            make_batch(args.rows, atari, np.arange(args.rows) % 64))  # fmt: skip
        try:
            for _ in range(args.repeats):
                elapsed, calls = timed(args.seconds, lambda w=writer, a=adds: w.add(next(a)))
                tick = time.perf_counter()
                writer.flush()
                elapsed += time.perf_counter() - tick
                out.setdefault(f"insert {kind} us_per_add", []).append(1e6 * elapsed / calls)
                out.setdefault(f"insert {kind} rows_per_s", []).append(calls * args.rows / elapsed)
        finally:
            shards.close()
    for kind, atari, prioritized in (("cartpole", False, False), ("cartpole prioritized", False, True),
                                     ("atari", True, False)):  # fmt: skip
        shards = shards_of(2, atari, prioritized)
        try:
            fill(shards, args.rows, atari, 2_048 if atari else 20_000)
            for sync in (False, True) if prioritized else (False,):
                replay = ShardedReplay(shards, warmup=SAMPLE_BATCH, prefetch=1, seed=0, sync_updates=sync)
                sampler = ptl_rl.BatchSampler(replay, SAMPLE_BATCH)
                td = np.abs(np.random.default_rng(0).normal(size=SAMPLE_BATCH)).astype(np.float32)
                for _ in range(args.repeats):
                    if not prioritized:
                        elapsed, calls = timed(args.seconds, lambda s=sampler: next(s))
                        out.setdefault(f"sample {kind} us_per_batch", []).append(1e6 * elapsed / calls)
                        continue
                    spent, calls, start = 0.0, 0, time.perf_counter()
                    while time.perf_counter() - start < args.seconds:
                        batch = next(sampler)
                        tick = time.perf_counter()
                        batch.update_priorities(td)
                        spent += time.perf_counter() - tick
                        calls += 1
                    tick = time.perf_counter()
                    replay.flush_updates()
                    spent += time.perf_counter() - tick
                    name = "update sync us_per_call" if sync else "update async us_per_call"
                    out.setdefault(name, []).append(1e6 * spent / calls)
                    if not sync:
                        elapsed, count = timed(args.seconds, lambda s=sampler: next(s))
                        out.setdefault(f"sample {kind} us_per_batch", []).append(1e6 * elapsed / count)
        finally:
            shards.close()
    shards = shards_of(1, False, False, RateLimit.min_size(1))
    try:
        for _ in range(args.repeats):
            elapsed, calls = timed(args.seconds, lambda: ray.get(shards.limiter.insert.remote(1)))
            out.setdefault("limiter us_per_grant", []).append(1e6 * elapsed / calls)
            elapsed, calls = timed(args.seconds, lambda: ray.get([shards.limiter.insert.remote(1) for _ in range(100)]))
            out.setdefault("limiter us_per_grant_pipelined", []).append(1e6 * elapsed / (100 * calls))
    finally:
        shards.close()
    return out


def bench_learner(ray: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    shards = shards_of(2, False, False)
    try:
        fill(shards, args.rows, False, 20_000)
        writers = writers_of(ray, shards, max(args.busy), args.rows, False)
        replay = ShardedReplay(shards, warmup=SAMPLE_BATCH, prefetch=1, seed=0)
        sampler = ptl_rl.BatchSampler(replay, SAMPLE_BATCH)
        for _ in range(args.repeats):
            for busy in args.busy:  # interleaved: a change of load hits every count alike
                running = [w.run.remote(args.seconds + 1.0) for w in writers[:busy]]
                time.sleep(0.3 if busy else 0.0)  # the writers are adding
                elapsed, calls = timed(args.seconds, lambda s=sampler: next(s))
                written = sum(ray.get(running))
                out.setdefault(f"{busy} batches_per_s", []).append(calls / elapsed)
                out.setdefault(f"{busy} writer_rows_per_s", []).append(written / (args.seconds + 1.0))
    finally:
        shards.close()
    return out


def bench_ingest(
    ray: Any, args: argparse.Namespace, stream: ptl_rl.TransitionBatch
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    out: dict[str, list[float]] = {}
    placement: dict[str, list[int]] = {}
    stream_ref = ray.put(stream)
    for kind in ("cartpole", "atari", "atari dedup"):
        atari, dedup = kind != "cartpole", kind == "atari dedup"
        for num_shards in args.shard_counts:
            shards = shards_of(num_shards, atari, False, n_step=args.n_step if dedup else None)
            try:
                placement[str(num_shards)] = node_counts(ray, shards)
                extra = (stream_ref, args.atari_envs) if dedup else ()
                writers = writers_of(ray, shards, args.writers, args.rows, atari, *extra)
                for _ in range(args.repeats):
                    stored = sum(ray.get([w.run.remote(args.seconds) for w in writers]))
                    out.setdefault(f"{kind} {num_shards}", []).append(stored / args.seconds)
            finally:
                shards.close()
    return out, placement


def bench_limiter(ray: Any, args: argparse.Namespace) -> dict[str, Any]:
    limit = RateLimit.sample_to_insert_ratio(args.spi, args.min_size, args.error_buffer)
    shards = shards_of(2, False, False, limit)
    out: dict[str, Any] = {"target": args.spi, "error_buffer": args.error_buffer, "min_size": args.min_size}
    try:
        writers = writers_of(ray, shards, 2, args.rows, False)
        seconds = 4 * args.phase
        fast, slow = args.sleep, 4 * args.sleep
        running = [
            writers[0].run.remote(seconds, [fast, slow], args.phase),
            writers[1].run.remote(seconds, [slow, fast], args.phase),
        ]
        replay = ShardedReplay(shards, warmup=SAMPLE_BATCH, prefetch=1, seed=0, sample_timeout=0.5)
        sampler = ptl_rl.BatchSampler(replay, SAMPLE_BATCH)
        next(sampler)
        first = shards.rate_counts()
        deviations, start, batches = [], time.perf_counter(), 0
        while time.perf_counter() - start < seconds - 1.0:  # the writers run on for a while after this
            next(sampler)
            batches += 1
            if batches % 4 == 0:
                counts = shards.rate_counts()
                deviations.append(counts["inserts"] * args.spi - counts["samples"] - args.spi * args.min_size)
        last = shards.rate_counts()
        elapsed = time.perf_counter() - start
        while len(ray.wait(running, num_returns=2, timeout=0)[0]) < 2:  # sample on: the writers' last adds wait
            try:
                next(sampler)
            except TimeoutError:
                pass
        rows = ray.get(running)
        out["achieved"] = (last["samples"] - first["samples"]) / max(1, last["inserts"] - first["inserts"])
        out["largest_deviation"] = max(abs(d) for d in deviations) if deviations else None
        out["learner_batches_per_s"] = batches / elapsed
        out["writer_rows"] = rows
        out.update({k: last[k] for k in ("inserts", "samples", "blocked_inserts", "blocked_samples")})
    finally:
        shards.close()
    return out


# ---------------------------------------------------------------------------- the cluster, the run
def start_cluster(args: argparse.Namespace) -> tuple[Any, Any]:
    import ray  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, single-user Ray
    store = args.store_mb * 1024**2
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": store, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, object_store_memory=store)
    ray.init(address=cluster.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    cluster.wait_for_nodes()
    return ray, cluster


def measure(args: argparse.Namespace) -> None:
    run = _records.Run(
        "shards", {k: v for k, v in vars(args).items() if k != "write_docs"}, args.results, peers=["ray"]
    )
    stream = atari_stream(args.atari_envs, args.n_step)
    wire = wire_bytes(stream, args.rows)
    parts = dedup_parts(stream, args.rows, args.n_step, args.repeats)
    print(f"stream: {len(stream):,} rows, {wire['bytes']:,.0f} B and {wire['frames']:.3f} frames per row on the "
          "wire", flush=True)  # fmt: skip
    ray, cluster = start_cluster(args)
    medians: dict[str, Any] = {}
    repeats: dict[str, Any] = {}
    try:
        print(f"cluster: {len(ray.nodes())} nodes  ({load()})", flush=True)
        for name, part in (("ops", functools.partial(bench_ops, stream=stream)), ("learner", bench_learner)):
            values = part(ray, args)
            if name == "ops":
                values.update(parts)
            repeats[name] = values
            medians[name] = {k: _records.median(v) for k, v in values.items()}
            for key, value in medians[name].items():
                print(f"{name:8s} {key:36s} {value:14,.1f}", flush=True)
        values, placement = bench_ingest(ray, args, stream)
        repeats["ingest"] = values
        medians["ingest"] = {k: _records.median(v) for k, v in values.items()}
        medians["placement"] = placement
        for key, value in medians["ingest"].items():
            print(f"ingest   {key:36s} {value:14,.0f} rows/s  (shards per node {placement[key.split()[-1]]})")
        medians["limiter"] = bench_limiter(ray, args)
        print(f"limiter  {medians['limiter']}  ({load()})", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    medians["row_bytes"] = {"cartpole": row_bytes(False), "atari": row_bytes(True), "atari dedup": wire["bytes"]}
    medians["wire_frames_per_row"] = wire["frames"]
    medians["stream_rows"] = len(stream)
    run.save(medians, repeats)


# ---------------------------------------------------------------------------- tables
def us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def table(records: list[dict[str, Any]]) -> str:
    """The docs' tables from ``records``: operations, learner, ingest, limiter, and the projection of the latest."""
    if not records:
        return ""
    cell, span, out = _records.cell, _records.span, []
    per_add = span([r["config"]["rows"] for r in records], "{:.0f}")
    when = _records.runs(records)

    def sampled(key: str) -> str:  # rows/s of 256-row batches
        return _records.column(records, lambda r: SAMPLE_BATCH * 1e6 / r["medians"]["ops"][key], "{:,.0f}")

    ops = [[f"insert {per_add} {label}", cell(records, ("ops", f"insert {kind} us_per_add"), "{:,.0f}"),
            cell(records, ("ops", f"insert {kind} rows_per_s"), "{:,.0f}")]
           for kind, label in (("cartpole", "CartPole rows"), ("atari", "Atari full rows (ArrayStorage)"),
                               ("atari dedup", "Atari rows, each frame once (FrameStorage)"))]  # fmt: skip
    for key, label in (("encode", "writer's encoding"), ("decode", "shard's decoding"),
                       ("store", "shard's FrameStorage insert")):  # fmt: skip
        us_add = ("ops", f"dedup {key} us_per_add")  # (one process: where an add each frame once spends its time)
        ops.append([f"each frame once: {label} (in-process)", cell(records, us_add, "{:,.0f}"),
                    _records.column(records, lambda r, k=us_add[1]: r["config"]["rows"] * 1e6 / r["medians"]["ops"][k]
                                    if k in r["medians"]["ops"] else None, "{:,.0f}")])  # fmt: skip
    for kind, label in (("cartpole", "uniform CartPole"), ("cartpole prioritized", "prioritized CartPole"),
                        ("atari", "uniform Atari")):  # fmt: skip
        key = f"sample {kind} us_per_batch"
        ops.append([f"sample 256, {label}", cell(records, ("ops", key), "{:,.0f}"), sampled(key)])
    for key, label in (("update async us_per_call", "priority update 256, sent"),
                       ("update sync us_per_call", "priority update 256, waited"),
                       ("limiter us_per_grant", "limiter grant, waited"),
                       ("limiter us_per_grant_pipelined", "limiter grant, 100 in flight")):  # fmt: skip
        ops.append([label, cell(records, ("ops", key), "{:,.0f}"), "-"])
    out.append(_records.rst_table([f"operation, 2-node cluster, {when}", "us per call", "rows/s"], ops))
    busy = sorted({int(k.split()[0]) for r in records for k in r["medians"]["learner"] if k.endswith("batches_per_s")})
    rows = [[f"{n} writer(s) busy", cell(records, ("learner", f"{n} batches_per_s"), "{:,.0f}"),
             cell(records, ("learner", f"{n} batches_per_s"), "{:,.0f}", SAMPLE_BATCH),
             cell(records, ("learner", f"{n} writer_rows_per_s"), "{:,.0f}") if n else "-"]
            for n in busy]  # fmt: skip
    header = [f"learner, 256-row batches, {when}", "batches/s", "rows/s sampled", "rows/s written"]
    out.append(_records.rst_table(header, rows))
    counts = sorted({int(k.split()[-1]) for r in records for k in r["medians"]["ingest"]})
    writers = span([r["config"]["writers"] for r in records], "{:.0f}")
    placed = {n: " / ".join(sorted({"+".join(map(str, r["medians"]["placement"][str(n)])) for r in records}))
              for n in counts}  # fmt: skip
    rows = [[f"{n} shard(s)", cell(records, ("ingest", f"cartpole {n}"), "{:,.0f}"),
             cell(records, ("ingest", f"atari {n}"), "{:,.0f}"), cell(records, ("ingest", f"atari dedup {n}"),
             "{:,.0f}"), placed[n]] for n in counts]  # fmt: skip
    header = [f"ingest, {writers} writers, {when}", "CartPole rows/s", "Atari full rows/s",
              "Atari each frame once rows/s", "shards per node"]  # fmt: skip
    out.append(_records.rst_table(header, rows))
    lim = [r["medians"]["limiter"] for r in records]

    def over(key: str, fmt: str) -> str:
        return span([x[key] for x in lim if x.get(key) is not None], fmt)

    rows = [[over("target", "{:g}"), over("achieved", "{:.3f}"), over("error_buffer", "{:,.0f}"),
             over("largest_deviation", "{:,.0f}"), over("blocked_inserts", "{:.0f}"),
             over("blocked_samples", "{:.0f}")]]  # fmt: skip
    header = [f"limiter: target samples/insert, {when}", "achieved", "error buffer", "largest deviation",
              "blocked inserts", "blocked samples"]  # fmt: skip
    out.append(_records.rst_table(header, rows))
    out.append(projection(records[-1]))
    return "\n\n".join(out)


def projection(record: dict[str, Any]) -> str:
    """100 and 1,000 workers from the measured costs of ``record`` (the latest) and its projection parameters
    (``--worker-rate``, ``--worker-rate-atari``); the assumptions printed below the table."""
    args = argparse.Namespace(**record["config"])
    ops, med = record["medians"]["ops"], record["medians"]
    rows_per_add = record["config"]["rows"]
    bytes_cp, bytes_at = med["row_bytes"]["cartpole"], med["row_bytes"]["atari"]
    dedup_bytes = med["row_bytes"]["atari dedup"]  # measured on the wire: a FrameMessage's pickled bytes per row
    us_cp = 1e6 / ops["insert cartpole rows_per_s"]  # a shard's time per row stored
    us_at = 1e6 / ops["insert atari rows_per_s"]
    us_dedup = 1e6 / ops["insert atari dedup rows_per_s"]
    grants_per_s = 1e6 / ops.get("limiter us_per_grant_pipelined", ops["limiter us_per_grant"])
    learner = med["learner"]["0 batches_per_s"] * SAMPLE_BATCH  # rows/s the learner can sample, CartPole rows
    atari_sampled = 1e6 / ops["sample atari us_per_batch"] * SAMPLE_BATCH
    rows = []
    for name, rate, us_row, row_b, sampled in (
        ("CartPole", args.worker_rate, us_cp, bytes_cp, learner),
        ("Atari, full rows", args.worker_rate_atari, us_at, bytes_at, atari_sampled),
        ("Atari, deduplicated", args.worker_rate_atari, us_dedup, dedup_bytes, atari_sampled),
    ):
        for workers in (100, 1_000):
            inserted = workers * rate
            rows.append([
                f"{name}, {workers:,} workers", f"{inserted:,.0f}", f"{inserted * row_b / 1e6:,.0f}",
                f"{math.ceil(inserted * us_row / 1e6):,}", f"{inserted / rows_per_add / grants_per_s:.2f}",
                f"{sampled / inserted:.3g}",
            ])  # fmt: skip
    header = [f"projection from {_records.date_of(record)}", "rows/s", "MB/s", "shards (cores)",
              "limiter cores", "max samples/insert"]  # fmt: skip
    notes = (
        f"(workers of {args.worker_rate:,} CartPole / {args.worker_rate_atari:,} Atari env steps/s, one row each; a "
        f"shard stores {1e6 / us_cp:,.0f} CartPole / {1e6 / us_at:,.0f} full Atari / {1e6 / us_dedup:,.0f} "
        "deduplicated Atari rows/s on one core, the insert rates measured from one writer into one shard; "
        f"deduplicated rows: a frame-stacked stream of {args.atari_envs} envs into a FrameStorage shard, each frame "
        f"sent once, {dedup_bytes:,.0f} bytes per row on the wire, measured; a grant per add of {rows_per_add} rows, "
        f"{grants_per_s:,.0f} grants/s a limiter core; the learner samples 256-row batches at its measured rate with "
        "no writer busy and ingests only counts)"
    )
    return _records.rst_table(header, rows) + "\n\n" + textwrap.fill(notes, 100)


# the pages that carry the tables, between two marker lines each: (page, begin, end, only the projection)
PAGES = (
    ("docs/benchmarks.rst", ".. shards.py --table: begin", ".. shards.py --table: end", False),
    ("docs/design/replay-service.md", "<!-- shards.py --table: begin -->", "<!-- shards.py --table: end -->", False),
    ("README.rst", ".. shards.py --table (projection): begin", ".. shards.py --table (projection): end", True),
)


def write_docs(text: str, root: str = ROOT) -> None:
    """Put ``text`` (the ``--table`` output) between each page's markers: the whole on the benchmarks page and
    the design record (a fenced block there), the projection alone in the README."""
    projection_only = "\n\n".join(text.split("\n\n")[-2:])
    for page, begin, end, short in PAGES:
        path = os.path.join(root, page)
        with open(path) as handle:
            old = handle.read()
        head, _, rest = old.partition(begin + "\n")
        _, found, tail = rest.partition(end)
        if not found:
            raise SystemExit(f"{page} has no lines {begin!r} ... {end!r} to put the tables between")
        body = projection_only if short else text
        body = f"```text\n{body}\n```" if page.endswith(".md") else body
        with open(path, "w") as handle:
            handle.write(f"{head}{begin}\n\n{body}\n\n{end}{tail}")
        print(f"tables written to {page}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _records.add_options(parser, "shards")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds each measurement is timed over")
    parser.add_argument("--rows", type=int, default=64, help="rows per add call (B)")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2, 4], help="writers busy (learner part)")
    parser.add_argument("--shard-counts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--writers", type=int, default=2, help="writer actors of the ingest part")
    parser.add_argument("--spi", type=float, default=2.0, help="limiter part: target samples per insert")
    parser.add_argument("--min-size", type=int, default=1_000)
    parser.add_argument("--error-buffer", type=float, default=2_048.0)
    parser.add_argument("--sleep", type=float, default=0.005, help="limiter part: the fast writer's sleep per add")
    parser.add_argument("--phase", type=float, default=2.0, help="limiter part: seconds between speed swaps")
    parser.add_argument("--store-mb", type=int, default=512, help="object store per node")
    parser.add_argument("--worker-rate", type=int, default=5_000, help="projection: env steps/s of a CartPole worker")
    parser.add_argument("--worker-rate-atari", type=int, default=1_000, help="projection: of an Atari worker")
    parser.add_argument("--atari-envs", type=int, default=8, help="envs of the frame-stacked Atari-shaped stream")
    parser.add_argument("--n-step", type=int, default=3, help="the stream's NStepTransform n (the FrameStorage's)")
    parser.add_argument("--write-docs", action="store_true", help="--table, written between the pages' markers")
    args = parser.parse_args()
    if args.table or args.write_docs:
        text = table(_records.select(args, "shards"))
        if args.write_docs:
            write_docs(text)
        else:
            print(text)
        return
    measure(args)


if __name__ == "__main__":
    main()

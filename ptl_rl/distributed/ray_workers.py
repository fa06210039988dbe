"""RayWorkers: N Ray actors, each with its own vector env, source and n-step stage, feeding the learner's replay.

::

    ray.init(num_cpus=2)            # a laptop; ray.init(address="auto") on a cluster
    workers = RayWorkers(factory, num_workers=2, policy=net)
    RayWorkers -> ReplayBuffer -> BatchSampler -> to_dataloader

    shards = ReplayShards(factory_of_a_buffer, num_shards=4)     # or: workers write to replay shards directly
    workers = RayWorkers(factory, num_workers=2, policy=net, shards=shards)
    RayWorkers (counts only) -> ShardedReplay(shards) -> BatchSampler -> to_dataloader

Ray is imported only when the stage starts (``pip install ptl_rl[ray]``).
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.ranks import distributed_rank
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.distributed.async_source import CollectorError
from ptl_rl.distributed.common import Factory, WorkerInfo, factory_name, weights_of, worker_rank
from ptl_rl.distributed.intake import RemoteSource
from ptl_rl.distributed.ray_collector import collector_actor_class, import_ray
from ptl_rl.distributed.replay_shards import ReplayShards
from ptl_rl.distributed.shard_writer import ShardWrites
from ptl_rl.stages.source import Episode


class RayWorkers(RemoteSource[Any]):
    """A source stage whose transitions come from ``num_workers`` Ray actors.

    Args:
        factory: ``factory(info: WorkerInfo) -> Collector(pipeline, policy)``,
            called inside each actor (see :class:`~ptl_rl.distributed.AsyncSource`);
            build the source with ``rank=info.rank``.
        num_workers: number of actors.
        policy: the learner's module whose weights the actors' ``policy`` receive
            (``None``: no weights are sent; every row has ``policy_version`` 0).
        steps_per_call: pipeline batches (vector steps) an actor collects per
            remote call: larger amortises the call overhead, smaller keeps the
            data fresher and the replay ratio finer.
        max_staleness: drop rows more than this many versions behind when taken in.
        max_restarts: restarts allowed per worker before the failure is raised.
        actor_options: passed to ``.options(...)`` of each actor (``num_cpus``,
            ``num_gpus``, ``resources``, ...); default ``{"num_cpus": 1}``.
        shards: a :class:`~ptl_rl.distributed.ReplayShards`: each actor writes
            its rows into these shards itself (a writer of its own, each env's
            stream to shard ``env_id % K``), and ``next()`` yields a
            :class:`~ptl_rl.distributed.ShardWrites` (rows stored, env steps,
            episodes) per call instead of rows: no row passes through the
            learner's process. Put a :class:`~ptl_rl.distributed.ShardedReplay`
            of the same shards downstream. ``max_staleness`` needs the rows, so
            it is refused here.
        writer_in_flight: with ``shards``, each actor's writer's ``max_in_flight``.

    Every actor always has one call in flight, so actors collect while the
    learner trains; ``next()`` returns the rows of the first call to finish,
    with ``policy_version`` (int64 [B]) stamped by the actor. Weights are put
    in Ray's object store once per version (:meth:`push_weights`) and handed
    to each actor with its next call, only if it does not hold that version.

    A worker that dies (killed, node lost, or its env raising) is replaced by
    a new actor with the next ``incarnation``: its rank, hence its env seeds
    and ``env_id`` range, are new, it gets the current weights, and the
    others go on. Rows are only ever delivered as whole calls' results, so
    the replay never holds part of a failed call; the n-step windows in
    flight in the dead actor are gone with it (dropped, never joined to a new
    episode). ``failures`` lists what happened. A ``next()`` cut short (an
    interrupt, an error) loses the rows it had received, never half taken in;
    a worker whose call it was handling is replaced the same way before the
    next ``next()``, and the stage's stream is marked cut (:class:`~ptl_rl.Stage`).
    """

    def __init__(
        self,
        factory: Factory,
        num_workers: int,
        *,
        policy: torch.nn.Module | None = None,
        steps_per_call: int = 8,
        max_staleness: int | None = None,
        max_restarts: int = 10,
        actor_options: Mapping[str, Any] | None = None,
        stats_window: int = 100,
        shards: ReplayShards | None = None,
        writer_in_flight: int = 8,
    ) -> None:
        if not callable(factory):
            raise TypeError(
                f"factory must be callable as factory(WorkerInfo) -> Collector, got {type(factory).__name__}"
            )
        if num_workers < 1 or steps_per_call < 1:
            raise ValueError(f"num_workers and steps_per_call must be >= 1, got {num_workers} and {steps_per_call}")
        if shards is not None and max_staleness is not None:
            raise ValueError(
                "max_staleness drops rows when the learner takes them in, but with shards= the rows go from the "
                "workers to the shards and never reach the learner; leave max_staleness=None (or collect without "
                "shards)"
            )
        super().__init__(factory, stats_window, max_staleness)
        self.shards = shards
        self.writer_in_flight = int(writer_in_flight)
        self.rows_stored = 0  # with shards: rows the workers' calls stored, as far as the learner has received
        self.rows_dropped = 0  # with shards: rows their writers dropped (in flight to a shard that died)
        self.num_workers = int(num_workers)
        self.policy = policy
        self.steps_per_call = int(steps_per_call)
        self.max_restarts = int(max_restarts)
        self.actor_options = dict(actor_options or {"num_cpus": 1})
        self.version = 0
        self.rank = 0
        self.world_size: int | None = None  # None: torch.distributed's when the actors start
        self.incarnations = [0] * self.num_workers
        self.restarts = 0
        self.failures: list[str] = []
        self.actors: list[Any] = []
        self._actor_versions: list[int] = []
        self._pending: dict[Any, int] = {}  # object ref of a call in flight -> worker index
        self._ready: deque[TransitionBatch | ShardWrites] = deque()
        self._weights_ref: Any = None
        self._weights_version = -1
        self._snapshot: dict[str, torch.Tensor] | None = None  # the weights of ``version``, copied when published
        self._snapshot_version = -1
        self._restore_counters = False
        self._ray: Any = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return bool(self.actors)

    def start(self) -> None:
        """Start the actors (``next()`` does it when needed). Ray must be initialised (``ray.init(...)``)."""
        if self.actors:
            return
        ray = self._ray = import_ray()
        if not ray.is_initialized():
            raise RuntimeError(
                "Ray is not initialised: call ray.init(num_cpus=...) on a single machine, or "
                "ray.init(address='auto') on a cluster node, before the first next() of RayWorkers"
            )
        self._ddp_layout()  # a rank outside the world size is refused before any actor exists
        self.actors = [None] * self.num_workers
        self._actor_versions = [-1] * self.num_workers
        for worker in range(self.num_workers):
            self._launch(worker)

    def close(self) -> None:
        """Kill the actors; a later ``next()`` starts new ones (new incarnations, fresh episodes)."""
        ray = self._ray
        for worker, actor in enumerate(self.actors):
            if actor is not None:
                ray.kill(actor, no_restart=True)
                self.incarnations[worker] += 1
        self.actors, self._pending = [], {}
        self._ready.clear()
        self._restore_counters = True

    def _ddp_layout(self) -> tuple[int, int]:
        """``(rank, world_size)`` of this learner among the DDP ranks, checked."""
        world_size = self.world_size if self.world_size is not None else distributed_rank()[1]
        if not 0 <= self.rank < world_size:
            raise ValueError(
                f"RayWorkers has DDP rank {self.rank} but the world size is {world_size}, so its workers' env ids "
                "and seeds could collide with another rank's; outside torch.distributed, give both: "
                "set_rank(rank, world_size=...)"
            )
        return self.rank, world_size

    def _launch(self, worker: int) -> None:
        incarnation = self.incarnations[worker]
        info = WorkerInfo(
            # ranks interleave by world size: disjoint across DDP ranks, workers and any number of restarts
            rank=worker_rank(worker, incarnation, self.num_workers, *self._ddp_layout()),
            worker=worker,
            incarnation=incarnation,
            num_workers=self.num_workers,
        )
        # a fresh actor continues the learner's step count, so exploration schedules go on where they were
        share = self.counters.total_steps // self.num_workers
        counters = (share, 0) if self._restore_counters or self.incarnations[worker] else None
        cls = collector_actor_class(self._ray)
        writer = None if self.shards is None else self.shards.writer(self.writer_in_flight)
        self.actors[worker] = cls.options(**self.actor_options).remote(self.factory, info, counters, writer)
        self._actor_versions[worker] = -1
        self._submit(worker)

    def _submit(self, worker: int) -> None:
        weights = None
        if self.policy is not None and self._actor_versions[worker] != self.version:
            weights = self._current_weights()
            self._actor_versions[worker] = self.version
        actor = self.actors[worker]
        collect = actor.collect if self.shards is None else actor.collect_into_shards
        ref = collect.remote(self.version, weights, self.steps_per_call)
        self._pending[ref] = worker

    def _current_weights(self) -> Any:
        if self._weights_version != self.version:  # one object-store copy per version, shared by all actors
            if self._snapshot_version != self.version:  # version 0 or a restored one: the module's weights now
                self._snapshot, self._snapshot_version = weights_of(self.policy), self.version
            self._weights_ref = self._ray.put(self._snapshot)
            self._weights_version = self.version
            self._snapshot = None  # the object store holds them now
        return self._weights_ref

    def _relaunch(self, worker: int) -> None:
        """Replace worker ``worker``'s actor by a new incarnation (fresh envs, the current weights)."""
        actor = self.actors[worker]
        if actor is not None:
            self._ray.kill(actor, no_restart=True)
            self.incarnations[worker] += 1
        self._launch(worker)

    def _restart(self, worker: int, error: BaseException) -> None:
        self.failures.append(
            f"worker {worker} (incarnation {self.incarnations[worker]}): {type(error).__name__}: {error}"
        )
        if self.incarnations[worker] >= self.max_restarts:
            self.close()
            raise CollectorError(
                f"Ray worker {worker} failed {self.max_restarts + 1} times; the last failure: "
                f"{type(error).__name__}: {error}"
            ) from error
        warnings.warn(
            f"Ray worker {worker} failed ({type(error).__name__}); restarting it with fresh envs and the current "
            "weights. Its n-step windows in flight are dropped.",
            RuntimeWarning,
            stacklevel=3,
        )
        self.restarts += 1
        self._relaunch(worker)

    # ------------------------------------------------------------------ weights
    def push_weights(self, state_dict: Mapping[str, torch.Tensor] | None = None) -> int:
        """Publish the policy's current weights (after loading ``state_dict`` into it, if given) as the next version.

        The weights are copied at once (to the CPU), so the rows stamped with
        this version are chosen by exactly these weights, however the policy
        changes before the actors' next calls; the copy goes into Ray's object
        store at the first call that needs it. Returns the new version.
        """
        if self.policy is None:
            raise RuntimeError("this RayWorkers has no policy to push; pass RayWorkers(factory, n, policy=module)")
        if state_dict is not None:
            self.policy.load_state_dict(state_dict)
        self.version += 1
        self._snapshot, self._snapshot_version = weights_of(self.policy), self.version
        return self.version

    # ------------------------------------------------------------------ stage
    def step(self) -> TransitionBatch | ShardWrites:
        """The rows of the next call to finish (within ``max_staleness``), or with ``shards`` its
        :class:`~ptl_rl.distributed.ShardWrites`; starts the actors if none run."""
        if not self.actors:
            self.start()
        while not self._ready:
            self._receive_one()
        return self._ready.popleft()

    def snapshot(self) -> object:
        return None  # the intake journals each call's result itself; the actors cannot be stepped back

    def restore(self, snapshot: object) -> None:
        """After a step cut short: every worker gets a call in flight again.

        The cut may have fallen between taking a worker's result and handing it its next call: that worker
        is replaced by a new incarnation (as after a failure: the rows of the call are lost, its n-step
        windows with it), so no actor sits idle and none has two calls queued. The other workers go on.
        """
        if not self.actors:
            return
        busy = set(self._pending.values())
        for worker in range(self.num_workers):
            if worker not in busy:
                self._relaunch(worker)

    def _receive_one(self) -> None:
        ray = self._ray
        done, _ = ray.wait(list(self._pending), num_returns=1)
        ref = done[0]
        worker = self._pending.pop(ref)
        try:
            batch, steps, episodes = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
            self._restart(worker, error)
            return
        self._submit(worker)  # the actor collects the next call while the learner works on this one
        self._take(batch, steps, episodes)

    def _take(self, result: TransitionBatch | tuple[int, int] | None, steps: int, episodes: list[Episode]) -> None:
        """Take a call's result in: its rows (or, with shards, the rows it stored and dropped), env steps and
        episodes."""
        if isinstance(result, tuple):  # the rows are in the shards: count them
            self.intake.take(None, steps, episodes, self.version)
            stored, dropped = result
            self.rows_stored += stored
            self.rows_dropped += dropped
            self._ready.append(ShardWrites(stored, steps, len(episodes), dropped))
            return
        batch = self.intake.take(result, steps, episodes, self.version)
        if batch is not None and len(batch):
            self._ready.append(batch)

    def count(self, out: object) -> int:
        """Rows of one output (with ``shards``: the rows its call stored)."""
        return out.rows if isinstance(out, ShardWrites) else super().count(out)

    def drain(self) -> None:
        """Wait for every call in flight and take its result in (queued for the next ``next()``s), sending no new
        call, then :meth:`close`. With ``shards``, the counters then cover every row the workers stored."""
        if not self.actors:
            return
        ray = self._ray
        pending, self._pending = self._pending, {}
        for ref, worker in pending.items():
            try:
                batch, steps, episodes = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
                self.failures.append(f"worker {worker} (incarnation {self.incarnations[worker]}): {error}")
                continue
            self._take(batch, steps, episodes)
        ready = list(self._ready)
        self.close()
        self._ready.extend(ready)

    def set_rank(self, rank: int, world_size: int | None = None) -> None:
        """Take the DDP rank (the Lightning adapter calls it): DDP ranks get disjoint worker ranks.

        Worker ``w`` in its ``i``-th incarnation gets the rank
        ``rank + world_size * (w + num_workers * i)`` (``ptl_rl.distributed.common.worker_rank``),
        hence its own env ids and seeds, whatever the number of restarts.
        ``world_size``: the number of DDP ranks; ``None`` takes
        ``torch.distributed``'s when the actors start (1 when it is not
        initialised).
        """
        if world_size is not None and not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank must be in [0, world_size): got rank {rank} of world size {world_size}")
        if self.actors and (int(rank) != self.rank or world_size not in (None, self.world_size)):
            raise RuntimeError("this RayWorkers is already collecting; build the pipeline inside each DDP process")
        self.rank = int(rank)
        if world_size is not None:
            self.world_size = int(world_size)

    def staleness_stats(self) -> dict[str, float]:
        return {"policy_version": float(self.version), "restarts": float(self.restarts), **self.staleness.stats()}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state = {
            "version": self.version,
            "incarnations": list(self.incarnations),
            "restarts": self.restarts,
            **self.intake.state_dict(),
        }
        return versioned(state, self.STATE_VERSION)

    STATE_VERSION = 1

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore counters and version; running actors are replaced by new incarnations at the next ``next()``."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        if self.actors:
            self.close()
        self.version = int(state["version"])
        # every worker restarts one incarnation later than saved: its env ids are new
        self.incarnations = [int(i) + 1 for i in state["incarnations"]]
        self.restarts = int(state["restarts"])
        self.intake.load_state_dict(state)
        self._restore_counters = True
        self._snapshot_version = self._weights_version = -1  # the restored version: the module's restored weights
        self.state_replaced()

    def __repr__(self) -> str:
        return stage_repr(
            self,
            factory_name(self.factory),
            workers=self.num_workers,
            env_steps=self.total_steps,
            version=self.version,
            restarts=self.restarts,
        )

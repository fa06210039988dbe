"""AsyncSource: the source (and n-step) stage in a background process, collecting while the learner trains.

::

    AsyncSource(factory, policy=net) -> ReplayBuffer -> BatchSampler -> to_dataloader

The child process calls ``factory(WorkerInfo)`` to build its env, agent,
:class:`~ptl_rl.stages.source.ExperienceSource` and optional
:class:`~ptl_rl.stages.nstep.NStepTransform`, so nothing unpicklable crosses the
process boundary. Batches come back through a bounded queue (pickled numpy
arrays), weights go the other way through one shared-memory copy of the
policy's ``state_dict`` guarded by a lock, with a version counter beside it.

This module is the learner's side; what runs in the child and the messages it
sends are in :mod:`ptl_rl.distributed.collector_process`, the shared weights in
:mod:`ptl_rl.distributed.shared_weights`, starting and stopping processes in
:mod:`ptl_rl.distributed.process_control`.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Mapping
from typing import Any, cast

import torch

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.ranks import distributed_rank
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.distributed.collector_process import POLL_S, collector_main
from ptl_rl.distributed.common import VERSION_FIELD, Factory, WorkerInfo, factory_name, weights_of, worker_rank
from ptl_rl.distributed.intake import RemoteSource
from ptl_rl.distributed.process_control import LIVE, check_importable, context, describe_exit, stop_process
from ptl_rl.distributed.shared_weights import SharedWeights
from ptl_rl.distributed.shm_ring import RingReader


class CollectorError(RuntimeError):
    """The collector (a background process or a remote worker) failed; the message holds its traceback."""


class AsyncSource(RemoteSource[TransitionBatch]):
    """A source stage whose env steps run in a background process while the learner trains.

    Args:
        factory: ``factory(info: WorkerInfo) -> Collector(pipeline, policy)``,
            called in the child. It must be picklable: a module-level function
            or a ``functools.partial`` of one (spawned processes import it by
            name; a lambda or a function defined in a notebook cell of
            ``__main__`` is not importable there). Build the source with
            ``rank=info.rank``.
        policy: the learner's module whose weights the collector's ``policy``
            receives (``None``: the collector never gets weights and every row
            has ``policy_version`` 0).
        max_staleness: drop rows whose ``policy_version`` is more than this many
            versions behind the learner's when they are taken in (``None``: keep all).
        queue_size: messages the collector may run ahead of the learner. The
            collector blocks when the queue is full, so the replay ratio set on
            the :class:`~ptl_rl.replay.ReplayBuffer` downstream holds exactly:
            the learner waits for its transitions as it does in-process.
        steps_per_message: pipeline batches (vector steps) the collector joins
            into one message. Each message costs a fixed amount (pickling, a pipe
            write, waking the learner, unpickling) whatever its size, so for small
            rows (CartPole) a few steps per message cut the learner's receive cost
            per transition. The collector then runs up to ``queue_size *
            steps_per_message`` vector steps ahead: lower ``queue_size`` to keep
            the staleness where it was.
        shared_memory_mb: size of a shared-memory ring (MiB) through which the
            collector sends each message's large arrays (>= 1 KiB, e.g. pixel
            observations) instead of pickling them through the queue: one copy
            on each side instead of four, and the learner skips the unpickle and
            the pipe read. ``None`` (default): everything is pickled, which is
            as fast for CartPole-sized rows. The ring must hold at least one
            message's largest array; the collector waits while it is full.
        start_method: ``"forkserver"`` (default where the platform has it) or
            ``"spawn"``. Never ``"fork"``: it would copy the learner's threads
            and CUDA state. Both need a picklable factory; with ``"forkserver"``
            torch and ptl_rl are imported once, in the server, so a collector
            (and every restart of one) starts in a fraction of a second instead
            of the several seconds a spawned interpreter takes to import torch.
        start_timeout: seconds to wait for the first batch (the child imports
            torch and builds its envs) before raising.
        stats_window: episodes kept for :meth:`episode_stats`.

    Each ``next()`` returns the rows of ``steps_per_message`` batches of the
    collector's pipeline (one :class:`~ptl_rl.core.batch.TransitionBatch`) with an
    extra field ``policy_version`` (int64 [B]), the version of the weights
    that chose each row's action. The stage has the episode interface of an
    :class:`~ptl_rl.stages.source.ExperienceSource` (``total_steps``, ``episodes_finished``, ``recent_episodes``,
    ``pop_episodes``, ``episode_stats``) and :meth:`staleness_stats`.

    The process starts at the first ``next()`` and stops at :meth:`close` (also
    ``with AsyncSource(...)``, at interpreter exit, when the learner is
    interrupted inside ``next()``, and when the collector fails). A later
    ``next()`` after a close or an interrupt starts a new process whose envs
    begin new episodes (as after a checkpoint restore); the counters carry on.
    A ``next()`` cut short (an interrupt, an error) is a cut of the stage's
    stream (:class:`~ptl_rl.Stage`): the rows it had received are lost, never
    half taken in, and the next ``next()`` starts from a fresh collector.
    """

    def __init__(
        self,
        factory: Factory,
        *,
        policy: torch.nn.Module | None = None,
        max_staleness: int | None = None,
        queue_size: int = 8,
        start_timeout: float = 120.0,
        stats_window: int = 100,
        start_method: str | None = None,
        steps_per_message: int = 1,
        shared_memory_mb: float | None = None,
    ) -> None:
        if not callable(factory):
            raise TypeError(
                f"factory must be callable as factory(WorkerInfo) -> Collector, got {type(factory).__name__}"
            )
        check_importable(factory)
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        if steps_per_message < 1:
            raise ValueError(f"steps_per_message must be >= 1, got {steps_per_message}")
        self.steps_per_message = int(steps_per_message)
        if shared_memory_mb is not None and shared_memory_mb <= 0:
            raise ValueError(f"shared_memory_mb must be > 0 (or None for no ring), got {shared_memory_mb}")
        self.shared_memory_mb = shared_memory_mb
        super().__init__(factory, stats_window, max_staleness)
        self._ring: tuple[torch.Tensor, Any] | None = None
        self._reader: RingReader | None = None
        self.policy = policy
        self.queue_size = int(queue_size)
        self.start_timeout = float(start_timeout)
        self.version = 0
        self.rank = 0
        self.incarnation = 0  # processes started so far
        self._restore_counters = False
        self._ctx = context(start_method)
        self._proc: Any = None
        self._data_q: Any = None
        self._stop: Any = None
        self._shared = SharedWeights(self._ctx)  # the weights the collector acts with, and their version
        self._first_batch_seen = False
        self._stashed: tuple[Any, ...] | None = None  # a message read while checking on a collector that had exited

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        """Whether a collector process is alive."""
        return self._proc is not None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        """The collector process's id (``None`` when none runs)."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Start the collector process (``next()`` does it when needed)."""
        if self._proc is not None:
            return
        dist_rank, world_size = distributed_rank()
        rank = self.rank if world_size == 1 else dist_rank
        # one process per DDP rank, ranks interleaved by world size; alone, a rank given by set_rank is a base
        info = WorkerInfo(
            rank=worker_rank(0, self.incarnation, 1, rank, world_size) if world_size > 1 else rank + self.incarnation,
            worker=rank,
            incarnation=self.incarnation,
            num_workers=world_size,
        )
        if self.policy is not None:
            self._shared.allocate(self.policy, self.version)
            self._shared.new_lock()
            # version 0, or a restored one: the module's weights as they are now
            if self._shared.published != self.version:
                self._write_weights(weights_of(self.policy), self.version)
        counters = (self.counters.total_steps, self.counters.episodes_finished) if self._restore_counters else None
        if self.shared_memory_mb is not None:
            if self._ring is None:  # allocated once, reused by every incarnation (each starts at position 0)
                ring = torch.empty(int(self.shared_memory_mb * 2**20), dtype=torch.uint8).share_memory_()
                self._ring = (ring, self._ctx.Value("q", 0, lock=False))
            self._ring[1].value = 0
            self._reader = RingReader(*self._ring)
        self._data_q = self._ctx.Queue(maxsize=self.queue_size)
        self._stop = self._ctx.Event()
        self._proc = self._ctx.Process(
            target=collector_main,
            args=(
                self.factory,
                info,
                self._data_q,
                self._stop,
                self._shared.tensors,
                self._shared.version_value,
                self._shared.lock,
                counters,
                self.steps_per_message,
                self._ring,
            ),
            name=f"ptl_rl-collector-{info.rank}",
            daemon=False,  # a daemonic process may not start children, and the collector's AsyncVectorEnv does
        )
        self._proc.start()
        self.mark_cut()  # a new process: its envs begin new episodes (stages downstream join nothing across it)
        # the learner only reads: without its copy of the write end, a collector that dies in the middle of a
        # message (killed, out of memory) leaves an end of file, not a read that waits for the rest forever
        with contextlib.suppress(AttributeError, OSError):
            self._data_q._writer.close()
        self._stashed = None
        self.incarnation += 1
        self._restore_counters = True  # a later process continues these counters
        self._first_batch_seen = False
        LIVE.add(self)

    def close(self) -> None:
        """Stop the collector process (ask, then terminate, then kill); a later ``next()`` starts a new one."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, self._stop, self._data_q)
        LIVE.discard(self)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ weights
    def push_weights(self, state_dict: Mapping[str, torch.Tensor] | None = None) -> int:
        """Publish new weights (default: ``policy``'s current ones) as the next version; returns that version.

        Args:
            state_dict: the weights to publish, with the keys (and shapes) of
                ``policy.state_dict()``; ``None``: the policy's weights now.

        The weights are copied at once into the shared copy the collector
        reads, whatever its state (not started yet, running, closed or
        crashed): the rows stamped with this version are chosen by exactly
        these weights, also when the collector starts (or restarts) later
        and the policy has changed in between. The collector picks them up
        before its next env step. Cheap: one in-place copy into shared memory.
        The learner's ``policy`` module itself is not changed.
        """
        if self.policy is None:
            raise RuntimeError("this AsyncSource has no policy to push; pass AsyncSource(factory, policy=module)")
        self._shared.allocate(self.policy, self.version)
        state = state_dict if state_dict is not None else self.policy.state_dict()
        self._shared.check_fits(state)
        self.version += 1
        self._write_weights(state, self.version)
        return self.version

    def _write_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        if not self._shared.write(state_dict, version, reader_running=self.running):
            self._raise_if_dead()
            raise CollectorError("the collector holds the weights lock for more than 10 s; it is stuck")

    # ------------------------------------------------------------------ stage
    def step(self) -> TransitionBatch:
        """The rows of the collector's next message within ``max_staleness`` (a collector is started if none runs)."""
        try:
            if self._proc is None:
                self.start()
            while True:
                message = self._receive()
                if message[0] == "error":
                    _, kind, text, tb = message
                    raise CollectorError(
                        f"the collector process failed with {kind}: {text}\n"
                        f"(built by {factory_name(self.factory)!r}; its traceback follows)\n{tb}"
                    )
                _, received, steps, episodes = message
                if self._reader is not None:
                    received = self._reader.unpack(received)
                batch = self.intake.take(cast(TransitionBatch, received), steps, episodes, self.version)
                if len(batch):
                    return batch
        except BaseException:
            # the step was cut (an interrupt while waiting, a failed collector): the guard's restore drops the
            # collector before the next step; stopping it now too leaves no process behind an interrupted cell
            self.close()
            raise

    def snapshot(self) -> object:
        return None  # the intake journals each message itself, and a collector cannot be stepped back

    def restore(self, snapshot: object) -> None:
        """After a step cut short: drop the collector, so that the next step starts a fresh one.

        The cut may have fallen in the middle of reading a message (the queue's pipe is then mid-message) or
        after a message was taken in (its rows are lost): neither can be continued, and a new collector's
        envs begin new episodes. The stream is marked cut (the guard does it).
        """
        self.close()

    def _receive(self) -> tuple[Any, ...]:
        waited = 0.0
        message: tuple[Any, ...]  # (a collector's message: its kind first)
        while True:
            if self._stashed is not None:  # read by _raise_if_dead from a collector that had exited
                message, self._stashed = self._stashed, None
                return message
            try:
                message = self._data_q.get(timeout=POLL_S)
                self._first_batch_seen = True
                return message
            except queue.Empty:
                waited += POLL_S
            except (EOFError, OSError):  # the collector is gone, maybe in the middle of a message
                self._proc.join(POLL_S)
            self._raise_if_dead()
            if not self._first_batch_seen and waited > self.start_timeout:
                self.close()
                raise CollectorError(
                    f"the collector process sent nothing in {self.start_timeout:.0f} s after its start; "
                    "its factory or first env step hangs (raise start_timeout if building the envs is slow)"
                )

    def _raise_if_dead(self) -> None:
        proc = self._proc
        if proc is None or proc.is_alive():
            return
        # it may have sent an error (or a last batch) just before exiting: read it first; the next look finds the
        # process dead and the queue empty (or a message cut short by its death: an end of file)
        with contextlib.suppress(queue.Empty, EOFError, OSError):
            self._stashed = self._data_q.get(timeout=POLL_S)
            return
        started = self._first_batch_seen
        self.close()
        hint = (
            "killed from outside, or out of memory?"
            if started
            else "it failed before its first batch: a script that starts collectors needs "
            "`if __name__ == '__main__':` around its top-level code"
        )
        raise CollectorError(
            f"the collector process (pid {proc.pid}) {describe_exit(proc.exitcode)} without reporting an error "
            f"({hint}). Call next() again to start a new one."
        )

    # ------------------------------------------------------------------ rank
    def set_rank(self, rank: int) -> None:
        """Take the DDP rank (the Lightning adapter calls it): it offsets the collector's env ids and seeds."""
        if self._proc is not None and int(rank) != self.rank:
            raise RuntimeError("this AsyncSource is already collecting; build the pipeline inside each DDP process")
        self.rank = int(rank)

    def staleness_stats(self) -> dict[str, float]:
        """``policy_version`` lag of the rows taken in (see :class:`~ptl_rl.distributed.intake.StalenessTracker`)."""
        return {"policy_version": float(self.version), **self.staleness.stats()}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Learner-side state: policy version, env-step and episode counters, staleness counters."""
        state = {"version": self.version, "incarnation": self.incarnation, **self.intake.state_dict()}
        return versioned(state, self.STATE_VERSION)

    STATE_VERSION = 1

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the counters; a running collector is stopped, and the next one starts new episodes."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.close()
        self.version = int(state["version"])
        self.incarnation = int(state["incarnation"])
        self.intake.load_state_dict(state)
        self._restore_counters = True
        # the restored version acts with the module's (restored) weights at the next start
        self._shared.published = None
        self.state_replaced()

    def __repr__(self) -> str:
        return stage_repr(
            self,
            factory_name(self.factory),
            env_steps=self.total_steps,
            episodes=self.episodes_finished,
            version=self.version,
            running=self.running,
        )


__all__ = ["VERSION_FIELD", "AsyncSource", "CollectorError"]

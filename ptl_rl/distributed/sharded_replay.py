"""ShardedReplay: the learner's side of a sharded replay, a stage a BatchSampler draws from as from one buffer.

::

    ReplayShards(factory, K)  <- ShardWriter.add (collectors, directly)
            |
    ShardedReplay(shards) -> BatchSampler -> to_dataloader      (unchanged)

Batches are distributed exactly as from one buffer holding every shard's rows
(:mod:`ptl_rl.distributed.shard_sampling`); the next requests are kept in
flight (``prefetch``) so a training step rarely waits on the shards; priorities
fed back go to the shard holding each row (``shard``, ``indices``,
``generations``), where a row overwritten since its draw is ignored.
See ``docs/design/replay-service.md``.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.core.schedules import Schedule, as_schedule
from ptl_rl.core.stage import Stage
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.distributed.replay_shard import INCARNATION_FIELD, SHARD_FIELD, ShardSample, ShardStats
from ptl_rl.distributed.replay_shards import ReplayShards
from ptl_rl.distributed.shard_priorities import PriorityRouter
from ptl_rl.distributed.shard_requests import ShardRequest, ShardRequests
from ptl_rl.distributed.shard_sampling import ShardedPriorityFeedback, merge_answers
from ptl_rl.distributed.shard_writer import ShardWrites


class ShardedReplay(Stage["ShardedReplay"]):
    """Samples batches across the shards of a :class:`~ptl_rl.distributed.ReplayShards`, as one buffer would.

    A stage like a :class:`~ptl_rl.ReplayBuffer`: each ``next()`` yields
    itself, for a :class:`~ptl_rl.BatchSampler` to call :meth:`sample`, so
    ``to_dataloader(BatchSampler(ShardedReplay(shards), batch_size))`` and the
    LightningModule are those of a local buffer.

    Args:
        shards: the shards to draw from (writers fill them: ``shards.writer()``).
        upstream: optional stage whose batches this stage writes into the
            shards itself (through the learner, like a local buffer's pulls:
            ``transitions_per_yield`` per yield); or a stage that yields
            :class:`~ptl_rl.distributed.ShardWrites` (``RayWorkers(...,
            shards=shards)``, whose workers write the rows themselves): its
            counts are the credit, ``transitions_per_yield`` rows stored by
            the workers per yield, and this stage writes nothing; ``None`` when
            collectors write to the shards directly, unpaced.
        warmup: rows stored over all shards before the first yield.
        transitions_per_yield: with an upstream, rows written per yield, on average.
        prefetch: sample requests kept in flight beyond the one being used
            (0: each batch is asked for when needed). A prefetched batch was
            drawn before the priorities fed back from the batches before it
            reached the shards (one step behind per request in flight).
        beta: importance-sampling exponent (float or schedule); ``None``: the
            shards' ``PrioritizedDraws`` schedule and clock (``"learner"``:
            batches this stage drew; ``"env"``: rows added to all shards).
        seed: seed of this learner's random stream: the generator that splits
            batches over the shards and seeds the shards' draws of them
            (``shard_requests.ShardRequests``). Under
            DDP each rank derives its own from it (:meth:`set_rank`, called by
            the Lightning adapter), so the ranks sample the same shards with
            distinct streams; ``None``: fresh entropy.
        sync_updates: wait for the shards' answer to every priority update, so
            ``batch.update_priorities`` returns the stale rows it skipped;
            ``False`` (default) sends and returns 0, and the answers are
            counted in :attr:`stale_updates` as they arrive.
        poll_interval: seconds between two looks at the shards' sizes while
            waiting for ``warmup`` without an upstream.
        sample_timeout: seconds :meth:`sample` waits for a batch before it
            raises ``TimeoutError`` (naming the rate limiter's counts when the
            shards have one); ``None``: no limit. The request stays in flight:
            the next call goes on waiting for it.

    With a rate limit on the shards (``ReplayShards(rate_limit=...)``) each
    request's rows are granted by the limiter before the shards draw them, so
    a learner ahead of its writers waits there (a prefetched request counts as
    sampled once granted).

    A batch holds the stored fields ``[B, ...]``, ``shard`` and ``shard_incarnation`` (int64 [B]);
    with a strategy that names its slots also ``indices`` and ``generations``
    (int64 [B]), and with prioritized shards ``weights`` (float32 [B],
    ``(N P(i)) ** -beta`` normalised by the batch's largest, over all shards)
    and ``batch.update_priorities(td_errors)``. Rows come grouped by shard.
    """

    def __init__(
        self,
        shards: ReplayShards,
        upstream: Iterator[TransitionBatch | ShardWrites] | None = None,
        *,
        warmup: int = 1_000,
        transitions_per_yield: int = 1,
        prefetch: int = 1,
        beta: float | Schedule | None = None,
        seed: int | None = None,
        sync_updates: bool = False,
        poll_interval: float = 0.01,
        sample_timeout: float | None = None,
    ) -> None:
        if warmup < 0 or transitions_per_yield < 1 or prefetch < 0:
            raise ValueError(
                f"warmup and prefetch must be >= 0 and transitions_per_yield >= 1; got {warmup}, {prefetch} "
                f"and {transitions_per_yield}"
            )
        limit = shards.rate_limit
        writes_itself = upstream is not None and getattr(upstream, "shards", None) is None
        if getattr(upstream, "shards", None) not in (None, shards):
            raise ValueError(
                "the upstream writes into other replay shards than this ShardedReplay samples; pass the same "
                "ReplayShards to both (RayWorkers(..., shards=shards) and ShardedReplay(shards, workers))"
            )
        if writes_itself and limit is not None and limit.max_diff < sys.float_info.max:
            raise ValueError(
                "this ShardedReplay writes its upstream's rows itself, and the shards' rate limit would make those "
                "writes wait for this learner's samples, which wait for its writes: give the learner's own replay "
                "ratio with transitions_per_yield instead, or write from collectors (shards.writer())"
            )
        super().__init__(upstream)
        self.shards = shards
        self._ray = shards._ray
        self._handles: list[Any] = shards.handles
        info = shards.info()
        self.prioritized = info.kind == "prioritized"
        self.beta_schedule: Schedule | None = as_schedule(beta) if beta is not None else info.beta
        self.beta_clock = info.beta_clock or "learner"
        self.warmup = int(warmup)
        self.transitions_per_yield = int(transitions_per_yield)
        self.prefetch = int(prefetch)
        self.sync_updates = bool(sync_updates)
        self.poll_interval = float(poll_interval)
        self._limiter: Any = shards.limiter
        self.requests = ShardRequests(self._ray, self._handles, self._limiter, seed, sample_timeout, shards.rate_counts)
        self.known: list[ShardStats] = [ShardStats(0, 0.0, 0)] * len(self._handles)
        self.batches_sampled = 0
        self.shard_failures = 0  # requests asked again because a shard died or restarted empty since the split
        self._writer = shards.writer() if writes_itself else None
        self._warm = False
        self._credit = 0
        self._written = self._counted = 0
        self._pending: deque[ShardRequest] = deque()
        self._router = PriorityRouter(self._ray, self._handles)  # priority updates sent, counted as answered

    @property
    def rng(self) -> np.random.Generator:
        """This learner's random stream (see ``seed``)."""
        return self.requests.rng

    @property
    def rank(self) -> int:
        """The DDP rank whose stream this learner samples with (0 until :meth:`set_rank`)."""
        return self.requests.rank

    def set_rank(self, rank: int) -> None:
        """Sample with DDP rank ``rank``'s own stream (:func:`~ptl_rl.rank_seed` of ``seed``); a no-op when already
        there, so a restored stream is kept. Requests in flight, drawn by the old stream, are dropped."""
        if int(rank) != self.rank:
            self._pending.clear()
            self.requests.set_rank(rank)

    # ------------------------------------------------------------------ sizes
    def __len__(self) -> int:
        """Rows stored over all shards, as of the shards' last answers."""
        return sum(stats.size for stats in self.known)

    def refresh(self) -> list[ShardStats]:
        """Ask every shard for its size and mass now (waits); returns them in shard order."""
        self.known = self.shards.stats()
        return self.known

    @property
    def beta(self) -> float | None:
        """The importance-sampling exponent now (``None`` for uniform shards)."""
        if not self.prioritized or self.beta_schedule is None:
            return None
        step = self.batches_sampled if self.beta_clock == "learner" else sum(s.total_added for s in self.known)
        return float(self.beta_schedule(step))

    # ------------------------------------------------------------------ stage
    def step(self) -> ShardedReplay:
        """Write ``transitions_per_yield`` rows of the upstream (if any), wait for ``warmup`` rows; yield self."""
        warming_up = not self._warm
        if self.upstream is not None:
            while self._credit < self.transitions_per_yield or (not self._warm and self._written < self.warmup):
                self._credit += self._take_upstream()
        if not self._warm:
            self._wait_for_warmup()
        if self.upstream is not None:
            if warming_up:
                self._credit = min(self._credit, self.transitions_per_yield)
            self._credit -= self.transitions_per_yield
        return self

    def _take_upstream(self) -> int:
        """One output of the upstream: a batch written into the shards, or a collector's count of the rows it
        wrote itself; returns the rows."""
        item = self.pull()
        if isinstance(item, ShardWrites):
            rows = item.rows
        else:
            assert self._writer is not None  # (an upstream of batches gets a writer)
            self._writer.add(item)
            rows = len(item)
        self._written += rows
        return rows

    def _wait_for_warmup(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        while sum(stats.size for stats in self.refresh()) < self.warmup:
            if self.upstream is not None:  # (rows written may have been refused or overwritten)
                self._take_upstream()
                if self._writer is not None:
                    self._writer.flush()
            else:
                time.sleep(self.poll_interval)
        self._warm = True

    def snapshot(self) -> object:
        return self._credit  # rows written by a step cut short stay written (as a local buffer's adds)

    def restore(self, snapshot: object) -> None:
        self._credit = int(cast(int, snapshot))

    def count(self, out: object) -> int:
        """Rows written through this stage since the last count (the clock's items)."""
        written, self._counted = self._written - self._counted, self._written
        return written

    STATE_VERSION = 2  # 2: the random stream and its rank

    def state_dict(self) -> dict[str, Any]:
        """The shards' saves (:meth:`ReplayShards.state_dict`: each shard saves its buffer into its own directory;
        the state refers to them and holds no arrays), this stage's counters and its random stream (rank and
        generator state as of the oldest request in flight, so a resumed run over the same rows draws the same
        batches). Priority updates sent are waited for first, so the saved priorities include them. Shards
        without a ``checkpoint_dir`` are not saved (``"shards": None``; their rows stay where they are), so a
        pipeline checkpoint still works. Under DDP only rank 0 saves the shards (they are shared, and rank 0
        writes the checkpoint): a save by every rank into the same directories would replace rank 0's."""
        self.flush_updates()
        saves_shards = self.shards.checkpoint_dir is not None and self.rank == 0
        state = {
            "shards": self.shards.state_dict() if saves_shards else None,
            "batches_sampled": self.batches_sampled,
            "stale_updates": self.stale_updates,
            "applied_updates": self.applied_updates,
            "credit": self._credit,
            "warm": self._warm,
            "rank": self.rank,
            # the stream as of the oldest request in flight: a resumed run asks for those batches again
            "rng": self._pending[0].stream_state if self._pending else self.rng.bit_generator.state,
        }
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load the shards from their saves and the counters; requests and updates in flight are dropped (they
        were of the rows replaced). Under DDP every rank loads rank 0's checkpoint; only a learner of rank 0 (as
        given before the load, e.g. by ``PipelineCheckpoint``) loads the shards, once, and the others wait for
        ``warmup`` rows again before they sample, as the shards may still be loading."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self._pending.clear()
        loads_shards = state["shards"] is not None and self.rank == 0
        if loads_shards:
            self.shards.load_state_dict(state["shards"])
        self.batches_sampled = int(state["batches_sampled"])
        self._router.reset(int(state["stale_updates"]), int(state["applied_updates"]))
        self._credit = int(state["credit"])
        self._warm = bool(state["warm"]) and (loads_shards or state["shards"] is None)
        if "rng" in state:  # (version 1 has no stream: the current one goes on)
            self.requests.rank = int(state["rank"])
            self.rng.bit_generator.state = state["rng"]
        self.refresh()
        self.state_replaced()

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` rows over all shards, each as likely as in one buffer holding them all.

        Fields ``[B, ...]`` as stored, plus ``shard`` (int64 [B]) and, for
        strategies that name their slots, ``indices``/``generations`` (int64
        [B]); prioritized: ``weights`` (float32 [B]) and the priority feedback.
        Raises ``ValueError`` (naming the fix, sending nothing) for a batch
        larger than the rows stored.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._router.count(wait=False)
        while True:
            while self._pending and self._pending[0].batch_size != batch_size:
                self._pending.popleft()  # asked for another batch size: its answers are dropped
            if not self._pending:
                self._pending.append(self._request(batch_size))
            request = self._pending[0]
            while len(self._pending) < 1 + self.prefetch:  # the next ones go out before this one is awaited
                self._pending.append(self._request(batch_size))
            answers = self._answers(request)
            if self._pending and self._pending[0] is request:
                self._pending.popleft()
            if answers is not None:
                break
            # a shard died, or restarted empty, since the split: the requests in flight were split by masses
            # it no longer has; ask again by the stats just learnt (the lost shard's rows are gone)
            self.shard_failures += 1
            self._pending.clear()
        drawn = [(shard, answer) for shard, answer in enumerate(answers) if answer.batch is not None]
        beta = self.beta
        batch = merge_answers(drawn, request.masses, beta)
        self.batches_sampled += 1
        if beta is not None:
            feedback = ShardedPriorityFeedback(
                self, batch[SHARD_FIELD], batch["indices"], batch["generations"], batch[INCARNATION_FIELD]
            )
            batch.attach_priority_feedback(feedback)
        return batch

    def _answers(self, request: ShardRequest) -> list[ShardSample] | None:
        """Every shard's answer to ``request``; ``None`` when a shard died before answering or answered no rows
        for a count above 0 (it restarted empty): :attr:`known` then holds what the shards said (0 for a dead
        one), for the next split."""
        answers, self.known = self.requests.collect(request)
        return answers

    def _request(self, batch_size: int) -> ShardRequest:
        """Split a batch over the shards by their last known masses and send every shard its count."""
        if batch_size > len(self):
            self.refresh()
            if batch_size > len(self):
                raise ValueError(
                    f"cannot sample a batch of {batch_size} from a sharded replay holding {len(self)} transitions "
                    f"in {len(self.known)} shards; set ShardedReplay(shards, warmup={batch_size}) or more so "
                    "sampling starts later, or lower batch_size. Nothing was drawn or changed."
                )
        return self.requests.send(batch_size, np.array([stats.mass for stats in self.known], dtype=np.float64))

    def update_priorities(
        self,
        shard: Numbers,
        indices: Numbers,
        priorities: Numbers,
        generations: Numbers | None = None,
        incarnations: Numbers | None = None,
    ) -> int:
        """Send ``priorities`` (float [B], finite, ``>= 0``) of rows ``(shard, indices)`` (int [B]) to their shards.

        Each shard applies them as a local buffer does (``(p + eps) ** alpha``);
        rows whose ``generations`` (int [B]) no longer match their slot were
        overwritten since the draw and are skipped there, and so are rows of
        another ``incarnations`` (int [B]) of their shard (it restarted since
        the draw; an update sent to a shard that dies before answering counts
        its rows as stale too). Bad values raise a
        ``ValueError`` here, before anything is sent. Returns the stale rows
        skipped with ``sync_updates``, else 0 (counted in :attr:`stale_updates`
        once the shards answer; :meth:`flush_updates` waits for them).
        """
        if not self.prioritized:
            raise TypeError(
                "these shards draw uniformly: they have no priorities to update; build them with a factory "
                "whose buffer has draws=ptl_rl.PrioritizedDraws(...)"
            )
        self._router.send(shard, indices, priorities, generations, incarnations)
        return self.flush_updates() if self.sync_updates else 0

    def flush_updates(self) -> int:
        """Wait for every priority update sent; returns the stale rows they skipped (errors raise here)."""
        return self._router.count(wait=True)

    @property
    def stale_updates(self) -> int:
        """Rows of priority updates the shards ignored (overwritten, or of a shard's earlier incarnation)."""
        return self._router.stale

    @property
    def applied_updates(self) -> int:
        """Rows of priority updates the shards applied."""
        return self._router.applied

    def __repr__(self) -> str:
        """``ShardedReplay(shards=K, size=..., warmup=..., [beta=...])`` and the chain upstream."""
        shown: dict[str, object] = {"shards": len(self._handles), "size": len(self), "warmup": self.warmup}
        if self.prioritized:
            shown["beta"] = self.beta
        return stage_repr(self, **shown)

"""The learner's requests to the shards: each batch split over the shards and drawn there by the learner's own stream.

A :class:`~ptl_rl.distributed.ShardedReplay` asks for a batch by one request: the multinomial split of the
batch over the shards' masses (:func:`~ptl_rl.distributed.shard_sampling.split_counts`), a seed for the
shards' draws, a grant of the rate limiter if there is one, and one ``sample`` call per shard. Both the
split and the seed come from one generator, :attr:`ShardRequests.rng`, seeded per DDP rank
(:func:`~ptl_rl.rank_seed`), and each shard draws a request's rows with a generator made from the
request's seed and its own index. So every learner (every DDP rank) samples the shared shards with its
own random stream: two ranks never draw the same batches, a fixed seed repeats a rank's batches over the
same rows, and the stream is one generator's state (saved in the learner's checkpoint), however many
learners the shards serve. See ``docs/design/replay-service.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from ptl_rl.core.ranks import rank_seed
from ptl_rl.distributed.replay_shard import ShardSample, ShardStats
from ptl_rl.distributed.shard_sampling import split_counts

#: Request seeds are drawn below this bound (63 bits: a non-negative int64).
SEED_BOUND = 2**63


class ShardRequest(NamedTuple):
    """A batch asked of the shards: its size, the masses it was split by (float64 [K]), the counts (int64 [K]),
    one ref per shard, and the stream's state before it was drawn (a checkpoint taken while it is in flight
    saves that state, so a resumed run draws it again)."""

    batch_size: int
    masses: np.ndarray
    counts: np.ndarray
    refs: list[Any]
    stream_state: Mapping[str, Any]


class ShardRequests:
    """Sends a learner's requests to the shards and collects the answers, with the learner's random stream.

    Args:
        ray: the ``ray`` module.
        handles: the shards' actor handles, in shard order.
        limiter: the rate limiter's actor handle, or ``None``.
        seed: seeds :attr:`rng` for rank 0 (other ranks: :func:`~ptl_rl.rank_seed`); ``None``: fresh entropy.
        sample_timeout: seconds :meth:`collect` waits before it raises ``TimeoutError``; ``None``: no limit.
        rate_counts: reads the limiter's counts, for the timeout's message.
    """

    def __init__(
        self,
        ray: Any,
        handles: list[Any],
        limiter: Any,
        seed: int | None,
        sample_timeout: float | None,
        rate_counts: Callable[[], dict[str, int]],
    ) -> None:
        self._ray = ray
        self._handles = handles
        self._limiter = limiter
        self._last_grant: Any = None
        self._rate_counts = rate_counts
        self.seed = seed
        self.sample_timeout = sample_timeout
        self.rank = 0
        self.rng = np.random.default_rng(seed)

    def set_rank(self, rank: int) -> None:
        """Re-seed for DDP rank ``rank`` (a no-op when already there, so a restored state is kept)."""
        if int(rank) != self.rank:
            self.rank = int(rank)
            self.rng = np.random.default_rng(rank_seed(self.seed, self.rank))

    def send(self, batch_size: int, masses: np.ndarray) -> ShardRequest:
        """Split ``batch_size`` rows over the shards by ``masses`` (float64 [K]) and send every shard its count.

        Every shard is asked, a count of 0 answering with its stats only, so the
        next split knows every shard's mass. The shards draw with a seed from
        :attr:`rng` (the same for all of them; each mixes in its index).
        """
        stream_state = self.rng.bit_generator.state
        counts = split_counts(self.rng, batch_size, masses)
        seed = int(self.rng.integers(SEED_BOUND))
        grant = None
        if self._limiter is not None:  # granted in the order asked (see RateLimiter.insert)
            grant = self._last_grant = self._limiter.sample.remote(batch_size, self._last_grant)
        refs = [h.sample.remote(int(c), grant, seed) for h, c in zip(self._handles, counts, strict=True)]
        return ShardRequest(batch_size, masses, counts, refs, stream_state)

    def collect(self, request: ShardRequest) -> tuple[list[ShardSample] | None, list[ShardStats]]:
        """Every shard's answer to ``request`` and the shards' stats as of them.

        The answers are ``None`` when a shard died before answering (its stats
        then say 0 rows: it restarts empty) or answered no rows for a count
        above 0 (it restarted empty since the split): the caller asks again by
        the stats returned.
        """
        ray = self._ray
        try:
            answers: list[ShardSample] = ray.get(request.refs, timeout=self.sample_timeout)
        except ray.exceptions.RayActorError:
            known = []
            for ref in request.refs:
                try:
                    known.append(ray.get(ref, timeout=self.sample_timeout).stats)
                except ray.exceptions.RayActorError:
                    known.append(ShardStats(0, 0.0, 0, -1))  # restarting: empty when it answers again
            return None, known
        except ray.exceptions.GetTimeoutError:
            held = "" if self._limiter is None else f"; the rate limiter has granted {self._rate_counts()}"
            raise TimeoutError(
                f"no batch from the shards within {self.sample_timeout} s on rank {self.rank}{held}. With a rate "
                "limit the learner waits for writers to insert (samples_per_insert, error_buffer); without one, a "
                "shard is slow or gone. The request stays in flight: sample() again goes on waiting. Under DDP the "
                "other ranks wait for this one at their next gradient step: stop the run, or raise sample_timeout"
            ) from None
        known = [answer.stats for answer in answers]
        if any(answer.batch is None and count > 0 for answer, count in zip(answers, request.counts, strict=True)):
            return None, known
        return answers, known

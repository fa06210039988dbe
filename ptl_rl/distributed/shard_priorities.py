"""Priority updates of a sharded replay: each row's new priority sent to the shard holding it, answers counted.

:class:`~ptl_rl.distributed.ShardedReplay` checks the values and hands them here; the shards skip rows overwritten
since their draw (``generations``) and rows of an earlier life of the shard (``incarnations``), as a local
buffer skips stale rows. An update sent to a shard that died before answering counts its rows as stale.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptl_rl.core.batch import Numbers
from ptl_rl.distributed.shard_sampling import check_priorities
from ptl_rl.replay.feedback import to_numpy_1d


class PriorityRouter:
    """Sends priority updates to the shards holding the rows, and counts the stale and applied rows as answered.

    Args:
        ray: the ``ray`` module.
        handles: the shard actors, in shard order.
    """

    def __init__(self, ray: Any, handles: list[Any]) -> None:
        self._ray = ray
        self._handles = handles
        self._sent: list[tuple[Any, int]] = []  # (ref, rows) of updates sent, not yet counted
        self.stale = 0  # rows the shards ignored
        self.applied = 0  # rows the shards applied

    def reset(self, stale: int, applied: int) -> None:
        """Forget the updates in flight (the shards' rows were replaced) and set the counts."""
        self._sent, self.stale, self.applied = [], stale, applied

    def send(
        self,
        shard: Numbers,
        indices: Numbers,
        priorities: Numbers,
        generations: Numbers | None,
        incarnations: Numbers | None,
    ) -> None:
        """Send ``priorities`` (float [B], finite, ``>= 0``) of rows ``(shard, indices)`` (int [B]), with their
        write stamps ``generations`` and shard lives ``incarnations`` (int [B] or ``None``): one call per shard
        and life, not per row. Bad input raises ``ValueError`` before anything is sent."""
        shards = to_numpy_1d(shard, "shard", np.int64)
        idx = to_numpy_1d(indices, "indices", np.int64)
        values = to_numpy_1d(priorities, "priorities", np.float64)
        gens = None if generations is None else to_numpy_1d(generations, "generations", np.int64)
        incs = None if incarnations is None else to_numpy_1d(incarnations, "incarnations", np.int64)
        if (
            not (len(shards) == len(idx) == len(values))
            or (gens is not None and len(gens) != len(idx))
            or (incs is not None and len(incs) != len(idx))
        ):
            raise ValueError(
                f"got {len(shards)} shards, {len(idx)} indices, {len(values)} priorities"
                + ("" if gens is None else f" and {len(gens)} generations")
                + "; pass one of each per sampled row, in the batch's order. No shard's priorities changed."
            )
        check_priorities(values)
        if len(shards) and (shards.min() < 0 or shards.max() >= len(self._handles)):
            raise ValueError(
                f"shard must be in [0, {len(self._handles)}); got {shards.min()}..{shards.max()}. Pass the "
                "shard field of a batch sampled from this replay. No shard's priorities changed."
            )
        lives = np.zeros(len(shards), np.int64) if incs is None else incs
        for k in np.unique(shards).tolist():  # a loop over shards (and their lives), not rows
            for life in np.unique(lives[shards == k]).tolist():
                rows = (shards == k) & (lives == life)
                stamps = None if gens is None else gens[rows]
                incarnation = None if incs is None else int(life)
                ref = self._handles[k].update_priorities.remote(idx[rows], values[rows], stamps, incarnation)
                self._sent.append((ref, int(np.count_nonzero(rows))))

    def count(self, wait: bool) -> int:
        """Count the answers of the updates sent (all of them, waiting, or those already in); returns the stale
        rows among them (a shard's refusal raises here)."""
        if not self._sent:
            return 0
        if wait:
            done, self._sent = self._sent, []
        else:
            ready, _ = self._ray.wait([ref for ref, _ in self._sent], num_returns=len(self._sent), timeout=0)
            ready_set = set(ready)
            done = [update for update in self._sent if update[0] in ready_set]
            self._sent = [update for update in self._sent if update[0] not in ready_set]
        ray = self._ray
        try:
            stale = int(sum(ray.get([ref for ref, _ in done])))  # (a shard's refusal raises here)
        except ray.exceptions.RayActorError:  # a shard died before answering: its rows' updates are lost
            stale = 0
            for ref, rows in done:
                try:
                    stale += int(ray.get(ref))
                except ray.exceptions.RayActorError:
                    stale += rows
        self.stale += stale
        self.applied += sum(rows for _, rows in done) - stale
        return stale

"""Sampling without replacement: shuffled passes over the stored slots (epoch-style training)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ptl_rl.core.versions import check_version, versioned


class ShuffledPasses:
    """Hands out the slots ``0 .. size-1`` in a fresh random order per pass, each exactly once per pass.

    A pass is a permutation of the slots stored when it begins; consecutive
    calls of :meth:`next` cut it into batches, and the last batch of a pass
    holds the remainder (it may be smaller). Slots added during a pass join the
    next one; a slot overwritten during a pass is still drawn once, with its
    new contents.
    """

    def __init__(self) -> None:
        self.order = np.zeros(0, dtype=np.int64)
        self.position = 0
        self.passes = 0  # passes begun so far

    @property
    def remaining(self) -> int:
        """Slots of the current pass not handed out yet."""
        return len(self.order) - self.position

    def start(self, size: int, rng: np.random.Generator) -> None:
        """Begin a new pass over ``size`` slots (the rest of an unfinished pass is dropped)."""
        self.order = rng.permutation(size).astype(np.int64, copy=False)
        self.position = 0
        self.passes += 1

    def next(self, batch_size: int, size: int, rng: np.random.Generator) -> np.ndarray:
        """The next ``<= batch_size`` slots (int64) of the current pass, starting a new pass when it is used up."""
        if self.remaining == 0:
            self.start(size, rng)
        out = self.order[self.position : self.position + batch_size]
        self.position += len(out)
        return out

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        state = {"order": torch.from_numpy(self.order.copy()), "position": self.position, "passes": self.passes}
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.order = state["order"].numpy().copy()
        self.position = int(state["position"])
        self.passes = int(state["passes"])

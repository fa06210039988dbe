"""A per-step stage that keeps a copy of every raw batch going through it, for tests of stages placed after it."""

from __future__ import annotations

from typing import Any

import numpy as np


class Tap:
    """Passes batches on unchanged; ``raw`` holds a copy of each one's fields (numpy arrays)."""

    one_row_per_env = True

    def __init__(self, upstream: Any) -> None:
        self.upstream = upstream
        self.raw: list[dict[str, np.ndarray]] = []

    @property
    def stream_seq(self) -> int:
        return self.upstream.stream_seq

    @property
    def num_envs(self) -> int:
        return self.upstream.num_envs

    def __iter__(self) -> Tap:
        return self

    def __next__(self) -> Any:
        batch = next(self.upstream)
        self.raw.append({k: np.array(v, copy=True) for k, v in batch.items()})
        return batch

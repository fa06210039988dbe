# Type stub of the optional compiled frame insert (_frame_insert.c): mypy cannot read an extension module.
from typing import Any

import numpy as np
import numpy.typing as npt

class Kernel:
    """A FrameStorage's long-lived arrays (the per-env state pair included) held as buffers, and the batch's keys
    (``("obs", "next_obs", *fields)``); ``insert`` writes one batch, given as its dict, into them."""

    def __init__(
        self,
        pool: np.ndarray,
        obs_refs: npt.NDArray[np.int64],
        next_refs: npt.NDArray[np.int64],
        pending: np.ndarray,
        watermark: npt.NDArray[np.int64],
        fields: tuple[np.ndarray, ...],
        keys: tuple[str, ...],
        state: npt.NDArray[np.int64],
        spare: npt.NDArray[np.int64],
        env_k: int,
        terminated_k: int,
        truncated_k: int,
        n: int,
        /,
    ) -> None: ...
    def insert(
        self,
        batch: dict[str, Any],
        state: npt.NDArray[np.int64],
        spare: npt.NDArray[np.int64],
        trusted: bool,
        cursor: int,
        total_added: int,
        /,
    ) -> int:
        """Rows written, or -1: the batch is not covered (a key more or missing, ...), nothing changed."""

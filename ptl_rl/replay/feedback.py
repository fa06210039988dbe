"""What a batch that names its slots carries: the fields added to it, and the link that feeds priorities back.

A batch drawn by a strategy that names its slots (:class:`~ptl_rl.replay.PrioritizedDraws`,
:class:`~ptl_rl.replay.SequenceWindows`, :class:`~ptl_rl.replay.HindsightGoals`)
carries ``indices`` (int64 [B], the slots drawn) and ``generations`` (int64
[B], the slots' write stamps), and with priorities ``weights`` (float32 [B])
and the link ``batch.update_priorities(td_errors)`` (a :class:`PriorityFeedback`)
that writes ``|td_errors|`` back to the strategy. A slot overwritten since it
was sampled has a new stamp: its update is ignored and counted in
``stale_updates``.
"""

from __future__ import annotations

import numpy as np
import torch

from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.core.protocols.draws import PriorityDrawStrategy

__all__ = ["SAMPLE_FIELDS", "Numbers", "PriorityFeedback", "check_reserved_fields", "to_numpy_1d"]

# Fields the strategies that name their slots add to sampled batches; stored data may not use them.
SAMPLE_FIELDS = ("indices", "generations", "weights", "mask")


def check_reserved_fields(batch: TransitionBatch) -> None:
    """Refuse a batch that stores a field these buffers add to sampled batches (``indices``, ...)."""
    clash = [name for name in SAMPLE_FIELDS if name in batch]
    if clash:
        raise ValueError(
            f"field(s) {clash} are added to sampled batches by this buffer and cannot be stored; rename the agent "
            "extra(s)"
        )


def to_numpy_1d(values: Numbers, name: str, dtype: type) -> np.ndarray:
    """``values`` (numpy, list or torch tensor on any device) as a 1-D numpy array of ``dtype``.

    A trailing singleton dimension (``[B, 1]``, as a Q-network with keepdim gives) is dropped.
    """
    if type(values) is np.ndarray and values.ndim == 1 and values.dtype == dtype:
        return values  # the common case, without further checks
    if isinstance(values, torch.Tensor):
        values = values.detach()
        if values.is_floating_point() and values.dtype not in (torch.float32, torch.float64):
            values = values.float()  # bfloat16/float16 have no numpy twin
        values = values.cpu().numpy()
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise ValueError(
            f"{name} must be one value per sampled row, shape [B]; got shape {array.shape}. "
            "For sequence batches [B, L] reduce over time first (e.g. 0.9 * max + 0.1 * mean over the mask)."
        )
    return array.astype(dtype, copy=False)


class PriorityFeedback:
    """The hook a prioritized batch carries: feeds ``|td_errors|`` back to the strategy that drew it.

    Holds numpy copies of the batch's slots and generation stamps, so it needs
    no device-to-host copy of the batch's ``indices`` and survives
    ``TorchBatch.to(device)``. Subsetting a batch with ``rows`` selects the
    same rows here.
    """

    __slots__ = ("generations", "indices", "target")

    def __init__(self, target: PriorityDrawStrategy, indices: np.ndarray, generations: np.ndarray) -> None:
        self.target = target
        self.indices = indices
        self.generations = generations

    def __call__(self, td_errors: Numbers) -> int:
        """Write ``|td_errors|`` (float [B]) as the new priorities; returns the number of stale rows ignored."""
        td = to_numpy_1d(td_errors, "td_errors", np.float64)
        return self.target.update_priorities(self.indices, np.abs(td), self.generations)

    def select(self, index: np.ndarray | torch.Tensor | slice) -> PriorityFeedback:
        """The feedback of the rows ``index`` (slice, bool mask or int indices; numpy or torch)."""
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        return PriorityFeedback(self.target, self.indices[index], self.generations[index])

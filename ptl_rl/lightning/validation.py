"""EvaluationMixin: a ready ``validation_step``/``test_step`` that logs the episodes of an evaluation loader."""

from __future__ import annotations

import torch

__all__ = ["EvaluationMixin"]


class EvaluationMixin:
    """A ready ``validation_step``/``test_step`` for :func:`~ptl_rl.evaluation.evaluation_dataloader` batches.

    Put it before ``LightningModule`` in the bases:
    ``class MyDQN(ptl_rl.EvaluationMixin, L.LightningModule)``. Each evaluation
    batch holds ``episode_return`` and ``episode_length`` (float32 [episodes]);
    the mixin logs their means as ``eval/return_mean`` and ``eval/length_mean``
    (averaged over ranks under DDP), which ``EarlyStopping(monitor=...)`` and
    ``ModelCheckpoint(monitor=...)`` can watch.
    """

    eval_metric_prefix = "eval"

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._log_evaluation(batch)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._log_evaluation(batch)

    def _log_evaluation(self, batch: dict[str, torch.Tensor]) -> None:
        size = len(batch["episode_return"])
        prefix = self.eval_metric_prefix
        self.log(  # type: ignore[attr-defined]  # a mixin: the LightningModule it is mixed into has log
            f"{prefix}/return_mean",
            batch["episode_return"].float().mean(),
            batch_size=size,
            sync_dist=True,
            prog_bar=True,
        )
        self.log(f"{prefix}/length_mean", batch["episode_length"].float().mean(), batch_size=size, sync_dist=True)  # type: ignore[attr-defined]

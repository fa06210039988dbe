"""AsyncSource under a Lightning Trainer: weight pushes every K steps, staleness logs, checkpoints, resume, shutdown."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from collectors import ShiftPolicy, check_rows, concat_rows, scripted_collector

from ptl_rl import BatchSampler, EnvStepLimit, EpisodeStatsLogger, PipelineCheckpoint, ReplayBuffer, to_dataloader
from ptl_rl.distributed import AsyncSource
from ptl_rl.distributed.callbacks import WeightSync

K = 5  # optimizer steps between weight pushes


class ShiftModule(pl.LightningModule):
    """Trains a throwaway head; sets the policy's shift so the weights pushed as version v act with shift v."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.policy = ShiftPolicy()
        self.head = torch.nn.Linear(1, 1)
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if self.fail_at is not None and self.global_step >= self.fail_at:
            raise RuntimeError("learner failure")
        with torch.no_grad():  # WeightSync pushes after step s when s % K == 0, as version s // K
            self.policy.shift.fill_((self.global_step + 1) // K)
        return (self.head(batch.reward[:, None].float()) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.head.parameters(), lr=1e-3)


def _pipeline(module: ShiftModule):
    source = AsyncSource(functools.partial(scripted_collector, n=2), policy=module.policy, queue_size=4)
    buffer = ReplayBuffer(source, capacity=5_000, warmup=20, transitions_per_yield=4, seed=0)
    return source, buffer, to_dataloader(BatchSampler(buffer, batch_size=8), steps_per_epoch=1000)


def _trainer(tmp_path, loader, max_steps: int, source: AsyncSource) -> pl.Trainer:
    return pl.Trainer(
        max_steps=max_steps,
        callbacks=[WeightSync(loader, every_n_steps=K), PipelineCheckpoint(loader), EpisodeStatsLogger(loader)],
        logger=pl.loggers.CSVLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        default_root_dir=tmp_path,
    )


def _stored(buffer: ReplayBuffer) -> dict[str, np.ndarray]:
    return concat_rows([buffer.storage.gather(np.arange(len(buffer)))])


def test_fit_pushes_logs_checkpoints_and_resumes_with_fresh_envs(tmp_path) -> None:
    module = ShiftModule()
    source, buffer, loader = _pipeline(module)
    trainer = _trainer(tmp_path, loader, 30, source)
    trainer.fit(module, train_dataloaders=loader)
    assert not source.running, "the collector outlived fit"
    assert source.version == 30 // K
    assert "collector/staleness_mean" in trainer.logged_metrics
    rows = _stored(buffer)
    check_rows(rows, n=2)
    assert rows["policy_version"].max() >= 30 // K - 2
    ckpt = tmp_path / "run.ckpt"
    trainer.save_checkpoint(ckpt)
    steps_before, stored_before = source.total_steps, len(buffer)

    resumed = ShiftModule()
    source2, buffer2, loader2 = _pipeline(resumed)
    trainer2 = _trainer(tmp_path, loader2, 45, source2)
    trainer2.fit(resumed, train_dataloaders=loader2, ckpt_path=ckpt)
    assert not source2.running
    assert source2.version == 45 // K and source2.total_steps > steps_before
    rows2 = _stored(buffer2)
    check_rows(rows2, n=2)
    new = rows2["obs"][stored_before:]
    # the restarted collector is a new incarnation: fresh episodes (numbered from 1000) on other env ids
    assert len(new) and (new[:, 1] >= 1000).all() and (rows2["env_id"][stored_before:] >= 3).all()
    np.testing.assert_array_equal(rows2["obs"][:stored_before], rows["obs"])  # the replay came back whole
    assert rows2["policy_version"][stored_before:].min() >= 30 // K


def test_learner_failure_and_env_step_limit_stop_the_collector(tmp_path) -> None:
    module = ShiftModule(fail_at=8)
    source, _, loader = _pipeline(module)
    with pytest.raises(RuntimeError, match="learner failure"):
        _trainer(tmp_path, loader, 100, source).fit(module, train_dataloaders=loader)
    assert not source.running
    module = ShiftModule()
    source, _, loader = _pipeline(module)
    trainer = _trainer(tmp_path, loader, 10_000, source)
    trainer.callbacks.append(EnvStepLimit(loader, 60))
    trainer.fit(module, train_dataloaders=loader)
    assert not source.running and 60 <= source.total_steps

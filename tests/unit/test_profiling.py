"""ptl_rl.profile and the PipelineProfiler callback: the numbers add up, items equal the rows that passed."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ptl_rl
from ptl_rl.core.clock import StageClock


def build(num_envs: int = 4, batch_size: int = 16, n: int = 3):
    env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=0)), seed=0)
    nstep = ptl_rl.NStepTransform(source, n=n, gamma=0.9)
    buffer = ptl_rl.ReplayBuffer(nstep, 1_000, warmup=64, transitions_per_yield=4, seed=0)
    return net, source, nstep, buffer, ptl_rl.BatchSampler(buffer, batch_size)


def test_shares_sum_to_one_and_items_are_the_rows_that_passed() -> None:
    _, source, nstep, buffer, sampler = build()
    table = ptl_rl.profile(sampler)
    table.reset()
    for _ in range(60):
        next(sampler)
    table = ptl_rl.profile(sampler)
    stages = [row.stage for row in table.rows]
    assert stages == [
        "env step",
        "agent call",
        "source bookkeeping",
        "n-step",
        "insert",
        "replay",
        "sample",
        "conversion to torch",
        "sampler",
        "outside the pipeline",
    ]
    assert sum(table.shares().values()) == pytest.approx(1.0, abs=1e-9)
    assert all(row.own_s >= 0 and 0 <= row.share <= 1 for row in table.rows)
    # the own times telescope to the last stage's inclusive time
    inside = sum(row.own_s for row in table.rows if row.stage != "outside the pipeline")
    assert inside == pytest.approx(sampler.clock.ns / 1e9, rel=1e-9)
    assert table["env step"].items == source.num_envs * table["env step"].calls
    assert table["agent call"].calls == table["env step"].calls
    assert table["source bookkeeping"].items == source.total_steps  # every env step that was a transition
    assert table["n-step"].items == buffer.storage.total_added == table["insert"].items
    assert table["replay"].items == table["insert"].items
    assert table["sample"].items == table["conversion to torch"].items == 60 * 16
    assert table["sampler"].calls == 60
    row = table["env step"]
    assert row.us_per_item == pytest.approx(1e6 * row.own_s / row.items)
    assert row.items_per_s == pytest.approx(row.items / row.own_s)


def test_reset_repr_and_html() -> None:
    _, source, nstep, _, _ = build()
    for _ in range(20):
        next(nstep)
    table = ptl_rl.profile(nstep)
    text, page = repr(table), table._repr_html_()
    for stage in ("env step", "agent call", "source bookkeeping", "n-step", "outside the pipeline"):
        assert stage in text and stage in page
    assert "us/item" in text and "<table>" in page
    table.reset()
    after = ptl_rl.profile(nstep)
    assert all(row.calls == 0 and row.items == 0 for row in after.rows)
    assert source.clock.ns == nstep.clock.ns == 0


def test_switched_off_the_counters_stand_still() -> None:
    _, source, nstep, _, _ = build()
    ptl_rl.set_profiling(False)
    try:
        for _ in range(10):
            next(nstep)
    finally:
        ptl_rl.set_profiling(True)
    assert nstep.clock.calls == source.clock.calls == source._env.clock.calls == 0
    next(nstep)
    assert nstep.clock.calls == 1


def test_host_to_device_copy_is_counted_by_the_sampler_that_made_the_batch() -> None:
    clock = StageClock("host-to-device copy", "rows")
    batch = ptl_rl.TransitionBatch(obs=np.zeros((8, 4), np.float32), reward=np.zeros(8, np.float32)).to_torch()
    batch.to("meta")  # a batch no sampler made: no clock, nothing counted anywhere
    batch = batch.time_transfers(clock)
    assert batch.to("cpu") is batch and clock.calls == 0  # nothing moved
    batch.to("meta")  # a device every machine has
    assert clock.calls == 1 and clock.items == 8
    _, _, _, _, sampler = build()
    sampled = next(sampler)
    sampled.to("meta")
    row = ptl_rl.profile(sampler)["host-to-device copy"]
    assert row.calls == 1 and row.items == len(sampled)


def test_a_pipeline_without_clocks_is_refused() -> None:
    with pytest.raises(ValueError, match="keeps time"):
        ptl_rl.profile(iter([]))


def test_profiler_callback_logs_throughput_and_shares(L) -> None:  # noqa: N803
    net, source, _, _, sampler = build()

    class QModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            q = self.net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
            return F.mse_loss(q, batch.reward)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    profiler = ptl_rl.PipelineProfiler(sampler, every_n_steps=5)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=30,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[profiler],
    )
    trainer.fit(QModule(), train_dataloaders=ptl_rl.to_dataloader(sampler, steps_per_epoch=30))
    metrics = trainer.callback_metrics
    for key in ("throughput/env_steps_per_s", "throughput/grad_steps_per_s", "profile/env_step", "profile/n-step"):
        assert key in metrics, sorted(metrics)
    assert metrics["throughput/env_steps_per_s"] > 0 and metrics["throughput/grad_steps_per_s"] > 0
    shares = [float(v) for k, v in metrics.items() if k.startswith("profile/")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-4)
    assert "env_steps/s" in trainer.progress_bar_metrics
    assert profiler.profile is not None and profiler.profile["sampler"].calls >= 25

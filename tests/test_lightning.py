"""The Lightning side: the DataLoader adapter, the DataModule's checkpointed state, callbacks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch import nn

import ptl_rl


def build_pipeline(seed: int = 0, batch_size: int = 16):
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    agent = ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=seed))
    source = ptl_rl.ExperienceSource(env, agent, seed=seed)
    nstep = ptl_rl.NStepTransform(source, n=2, gamma=0.9)
    buffer = ptl_rl.ReplayBuffer(nstep, 500, warmup=32, transitions_per_yield=2, seed=seed)
    return net, ptl_rl.BatchSampler(buffer, batch_size)


class PlainQModule(pl.LightningModule):
    """A plain LightningModule: nothing ptl_rl-specific beyond reading batch fields."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.seen: list[ptl_rl.TorchBatch] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch)
        q = self.net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
        with torch.no_grad():
            bootstrap = self.net(batch.next_obs).max(1).values
        target = batch.reward + batch.discount * (~batch.terminated).float() * bootstrap
        return nn.functional.smooth_l1_loss(q, target)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def trainer(**kwargs) -> pl.Trainer:
    defaults = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return pl.Trainer(**{**defaults, **kwargs})


def test_fit_a_plain_module_through_the_adapter_for_max_steps() -> None:
    net, sampler = build_pipeline()
    module = PlainQModule(net)
    before = [p.detach().clone() for p in net.parameters()]
    loader = ptl_rl.to_dataloader(sampler)
    assert loader.batch_size is None and loader.num_workers == 0
    trainer(max_steps=25).fit(module, train_dataloaders=loader)
    assert len(module.seen) == 25
    batch = module.seen[0]
    assert isinstance(batch, ptl_rl.TorchBatch)
    assert batch.obs.shape == (16, 4) and batch.obs.dtype == torch.float32
    assert batch.terminated.dtype == torch.bool
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    # warm-up of 32, then 2 transitions per batch (Lightning prefetches one batch)
    assert 32 + 2 * 25 <= source.total_steps <= 32 + 2 * 27 + 2


def test_steps_per_epoch_gives_lightning_epochs_that_continue_the_same_pipeline() -> None:
    net, sampler = build_pipeline()
    module = PlainQModule(net)
    loader = ptl_rl.to_dataloader(sampler, steps_per_epoch=10)
    assert len(loader) == 10
    fit = trainer(max_epochs=3)
    fit.fit(module, train_dataloaders=loader)
    assert fit.current_epoch == 3 and fit.global_step == 30
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    # one continuous stream: the environments were not reset between epochs
    assert source._reset_count == 1
    buffer = ptl_rl.find_stage(sampler, ptl_rl.ReplayBuffer)
    assert len(buffer) >= 32 + 2 * 29


def test_episode_stats_reach_the_logged_metrics() -> None:
    net, sampler = build_pipeline()
    module = PlainQModule(net)
    fit = trainer(max_steps=60, callbacks=[ptl_rl.EpisodeStatsLogger(sampler, every_n_steps=1)])
    fit.fit(module, train_dataloaders=ptl_rl.to_dataloader(sampler))
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    assert fit.callback_metrics["env_steps"].item() == pytest.approx(source.total_steps, abs=4)
    assert fit.callback_metrics["episode/return_mean"].item() == pytest.approx(
        source.episode_stats()["return_mean"], abs=5
    )
    assert "env_steps" in fit.progress_bar_metrics


def test_env_step_limit_stops_training() -> None:
    net, sampler = build_pipeline()
    fit = trainer(max_steps=10_000, callbacks=[ptl_rl.EnvStepLimit(sampler, 100)])
    fit.fit(PlainQModule(net), train_dataloaders=ptl_rl.to_dataloader(sampler))
    assert fit.global_step < 40


def test_datamodule_state_survives_a_checkpoint_loaded_with_weights_only(tmp_path) -> None:
    net, sampler = build_pipeline(seed=1)
    data = ptl_rl.RLDataModule(sampler, steps_per_epoch=20)
    fit = trainer(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    fit.fit(PlainQModule(net), datamodule=data)
    path = tmp_path / "run.ckpt"
    fit.save_checkpoint(path)

    checkpoint = torch.load(path, weights_only=True)  # no numpy arrays or custom objects inside
    saved = checkpoint["RLDataModule"]["pipeline"]
    assert set(saved) == {"0:ExperienceSource", "1:NStepTransform", "2:ReplayBuffer", "3:BatchSampler"}

    old_buffer = ptl_rl.find_stage(sampler, ptl_rl.ReplayBuffer)
    old_source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    net2, sampler2 = build_pipeline(seed=2)
    data2 = ptl_rl.RLDataModule(sampler2, steps_per_epoch=20)
    data2.load_state_dict(checkpoint["RLDataModule"])
    new_buffer = ptl_rl.find_stage(sampler2, ptl_rl.ReplayBuffer)
    new_source = ptl_rl.find_stage(sampler2, ptl_rl.ExperienceSource)
    assert len(new_buffer) == len(old_buffer)
    for name, stored in old_buffer.storage.fields.items():
        np.testing.assert_array_equal(new_buffer.storage.fields[name][: len(old_buffer)], stored[: len(old_buffer)])
    assert new_source.total_steps == old_source.total_steps
    assert new_source.episodes_finished == old_source.episodes_finished
    np.testing.assert_array_equal(new_buffer.sample(8)["action"], old_buffer.sample(8)["action"])


def test_resuming_fit_from_a_checkpoint_restores_the_pipeline(tmp_path) -> None:
    net, sampler = build_pipeline(seed=3)
    fit = trainer(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    fit.fit(PlainQModule(net), datamodule=ptl_rl.RLDataModule(sampler, steps_per_epoch=15))
    path = tmp_path / "resume.ckpt"
    fit.save_checkpoint(path)
    stored = len(ptl_rl.find_stage(sampler, ptl_rl.ReplayBuffer))

    net2, sampler2 = build_pipeline(seed=4)
    resumed = trainer(max_epochs=2)
    resumed.fit(PlainQModule(net2), datamodule=ptl_rl.RLDataModule(sampler2, steps_per_epoch=15), ckpt_path=path)
    buffer2 = ptl_rl.find_stage(sampler2, ptl_rl.ReplayBuffer)
    # restored contents plus one more epoch of collection, not a buffer refilled from scratch
    assert len(buffer2) >= stored + 2 * 14
    assert resumed.global_step == 30


def test_pipeline_state_rejects_a_different_pipeline() -> None:
    _, sampler = build_pipeline()
    state = ptl_rl.pipeline_state_dict(sampler)
    buffer = ptl_rl.ReplayBuffer(None, 10, warmup=0)
    with pytest.raises(ValueError, match="build the same pipeline"):
        ptl_rl.load_pipeline_state_dict(buffer, state)


def test_periodic_evaluation_logs_and_stops_once_the_return_is_reached() -> None:
    net, sampler = build_pipeline()
    eval_env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    agents = []

    def make_agent(module):
        agents.append(ptl_rl.DQNAgent(module.net, ptl_rl.ArgmaxSelector()))
        return agents[-1]

    evaluation = ptl_rl.PeriodicEvaluation(
        sampler, eval_env, make_agent, every_env_steps=40, episodes=2, stop_at_return=1.0, seed=0
    )
    fit = trainer(max_steps=1_000, callbacks=[evaluation])
    module = PlainQModule(net)
    fit.fit(module, train_dataloaders=ptl_rl.to_dataloader(sampler))
    # any CartPole episode returns at least 1, so the first evaluation (after 40 env steps) stops training
    assert len(evaluation.history) == 1 and evaluation.solved_at == evaluation.history[0][0] >= 40
    assert evaluation.solved_after_s is not None and fit.global_step < 10
    assert agents[0].net is module.net  # evaluated with the module's current network
    assert fit.callback_metrics["eval/return_mean"].item() == evaluation.history[0][1]


def test_evaluation_every_n_env_steps_without_a_stop() -> None:
    net, sampler = build_pipeline()
    eval_env = gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="sync")
    evaluation = ptl_rl.PeriodicEvaluation(
        sampler, eval_env, lambda m: ptl_rl.DQNAgent(m.net, ptl_rl.ArgmaxSelector()), every_env_steps=20, episodes=1
    )
    trainer(max_steps=30, callbacks=[evaluation]).fit(
        PlainQModule(net), train_dataloaders=ptl_rl.to_dataloader(sampler)
    )
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    grid = [steps // 20 for steps, _ in evaluation.history]
    # one evaluation per multiple of 20 env steps crossed (the first after the warm-up)
    assert grid == list(range(grid[0], source.total_steps // 20 + 1)) and len(grid) >= 3
    assert evaluation.solved_at is None

"""MuJoCo smoke runs: the PPO recipe and SAC on a few thousand Hopper-v5 steps, and normalization in checkpoints.

Whether PPO reaches the published returns at 1M steps is a benchmark
(``benchmarks/mujoco.py``, records in ``benchmarks/results/mujoco.json``), not a test.
"""

from __future__ import annotations

import importlib
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import ptl_rl

pytest.importorskip("mujoco")

from ptl_rl.examples import ppo, sac  # noqa: E402 - after the skip: they need MuJoCo only to run, not to import


def test_ppo_takes_the_mujoco_recipe_for_mujoco_envs_and_explicit_flags_win():
    args = ppo.parse_args(["--env-id", "Hopper-v5"])
    for name, value in ppo.MUJOCO_RECIPE.items():
        assert getattr(args, name) == value or (name == "solved_return" and args.solved_return is None), name
    assert ppo.parse_args(["--env-id", "Hopper-v5", "--lr", "1e-4", "--no-norm-obs"]).lr == 1e-4
    assert not ppo.parse_args(["--env-id", "Hopper-v5", "--no-norm-obs"]).norm_obs
    classic = ppo.parse_args(["--env-id", "CartPole-v1"])
    assert classic.num_envs == 8 and not classic.norm_obs and not classic.clip_vloss
    assert ppo.parse_args(["--env-id", "CartPole-v1", "--recipe", "mujoco"]).norm_obs
    assert not ppo.parse_args(["--env-id", "Hopper-v5", "--recipe", "classic"]).norm_obs


def test_ppo_runs_the_mujoco_recipe_on_hopper(tmp_path):
    summary = ppo.train(ppo.parse_args(["--env-id", "Hopper-v5", "--env-steps", "2048", "--steps-per-env", "512",
                        "--num-minibatches", "4", "--update-epochs", "2", "--final-eval-episodes", "2",
                        "--runs-dir", str(tmp_path), "--no-progress-bar", "--seed", "3"]))  # fmt: skip
    assert summary["env_steps"] >= 2048 and summary["rollouts"] >= 3
    assert math.isfinite(summary["final_eval_return"]) and math.isfinite(summary["train_return_last10"])


def test_sac_runs_on_hopper(tmp_path):
    summary = sac.train(sac.parse_args(["--env-id", "Hopper-v5", "--env-steps", "1200", "--learning-starts", "400",
                        "--batch-size", "32", "--hidden", "32", "--eval-every", "0", "--final-eval-episodes", "1",
                        "--runs-dir", str(tmp_path), "--no-progress-bar"]))  # fmt: skip
    assert summary["env_steps"] >= 1200 and math.isfinite(summary["final_eval_return"])


def build_pipeline(seed: int):
    env = gym.make_vec("Hopper-v5", num_envs=2, vectorization_mode="sync")
    rng = np.random.default_rng(seed)

    def agent(obs):
        return rng.uniform(-1, 1, size=(len(obs), 3)).astype(np.float32)

    normalizer = ptl_rl.ObservationNormalizer()
    source = ptl_rl.ExperienceSource(env, agent, seed=seed, observation_transform=normalizer)
    norm = ptl_rl.NormalizeObservations(source, normalizer, output="raw")
    scaled = ptl_rl.ScaleRewards(norm, gamma=0.99)
    buffer = ptl_rl.ReplayBuffer(scaled, 2_000, warmup=64, transitions_per_yield=4, seed=seed)
    sampled = ptl_rl.NormalizeSampledObservations(ptl_rl.BatchSampler(buffer, 16), norm.normalizer)
    return sampled, norm, scaled


@pytest.mark.parametrize("package", ["pytorch_lightning", "lightning.pytorch"])
def test_normalization_statistics_survive_a_lightning_checkpoint_exactly(tmp_path, package):
    L = importlib.import_module(package)  # noqa: N806

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(11, 1)

        def training_step(self, batch, batch_idx):
            assert batch.obs.abs().max() <= 10.0  # normalized and clipped at sampling time
            return (self.head(batch.obs).squeeze(1) - batch.reward).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class Snapshot(L.Callback):
        def __init__(self, norm, scaled):
            self.norm, self.scaled, self.at_start = norm, scaled, None

        def on_fit_start(self, trainer, pl_module):  # after a restore, before the first batch
            self.at_start = (self.norm.normalizer.statistics.moments, self.scaled.statistics.moments)

    def fit(pipeline, norm, scaled, max_steps, ckpt=None):
        snap = Snapshot(norm, scaled)
        trainer = L.Trainer(max_steps=max_steps, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, callbacks=[snap])  # fmt: skip
        trainer.fit(Module(), datamodule=ptl_rl.RLDataModule(pipeline, steps_per_epoch=None), ckpt_path=ckpt)
        return trainer, snap

    pipeline, norm, scaled = build_pipeline(0)
    trainer, _ = fit(pipeline, norm, scaled, 30)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    saved = (norm.normalizer.statistics.moments, scaled.statistics.moments)
    assert saved[0].count > 64 and saved[1].count == saved[0].count
    torch.load(tmp_path / "last.ckpt", weights_only=True)  # plain tensors and containers

    pipeline2, norm2, scaled2 = build_pipeline(1)
    _, snap = fit(pipeline2, norm2, scaled2, 40, ckpt=tmp_path / "last.ckpt")
    for before, after in zip(saved, snap.at_start, strict=True):
        assert after.count == before.count
        assert np.array_equal(after.mean, before.mean) and np.array_equal(after.m2, before.m2)

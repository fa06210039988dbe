"""Two CPU DDP ranks whose pipelines normalize observations and scale rewards (tests/integration/test_ddp.py).

    python tests/support/ddp_normalization_run.py OUT_DIR PACKAGE

Each rank keeps a copy of every raw observation row its normalization stage took in
(a tap between the source and the stage) and writes, after a final checkpoint
(whose save merges the statistics of both ranks), ``OUT_DIR/norm_rank<r>.pt``:
its raw rows, the statistics it ends with and the number of syncs it saw.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from taps import Tap  # the script's folder is first on sys.path
from torch import nn

import ptl_rl


def main(out: Path, package: str) -> None:
    L = importlib.import_module(package)  # noqa: N806
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    agent = ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(ptl_rl.LinearSchedule(1.0, 0.1, 300), seed=0))
    source = ptl_rl.ExperienceSource(env, agent, seed=0, observation_transform=ptl_rl.ObservationNormalizer())
    tap = Tap(source)
    norm = ptl_rl.NormalizeObservations(tap)  # the source's normalizer
    scaled = ptl_rl.ScaleRewards(norm, gamma=0.9)
    buffer = ptl_rl.ReplayBuffer(scaled, 1_000, warmup=32, transitions_per_yield=2, seed=0)
    sampler = ptl_rl.BatchSampler(buffer, 8)

    class QModule(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            q = self.net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
            return F.mse_loss(q, batch.reward)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=60, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
        callbacks=[ptl_rl.NormalizationSync(sampler, every_n_steps=7)],
    )  # fmt: skip
    trainer.fit(QModule(), datamodule=ptl_rl.RLDataModule(sampler, steps_per_epoch=None))
    trainer.save_checkpoint(out / "norm.ckpt")  # every rank takes part; the save merges the statistics
    moments = norm.normalizer.statistics.moments
    torch.save(
        {
            "raw_obs": torch.from_numpy(np.concatenate([raw["obs"] for raw in tap.raw])),
            "count": moments.count,
            "mean": torch.from_numpy(np.asarray(moments.mean)),
            "var": torch.from_numpy(np.asarray(moments.var)),
            "local_count": norm.normalizer.statistics.local.count,
            "return_count": scaled.statistics.moments.count,
            "env_ids": torch.from_numpy(source.env_ids.copy()),
        },
        out / f"norm_rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    # Gloo's worker threads outlive a process group that is never destroyed, and the
    # interpreter's teardown then aborts the rank (SIGABRT, "terminate called without
    # an active exception"): end every DDP script this way, as PyTorch asks.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

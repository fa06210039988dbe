"""Two CPU DDP ranks sampling one set of replay shards on a Ray cluster they both join.

Run by tests/integration/test_shards_ddp.py (Lightning's DDP launcher re-runs this script for rank 1):

    python tests/support/ddp_shards_run.py OUT_DIR PACKAGE

``OUT_DIR/address`` holds the Ray cluster's GCS address and ``OUT_DIR/shards.pkl`` the pickled
``ReplayShards`` (unpickled once connected), both written by the test, which filled the shards. Each rank
joins the cluster, samples the shards through ``ShardedReplay -> BatchSampler -> to_dataloader`` and
writes the rows of every batch it trained on to ``OUT_DIR/rank<r>.pt``.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path

import ray
import torch
from torch import nn

import ptl_rl
from ptl_rl.distributed import ShardedReplay

SEED, BATCH, STEPS_PER_EPOCH, MAX_STEPS = 7, 8, 5, 10


def main(out: Path, package: str) -> None:
    L = importlib.import_module(package)  # noqa: N806
    ray.init(address=(out / "address").read_text(), log_to_driver=False)
    shards = pickle.loads((out / "shards.pkl").read_bytes())
    replay = ShardedReplay(shards, warmup=BATCH, seed=SEED, prefetch=1)  # the same seed on every rank

    class Recorder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(1, 1)
            self.rows: list[torch.Tensor] = []
            self.shards: list[torch.Tensor] = []

        def training_step(self, batch, batch_idx):
            self.rows.append(batch.obs[:, 0].long().cpu())
            self.shards.append(batch.shard.cpu())
            return self.net(batch.obs).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    module = Recorder()
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=MAX_STEPS, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    loader = ptl_rl.to_dataloader(ptl_rl.BatchSampler(replay, BATCH), steps_per_epoch=STEPS_PER_EPOCH)
    trainer.fit(module, train_dataloaders=loader)
    torch.save(
        {"rows": module.rows, "shards": module.shards, "global_step": trainer.global_step, "rank": replay.rank},
        out / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    if torch.distributed.is_initialized():  # (see ddp_run.py: gloo's threads abort a teardown without it)
        torch.distributed.destroy_process_group()

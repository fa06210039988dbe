"""A 2-process CPU DDP run of a ptl_rl pipeline, as a user's training script would do it.

Run by tests/integration/test_ddp.py (Lightning's DDP launcher re-runs this script for
rank 1, so it must be a script, not a test function):

    python tests/support/ddp_run.py train OUT_DIR PACKAGE    # train to an env-step budget, checkpoint
    python tests/support/ddp_run.py resume OUT_DIR PACKAGE   # resume from OUT_DIR/last.ckpt, record restored state
    python tests/support/ddp_run.py grouped OUT_DIR PACKAGE  # batches_per_step=3, gradient steps by hand
    python tests/support/ddp_run.py video OUT_DIR PACKAGE    # EvaluationVideo: only rank 0 renders and writes

Each rank writes what it saw to ``OUT_DIR/<phase>_rank<r>.pt`` for the test to compare.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

import ptl_rl

BUDGET = 400  # env steps over both ranks


def build(seed: int):
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    epsilon = ptl_rl.LinearSchedule(1.0, 0.1, 300)
    agent = ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(epsilon, seed=seed))
    source = ptl_rl.ExperienceSource(env, agent, seed=seed)  # no rank=: taken from the Trainer
    nstep = ptl_rl.NStepTransform(source, n=2, gamma=0.9)
    buffer = ptl_rl.ReplayBuffer(nstep, 1_000, warmup=32, transitions_per_yield=2, seed=seed)
    return net, ptl_rl.BatchSampler(buffer, 8)


def snapshot(sampler) -> dict:
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    buffer = ptl_rl.find_stage(sampler, ptl_rl.ReplayBuffer)
    fields = buffer.storage.fields
    return {
        "total_steps": source.total_steps,
        "env_ids": torch.from_numpy(source.env_ids.copy()),
        "epsilon": source.agent.selector.epsilon,
        "size": len(buffer),
        "obs": torch.from_numpy(fields["obs"][: len(buffer)].copy()) if fields else None,
        "buffer_rng": buffer.rng.bit_generator.state,
    }


def main(phase: str, out: Path, package: str) -> None:
    L = importlib.import_module(package)  # noqa: N806

    class QModule(L.LightningModule):
        def __init__(self, net):
            super().__init__()
            self.net = net
            self.batches: list[torch.Tensor] = []

        def training_step(self, batch, batch_idx):
            self.batches.append(batch.obs.detach().clone())
            q = self.net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
            with torch.no_grad():
                target = (
                    batch.reward + batch.discount * (~batch.terminated).float() * self.net(batch.next_obs).max(1).values
                )
            loss = F.smooth_l1_loss(q, target)
            self.log("loss", loss, on_epoch=True, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class Record(L.Callback):
        def __init__(self, sampler):
            self.sampler, self.at_start = sampler, None

        def on_fit_start(self, trainer, pl_module):  # after a restore, before Lightning fetches a batch
            self.at_start = snapshot(self.sampler)

    if phase == "grouped":
        return grouped(L, out)
    if phase == "video":
        return video(L, QModule, out)
    net, sampler = build(seed=0 if phase == "train" else 123)  # a resumed run must not depend on its own seed
    module = QModule(net)
    record = Record(sampler)
    callbacks = [ptl_rl.EnvStepLimit(sampler, BUDGET), record]
    if phase == "train":
        callbacks.append(L.callbacks.ModelCheckpoint(dirpath=out, save_last=True, every_n_train_steps=20))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=10_000,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=phase == "train", callbacks=callbacks,
    )  # fmt: skip
    data = ptl_rl.RLDataModule(sampler, steps_per_epoch=None)
    trainer.fit(module, datamodule=data, ckpt_path=out / "last.ckpt" if phase == "resume" else None)
    if phase == "train":
        trainer.save_checkpoint(out / "last.ckpt")  # the state at the end, on every rank's behalf
    torch.save(
        {
            "at_start": record.at_start,
            "at_end": snapshot(sampler),
            "batches": module.batches,
            "global_step": trainer.global_step,
        },
        out / f"{phase}_rank{trainer.global_rank}.pt",
    )


def grouped(L, out: Path) -> None:  # noqa: N803
    """Three gradient steps per Lightning step (ptl_rl.BatchGroup) under DDP, stopped by the env-step budget."""

    class GroupedQ(L.LightningModule):
        def __init__(self, net):
            super().__init__()
            self.net, self.automatic_optimization, self.group_sizes = net, False, []

        def training_step(self, group, batch_idx):
            optimizer = self.optimizers()
            for batch in group.batches():
                q = self.net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
                optimizer.zero_grad()
                self.manual_backward(F.smooth_l1_loss(q, batch.reward))  # DDP averages the gradients here
                optimizer.step()
            self.group_sizes.append(group.taken)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    net, sampler = build(seed=0)
    module = GroupedQ(net)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=10_000, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=[ptl_rl.EnvStepLimit(sampler, BUDGET)],
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=ptl_rl.to_dataloader(sampler, batches_per_step=3))
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    torch.save(
        {
            "weights": [p.detach().clone() for p in net.parameters()],
            "group_sizes": module.group_sizes,
            "global_step": trainer.global_step,
            "total_steps": source.total_steps,
            "env_ids": torch.from_numpy(source.env_ids.copy()),
        },
        out / f"grouped_rank{trainer.global_rank}.pt",
    )


def video(L, module_class, out: Path) -> None:  # noqa: N803
    """EvaluationVideo every 100 env steps (summed over ranks) under DDP: rank 0 records, rank 1 never renders."""
    from videos import RenderSpy

    net, sampler = build(seed=0)
    env = RenderSpy(gym.make("CartPole-v1", render_mode="rgb_array"))
    greedy = lambda module: ptl_rl.DQNAgent(module.net, ptl_rl.ArgmaxSelector())  # noqa: E731
    recorder = ptl_rl.EvaluationVideo(sampler, env, greedy, every_env_steps=100, directory=out / "videos")
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=10_000, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
        callbacks=[ptl_rl.EnvStepLimit(sampler, BUDGET), recorder],
    )  # fmt: skip
    trainer.fit(module_class(net), train_dataloaders=ptl_rl.to_dataloader(sampler))
    torch.save(
        {"renders": env.renders, "recordings": recorder.recordings, "next_record": recorder.next_record},
        out / f"video_rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
    # Gloo's worker threads outlive a process group that is never destroyed, and the
    # interpreter's teardown then aborts the rank (SIGABRT, "terminate called without
    # an active exception"): end every DDP script this way, as PyTorch asks.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

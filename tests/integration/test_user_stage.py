"""A stage of the user's own, written only against ``ptl_rl.core.protocols``, trains and resumes like ptl_rl's.

``ClipRewards`` sits between the source and the n-step transform and inherits nothing from ptl_rl: it has the
members of the protocols (``StageLike``, ``Stateful``, and it forwards its upstream's ``NumberedStream`` and
``PerEnvStream`` facts), and builds its batches with the public ``TransitionBatch``. It goes through
``to_dataloader`` under a Lightning Trainer of either package, into a checkpoint, and back.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ptl_rl
from ptl_rl.core.protocols import NumberedStream, PerEnvStream, StageLike, Stateful

GAMMA = 0.9
LIMIT = 0.5  # CartPole pays 1.0 per step: every reward is clipped


class ClipRewards:
    """Clips each 1-step reward to ``[-limit, limit]`` and counts the rewards it changed (its checkpointed state)."""

    STATE_VERSION = 1

    def __init__(self, upstream: Any, limit: float) -> None:
        self.upstream = upstream
        self.limit = float(limit)
        self.clipped = 0

    # It passes every row through, in order: the upstream's stream facts hold for its own batches too.
    @property
    def stream_seq(self) -> int | None:
        return self.upstream.stream_seq

    @property
    def one_row_per_env(self) -> bool:
        return self.upstream.one_row_per_env

    def __iter__(self) -> ClipRewards:
        return self

    def __next__(self) -> ptl_rl.TransitionBatch:
        batch = next(self.upstream)
        reward = np.clip(batch.reward, -self.limit, self.limit)
        self.clipped += int(np.count_nonzero(reward != batch.reward))
        return ptl_rl.TransitionBatch({**batch, "reward": reward})

    def state_dict(self) -> dict[str, Any]:
        return ptl_rl.versioned({"clipped": self.clipped}, self.STATE_VERSION)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ptl_rl.check_version(state, self.STATE_VERSION, type(self).__name__)
        self.clipped = int(state["clipped"])


def build_pipeline(seed: int) -> tuple[nn.Module, ClipRewards, ptl_rl.BatchSampler]:
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=seed)), seed=seed)
    clip = ClipRewards(source, LIMIT)
    buffer = ptl_rl.ReplayBuffer(ptl_rl.NStepTransform(clip, n=2, gamma=GAMMA), 500, warmup=32, seed=seed)
    return net, clip, ptl_rl.BatchSampler(buffer, batch_size=16)


def module_class(L):  # noqa: N803
    class QModule(L.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net
            self.rewards: list[torch.Tensor] = []

        def training_step(self, batch, batch_idx):
            self.rewards.append(batch.reward)
            q = self.net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
            with torch.no_grad():
                bootstrap = self.net(batch.next_obs).max(1).values
            target = batch.reward + batch.discount * (~batch.terminated).to(q.dtype) * bootstrap
            return F.smooth_l1_loss(q, target)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return QModule


def trainer(L, **kwargs):  # noqa: N803
    quiet = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    kwargs.setdefault("enable_checkpointing", False)
    return L.Trainer(**quiet, **kwargs)


def test_the_user_stage_meets_the_protocols_without_inheriting_from_ptl_rl():
    _, clip, sampler = build_pipeline(seed=0)
    assert all(base.__module__ == "builtins" for base in ClipRewards.__mro__[1:])
    for protocol in (StageLike, Stateful, NumberedStream, PerEnvStream):
        assert isinstance(clip, protocol), protocol.__name__
    assert [type(s).__name__ for s in ptl_rl.pipeline_stages(sampler)] == [
        "ExperienceSource",
        "ClipRewards",
        "NStepTransform",
        "ReplayBuffer",
        "BatchSampler",
    ]
    assert ptl_rl.find_stage(sampler, ClipRewards) is clip
    assert "<- ClipRewards <- ExperienceSource(" in repr(sampler)
    assert "1:ClipRewards" in ptl_rl.pipeline_state_dict(sampler)["stages"]


def test_the_user_stage_trains_through_the_adapter_and_resumes_with_its_state(L, tmp_path):
    net, clip, sampler = build_pipeline(seed=0)
    module = module_class(L)(net)
    checkpoints = L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    fit = trainer(
        L, max_epochs=1, enable_checkpointing=True, callbacks=[ptl_rl.PipelineCheckpoint(sampler), checkpoints]
    )
    fit.fit(module, train_dataloaders=ptl_rl.to_dataloader(sampler, steps_per_epoch=10))

    # what reached training_step was clipped before the n-step sums: 0.5, or 0.5 + 0.9 * 0.5 for two steps
    # (unclipped CartPole data would hold 1.0 and 1.9)
    rewards = torch.cat(module.rewards).numpy()
    assert len(module.rewards) == 10
    clipped_sums = np.isclose(rewards[:, None], [LIMIT, LIMIT * (1 + GAMMA)]).any(axis=1)
    assert clipped_sums.all() and np.isclose(rewards, LIMIT * (1 + GAMMA)).any()
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    assert clip.clipped == source.total_steps > 0  # every reward of every env step was clipped, once

    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)[ptl_rl.CHECKPOINT_KEY]["ranks"][0]["stages"]
    assert saved["1:ClipRewards"] == {"clipped": clip.clipped, "state_version": ClipRewards.STATE_VERSION}

    net2, clip2, sampler2 = build_pipeline(seed=1)
    at_start: dict[str, int] = {}

    class Probe(L.Callback):
        def on_train_start(self, trainer, pl_module):
            at_start["clipped"] = clip2.clipped

    resumed = trainer(L, max_epochs=2, callbacks=[ptl_rl.PipelineCheckpoint(sampler2), Probe()])
    loader2 = ptl_rl.to_dataloader(sampler2, steps_per_epoch=10)
    resumed.fit(module_class(L)(net2), train_dataloaders=loader2, ckpt_path=tmp_path / "last.ckpt")
    assert at_start["clipped"] == clip.clipped  # restored before training went on
    source2 = ptl_rl.find_stage(sampler2, ptl_rl.ExperienceSource)
    assert clip2.clipped == source2.total_steps > clip.clipped  # and still in step with the restored source

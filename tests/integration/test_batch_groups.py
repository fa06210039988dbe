"""``to_dataloader(batches_per_step=K)``: K gradient steps per Lightning step, with both Lightning packages.

The reference is a plain PyTorch loop over the same pipeline: pull a batch,
take a gradient step, repeat. A grouped Lightning run pulls each batch of a
group only after the previous gradient step, so it must reproduce that loop
exactly, weights and every batch, even with an agent that acts with the
weights being trained (Lightning's one-batch prefetch would not).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ptl_rl


def build(seed: int = 0, batch_size: int = 8, as_tuple: bool = False):
    """A DQN pipeline whose agent acts greedily with ``net``: the data depends on the weights being trained."""
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    agent = ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector())
    source = ptl_rl.ExperienceSource(env, agent, seed=seed)
    buffer = ptl_rl.ReplayBuffer(source, 500, warmup=16, transitions_per_yield=2, seed=seed)
    return net, ptl_rl.BatchSampler(buffer, batch_size)


def loss_of(net: nn.Module, batch: ptl_rl.TorchBatch) -> torch.Tensor:
    q = net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
    return F.mse_loss(q, batch.reward)


def plain_loop(steps: int) -> tuple[list[np.ndarray], nn.Module]:
    net, sampler = build()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    seen = []
    for _ in range(steps):
        batch = next(sampler)
        seen.append(batch.obs.numpy().copy())
        optimizer.zero_grad()
        loss_of(net, batch).backward()
        optimizer.step()
    return seen, net


def grouped_module_class(L):  # noqa: N803
    class Grouped(L.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net
            self.automatic_optimization = False
            self.seen: list[np.ndarray] = []
            self.group_sizes: list[int] = []

        def training_step(self, group, batch_idx):
            assert isinstance(group, ptl_rl.BatchGroup)
            optimizer = self.optimizers()
            for batch in group.batches():
                if isinstance(batch, tuple):  # as_tuple=("obs", "action", "reward")
                    batch = ptl_rl.TorchBatch(obs=batch[0], action=batch[1], reward=batch[2])
                self.seen.append(batch.obs.numpy().copy())
                optimizer.zero_grad()
                self.manual_backward(loss_of(self.net, batch))
                optimizer.step()
            self.group_sizes.append(group.taken)
            self.log("groups", float(batch_idx), on_step=True, on_epoch=False)

        def configure_optimizers(self):
            return torch.optim.SGD(self.net.parameters(), lr=0.1)

    return Grouped


def fit(L, module, loader, **limits):  # noqa: N803
    """A quiet CPU ``Trainer(**limits)`` fitted on ``loader``; returns it."""
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu",
            default_root_dir=root,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            **limits,
        )
        trainer.fit(module, train_dataloaders=loader)
    return trainer


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_grouped_lightning_run_reproduces_the_plain_loop_batch_for_batch(L, group_size):  # noqa: N803
    steps = 12
    reference_seen, reference_net = plain_loop(steps)
    net, sampler = build()
    module = grouped_module_class(L)(net)
    trainer = fit(L, module, ptl_rl.to_dataloader(sampler, batches_per_step=group_size), max_steps=steps)
    assert trainer.global_step == steps  # one optimizer step per batch
    assert module.group_sizes == [group_size] * (steps // group_size)
    assert len(module.seen) == steps
    for ours, reference in zip(module.seen, reference_seen, strict=True):
        np.testing.assert_array_equal(ours, reference)
    for ours, reference in zip(net.parameters(), reference_net.parameters(), strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0)


def test_one_batch_per_step_hands_over_plain_batches_as_before():
    """``batches_per_step=1`` (the default) keeps the loader's items unchanged: batches, not groups."""
    _, sampler = build()
    first = next(iter(ptl_rl.to_dataloader(sampler, batches_per_step=1)))
    assert isinstance(first, ptl_rl.TorchBatch) and first.obs.shape == (8, 4)


def test_grouped_tuples_and_epochs_count_groups(L):  # noqa: N803
    net, sampler = build()
    module = grouped_module_class(L)(net)
    loader = ptl_rl.to_dataloader(sampler, steps_per_epoch=2, as_tuple=("obs", "action", "reward"), batches_per_step=3)
    assert len(loader) == 2
    trainer = fit(L, module, loader, max_epochs=2)
    assert module.group_sizes == [3, 3, 3, 3] and trainer.global_step == 12


def test_a_group_is_not_iterable_so_lightning_never_pulls_from_it():
    """Lightning's batch-size inference iterates iterable batches; a group must not be one (it would pull data)."""
    _, sampler = build()
    group = next(iter(ptl_rl.to_dataloader(sampler, batches_per_step=2)))
    assert not isinstance(group, Iterable) and group.taken == 0
    assert group.to("cpu") is group
    batches = list(group.batches())
    assert len(batches) == 2 and group.taken == 2 and list(group.batches()) == []


def test_a_group_ends_with_the_pipeline():
    batches = iter([ptl_rl.TorchBatch(reward=torch.zeros(2)) for _ in range(5)])
    group = ptl_rl.BatchGroup(lambda: next(batches), 3)
    assert len(list(group.batches())) == 3
    rest = ptl_rl.BatchGroup(lambda: next(batches), 3)
    assert len(list(rest.batches())) == 2 and rest.taken == 2


def test_looping_over_a_group_itself_names_group_batches_and_pulls_nothing():
    pulled = []
    group = ptl_rl.BatchGroup(lambda: pulled.append(1) or ptl_rl.TorchBatch(reward=torch.zeros(2)), 3)
    for misuse in (lambda: [b for b in group], lambda: len(group), lambda: group[0]):
        with pytest.raises(TypeError, match=r"group\.batches\(\)"):
            misuse()
    assert not isinstance(group, Iterable)  # Lightning's batch-size inference must not iterate it
    assert group and pulled == [] and group.taken == 0


def test_an_interrupted_pull_takes_nothing():
    calls = iter([KeyboardInterrupt, ptl_rl.TorchBatch(reward=torch.ones(1))])

    def take():
        item = next(calls)
        if item is KeyboardInterrupt:
            raise KeyboardInterrupt
        return item

    group = ptl_rl.BatchGroup(take, 1)
    pulls = group.batches()
    with pytest.raises(KeyboardInterrupt):
        next(pulls)
    assert group.taken == 0
    assert next(pulls).reward.item() == 1.0 and group.taken == 1


def test_bad_group_sizes_are_refused_with_the_fix():
    _, sampler = build()
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="batches_per_step must be an integer >= 1"):
            ptl_rl.to_dataloader(sampler, batches_per_step=bad)
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    agent = ptl_rl.ActorCriticAgent(nn.Linear(4, 2), nn.Linear(4, 1), env.single_action_space, seed=0)
    source = ptl_rl.ExperienceSource(env, agent, gamma=0.99, seed=0)
    rollout = ptl_rl.RolloutBuffer(source, steps_per_env=8, epochs=2, num_minibatches=2, seed=0)  # 4 per rollout
    assert len(ptl_rl.to_dataloader(rollout, batches_per_step=2)) == 2
    with pytest.raises(ValueError, match="does not divide the 4 batches of a rollout"):
        ptl_rl.to_dataloader(rollout, batches_per_step=3)

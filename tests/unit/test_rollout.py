"""RolloutBuffer as a stage: minibatch epochs, collection timing, normalization, state, Lightning."""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch import nn

import ptl_rl


def cartpole(num_envs: int = 3, mode: str = "NextStep") -> gym.vector.VectorEnv:
    return gym.make_vec(
        "CartPole-v1", num_envs=num_envs, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}
    )


def actor_critic(env: gym.vector.VectorEnv, seed: int = 0) -> ptl_rl.ActorCriticAgent:
    torch.manual_seed(seed)
    obs_dim = env.single_observation_space.shape[0]
    actor = nn.Sequential(nn.Linear(obs_dim, 16), nn.Tanh(), ptl_rl.action_head(env.single_action_space, 16))
    return ptl_rl.ActorCriticAgent(actor, nn.Linear(obs_dim, 1), env.single_action_space, seed=seed)


class CountingSource:
    """Wraps a source and counts the env steps it was asked for (to see when collection happens)."""

    def __init__(self, source: ptl_rl.ExperienceSource) -> None:
        self.upstream = source
        self.num_envs = source.num_envs
        self.pulls = 0

    def __iter__(self) -> CountingSource:
        return self

    def __next__(self) -> ptl_rl.TransitionBatch:
        self.pulls += 1
        return next(self.upstream)


def row_ids(batch: ptl_rl.TorchBatch) -> list[tuple]:
    """A row's identity: its env and its exact observation (CartPole states do not repeat)."""
    return [(int(e), *o.tolist()) for e, o in zip(batch.env_id, batch.obs, strict=True)]


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize(("epochs", "num_minibatches"), [(1, 1), (3, 4), (2, 7)])
def test_each_transition_once_per_epoch_and_collection_after_k_epochs(mode, epochs, num_minibatches):
    env = cartpole(3, mode)
    counting = CountingSource(ptl_rl.ExperienceSource(env, actor_critic(env), seed=1))
    rollout = ptl_rl.RolloutBuffer(counting, 16, epochs=epochs, num_minibatches=num_minibatches, seed=0)
    assert rollout.batches_per_rollout == epochs * num_minibatches
    for k in range(3):
        first = next(rollout)
        assert rollout.rollouts_collected == k + 1
        pulls = counting.pulls
        batches = [first] + [next(rollout) for _ in range(rollout.batches_per_rollout - 1)]
        assert counting.pulls == pulls, "collected while minibatches of the current rollout were pending"
        assert rollout.rollouts_collected == k + 1
        size = len(rollout.rollout)
        all_rows = sorted(row_ids(rollout.rollout.to_torch()))
        assert size >= 3 * 16
        for epoch in range(epochs):
            part = batches[epoch * num_minibatches : (epoch + 1) * num_minibatches]
            sizes = [len(b) for b in part]
            assert max(sizes) - min(sizes) <= 1
            assert sorted(r for b in part for r in row_ids(b)) == all_rows  # exactly once per epoch
    next(rollout)
    assert rollout.rollouts_collected == 4


def test_epochs_are_shuffled_differently():
    env = cartpole(2)
    source = ptl_rl.ExperienceSource(env, actor_critic(env), seed=0)
    rollout = ptl_rl.RolloutBuffer(source, 32, epochs=2, num_minibatches=1, seed=0)
    first, second = next(rollout), next(rollout)
    assert row_ids(first) != row_ids(second) and sorted(row_ids(first)) == sorted(row_ids(second))


def test_minibatch_fields_dtypes_and_shapes():
    env = cartpole(2)
    rollout = ptl_rl.RolloutBuffer(ptl_rl.ExperienceSource(env, actor_critic(env), seed=0), 8, num_minibatches=2)
    batch = next(rollout)
    assert isinstance(batch, ptl_rl.TorchBatch)
    expected = set(ptl_rl.CORE_FIELDS) | {"log_prob", "value", "advantage", "returns"}
    assert set(batch.keys()) == expected
    b = len(batch)
    for name in ("reward", "discount", "log_prob", "value", "advantage", "returns"):
        assert batch[name].dtype == torch.float32 and batch[name].shape == (b,), name
    assert batch.obs.shape == (b, 4) and batch.action.dtype == torch.int64
    assert batch.terminated.dtype == torch.bool and batch.env_id.dtype == torch.int64
    # returns - advantage is the behaviour value (per-minibatch normalization only touches advantage)
    raw = rollout.rollout
    np.testing.assert_allclose(raw["returns"] - raw["advantage"], raw["value"], atol=1e-5)


@pytest.mark.parametrize("normalize", ["minibatch", "rollout", None])
def test_advantage_normalization(normalize):
    env = cartpole(2)
    source = ptl_rl.ExperienceSource(env, actor_critic(env), seed=0)
    rollout = ptl_rl.RolloutBuffer(source, 64, epochs=1, num_minibatches=4, normalize_advantage=normalize, seed=0)
    batches = [next(rollout) for _ in range(4)]
    advantage = torch.cat([b.advantage for b in batches])
    raw = rollout.rollout["advantage"]
    if normalize == "minibatch":
        for b in batches:
            assert abs(b.advantage.mean().item()) < 1e-5
            assert b.advantage.std(correction=0).item() == pytest.approx(1, abs=1e-4)
    elif normalize == "rollout":
        assert abs(raw.mean()) < 1e-5 and raw.std() == pytest.approx(1, abs=1e-4)
        assert abs(advantage.mean().item()) < 1e-5
    else:
        assert raw.std() > 1.5  # CartPole returns are far from standardized
    if normalize != "minibatch":  # the minibatches then serve the rollout's advantages unchanged
        np.testing.assert_allclose(np.sort(advantage.numpy()), np.sort(raw), atol=1e-5)


def test_add_accepts_several_rows_per_env_in_one_batch():
    """Standalone use: rows of one env in one batch are appended in order."""
    env = cartpole(2, "SameStep")
    source = ptl_rl.ExperienceSource(env, actor_critic(env), seed=0)
    steps = [next(source) for _ in range(6)]
    agent = source.agent
    one_by_one = ptl_rl.RolloutBuffer(None, 6, num_envs=2, value_fn=agent.value)
    for b in steps:
        one_by_one.add(b)
    together = ptl_rl.RolloutBuffer(None, 6, num_envs=2, value_fn=agent.value)
    together.add(ptl_rl.TransitionBatch.concat(steps[:3]))
    together.add(ptl_rl.TransitionBatch.concat(steps[3:]))
    a, b = one_by_one.finish(), together.finish()
    for name in ("obs", "advantage", "returns", "env_id"):
        np.testing.assert_array_equal(a[name], b[name])


def test_overflowing_capacity_raises():
    env = cartpole(2, "SameStep")
    source = ptl_rl.ExperienceSource(env, actor_critic(env), seed=0)
    buffer = ptl_rl.RolloutBuffer(None, 2, num_envs=2, capacity_per_env=2)
    buffer.add(next(source))
    buffer.add(next(source))
    with pytest.raises(RuntimeError, match="capacity_per_env"):
        buffer.add(next(source))


def test_missing_critic_is_explained():
    env = cartpole(2)
    policy = ptl_rl.StochasticPolicyAgent(actor_critic(env).actor, env.single_action_space, seed=0)
    source = ptl_rl.ExperienceSource(env, policy, seed=0)
    with pytest.raises(ValueError, match="ActorCriticAgent.*value_fn"):  # at construction, not after a rollout
        ptl_rl.RolloutBuffer(source, 4)
    assert source.total_steps == 0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="num_envs"):
        ptl_rl.RolloutBuffer(None, 4)
    with pytest.raises(ValueError, match="num_minibatches"):
        ptl_rl.RolloutBuffer(None, 2, num_envs=2, num_minibatches=5)
    with pytest.raises(ValueError, match="normalize_advantage"):
        ptl_rl.RolloutBuffer(None, 2, num_envs=2, normalize_advantage="batch")


def test_state_dict_roundtrip_restarts_collection():
    env = cartpole(2)
    source = ptl_rl.ExperienceSource(env, actor_critic(env), seed=0)
    rollout = ptl_rl.RolloutBuffer(source, 8, epochs=2, num_minibatches=2, seed=3)
    next(rollout)
    buf = io.BytesIO()
    torch.save(ptl_rl.pipeline_state_dict(rollout), buf)  # what PipelineCheckpoint writes for this rank
    buf.seek(0)
    ptl_rl.load_pipeline_state_dict(rollout, torch.load(buf, weights_only=True))
    assert rollout.rollouts_collected == 1
    next(rollout)  # the half-served rollout was dropped with the source's episodes: collect afresh
    assert rollout.rollouts_collected == 2


class VersionedAgent:
    """Wraps an agent and records, per step, how many optimizer updates the weights have seen."""

    def __init__(self, agent: ptl_rl.ActorCriticAgent) -> None:
        self.agent, self.version = agent, 0

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.agent.value(obs)

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, dict]:
        action, extras = self.agent(obs)
        extras["version"] = np.full(len(action), self.version, dtype=np.int64)
        return action, extras


class VersionCheck(pl.LightningModule):
    """Trains the critic a little and asserts that every batch was collected after the previous rollout's updates."""

    def __init__(self, agent: VersionedAgent, batches_per_rollout: int) -> None:
        super().__init__()
        self.versioned = agent
        self.critic = agent.agent.critic
        self.actor = agent.agent.actor
        self.batches_per_rollout = batches_per_rollout
        self.seen: list[int] = []

    def training_step(self, batch: ptl_rl.TorchBatch, batch_idx: int) -> torch.Tensor:
        expected = self.global_step // self.batches_per_rollout * self.batches_per_rollout
        versions = batch.version.unique().tolist()
        assert versions == [expected], (versions, expected)
        self.seen.append(len(batch))
        return ((self.versioned.agent.critic_value(batch.obs) - batch.returns) ** 2).mean()

    def on_train_batch_end(self, *args: object) -> None:
        self.versioned.version = self.global_step  # the agent acts with the weights after this many updates

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


@pytest.mark.parametrize("rollouts_per_epoch", [1, 2])
def test_lightning_collects_only_after_the_last_update_of_a_rollout(rollouts_per_epoch):
    env = cartpole(2)
    agent = VersionedAgent(actor_critic(env))
    source = ptl_rl.ExperienceSource(env, agent, seed=0)
    rollout = ptl_rl.RolloutBuffer(source, 16, epochs=2, num_minibatches=3, seed=0)
    module = VersionCheck(agent, rollout.batches_per_rollout)
    loader = ptl_rl.to_dataloader(rollout, steps_per_epoch=rollouts_per_epoch * rollout.batches_per_rollout)
    trainer = pl.Trainer(
        max_epochs=6 // rollouts_per_epoch,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=loader)
    assert rollout.rollouts_collected == 6
    assert trainer.global_step == 6 * rollout.batches_per_rollout


def test_to_dataloader_gives_an_on_policy_stage_one_epoch_per_rollout():
    env = cartpole(2)
    rollout = ptl_rl.RolloutBuffer(
        ptl_rl.ExperienceSource(env, actor_critic(env), seed=0), 8, epochs=3, num_minibatches=2
    )
    assert len(ptl_rl.to_dataloader(rollout)) == rollout.batches_per_rollout == 6
    assert len(ptl_rl.to_dataloader(rollout, steps_per_epoch=12)) == 12

"""The Lightning side as an existing project uses it, with both Lightning packages.

Every test that builds a Trainer runs twice: with ``pytorch_lightning`` and
with ``lightning.pytorch`` (``import lightning as L``). The module under test
is written the way Lightning users write them: ``self.log(..., on_epoch=True)``,
``ModelCheckpoint``, ``EarlyStopping``, ``trainer.validate``.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ptl_rl


def build_pipeline(seed: int = 0, batch_size: int = 16, prioritized: bool = False, epsilon=0.5):
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    agent = ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(epsilon, seed=seed))
    source = ptl_rl.ExperienceSource(env, agent, seed=seed)
    nstep = ptl_rl.NStepTransform(source, n=2, gamma=0.9)
    kind = ptl_rl.PrioritizedReplayBuffer if prioritized else ptl_rl.ReplayBuffer
    buffer = kind(nstep, 500, warmup=32, transitions_per_yield=2, seed=seed)
    return net, ptl_rl.BatchSampler(buffer, batch_size)


def q_module_class(L):  # noqa: N803
    class QModule(ptl_rl.EvaluationMixin, L.LightningModule):
        """A plain LightningModule: nothing ptl_rl-specific beyond reading batch fields."""

        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net
            self.seen: list = []

        def training_step(self, batch, batch_idx):
            self.seen.append(batch)
            q = self.net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
            with torch.no_grad():
                bootstrap = self.net(batch.next_obs).max(1).values
            target = batch.reward + batch.discount * (~batch.terminated).to(q.dtype) * bootstrap
            loss = F.smooth_l1_loss(q, target.to(q.dtype))
            self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
            if "weights" in batch:
                batch.update_priorities(q - target)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return QModule


def trainer(L, **kwargs):  # noqa: N803
    defaults = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**defaults, **kwargs})


# ---------------------------------------------------------------------------- the adapter
def test_fit_through_the_adapter_with_epoch_logging(L) -> None:
    net, sampler = build_pipeline()
    module = q_module_class(L)(net)
    before = [p.detach().clone() for p in net.parameters()]
    loader = ptl_rl.to_dataloader(sampler, steps_per_epoch=25)
    assert loader.batch_size is None and loader.num_workers == 0
    fit = trainer(L, max_epochs=1)
    fit.fit(module, train_dataloaders=loader)
    assert len(module.seen) == 25
    batch = module.seen[0]
    assert isinstance(batch, ptl_rl.TorchBatch)
    assert batch.obs.shape == (16, 4) and batch.obs.dtype == torch.float32
    assert batch.terminated.dtype == torch.bool
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert "train/loss_epoch" in fit.callback_metrics  # on_epoch=True needs the batch size, inferred from the batch
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    # warm-up of 32, then 2 transitions per batch (Lightning prefetches one batch)
    assert 32 + 2 * 25 <= source.total_steps <= 32 + 2 * 27 + 2


def test_steps_per_epoch_gives_lightning_epochs_that_continue_the_same_pipeline(L) -> None:
    net, sampler = build_pipeline()
    loader = ptl_rl.to_dataloader(sampler, steps_per_epoch=10)
    assert len(loader) == 10
    fit = trainer(L, max_epochs=3)
    fit.fit(q_module_class(L)(net), train_dataloaders=loader)
    assert fit.current_epoch == 3 and fit.global_step == 30
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    assert source._reset_count == 1  # one continuous stream: the environments were not reset between epochs
    assert len(ptl_rl.find_stage(sampler, ptl_rl.ReplayBuffer)) >= 32 + 2 * 29


@pytest.mark.parametrize("steps_per_epoch", [None, 6])
def test_a_loader_iterator_goes_on_after_an_interrupt_inside_next(steps_per_epoch) -> None:
    # a notebook interrupt inside next(it) must not end the epoch: later next(it) calls go on, and an
    # interrupted call does not count as one of the epoch's batches
    net, sampler = build_pipeline()
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    env_step = source._env.step
    calls = {"n": 0, "at": -1}  # armed after the first batch: the next env step raises

    def interrupted_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            raise KeyboardInterrupt
        return env_step(*args, **kwargs)

    source._env.step = interrupted_once
    loader = ptl_rl.to_dataloader(sampler, steps_per_epoch=steps_per_epoch)
    it = iter(loader)
    got, interrupts = 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no Trainer stops this endless loader: the warning is expected)
        while got < 12 and interrupts < 2:
            try:
                batch = next(it)
            except KeyboardInterrupt:
                interrupts += 1
                continue
            except StopIteration:
                break
            assert batch.obs.shape == (16, 4)
            got += 1
            if got == 1:
                calls["at"] = calls["n"] + 1
    assert interrupts == 1
    assert got == (12 if steps_per_epoch is None else steps_per_epoch)


def test_the_batch_is_a_collection_lightning_knows() -> None:
    from lightning_utilities.core.apply_func import apply_to_collection
    from pytorch_lightning.utilities.data import extract_batch_size

    _, sampler = build_pipeline(prioritized=True)
    batch = next(sampler)
    assert extract_batch_size(batch) == 16
    assert list(batch) == list(batch.keys()) and dict(batch)["obs"] is batch.obs
    # what precision="bf16-true" does to a batch: float tensors converted, the mapping rebuilt
    converted = apply_to_collection(batch, torch.Tensor, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)
    assert isinstance(converted, ptl_rl.TorchBatch)
    assert converted.obs.dtype == torch.bfloat16 and converted.action.dtype == torch.int64
    buffer = ptl_rl.find_stage(sampler, ptl_rl.PrioritizedReplayBuffer)
    before = buffer.draws.applied_updates
    converted.update_priorities(torch.ones(16, dtype=torch.bfloat16))  # the link survives the rebuild
    assert buffer.draws.applied_updates == before + 16


def test_tuples_for_modules_that_unpack_them(L) -> None:
    net, sampler = build_pipeline()
    seen = []

    class BoltsStyleDQN(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            states, actions, rewards, dones, next_states = batch
            seen.append((states, actions, rewards, dones, next_states))
            q = self.net(states).gather(1, actions[:, None]).squeeze(1)
            target = rewards + 0.9 * (~dones).float() * self.net(next_states).max(1).values.detach()
            return F.mse_loss(q, target)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    loader = ptl_rl.to_dataloader(sampler, steps_per_epoch=5, as_tuple=ptl_rl.BOLTS_FIELDS)
    trainer(L, max_epochs=1).fit(BoltsStyleDQN(), train_dataloaders=loader)
    states, actions, rewards, dones, next_states = seen[0]
    assert states.shape == next_states.shape == (16, 4) and dones.dtype == torch.bool and len(seen) == 5


def test_to_dataloader_refuses_stages_that_do_not_yield_torch_batches() -> None:
    _, sampler = build_pipeline()
    with pytest.raises(TypeError, match=r"BatchSampler\(buffer"):
        ptl_rl.to_dataloader(sampler.upstream)
    with pytest.raises(TypeError, match="numpy TransitionBatches"):
        ptl_rl.to_dataloader(sampler.upstream.upstream)
    # a stage unknown by type (a user's generator, a dataset reader) is caught at its first batch
    loader = ptl_rl.to_dataloader((batch for batch in sampler.upstream.upstream), steps_per_epoch=2)
    with pytest.raises(TypeError, match=r"ReplayBuffer\(stage"):
        next(iter(loader))


def test_an_endless_loader_without_a_stop_condition_warns(L) -> None:
    net, sampler = build_pipeline()
    data = ptl_rl.RLDataModule(sampler, steps_per_epoch=None)
    with pytest.warns(UserWarning, match="will not stop by itself"):
        data.trainer = trainer(L, max_epochs=1)
        data.setup("fit")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Trainer with max_steps: nothing to warn about
        data2 = ptl_rl.RLDataModule(build_pipeline()[1], steps_per_epoch=None)
        data2.trainer = trainer(L, max_steps=5)
        data2.setup("fit")
    with pytest.warns(UserWarning, match="no length"):  # the bare adapter cannot see the Trainer: it says so once
        next(iter(ptl_rl.to_dataloader(sampler)))
    net3, sampler3 = build_pipeline()
    with warnings.catch_warnings():  # a ptl_rl callback saw the Trainer's max_steps: no warning from the adapter
        warnings.filterwarnings("error", message=".*no length")
        trainer(L, max_steps=3, callbacks=[ptl_rl.EpisodeStatsLogger(sampler3)]).fit(
            q_module_class(L)(net3), train_dataloaders=ptl_rl.to_dataloader(sampler3)
        )


# ---------------------------------------------------------------------------- checkpoints
def pipeline_snapshot(sampler) -> dict:
    """Everything a resume must bring back, copied out of a live pipeline."""
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    buffer = ptl_rl.find_stage(sampler, ptl_rl.ReplayBuffer)
    nstep = ptl_rl.find_stage(sampler, ptl_rl.NStepTransform)
    selector = source.agent.selector
    return {
        "total_steps": source.total_steps,
        "episodes": source.episodes_finished,
        "epsilon": selector.epsilon,
        "selector_rng": selector.rng.bit_generator.state,
        "buffer_rng": buffer.rng.bit_generator.state,
        "size": len(buffer),
        "obs": None if buffer.storage.fields is None else buffer.storage.fields["obs"][: len(buffer)].copy(),
        "windows": nstep.windows._length.copy(),
    }


def schedule_agent_pipeline(seed: int):
    epsilon = ptl_rl.LinearSchedule(1.0, 0.05, 1_000)
    return build_pipeline(seed=seed, epsilon=epsilon)


class StateAtStart:
    """Records the pipeline right after a resume, before the first new batch is collected."""

    def __init__(self, L, sampler):  # noqa: N803
        class Probe(L.Callback):
            def on_fit_start(probe, trainer, pl_module):  # noqa: N805 - after a restore, before any fetch
                self.snapshot = pipeline_snapshot(sampler)

        self.callback = Probe()
        self.snapshot: dict | None = None


@pytest.mark.parametrize("route", ["datamodule", "loader"])
def test_resume_brings_back_replay_windows_rng_epsilon_and_callback_state(L, route, tmp_path) -> None:
    net, sampler = schedule_agent_pipeline(seed=3)
    eval_env = gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="sync")
    greedy = lambda m: ptl_rl.DQNAgent(m.net, ptl_rl.ArgmaxSelector())  # noqa: E731
    evaluation = ptl_rl.PeriodicEvaluation(sampler, eval_env, greedy, every_env_steps=30, episodes=1, seed=0)
    checkpoints = L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    callbacks = [evaluation, checkpoints]
    if route == "datamodule":
        data = {"datamodule": ptl_rl.RLDataModule(sampler, steps_per_epoch=15)}
    else:
        callbacks.append(ptl_rl.PipelineCheckpoint(sampler))
        data = {"train_dataloaders": ptl_rl.to_dataloader(sampler, steps_per_epoch=15)}
    fit = trainer(L, max_epochs=2, enable_checkpointing=True, callbacks=callbacks)
    fit.fit(q_module_class(L)(net), **data)
    saved = pipeline_snapshot(sampler)
    assert 0.05 < saved["epsilon"] < 1.0 and saved["windows"].any()
    saved_history = list(evaluation.history)
    assert saved_history

    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)  # tensors and plain containers only
    assert checkpoint[ptl_rl.CHECKPOINT_KEY]["world_size"] == 1

    net2, sampler2 = schedule_agent_pipeline(seed=4)
    evaluation2 = ptl_rl.PeriodicEvaluation(sampler2, eval_env, greedy, every_env_steps=30, episodes=1, seed=0)
    probe = StateAtStart(L, sampler2)
    callbacks2 = [evaluation2, probe.callback]
    if route == "datamodule":
        data2 = {"datamodule": ptl_rl.RLDataModule(sampler2, steps_per_epoch=15)}
    else:
        callbacks2.append(ptl_rl.PipelineCheckpoint(sampler2))
        data2 = {"train_dataloaders": ptl_rl.to_dataloader(sampler2, steps_per_epoch=15)}
    resumed = trainer(L, max_epochs=3, callbacks=callbacks2)
    resumed.fit(q_module_class(L)(net2), **data2, ckpt_path=tmp_path / "last.ckpt")

    restored = probe.snapshot
    np.testing.assert_array_equal(restored.pop("obs"), saved.pop("obs"))
    np.testing.assert_array_equal(restored.pop("windows"), saved.pop("windows"))
    assert restored == saved  # counters, epsilon where it was (not back at 1.0), both RNG states
    assert evaluation2.history[: len(saved_history)] == saved_history  # history kept, rhythm kept:
    assert all(steps >= saved["total_steps"] for steps, _ in evaluation2.history[len(saved_history) :])
    assert resumed.global_step == 45


def test_weights_only_checkpoints_hold_no_replay(L, tmp_path) -> None:
    net, sampler = build_pipeline()
    weights = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "w", save_weights_only=True, save_last=True)
    data = ptl_rl.RLDataModule(sampler, steps_per_epoch=10)
    trainer(L, max_epochs=1, enable_checkpointing=True, callbacks=[weights]).fit(
        q_module_class(L)(net), datamodule=data
    )
    checkpoint = torch.load(tmp_path / "w" / "last.ckpt", weights_only=True)
    assert ptl_rl.CHECKPOINT_KEY not in checkpoint
    assert not any(isinstance(v, dict) and "pipeline" in v for v in checkpoint.values())


def test_the_replay_can_be_kept_out_of_checkpoints(L, tmp_path) -> None:
    net, sampler = build_pipeline()
    data = ptl_rl.RLDataModule(sampler, steps_per_epoch=10, include_replay=False)
    fit = trainer(L, max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    fit.fit(q_module_class(L)(net), datamodule=data)
    fit.save_checkpoint(tmp_path / "small.ckpt")
    stages = torch.load(tmp_path / "small.ckpt", weights_only=True)[ptl_rl.CHECKPOINT_KEY]["ranks"][0]["stages"]
    assert set(stages) == {"0:ExperienceSource", "1:NStepTransform", "3:BatchSampler"}

    net2, sampler2 = build_pipeline(seed=1)
    probe = StateAtStart(L, sampler2)
    data2 = ptl_rl.RLDataModule(sampler2, steps_per_epoch=10, include_replay=False)
    trainer(L, max_epochs=2, callbacks=[probe.callback]).fit(
        q_module_class(L)(net2), datamodule=data2, ckpt_path=tmp_path / "small.ckpt"
    )
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    assert probe.snapshot["size"] == 0 and probe.snapshot["total_steps"] == source.total_steps


def test_a_subclass_restores_a_checkpoint_of_its_parent(L, tmp_path) -> None:
    class MyData(ptl_rl.RLDataModule):
        pass

    net, sampler = build_pipeline()
    fit = trainer(L, max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    fit.fit(q_module_class(L)(net), datamodule=ptl_rl.RLDataModule(sampler, steps_per_epoch=10))
    fit.save_checkpoint(tmp_path / "parent.ckpt")
    stored = len(ptl_rl.find_stage(sampler, ptl_rl.ReplayBuffer))

    net2, sampler2 = build_pipeline(seed=1)
    probe = StateAtStart(L, sampler2)
    trainer(L, max_epochs=2, callbacks=[probe.callback]).fit(
        q_module_class(L)(net2), datamodule=MyData(sampler2, steps_per_epoch=10), ckpt_path=tmp_path / "parent.ckpt"
    )
    assert probe.snapshot["size"] == stored


def test_the_bare_loader_warns_when_a_checkpoint_misses_the_pipeline(L, tmp_path) -> None:
    net, sampler = build_pipeline()
    fit = trainer(L, max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match="PipelineCheckpoint"):  # the checkpoint written at the epoch's end
        fit.fit(q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler, steps_per_epoch=5))


def test_pipeline_state_rejects_a_different_pipeline() -> None:
    _, sampler = build_pipeline()
    state = ptl_rl.pipeline_state_dict(sampler)
    buffer = ptl_rl.ReplayBuffer(None, 10, warmup=0)
    with pytest.raises(ValueError, match="build the same pipeline"):
        ptl_rl.load_pipeline_state_dict(buffer, state)


def test_saving_a_replay_does_not_copy_it() -> None:
    _, sampler = build_pipeline()
    for _ in range(5):
        next(sampler)
    buffer = ptl_rl.find_stage(sampler, ptl_rl.ReplayBuffer)
    saved = buffer.state_dict()["storage"]["fields"]["obs"]
    assert saved.data_ptr() == buffer.storage.fields["obs"].ctypes.data  # a view of the ring, no second copy
    assert len(saved) == len(buffer)


# ---------------------------------------------------------------------------- validation and logging
def test_validation_early_stopping_and_monitored_checkpoints_on_the_episode_return(L, tmp_path) -> None:
    net, sampler = build_pipeline()
    eval_env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    data = ptl_rl.RLDataModule(
        sampler,
        steps_per_epoch=None,
        eval_env=eval_env,
        eval_agent=ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector()),
        eval_episodes=2,
        eval_seed=0,
    )
    stop = L.callbacks.EarlyStopping(monitor="eval/return_mean", mode="max", patience=0, min_delta=1e9)
    best = L.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="eval/return_mean", mode="max")
    fit = trainer(
        L, max_steps=200, val_check_interval=10, num_sanity_val_steps=0, enable_checkpointing=True,
        callbacks=[stop, best],
    )  # fmt: skip
    module = q_module_class(L)(net)
    fit.fit(module, datamodule=data)
    # the first validation sets the best score, the second cannot beat it by 1e9: early stop after 2 validations
    assert fit.global_step == 20 and stop.stopped_epoch == 0 and fit.should_stop
    assert best.best_model_path and best.best_model_score is not None
    results = fit.validate(module, datamodule=data, verbose=False)
    assert results[0]["eval/return_mean"] >= 1.0


def test_every_episode_is_logged_against_env_steps(L, tmp_path) -> None:
    net, sampler = build_pipeline()
    logged: list[tuple[dict, int]] = []

    class Recorder(L.loggers.CSVLogger):
        def log_metrics(self, metrics, step=None):
            logged.append((dict(metrics), step))
            super().log_metrics(metrics, step)

    fit = trainer(
        L, max_steps=120, logger=Recorder(tmp_path), log_every_n_steps=50,
        callbacks=[ptl_rl.EpisodeStatsLogger(sampler, every_n_steps=50)],
    )  # fmt: skip
    fit.fit(q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler))
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    episodes = [(m["episode/return"], step) for m, step in logged if "episode/return" in m]
    finished = source.recent_episodes()
    assert len(episodes) >= source.episodes_finished - 1 > 10  # all of them, not 1 in 50 steps (the last may wait)
    assert episodes == [(e.ret, e.total_steps) for e in finished[: len(episodes)]]
    env_steps = [m["env_steps"] for m, _ in logged if "env_steps" in m]
    assert env_steps and all(isinstance(v, int) for v in env_steps)
    assert fit.callback_metrics["env_steps"] == env_steps[-1]  # without a bar too: what a monitor reads


def test_the_progress_bar_shows_env_steps_and_return(L, tmp_path) -> None:
    net, sampler = build_pipeline()
    fit = trainer(
        L, max_steps=120, enable_progress_bar=True, default_root_dir=tmp_path,
        callbacks=[ptl_rl.EpisodeStatsLogger(sampler, every_n_steps=50)],
    )  # fmt: skip
    fit.fit(q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler))
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    assert fit.progress_bar_metrics["env_steps"] <= source.total_steps
    assert "return" in fit.progress_bar_metrics


def test_env_step_limit_stops_training(L) -> None:
    net, sampler = build_pipeline()
    fit = trainer(L, max_steps=10_000, callbacks=[ptl_rl.EnvStepLimit(sampler, 100)])
    fit.fit(q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler))
    assert fit.global_step < 40


def test_periodic_evaluation_logs_and_stops_once_the_return_is_reached(L) -> None:
    net, sampler = build_pipeline()
    eval_env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    agents = []

    def make_agent(module):
        agents.append(ptl_rl.DQNAgent(module.net, ptl_rl.ArgmaxSelector()))
        return agents[-1]

    evaluation = ptl_rl.PeriodicEvaluation(
        sampler, eval_env, make_agent, every_env_steps=40, episodes=2, stop_at_return=1.0, seed=0
    )
    fit = trainer(L, max_steps=1_000, callbacks=[evaluation])
    module = q_module_class(L)(net)
    fit.fit(module, train_dataloaders=ptl_rl.to_dataloader(sampler))
    # any CartPole episode returns at least 1, so the first evaluation (after 40 env steps) stops training
    assert len(evaluation.history) == 1 and evaluation.solved_at == evaluation.history[0][0] >= 40
    assert evaluation.solved_after_s is not None and fit.global_step < 10
    assert agents[0].net is module.net  # evaluated with the module's current network
    assert fit.callback_metrics["eval/return_mean"].item() == evaluation.history[0][1]


def test_evaluation_every_n_env_steps_without_a_stop(L) -> None:
    net, sampler = build_pipeline()
    eval_env = gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="sync")
    evaluation = ptl_rl.PeriodicEvaluation(
        sampler, eval_env, lambda m: ptl_rl.DQNAgent(m.net, ptl_rl.ArgmaxSelector()), every_env_steps=20, episodes=1
    )
    trainer(L, max_steps=30, callbacks=[evaluation]).fit(
        q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler)
    )
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    grid = [steps // 20 for steps, _ in evaluation.history]
    # one evaluation per multiple of 20 env steps crossed (the first after the warm-up)
    assert grid == list(range(grid[0], source.total_steps // 20 + 1)) and len(grid) >= 3
    assert evaluation.solved_at is None


# ---------------------------------------------------------------------------- precision and dtypes
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_the_dqn_pipeline_trains_under_bf16(L, precision) -> None:
    net, sampler = build_pipeline(prioritized=True)
    module = q_module_class(L)(net)
    trainer(L, max_steps=20, precision=precision).fit(module, train_dataloaders=ptl_rl.to_dataloader(sampler))
    assert len(module.seen) == 20
    if precision == "bf16-true":
        assert next(net.parameters()).dtype == torch.bfloat16
        assert module.seen[-1].obs.dtype == torch.bfloat16  # the batch was converted like the module
    buffer = ptl_rl.find_stage(sampler, ptl_rl.PrioritizedReplayBuffer)
    assert buffer.draws.applied_updates == 20 * 16  # priorities flowed back under either precision
    # the agent acted with the bf16 network (observations cast to its dtype, bf16 outputs read back)
    agent = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource).agent
    actions = agent(np.zeros((2, 4), dtype=np.float32))
    assert actions.shape == (2,) and actions.dtype == np.int64


class Float64Env(gym.Env):
    """A classic-control-style env with float64 observations and float64 rewards."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3), {}

    def step(self, action):
        self.t += 1
        return self.np_random.uniform(-1, 1, 3), np.float64(0.5), False, self.t >= 5, {}


def test_an_agent_returning_bf16_tensors_works() -> None:
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    net = nn.Linear(4, 2).to(torch.bfloat16)

    def agent(obs):
        logits = net(torch.as_tensor(obs, dtype=torch.bfloat16))
        return logits.argmax(1), {"logits": logits}  # bf16 extras, as a bf16-true module would give

    batch = next(ptl_rl.ExperienceSource(env, agent, seed=0))
    assert batch.action.dtype == np.int64 and batch["logits"].dtype == np.float32


def test_float64_observations_become_float32_at_the_source_unless_asked_not_to() -> None:
    net = nn.Linear(3, 2)
    seen = []

    def agent(obs):
        seen.append(obs.dtype)
        return ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector())(obs)

    vec = gym.vector.SyncVectorEnv([Float64Env, Float64Env])
    batch = next(ptl_rl.ExperienceSource(vec, agent, seed=0))
    assert batch.obs.dtype == batch.next_obs.dtype == np.float32 and seen == [np.float32]
    assert batch.reward.dtype == np.float32
    kept = next(ptl_rl.ExperienceSource(gym.vector.SyncVectorEnv([Float64Env]), agent, seed=0, cast_float64=False))
    assert kept.obs.dtype == np.float64


def test_a_standalone_buffer_stores_the_contract_dtypes_whatever_it_sees_first() -> None:
    def batch(reward_dtype):
        return ptl_rl.TransitionBatch(
            obs=np.zeros((2, 3), np.float32),
            action=np.zeros(2, np.int64),
            reward=np.ones(2, reward_dtype),
            next_obs=np.zeros((2, 3), np.float32),
            terminated=np.zeros(2, bool),
            truncated=np.zeros(2, bool),
            discount=np.full(2, 0.9, np.float64),
            env_id=np.arange(2, dtype=np.int32),
        )

    buffer = ptl_rl.ReplayBuffer(None, 10, warmup=0)
    buffer.add(batch(np.float64))  # SyncVectorEnv's rewards, as a user might add them by hand
    buffer.add(batch(np.float32))  # then a source's batch
    assert buffer.storage.fields["reward"].dtype == buffer.storage.fields["discount"].dtype == np.float32
    assert buffer.storage.fields["env_id"].dtype == np.int64 and len(buffer) == 4
    with pytest.raises(ValueError, match="obs"):  # other fields still have to match exactly
        bad = batch(np.float32)
        bad["obs"] = bad.obs.astype(np.float64)
        buffer.add(bad)
    assert len(buffer) == 4


def test_a_datamodule_without_evaluation_gives_lightning_no_val_loader_to_warn_about(L) -> None:
    net, sampler = build_pipeline()

    class NoValidation(L.LightningModule):  # a module with no validation_step, as most RL modules are
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            return self.net(batch.obs).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = L.Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(NoValidation(), datamodule=ptl_rl.RLDataModule(sampler, steps_per_epoch=10))
    assert trainer.global_step == 5
    assert not [w for w in caught if "val_dataloader" in str(w.message)]


def test_a_subclass_keeps_its_own_val_dataloader_without_an_eval_env(L) -> None:
    net, sampler = build_pipeline()

    class WithValidation(ptl_rl.RLDataModule):
        def val_dataloader(self):
            return ptl_rl.to_dataloader(self.pipeline, steps_per_epoch=2)

    data = WithValidation(sampler, steps_per_epoch=10)
    assert callable(data.val_dataloader) and len(data.val_dataloader()) == 2
    assert ptl_rl.RLDataModule(sampler).val_dataloader is None

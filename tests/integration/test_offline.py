"""Minari datasets in and out of the pipeline: exact round trips against the scripted env's own record.

The scripted env records every step it takes (independently of ptl_rl), and
each observation ``[env, episode, step]`` names one point of one episode, so
rows can be matched one to one whatever order a stage yields them in.
Every dataset here is created locally under a temporary ``MINARI_DATASETS_PATH``.
"""

from __future__ import annotations

import collections
import functools
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from faults import InjectedFault, Injector
from nstep_reference import reference_nstep
from scripted_env import (
    BOTH,
    MODES,
    TERM,
    TRUNC,
    ScriptedAgent,
    ScriptedEnv,
    env_attr,
    ids_of,
    make_env,
    obs_code,
    scripted_batches,
)
from taps import Tap

import ptl_rl
from ptl_rl import (
    BatchSampler,
    ExperienceSource,
    MinariRecorder,
    MinariSource,
    NStepTransform,
    ReplayBuffer,
    TransitionBatch,
    minari_replay_buffer,
)
from ptl_rl.core import guard, stage
from ptl_rl.offline import reader as offline_reader
from ptl_rl.offline import recorder as offline_recorder
from ptl_rl.offline import source as offline_source

minari = pytest.importorskip("minari")

LAYOUTS = [
    [(3, TERM), (2, TRUNC), (4, BOTH), (1, TERM)],
    [(5, TRUNC), (1, TERM), (6, TERM)],
    [(2, TERM), (7, TRUNC)],
]


@pytest.fixture(autouse=True)
def datasets_path(tmp_path, monkeypatch):
    """Every dataset of a test lives in its own temporary directory; nothing is read from or written to ~/.minari."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    return tmp_path / "datasets"


class _Through:
    """Pull batches through the recorder while ``scripted_batches`` reads the source's ``rank``/``num_envs``."""

    def __init__(self, recorder: MinariRecorder, source: ExperienceSource) -> None:
        self.recorder, self.rank, self.num_envs = recorder, source.rank, source.num_envs

    def __next__(self) -> TransitionBatch:
        return next(self.recorder)


def record(layouts, mode, dataset_id="test/scripted-v0", *, dict_obs=False, extra=3, partial="truncate", seed=0):
    """Record a source over the script with a MinariRecorder stage; returns (dataset, the envs' own records)."""
    env = make_env(layouts, mode, dict_obs=dict_obs, reward_seed=seed)
    source = ExperienceSource(env, ScriptedAgent(len(layouts), seed=seed), seed=seed)
    recorder = MinariRecorder(source, dataset_id, partial_episodes=partial, flush_every=2)
    for _ in scripted_batches(_Through(recorder, source), layouts, extra):
        pass
    dataset = recorder.close()
    return dataset, env_attr(env, "record")


def expected_rows(records, partial):
    """The envs' own steps as the dataset should hold them: the episode still running at the end is truncated
    on its last recorded step (``"truncate"``) or absent (``"drop"``). Returned as (rows sorted by obs code, records
    with the cut applied)."""
    rows, cut_records = [], []
    for i, record in enumerate(records):
        ended_at = max((t for t, step in enumerate(record) if step[4] or step[5]), default=-1)
        steps = [list(step) for step in record]
        if partial == "drop":
            steps = steps[: ended_at + 1]
        elif steps and ended_at < len(steps) - 1:
            steps[-1][5] = True
        cut_records.append([tuple(step) for step in steps])
        rows += [(i, *step) for step in steps]
    rows.sort(key=lambda r: int(obs_code(r[1])))
    return rows, cut_records


def loaded_rows(source):
    """Every row ``source`` yields, sorted by obs code (unique per env, episode and step)."""
    got = TransitionBatch.concat(list(source))
    order = np.argsort(obs_code(ids_of(got["obs"])), kind="stable")
    return got.rows(order)


def assert_rows_equal(got: TransitionBatch, rows, dict_obs=False):
    """Field by field: obs, action, reward, next_obs (the real final observation), terminated, truncated."""
    env, obs, action, reward, next_obs, terminated, truncated = (np.array(x) for x in zip(*rows, strict=True))
    assert len(got) == len(rows)
    np.testing.assert_array_equal(ids_of(got["obs"]), obs)
    np.testing.assert_array_equal(got["action"], action)
    assert got["reward"].dtype == np.float32
    np.testing.assert_array_equal(got["reward"], reward.astype(np.float32))
    np.testing.assert_array_equal(ids_of(got["next_obs"]), next_obs)
    np.testing.assert_array_equal(got["terminated"], terminated.astype(bool))
    np.testing.assert_array_equal(got["truncated"], truncated.astype(bool))
    assert got["terminated"].dtype == bool and got["truncated"].dtype == bool and got["env_id"].dtype == np.int64
    if dict_obs:
        for key, ident in (("obs", obs), ("next_obs", next_obs)):
            pos = np.stack([ident[:, 1] * 0.5, ident[:, 2] * 0.25], 1).astype(np.float32)
            np.testing.assert_array_equal(got[key]["pos"], pos)


# ---------------------------------------------------------------------- round trip
@pytest.mark.parametrize("partial", ["truncate", "drop"])
@pytest.mark.parametrize("mode", MODES)
def test_round_trip_equals_env_record(mode, partial):
    layouts = LAYOUTS[:1] if mode == "single" else LAYOUTS
    dataset, records = record(layouts, mode, partial=partial)
    rows, _ = expected_rows(records, partial)
    assert dataset.total_steps == len(rows)
    assert dataset.total_episodes == sum(len(layout) for layout in layouts) + (
        len(layouts) if partial == "truncate" else 0
    )
    # Minari's own view: T + 1 observations per episode, the last one the final observation, never a reset one
    for episode in dataset.iterate_episodes():
        ident = ids_of(episode.observations)
        assert len(ident) == len(episode.rewards) + 1
        assert (ident[:, 0] == ident[0, 0]).all() and (ident[:, 1] == ident[0, 1]).all(), "episode spans a reset"
        np.testing.assert_array_equal(ident[:, 2], np.arange(len(ident)))
    got = loaded_rows(MinariSource("test/scripted-v0", lanes=2))
    assert_rows_equal(got, rows)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_round_trip_dict_observations(mode):
    dataset, records = record(LAYOUTS, mode, dict_obs=True)
    assert isinstance(dataset.observation_space, gym.spaces.Dict)
    rows, _ = expected_rows(records, "truncate")
    got = loaded_rows(MinariSource(dataset, lanes=3))
    assert_rows_equal(got, rows, dict_obs=True)


def test_loader_batches_look_like_a_vector_source():
    """One row per busy lane and batch; a lane's rows are consecutive steps; every episode read exactly once."""
    dataset, records = record(LAYOUTS, "NextStep")
    source = MinariSource(dataset, lanes=4, gamma=0.9, episode_id=True)
    assert source.one_row_per_env
    last_next = {}
    seen_episode_steps = {}
    for batch in source:
        assert len(np.unique(batch["env_id"])) == len(batch) <= 4
        np.testing.assert_array_equal(batch["discount"], np.float32(0.9))
        for lane, obs, nxt, done, ep in zip(
            batch["env_id"].tolist(),
            ids_of(batch["obs"]),
            ids_of(batch["next_obs"]),
            batch["terminated"] | batch["truncated"],
            batch["episode_id"].tolist(),
            strict=True,
        ):
            if lane in last_next:  # continues the lane's episode: obs is the previous next_obs
                np.testing.assert_array_equal(obs, last_next[lane])
            else:
                assert obs[2] == 0, "a lane starts an episode at its first step"
            seen_episode_steps[ep] = seen_episode_steps.get(ep, 0) + 1
            if done:
                last_next.pop(lane, None)
            else:
                last_next[lane] = nxt
    assert not last_next, "an episode was left unfinished"
    assert seen_episode_steps == {e.id: len(e.rewards) for e in dataset.iterate_episodes()}
    assert source.total_steps == dataset.total_steps and source.episodes_finished == dataset.total_episodes
    assert "MinariSource(test/scripted-v0 x4" in repr(source)


def test_epochs_shuffle_and_episode_indices():
    dataset, _ = record(LAYOUTS, "NextStep")
    once = loaded_rows(MinariSource(dataset, lanes=3))
    twice = list(MinariSource(dataset, lanes=3, epochs=2, shuffle=True, seed=1, episode_id=True))
    codes = obs_code(ids_of(TransitionBatch.concat(twice)["obs"]))
    assert len(codes) == 2 * len(once)
    np.testing.assert_array_equal(np.sort(codes)[::2], obs_code(ids_of(once["obs"])))
    first = MinariSource(dataset, lanes=1, episode_indices=[4, 2], episode_id=True)
    assert [int(b["episode_id"][0]) for b in first][:1] == [4]
    endless = MinariSource(dataset, lanes=2, epochs=None)
    assert sum(len(next(endless)) for _ in range(200)) >= 200  # keeps reading past the end of the dataset


# ---------------------------------------------------------------------- downstream stages
@pytest.mark.parametrize("lanes", [1, 3, 16])
def test_loader_feeds_nstep_like_live_data(lanes):
    """MinariSource -> NStepTransform equals the brute-force n-step reference on the env's own record."""
    dataset, records = record(LAYOUTS, "SameStep")
    _, cut = expected_rows(records, "truncate")
    reference = reference_nstep(cut, 3, 0.9)
    nstep = NStepTransform(MinariSource(dataset, lanes=lanes, gamma=0.9), n=3, gamma=0.9)
    got = TransitionBatch.concat(list(nstep))
    assert nstep.flush() is None, "every window was emitted at its episode's end"
    order = np.argsort(obs_code(ids_of(got["obs"])))
    got = got.rows(order)
    np.testing.assert_array_equal(obs_code(ids_of(got["obs"])), reference["code"])
    np.testing.assert_array_equal(got["action"], reference["action"])
    np.testing.assert_allclose(got["reward"], reference["reward"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["discount"], reference["discount"], rtol=1e-6)
    np.testing.assert_array_equal(obs_code(ids_of(got["next_obs"])), reference["next_code"])
    np.testing.assert_array_equal(got["terminated"], reference["terminated"])
    np.testing.assert_array_equal(got["truncated"], reference["truncated"])


def test_loader_as_a_streaming_replay_stage():
    """MinariSource -> NStepTransform -> ReplayBuffer -> BatchSampler -> to_dataloader, unchanged."""
    dataset, _ = record(LAYOUTS, "Disabled")
    nstep = NStepTransform(MinariSource(dataset, lanes=2, gamma=0.9, epochs=None), n=2, gamma=0.9)
    buffer = ReplayBuffer(nstep, capacity=64, warmup=8, transitions_per_yield=2, seed=0)
    loader = ptl_rl.to_dataloader(BatchSampler(buffer, batch_size=8), steps_per_epoch=20)
    batches = list(loader)
    assert len(batches) == 20 and all(isinstance(b, ptl_rl.TorchBatch) for b in batches)
    assert batches[0].obs.shape == (8, 3) and batches[0].discount.dtype == torch.float32
    assert "ReplayBuffer" in repr(buffer) and "MinariSource" in repr(buffer)


@pytest.mark.parametrize("nstep", [1, 3])
def test_replay_buffer_filled_in_one_call(nstep):
    dataset, records = record(LAYOUTS, "NextStep")
    _, cut = expected_rows(records, "truncate")
    reference = reference_nstep(cut, nstep, 0.9)
    buffer = minari_replay_buffer(dataset, nstep=nstep, gamma=0.9, seed=0, replacement=False)
    assert len(buffer) == buffer.capacity == dataset.total_steps
    stored = buffer.storage.gather(np.arange(len(buffer)))
    order = np.argsort(obs_code(ids_of(stored["obs"])))
    np.testing.assert_array_equal(obs_code(ids_of(stored["obs"]))[order], reference["code"])
    np.testing.assert_allclose(stored["reward"][order], reference["reward"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stored["discount"][order], reference["discount"], rtol=1e-6)
    np.testing.assert_array_equal(obs_code(ids_of(stored["next_obs"]))[order], reference["next_code"])
    np.testing.assert_array_equal(stored["terminated"][order], reference["terminated"])
    np.testing.assert_array_equal(stored["truncated"][order], reference["truncated"])
    # then sample epochs: every transition exactly once per epoch
    epoch = TransitionBatch.concat(list(buffer.epoch(7)))
    np.testing.assert_array_equal(np.sort(obs_code(ids_of(epoch["obs"]))), reference["code"])


def test_fill_a_prioritized_buffer():
    dataset, _ = record(LAYOUTS, "NextStep")
    buffer = MinariSource(dataset, gamma=0.9).fill(ptl_rl.PrioritizedReplayBuffer(None, capacity=64, warmup=0), 3)
    assert len(buffer) == dataset.total_steps
    batch = buffer.sample(8)
    assert batch["weights"].shape == (8,) and set(np.unique(batch["discount"])) <= {
        np.float32(0.9**k) for k in (1, 2, 3)
    }


def test_fill_warns_when_the_buffer_is_too_small():
    dataset, _ = record(LAYOUTS, "NextStep")
    with pytest.warns(UserWarning, match="overwritten"):
        MinariSource(dataset).fill(ReplayBuffer(None, capacity=10, warmup=0))


# ---------------------------------------------------------------------- datasets written by Minari itself
def _buffer(observations, actions, rewards, terminations, truncations):
    from minari.data_collector import EpisodeBuffer

    return EpisodeBuffer(
        observations=observations,
        actions=actions,
        rewards=rewards,
        terminations=terminations,
        truncations=truncations,
    )


def _minari_dataset(dataset_id, episodes, observation_space, action_space):
    """A dataset written by Minari's own API from in-memory episodes, as a downloaded one is written."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="env_spec is None", category=UserWarning)
        return _create(dataset_id, episodes, observation_space, action_space)


def _create(dataset_id, episodes, observation_space, action_space):
    return minari.create_dataset_from_buffers(
        dataset_id,
        episodes,
        observation_space=observation_space,
        action_space=action_space,
        author="ptl_rl tests",
        author_email="none",
        code_permalink="none",
        algorithm_name="none",
        description="test",
        eval_env="CartPole-v1",
    )


def test_reads_a_dataset_written_by_minari_and_truncates_an_unfinished_last_episode(datasets_path):
    obs_space = gym.spaces.Box(-10, 10, (2,), np.float64)
    rng = np.random.default_rng(0)
    ended = _buffer(rng.normal(size=(4, 2)), np.array([0, 1, 0]), np.ones(3), [False, False, True], [False] * 3)
    unfinished = _buffer(rng.normal(size=(3, 2)), np.array([1, 1]), np.ones(2), [False, False], [False, False])
    _minari_dataset("test/by-minari-v0", [ended, unfinished], obs_space, gym.spaces.Discrete(2))
    # point the loader at the dataset's directory, as for one copied from elsewhere
    got = TransitionBatch.concat(list(MinariSource(datasets_path / "test" / "by-minari-v0", lanes=2)))
    assert got["obs"].dtype == np.float32  # float64 observations are cast like the live source does
    assert got["truncated"].tolist().count(True) == 1 and got["terminated"].tolist().count(True) == 1
    assert len(got) == 5


# ---------------------------------------------------------------------- errors
def test_unknown_dataset_id_says_how_to_download():
    with pytest.raises(FileNotFoundError, match="minari download D4RL/door/human-v2"):
        MinariSource("D4RL/door/human-v2")


def test_existing_dataset_id_is_not_overwritten():
    record(LAYOUTS, "NextStep")
    with pytest.raises(FileExistsError, match="already exists"):
        MinariRecorder(None, "test/scripted-v0", env=make_env(LAYOUTS, "NextStep"))


def test_missing_field_is_named(datasets_path):
    import h5py

    dataset, _ = record(LAYOUTS, "NextStep")
    with h5py.File(datasets_path / "test" / "scripted-v0" / "data" / "main_data.hdf5", "a") as f:
        del f["episode_1"]["rewards"]
    with pytest.raises(ValueError, match="episode 1: the stored episode lacks the field .rewards."):
        list(MinariSource("test/scripted-v0"))


def test_observations_not_matching_their_space_are_reported():
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    wrong = _buffer(np.zeros((3, 4), np.float32), np.array([0, 1]), np.ones(2), [False, True], [False, False])
    _minari_dataset("test/wrong-shape-v0", [wrong], obs_space, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match=r"observations have shape \(3, 4\), expected \(3, 3\)"):
        list(MinariSource("test/wrong-shape-v0"))
    missing_final = _buffer(np.zeros((2, 3), np.float32), np.array([0, 1]), np.ones(2), [False, True], [False] * 2)
    _minari_dataset("test/no-final-obs-v0", [missing_final], obs_space, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="T \\+ 1 observations"):
        list(MinariSource("test/no-final-obs-v0"))


def test_episode_end_inside_an_episode_is_rejected():
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    spans = _buffer(np.zeros((4, 3), np.float32), np.array([0, 1, 0]), np.ones(3), [True, False, True], [False] * 3)
    _minari_dataset("test/spans-reset-v0", [spans], obs_space, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="step 0 of 3 is terminated/truncated"):
        list(MinariSource("test/spans-reset-v0"))


def test_mismatched_spaces_are_reported():
    dataset, _ = record(LAYOUTS, "NextStep")
    cartpole = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match="has observation space .* but the pipeline expects"):
        MinariSource(dataset, observation_space=cartpole.observation_space)
    with pytest.raises(ValueError, match="has action space .* but the pipeline expects"):
        MinariSource(dataset, action_space=gym.spaces.Discrete(2))
    MinariSource(dataset, observation_space=dataset.observation_space, action_space=gym.spaces.Discrete(5))


def test_tuple_spaces_are_rejected_with_the_fix():
    space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3)))
    with pytest.raises(TypeError, match="FlattenObservation"):
        MinariRecorder(None, "test/tuple-v0", observation_space=space, action_space=gym.spaces.Discrete(2))


def test_a_falsy_space_passed_to_the_recorder_is_the_space_used():
    """An empty Dict space has len 0 (falsy): it is still the space asked for, not "none given"."""
    empty = gym.spaces.Dict({})
    recorder = MinariRecorder(None, "test/empty-v0", observation_space=empty, action_space=gym.spaces.Discrete(2))
    assert recorder._observation_space is empty
    env = make_env(LAYOUTS, "NextStep")  # its own observation space is a Box: the one passed wins
    recorder = MinariRecorder(None, "test/empty-env-v0", env=env, observation_space=empty)
    assert recorder._observation_space is empty
    assert recorder._action_space == env.single_action_space


def test_rows_equal_matches_a_row_by_row_comparison():
    """rows_equal_nan_as_equal (the recorder's check that rows follow) against a loop over rows and leaves."""
    from ptl_rl.offline.recorder import rows_equal_nan_as_equal

    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = int(rng.integers(1, 6))  # (the recorder compares only when some env has a running episode)
        a = {"x": rng.integers(0, 2, (rows, 3)).astype(np.float32), "y": {"z": rng.integers(0, 2, (rows,))}}
        a["x"][rng.random((rows, 3)) < 0.2] = np.nan
        b = {"x": a["x"].copy(), "y": {"z": a["y"]["z"].copy()}}
        flip = rng.random(rows) < 0.4
        b["x"][flip & (rng.random(rows) < 0.5), 0] = 7.0
        b["y"]["z"][flip] += rng.integers(0, 2, int(flip.sum()))
        expected = [
            np.array_equal(a["x"][i], b["x"][i], equal_nan=True) and a["y"]["z"][i] == b["y"]["z"][i]
            for i in range(rows)
        ]
        assert rows_equal_nan_as_equal(a, b, rows).tolist() == expected
    # a tree without leaves (an empty Dict observation): every row is equal, not None
    assert rows_equal_nan_as_equal({}, {}, 3).tolist() == [True, True, True]


def test_recorder_rejects_rows_that_are_not_consecutive_steps():
    env = make_env(LAYOUTS, "NextStep")
    nstep = NStepTransform(ExperienceSource(env, ScriptedAgent(3), seed=0), n=3, gamma=0.9)
    recorder = MinariRecorder(nstep, "test/nstep-v0", env=env)
    with pytest.raises(ValueError, match="not consecutive 1-step transitions"):
        for _ in range(20):
            next(recorder)


def test_missing_minari_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "minari", None)  # import minari -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'ptl_rl\[offline\]'"):
        MinariSource("anything-v0")


# ---------------------------------------------------------------------- learning
@pytest.mark.learning
def test_behaviour_cloning_from_a_recorded_expert_solves_cartpole(restore_torch_threads):
    # python -m ptl_rl.examples.offline_bc --seed 0: record 20 PD-expert episodes, clone them for 1000 steps
    from ptl_rl.examples import offline_bc

    args = offline_bc.parse_args(["--seed", "0", "--no-progress-bar", "--runs-dir", ""])
    dataset = offline_bc.record_dataset("ptl_rl/cartpole-pd-expert-s0-v0", args)
    assert dataset.total_episodes == args.record_episodes
    assert dataset.recover_environment().spec.id == "CartPole-v1"  # the env spec was stored

    # training reads the dataset only: stepping an env before the final evaluation fails the test
    with pytest.MonkeyPatch.context() as patch:
        real_evaluate = ptl_rl.evaluate

        def step_during_training(self, actions):
            raise AssertionError("an env was stepped during offline training")

        def evaluate_after_training(*args, **kwargs):
            patch.undo()  # training is over: the evaluation may step envs
            return real_evaluate(*args, **kwargs)

        patch.setattr(gym.vector.SyncVectorEnv, "step", step_during_training)
        patch.setattr(ptl_rl, "evaluate", evaluate_after_training)
        result = offline_bc.train(args)
    assert result["dataset_steps"] == dataset.total_steps  # the recorded dataset was reused, not re-recorded
    assert result["final_eval_return"] >= 475.0, result


def test_offline_example_rejects_envs_it_cannot_clone(capsys, tmp_path, monkeypatch):
    from ptl_rl.examples import offline_bc

    (tmp_path / "acrobot" / "expert-v0" / "data").mkdir(parents=True)  # stored locally: parse_args checks it
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))

    with pytest.raises(SystemExit):
        offline_bc.parse_args(["--env-id", "Pendulum-v1"])
    assert "needs Discrete actions, but Pendulum-v1 has Box" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        offline_bc.parse_args(["--env-id", "Acrobot-v1"])
    assert "only drives CartPole-v1; pass --dataset" in capsys.readouterr().err
    assert offline_bc.parse_args(["--env-id", "Acrobot-v1", "--dataset", "acrobot/expert-v0"]).dataset


def test_record_by_hand_with_several_steps_of_an_env_per_batch():
    """record() takes any 1-step rows in time order per env, e.g. a whole trajectory in one batch."""
    env = make_env(LAYOUTS, "SameStep")
    source = ExperienceSource(env, ScriptedAgent(3), seed=0)
    trajectory = TransitionBatch.concat([TransitionBatch(dict(b)) for b in scripted_batches(source, LAYOUTS, 2)])
    with MinariRecorder(None, "test/by-hand-v0", env=env, partial_episodes="drop") as recorder:
        recorder.record(trajectory)
        recorder.record(trajectory.rows(slice(0, 0)))  # an empty batch is fine
    rows, _ = expected_rows(env_attr(env, "record"), "drop")
    assert_rows_equal(loaded_rows(MinariSource(recorder.dataset, lanes=5)), rows)
    with pytest.raises(RuntimeError, match="closed"):
        recorder.record(trajectory)


def test_float64_observations_are_recorded_as_the_float32_the_source_yields():
    class Float64Obs(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            space = env.observation_space
            self.observation_space = gym.spaces.Box(space.low, space.high, space.shape, np.float64)

        def observation(self, obs):
            return obs.astype(np.float64)

    env = Float64Obs(gym.make("CartPole-v1"))
    source = ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
    with MinariRecorder(source, "test/float64-v0") as recorder:
        while source.episodes_finished < 2:
            next(recorder)
    dataset = recorder.dataset
    assert dataset.observation_space.dtype == np.float32
    assert dataset.total_episodes == 2  # recording stopped right at an episode end: nothing was running
    assert dataset.env_spec.id == "CartPole-v1"  # stored, though this test wrapper cannot be re-made from it
    # the float64 space of the env still matches (same kind and shape): a model for this env can train on it
    got = TransitionBatch.concat(list(MinariSource(dataset, observation_space=env.observation_space)))
    assert got["obs"].dtype == np.float32 and len(got) == dataset.total_steps


def test_ranks_read_disjoint_episodes_under_ddp(monkeypatch):
    """set_rank in a (faked) 2-process world: each rank gets distinct env_ids and a disjoint share of the episodes."""
    import ptl_rl.offline.source

    dataset, _ = record(LAYOUTS, "NextStep")
    monkeypatch.setattr(ptl_rl.offline.source, "distributed_rank", lambda: (1, 2))
    episodes = []
    for rank in (0, 1):
        source = MinariSource(dataset, lanes=2, episode_id=True, shuffle=True, seed=0)
        source.set_rank(rank)
        got = TransitionBatch.concat(list(source))
        assert set(got["env_id"].tolist()) <= {2 * rank, 2 * rank + 1}
        episodes.append(set(got["episode_id"].tolist()))
    assert episodes[0].isdisjoint(episodes[1]) and episodes[0] | episodes[1] == set(range(dataset.total_episodes))
    source = MinariSource(dataset, lanes=2, episode_indices=[0, 1])  # explicit indices: the user's own split
    source.set_rank(1)
    assert source.episode_indices.tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="already read"):
        next(source)
        source.set_rank(0)


# ---------------------------------------------------------------------- cut streams (env crash, peek)
class CrashingEnv(ScriptedEnv):
    """Raises in its ``crash_at``-th step() call, after its state moved on (like test_robustness.py's)."""

    def __init__(self, *args, crash_at: int = -1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.crash_at, self.calls = crash_at, 0

    def step(self, action):
        self.calls += 1
        out = super().step(action)
        if self.calls == self.crash_at:
            raise ValueError(f"env {self.index} broke")
        return out


CRASH_LAYOUTS = [[(4, TERM), (3, TRUNC)], [(2, TRUNC), (6, TERM)], [(5, BOTH)]]


def crashing_source(mode):
    fns = [
        functools.partial(CrashingEnv, i, layout, reward_seed=4, crash_at=5 if i == 1 else -1)
        for i, layout in enumerate(CRASH_LAYOUTS)
    ]
    env = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))
    rng = np.random.default_rng(2)  # a plain agent: ScriptedAgent's hook checks do not expect a crash
    return env, ExperienceSource(env, lambda obs: rng.integers(0, 5, size=len(obs)), seed=2)


def pull_across_a_crash(stage, steps=12):
    """``steps`` batches of ``stage`` before and after the crash (the source resynchronises); the crash is seen."""
    got = []
    with pytest.raises(ValueError, match="env 1 broke"):
        for _ in range(steps):
            got.append(next(stage))
    got += [next(stage) for _ in range(steps)]
    return got


def episodes_of(rows: TransitionBatch, records, partial):
    """The rows grouped by the scripted ids into (env, episode), in step order, as a recorder must store them.

    Every group must be consecutive steps of the env's own record from the episode's start; a group whose
    last row has neither flag was cut (by the crash or by close()): truncated there, or absent under "drop".
    """
    ident = ids_of(rows["obs"])
    expected = []
    for env, episode in sorted({(int(i), int(e)) for i, e in ident[:, :2]}):
        order = np.flatnonzero((ident[:, 0] == env) & (ident[:, 1] == episode))
        order = order[np.argsort(ident[order, 2])]
        steps = [s for s in records[env] if s[0][1] == episode]
        assert len(steps) >= len(order) and ident[order, 2].tolist() == list(range(len(order)))
        steps = [list(s) for s in steps[: len(order)]]
        if not (steps[-1][4] or steps[-1][5]):
            if partial == "drop":
                continue
            steps[-1][5] = True
        expected += [(env, *step) for step in steps]
    expected.sort(key=lambda r: int(obs_code(r[1])))
    return expected


def check_nstep_windows(batches, env, n, gamma, atol=0.0):
    """Every n-step row is a window of real consecutive steps of one episode, with the discounted sum of their
    rewards: none joins steps across a cut."""
    rows = TransitionBatch.concat([b for b in batches if b is not None and len(b)])
    ident, next_ident = ids_of(rows["obs"]), ids_of(rows["next_obs"])
    assert (ident[:, :2] == next_ident[:, :2]).all(), "an n-step row spans a cut"
    k = next_ident[:, 2] - ident[:, 2]
    assert ((k >= 1) & (k <= n)).all()
    lookup = {int(obs_code(s[0])): s for r in env_attr(env, "record") for s in r}
    for r in range(len(rows)):
        window = [lookup[int(obs_code(ident[r])) + j] for j in range(int(k[r]))]
        expected = sum(gamma**j * s[2] for j, s in enumerate(window))
        np.testing.assert_allclose(rows["reward"][r], expected, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("partial", ["truncate", "drop"])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_recorder_records_on_after_the_source_resynchronises_from_an_env_crash(mode, partial):
    """The episodes the crash abandoned are stored as cut (truncated, or dropped), and recording goes on."""
    env, source = crashing_source(mode)
    recorder = MinariRecorder(source, "test/crash-v0", partial_episodes=partial, flush_every=2)
    passed = TransitionBatch.concat(pull_across_a_crash(recorder))
    dataset = recorder.close()
    records = env_attr(env, "record")
    rows = episodes_of(passed, records, partial)
    # more episodes were cut than close() cuts (one per env at most): the crash cut some too
    abandoned = {(int(s[0][0]), int(s[0][1])) for r in records for s in r} - {(r[0], int(r[1][1])) for r in rows}
    truncated = {int(obs_code(s[0])) for r in records for s in r if s[5]}
    cut = sum(1 for r in rows if r[6] and int(obs_code(r[1])) not in truncated)
    assert (len(abandoned) if partial == "drop" else cut) > len(CRASH_LAYOUTS), "the crash cut no episode"
    assert dataset.total_steps == len(rows)
    for episode in dataset.iterate_episodes():  # no stored episode spans the resync's reset
        ident = ids_of(episode.observations)
        assert (ident[:, :2] == ident[0, :2]).all(), "episode spans a reset"
    assert_rows_equal(loaded_rows(MinariSource("test/crash-v0", lanes=2)), rows)


def test_recorder_cuts_episodes_where_its_source_was_peeked_and_tells_stages_downstream():
    """A batch pulled past the recorder is a gap in its source's stream_seq: the episodes are cut there, and the
    recorder passes the stream numbers on so that an NStepTransform behind it flushes its windows too."""
    env = make_env(LAYOUTS, "SameStep")
    source = ExperienceSource(env, ScriptedAgent(3), seed=0)
    recorder = MinariRecorder(source, "test/peek-v0", partial_episodes="drop")
    nstep = NStepTransform(recorder, n=3, gamma=0.9)
    out = [next(nstep) for _ in range(3)]
    seqs = recorder.stream_seq, source.stream_seq
    next(source)  # a peek: the recorder and the transform never see this step
    out += [next(nstep) for _ in range(6)]
    # the recorder numbers its own batches (ptl_rl.Stage): they advanced as its source's, the batch it never saw
    # (the peek) a skipped number, which the transform behind it sees as a cut
    assert recorder.stream_seq - seqs[0] == source.stream_seq - seqs[1] > 1
    recorder.close()
    out.append(nstep.flush())
    check_nstep_windows(out, env, n=3, gamma=0.9)  # none joins steps across the gap
    # the recorder stored the episodes up to the gap and the rest of them after it (an episode's tail starts
    # after the peeked step), each as consecutive steps of one episode
    stored = [ids_of(e.observations) for e in recorder.dataset.iterate_episodes()]
    assert all((np.diff(ident[:, 2]) == 1).all() and (ident[:, :2] == ident[0, :2]).all() for ident in stored)
    assert any(ident[0, 2] > 0 for ident in stored), "no episode was cut at the peek"


# ---------------------------------------------------------------------- cuts inside the offline stages' own steps
SOURCE_CUTS = {
    "code": lambda code: (
        code.co_filename in (offline_source.__file__, offline_reader.__file__, guard.__file__, stage.__file__)
    )
}


GUARD_RETURN_LINE = max(line for _, _, line in guard.next_step.__code__.co_lines() if line)  # `return out`


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_next_of_minari_source_cut_at_any_line_is_rolled_back_whole(shuffle):
    """Interrupts and exceptions between any two statements of MinariSource's step (filling lanes, reading
    episodes, the reading order) and of the guard around it: the next next() yields what the cut one would have,
    so the rows are those of a run without a fault, in the same order, and the counters agree."""
    dataset, _ = record(LAYOUTS, "NextStep")
    options = {"lanes": 2, "epochs": 2, "shuffle": shuffle, "seed": 3, "episodes_per_read": 2, "episode_id": True}
    clean = MinariSource(dataset, **options)
    expected = list(clean)
    source = MinariSource(dataset, **options)
    injector = Injector(SOURCE_CUTS)
    got, faults, lost = [], 0, 0
    while True:
        k = 1
        while True:  # cut this call at every line in turn, then let it run
            fault = KeyboardInterrupt() if k % 2 else InjectedFault()
            try:
                batch = injector.run(lambda: next(source), "code", k, fault)  # noqa: B023 - run at once
            except (KeyboardInterrupt, InjectedFault) as raised:
                assert raised is fault
                faults, k = faults + 1, k + 1
                if (injector.where, injector.line) == (guard.next_step.__code__, GUARD_RETURN_LINE):
                    got.append(None)  # cut as the finished step returns: its rows are lost, as in any stage
                    lost += 1
                continue
            except StopIteration:
                batch = None
            break
        if batch is None:
            break
        got.append(batch)
    assert faults > 20 * len(expected) and lost > len(expected) // 2
    assert len(got) == len(expected)
    for have, want in zip(got, expected, strict=True):
        if have is None:
            continue
        assert have.keys() == want.keys()
        for key in want.keys():
            np.testing.assert_array_equal(have[key], want[key], err_msg=key)
    assert (source.total_steps, source.episodes_finished) == (clean.total_steps, clean.episodes_finished)
    assert source.stream_seq > len(got)  # the restores were cuts of its stream


RECORDER_CUTS = {"code": lambda code: code.co_filename in (offline_recorder.__file__, guard.__file__, stage.__file__)}


def check_stored_episodes(dataset, env, partial):
    """Every stored episode is consecutive steps of one episode of the env's record, with its actions, rewards,
    flags and final observation (a cut one truncated on its last step, under "truncate"; under "drop" only
    episodes that really ended), and no step is stored twice. Returns the stored steps' codes and how many
    stored episodes were cut."""
    lookup = {int(obs_code(s[0])): s for r in env_attr(env, "record") for s in r}
    stored, cut = [], 0
    for episode in dataset.iterate_episodes():
        ident = ids_of(episode.observations)
        assert (ident[:, :2] == ident[0, :2]).all() and (np.diff(ident[:, 2]) == 1).all(), "joined across a cut"
        steps = [lookup[int(code)] for code in obs_code(ident[:-1])]
        for t, step in enumerate(steps):
            assert episode.actions[t] == step[1] and np.float32(episode.rewards[t]) == np.float32(step[2])
            assert bool(episode.terminations[t]) == bool(step[4])
            ended = step[4] or step[5]
            assert ended == (t == len(steps) - 1) or t == len(steps) - 1, "an episode end inside a stored episode"
            if t == len(steps) - 1 and not ended:  # cut here: stored truncated
                assert partial == "truncate" and episode.truncations[t]
                cut += 1
            else:
                assert bool(episode.truncations[t]) == bool(step[5])
        assert obs_code(ident[-1]) == obs_code(steps[-1][3]), "the final observation"
        stored += obs_code(ident[:-1]).tolist()
    assert len(stored) == len(set(stored)), "a row stored twice"
    return set(stored), cut


@pytest.mark.parametrize("partial", ["truncate", "drop"])
def test_a_next_of_the_recorder_cut_at_any_line_stores_no_episode_across_the_cut(partial):
    """Interrupts and exceptions between any two statements of the recorder's step (recording, ending episodes at a
    cut, writing to disk) and of the guard around it: the batch of a step cut short is lost and the running
    episodes end there, truncated or dropped; recording goes on, every stored episode is right (and every row passed
    on stored once), and the n-step rows behind the recorder join no steps across a cut."""
    rng = np.random.default_rng(5)
    layouts = [[(int(rng.integers(1, 7)), (TERM, TRUNC, BOTH)[rng.integers(3)]) for _ in range(200)] for _ in range(3)]
    env = make_env(layouts, "SameStep", reward_seed=5)
    actions = np.random.default_rng(6)
    source = ExperienceSource(env, lambda obs: actions.integers(0, 5, size=len(obs)), seed=5)
    recorder = MinariRecorder(source, f"test/cuts-{partial}-v0", partial_episodes=partial, flush_every=2)
    tap = Tap(recorder)
    nstep = NStepTransform(tap, n=3, gamma=0.9)
    injector = Injector(RECORDER_CUTS)
    out = [next(nstep) for _ in range(5)]
    injector.run(lambda: out.append(next(nstep)))  # a steady call's lines
    lines = injector.counts["code"]
    with pytest.raises(KeyboardInterrupt):
        injector.run(lambda: out.append(next(nstep)), "code", lines // 2, KeyboardInterrupt())
    injector.run(lambda: out.append(next(nstep)))  # the lines of a call after a cut: it rolls back, ends the
    after_cut = injector.counts["code"]  # running episodes (their env's slots are free), records the batch
    faults = collections.Counter()
    # each line of a steady call, then a line of the call after it (which reuses slots of episodes it ended)
    for index, k in enumerate(k for i in range(1, lines + 1) for k in (i, 1 + i * 37 % after_cut)):
        fault = KeyboardInterrupt() if k % 2 else InjectedFault()
        try:
            injector.run(lambda: out.append(next(nstep)), "code", k, fault)  # noqa: B023 - run at once
        except (KeyboardInterrupt, InjectedFault) as raised:
            assert raised is fault
            if (injector.where, injector.line) == (guard.next_step.__code__, GUARD_RETURN_LINE):
                faults["as a step returns"] += 1  # its output is lost, what the stage did kept (any stage)
            elif injector.where is MinariRecorder._write.__code__:
                faults["writing"] += 1  # a write to disk cut short loses its episodes (never writes them twice)
            else:
                faults["elsewhere"] += 1
        if index % 2:
            out += [next(nstep), next(nstep)]
    assert faults.total() > lines // 2 and faults["elsewhere"] > lines // 4, faults
    dataset = recorder.close()
    out.append(nstep.flush())
    check_nstep_windows(out, env, n=3, gamma=0.9, atol=1e-6)  # (float32 sums near 0)
    stored, cut = check_stored_episodes(dataset, env, partial)
    passed = set(obs_code(ids_of(np.concatenate([b["obs"] for b in tap.raw]))).tolist())
    # what was stored is what was passed on, but for a recorded batch lost as its step returned (3 rows each) ...
    assert len(stored - passed) <= 3 * faults["as a step returns"]
    if partial == "truncate":  # ... and the episodes of a write cut short (a few, 6 steps at most each)
        missing = len(passed - stored)
        assert missing <= 5 * 6 * faults["writing"] and missing < len(passed) // 10, (missing, faults)
        assert cut > len(layouts), "no episode was cut inside a run (close() cuts one per env at most)"
    assert dataset.total_episodes > lines

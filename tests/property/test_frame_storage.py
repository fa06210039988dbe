"""FrameStorage against brute force: every sampled obs / next_obs bit-identical to what the env returned.

The env is the scripted env (every frame names its env, episode and step)
wrapped in gymnasium's ``FrameStackObservation`` and a recorder that keeps
every stacked observation the wrapper returned. The reference for a stored
transition of env ``i``, episode ``e``, step ``t`` is read off that record
(obs at step ``t``, and the observation ``k = min(n, steps left)`` steps
later, the final one at an episode end). Small capacities force ring
wrap-around; scripts mix terminations, truncations and episodes shorter than
the stack and the n-step window; every autoreset mode is run.
"""

from __future__ import annotations

import functools
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from scripted_env import BOTH, MODES, TERM, TRUNC, ScriptedEnv, obs_code

from ptl_rl import (
    ExperienceSource,
    FrameStorage,
    NStepTransform,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SequenceReplayBuffer,
    TransitionBatch,
)
from ptl_rl.replay import ArrayStorage, load_buffer, save_buffer
from ptl_rl.replay.frames import _frame_insert
from ptl_rl.replay.persist import MANIFEST, read_manifest

STACK = 4
LAYOUTS = [
    [(5, TERM), (1, TRUNC), (7, BOTH), (2, TERM), (9, TRUNC)],
    [(2, TRUNC), (8, TERM), (3, TERM), (1, TERM), (6, BOTH)],
    [(11, TERM), (4, TRUNC), (2, BOTH)],
]


class StackRecorder(gym.Wrapper):
    """Records every (obs, next_obs, terminated, truncated) the stacked env returns, as the env's own brute force."""

    def __init__(self, env: gym.Env, stack_last: bool) -> None:
        super().__init__(env)
        self.stack_last = stack_last
        if stack_last:
            space = env.observation_space
            self.observation_space = gym.spaces.Box(
                np.moveaxis(space.low, 0, -1), np.moveaxis(space.high, 0, -1), dtype=space.dtype
            )
        self.steps: list[tuple[np.ndarray, np.ndarray, bool, bool]] = []
        self._obs: np.ndarray | None = None

    def _out(self, obs: np.ndarray) -> np.ndarray:
        return np.moveaxis(obs, 0, -1).copy() if self.stack_last else np.array(obs, copy=True)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._obs = self._out(obs)
        return self._obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        obs = self._out(obs)
        self.steps.append((self._obs, obs, bool(terminated), bool(truncated)))
        self._obs = obs
        return obs, reward, terminated, truncated, info


def make_stacked(index: int, layout, padding: str, stack_last: bool) -> gym.Env:
    stacked = gym.wrappers.FrameStackObservation(ScriptedEnv(index, layout), STACK, padding_type=padding)
    return StackRecorder(stacked, stack_last)


def make_env(mode: str, padding: str = "reset", stack_last: bool = False):
    fns = [functools.partial(make_stacked, i, layout, padding, stack_last) for i, layout in enumerate(LAYOUTS)]
    if mode == "single":
        return fns[0]()
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))


def recorders(env) -> list[StackRecorder]:
    return list(env.envs) if isinstance(env, gym.vector.VectorEnv) else [env]


def newest_code(obs: np.ndarray, stack_last: bool) -> np.ndarray:
    """Obs code of the newest frame of each stacked observation [..., S, 3] (or [..., 3, S])."""
    newest = obs[..., :, -1] if stack_last else obs[..., -1, :]
    return obs_code(newest)


def reference(records: list[StackRecorder], n: int, stack_last: bool) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Brute force: obs code of a step -> (the stacked obs the env returned, the one k steps later)."""
    table = {}
    for rec in records:
        episodes, current = [], []
        for step in rec.steps:
            current.append(step)
            if step[2] or step[3]:
                episodes.append(current)
                current = []
        episodes.append(current)
        for steps in episodes:
            for t, (obs, _, _, _) in enumerate(steps):
                k = min(n, len(steps) - t)
                table[int(newest_code(obs, stack_last))] = (obs, steps[t + k - 1][1])
    return table


def random_agent(num_envs: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return lambda obs: rng.integers(0, 5, size=len(obs))


def check_against_reference(batch, table, stack_last: bool) -> None:
    obs, next_obs = np.asarray(batch["obs"]), np.asarray(batch["next_obs"])
    codes = newest_code(obs, stack_last).reshape(-1)
    flat_obs = obs.reshape(-1, *obs.shape[-2:])
    flat_next = next_obs.reshape(-1, *obs.shape[-2:])
    for row, code in enumerate(codes):
        want_obs, want_next = table[int(code)]
        assert flat_obs[row].dtype == want_obs.dtype
        np.testing.assert_array_equal(flat_obs[row], want_obs)
        np.testing.assert_array_equal(flat_next[row], want_next)


# ---------------------------------------------------------------------- storage against the env's record
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    "padding,stack_last,extra,check",
    [("reset", False, 200, True), ("zero", True, 8, True), ("reset", True, 200, False)],
)
def test_storage_matches_env_record(mode, n, padding, stack_last, extra, check):
    """Every sampleable slot rebuilds the env's own stacks; exactly the slots whose next_obs arrived are sampleable."""
    env = make_env(mode, padding, stack_last)
    stream = NStepTransform(ExperienceSource(env, random_agent(3), seed=1), n=n, gamma=0.9)
    capacity = 23  # small and odd: the ring wraps many times, at every phase
    frames = FrameStorage(capacity, stack_axis=-1 if stack_last else 0, n_step=n, extra_frames=extra, check=check)
    twin = ArrayStorage(capacity)  # stores obs and next_obs in full: the naive ring
    arrived: set[int] = set()
    stored_any = 0
    for _ in range(60):
        batch = next(stream)
        slots = frames.add(batch)
        assert np.array_equal(slots, twin.add(batch))
        arrived.update(int(c) for c in newest_code(np.asarray(batch["obs"]), stack_last))
        table = reference(recorders(env), n, stack_last)
        every = np.arange(len(frames))
        ok = frames.sampleable(every)
        mine, naive = frames.gather(every[ok]), twin.gather(every[ok])
        for name in naive.keys():
            np.testing.assert_array_equal(mine[name], naive[name], err_msg=name)
        check_against_reference(mine, table, stack_last)
        # the next_obs-has-arrived rule, from the record
        stored = twin.gather(every)
        codes = newest_code(stored["obs"], stack_last)
        done = stored["terminated"] | stored["truncated"]
        ahead = codes + n  # same env and episode, n steps later (codes count steps in the last digits)
        has_arrived = done | np.isin(ahead, list(arrived))
        assert not (ok & ~has_arrived).any(), "a transition whose next_obs has not arrived is sampleable"
        if extra >= 200:  # a pool that never overflows: nothing else makes a slot unsampleable
            assert np.array_equal(ok, has_arrived)
        stored_any += int(ok.sum())
    assert frames.total_added > 2 * capacity and stored_any > 0
    # one frame per transition plus a few per episode: far below obs + next_obs in full
    assert frames.frames_written <= frames.total_added + 4 * STACK * sum(len(x) for x in LAYOUTS) + 3 * STACK


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_buffers_sample_exact_stacks(mode):
    """Uniform and prioritized replay over FrameStorage sample only exact, arrived transitions, as uint8 pixels too."""
    table_of = lambda env: reference(recorders(env), 3, False)  # noqa: E731
    for cls in (ReplayBuffer, PrioritizedReplayBuffer):
        env = make_env(mode)
        stream = NStepTransform(ExperienceSource(env, random_agent(3, 5), seed=2), n=3, gamma=0.9)
        buffer = cls(stream, 40, warmup=16, seed=0, storage=functools.partial(FrameStorage, stack_axis=0))
        assert buffer.storage.n_step == 3  # taken from the upstream NStepTransform
        for _ in range(30):
            next(buffer)
            batch = buffer.sample(16)
            check_against_reference(batch, table_of(env), False)
            if cls is PrioritizedReplayBuffer:
                assert buffer.storage.sampleable(batch["indices"]).all()
                batch.update_priorities(np.arange(16.0))


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_sequence_buffer_windows_exact(mode):
    """Sequence windows over FrameStorage equal the same windows over a full-obs twin, step by step."""
    env = make_env(mode)
    source = ExperienceSource(env, random_agent(3, 7), seed=3)
    make = lambda storage=None: SequenceReplayBuffer(None, 37, length=3, burn_in=2, seed=0, storage=storage)  # noqa: E731
    buffer = make(functools.partial(FrameStorage, stack_axis=0, n_step=1))
    twin = make()
    for _ in range(60):
        batch = next(source)
        buffer.add(batch)
        twin.add(batch)
        if buffer.draws.num_windows < 4:
            continue
        sample = buffer.sample(8)
        slots, _ = buffer.draws.window_slots(sample["indices"])
        assert buffer.storage.sampleable(slots[sample["mask"]]).all()
        expected = twin.storage.gather(slots)
        for name in expected.keys():
            np.testing.assert_array_equal(sample[name], expected[name], err_msg=name)
        check_against_reference(sample, reference(recorders(env), 1, False), False)


def test_next_obs_of_the_newest_steps_is_never_sampled():
    """With 2 envs and n=1, the newest step of each env waits for its next_obs: never drawn, however often."""
    obs = np.arange(4 * 6, dtype=np.uint8).reshape(4, 6)  # 4 frames of 6 pixels, no stacking
    storage = FrameStorage(10, n_step=1)
    rows = lambda o, no, env: TransitionBatch(  # noqa: E731
        obs=o,
        next_obs=no,
        action=np.zeros(len(env)),
        reward=np.zeros(len(env), np.float32),
        terminated=np.zeros(len(env), bool),
        truncated=np.zeros(len(env), bool),
        discount=np.full(len(env), 0.9, np.float32),
        env_id=np.array(env),
    )
    storage.add(rows(obs[[0, 1]], obs[[2, 3]], [0, 1]))
    assert not storage.sampleable(np.arange(2)).any()
    storage.add(rows(obs[[2]], obs[[0]], [0]))  # env 0's step 1 arrives: its step 0 is complete
    assert storage.sampleable(np.arange(3)).tolist() == [True, False, False]
    np.testing.assert_array_equal(storage.gather(np.array([0]))["next_obs"], obs[[2]])
    buffer = ReplayBuffer(None, 10, storage=functools.partial(FrameStorage, n_step=1))
    buffer.add(rows(obs[[0, 1]], obs[[2, 3]], [0, 1]))
    buffer.add(rows(obs[[2]], obs[[0]], [0]))
    assert (buffer.sample(3)["obs"] == obs[0]).all()
    assert all((buffer.sample(3)["obs"] == obs[0]).all() for _ in range(50))


def test_wrong_n_step_is_reported():
    env = make_env("NextStep")
    stream = NStepTransform(ExperienceSource(env, random_agent(3), seed=1), n=3, gamma=0.9)
    storage = FrameStorage(50, stack_axis=0, n_step=1)
    with pytest.raises(ValueError, match="n_step=1.*NStepTransform"):
        for _ in range(20):
            storage.add(next(stream))


# ---------------------------------------------------------------------- persistence
def filled_buffer(tmp_path, memmap: bool, checkpoint: bool = False):
    env = make_env("NextStep")
    stream = NStepTransform(ExperienceSource(env, random_agent(3), seed=4), n=3, gamma=0.9)
    storage = functools.partial(
        FrameStorage,
        stack_axis=0,
        memmap_dir=tmp_path / "scratch" if memmap else None,
        checkpoint_dir=tmp_path / "ckpt" if checkpoint else None,
    )
    buffer = PrioritizedReplayBuffer(stream, 30, warmup=10, seed=0, storage=storage)
    for _ in range(25):
        next(buffer)
    return buffer, storage


@pytest.mark.parametrize("memmap", [False, True])
def test_save_and_load_directory(tmp_path, memmap):
    buffer, storage = filled_buffer(tmp_path, memmap)
    if memmap:
        assert isinstance(buffer.storage.pool, np.memmap)
    save_buffer(buffer, tmp_path / "save")
    restored = PrioritizedReplayBuffer(None, 30, seed=0, storage=functools.partial(FrameStorage, stack_axis=0))
    load_buffer(restored, tmp_path / "save")
    every = np.arange(len(buffer))
    ok = buffer.storage.sampleable(every)
    assert np.array_equal(ok, restored.storage.sampleable(every))
    a, b = buffer.storage.gather(every[ok]), restored.storage.gather(every[ok])
    for name in a.keys():
        np.testing.assert_array_equal(a[name], b[name])
    np.testing.assert_array_equal(buffer.draws.priorities(), restored.draws.priorities())
    assert buffer.rng.bit_generator.state == restored.rng.bit_generator.state
    # a second save onto the same directory replaces it atomically
    save_buffer(restored, tmp_path / "save")
    assert sorted(os.listdir(tmp_path)) == sorted(["save"] + (["scratch"] if memmap else []))


def test_half_written_save_is_refused(tmp_path):
    buffer, _ = filled_buffer(tmp_path, False)
    target = tmp_path / "save"
    save_buffer(buffer, target)
    os.remove(target / MANIFEST)  # as if the process died before the manifest was written
    fresh = PrioritizedReplayBuffer(None, 30, storage=functools.partial(FrameStorage, stack_axis=0))
    with pytest.raises(ValueError, match="not a complete save"):
        load_buffer(fresh, target)
    save_buffer(buffer, tmp_path / "other")
    with open(tmp_path / "other" / "pool.npy", "r+b") as f:  # a truncated array file
        f.truncate(100)
    with pytest.raises(ValueError, match="damaged"):
        read_manifest(tmp_path / "other")


def test_checkpoint_refers_to_directory(tmp_path):
    """With checkpoint_dir the state holds a path, not the replay; loading it restores the same contents."""
    buffer, storage = filled_buffer(tmp_path, True, checkpoint=True)
    state = buffer.state_dict()
    assert set(state["storage"]) == {"directory", "save_id", "state_version"}
    blob = tmp_path / "state.pt"
    torch.save(state, blob)
    assert os.path.getsize(blob) < 100_000  # the replay (frames) is not in it
    restored = PrioritizedReplayBuffer(None, 30, storage=functools.partial(FrameStorage, stack_axis=0))
    restored.load_state_dict(torch.load(blob, weights_only=True))
    every = np.arange(len(buffer))
    ok = buffer.storage.sampleable(every)
    np.testing.assert_array_equal(buffer.storage.gather(every[ok])["obs"], restored.storage.gather(every[ok])["obs"])


def test_pipeline_checkpoint_state_refers_to_replay_directory(tmp_path):
    """The whole pipeline's state (what PipelineCheckpoint writes) holds the replay's path; it restores exactly."""
    from ptl_rl import BatchSampler, load_pipeline_state_dict, pipeline_state_dict

    buffer, _ = filled_buffer(tmp_path, False, checkpoint=True)
    pipeline = BatchSampler(buffer, batch_size=8)
    blob = tmp_path / "pipeline.pt"
    torch.save(pipeline_state_dict(pipeline), blob)
    assert os.path.getsize(blob) < 100_000
    env = make_env("NextStep")
    stream = NStepTransform(ExperienceSource(env, random_agent(3), seed=4), n=3, gamma=0.9)
    storage = functools.partial(FrameStorage, stack_axis=0)
    fresh = BatchSampler(PrioritizedReplayBuffer(stream, 30, warmup=10, seed=0, storage=storage), batch_size=8)
    load_pipeline_state_dict(fresh, torch.load(blob, weights_only=True))
    restored = fresh.upstream
    every = np.arange(len(buffer))
    ok = buffer.storage.sampleable(every)
    assert np.array_equal(ok, restored.storage.sampleable(every))
    np.testing.assert_array_equal(
        buffer.storage.gather(every[ok])["next_obs"], restored.storage.gather(every[ok])["next_obs"]
    )
    next(fresh)  # the restored pipeline keeps running: new episodes after the flushed windows


def test_errors_name_the_problem_and_the_fix():
    def rows(obs, next_obs=None):
        count = len(obs) if not isinstance(obs, dict) else len(obs["a"])
        return TransitionBatch(
            obs=obs, next_obs=obs if next_obs is None else next_obs, action=np.zeros(count),
            reward=np.zeros(count, np.float32), terminated=np.zeros(count, bool), truncated=np.zeros(count, bool),
            discount=np.ones(count, np.float32), env_id=np.arange(count),
        )  # fmt: skip

    with pytest.raises(ValueError, match="pass frame_key= naming the key"):
        FrameStorage(10).add(rows({"a": np.zeros((2, 3), np.uint8)}))
    with pytest.raises(ValueError, match="stack_axis=3 is not an axis.*FrameStackObservation"):
        FrameStorage(10, stack_axis=3).add(rows(np.zeros((2, 4, 5), np.uint8)))
    storage = FrameStorage(10, stack_axis=0)
    storage.add(rows(np.zeros((2, 4, 5), np.uint8)))
    with pytest.raises(ValueError, match=r"field 'next_obs' has shape \(2, 4, 6\).*one shape and dtype"):
        storage.add(rows(np.zeros((2, 4, 5), np.uint8), np.zeros((2, 4, 6), np.uint8)))
    with pytest.raises(ValueError, match="n_step must be an integer >= 1"):
        FrameStorage(10, n_step=0)


@pytest.mark.parametrize("n", [1, 3])
def test_recorded_trajectory_added_in_one_batch(n):
    """A whole recorded run (several episodes of each env in one batch, as offline data comes) is stored exactly."""
    env = make_env("SameStep", "zero")
    source = ExperienceSource(env, random_agent(3, 11), seed=5)
    recorded = TransitionBatch.concat([next(source) for _ in range(40)])
    nstep = NStepTransform(None, n=n, gamma=0.9)
    batch = TransitionBatch.concat([b for b in (nstep.fold(recorded), nstep.flush()) if b is not None])
    frames, twin = FrameStorage(500, stack_axis=0, n_step=n), ArrayStorage(500)
    frames.add(batch)
    twin.add(batch)
    every = np.arange(len(frames))
    ok = frames.sampleable(every)
    done = np.asarray(twin.gather(every)["terminated"] | twin.gather(every)["truncated"])
    assert ok[done].all() and ok.sum() >= len(every) - 3 * n  # only the newest n of each env wait
    mine, naive = frames.gather(every[ok]), twin.gather(every[ok])
    for name in naive.keys():
        np.testing.assert_array_equal(mine[name], naive[name], err_msg=name)
    check_against_reference(mine, reference(recorders(env), n, False), False)


# ---------------------------------------------------------------------- Dict observations
class DictObs(gym.ObservationWrapper):
    """``{"pixels": the stack, "state": a float vector of the newest frame's code}``: a pixel key and a plain key."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        state = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"pixels": env.observation_space, "state": state})

    def observation(self, obs):
        return {"pixels": obs, "state": state_of(obs)}


def state_of(pixels: np.ndarray) -> np.ndarray:
    code = newest_code(np.asarray(pixels), False).astype(np.float32)
    return np.stack([code, -0.5 * code], axis=-1)


def make_dict_env(mode: str, padding: str):
    fns = [
        lambda i=i, layout=layout: DictObs(make_stacked(i, layout, padding, False)) for i, layout in enumerate(LAYOUTS)
    ]
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize("n,padding,check", [(1, "reset", None), (3, "zero", None), (3, "reset", True)])
def test_dict_observations_match_env_record(mode, n, padding, check):
    """Dict obs: the pixel key is stored once per frame, the state key per transition; both exact, wrapping."""
    env = make_dict_env(mode, padding)
    rng = np.random.default_rng(0)
    agent = lambda obs: rng.integers(0, 5, size=len(obs["state"]))  # noqa: E731
    stream = NStepTransform(ExperienceSource(env, agent, seed=7), n=n, gamma=0.9)
    storage = functools.partial(FrameStorage, stack_axis=0, check=check)
    buffer = ReplayBuffer(stream, 23, warmup=8, seed=0, storage=storage)
    assert buffer.storage.trusted == (check is None) and buffer.storage.n_step == n
    twin = ArrayStorage(23)
    for _ in range(50):
        slots = buffer._pull()
        twin.add(buffer.storage._stream.noted[-1][0])  # the batch the buffer just stored
        assert buffer.storage.frame_key == "pixels"
        every = np.arange(len(buffer))
        ok = buffer.storage.sampleable(every)
        mine, naive = buffer.storage.gather(every[ok]), twin.gather(every[ok])
        assert set(mine["obs"]) == {"pixels", "state"} and len(slots) > 0
        for name in naive.keys():
            if isinstance(naive[name], dict):
                for key in naive[name]:
                    np.testing.assert_array_equal(mine[name][key], naive[name][key], err_msg=f"{name}.{key}")
            else:
                np.testing.assert_array_equal(mine[name], naive[name], err_msg=name)
        table = reference(recorders_of(env), n, False)
        check_against_reference({k: mine[k]["pixels"] for k in ("obs", "next_obs")}, table, False)
        np.testing.assert_array_equal(mine["next_obs"]["state"], state_of(mine["next_obs"]["pixels"]))
    assert buffer.storage.total_added > 2 * 23
    # the state key is a per-transition field; the pixels are frames in the pool
    assert set(buffer.storage._fields.fields["obs"]) == {"state"}
    sample = buffer.sample(16)
    np.testing.assert_array_equal(sample["obs"]["state"], state_of(sample["obs"]["pixels"]))


def recorders_of(env) -> list[StackRecorder]:
    return [e.env for e in env.envs]  # DictObs(StackRecorder(...))


def test_dict_observations_need_a_frame_key_when_ambiguous():
    two = {"a": np.zeros((2, 4, 5), np.uint8), "b": np.zeros((2, 4, 5), np.uint8)}
    batch = TransitionBatch(
        obs=two, next_obs=two, action=np.zeros(2), reward=np.zeros(2, np.float32), terminated=np.zeros(2, bool),
        truncated=np.zeros(2, bool), discount=np.ones(2, np.float32), env_id=np.arange(2),
    )  # fmt: skip
    with pytest.raises(ValueError, match="pass frame_key= naming the key"):
        FrameStorage(10, stack_axis=0).add(batch)
    with pytest.raises(ValueError, match="frame_key='c' is not a key"):
        FrameStorage(10, stack_axis=0, frame_key="c").add(batch)
    storage = FrameStorage(10, stack_axis=0, frame_key="b")
    storage.add(batch)
    assert set(storage._fields.fields["obs"]) == {"a"}


# ---------------------------------------------------------------------- trusted and checked inserts
def shifting_rows(steps, env: int = 0) -> TransitionBatch:
    """One row per step ``t`` of one env: obs is the stack of frames ``t-3 .. t`` (frame ``t``: 6 pixels of ``t``)."""
    stack = lambda t: np.stack([np.full(6, max(t - k, t // 100 * 100), np.uint8) for k in (3, 2, 1, 0)])  # noqa: E731
    return TransitionBatch(
        obs=np.stack([stack(t) for t in steps]), next_obs=np.stack([stack(t + 1) for t in steps]),
        action=np.zeros(len(steps)), reward=np.zeros(len(steps), np.float32),
        terminated=np.zeros(len(steps), bool), truncated=np.zeros(len(steps), bool),
        discount=np.ones(len(steps), np.float32), env_id=np.full(len(steps), env),
    )  # fmt: skip


def test_trusted_inserts_compare_again_after_a_cut_in_the_stream():
    """A numbered upstream lets the storage trust shifts; a skipped stream_seq (envs reset, no done) is compared."""

    class Numbered:  # an upstream as the storage sees it: n and the number of the batch just pulled
        n, stream_seq = 1, 0

    upstream = Numbered()
    storage = FrameStorage(50, stack_axis=0)
    storage.bind_upstream(upstream)
    assert storage.trusted and not FrameStorage(50).trusted  # (no numbered upstream: compared)
    added = []
    for seq, t in enumerate([*range(0, 10), *range(200, 205)], start=1):
        upstream.stream_seq = seq if t < 200 else seq + 1  # a batch lost between t=9 and t=200
        batch = shifting_rows([t])
        storage.add(batch)
        added.append(batch)
    every = np.arange(len(storage))
    ok = storage.sampleable(every)
    assert ok.sum() == len(every) - 1  # t=9 took the next_obs its own batch carried at the cut; t=204 waits
    everything = TransitionBatch.concat(added)
    np.testing.assert_array_equal(storage.gather(every[ok])["obs"], everything["obs"][ok])
    np.testing.assert_array_equal(storage.gather(every[ok])["next_obs"], everything["next_obs"][ok])
    # one frame a start (its padding repeats it), one a step, and t=9's own next_obs frame at the cut
    assert storage.frames_written == 1 + 9 + 1 + 1 + 4


def test_wrong_n_step_against_a_numbered_upstream_is_refused():
    class Numbered:
        n, stream_seq = 3, 0

    with pytest.raises(ValueError, match="n_step=1 but its upstream emits 3-step"):
        ReplayBuffer(Numbered(), 10, storage=functools.partial(FrameStorage, n_step=1))


COMPILED = [False, pytest.param(True, marks=pytest.mark.skipif(_frame_insert is None, reason="not built"))]


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("compiled", COMPILED)
def test_peeking_at_the_upstream_leaves_no_dead_slots(mode, n, compiled):
    """next() on the n-step stage between the buffer's pulls (a notebook peek) cuts the streams; stored rows stay.

    The transitions that waited for a later observation as next_obs when the
    cut came take the one their own batch carried: every stored transition is
    sampleable except the newest ones of each env, which wait for theirs.
    """
    env = make_env(mode)
    stream = NStepTransform(ExperienceSource(env, random_agent(3, 4), seed=3), n=n, gamma=0.9)
    storage = functools.partial(FrameStorage, stack_axis=0)
    buffer = ReplayBuffer(stream, 400, warmup=0, transitions_per_yield=1, seed=0, storage=storage)
    buffer.storage.compiled = compiled  # the rows the compiled insert adds must be resolved at a cut as well
    rng = np.random.default_rng(n)
    peeks = 0
    for _ in range(120):
        if rng.random() < 0.3:
            next(stream)  # the user looks at a batch: the buffer never sees it
            peeks += 1
        else:
            next(buffer)
    every = np.arange(len(buffer))
    ok = buffer.storage.sampleable(every)
    assert peeks > 20 and len(buffer) > 60
    assert len(every) - ok.sum() <= env.num_envs * n  # only the newest rows of each env wait for next_obs
    check_against_reference(buffer.storage.gather(every[ok]), reference(recorders(env), n, False), False)


@pytest.mark.parametrize("copy", ["pickle", "deepcopy"])
@pytest.mark.parametrize("compiled", COMPILED)
def test_a_copied_storage_continues_like_the_original(copy, compiled):
    """A storage pickled or deep-copied mid-stream takes the same adds as the original and stores the same.

    The per-env state is one array with column views: a copy must make the views of its own array (pickled
    one by one, each view would come back as a separate array, and the Python path would write the state
    into arrays the copy no longer reads).
    """
    import copy as copying
    import pickle

    env = make_env("NextStep")
    stream = NStepTransform(ExperienceSource(env, random_agent(3, 5), seed=5), n=3, gamma=0.9)
    batches = [next(stream) for _ in range(60)]
    storage = FrameStorage(40, stack_axis=0, n_step=3, extra_frames=200, check=True)
    storage.compiled = compiled
    for b in batches[:30]:
        storage.add(b)
    twin = pickle.loads(pickle.dumps(storage)) if copy == "pickle" else copying.deepcopy(storage)
    envs = twin._envs
    assert np.shares_memory(envs.state.recent, envs.state.array) and np.shares_memory(envs.spare.head, envs.spare.array)
    for b in batches[30:]:
        np.testing.assert_array_equal(twin.add(b), storage.add(b))
    every = np.arange(len(storage))
    ok = storage.sampleable(every)
    np.testing.assert_array_equal(twin.sampleable(every), ok)
    mine, theirs = twin.gather(every[ok]), storage.gather(every[ok])
    for name in theirs.keys():
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)
    check_against_reference(mine, reference(recorders(env), 3, False), False)

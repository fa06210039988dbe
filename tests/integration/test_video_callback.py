"""EvaluationVideo inside a Lightning fit: files and frame counts, greedy episodes from a fixed seed, TensorBoard,
checkpoints, errors before training, and training left exactly as it is whether videos are off, on or absent."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from videos import RenderSpy, assert_same_frames, decode_gif, decode_mp4, play_by_hand

import ptl_rl
from ptl_rl.lightning.video_recording import video_name
from ptl_rl.video import gif_frame_ms

pytest.importorskip("imageio_ffmpeg", reason="the video extra: pip install -e '.[video]'")
pytest.importorskip("PIL", reason="the video extra: pip install -e '.[video]'")
pytest.importorskip("pygame", reason="CartPole renders with pygame: pip install -e '.[video]'")


def build(seed: int = 0):
    """A DQN pipeline on 2 CartPole sub-envs, each wrapped in a RenderSpy: the training envs must never render."""
    spies: list[RenderSpy] = []

    def make() -> gym.Env:
        spies.append(RenderSpy(gym.make("CartPole-v1")))
        return spies[-1]

    env = gym.vector.SyncVectorEnv([make, make])
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    agent = ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=seed))
    source = ptl_rl.ExperienceSource(env, agent, seed=seed)
    buffer = ptl_rl.ReplayBuffer(ptl_rl.NStepTransform(source, n=2, gamma=0.9), 500, warmup=32, seed=seed)
    return net, ptl_rl.BatchSampler(buffer, 16), spies


def q_module(L, net):  # noqa: N803
    class QModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.seen = net, []

        def training_step(self, batch, batch_idx):
            self.seen.append(batch.obs.clone())
            q = self.net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
            with torch.no_grad():
                target = batch.reward + batch.discount * (~batch.terminated) * self.net(batch.next_obs).max(1).values
            return F.smooth_l1_loss(q, target)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    return QModule()


def greedy(module) -> ptl_rl.DQNAgent:
    return ptl_rl.DQNAgent(module.net, ptl_rl.ArgmaxSelector())


def video_env() -> RenderSpy:
    return RenderSpy(gym.make("CartPole-v1", render_mode="rgb_array"))


def fit(L, module, sampler, callbacks, max_steps: int, **kwargs):  # noqa: N803
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer = L.Trainer(max_steps=max_steps, enable_model_summary=False, callbacks=callbacks, **{**options, **kwargs})
    trainer.fit(module, train_dataloaders=ptl_rl.to_dataloader(sampler, steps_per_epoch=1_000))
    return trainer


def env_step_counts(L, sampler):  # noqa: N803
    """A callback that notes the source's env-step count at every batch end (``counts``)."""
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)

    class Counts(L.Callback):
        counts: list[int] = []

        def on_train_batch_end(self, *args) -> None:
            self.counts.append(source.total_steps)

    return Counts()


def test_videos_every_n_env_steps_hold_one_frame_per_step_plus_the_reset_frame(L, tmp_path) -> None:
    net, sampler, _ = build()
    env = video_env()
    recorder = ptl_rl.EvaluationVideo(sampler, env, greedy, every_env_steps=20, episodes=2, directory=tmp_path, seed=7)
    counts = env_step_counts(L, sampler)
    fit(L, q_module(L, net), sampler, [counts, recorder], max_steps=40)

    steps = [entry["env_steps"] for entry in recorder.recordings]
    # at the first batch end at or past each multiple of 20 env steps, then the final weights when training ends
    multiples = range(20, counts.counts[-1] + 1, 20)
    expected = sorted({next(c for c in counts.counts if c >= m) for m in multiples})
    assert len(expected) >= 2 and steps == [*expected, counts.counts[-1]]
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == sorted(video_name(s, i, "mp4") for s in steps for i in range(2))
    for entry in recorder.recordings:
        for path, length in zip(entry["paths"], entry["lengths"], strict=True):
            decoded = decode_mp4(path)
            assert decoded.shape == (length + 1, 400, 600, 3)
    # frames rendered: one per step plus each reset frame, plus the one frame checked when fit started
    lengths = [length for entry in recorder.recordings for length in entry["lengths"]]
    assert env.renders == sum(lengths) + len(lengths) + 1

    # the last recording is the greedy policy of the final weights from reset(seed=7): played again by hand
    frames, ret = play_by_hand(
        gym.make("CartPole-v1", render_mode="rgb_array"), lambda obs: int(net(torch.as_tensor(obs)).argmax()), seed=7
    )
    assert recorder.recordings[-1]["returns"][0] == ret
    assert_same_frames(decode_mp4(recorder.recordings[-1]["paths"][0]), frames)


def test_every_recording_starts_from_the_same_seed(L, tmp_path) -> None:
    net, sampler, _ = build()
    push_left = lambda module: lambda obs: np.zeros(len(obs), dtype=np.int64)  # noqa: E731 - the weights play no part
    recorder = ptl_rl.EvaluationVideo(
        sampler, video_env(), push_left, every_env_steps=30, directory=tmp_path, video_format="gif", seed=3
    )
    fit(L, q_module(L, net), sampler, [recorder], max_steps=30)
    files = [entry["paths"][0] for entry in recorder.recordings]
    assert len(files) >= 2 and all(name.endswith(".gif") for name in files)
    contents = {open(name, "rb").read() for name in files}
    assert len(contents) == 1, "the same start state and actions: the same video every time"
    (length,) = {entry["lengths"][0] for entry in recorder.recordings}
    _, delays = decode_gif(files[0])
    assert sum(delays) == (length + 1) * gif_frame_ms(50)  # CartPole's render_fps is 50


@pytest.mark.parametrize("mode", ["absent", "off", "on"])
def test_training_is_the_same_with_videos_absent_off_or_on(L, mode, tmp_path) -> None:
    """The same batches and weights in all three cases; the training envs never render, the video env only when on."""
    reference_net, reference_sampler, _ = build()
    reference = q_module(L, reference_net)
    fit(L, reference, reference_sampler, [], max_steps=30)

    net, sampler, spies = build()
    module, env = q_module(L, net), video_env()
    callbacks = []
    if mode != "absent":
        every, at_end = (20, True) if mode == "on" else (0, False)
        recorder = ptl_rl.EvaluationVideo(
            sampler, env, greedy, every_env_steps=every, at_train_end=at_end, directory=tmp_path
        )
        callbacks.append(recorder)
    fit(L, module, sampler, callbacks, max_steps=30)

    assert len(module.seen) == len(reference.seen) == 30
    assert all(torch.equal(a, b) for a, b in zip(module.seen, reference.seen, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), reference_net.parameters(), strict=True))
    assert len(spies) == 2 and all(spy.renders == 0 for spy in spies)
    if mode == "on":
        assert len(recorder.recordings) >= 2 and env.renders > 0
    else:
        assert env.renders == 0 and not list(tmp_path.iterdir())


def test_tensorboard_gets_each_recording_as_a_gif_at_its_env_step(L, tmp_path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    net, sampler, _ = build()
    logger = L.loggers.TensorBoardLogger(tmp_path, name="tb", version="")
    recorder = ptl_rl.EvaluationVideo(sampler, video_env(), greedy, every_env_steps=40)
    fit(L, q_module(L, net), sampler, [recorder], max_steps=40, logger=logger)
    assert all(path.startswith(str(tmp_path / "tb" / "videos")) for e in recorder.recordings for path in e["paths"])

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("video/episode_0")
    assert [image.step for image in images] == [entry["env_steps"] for entry in recorder.recordings]
    for image, entry in zip(images, recorder.recordings, strict=True):
        assert (image.width, image.height) == (600, 400)
        frames, delays = decode_gif(image.encoded_image_string)
        assert frames[0].shape == (400, 600, 3) and sum(delays) == (entry["lengths"][0] + 1) * gif_frame_ms(50)


def test_the_recording_rhythm_and_list_survive_a_resume(L, tmp_path) -> None:
    net, sampler, _ = build()
    # no recording at the end: the checkpoint is written before it, at the last step
    recorder = ptl_rl.EvaluationVideo(
        sampler, video_env(), greedy, every_env_steps=20, directory=tmp_path / "v", at_train_end=False
    )
    checkpoints = L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    fit(L, q_module(L, net), sampler, [recorder, ptl_rl.PipelineCheckpoint(sampler), checkpoints], 40,
        enable_checkpointing=True)  # fmt: skip
    saved, next_record = [dict(entry) for entry in recorder.recordings], recorder.next_record
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)  # plain containers only
    (state,) = [value for key, value in checkpoint["callbacks"].items() if key.startswith("EvaluationVideo")]
    assert state["next_record"] == next_record and state["recordings"] == saved

    net2, sampler2, _ = build(seed=1)
    resumed = ptl_rl.EvaluationVideo(
        sampler2, video_env(), greedy, every_env_steps=20, directory=tmp_path / "v", at_train_end=False
    )
    assert resumed.next_record == 20 and not resumed.recordings
    trainer = L.Trainer(
        max_steps=80, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[resumed, ptl_rl.PipelineCheckpoint(sampler2)],
    )  # fmt: skip
    loader = ptl_rl.to_dataloader(sampler2, steps_per_epoch=1_000)
    trainer.fit(q_module(L, net2), train_dataloaders=loader, ckpt_path=tmp_path / "last.ckpt")
    assert len(saved) >= 2 and resumed.recordings[: len(saved)] == saved
    later = [entry["env_steps"] for entry in resumed.recordings[len(saved) :]]
    assert later and later[0] >= next_record and later == sorted(later)


class NoRenderer(gym.Wrapper):
    """CartPole whose renderer is missing, as without pygame."""

    def render(self):
        raise gym.error.DependencyNotInstalled(
            'pygame is not installed, run `pip install "gymnasium[classic-control]"`'
        )


def test_an_env_that_cannot_render_fails_when_fit_starts_not_at_the_first_recording(L, tmp_path) -> None:
    net, sampler, _ = build()
    module = q_module(L, net)
    env = NoRenderer(gym.make("CartPole-v1", render_mode="rgb_array"))
    recorder = ptl_rl.EvaluationVideo(sampler, env, greedy, every_env_steps=10_000, directory=tmp_path)
    with pytest.raises(gym.error.DependencyNotInstalled, match="classic-control"):
        fit(L, module, sampler, [recorder], max_steps=5)
    assert not module.seen


def test_bad_arguments_are_refused_when_the_callback_is_built(monkeypatch) -> None:
    _, sampler, _ = build()
    env = video_env()
    with pytest.raises(ValueError, match=r"render_mode=None; make it with gym.make\(env_id, render_mode='rgb_array'\)"):
        ptl_rl.EvaluationVideo(sampler, gym.make("CartPole-v1"), greedy, every_env_steps=10)
    vector = gym.make_vec("CartPole-v1", num_envs=2, render_mode="rgb_array")
    with pytest.raises(ValueError, match="from a single env, got a vector env"):
        ptl_rl.EvaluationVideo(sampler, vector, greedy, every_env_steps=10)
    with pytest.raises(ValueError, match=r"video_format must be one of \('mp4', 'gif'\)"):
        ptl_rl.EvaluationVideo(sampler, env, greedy, every_env_steps=10, video_format="avi")
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        ptl_rl.EvaluationVideo(sampler, env, greedy, every_env_steps=10, episodes=0)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else real(name))
    with pytest.raises(ImportError, match=r"needs imageio-ffmpeg; pip install \"ptl_rl\[video\]\""):
        ptl_rl.EvaluationVideo(sampler, env, greedy, every_env_steps=10)
    ptl_rl.EvaluationVideo(sampler, env, greedy, every_env_steps=10, video_format="gif")  # GIFs need pillow only

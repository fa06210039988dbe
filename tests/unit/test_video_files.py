"""Video files and recorded episodes: MP4/GIF written and decoded back, frame counts, renders, errors naming the fix."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from videos import assert_same_frames, decode_gif, decode_mp4

import ptl_rl
from ptl_rl import video
from ptl_rl.lightning.video_recording import check_video_env

imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg", reason="the video extra: pip install -e '.[video]'")
pytest.importorskip("PIL", reason="the video extra: pip install -e '.[video]'")


def moving_square(frames: int, height: int, width: int) -> np.ndarray:
    """uint8 [frames, height, width, 3]: a white square moving right one pixel per frame on a dark background."""
    video_frames = np.full((frames, height, width, 3), 30, dtype=np.uint8)
    for t in range(frames):
        video_frames[t, 4:12, t % (width - 8) : t % (width - 8) + 8] = 255
    return video_frames


def push_left(obs: np.ndarray) -> np.ndarray:
    return np.zeros(len(obs), dtype=np.int64)


@pytest.mark.parametrize(("height", "width"), [(48, 64), (37, 51)])
def test_mp4_holds_every_frame_at_the_asked_rate(tmp_path, height, width) -> None:
    frames = moving_square(23, height, width)
    path = ptl_rl.write_video(tmp_path / "clip.mp4", frames, fps=25)
    decoded = decode_mp4(path)
    # odd sizes gain one repeated row/column (H.264 4:2:0 needs even sizes); nothing is rescaled
    expected = np.pad(frames, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)), mode="edge")
    assert decoded.shape == (23, height + height % 2, width + width % 2, 3)
    assert_same_frames(decoded, expected)
    count, seconds = imageio_ffmpeg.count_frames_and_secs(str(path))
    assert count == 23 and seconds == pytest.approx(23 / 25, abs=0.05)


def test_gif_duration_is_exact_and_identical_frames_merge(tmp_path) -> None:
    frames = moving_square(12, 20, 30)
    frames[5] = frames[4]  # Pillow merges identical neighbours into one longer frame
    path = ptl_rl.write_video(tmp_path / "clip.gif", frames, fps=50)
    decoded, delays = decode_gif(path)
    assert len(decoded) == 11 and delays[4] == 40 and sum(delays) == 12 * 20
    expanded = [frame for frame, delay in zip(decoded, delays, strict=True) for _ in range(delay // 20)]
    np.testing.assert_array_equal(np.stack(expanded), frames)  # two colours: the palette is exact


@pytest.mark.parametrize(("fps", "ms"), [(50, 20), (30, 30), (25, 40), (60, 20), (1000, 20), (7, 140)])
def test_gif_frame_delay_is_a_multiple_of_10_ms_and_at_least_20(fps, ms) -> None:
    assert video.gif_frame_ms(fps) == ms


def test_write_video_refuses_what_it_cannot_write(tmp_path) -> None:
    frames = moving_square(3, 16, 16)
    with pytest.raises(ValueError, match=r"unknown video format 'avi'; expected one of \('mp4', 'gif'\)"):
        ptl_rl.write_video(tmp_path / "clip.avi", frames, fps=10)
    with pytest.raises(ValueError, match=r"RGB frames \[T, H, W, 3\], got an array of shape \(3, 16, 16\)"):
        ptl_rl.write_video(tmp_path / "clip.mp4", frames[..., 0], fps=10)
    with pytest.raises(ValueError, match="must be uint8"):
        ptl_rl.write_video(tmp_path / "clip.mp4", frames.astype(np.float32), fps=10)
    with pytest.raises(ValueError, match="one shape"):
        ptl_rl.write_video(tmp_path / "clip.gif", [frames[0], frames[0, :8]], fps=10)
    with pytest.raises(ValueError, match="fps must be > 0"):
        ptl_rl.write_video(tmp_path / "clip.gif", frames, fps=0)
    assert not list(tmp_path.iterdir())


def test_a_missing_writer_names_the_video_extra(tmp_path, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else real(name))
    assert video.missing_video_packages("mp4") == ["imageio-ffmpeg"] and video.missing_video_packages("gif") == []
    with pytest.raises(ImportError, match=r"writing MP4 videos needs imageio-ffmpeg; pip install \"ptl_rl\[video\]\""):
        ptl_rl.write_video(tmp_path / "clip.mp4", moving_square(2, 16, 16), fps=10)


# ---------------------------------------------------------------------- recorded episodes
def hand_recording(env: gym.Env, seed: int, episodes: int) -> list[tuple[np.ndarray, float]]:
    """The reference: reset, render, then step and render until each episode ends, acting as push_left does."""
    recorded = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed if k == 0 else None)
        frames, ret, done = [env.render()], 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(push_left(obs[None])[0]))
            frames.append(env.render())
            ret, done = ret + float(reward), terminated or truncated
        recorded.append((np.stack(frames), ret))
    return recorded


def test_cartpole_episodes_have_one_frame_per_step_plus_the_reset_frame() -> None:
    pytest.importorskip("pygame", reason="CartPole renders with pygame: pip install -e '.[video]'")
    env = gym.make("CartPole-v1", render_mode="rgb_array")
    recorded = ptl_rl.record_episodes(env, push_left, episodes=3, seed=5)
    reference = hand_recording(gym.make("CartPole-v1", render_mode="rgb_array"), seed=5, episodes=3)
    assert [e.length for e in recorded] == [len(frames) - 1 for frames, _ in reference]
    for episode, (frames, ret) in zip(recorded, reference, strict=True):
        assert episode.frames.shape == (episode.length + 1, 400, 600, 3) and episode.frames.dtype == np.uint8
        np.testing.assert_array_equal(episode.frames, frames)
        assert episode.ret == ret
    again = ptl_rl.record_episodes(env, push_left, episodes=3, seed=5)  # same seed, same agent: the same video
    assert all(np.array_equal(a.frames, b.frames) for a, b in zip(recorded, again, strict=True))


def test_an_atari_episode_written_as_mp4_decodes_to_length_plus_one_frames(tmp_path) -> None:
    ale_py = pytest.importorskip("ale_py", reason="the atari extra")
    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", render_mode="rgb_array", max_episode_steps=40)  # cut short: cheap
    (episode,) = ptl_rl.record_episodes(env, push_left, episodes=1, seed=0)
    assert episode.length == 40 and episode.frames.shape == (41, 210, 160, 3)
    decoded = decode_mp4(ptl_rl.write_video(tmp_path / "pong.mp4", episode.frames, fps=30))
    assert decoded.shape == (41, 210, 160, 3)
    assert_same_frames(decoded, episode.frames)


def test_the_video_env_must_be_a_single_env_rendering_rgb_arrays() -> None:
    with pytest.raises(ValueError, match=r"render_mode=None; make it with gym.make\(env_id, render_mode='rgb_array'\)"):
        check_video_env(gym.make("CartPole-v1"))
    vector = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", render_mode="rgb_array")
    with pytest.raises(ValueError, match="recorded from a single env, got a vector env"):
        ptl_rl.record_episodes(vector, push_left)


@pytest.mark.parametrize(
    ("platform", "environ", "driver"),
    [
        ("linux", {}, "dummy"),  # a server: off-screen, and no "XDG_RUNTIME_DIR is invalid" from SDL
        ("linux", {"DISPLAY": ":0"}, None),
        ("linux", {"WAYLAND_DISPLAY": "wayland-0"}, None),
        ("linux", {"SDL_VIDEODRIVER": "x11"}, "x11"),  # the user's choice stays
        ("darwin", {}, None),  # macOS has no DISPLAY variable but can open windows
    ],
)
def test_sdl_renders_off_screen_only_where_no_display_exists(monkeypatch, platform, environ, driver) -> None:
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(video.sys, "platform", platform)
    video.quiet_headless_sdl()
    assert video.os.environ.get("SDL_VIDEODRIVER") == driver

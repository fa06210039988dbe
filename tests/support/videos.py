"""Reading videos back independently of ptl_rl's writers, counting renders, and a hand-played reference episode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np


def decode_mp4(path: str | Path) -> np.ndarray:
    """Every frame of an MP4 (uint8 [T, H, W, 3]), decoded by ffmpeg."""
    import imageio_ffmpeg  # noqa: PLC0415 - the video extra

    reader = imageio_ffmpeg.read_frames(str(path))
    width, height = next(reader)["size"]
    return np.stack([np.frombuffer(raw, np.uint8).reshape(height, width, 3) for raw in reader])


def decode_gif(data: str | Path | bytes) -> tuple[list[np.ndarray], list[int]]:
    """The frames (RGB uint8 [H, W, 3]) of a GIF file or its bytes, and each frame's delay in ms."""
    import io  # noqa: PLC0415

    from PIL import Image, ImageSequence  # noqa: PLC0415 - the video extra

    source = io.BytesIO(data) if isinstance(data, bytes) else data
    with Image.open(source) as gif:
        pairs = [(np.asarray(frame.convert("RGB")), frame.info["duration"]) for frame in ImageSequence.Iterator(gif)]
    return [frame for frame, _ in pairs], [delay for _, delay in pairs]


def assert_same_frames(decoded: np.ndarray, originals: np.ndarray) -> None:
    """Lossy (H.264) but the same pictures, in the same order: each decoded frame is nearest its own original."""
    assert decoded.shape == originals.shape, (decoded.shape, originals.shape)
    flat_decoded = decoded.reshape(len(decoded), -1).astype(np.int16)
    flat_originals = originals.reshape(len(originals), -1).astype(np.int16)
    errors = np.stack([np.abs(flat_originals - frame).mean(axis=1) for frame in flat_decoded])  # [decoded, original]
    assert np.diag(errors).mean() < 2, f"mean absolute error {np.diag(errors).mean():.2f} of 255"
    assert np.all(np.diag(errors) <= errors.min(axis=1) + 1e-9), "a decoded frame is nearer another original"


class RenderSpy(gym.Wrapper):
    """Counts ``render`` calls of the env it wraps (``renders``), passing them on."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.renders = 0

    def render(self) -> Any:
        self.renders += 1
        return self.env.render()


def play_by_hand(env: gym.Env, act: Any, seed: int) -> tuple[np.ndarray, float]:
    """One episode from ``env.reset(seed=seed)``, ``act(obs) -> action``, rendered after the reset and every step."""
    obs, _ = env.reset(seed=seed)
    frames, ret, done = [env.render()], 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(act(obs))
        frames.append(env.render())
        ret, done = ret + float(reward), terminated or truncated
    return np.stack(frames), ret

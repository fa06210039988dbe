"""Video files from ``rgb_array`` frames: MP4 (H.264), GIF, and GIFs in TensorBoard.

Frames are what ``env.render()`` returns for an env made with
``render_mode="rgb_array"``: uint8 arrays ``[H, W, 3]``. A video is a
sequence of them, ``[T, H, W, 3]``. This module only writes them; recording
them from an agent is :mod:`ptl_rl.lightning.video_recording`.

The writers need the ``video`` extra (``imageio-ffmpeg``, which ships its own
ffmpeg binary, for MP4; ``pillow`` for GIF). Nothing here imports torch or
Lightning, so a command line can check what is installed before it loads them.

GIF notes: a GIF stores delays in hundredths of a second, and browsers slow
down delays under 20 ms, so a GIF plays at ``100 / round(100 / fps)`` frames
per second, at most 50. Pillow merges identical consecutive frames into one
longer frame, so a GIF may hold fewer frames than it was given; its duration
is exact (``T`` times the frame delay).
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: the formats :func:`write_video` writes, by file suffix
VIDEO_FORMATS = ("mp4", "gif")

#: how to install what the video writers need, named by every error about them
VIDEO_INSTALL = 'pip install "ptl_rl[video]" (from a clone: pip install -c constraints.txt -e ".[video]")'

# format -> (module to import, package to install)
_NEEDS = {"mp4": ("imageio_ffmpeg", "imageio-ffmpeg"), "gif": ("PIL", "pillow")}


def missing_video_packages(video_format: str) -> list[str]:
    """The packages (pip names) that writing ``video_format`` (``"mp4"`` or ``"gif"``) needs and are not installed."""
    module, package = _NEEDS[_checked_format(video_format)]
    return [] if importlib.util.find_spec(module) is not None else [package]


def check_video_packages(video_format: str) -> None:
    """An ``ImportError`` naming the missing packages and the ``video`` extra unless ``video_format`` can be written."""
    missing = missing_video_packages(video_format)
    if missing:
        raise ImportError(f"writing {video_format.upper()} videos needs {', '.join(missing)}; {VIDEO_INSTALL}")


def quiet_headless_sdl() -> None:
    """On Linux without a display, set ``SDL_VIDEODRIVER=dummy`` (unless set): pygame then renders off-screen quietly.

    A program's choice, which ptl_rl never makes for it (the library does not write ``os.environ``): the
    examples call it at start; call it (or set the variable) before rendering on a headless machine to
    silence SDL's message.

    gymnasium's classic-control renderers start pygame's display even for
    ``rgb_array`` frames; with no display, SDL prints "error: XDG_RUNTIME_DIR
    is invalid or not set in the environment" at the first render. Where no
    display exists no window can open either, so the dummy driver changes
    nothing else. With ``DISPLAY`` or ``WAYLAND_DISPLAY`` set, on other systems
    or with ``SDL_VIDEODRIVER`` set already, nothing is changed.
    """
    if not sys.platform.startswith("linux") or "SDL_VIDEODRIVER" in os.environ:
        return
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ["SDL_VIDEODRIVER"] = "dummy"


def _checked_format(video_format: str) -> str:
    if video_format not in VIDEO_FORMATS:
        raise ValueError(f"unknown video format {video_format!r}; expected one of {VIDEO_FORMATS}")
    return video_format


def as_frames(frames: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """``frames`` as one uint8 array ``[T, H, W, 3]``, or a ``ValueError`` saying what is wrong with them."""
    if not isinstance(frames, np.ndarray):
        shapes = {np.shape(frame) for frame in frames}
        if len(shapes) > 1:
            raise ValueError(f"all frames of a video must have one shape, got {sorted(shapes)}")
        frames = np.stack(list(frames)) if shapes else np.zeros((0, 0, 0, 3), dtype=np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(
            f"a video is RGB frames [T, H, W, 3], got an array of shape {frames.shape}; env.render() returns "
            "such frames for an env made with render_mode='rgb_array'"
        )
    if frames.dtype != np.uint8:
        raise ValueError(f"video frames must be uint8 (0-255), got {frames.dtype}; convert them with .astype(np.uint8)")
    if len(frames) == 0:
        raise ValueError("a video needs at least one frame, got none")
    return frames


def gif_frame_ms(fps: float) -> int:
    """Milliseconds each GIF frame shows at ``fps``: a multiple of 10 ms (the GIF unit), at least 20 ms."""
    if not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    return 10 * max(2, round(100 / fps))


def gif_bytes(frames: np.ndarray | Sequence[np.ndarray], fps: float) -> bytes:
    """An animated GIF (looping) of ``frames`` (uint8 ``[T, H, W, 3]``), each shown :func:`gif_frame_ms` ms."""
    check_video_packages("gif")
    from PIL import Image  # noqa: PLC0415 - the video extra is optional

    frames = as_frames(frames)
    images = [Image.fromarray(frame) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=gif_frame_ms(fps), loop=0)
    return buffer.getvalue()


def _even(frames: np.ndarray) -> np.ndarray:
    """``frames`` padded by repeating their last row/column to even height and width (H.264's 4:2:0 needs both)."""
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if not (pad_h or pad_w):
        return frames
    return np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")


def write_mp4(path: str | Path, frames: np.ndarray | Sequence[np.ndarray], fps: float) -> Path:
    """Write ``frames`` (uint8 ``[T, H, W, 3]``) as an H.264 MP4 of exactly ``T`` frames at ``fps``.

    Odd heights or widths are padded by one repeated row or column (H.264 in
    the yuv420p pixel format every player reads needs even sizes); frames are
    never rescaled.
    """
    check_video_packages("mp4")
    import imageio_ffmpeg  # noqa: PLC0415 - the video extra is optional

    frames = _even(as_frames(frames))
    path = Path(path)
    _, height, width, _ = frames.shape
    writer = imageio_ffmpeg.write_frames(
        str(path), (width, height), fps=float(fps), codec="libx264", macro_block_size=1, ffmpeg_log_level="error"
    )
    writer.send(None)  # starts ffmpeg
    try:
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()
    return path


def write_video(path: str | Path, frames: np.ndarray | Sequence[np.ndarray], fps: float) -> Path:
    """Write ``frames`` (uint8 ``[T, H, W, 3]``) to ``path``, an ``.mp4`` or a ``.gif`` file; returns the path.

    MP4 holds exactly the ``T`` frames at ``fps``; GIF plays at most 50 frames
    per second and merges identical consecutive frames (see the module notes).
    The parent directory is created if missing.
    """
    path = Path(path)
    video_format = _checked_format(path.suffix.lower().lstrip("."))
    if not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if video_format == "mp4":
        return write_mp4(path, frames, fps)
    path.write_bytes(gif_bytes(frames, fps))
    return path


def add_tensorboard_video(writer: Any, tag: str, frames: np.ndarray, fps: float, step: int) -> None:
    """Write ``frames`` to a ``torch.utils.tensorboard.SummaryWriter`` as ``tag`` at ``step``: an animated GIF.

    This is the summary ``SummaryWriter.add_video`` writes (an image summary
    whose image is a GIF, shown by TensorBoard's Images tab), encoded here
    with Pillow: ``add_video`` needs moviepy 1.x (``moviepy.editor``, gone in
    moviepy 2), and prints a line instead of raising when it is missing.
    """
    from tensorboard.compat.proto.summary_pb2 import Summary  # noqa: PLC0415 - tensorboard is optional

    frames = as_frames(frames)
    _, height, width, channels = frames.shape
    image = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=gif_bytes(frames, fps))
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), global_step=step)

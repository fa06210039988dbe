"""Videos of the agent: greedy episodes in a separate evaluation env, rendered frame by frame, during training.

Frames are rendered only here, in an env made for it with
``render_mode="rgb_array"``: the training envs never render, and nothing is
rendered while no recording is due. A recorded episode of ``L`` steps has
``L + 1`` frames: the frame after ``reset`` and one after every step (the
convention of gymnasium's ``RecordVideo``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ptl_rl.core.chain import find_episode_source
from ptl_rl.core.protocols import Agent, EpisodeCounter, Pipeline
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.evaluation import run_episodes
from ptl_rl.lightning._compat import LIGHTNING_PACKAGES, ModuleLike, TrainerLike
from ptl_rl.lightning.stops import PipelineCallback, global_env_steps
from ptl_rl.video import (
    VIDEO_FORMATS,
    add_tensorboard_video,
    as_frames,
    check_video_packages,
    write_video,
)

#: frames per second of a video when neither the caller nor the env's ``metadata["render_fps"]`` says
DEFAULT_FPS = 30


@dataclass(frozen=True)
class RecordedEpisode:
    """One recorded episode: ``frames`` uint8 ``[length + 1, H, W, 3]`` (reset frame first), its return and length."""

    frames: np.ndarray
    ret: float
    length: int


class _FrameCapture(gym.Wrapper):
    """Renders after every ``reset`` and ``step`` of the first ``episodes`` episodes; one frame list per episode.

    The source resets the env as soon as an episode ends; the reset after the
    last wanted episode is not rendered (that episode is never played).
    """

    def __init__(self, env: gym.Env, episodes: int) -> None:
        super().__init__(env)
        self.wanted = int(episodes)
        self.episodes: list[list[np.ndarray]] = []
        self._capturing = False

    def reset(self, **kwargs: Any) -> Any:
        result = self.env.reset(**kwargs)
        self._capturing = len(self.episodes) < self.wanted
        if self._capturing:
            self.episodes.append([self._frame()])
        return result

    def step(self, action: Any) -> Any:
        result = self.env.step(action)
        if self._capturing:
            self.episodes[-1].append(self._frame())
        return result

    def _frame(self) -> np.ndarray:
        return render_frame(self.env)


def render_frame(env: gym.Env) -> np.ndarray:
    """``env.render()``, checked to be an RGB frame (uint8 ``[H, W, 3]``)."""
    frame = env.render()
    if not isinstance(frame, np.ndarray):
        raise TypeError(
            f"env.render() returned {type(frame).__name__}, not an rgb_array frame; make the env with "
            "render_mode='rgb_array', e.g. gym.make(env_id, render_mode='rgb_array')"
        )
    as_frames(frame[None])  # the shape and dtype of a video frame, or an error saying which
    return frame


def check_video_env(env: object) -> None:
    """Raise a ``ValueError`` naming the fix unless ``env`` is a single env that renders ``rgb_array`` frames."""
    if isinstance(env, gym.vector.VectorEnv) or hasattr(env, "num_envs"):
        raise ValueError(
            f"a video is recorded from a single env, got a vector env ({type(env).__name__}); pass one env made "
            "with gym.make(env_id, render_mode='rgb_array')"
        )
    mode = getattr(env, "render_mode", None)
    if mode != "rgb_array":
        raise ValueError(
            f"the video env has render_mode={mode!r}; make it with gym.make(env_id, render_mode='rgb_array') "
            "(a separate env from the training env, which never renders)"
        )


def record_episodes(env: gym.Env, agent: Agent, episodes: int = 1, seed: int | None = None) -> list[RecordedEpisode]:
    """Play ``episodes`` whole episodes of ``agent`` in ``env`` and return them with their frames.

    ``env`` is a single env made with ``render_mode="rgb_array"``; ``agent``
    acts as in :class:`~ptl_rl.stages.source.ExperienceSource` (``obs [1, ...] ->
    actions [1, ...]``; pass a greedy one for an evaluation). The first
    episode starts from ``env.reset(seed=seed)``; the next ones follow on the
    env's own random stream, so the same seed and weights give the same
    video. Each episode's frames are held in memory until it is returned
    (``H * W * 3`` bytes per step: cap long episodes with a ``TimeLimit``).

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make("CartPole-v1", render_mode="rgb_array")  # CartPole renders with pygame
        >>> push_left = lambda obs: np.zeros(len(obs), dtype=np.int64)
        >>> (episode,) = ptl_rl.record_episodes(env, push_left, episodes=1, seed=0)
        >>> episode.length, episode.ret, episode.frames.shape, episode.frames.dtype  # the reset frame + 11 steps
        (11, 11.0, (12, 400, 600, 3), dtype('uint8'))
    """
    check_video_env(env)
    capture = _FrameCapture(env, episodes)
    returns, lengths = run_episodes(capture, agent, episodes, seed)
    recorded = []
    for frames, ret, length in zip(capture.episodes, returns.tolist(), lengths.tolist(), strict=True):
        if len(frames) != length + 1:  # only if something else stepped or reset the env meanwhile
            raise RuntimeError(f"recorded {len(frames)} frames for an episode of {length} steps; expected {length + 1}")
        recorded.append(RecordedEpisode(as_frames(frames), float(ret), int(length)))
    return recorded


def video_name(env_steps: int, episode: int, video_format: str) -> str:
    """The file name of episode ``episode`` of the recording at ``env_steps``: ``env_steps_000012500_episode_0.mp4``."""
    return f"env_steps_{env_steps:09d}_episode_{episode}.{video_format}"


class EvaluationVideo(PipelineCallback):
    """Records greedy episodes of the current policy as videos every ``every_env_steps`` env steps.

    At each recording the agent of ``make_agent(pl_module)`` (acting with the
    current weights) plays ``episodes`` episodes in ``env``, a separate env made
    with ``render_mode="rgb_array"``; each becomes a file
    ``env_steps_<9 digits>_episode_<i>.<format>`` in ``directory`` and, for
    every TensorBoard logger of the Trainer, an animated GIF under the tag
    ``video/episode_<i>`` at the env-step count (TensorBoard's Images tab).
    Every recording starts from ``env.reset(seed=seed)``: the videos of a run
    show the same start states, played by the policy as it was at each point.

    Frames stay off the training path: only ``env`` renders, only while a
    recording plays, and only on global rank 0 under DDP (the other ranks take
    part in the env-step count, which is summed over ranks, and go on). The
    training data and weights are the same with or without this callback
    when ``make_agent`` draws no random numbers from torch or numpy's global
    generators (greedy agents draw none).

    Args:
        pipeline: the training pipeline (any stage after its :class:`~ptl_rl.stages.source.ExperienceSource`), whose
            env-step count (summed over ranks) sets the rhythm.
        env: a single ``gymnasium.Env`` with ``render_mode="rgb_array"``.
        make_agent: ``pl_module -> agent``, e.g. ``lambda m: DQNAgent(m.q_net, ArgmaxSelector())``; called at
            every recording.
        every_env_steps: env steps between recordings (``<= 0``: none during training).
        episodes: episodes per recording.
        directory: where the files go; ``None``: ``<trainer.log_dir>/videos``.
        video_format: ``"mp4"`` (H.264, needs ``imageio-ffmpeg``) or ``"gif"`` (needs ``pillow``).
        fps: frames per second; ``None``: the env's ``metadata["render_fps"]``, else 30.
        seed: the seed of every recording's first reset (``None``: unseeded, a new start each time).
        tensorboard: also write the videos to the Trainer's TensorBoard loggers (GIFs, which need ``pillow``),
            through ``torch.utils.tensorboard``: a logger writing with ``tensorboardX`` (no ``tensorboard``
            package) gets none.
        at_train_end: also record the final weights when training ends (unless a recording was made at that
            env-step count already).

    A missing package is an ``ImportError`` here, naming the ``video`` extra; an
    env that cannot render (render mode, a missing renderer such as pygame for
    gymnasium's classic-control envs) fails at ``setup``, when ``fit`` starts,
    by rendering its reset frame once. ``recordings`` lists what was written:
    ``{"env_steps", "paths", "returns", "lengths"}`` per recording. It and the
    next recording point are saved in checkpoints, so a resumed run keeps its
    rhythm.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        env: gym.Env,
        make_agent: Callable[[Any], Agent],
        every_env_steps: int,
        episodes: int = 1,
        directory: str | Path | None = None,
        video_format: str = "mp4",
        fps: float | None = None,
        seed: int | None = 0,
        tensorboard: bool = True,
        at_train_end: bool = True,
    ) -> None:
        super().__init__()
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        if video_format not in VIDEO_FORMATS:
            raise ValueError(f"video_format must be one of {VIDEO_FORMATS}, got {video_format!r}")
        check_video_env(env)
        check_video_packages(video_format)
        if tensorboard:
            check_video_packages("gif")  # TensorBoard shows GIFs
        self.source: EpisodeCounter = find_episode_source(pipeline)
        self.pipeline = pipeline
        self.env, self.make_agent = env, make_agent
        self.every, self.episodes, self.seed = int(every_env_steps), int(episodes), seed
        self.video_format, self.tensorboard, self.at_train_end = video_format, bool(tensorboard), bool(at_train_end)
        self.fps = float(fps if fps is not None else env.metadata.get("render_fps") or DEFAULT_FPS)
        if not self.fps > 0:
            raise ValueError(f"fps must be > 0, got {self.fps}")
        self.directory = None if directory is None else Path(directory)
        self._directory = self.directory  # where files go: directory, else <trainer.log_dir>/videos from setup
        self.next_record = self.every
        self.recordings: list[dict[str, Any]] = []

    @property
    def state_key(self) -> str:
        key: str = self._generate_state_key(every_env_steps=self.every, episodes=self.episodes)
        return key

    @property
    def _active(self) -> bool:
        return self.every > 0 or self.at_train_end

    def setup(self, trainer: TrainerLike, pl_module: ModuleLike, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit" or not self._active:
            return
        if self.directory is None:  # trainer.log_dir on every rank: Lightning broadcasts it
            self._directory = Path(trainer.log_dir or trainer.default_root_dir) / "videos"
        if trainer.global_rank == 0:
            self._check_renders()

    def _check_renders(self) -> None:
        """Render the reset frame once, so that an env that cannot render fails now, not at the first recording."""
        self.env.reset(seed=self.seed)
        render_frame(self.env)

    def on_train_batch_end(self, trainer: TrainerLike, pl_module: ModuleLike, *args: object) -> None:
        if self.every <= 0:
            return
        steps = global_env_steps(trainer, self.source)  # every rank takes part: a collective under DDP
        if steps < self.next_record:
            return
        self.next_record = steps - steps % self.every + self.every
        if trainer.global_rank == 0:
            self.record(trainer, pl_module, steps)

    def on_train_end(self, trainer: TrainerLike, pl_module: ModuleLike) -> None:
        if not self.at_train_end:
            return
        steps = global_env_steps(trainer, self.source)
        done = bool(self.recordings) and self.recordings[-1]["env_steps"] == steps
        if trainer.global_rank == 0 and not done:
            self.record(trainer, pl_module, steps)

    def record(self, trainer: TrainerLike, pl_module: ModuleLike, env_steps: int) -> dict[str, Any]:
        """Record ``episodes`` episodes now, labelled ``env_steps``: write the files and the TensorBoard videos."""
        episodes = record_episodes(self.env, self.make_agent(pl_module), self.episodes, self.seed)
        directory = self._directory if self._directory is not None else Path(trainer.default_root_dir) / "videos"
        paths = []
        for i, episode in enumerate(episodes):
            paths.append(
                str(write_video(directory / video_name(env_steps, i, self.video_format), episode.frames, self.fps))
            )
            for writer in self._tensorboard_writers(trainer):
                add_tensorboard_video(writer, f"video/episode_{i}", episode.frames, self.fps, env_steps)
        entry = {
            "env_steps": int(env_steps),
            "paths": paths,
            "returns": [e.ret for e in episodes],
            "lengths": [e.length for e in episodes],
        }
        self.recordings.append(entry)
        return entry

    def _tensorboard_writers(self, trainer: TrainerLike) -> list[Any]:
        """The ``SummaryWriter`` of each TensorBoard logger of ``trainer`` (none when ``tensorboard`` is off)."""
        if not self.tensorboard:
            return []
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - needs the tensorboard package
        except ImportError:
            return []
        # only TensorBoard loggers are asked for their experiment: asking another logger may start a remote run
        kinds = tuple(package.loggers.TensorBoardLogger for package in LIGHTNING_PACKAGES)
        loggers = [logger for logger in trainer.loggers if isinstance(logger, kinds)]
        return [logger.experiment for logger in loggers if isinstance(logger.experiment, SummaryWriter)]

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        recordings = [{**entry, "paths": list(entry["paths"])} for entry in self.recordings]
        return versioned({"next_record": self.next_record, "recordings": recordings}, self.STATE_VERSION)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_version(state_dict, self.STATE_VERSION, type(self).__name__)
        self.next_record = int(state_dict["next_record"])
        self.recordings = [dict(entry) for entry in state_dict["recordings"]]

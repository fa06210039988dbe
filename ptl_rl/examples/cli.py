"""The examples' command line: the flags every example shares, and the env check.

An example builds its parser with :func:`example_parser` (the run, logging,
limits and evaluation flags), adds its algorithm's flags, and finishes with
:func:`parse`, which also runs :func:`check_env`: an unknown id gets the close
matches, an Atari id without ale-py the install line, an env the algorithm
cannot run the reason. Argument parsing only: what an example does with the
flags (its Trainer, callbacks and evaluations) is written out in the example.
Only ``argparse``, ``gymnasium`` and the standard-library
:mod:`ptl_rl.examples.runs` are imported here.

Errors end with argparse's usage line and a one-line reason (exit status 2)
instead of a traceback from deep inside the run.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from ptl_rl.examples.env_ids import check_registered, is_mujoco
from ptl_rl.examples.runs import tensorboard_available
from ptl_rl.video import VIDEO_FORMATS, VIDEO_INSTALL, missing_video_packages, quiet_headless_sdl

#: how to get TensorBoard logs, named wherever the examples say they are off
TENSORBOARD_INSTALL = 'pip install -c constraints.txt -e ".[examples]" (or pip install tensorboard)'

#: flags of the off-policy examples' burst training that other flags are checked against
BURST_HELP = (
    "burst training as SB3's train_freq/gradient_steps: every --train-freq env steps (all sub-envs together; "
    "one vector step brings --num-envs of them), take --gradient-steps gradient steps"
)


#: the ``--env-steps`` help of the on-policy examples (PPO, recurrent PPO, A2C), which train on whole rollouts
ROLLOUT_BUDGET_HELP = (
    "budget of env steps (all sub-envs together), rounded up to whole rollouts: ceil(env-steps / (num-envs x "
    "steps-per-env)) rollouts, each trained in full, so the run ends at a rollout boundary; the summary reports the "
    "env steps taken (a rollout also keeps the extra steps of the sub-envs ahead of one that reset)"
)


class ExampleParser(argparse.ArgumentParser):
    """argparse's parser, and whether its example trains online (:func:`parse` checks the env-step flags then)."""

    online: bool = True


def example_parser(
    name: str,
    doc: str,
    *,
    default_env: str,
    default_env_steps: int = 0,
    online: bool = True,
    budget_help: str = "budget of env steps (all sub-envs together)",
) -> ExampleParser:
    """A parser whose usage line says ``python -m ptl_rl.examples.<name>``, with the flags every example shares.

    Groups: run (env, budget, seed, threads, accelerator), limits (``--time-limit``,
    ``--grad-clip``), logging (``--runs-dir``, ``--log-every``), evaluation
    (periodic, confirmed, final) and video (``--video-every``; online only).
    Defaults that differ per example are changed with ``parser.set_defaults``
    after the call. ``online=False`` (training from a dataset) leaves out the
    env-step budget, the sub-envs, the periodic evaluation and the videos: the
    env is only played in the final evaluation. ``budget_help`` is the help of
    ``--env-steps`` (:data:`ROLLOUT_BUDGET_HELP` for the on-policy examples).
    """
    parser = ExampleParser(
        prog=f"python -m ptl_rl.examples.{name}",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = parser.add_argument_group("run")
    run.add_argument("--env-id", default=default_env, help="gymnasium env id ('module:Id' imports module first)")
    if online:
        run.add_argument("--env-steps", type=int, default=default_env_steps, help=budget_help)
    run.add_argument("--seed", type=int, default=0, help="seeds torch, numpy, the envs and the samplers")
    if online:
        run.add_argument("--num-envs", type=int, default=1, help="sub-envs of the training vector env")
    run.add_argument("--threads", type=int, default=1, help="torch CPU threads (torch.set_num_threads)")
    run.add_argument("--accelerator", default="cpu", help="Lightning accelerator; a small MLP is fastest on the CPU")
    run.add_argument(
        "--progress-bar", action=argparse.BooleanOptionalAction, default=True, help="show Lightning's progress bar"
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--time-limit",
        type=time_limit,
        default=None,
        metavar="[[HH:]MM:]SS",
        help="stop training after this wall-clock time (e.g. 01:30:00 or 5400); the final evaluation still runs",
    )
    limits.add_argument(
        "--grad-clip",
        type=float,
        default=None,
        help="clip the gradient norm of each optimizer step to this (none or 0: no clipping)",
    )
    logs = parser.add_argument_group("logging")
    logs.add_argument(
        "--runs-dir",
        default="runs",
        help="each run writes its directory <runs-dir>/<algo>_<env>_<seed>_<time>/ here (empty: write nothing)",
    )
    logs.add_argument("--log-every", type=int, default=100, help="gradient steps between logged training metrics")
    # the default follows what is installed, so the help states what a run will do on this machine
    logs.add_argument(
        "--tensorboard",
        action=argparse.BooleanOptionalAction,
        default=tensorboard_available(),
        help="also write TensorBoard logs into the run directory; on by default when the tensorboard package is "
        f"installed, {'which it is' if tensorboard_available() else 'which it is not: ' + TENSORBOARD_INSTALL}",
    )
    evaluation = parser.add_argument_group("evaluation")
    if not online:
        parser.set_defaults(env_steps=0, num_envs=1, eval_every=0, eval_episodes=1, solved_return=None)
        parser.set_defaults(confirm_episodes=0)
        evaluation.add_argument(
            "--final-eval-episodes", type=int, default=100, help="fresh episodes of the evaluation after training"
        )
        parser.online = False  # read by parse(): no env-step budget to check
        return parser
    evaluation.add_argument(
        "--eval-every", type=int, default=5_000, help="env steps between greedy evaluations (0: never)"
    )
    evaluation.add_argument("--eval-episodes", type=int, default=20, help="episodes per greedy evaluation")
    evaluation.add_argument(
        "--solved-return",
        type=float,
        default=None,
        help="target return: once an evaluation reaches it and --confirm-episodes fresh episodes confirm it, "
        "training stops (none: the env's reward_threshold from its gymnasium spec, e.g. 475 for CartPole-v1, "
        "or the example's own target for its default env; inf: never stop early)",
    )
    evaluation.add_argument(
        "--confirm-episodes",
        type=int,
        default=None,
        help="fresh episodes (new seeds) that must also reach --solved-return before stopping; a failed "
        "confirmation keeps training (none: as many as --eval-episodes; 0: stop at the first crossing)",
    )
    evaluation.add_argument(
        "--final-eval-episodes", type=int, default=100, help="fresh episodes of the final greedy evaluation (0: none)"
    )
    add_video_flags(parser)
    return parser


def video_help() -> str:
    """The video group's description: what the flags need, and whether this machine has it."""
    missing = sorted({name for fmt in VIDEO_FORMATS for name in missing_video_packages(fmt)})
    state = f"not installed here: {', '.join(missing)}" if missing else "installed here"
    return (
        "greedy episodes recorded as videos into <run directory>/videos/ (and TensorBoard's Images tab), rendered "
        "in an env of their own, never in the training envs; they need imageio-ffmpeg (MP4) and pillow (GIF), "
        f"{state}, plus the env's renderer (pygame for classic control); {VIDEO_INSTALL}"
    )


def add_video_flags(parser: argparse.ArgumentParser) -> None:
    """``--video-every N --video-episodes K --video-format mp4|gif`` (checked by :func:`parse`)."""
    video = parser.add_argument_group("video", video_help())
    video.add_argument(
        "--video-every",
        type=int,
        default=0,
        help="env steps between recordings of the greedy policy, plus one of the final weights (0: no videos)",
    )
    video.add_argument("--video-episodes", type=int, default=1, help="episodes per recording, one file each")
    video.add_argument("--video-format", choices=VIDEO_FORMATS, default="mp4", help="file format of the videos")


def add_burst_flags(parser: argparse.ArgumentParser, train_freq: int, gradient_steps: int = 1) -> None:
    """``--train-freq K --gradient-steps G`` of the off-policy examples (``--train-every K`` stays an alias)."""
    group = parser.add_argument_group("burst training", BURST_HELP)
    group.add_argument(
        "--train-freq",
        "--train-every",
        dest="train_freq",
        type=int,
        default=train_freq,
        help="env steps collected between bursts of gradient steps (the replay's transitions_per_yield)",
    )
    group.add_argument(
        "--gradient-steps", type=int, default=gradient_steps, help="gradient steps per burst (batches per yield)"
    )


def time_limit(text: str) -> float:
    """``"SS"``, ``"MM:SS"`` or ``"HH:MM:SS"`` (seconds may have a fraction) -> seconds, for ``--time-limit``."""
    if not re.fullmatch(r"\d+(\.\d*)?|(\d+:){1,2}\d+(\.\d*)?", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not SS, MM:SS or HH:MM:SS (e.g. 01:30:00 or 5400)")
    seconds = 0.0
    for part in text.strip().split(":"):
        seconds = seconds * 60 + float(part)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the time limit must be positive")
    return seconds


def parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    action_spaces: tuple[type[spaces.Space[Any]], ...],
    algorithm: str,
    *,
    solved_returns: Mapping[str, float] | None = None,
    **check: bool,
) -> tuple[argparse.Namespace, gym.Env]:
    """Parse ``argv``, check the shared flags and the env (:func:`check_env`); returns the args and the closed env.

    The env check builds the env once, so a typo or an env the algorithm
    cannot run ends here, before anything is built or trained. Without
    ``--solved-return`` the target is the env's registered ``reward_threshold``,
    else ``solved_returns[env_id]`` (targets for envs registered without one,
    e.g. ``{"Pendulum-v1": -200.0}``), else none.
    """
    args = parser.parse_args(argv)
    online = getattr(parser, "online", True)
    for flag in ("env_steps", "num_envs", "threads", "log_every", "eval_episodes")[0 if online else 2 :]:
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for flag in ("train_freq", "gradient_steps"):
        if getattr(args, flag, 1) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.grad_clip is not None and args.grad_clip < 0:
        parser.error(f"--grad-clip must be >= 0 (0: no clipping), got {args.grad_clip}")
    args.grad_clip = args.grad_clip or None
    if args.tensorboard and not tensorboard_available():  # asked for explicitly: the default is off then
        parser.error(f"--tensorboard: the tensorboard package is not installed; {TENSORBOARD_INSTALL}")
    if args.confirm_episodes is None:
        args.confirm_episodes = args.eval_episodes
    if args.confirm_episodes < 0 or args.final_eval_episodes < 0 or args.eval_every < 0:
        parser.error("--confirm-episodes, --final-eval-episodes and --eval-every must be >= 0")
    env = check_env(parser, args.env_id, action_spaces, algorithm, **check)
    if getattr(args, "video_every", 0):
        check_video(parser, args)
    if args.solved_return is None:
        threshold = getattr(env.spec, "reward_threshold", None)
        args.solved_return = threshold if threshold is not None else (solved_returns or {}).get(args.env_id)
    if args.solved_return is not None and not math.isfinite(args.solved_return):
        args.solved_return = None  # inf: never stop early
    return args, env


def check_video(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` unless ``--video-every`` can record: packages installed, a run directory, an env that renders.

    The env is made with ``render_mode="rgb_array"`` and renders its reset
    frame once, so a missing renderer (pygame for classic control) is named
    now rather than at the first recording.
    """
    if args.video_every < 0 or args.video_episodes < 1:
        parser.error("--video-every must be >= 0 and --video-episodes >= 1")
    missing = missing_video_packages(args.video_format) + (missing_video_packages("gif") if args.tensorboard else [])
    if missing:
        parser.error(f"--video-every: writing videos needs {', '.join(sorted(set(missing)))}; {VIDEO_INSTALL}")
    if not args.runs_dir:
        parser.error("--video-every writes into the run directory; --runs-dir is empty (write nothing)")
    quiet_headless_sdl()  # else pygame prints "XDG_RUNTIME_DIR is invalid" on a machine without a display
    try:
        env = gym.make(args.env_id, render_mode="rgb_array")
        try:
            env.reset(seed=0)
            frame = env.render()
        finally:
            env.close()
    except Exception as error:  # noqa: BLE001 - any failure to render is the user's to fix before training
        parser.error(f"--video-every: {args.env_id} cannot render rgb_array frames: {type(error).__name__}: {error}")
    shape = getattr(frame, "shape", None)  # (an array's; render()'s declared type is wider)
    if shape is None or len(shape) != 3:
        parser.error(f"--video-every: {args.env_id} renders {type(frame).__name__}, not rgb_array frames [H, W, 3]")


def check_env(
    parser: argparse.ArgumentParser,
    env_id: str,
    action_spaces: tuple[type[spaces.Space[Any]], ...],
    algorithm: str,
    *,
    flat_box_actions: bool = True,
    box_observations: bool = True,
) -> gym.Env:
    """The env ``env_id`` (created once to read its spaces, then closed), or ``parser.error`` saying why not.

    Args:
        action_spaces: the ``gymnasium.spaces`` classes ``algorithm`` can act in.
        flat_box_actions: a ``Box`` action space must be 1-d (the Gaussian policy heads).
        box_observations: observations must be a ``Box`` (the examples' networks take arrays).
    """
    check_registered(parser, env_id)
    try:
        env = gym.make(env_id)
    except Exception as error:  # noqa: BLE001 - any failure to build the env is a bad --env-id for the user
        parser.error(f"--env-id {env_id}: gymnasium could not create it: {type(error).__name__}: {error}")
    env.close()
    action_space, obs_space = env.action_space, env.observation_space
    if not isinstance(action_space, action_spaces):
        names = ", ".join(kind.__name__ for kind in action_spaces)
        parser.error(f"--env-id {env_id}: {algorithm} needs {names} actions, but {env_id} has {action_space}")
    if flat_box_actions and isinstance(action_space, spaces.Box) and len(action_space.shape) != 1:
        parser.error(f"--env-id {env_id}: {algorithm} needs a 1-d Box action space, got shape {action_space.shape}")
    if box_observations and not isinstance(obs_space, spaces.Box):
        parser.error(
            f"--env-id {env_id}: the example's MLP needs Box (array) observations, but {env_id} has {obs_space}; "
            "wrap the env (e.g. one-hot encode Discrete observations) or pick another env"
        )
    return env


def apply_recipe(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    recipes: Mapping[str, Mapping[str, Any]],
    recipe_of: Callable[[str], str | None] | None = None,
) -> None:
    """Make ``recipes[name]`` the parser's defaults, ``name`` from ``--recipe`` or, under ``auto``, from the env.

    ``auto`` picks ``"mujoco"`` for gymnasium's MuJoCo envs, then ``recipe_of(env_id)`` if given and not
    ``None`` (a recipe for a family of ids), then the env id itself when ``recipes`` has one for it; else
    nothing changes. Flags given on the command line still win.
    """
    known, _ = parser.parse_known_args(argv)
    name = known.recipe
    if name == "auto":
        family = recipe_of(known.env_id) if recipe_of is not None else None
        name = "mujoco" if is_mujoco(known.env_id) and "mujoco" in recipes else family or known.env_id
    if name in recipes:
        parser.set_defaults(**recipes[name])

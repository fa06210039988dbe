"""CleanRL's single files, patched in memory for gymnasium 1.x and run as child processes.

The benchmarks that compare ptl_rl with CleanRL (``mujoco.py``, ``e2e.py``)
read CleanRL's files from a checkout whose path they are given and never copy
them into this repository. The files were written for gymnasium 0.29; the
patches (each must apply exactly once, or the run stops and names it) are:

* ``tyro.cli(Args)`` becomes ``Args(**overrides)`` (tyro is not a dependency
  of ptl_rl);
* the vector env autoresets in gymnasium 1.x's same-step mode, the semantics
  of gymnasium 0.29 that CleanRL's loops assume (the step after an episode end
  starts the next episode; under 1.x's default next-step mode the loop would
  store a reset step as a transition);
* ``TransformObservation`` gets its new ``observation_space`` argument (``None``);
* the episode statistics are read from gymnasium 1.x's ``final_info`` layout
  (a dict of arrays with an ``_episode`` mask instead of a list of dicts);
* the final observation of a truncated episode is ``info["final_obs"]``
  (gymnasium 0.29 called it ``final_observation``).

A run's cost is the CPU time (user + system) the kernel accounted to the child,
read with ``os.wait4``, so neither side pays for the other's bookkeeping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_TYRO = [("import tyro\n", ""), ("    args = tyro.cli(Args)\n", "    args = Args(**_OVERRIDES)\n")]


def _same_step(trailing_comma: bool) -> tuple[str, str]:
    old = "for i in range(args.num_envs)]" + (",\n    )" if trailing_comma else "\n    )")
    return old, "for i in range(args.num_envs)],\n        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )"


def _episode_log(indent: str, first_only: bool) -> tuple[str, str]:
    """gymnasium 0.29's list of per-env info dicts -> 1.x's dict of arrays with an ``_episode`` mask."""
    i = indent
    condition = "info is not None" if first_only else 'info and "episode" in info'
    stop = f"{i}            break\n" if first_only else ""
    old = (
        f'{i}if "final_info" in infos:\n'
        f'{i}    for info in infos["final_info"]:\n'
        f"{i}        if {condition}:\n"
        f"{i}            print(f\"global_step={{global_step}}, episodic_return={{info['episode']['r']}}\")\n"
        f'{i}            writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)\n'
        f'{i}            writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)\n'
        f"{stop}"
    )
    new = (
        f'{i}if "final_info" in infos and "episode" in infos["final_info"]:\n'
        f'{i}    _ep = infos["final_info"]["episode"]\n'
        f'{i}    for _i in infos["final_info"]["_episode"].nonzero()[0]:\n'
        f"{i}        print(f\"global_step={{global_step}}, episodic_return={{float(_ep['r'][_i])}}\")\n"
        f'{i}        writer.add_scalar("charts/episodic_return", _ep["r"][_i], global_step)\n'
        f'{i}        writer.add_scalar("charts/episodic_length", _ep["l"][_i], global_step)\n'
        f"{stop[4:]}"
    )
    return old, new


_FINAL_OBS = ('infos["final_observation"][idx]', 'infos["final_obs"][idx]')

PATCHES: dict[str, list[tuple[str, str]]] = {
    "ppo_continuous_action.py": [
        *_TYRO,
        _same_step(trailing_comma=False),
        (
            "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
            "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), None)",
        ),
        _episode_log(" " * 12, first_only=False),
    ],
    "sac_continuous_action.py": [
        *_TYRO,
        _same_step(trailing_comma=False),
        _episode_log(" " * 8, first_only=True),
        _FINAL_OBS,
    ],
    "dqn.py": [*_TYRO, _same_step(trailing_comma=False), _episode_log(" " * 8, first_only=False), _FINAL_OBS],
    "ppo.py": [*_TYRO, _same_step(trailing_comma=True), _episode_log(" " * 12, first_only=False)],
}


def patched(checkout: Path, filename: str) -> str:
    """The source of CleanRL's ``cleanrl/<filename>`` with the gymnasium 1.x patches applied."""
    source = (checkout / "cleanrl" / filename).read_text()
    for old, new in PATCHES[filename]:
        if source.count(old) != 1:
            raise SystemExit(f"CleanRL's {filename} has changed: this patch no longer applies:\n{old}")
        source = source.replace(old, new)
    return source


def run_inline(checkout: str, filename: str, overrides: dict[str, Any]) -> None:
    """In this (child) process: run the patched file as ``__main__`` with ``Args(**overrides)``, one torch thread."""
    import torch  # noqa: PLC0415 - only the child needs it

    torch.set_num_threads(1)
    sys.path.insert(0, checkout)  # cleanrl_utils (the replay buffer of the DQN and SAC files)
    path = Path(checkout) / "cleanrl" / filename
    namespace = {"__name__": "__main__", "__file__": str(path), "_OVERRIDES": {"cuda": False, **overrides}}
    exec(compile(patched(Path(checkout), filename), str(path), "exec"), namespace)  # noqa: S102 - by design


def child(cmd: list[str], cwd: str, log: Path) -> tuple[int, float, float]:
    """Run ``cmd`` (stdout and stderr to ``log``); returns (exit status, CPU seconds of the child, wall seconds)."""
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, time.perf_counter() - start

"""Smoke test of an installed ptl_rl wheel; run by ``.ci/package_check`` with the venv's python, outside the checkout.

Usage: ``VENV/bin/python -I package_smoke.py VENV compiled|fallback RUNS_DIR``,
from a directory outside the checkout (``-I``: neither the current directory,
the script's nor ``PYTHONPATH`` is on ``sys.path``). It checks that ``ptl_rl``
is imported from VENV's site-packages, that ``py.typed`` was installed, that
FrameStorage's compiled insert is present and taken (``compiled``) or absent
with the Python path in use (``fallback``), that a short frame-stacked stream
stores the same stacks either way, and then trains the DQN example for 2,000
CartPole env steps into RUNS_DIR and reads its summary.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

STARTED = time.monotonic()


def say(line: str) -> None:
    """``line``, after the seconds since start: a slow first import in a fresh venv shows in CI's log."""
    print(f"[{time.monotonic() - STARTED:5.1f}s] {line}", flush=True)


def fail(message: str) -> None:
    raise SystemExit(f"package smoke: {message}")


def check_installed(venv: Path) -> None:
    import ptl_rl  # noqa: PLC0415 (after sys.path is known to be clean)

    package = Path(ptl_rl.__file__).resolve().parent
    if Path(sys.prefix).resolve() != venv.resolve():
        fail(f"run with {sys.prefix}'s python, not {venv}'s")
    site = {Path(sysconfig.get_path(kind)).resolve() for kind in ("purelib", "platlib")}
    if package.parent not in site:
        fail(f"ptl_rl was imported from {package}, not from the venv's {sorted(map(str, site))}: checkout on sys.path?")
    if not (package / "py.typed").is_file():
        fail(f"{package} has no py.typed: the wheel does not ship the package's type hints (PEP 561)")
    say(f"ptl_rl {ptl_rl.__version__} from {package}")


def frame_stream(storage_factory, steps: int):
    """A FrameStorage replay fed by 2 frame-stacked CartPole envs (3-step returns) for ``steps`` vector steps."""
    import gymnasium as gym  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    import ptl_rl  # noqa: PLC0415

    def make():
        return gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 4)

    env = gym.vector.SyncVectorEnv([make, make])
    rng = np.random.default_rng(0)
    source = ptl_rl.ExperienceSource(env, lambda obs: rng.integers(0, 2, size=len(obs)), seed=0)
    nstep = ptl_rl.NStepTransform(source, n=3, gamma=0.99)
    buffer = ptl_rl.ReplayBuffer(nstep, capacity=256, storage=storage_factory)
    for batch in itertools.islice(nstep, steps):
        buffer.add(batch)
    env.close()
    return buffer.storage


def stacks(storage) -> dict:
    import numpy as np  # noqa: PLC0415

    every = np.arange(len(storage))
    drawn = storage.gather(every[storage.sampleable(every)])
    return {name: np.asarray(drawn[name]) for name in ("obs", "next_obs", "reward", "discount")}


def check_insert(expect: str) -> None:
    import numpy as np  # noqa: PLC0415

    from ptl_rl import FrameStorage  # noqa: PLC0415
    from ptl_rl.replay import frames  # noqa: PLC0415

    venv_module = getattr(frames._frame_insert, "__file__", None)
    if expect == "compiled" and not (frames.COMPILED_INSERT and venv_module):
        fail("the compiled insert ptl_rl.replay._frame_insert is not importable from the installed wheel")
    if expect == "fallback" and (frames._frame_insert is not None or frames.COMPILED_INSERT):
        fail(f"the fallback wheel has a compiled insert ({venv_module}): it was meant to be built without a compiler")

    adds = fell_back = 0

    def counting(capacity: int) -> FrameStorage:
        storage = FrameStorage(capacity, stack_axis=0)
        kernel = storage._kernel  # (None: no compiled insert; every add is the Python path's)
        if kernel is None:
            return storage
        python_write, compiled_write = kernel.fallback, storage._writer

        def fallback(batch):
            nonlocal fell_back
            fell_back += 1
            return python_write(batch)

        def counted(batch):
            nonlocal adds
            adds += 1
            return compiled_write(batch)

        kernel.fallback, storage._writer = fallback, counted
        return storage

    def python_path(capacity: int) -> FrameStorage:
        storage = FrameStorage(capacity, stack_axis=0)
        storage.compiled = False
        return storage

    default, reference = frame_stream(counting, 300), frame_stream(python_path, 300)
    taken = adds - fell_back
    if expect == "compiled" and taken == 0:
        fail("the compiled insert is installed but no add took it")
    if expect == "fallback" and taken:
        fail(f"{taken} adds took a compiled insert in the fallback wheel")
    mine, theirs = stacks(default), stacks(reference)
    if len(mine["obs"]) < 200:
        fail(f"only {len(mine['obs'])} sampleable transitions after 300 vector steps")
    for name in theirs:
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=f"{name}: compiled vs Python path")
    where = venv_module or "none: the pure-Python path"
    say(f"FrameStorage insert {expect}: {taken} compiled adds, module {where}; stacks equal the Python path's")


def check_sum_tree(expect: str) -> None:
    """The sum-tree's compiled loops are there (or not), and give the numpy path's draws."""
    import numpy as np  # noqa: PLC0415

    from ptl_rl import SumTree  # noqa: PLC0415
    from ptl_rl.replay import sumtree  # noqa: PLC0415

    module = getattr(sumtree._sumtree_kernel, "__file__", None)
    if (expect == "compiled") != (module is not None):
        fail(f"sum-tree loops: expected {expect}, the installed module is {module}")
    trees = [SumTree(5000), SumTree(5000)]
    trees[1].compiled = False
    values = np.random.default_rng(0).exponential(size=5000)
    draws = []
    for tree in trees:
        tree.update(np.arange(5000), values)
        draws.append(tree.sample(np.random.default_rng(1).random(256))[0])
    np.testing.assert_array_equal(draws[0], draws[1], err_msg="sum-tree draws: default vs numpy path")
    say(f"SumTree loops {expect}: module {module or 'none: numpy'}; draws equal the numpy path's")


def check_dqn(runs_dir: Path, env_steps: int = 2_000) -> None:
    """The DQN example as a user runs it (``python -m``, a fresh interpreter), for ``env_steps`` CartPole steps."""
    command = [sys.executable, "-I", "-m", "ptl_rl.examples.dqn", "--env-id", "CartPole-v1", "--seed", "0"]
    command += ["--env-steps", str(env_steps), "--final-eval-episodes", "5", "--no-progress-bar"]
    say(f"DQN example, {env_steps} CartPole-v1 env steps")
    subprocess.run([*command, "--runs-dir", str(runs_dir)], check=True, timeout=600)
    summaries = list(runs_dir.glob("*/summary.json"))
    if len(summaries) != 1:
        fail(f"expected one run directory with a summary.json in {runs_dir}, found {summaries}")
    summary = json.loads(summaries[0].read_text())
    if summary["env_steps"] != env_steps or summary["gradient_steps"] < 1 or summary["stopped"] != "env-step budget":
        fail(f"the DQN run did not train for its {env_steps} env steps: {summary}")
    say(f"DQN run done: {summary['gradient_steps']} gradient steps, summary in {summaries[0].parent.name}")


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[2] not in ("compiled", "fallback"):
        fail("usage: VENV/bin/python -I package_smoke.py VENV compiled|fallback RUNS_DIR")
    venv, expect, runs_dir = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    say(f"smoke test of the {expect} wheel")
    check_installed(venv)
    check_insert(expect)
    check_sum_tree(expect)
    check_dqn(runs_dir)


if __name__ == "__main__":
    main()

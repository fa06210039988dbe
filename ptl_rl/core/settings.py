"""ptl_rl's process-wide switches, in one place: the time accounting, and whether the compiled kernels are used.

Everything that a whole process shares lives in :data:`SETTINGS` and is read
from here, nowhere else. The one environment variable, ``PTL_RL_PURE_PYTHON``,
is read once, here, at import; ptl_rl never writes ``os.environ``.
"""

from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass
from types import ModuleType


@dataclass
class Settings:
    """The switches (see the module docstring).

    Attributes:
        profiling: per-stage time accounting (:func:`ptl_rl.profile`): two clock reads per ``next()``,
            well under 1% of collection; :func:`ptl_rl.set_profiling` turns it off.
        compiled: use the compiled kernels (the frame insert, the sum-tree loops) where they are built.
            ``PTL_RL_PURE_PYTHON=1`` in the environment makes it ``False`` for the process.
    """

    profiling: bool = True
    compiled: bool = True


SETTINGS = Settings(compiled=os.environ.get("PTL_RL_PURE_PYTHON", "") in ("", "0"))


def set_profiling(enabled: bool) -> None:
    """Turn the per-stage accounting of every pipeline on (the default) or off.

    It costs well under 1% of collection speed (see ``benchmarks/collection.py``);
    switch it off only to measure that.
    """
    SETTINGS.profiling = bool(enabled)


_warned = False  # one warning per process, whichever kernel is missing first


def load_kernel(name: str) -> ModuleType | None:
    """The compiled module ``ptl_rl.replay.<name>``, or ``None`` when it is not built.

    Whether a kernel that is built is *used* by default is :attr:`Settings.compiled`'s to say. A kernel that
    is not built warns once per process (whichever is missing first), saying what the numpy paths cost and how
    to get the kernels, unless ``PTL_RL_PURE_PYTHON=1`` chose the numpy paths.
    """
    global _warned
    try:
        return importlib.import_module(f"ptl_rl.replay.{name}")
    except ImportError:  # not built (no compiler at install time, or a source checkout without build_ext)
        if SETTINGS.compiled and not _warned:
            _warned = True
            warnings.warn(
                "ptl_rl's compiled kernels are not built, so it runs their numpy paths: a FrameStorage add "
                "(pixel replay) at about 0.11x and a prioritized sample + update at about 0.7x of the compiled "
                "speed (benchmarks/pixels.py, benchmarks/prioritized.py). Reinstall with a C compiler present "
                "(pip install -e . builds them), or set PTL_RL_PURE_PYTHON=1 to choose the numpy paths without "
                "this warning.",
                RuntimeWarning,
                stacklevel=2,
            )
        return None

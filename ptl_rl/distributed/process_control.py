"""Starting and stopping collector processes from the learner: start method, factory check, sure stop, exit report.

Every AsyncSource with a running collector is in :data:`LIVE`; at interpreter
exit each is closed, so no collector outlives the learner.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import pickle
import queue
import signal
import sys
import time
import weakref
from typing import Any

import torch.multiprocessing as mp

from ptl_rl.distributed.common import Factory

LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # the sources (anything with close()) whose collector may be running


@atexit.register
def _close_all() -> None:
    # registered after multiprocessing's own exit hook, so it runs first: children are stopped, not waited for
    # (importing torch.multiprocessing above has imported multiprocessing.util, which registers that hook)
    for source in list(LIVE):
        source.close()


def stop_process(proc: Any, stop: Any, data_q: Any, timeout: float = 5.0) -> None:
    """Stop a collector process for sure: ask, drain its queue so it is not stuck writing, then terminate, kill."""
    stop.set()
    deadline = time.monotonic() + timeout
    while proc.is_alive() and time.monotonic() < deadline:
        try:
            data_q.get(timeout=0.05)
        except (queue.Empty, OSError, EOFError, ValueError):
            proc.join(0.05)
    if proc.is_alive():
        proc.terminate()
        proc.join(2.0)
    if proc.is_alive():
        proc.kill()
        proc.join()
    with contextlib.suppress(Exception):
        data_q.close()
        data_q.cancel_join_thread()


_PRELOAD = ["ptl_rl.distributed.async_source"]  # what a forkserver imports once for all its children


def context(start_method: str | None) -> Any:
    """The multiprocessing context of ``start_method`` (default: forkserver where there is one, else spawn)."""
    methods = mp.get_all_start_methods()
    if start_method is None:
        start_method = "forkserver" if "forkserver" in methods else "spawn"
    if start_method not in ("forkserver", "spawn") or start_method not in methods:
        raise ValueError(
            f"start_method must be 'forkserver' or 'spawn' (available here: {methods}), got {start_method!r}; "
            "'fork' would copy the learner's threads and CUDA state into the collector"
        )
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)  # takes effect when the server starts (at the first collector)
    return ctx


def check_importable(factory: Factory) -> None:
    """Raise, naming the fix, for a factory the collector process could not import (checked before it starts)."""
    try:
        pickle.dumps(factory)
    except Exception as error:  # noqa: BLE001 - pickle raises several types (PicklingError, AttributeError, ...)
        raise TypeError(
            f"the factory {factory!r} cannot be sent to the collector process ({type(error).__name__}: {error}). "
            "Pass a module-level function or a functools.partial of one, not a lambda or a nested function."
        ) from error
    func = factory.func if isinstance(factory, functools.partial) else factory
    main = sys.modules.get("__main__")
    if getattr(func, "__module__", None) == "__main__" and not hasattr(main, "__file__"):
        raise TypeError(
            f"the factory {getattr(func, '__qualname__', func)!r} is defined in a notebook or an interactive "
            "session, which the collector process cannot import (it starts a fresh interpreter and imports the "
            "factory by name). Put it in a .py file next to the notebook and import it from there."
        )


def describe_exit(code: int | None) -> str:
    """How a process with exit code ``code`` ended, for an error message ("was killed by signal SIGKILL")."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"

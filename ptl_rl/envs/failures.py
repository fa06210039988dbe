"""What an env's failure leaves behind, read off gymnasium's vector envs: which sub-env raised, a dead worker,
the late answers of a call an interrupt cut in two.
"""

from __future__ import annotations

import numpy as np

from ptl_rl.core.protocols import EnvLike

_ASYNC_DRAIN_TIMEOUT_S = 10.0  # how long an interrupted AsyncVectorEnv call may take to finish


def note_failed_sub_env(env: EnvLike, is_vector: bool, env_ids: np.ndarray, exc: BaseException) -> None:
    """Add a note to ``exc`` naming the sub-env whose ``step()`` raised it, where that can be known."""
    index = None
    pipes = getattr(env, "parent_pipes", None)
    if pipes is not None:  # AsyncVectorEnv: gymnasium shuts down (pipe None) the worker that raised
        failed = [i for i, pipe in enumerate(pipes) if pipe is None]
        index = failed[0] if failed else None
    else:  # SyncVectorEnv: the frame of the sub-env's step() is in the traceback
        sub_envs = getattr(env, "envs", None) or ([env] if not is_vector else [])
        tb = exc.__traceback__
        while tb is not None and index is None:
            owner = tb.tb_frame.f_locals.get("self")
            index = next((i for i, e in enumerate(sub_envs) if owner is e), None)
            tb = tb.tb_next
    if index is None or not hasattr(exc, "add_note"):
        return
    note = f"ptl_rl: raised in step() of sub-env {index} (env_id {int(env_ids[index])}). "
    if pipes is not None:
        note += (
            "gymnasium has shut that worker down, so this AsyncVectorEnv cannot step again: "
            "build a new env and a new ExperienceSource."
        )
    else:
        note += "Calling next() again resets every sub-env and carries on."
    exc.add_note(note)


def check_env_usable(env: EnvLike) -> None:
    """Raise ``RuntimeError`` naming the fix if ``env`` is closed or a worker of it was shut down."""
    pipes = getattr(env, "parent_pipes", None) or ()
    dead = [i for i, pipe in enumerate(pipes) if pipe is None]
    if getattr(env, "closed", False) is True or dead:
        why = f" (gymnasium shut down the worker of sub-env(s) {dead} after it raised)" if dead else ""
        raise RuntimeError(
            f"the env of this ExperienceSource is closed{why} and cannot be stepped again. "
            "Build a new env and a new ExperienceSource (and re-chain the stages after it); "
            "the replay buffer and the model can be kept."
        )


def finish_pending_async_call(env: EnvLike) -> None:
    """After an interrupt between an AsyncVectorEnv's ``*_async`` and ``*_wait`` calls, drop the answers.

    Without this the workers' late answers would sit in the pipes and be read as the answers
    to the next call (rows from the wrong step).
    """
    state = getattr(env, "_state", None)
    value = getattr(state, "value", "default")
    if state is None or value == "default":  # (None has no value: the same test, said for the checker)
        return
    try:
        getattr(env, f"{value}_wait")(timeout=_ASYNC_DRAIN_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the answers are dropped anyway; the reset after this decides
        pass
    for pipe in getattr(env, "parent_pipes", None) or ():
        while pipe is not None and pipe.poll():
            pipe.recv()
    setattr(env, "_state", type(state)("default"))  # noqa: B010 - AsyncVectorEnv's own, outside the protocol

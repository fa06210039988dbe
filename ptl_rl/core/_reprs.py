"""The one formatter of stage reprs: a stage, its counters, and the chain upstream of it.

Every stage's ``__repr__`` is ``stage_repr(self, ...)``, so printing the last
stage of a pipeline (or the buffer a ``next()`` returns, in a notebook) shows
the whole chain, newest stage first::

    ReplayBuffer(size=1234/50000, warmup=1000, transitions_per_yield=4)
      <- NStepTransform(n=3, gamma=0.99, windows_in_flight=5)
      <- ExperienceSource(CartPole-v1 x8, env_steps=5000, episodes=211)

(on one line, stages joined by ``" <- "``). See ``docs/design/construction-checks.md``.
"""

from __future__ import annotations

from typing import Any

from ptl_rl.core.protocols import StageLike

CHAIN_ARROW = " <- "


def stage_repr(stage: Any, *positional: Any, **counters: Any) -> str:
    """``Name(positional..., key=value, ...)`` of ``stage``, followed by the repr of its ``upstream`` if it has one.

    Floats print with ``:g`` (``0.99``, not ``0.9900000000000001``); other
    values with ``str``.
    """
    parts = [_format(value) for value in positional]
    parts += [f"{key}={_format(value)}" for key, value in counters.items()]
    own = f"{type(stage).__name__}({', '.join(parts)})"
    upstream = stage.upstream if isinstance(stage, StageLike) else None
    return own if upstream is None else own + CHAIN_ARROW + _upstream_repr(upstream)


def env_name(env: Any) -> str:
    """The gymnasium id of ``env`` (or of its first sub-env), else its class name."""
    spec = getattr(env, "spec", None)
    if spec is None and getattr(env, "envs", None):  # a vector env built from env functions has no spec itself
        spec = getattr(env.envs[0], "spec", None)
    return spec.id if spec is not None else type(env).__name__


def _upstream_repr(upstream: Any) -> str:
    # a plain iterator (generator, list iterator) or a user's stage without __repr__ has only a default repr with
    # its address: name its type, and go on up the chain from a stage
    text = repr(upstream)
    if not text.startswith("<"):
        return text
    further = upstream.upstream if isinstance(upstream, StageLike) else None
    name = type(upstream).__name__
    return name if further is None else name + CHAIN_ARROW + _upstream_repr(further)


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)

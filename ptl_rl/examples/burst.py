"""Burst training for the off-policy examples: every K env steps, G gradient steps (SB3's train_freq, gradient_steps).

A :class:`~ptl_rl.ReplayBuffer` stage with ``transitions_per_yield=K`` yields
itself once per K collected transitions, and a :class:`~ptl_rl.BatchSampler`
draws one batch per yield. :class:`Burst` sits between them and hands each
yield on G times, so the sampler draws G batches (G gradient steps) from the
buffer as it stands after those K transitions, and only then is the env
stepped again. Built only from the public stage protocol (``upstream``,
iteration), so the episode callbacks still find the source through it.
"""

from __future__ import annotations

from typing import Any


class Burst:
    """Yields each item of ``upstream`` (a replay-buffer stage) ``gradient_steps`` times in a row.

    Args:
        upstream: a replay-buffer stage, e.g. ``ReplayBuffer(nstep, transitions_per_yield=K)``.
        gradient_steps: G, yields per upstream yield (>= 1).
    """

    def __init__(self, upstream: Any, gradient_steps: int) -> None:
        if gradient_steps < 1:
            raise ValueError(f"gradient_steps must be >= 1, got {gradient_steps}")
        self.upstream = upstream
        self.gradient_steps = int(gradient_steps)
        self._item: Any = None
        self._left = 0  # yields of the current item still to come

    def __iter__(self) -> Burst:
        return self

    def __next__(self) -> Any:
        if self._left == 0:
            self._item = next(self.upstream)
            self._left = self.gradient_steps
        self._left -= 1
        return self._item

    def __repr__(self) -> str:
        return f"Burst(gradient_steps={self.gradient_steps}) <- {self.upstream!r}"


def replay_stage(buffer: Any, gradient_steps: int) -> Any:
    """``buffer`` itself for one gradient step per yield (the plain pipeline), else a :class:`Burst` over it."""
    return buffer if gradient_steps == 1 else Burst(buffer, gradient_steps)

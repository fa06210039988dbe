"""n-step targets inside replayed windows: :func:`sequence_nstep_targets`, the learner's side of recurrent replay.

A :class:`~ptl_rl.replay.SequenceReplayBuffer` stores 1-step transitions (an
``NStepTransform`` upstream would end its episodes early); the learner folds
up to n of them at every position of a window with the field contract's
target rule. See docs/design/recurrent.md ("n-step targets inside windows").
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["sequence_nstep_targets"]


def sequence_nstep_targets(
    reward: torch.Tensor,
    discount: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    mask: torch.Tensor,
    next_values: torch.Tensor,
    n: int,
) -> torch.Tensor:
    """n-step targets float [B, T] at every position of windows of 1-step transitions.

    All inputs are [B, T] (a :class:`~ptl_rl.replay.SequenceReplayBuffer`
    batch, time second); ``next_values[:, t]`` is the bootstrap value of
    ``next_obs`` at position ``t``. From position ``t`` the walk sums up to
    ``n`` rewards, multiplying a running discount by each step's ``discount``
    field (never a gamma of its own), and stops after a step with
    ``terminated`` or ``truncated`` or before a position whose ``mask`` is
    False (the end of the window's real steps). The target is the sum plus
    ``running discount * (1 - terminated) * next_values`` of the last step
    summed: ``reward + discount * (1 - terminated) * V(next_obs)`` folded k
    times, as ``NStepTransform`` folds it. Positions whose ``mask`` is False
    get a target too; leave them out of the loss.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    shapes = {tuple(t.shape) for t in (reward, discount, terminated, truncated, mask, next_values)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(
            f"reward, discount, terminated, truncated, mask and next_values must all be [B, T], got {shapes}"
        )
    length = reward.shape[1]
    done = terminated.bool() | truncated.bool()
    mask = mask.bool()
    total = torch.zeros_like(next_values)
    running = torch.ones_like(next_values)
    positions = torch.arange(length, device=reward.device).expand_as(mask)
    last = positions.clone()  # the last position summed: its next_values bootstraps
    walking = mask.clone()
    for k in range(min(n, length)):  # a loop over the n offsets, each vectorized over all windows and positions
        at = _shift_left(mask, k, False) & walking
        total = total + torch.where(at, running * _shift_left(reward, k, 0.0), 0.0)
        running = torch.where(at, running * _shift_left(discount, k, 1.0), running)
        last = torch.where(at, positions + k, last)
        walking = at & ~_shift_left(done, k, True)
    alive = 1.0 - terminated.float().gather(1, last)
    return total + running * alive * next_values.gather(1, last)


def _shift_left(x: torch.Tensor, k: int, fill: Any) -> torch.Tensor:
    """``x[:, t + k]`` at position ``t`` (``fill`` past the end), for x [B, T]."""
    if k == 0:
        return x
    pad = torch.full((x.shape[0], k), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x[:, k:], pad], dim=1)

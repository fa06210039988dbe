"""NormalizationModule: a normalizer's statistics as an ``nn.Module`` layer, and the observation-shape check
that every apply path of the statistics shares.

The module is what lets the statistics travel with a policy's weights to collectors in other processes
(:meth:`~ptl_rl.normalization.normalizer.ObservationNormalizer.module`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def matches_shape(obs_shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Whether ``obs_shape`` ends with ``expected``: ``[B, *shape]``, one unbatched obs, or ``[B, T, *shape]``."""
    return obs_shape[len(obs_shape) - len(expected) :] == expected


def shape_error(obs_shape: tuple[int, ...], expected: tuple[int, ...], fix: str) -> ValueError:
    """The ``ValueError`` for observations of ``obs_shape`` against statistics of shape ``expected``, with ``fix``."""
    per_row = obs_shape[1:] if len(obs_shape) > len(expected) else obs_shape
    return ValueError(
        f"observations of shape {tuple(per_row)} per row (an input of shape {tuple(obs_shape)}), but the statistics "
        f"are of shape {tuple(expected)}: the shapes do not match. {fix}"
    )


class NormalizationModule(nn.Module):
    """``clip((x - shift) * scale)`` as an ``nn.Module`` whose ``shift``/``scale`` buffers travel with the weights.

    Made by :meth:`ObservationNormalizer.module`, which rewrites the buffers at every
    change of its statistics. A collector process builds its own with the same
    ``shape`` and ``clip`` (``NormalizationModule((11,), 10.0)``): the weights it is sent
    fill the buffers. Input ``[B, *shape]``, any numeric dtype; output float32.
    Input whose trailing dimensions are not ``shape``, and statistics of another
    shape given to :meth:`load`, are refused with a ``ValueError`` naming both shapes.
    """

    # buffers (state_dict entries), declared: nn.Module's __getattr__ would type them Tensor | Module
    shift: torch.Tensor
    scale: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float | None = 10.0) -> None:
        super().__init__()
        self.clip = None if clip is None else float(clip)
        self.register_buffer("shift", torch.zeros(shape, dtype=torch.float32))
        self.register_buffer("scale", torch.ones(shape, dtype=torch.float32))

    def load(self, shift: np.ndarray, scale: np.ndarray) -> None:
        """Write ``shift`` and ``scale``, each of the module's shape or ``()`` (one value for every dimension)."""
        shift_t, scale_t = torch.as_tensor(shift), torch.as_tensor(scale)
        for value in (shift_t, scale_t):
            if value.dim() and value.shape != self.shift.shape:
                raise ValueError(
                    f"statistics of shape {tuple(value.shape)} do not fit this NormalizationModule, of shape "
                    f"{tuple(self.shift.shape)}; nothing was loaded. Build the module with the shape of the "
                    "observations the statistics were learned on"
                )
        with torch.no_grad():
            self.shift.copy_(shift_t.expand_as(self.shift))
            self.scale.copy_(scale_t.expand_as(self.scale))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        expected = tuple(self.shift.shape)
        if not matches_shape(tuple(obs.shape), expected):
            raise shape_error(
                tuple(obs.shape),
                expected,
                "Feed the module the observations of the env its statistics come from, or build it with this "
                "env's observation shape (ObservationNormalizer(shape=env.single_observation_space.shape).module()).",
            )
        out = (obs.to(self.shift.dtype) - self.shift) * self.scale
        return out if self.clip is None else out.clamp(-self.clip, self.clip)

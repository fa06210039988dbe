"""Observations onto a network's device and dtype: :func:`obs_to_tensor` and the helpers agents read them with.

Every agent acts where its network lives: :class:`DeviceOf` reads the network's
device and floating dtype at each call, so moving the network (with Lightning,
or ``precision="bf16-true"``) needs nothing from the agent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ptl_rl.core.protocols import ObsTree


class DeviceOf:
    """The device of a module's first parameter, read on every call.

    ``Module.to()`` moves parameters in place (the Parameter object stays), so
    holding on to the first one follows the module across devices without
    walking ``parameters()`` on every step.
    """

    def __init__(self, net: nn.Module) -> None:
        self._probe = next(iter(net.parameters()), None)

    def __call__(self) -> torch.device:
        return self._probe.device if self._probe is not None else torch.device("cpu")

    def float_dtype(self) -> torch.dtype:
        """The network's floating dtype (bfloat16 under ``precision="bf16-true"``); float32 if it has no floats."""
        probe = self._probe
        return probe.dtype if probe is not None and probe.is_floating_point() else torch.float32


def obs_to_tensor(obs: ObsTree, device: torch.device, float_dtype: torch.dtype = torch.float32) -> Any:
    """Numpy observations (array or dict of arrays) -> tensors on ``device``.

    Floating arrays become ``float_dtype`` (pass the network's dtype, e.g.
    bfloat16 under ``precision="bf16-true"``); integer arrays such as uint8
    pixels keep their dtype, and the network converts them.
    """
    if isinstance(obs, dict):
        return {k: obs_to_tensor(v, device, float_dtype) for k, v in obs.items()}
    if type(obs) is np.ndarray and obs.flags.writeable and obs.dtype.isnative and obs.dtype.kind in "fiub":
        # what envs return: zero-copy and several times cheaper than as_tensor (~1 us vs ~3.5 us a call)
        t = torch.from_numpy(obs)
        t = t if getattr(device, "type", device) == "cpu" else t.to(device)
    else:
        t = torch.as_tensor(obs, device=device)
    return t.to(float_dtype) if t.is_floating_point() and t.dtype != float_dtype else t


def is_tensor_tree(obs: dict[str, Any]) -> bool:
    """Whether every leaf of the (nested) dict ``obs`` is already a tensor (training batches), not numpy."""
    return all(isinstance(v, torch.Tensor) or (isinstance(v, dict) and is_tensor_tree(v)) for v in obs.values())


def as_float(obs: Any, dtype: torch.dtype) -> Any:
    """Floating tensors -> ``dtype`` (the network's); integer observations are left to the network."""
    if isinstance(obs, dict):
        return {k: as_float(v, dtype) for k, v in obs.items()}
    return obs.to(dtype) if obs.is_floating_point() and obs.dtype != dtype else obs

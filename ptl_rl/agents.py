"""Agents: callables from a batch of observations to a batch of actions (and extras)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from ptl_rl.selectors import EpsilonGreedySelector


def _module_device(net: nn.Module) -> torch.device:
    for p in net.parameters():
        return p.device
    return torch.device("cpu")


class _DeviceOf:
    """The device of a module's first parameter, read on every call.

    ``Module.to()`` moves parameters in place (the Parameter object stays), so
    holding on to the first one follows the module across devices without
    walking ``parameters()`` on every step.
    """

    def __init__(self, net: nn.Module) -> None:
        self._probe = next(iter(net.parameters()), None)

    def __call__(self) -> torch.device:
        return self._probe.device if self._probe is not None else torch.device("cpu")


def obs_to_tensor(obs: Any, device: torch.device) -> Any:
    """Numpy observations (array or dict of arrays) -> tensors on ``device``.

    Float64 arrays become float32, the dtype networks expect.
    """
    if isinstance(obs, dict):
        return {k: obs_to_tensor(v, device) for k, v in obs.items()}
    t = torch.as_tensor(obs, device=device)
    return t.float() if t.dtype == torch.float64 else t


class DQNAgent:
    """Acts with a Q-network: ``q = net(obs)`` float [N, A], then ``selector(q)`` -> int64 [N].

    Observations are moved to the network's device (read at every call, so
    moving the network with Lightning just works). ``selector`` defaults to an
    epsilon-greedy selector; its epsilon schedule follows the env-step count
    that :class:`~ptl_rl.source.ExperienceSource` reports through
    :meth:`on_env_steps`.
    """

    def __init__(self, net: nn.Module, selector: Any | None = None) -> None:
        self.net = net
        self.selector = selector if selector is not None else EpsilonGreedySelector()
        self._device = _DeviceOf(net)

    @torch.no_grad()
    def __call__(self, obs: Any) -> np.ndarray:
        q = self.net(obs_to_tensor(obs, self._device()))
        return self.selector(q.cpu().numpy())

    def on_env_steps(self, total_steps: int) -> None:
        hook = getattr(self.selector, "on_env_steps", None)
        if hook is not None:
            hook(total_steps)


class PolicyAgent:
    """Samples actions from a categorical policy: ``net(obs)`` gives logits float [N, A].

    Returns ``(actions int64 [N], {"log_prob": float32 [N]})``; with
    ``greedy=True`` the most likely action instead of a sample.
    """

    def __init__(self, net: nn.Module, greedy: bool = False, seed: int | None = None) -> None:
        self.net = net
        self._device = _DeviceOf(net)
        self.greedy = greedy
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    @torch.no_grad()
    def __call__(self, obs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        logits = self.net(obs_to_tensor(obs, self._device())).float().cpu()
        log_probs = torch.log_softmax(logits, dim=-1)
        if self.greedy:
            actions = log_probs.argmax(dim=-1)
        else:
            actions = torch.multinomial(log_probs.exp(), 1, generator=self.generator).squeeze(-1)
        chosen = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return actions.numpy(), {"log_prob": chosen.numpy()}


class TargetNet(nn.Module):
    """A frozen copy of ``model`` for bootstrapped targets.

    :meth:`sync` copies the weights (hard update); :meth:`soft_sync` moves them
    by ``tau`` (Polyak averaging: ``target = (1 - tau) * target + tau * model``).
    Call it like the model: ``target(obs)``. It is an ``nn.Module`` holding only
    the copy, so as an attribute of a LightningModule it moves to the module's
    device and is saved in checkpoints, while ``model`` is not registered twice.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._source = [model]  # a list keeps the online model out of this module's parameters
        self.target = copy.deepcopy(model)
        self.target.requires_grad_(False)

    @property
    def model(self) -> nn.Module:
        return self._source[0]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.target(*args, **kwargs)

    @torch.no_grad()
    def sync(self) -> None:
        self.target.load_state_dict(self.model.state_dict())

    @torch.no_grad()
    def soft_sync(self, tau: float) -> None:
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau}")
        for target, source in zip(self.target.parameters(), self.model.parameters(), strict=True):
            target.lerp_(source, tau)
        for target, source in zip(self.target.buffers(), self.model.buffers(), strict=True):
            target.copy_(source)

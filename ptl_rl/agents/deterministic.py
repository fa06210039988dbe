"""A deterministic actor with Gaussian exploration noise (DDPG/TD3 style): :class:`DeterministicActorAgent`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ptl_rl.agents.distributions import ActionRescaler
from ptl_rl.agents.seeding import GeneratorPerDevice, SeededAgentState
from ptl_rl.agents.tensors import DeviceOf, obs_to_tensor
from ptl_rl.core.protocols import ObsTree
from ptl_rl.core.schedules import as_schedule


class DeterministicActorAgent(SeededAgentState):
    """Acts with a deterministic actor plus Gaussian exploration noise (DDPG/TD3 style), for Box spaces.

    ``actor(obs)`` gives policy actions float [N, D] in ``[-1, 1]`` (end it in
    ``tanh``). The agent adds ``N(0, noise_std^2)`` noise, clips to ``[-1, 1]``
    and returns ``(env_actions, {"policy_action": float32 [N, D]})``, with env
    actions from :class:`~ptl_rl.agents.distributions.ActionRescaler`.

    Args:
        noise_std: a float, or a schedule ``env_steps -> std`` such as
            :class:`~ptl_rl.core.schedules.LinearSchedule`; 0 acts greedily.
        warmup_steps: uniformly random policy actions until this many env steps.
        seed: seeds the noise generator.
    """

    action_spaces = (spaces.Box,)

    def __init__(
        self,
        actor: nn.Module,
        action_space: spaces.Box,
        *,
        noise_std: float | Any = 0.1,
        warmup_steps: int = 0,
        seed: int | None = None,
    ) -> None:
        self.actor = actor
        self.rescaler = ActionRescaler(action_space)
        self.schedule = as_schedule(noise_std)
        self.noise_std = float(self.schedule(0))
        self.warmup_steps = int(warmup_steps)
        self.total_steps = 0
        self._generator = GeneratorPerDevice(seed)
        self._actor_device = DeviceOf(actor)

    def on_env_steps(self, total_steps: int) -> None:
        self.total_steps = int(total_steps)
        self.noise_std = float(self.schedule(total_steps))

    @torch.inference_mode()  # cheaper than no_grad; the outputs leave as numpy
    def __call__(self, obs: ObsTree) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        device = self._actor_device()
        mean = self.actor(obs_to_tensor(obs, device, self._actor_device.float_dtype()))
        generator = self._generator(device)
        if self.total_steps < self.warmup_steps:
            action = torch.rand(mean.shape, generator=generator, device=device) * 2.0 - 1.0
        elif self.noise_std > 0.0:
            noise = torch.randn(mean.shape, generator=generator, device=device) * self.noise_std
            action = (mean + noise).clamp(-1.0, 1.0)
        else:
            action = mean.clamp(-1.0, 1.0)
        policy_action = action.float().cpu().numpy()
        return self.rescaler.to_env(policy_action), {"policy_action": policy_action}

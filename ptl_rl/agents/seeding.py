"""Seeded sampling for agents: one generator per device, and the state (env steps, RNGs) of an agent that samples.

Shared by :class:`~ptl_rl.agents.stochastic.StochasticPolicyAgent` and
:class:`~ptl_rl.agents.deterministic.DeterministicActorAgent`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ptl_rl.core.ranks import rank_seed
from ptl_rl.core.versions import check_version, versioned


def _seeded_generator(device: torch.device, seed: int | None) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # an unseeded torch.Generator would always start from the same fixed seed
    else:
        generator.manual_seed(int(seed))
    return generator


class GeneratorPerDevice:
    """One seeded generator per device: sampling happens where the network lives, without host round trips."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.base_seed = seed  # the seed given, before any rank offset
        self.rank = 0
        self._generators: dict[torch.device, torch.Generator] = {}

    def __call__(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = self._generators[device] = _seeded_generator(device, self.seed)
        return generator

    def set_rank(self, rank: int) -> None:
        """Re-seed for ``rank`` (a no-op when already there, so a restored state is kept)."""
        if int(rank) != self.rank:
            self.rank = int(rank)
            self.seed = rank_seed(self.base_seed, self.rank)
            self._generators.clear()

    def state_dict(self) -> dict[str, Any]:
        return {str(device): generator.get_state() for device, generator in self._generators.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for device, generator_state in state.items():
            self(torch.device(device)).set_state(generator_state)


class SeededAgentState:
    """``state_dict``/``set_rank`` of an agent whose only state is ``total_steps`` and its sampling generators."""

    _generator: GeneratorPerDevice
    total_steps: int

    def set_rank(self, rank: int) -> None:
        """Rank-distinct sampling under DDP."""
        self._generator.set_rank(rank)

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """Env-step count and sampling RNG states; the networks' weights live in the LightningModule."""
        state = {"total_steps": self.total_steps, "generators": self._generator.state_dict()}
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.on_env_steps(int(state["total_steps"]))  # type: ignore[attr-defined]
        self._generator.load_state_dict(state["generators"])

"""Recurrent actor-critic: the acting agent of recurrent PPO, and the network it acts with.

* :class:`RecurrentActorCritic`: encoder -> :class:`~ptl_rl.agents.recurrent.RecurrentCore`
  -> policy head and value head. ``step`` acts one step per env;
  ``unroll`` re-runs whole rollout sequences ``[B, T, ...]`` from their
  initial states, zeroing the state where an episode starts (training).
* :class:`RecurrentActorCriticAgent`: samples actions with such a network and
  keeps the hidden state of every sub-env between calls (the
  :class:`~ptl_rl.agents.recurrent.PerEnvState` it shares with
  :class:`~ptl_rl.agents.recurrent.RecurrentDQNAgent`). Extras: ``log_prob``,
  ``value`` and ``hidden`` (the state it acted *from*). A
  :class:`~ptl_rl.replay.RolloutBuffer` with ``sequence_length=L`` serves the
  rollout as sequences with those states and ``episode_start`` flags, and
  :meth:`RecurrentActorCriticAgent.evaluate_sequences` gives the PPO loss
  its log-probs, entropies and values. See docs/design/recurrent.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ptl_rl.agents.distributions import ActionDistribution, Categorical, MultiCategorical
from ptl_rl.agents.recurrent import PerEnvState
from ptl_rl.agents.stochastic import StochasticPolicyAgent
from ptl_rl.agents.tensors import is_tensor_tree, obs_to_tensor
from ptl_rl.core._trees import to_numpy, tree_leaves, tree_map
from ptl_rl.core.batch import TorchBatch
from ptl_rl.core.protocols import ObsTree, RecurrentActorCriticNet

__all__ = ["RecurrentActorCritic", "RecurrentActorCriticAgent"]


def _merge_time(obs: Any) -> Any:
    """[B, T, ...] tensors (or a dict of them) -> [B * T, ...]."""
    return tree_map(lambda t: t.flatten(0, 1), obs)


class RecurrentActorCritic(nn.Module):
    """``encoder`` -> ``core`` -> (``policy_head``, ``value_head``): a recurrent actor-critic with a shared memory.

    Args:
        encoder: obs [B, ...] -> features float [B, F] (an MLP; for pixels a CNN).
        core: a :class:`~ptl_rl.agents.recurrent.RecurrentCore` (``F`` -> ``H``), or any module with its
            ``initial_state``/``step``/``forward(x, state, mask, reset)`` (a feed-forward stand-in for a baseline).
        policy_head: features [B, H] -> the policy (``ptl_rl.action_head(space, H)``, or logits).
        value_head: features [B, H] -> float [B, 1] or [B].

    The encoder and the heads run once over all ``B * T`` positions of
    :meth:`unroll`; only the cell loops over time.
    """

    def __init__(self, encoder: nn.Module, core: nn.Module, policy_head: nn.Module, value_head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.policy_head, self.value_head = encoder, policy_head, value_head
        self.core: Any = core  # a RecurrentCore or a stand-in with its methods (nn.Module's typing hides them)

    def initial_state(self, batch_size: int) -> torch.Tensor:
        """Zeros float [batch_size, S]."""
        state: torch.Tensor = self.core.initial_state(batch_size)
        return state

    def step(self, obs: ObsTree, state: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """obs [N, ...] and state [N, S] -> (policy over N, value float [N], new state [N, S])."""
        out, new_state = self.core.step(self.encoder(obs), state)
        return self.policy_head(out), self.value_head(out).reshape(len(out)), new_state

    def unroll(self, obs: ObsTree, state: torch.Tensor, episode_start: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """obs [B, T, ...] from state [B, S], zeroed before flagged positions -> (policy over [B, T], value [B, T])."""
        b, t = episode_start.shape
        features = self.encoder(_merge_time(obs))
        out, _ = self.core(features.unflatten(0, (b, t)), state, None, episode_start)
        return self.policy_head(out), self.value_head(out).reshape(b, t)


class RecurrentActorCriticAgent(PerEnvState, StochasticPolicyAgent):
    """Acts with a :class:`RecurrentActorCriticNet` and holds the hidden state of every sub-env between calls.

    ``agent(obs [N, ...])`` runs ``net.step(obs, state)`` with each env's state
    and returns ``(actions, extras)``: the actions as
    :class:`~ptl_rl.agents.stochastic.StochasticPolicyAgent` samples them (Discrete,
    MultiDiscrete or 1-d Box), ``extras["log_prob"]`` and ``extras["value"]``
    (float32 [N]) and ``extras[state_field]`` float32 [N, S], the state each
    env acted **from**: a rollout's sequences start from it.

    The per-env state follows the rules of
    :class:`~ptl_rl.agents.recurrent.RecurrentDQNAgent` (they share
    :class:`~ptl_rl.agents.recurrent.PerEnvState`): zeroed through ``reset_state(mask)``
    by the source at every episode start, committed in the call's last
    statement (an interrupt leaves the old state), never changed in place,
    not saved in checkpoints (the restored source restarts every episode).
    One agent per source; an evaluation makes its own on the same network
    (``greedy=True`` acts with the policy's mode).

    The critic depends on the state, so this agent has no ``value(obs)``: a
    :class:`~ptl_rl.replay.RolloutBuffer` bootstraps through
    :meth:`next_value`, which recomputes the state after each row from its
    stored ``hidden``.

    Args:
        net: a :class:`RecurrentActorCriticNet`, e.g. :class:`RecurrentActorCritic`.
        action_space: the env's single action space.
        greedy: act with the policy's mode.
        seed: seeds the sampling generator.
        state_field: the name of the extra holding the state.
    """

    def __init__(
        self,
        net: nn.Module,
        action_space: spaces.Space[Any],
        *,
        greedy: bool = False,
        seed: int | None = None,
        state_field: str = "hidden",
    ) -> None:
        if not isinstance(net, nn.Module) or not isinstance(net, RecurrentActorCriticNet):
            raise TypeError(
                f"RecurrentActorCriticAgent needs a torch module with initial_state(n), step(obs, state) and "
                f"unroll(obs, state, episode_start), got {type(net).__name__}; use ptl_rl.RecurrentActorCritic"
            )
        super().__init__(net, action_space, greedy=greedy, seed=seed)
        self.net = net
        self.state_field = str(state_field)
        self._state = None  # [N, S]; None: zeros at the next call

    def _policy(self, out: Any) -> ActionDistribution:
        """The network's policy output (a distribution, or logits for a discrete space) as a distribution."""
        if self._num_scores is not None:
            self._check_logits(out)
        if isinstance(out, torch.Tensor):
            if isinstance(self.action_space, spaces.MultiDiscrete):
                return MultiCategorical(out, self.action_space.nvec)
            if isinstance(self.action_space, spaces.Discrete):
                return Categorical(out)
            raise TypeError("for a Box action space the policy head must return a distribution (ptl_rl.action_head)")
        return cast(ActionDistribution, out)  # (a Box space's policy head is an action_head)

    def _tensors(self, obs: Any) -> Any:
        if isinstance(obs, torch.Tensor) or (isinstance(obs, dict) and is_tensor_tree(obs)):
            return obs
        return obs_to_tensor(obs, self._actor_device(), self._actor_device.float_dtype())

    def distribution(self, obs: ObsTree) -> ActionDistribution:
        raise TypeError(
            "a recurrent policy depends on its state, not on obs alone: use evaluate_sequences(batch) on a "
            "RolloutBuffer(sequence_length=...) minibatch, or net.step(obs, state)"
        )

    # ------------------------------------------------------------------ acting
    @torch.inference_mode()  # cheaper than no_grad; the outputs leave as numpy
    def __call__(self, obs: ObsTree) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        obs_t = self._tensors(obs)
        state = self._acting_state(len(next(iter(tree_leaves(obs)))[1]), self.net.initial_state)
        out, value, new_state = self.net.step(obs_t, state)
        action, log_prob = self._choose(self._policy(out))
        extras = {"value": to_numpy(value.float()), self.state_field: to_numpy(state.float())}
        outputs = self._outputs(action, log_prob, extras)
        self._state = new_state  # the commit: an interrupt before this line leaves the state as it was
        return outputs

    @torch.inference_mode()
    def next_value(self, rows: Mapping[str, Any]) -> np.ndarray:
        """V(next_obs) float32 [R] of rollout rows (their ``obs``, ``next_obs`` and state field), for bootstrapping.

        The state after a row is recomputed from the state it acted from:
        ``step(obs, hidden)``, then the value of ``next_obs`` from there. With
        the acting weights that is exactly the state the agent held after the
        step (before any reset), whatever happened to the env since.
        """
        hidden = torch.as_tensor(np.asarray(rows[self.state_field]), device=self._actor_device())
        _, _, after = self.net.step(self._tensors(rows["obs"]), hidden.to(self._actor_device.float_dtype()))
        _, value, _ = self.net.step(self._tensors(rows["next_obs"]), after)
        return to_numpy(value.float())

    # ------------------------------------------------------------------ learning (with gradients)
    def evaluate_sequences(
        self, batch: TorchBatch | Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy, value)``, each float [B, T], of a sequence minibatch under the current weights.

        ``batch`` is a :class:`~ptl_rl.replay.RolloutBuffer` minibatch with
        ``sequence_length`` set: fields [B, T, ...], the state field, and
        ``episode_start`` bool [B, T]. Each sequence runs from its stored
        initial state ``batch[state_field][:, 0]`` (the state the agent acted
        from at its first row, so position 0 is never reset again) and is zeroed
        where the agent's state was. Padded positions (``batch.mask`` False)
        get values too: leave them out of the loss.
        """
        initial = batch[self.state_field][:, 0]
        episode_start = batch["episode_start"].bool().clone()
        episode_start[:, 0] = False  # the stored initial state already is the state acted from there
        out, value = self.net.unroll(batch["obs"], initial.to(self._actor_device.float_dtype()), episode_start)
        dist = self._policy(out)
        return dist.log_prob(self.policy_action(batch)), dist.entropy(), value

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._state = None  # the restored source starts every episode afresh

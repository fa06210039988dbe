"""Recurrent agents: a hidden state per sub-env, stored with each step, replayed as sequences (R2D2).

Two pieces, each usable alone (see docs/design/recurrent.md):

* :class:`RecurrentCore`: an LSTM or GRU cell whose state is **one** float
  tensor ``[B, S]`` (LSTM: ``h`` and ``c`` side by side, ``S = 2H``; GRU:
  ``S = H``), so that a state is an ordinary per-step field of a batch.
* :class:`RecurrentDQNAgent`: acts with a recurrent Q-network and keeps the
  state of every sub-env between calls. The source's ``reset_state(mask)``
  zeroes the rows of the envs that start an episode. Every call returns
  ``extras["hidden"]``: the state each env acted *from* (before the step's
  observation), which a :class:`~ptl_rl.replay.SequenceReplayBuffer` stores
  per step, so that ``batch.hidden[:, 0]`` is the state to start a window's
  burn-in from (R2D2's stored state).

The learner's n-step targets inside such windows are
:func:`~ptl_rl.agents.recurrent_targets.sequence_nstep_targets`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ptl_rl.agents.checks import check_output_width, check_selector, scores_width
from ptl_rl.agents.dqn import SelectorHooks
from ptl_rl.agents.selectors import EpsilonGreedySelector, Selector
from ptl_rl.agents.tensors import DeviceOf, obs_to_tensor
from ptl_rl.core._trees import to_numpy, tree_leaves
from ptl_rl.core.protocols import ObsTree, RecurrentQNet

__all__ = ["PerEnvState", "RecurrentCore", "RecurrentDQNAgent"]

_KINDS = ("lstm", "gru")


class RecurrentCore(nn.Module):
    """An LSTM or GRU cell with its state as one float tensor ``[B, S]``.

    Args:
        input_size: features per step, ``F``.
        hidden_size: ``H``, the width of the output (and of ``h``).
        kind: ``"lstm"`` (state ``[h, c]``, ``S = 2H``) or ``"gru"`` (state ``h``, ``S = H``).

    ``step(x [B, F], state [B, S]) -> (out [B, H], new_state [B, S])`` takes one
    step (acting); ``forward(x [B, T, F], state [B, S], mask [B, T])`` runs a
    sequence (training), carrying the state unchanged over positions whose
    ``mask`` is False (the padding of a replayed window). The output is always
    the first ``H`` entries of the state (``h``).

    Examples:
        >>> import torch
        >>> import ptl_rl
        >>> core = ptl_rl.RecurrentCore(3, 8, kind="lstm")
        >>> state = core.initial_state(2)
        >>> state.shape  # h and c of 2 sequences
        torch.Size([2, 16])
        >>> out, states = core(torch.randn(2, 5, 3), state, mask=torch.ones(2, 5, dtype=torch.bool))
        >>> out.shape, states.shape  # per position: the output and the state after it
        (torch.Size([2, 5, 8]), torch.Size([2, 5, 16]))
    """

    def __init__(self, input_size: int, hidden_size: int, kind: str = "lstm") -> None:
        super().__init__()
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if int(input_size) < 1 or int(hidden_size) < 1:
            raise ValueError(f"input_size and hidden_size must be >= 1, got {input_size} and {hidden_size}")
        self.kind = kind
        self.hidden_size = int(hidden_size)
        self.state_size = 2 * self.hidden_size if kind == "lstm" else self.hidden_size
        self.cell: nn.LSTMCell | nn.GRUCell = (
            nn.LSTMCell(int(input_size), self.hidden_size)
            if kind == "lstm"
            else nn.GRUCell(int(input_size), self.hidden_size)
        )

    def initial_state(
        self, batch_size: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """Zeros ``[batch_size, S]`` on the cell's device and in its dtype (unless given): a new episode's state."""
        weight = self.cell.weight_ih
        return torch.zeros(batch_size, self.state_size, device=device or weight.device, dtype=dtype or weight.dtype)

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``x`` float [B, F], ``state`` float [B, S] -> (output [B, H], new state [B, S])."""
        if state.ndim != 2 or state.shape != (x.shape[0], self.state_size):
            raise ValueError(
                f"state has shape {tuple(state.shape)}, expected {(x.shape[0], self.state_size)} (batch, state_size) "
                f"for input of shape {tuple(x.shape)}; make one with initial_state(batch_size)"
            )
        state = state.to(x.dtype)
        if isinstance(self.cell, nn.LSTMCell):
            h, c = self.cell(x, (state[:, : self.hidden_size], state[:, self.hidden_size :]))
            return h, torch.cat([h, c], dim=1)
        h = self.cell(x, state)
        return h, h

    def forward(
        self,
        x: torch.Tensor,
        state: torch.Tensor,
        mask: torch.Tensor | None = None,
        reset: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence: ``x`` float [B, T, F] from ``state`` [B, S] -> (outputs [B, T, H], states [B, T, S]).

        ``states[:, t]`` is the state after position ``t``. Where ``mask``
        (bool [B, T]) is False the position is skipped: the state is carried
        over unchanged and the output repeats its ``h``. Where ``reset``
        (bool [B, T]) is True the state is zeroed *before* position ``t``: an
        episode starts there (a rollout sequence that spans episodes, as
        recurrent PPO replays them).
        """
        if x.ndim != 3:
            raise ValueError(f"x must be [batch, time, features], got shape {tuple(x.shape)}; use step() for one step")
        for name, flags in (("mask", mask), ("reset", reset)):
            if flags is not None and tuple(flags.shape) != tuple(x.shape[:2]):
                expected = tuple(x.shape[:2])
                raise ValueError(f"{name} has shape {tuple(flags.shape)}, expected (batch, time) = {expected}")
        if state.ndim != 2 or state.shape != (x.shape[0], self.state_size):
            self.step(x[:, 0], state)  # raises the error that names the expected shape
        if mask is not None and bool(mask.all()):
            mask = None  # the common case (no padding): no per-step select
        # the state is carried as the cell's own (h, c) and joined once at the end: no cat per step
        lstm = isinstance(self.cell, nn.LSTMCell)
        h, c = state[:, : self.hidden_size], state[:, self.hidden_size :]  # c is empty for a GRU
        hs, cs = [], []
        if reset is not None and bool(reset.any()):
            keep_state = ~reset.bool()[..., None]  # [B, T, 1]: multiplied in, so no branch per position
        else:
            keep_state = None
        for t in range(x.shape[1]):  # a loop over positions (never over rows): the cell is sequential in time
            if keep_state is not None:
                h, c = h * keep_state[:, t], c * keep_state[:, t]
            if isinstance(self.cell, nn.LSTMCell):
                new_h, new_c = self.cell(x[:, t], (h, c))
            else:
                new_h, new_c = self.cell(x[:, t], h), c
            if mask is not None:
                keep = mask[:, t, None]
                new_h, new_c = torch.where(keep, new_h, h), torch.where(keep, new_c, c)
            h, c = new_h, new_c
            hs.append(h)
            cs.append(c)
        outputs = torch.stack(hs, dim=1)
        return outputs, torch.cat([outputs, torch.stack(cs, dim=1)], dim=2) if lstm else outputs


class PerEnvState:
    """The hidden state an acting agent keeps per sub-env, zeroed at episode starts: shared by the recurrent agents.

    An agent holds ``_state`` (float [N, S], or ``None``: zeros at the next
    call, for however many envs it gets), takes the state to act from with
    :meth:`_acting_state`, and commits the new one in its call's **last**
    statement (``self._state = new_state``), so that an interrupt anywhere
    before leaves the old state. :meth:`reset_state` builds a new tensor and
    assigns it in one statement; no state is ever changed in place, so a
    ``hidden`` array already handed out is never rewritten.
    """

    _state: torch.Tensor | None

    @property
    def state(self) -> torch.Tensor | None:
        """The state each env will act from at the next call, float [N, S] (``None``: zeros, N not known yet)."""
        return self._state

    def reset_state(self, mask: np.ndarray) -> None:
        """Zero the state of the envs ``mask`` (bool [N]) that start an episode; all of them forgets N too."""
        mask = np.asarray(mask, dtype=bool)
        state = self._state
        if state is None:
            return
        if mask.shape != (len(state),):
            raise ValueError(
                f"reset_state got a mask of shape {mask.shape}, but this agent holds the state of {len(state)} "
                f"envs; use one agent per ExperienceSource"
            )
        if mask.all():
            self._state = None  # the next call starts from zeros, for as many envs as it gets
            return
        keep = torch.from_numpy(~mask).to(state.device)[:, None]
        self._state = torch.where(keep, state, torch.zeros((), dtype=state.dtype, device=state.device))

    def _acting_state(self, n: int, initial_state: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """The state [n, S] to act from: the one held, or ``initial_state(n)`` (zeros) after a full reset."""
        state = self._state
        if state is None:
            return initial_state(n)
        if len(state) != n:
            raise ValueError(
                f"this agent holds the state of {len(state)} envs but got {n} observations: one agent acts for "
                "one ExperienceSource. For another env (an evaluation), make another agent on the same network"
            )
        return state


class RecurrentDQNAgent(PerEnvState, SelectorHooks):
    """Acts with a recurrent Q-network and holds the hidden state of every sub-env between calls.

    ``agent(obs [N, ...])`` runs ``net.step(obs, state)`` with each env's
    state, picks actions with ``selector(q)`` (int64 [N]) and returns
    ``(actions, {state_field: float32 [N, S]})``: the state each env acted
    **from**, i.e. before this step's observation. Stored per step by a
    :class:`~ptl_rl.replay.SequenceReplayBuffer`, it makes ``hidden[:, 0]``
    of a window the state to replay it from.

    The state lives here, one row per sub-env, from the first call on (zeros).
    :class:`~ptl_rl.stages.source.ExperienceSource` calls :meth:`reset_state` with the
    envs whose next observation starts an episode, in every autoreset mode, so
    no state crosses an episode start, and rows never mix: row ``i`` is only
    ever computed from row ``i``. Use one agent per source: evaluation gets its
    own (``RecurrentDQNAgent(net, ArgmaxSelector())`` shares the weights, not
    the state).

    Interrupts: a call computes the new state aside and commits it in its last
    statement, and :meth:`reset_state` builds a new tensor, so a call cut short
    leaves the state as it was (the source then resets every env anyway).
    The state is never changed in place, so the ``hidden`` arrays already
    handed out are never rewritten.

    Checkpoints: the per-env state is not saved (:meth:`state_dict` holds the
    selector's RNG and epsilon): the source restarts every episode after a
    restore, so a saved state would be reset before its first use.

    Args:
        net: a :class:`RecurrentQNet` (``initial_state`` and ``step``).
        selector: Q-values float [N, A] -> actions int64 [N]; default epsilon-greedy.
        state_field: the name of the extra holding the state.
    """

    action_spaces = (spaces.Discrete,)

    def __init__(self, net: nn.Module, selector: Selector | None = None, *, state_field: str = "hidden") -> None:
        if not isinstance(net, nn.Module) or not isinstance(net, RecurrentQNet):
            raise TypeError(
                f"RecurrentDQNAgent needs a torch module with initial_state(n) and step(obs, state), got "
                f"{type(net).__name__}; build it around ptl_rl.RecurrentCore (see the class's docs)"
            )
        check_selector(selector)
        self.net = net
        self.selector = selector if selector is not None else EpsilonGreedySelector()
        self.state_field = str(state_field)
        self._device = DeviceOf(net)
        self._state: torch.Tensor | None = None  # [N, S]; None: zeros at the next call (for however many envs)
        self._num_actions: int | None = None

    # ------------------------------------------------------------------ acting
    def check_action_space(self, action_space: spaces.Space[Any]) -> None:
        """Remember the env's number of actions: every call checks the Q-values' width against it."""
        if isinstance(action_space, spaces.Discrete):
            self._num_actions, self._space = scores_width(action_space), action_space

    @torch.no_grad()
    def __call__(self, obs: ObsTree) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        obs_t = obs_to_tensor(obs, self._device(), self._device.float_dtype())
        state = self._acting_state(len(next(iter(tree_leaves(obs)))[1]), self.net.initial_state)
        q, new_state = self.net.step(obs_t, state)
        if self._num_actions is not None and q.shape[-1] != self._num_actions:
            check_output_width(type(self).__name__, int(q.shape[-1]), self._space, "Q-values")
        actions = np.asarray(self.selector(to_numpy(q)))
        extras = {self.state_field: to_numpy(state.float())}
        self._state = new_state  # the commit: an interrupt before this line leaves the state as it was
        return actions, extras

    # ------------------------------------------------------------------ hooks (the selector's: SelectorHooks)
    # state_dict holds the selector's state only: not the per-env states (see the class), nor the weights
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._state = None  # the restored source starts every episode afresh

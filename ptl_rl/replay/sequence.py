"""SequenceReplayBuffer: a replay buffer that draws windows of consecutive steps, uniformly or by priority.

The named constructor of ``ReplayBuffer(..., draws=SequenceWindows(...))``;
the windows, their links and their priorities are the strategy's
(:mod:`ptl_rl.replay.windows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.protocols import Storage
from ptl_rl.core.schedules import Schedule
from ptl_rl.replay.buffer import ReplayBuffer
from ptl_rl.replay.draws import UniformDraws, WeightedSlots
from ptl_rl.replay.priority_draws import PrioritizedDraws
from ptl_rl.replay.windows import SequenceWindows


class SequenceReplayBuffer(ReplayBuffer):
    """Replay of sequences: ``B`` windows of ``burn_in + length`` steps, each from one episode of one env.

    A :class:`~ptl_rl.replay.ReplayBuffer` whose draws are
    ``SequenceWindows(length, burn_in, pad_end, draws=...)`` (see
    :class:`~ptl_rl.replay.SequenceWindows`, the strategy, reached as
    ``buffer.draws``: ``num_windows``, ``window_slots``), with
    ``PrioritizedDraws(alpha, beta, beta_clock, eps, stratified)`` for
    ``prioritized=True`` and ``UniformDraws(stratified=stratified)`` else.

    A batch holds every stored field as ``[B, burn_in + length, ...]`` (time
    second), ``mask`` (bool ``[B, burn_in + length]``), ``indices`` (the start
    slots) and ``generations``, and with ``prioritized=True`` ``weights`` and
    the ``batch.update_priorities(td_errors [B])`` link: the layout, the
    padding and the window starts are described there. A recurrent agent's
    state is stored like any agent extra (any field name, one row per step)
    and comes back per position.

    Args:
        length, burn_in, pad_end: the windows (see :class:`~ptl_rl.replay.SequenceWindows`).
        prioritized: draw windows proportionally to ``priority ** alpha`` of
            their start (with importance weights), else uniformly over the
            window starts.
        upstream, capacity, alpha, beta, beta_clock, eps, stratified, warmup, transitions_per_yield, seed: as for
            :class:`~ptl_rl.replay.PrioritizedReplayBuffer` (``alpha``,
            ``beta``, ``beta_clock``, ``eps`` only matter with ``prioritized``).
        storage: as for :class:`~ptl_rl.replay.ReplayBuffer`.

    Feed it 1-step transitions (straight from an ``ExperienceSource``): an
    episode ends at the step with ``terminated | truncated``. Stored batches
    need ``env_id``, ``terminated`` and ``truncated``; rows of one env must
    arrive in time order (any interleaving across envs).

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
        >>> buffer = ptl_rl.SequenceReplayBuffer(source, capacity=1_000, length=4, burn_in=2, warmup=20, seed=0)
        >>> windows = next(buffer).sample(3)
        >>> windows.obs.shape, windows.reward.shape, windows.mask.shape  # [B, burn_in + length, ...]
        ((3, 6, 4), (3, 6), (3, 6))
        >>> windows.mask  # the first window starts one step into its episode: one burn-in step is padding
        array([[False,  True,  True,  True,  True,  True],
               [ True,  True,  True,  True,  True,  True],
               [ True,  True,  True,  True,  True,  True]])
        >>> windows.env_id  # each window comes from one env
        array([[0, 0, 0, 0, 0, 0],
               [1, 1, 1, 1, 1, 1],
               [1, 1, 1, 1, 1, 1]])
    """

    draws: SequenceWindows  # (the strategy, typed as what this constructor builds)

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None = None,
        capacity: int = 100_000,
        *,
        length: int,
        burn_in: int = 0,
        pad_end: bool = False,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float | Schedule = 0.4,
        beta_clock: str = "learner",
        eps: float = 1e-6,
        stratified: bool = True,
        warmup: int | None = None,
        transitions_per_yield: int = 1,
        seed: int | None = None,
        storage: Callable[[int], Storage] | None = None,
    ) -> None:
        starts: WeightedSlots
        if prioritized:
            starts = PrioritizedDraws(alpha=alpha, beta=beta, beta_clock=beta_clock, eps=eps, stratified=stratified)
        else:
            starts = UniformDraws(stratified=stratified)
        super().__init__(
            upstream,
            capacity,
            warmup=warmup,
            transitions_per_yield=transitions_per_yield,
            seed=seed,
            storage=storage,
            draws=SequenceWindows(length, burn_in, pad_end, draws=starts),
        )

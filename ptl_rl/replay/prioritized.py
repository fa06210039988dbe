"""PrioritizedReplayBuffer: proportional prioritized replay (Schaul et al. 2016) on a vectorized sum-tree.

The named constructor of ``ReplayBuffer(..., draws=PrioritizedDraws(...))``;
the draws, the importance weights and the priority feedback are the
strategy's (:mod:`ptl_rl.replay.priority_draws`, whose docstring has the
formulas).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.protocols import Storage
from ptl_rl.core.schedules import Schedule
from ptl_rl.replay.buffer import ReplayBuffer
from ptl_rl.replay.priority_draws import PrioritizedDraws


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay; same stage and standalone behaviour as :class:`ReplayBuffer`.

    A :class:`~ptl_rl.replay.ReplayBuffer` whose draws are
    ``PrioritizedDraws(alpha, beta, beta_clock, eps, stratified)`` (see
    :class:`~ptl_rl.replay.PrioritizedDraws`, the strategy, reached as
    ``buffer.draws``: ``beta``, ``priorities()``, ``stale_updates``,
    ``applied_updates``).

    Args:
        upstream, capacity, warmup, transitions_per_yield, seed: as for
            :class:`~ptl_rl.replay.ReplayBuffer`.
        alpha: priority exponent (0 = uniform), ``>= 0``.
        beta: importance-sampling exponent: a float, or a schedule
            ``step -> beta`` such as ``LinearSchedule(0.4, 1.0, 100_000)``.
        beta_clock: the step a schedule is called with: ``"learner"`` (number of
            batches sampled so far) or ``"env"`` (transitions added so far).
        eps: added to every priority, so that no transition becomes unreachable (``> 0``).
        stratified: draw one target from each of ``B`` equal segments of the
            total priority mass (lower variance, as in the paper) instead of
            ``B`` independent targets. Either way ``P(i)`` is proportional to ``(p_i + eps) ** alpha``.

    New transitions get the largest priority among the transitions stored
    when they arrive, excluding the ones they overwrite (1.0 in an empty
    buffer): found with the max-tree kept beside the sum-tree.

    :meth:`sample` returns the stored fields ``[B, ...]`` plus ``indices``
    (int64 [B]), ``generations`` (int64 [B]) and ``weights`` (float32 [B]).

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
        >>> buffer = ptl_rl.PrioritizedReplayBuffer(capacity=100, alpha=1.0, beta=1.0, seed=0)
        >>> for _ in range(4):
        ...     slots = buffer.add(next(source))
        >>> batch = buffer.sample(4)
        >>> sorted(field for field in batch.keys() if field not in ptl_rl.CORE_FIELDS)
        ['generations', 'indices', 'weights']
        >>> batch.weights  # all priorities are equal so far
        array([1., 1., 1., 1.], dtype=float32)
        >>> batch.update_priorities(np.array([0.5, -2.0, 1.0, 0.0]))  # TD errors; returns the stale rows skipped
        0
        >>> buffer.update_priorities(np.arange(8), [4.0, 0, 0, 0, 0, 0, 0, 0])  # or by slot
        0
        >>> buffer.sample(4).indices  # now slot 0 holds almost all the mass
        array([0, 0, 0, 0])
        >>> buffer.draws.stale_updates, buffer.draws.applied_updates
        (0, 12)
    """

    draws: PrioritizedDraws  # (the strategy, typed as what this constructor builds)

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None = None,
        capacity: int = 100_000,
        *,
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
        super().__init__(
            upstream,
            capacity,
            warmup=warmup,
            transitions_per_yield=transitions_per_yield,
            seed=seed,
            storage=storage,
            draws=PrioritizedDraws(alpha=alpha, beta=beta, beta_clock=beta_clock, eps=eps, stratified=stratified),
        )

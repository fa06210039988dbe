"""Generalized advantage estimation (GAE(lambda)) over time-major arrays of several envs.

For one env's sequence of transitions ``t = 0 .. T-1``::

    delta_t = reward_t + discount_t * (1 - terminated_t) * next_value_t - value_t
    A_t     = delta_t + discount_t * lambda * (1 - end_t) * A_{t+1}
    R_t     = A_t + value_t                      (the critic's regression target)

``next_value_t`` is ``V(next_obs_t)``: inside an episode the next row's
``value``; at a truncation, or where the data stops (the last row of a
rollout), the critic's value of the real final observation ``next_obs_t``;
irrelevant at a termination (masked). ``end_t`` marks every place where the
recursion must not look at row ``t + 1``: a termination, a truncation, the
last row of the sequence, or padding. A truncation therefore bootstraps
(through ``delta_t``) but never chains into the next episode. ``discount_t``
is the batch's ``discount`` field (``gamma`` for 1-step data), so gamma is set
once, on the :class:`~ptl_rl.stages.source.ExperienceSource`.
"""

from __future__ import annotations

import numpy as np


def compute_gae(
    reward: np.ndarray,
    value: np.ndarray,
    next_value: np.ndarray,
    discount: np.ndarray,
    terminated: np.ndarray,
    end: np.ndarray,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns of time-major sequences.

    Args:
        reward, value, next_value, discount: float [T, N] (or [T]); row ``t``
            of column ``n`` is env ``n``'s ``t``-th transition.
        terminated: bool [T, N]; no bootstrap from ``next_value`` there.
        end: bool [T, N]; the recursion stops after these rows (episode ends,
            the last row of each env, padding). Must include ``terminated``
            and every truncation.
        gae_lambda: lambda in [0, 1]; 0 gives 1-step TD errors, 1 Monte-Carlo
            returns bootstrapped at the ends.

    Returns:
        ``(advantage, returns)``, float64 [T, N] (or [T]). The one Python loop
        runs over time steps, vectorized across envs.
    """
    if not 0.0 <= gae_lambda <= 1.0:
        raise ValueError(f"gae_lambda must be in [0, 1], got {gae_lambda}")
    reward = np.asarray(reward, dtype=np.float64)
    value = np.asarray(value, dtype=np.float64)
    discount = np.asarray(discount, dtype=np.float64)
    terminated = np.asarray(terminated, dtype=bool)
    bootstrap = np.where(terminated, 0.0, np.asarray(next_value, dtype=np.float64))
    delta = reward + discount * bootstrap - value
    carry = np.where(np.asarray(end, dtype=bool), 0.0, discount * gae_lambda)  # weight of A_{t+1} in A_t
    advantage = np.empty_like(delta)
    running = np.zeros(delta.shape[1:], dtype=np.float64)
    for t in range(delta.shape[0] - 1, -1, -1):
        running = delta[t] + carry[t] * running
        advantage[t] = running
    return advantage, advantage + value

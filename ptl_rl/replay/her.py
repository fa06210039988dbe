"""HERReplayBuffer: hindsight experience replay, relabeling goals at sampling time.

The named constructor of ``ReplayBuffer(..., draws=HindsightGoals(...))``;
the episode index, the draws and the relabeling are the strategy's
(:mod:`ptl_rl.replay.hindsight`, whose docstring describes the strategies).
"""

from __future__ import annotations

from collections.abc import Iterator

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.buffer import ReplayBuffer
from ptl_rl.replay.hindsight import GoalFunction, HindsightGoals


class HERReplayBuffer(ReplayBuffer):
    """Uniform replay of the steps of complete episodes, a ``her_ratio`` share of each batch relabeled in hindsight.

    A :class:`~ptl_rl.replay.ReplayBuffer` whose draws are
    ``HindsightGoals(compute_reward, ...)`` (see
    :class:`~ptl_rl.replay.HindsightGoals`, the strategy, reached as
    ``buffer.draws``: ``her_ratio``, ``num_sampleable``, ``episodes``),
    drawing the steps with ``UniformDraws(stratified=True)``.

    What it stores and what a sampled batch holds (``relabeled``, ``indices``,
    ``generations``, the relabeled goals and rewards) are described there.

    Args:
        upstream: iterator of 1-step :class:`TransitionBatch` es, or ``None`` to fill by hand with :meth:`add`.
        capacity: transitions kept; the oldest are overwritten (and with them, for sampling, the rest of their
            episode).
        compute_reward: ``(achieved [R, *goal], desired [R, *goal], info) -> rewards [R]``, vectorized over rows,
            e.g. ``env.unwrapped.compute_reward`` of a gymnasium-robotics env (for a vector env, that of one
            sub-env: ``vec_env.envs[0].unwrapped.compute_reward``). ``info`` is ``{}``: infos are not stored.
        compute_terminated: ``None`` (default, as SB3) keeps the stored ``terminated``; or a function like
            ``compute_reward`` returning bools [R] (``env.unwrapped.compute_terminated``) for envs whose episode
            ends when the goal is reached, so a relabeled row that reaches its new goal does not bootstrap.
        strategy: ``"future"`` (default), ``"final"`` or ``"episode"`` (see :mod:`ptl_rl.replay.hindsight`).
        n_sampled_goal: relabeled rows per real row (>= 0); ``her_ratio = 1 - 1 / (n_sampled_goal + 1)``,
            0.8 for the default 4.
        achieved_goal_key, desired_goal_key: the keys of the goals in the observation dicts.
        warmup, transitions_per_yield, seed: as for :class:`~ptl_rl.ReplayBuffer`. As a stage, the first yield
            also waits until an episode is complete.

    Examples:
        >>> import numpy as np
        >>> import ptl_rl
        >>> def steps(goals, desired, done):  # one env; obs and next_obs share the dict layout
        ...     goals = np.asarray(goals, dtype=np.float32)[:, None]
        ...     obs = {"achieved_goal": goals - 1, "desired_goal": np.full_like(goals, desired)}
        ...     next_obs = {"achieved_goal": goals, "desired_goal": np.full_like(goals, desired)}
        ...     return ptl_rl.TransitionBatch(
        ...         obs=obs, next_obs=next_obs, action=np.zeros(len(goals), dtype=np.int64),
        ...         reward=np.full(len(goals), -1.0, dtype=np.float32), terminated=np.zeros(len(goals), dtype=bool),
        ...         truncated=np.array(done), discount=np.full(len(goals), 0.9, dtype=np.float32),
        ...         env_id=np.zeros(len(goals), dtype=np.int64))
        >>> reward = lambda achieved, desired, info: (achieved == desired).all(-1) - 1.0  # 0 on the goal, else -1
        >>> buffer = ptl_rl.HERReplayBuffer(capacity=100, compute_reward=reward, strategy="final", seed=0)
        >>> _ = buffer.add(steps([1, 2, 3], desired=9, done=[False, False, True]))  # an episode that missed goal 9
        >>> batch = buffer.sample(6)
        >>> batch.relabeled
        array([ True,  True,  True, False, False,  True])
        >>> batch.obs["desired_goal"][:, 0]  # relabeled rows: the goal reached at the end, 3
        array([3., 3., 3., 9., 9., 3.], dtype=float32)
        >>> batch.next_obs["achieved_goal"][:, 0]
        array([1., 1., 2., 2., 3., 3.], dtype=float32)
        >>> batch.reward  # recomputed for the relabeled rows: the last step reached goal 3
        array([-1., -1., -1., -1., -1.,  0.], dtype=float32)
    """

    draws: HindsightGoals  # (the strategy, typed as what this constructor builds)

    def __init__(
        self,
        upstream: Iterator[TransitionBatch] | None = None,
        capacity: int = 100_000,
        *,
        compute_reward: GoalFunction,
        compute_terminated: GoalFunction | None = None,
        strategy: str = "future",
        n_sampled_goal: int = 4,
        achieved_goal_key: str = "achieved_goal",
        desired_goal_key: str = "desired_goal",
        warmup: int | None = None,
        transitions_per_yield: int = 1,
        seed: int | None = None,
    ) -> None:
        goals = HindsightGoals(
            compute_reward,
            compute_terminated,
            strategy=strategy,
            n_sampled_goal=n_sampled_goal,
            achieved_goal_key=achieved_goal_key,
            desired_goal_key=desired_goal_key,
        )
        super().__init__(
            upstream, capacity, warmup=warmup, transitions_per_yield=transitions_per_yield, seed=seed, draws=goals
        )

"""ExperienceSource: steps gymnasium environments with an agent and yields transition batches.

The source is the first stage of a pipeline. It accepts a single
``gymnasium.Env`` or a ``gymnasium.vector.VectorEnv`` (sync, async, or any
object with that API), calls the agent once per vector step on the whole
batch of observations, and yields a :class:`~ptl_rl.core.batch.TransitionBatch`
of the 1-step transitions of that step.

All three gymnasium autoreset modes are handled so that no transition spans a
reset and ``next_obs`` is always the real final observation of an episode:

* next-step (gymnasium's default): the step after an episode end only resets
  that sub-env; its row is dropped from the batch.
* same-step: the final observation is taken from ``info["final_obs"]``.
* disabled: the source resets finished sub-envs itself with ``reset_mask``.

A step cut short (a ``KeyboardInterrupt``, an exception in the env or the
agent, a non-finite value) may have stepped some sub-envs without the source
recording it, and an env cannot be stepped back: so the guard's restore
(:meth:`ExperienceSource.restore`) makes the next step reset every sub-env,
and the stream is marked cut for the stages downstream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import numpy as np

from ptl_rl.core._reprs import env_name, stage_repr
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.clock import StageClock
from ptl_rl.core.episode import Episode
from ptl_rl.core.protocols import Agent, EnvLike, RankAware, Stateful
from ptl_rl.core.stage import Stage
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.envs.checks import NEXT_STEP, SAME_STEP
from ptl_rl.stages.agent_call import AgentCall
from ptl_rl.stages.env_stepper import EnvStepper
from ptl_rl.stages.episodes import EpisodeTracker
from ptl_rl.stages.finite import FiniteCheck


def _saves_agent_state(agent: object) -> TypeGuard[Stateful]:
    """Whether the source checkpoints ``agent``'s state: a Stateful agent, except a torch module.

    A module's ``state_dict`` is its weights, which live in the LightningModule's own checkpoint.
    """
    return isinstance(agent, Stateful) and not hasattr(agent, "parameters")


class ExperienceSource(Stage[TransitionBatch]):
    """Steps ``env`` with ``agent`` and yields one :class:`TransitionBatch` per vector step.

    Args:
        env: a ``gymnasium.Env`` (treated as one sub-env) or a
            ``gymnasium.vector.VectorEnv`` with ``N = env.num_envs`` sub-envs.
        agent: a callable ``obs -> actions`` or ``obs -> (actions, extras)``.
            ``obs`` always has a leading dimension ``N`` (also for a single
            env); ``actions`` must have shape ``[N, *single_action_space.shape]``
            and each extra a leading dimension ``N``. Optional hooks, used when
            present: ``agent.reset_state(mask: bool[N])`` is called before the
            agent first sees a new episode's observation (recurrent state), and
            ``agent.on_env_steps(total_steps: int)`` after each step (schedules).
        gamma: the ``discount`` of the 1-step transitions this source yields
            (an :class:`~ptl_rl.stages.nstep.NStepTransform` downstream recomputes it).
        seed: sub-env ``i`` is reset with seed ``seed + rank * N + i`` at the
            first step; ``None`` leaves the envs unseeded.
        rank: index of this source among several (DDP rank or remote worker);
            it offsets both the seeds and ``env_id``. ``None`` (default): 0,
            unless the Lightning adapter assigns the DDP rank before the first
            step (:meth:`set_rank`); an explicit value is never overridden.
        cast_float64: store float64 observations as float32 (the default; see below).
        autoreset_mode: ``"NextStep"``, ``"SameStep"`` or ``"Disabled"``;
            read from ``env.metadata["autoreset_mode"]`` when omitted.
        stats_window: how many recent episodes :meth:`episode_stats` averages.
        max_pending_episodes: how many finished episodes :meth:`pop_episodes`
            keeps for its next call; older ones are discarded (their statistics
            still count in :meth:`episode_stats` and ``episodes_finished``), so a
            run that never pops does not grow without bound.
        check_finite: raise a ``FloatingPointError`` naming the field and the
            sub-env when a reward or a float observation is NaN or infinite
            (one dot product per field and step). ``False`` turns the check off.
        steps_per_batch: ``K``, the vector steps behind each yielded batch
            (a chunk). ``K > 1`` yields the rows of K consecutive vector steps
            (each with rows) in one batch, in time order, so that the stages
            downstream pay their fixed cost once per K steps: set it to a
            replay's ``transitions_per_yield / N`` and the data is the same as
            with ``K = 1``. The agent still acts at every step; per-step
            stages (the normalization stages) need ``K = 1``.
        observation_transform: what the agent is shown instead of the env's observations, e.g. an
            :class:`~ptl_rl.ObservationNormalizer` (``obs [N, ...] -> obs [N, ...]``). Yielded batches keep the
            env's own observations; :class:`~ptl_rl.NormalizeObservations` downstream decides what the learner
            gets and updates the statistics.

    Each yielded batch has ``B <= N`` rows (a sub-env that is only resetting
    contributes none) with fields ``obs [B, *obs_shape]``, ``action
    [B, *action_shape]``, ``reward`` float32 [B], ``next_obs``, ``terminated``
    and ``truncated`` bool [B], ``discount`` float32 [B] (= gamma), ``env_id``
    int64 [B], plus the agent's extras (``B <= K * N`` with ``steps_per_batch=K``,
    step by step in time order).

    Observations keep the observation space's dtype (uint8 pixels stay uint8),
    with one exception: float64 observations (most classic-control envs outside
    gymnasium's own) become float32, the dtype networks use, so the agent acts
    on and the buffer stores what the learner trains on. ``cast_float64=False``
    keeps float64 end to end.

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> push_left = lambda obs: np.zeros(len(obs), dtype=np.int64)  # any callable obs [N, 4] -> actions [N]
        >>> source = ptl_rl.ExperienceSource(env, push_left, gamma=0.99, seed=0)
        >>> batch = next(source)
        >>> batch.obs.shape, batch.obs.dtype, batch.action.shape, batch.env_id
        ((2, 4), dtype('float32'), (2,), array([0, 1]))
        >>> batch.reward, batch.discount, batch.terminated
        (array([1., 1.], dtype=float32), array([0.99, 0.99], dtype=float32), array([False, False]))
        >>> for _ in range(30):
        ...     batch = next(source)
        >>> [(e.env_id, e.ret, e.length) for e in source.pop_episodes()]  # always pushing left fails fast
        [(1, 10.0, 10), (0, 11.0, 11), (1, 9.0, 9), (0, 9.0, 9), (1, 9.0, 9), (0, 9.0, 9)]
    """

    one_row_per_env = True  # each yielded batch holds at most one transition per sub-env

    def __init__(
        self,
        env: EnvLike,
        agent: Agent,
        *,
        gamma: float = 0.99,
        seed: int | None = None,
        rank: int | None = None,
        autoreset_mode: str | None = None,
        stats_window: int = 100,
        cast_float64: bool = True,
        max_pending_episodes: int = 10_000,
        check_finite: bool = True,
        steps_per_batch: int = 1,
        observation_transform: Callable[[Any], Any] | None = None,
    ) -> None:
        stepper = EnvStepper(env, autoreset_mode, cast_float64)
        if not callable(agent):
            raise TypeError(f"agent must be callable as agent(obs) -> actions, got {type(agent).__name__}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        if max_pending_episodes < 1:
            raise ValueError(f"max_pending_episodes must be >= 1, got {max_pending_episodes}")
        if int(steps_per_batch) != steps_per_batch or steps_per_batch < 1:
            raise ValueError(f"steps_per_batch must be an integer >= 1 (vector steps per batch), got {steps_per_batch}")
        super().__init__(None)  # a source pulls from no stage
        self.steps_per_batch = int(steps_per_batch)
        # a chunk holds several steps of each env: stages that need one step per batch check this
        self.one_row_per_env = self.steps_per_batch == 1
        self._env = stepper
        self.env = stepper.env
        self.check_finite = bool(check_finite)
        self.gamma = float(gamma)
        self.seed = seed
        self.rank = int(rank or 0)
        self._rank_is_explicit = rank is not None
        self.is_vector = stepper.is_vector
        self.num_envs = stepper.num_envs
        self.action_space = stepper.action_space
        self.autoreset_mode = stepper.autoreset_mode
        self._agent_call = AgentCall(agent, self.num_envs, self.action_space)
        # what the agent is shown instead of the env's observations (an ObservationNormalizer); batches keep the
        # env's own: a stage downstream decides what it yields
        self.observation_transform = observation_transform

        n = self.num_envs
        self._set_env_ids()
        self._discount = np.full(n, self.gamma, dtype=np.float32)
        self._discount.flags.writeable = False
        self._no_env = np.zeros(n, dtype=bool)
        self._finite = FiniteCheck(n) if self.check_finite else None
        self._episodes = EpisodeTracker(self._env_ids, stats_window, max_pending_episodes)
        self._obs: Any = None
        self._fresh = np.ones(n, dtype=bool)  # envs whose current obs starts an episode
        self._resetting = np.zeros(n, dtype=bool)  # next-step mode: the next step only resets these
        self._any_resetting = False  # whether _resetting has a True: read once per step, kept with it
        self._reset_count = 0
        # time accounting (ptl_rl.profile): the env step and the agent call are parts of the source's own time
        self.clock = StageClock("source bookkeeping", "transitions", (stepper.clock, self._agent_call.clock))

    @property
    def agent(self) -> Agent:
        """What the source acts with. Assigning another agent (a collector stamping versions) checks it anew."""
        return self._agent_call.agent

    @agent.setter
    def agent(self, agent: Agent) -> None:
        self._agent_call = AgentCall(agent, self.num_envs, self.action_space)
        self.clock.parts = (self._env.clock, self._agent_call.clock)

    # ------------------------------------------------------------------ stage
    def step(self) -> TransitionBatch:
        """One vector step's transitions (or ``K`` steps' with ``steps_per_batch=K``), after a reset if due."""
        if self._obs is None:
            self._reset_all()
        if self.steps_per_batch == 1:
            while True:
                batch = self._step()
                if batch is not None:
                    return batch
        # a chunk: fresh arrays per batch (a batch is the caller's to keep, so no buffer is reused)
        steps: list[TransitionBatch] = []
        while len(steps) < self.steps_per_batch:
            batch = self._step()
            if batch is not None:
                steps.append(batch)
        return TransitionBatch.concat(steps)

    def snapshot(self) -> object:
        return None  # an env cannot be stepped back: restore resets every sub-env instead

    def restore(self, snapshot: object) -> None:
        """After a step cut short: the next step resets every sub-env (episodes in progress are abandoned)."""
        self._obs = None

    # ------------------------------------------------------------------ rank
    def set_rank(self, rank: int) -> None:
        """Take the DDP rank (or worker index) ``rank``: it offsets the env seeds and ``env_id``.

        Called by the Lightning adapter before the first step; ignored when the
        source was built with an explicit ``rank``. The agent gets the rank too
        (its ``set_rank``, if it has one), for rank-distinct exploration.
        """
        if self._rank_is_explicit or int(rank) == self.rank:
            return
        if self._obs is not None:
            raise RuntimeError(
                f"this ExperienceSource has already stepped as rank {self.rank}; it cannot become rank {rank}. "
                "Build the pipeline inside each process, or pass rank= explicitly."
            )
        self.rank = int(rank)
        self._set_env_ids()
        self._episodes.env_ids = self._env_ids
        if isinstance(self.agent, RankAware):
            self.agent.set_rank(self.rank)

    def _set_env_ids(self) -> None:
        # shared by every batch, so read-only: a consumer that writes to one fails loudly
        self._env_ids = np.arange(self.num_envs, dtype=np.int64) + self.rank * self.num_envs
        self._env_ids.flags.writeable = False

    @property
    def env_ids(self) -> np.ndarray:
        """The ``env_id`` of each sub-env (int64 [N], read-only): ``rank * N + i``."""
        return self._env_ids

    # ------------------------------------------------------------------ episodes
    @property
    def total_steps(self) -> int:
        """Env steps taken by all sub-envs together (a step cut short may be counted)."""
        return self._episodes.total_steps

    @property
    def episodes_finished(self) -> int:
        """Episodes finished so far (also those :meth:`pop_episodes` no longer holds)."""
        return self._episodes.episodes_finished

    def recent_episodes(self) -> list[Episode]:
        """The last ``stats_window`` finished episodes, oldest first (not consumed, unlike :meth:`pop_episodes`)."""
        return list(self._episodes.recent)

    def pop_episodes(self) -> list[Episode]:
        """Episodes finished since the last call (each returned once), oldest first.

        At most ``max_pending_episodes`` are kept between calls: when more finish, the oldest
        are dropped from this list (not from :meth:`episode_stats`).
        """
        return self._episodes.pop()

    def episode_stats(self) -> dict[str, float]:
        """Mean return and length of the last ``stats_window`` episodes, and counters."""
        return self._episodes.stats()

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """Counters and recent episodes (plain containers, ``weights_only``-safe).

        Environment state cannot be checkpointed in general, so the episodes in
        progress are not saved: after :meth:`load_state_dict` every sub-env starts a
        new episode.
        """
        state = {**self._episodes.state_dict(), "reset_count": self._reset_count}
        if _saves_agent_state(self.agent):
            state["agent"] = self.agent.state_dict()
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self._episodes.load_state_dict(state)
        self._reset_count = int(state["reset_count"])
        self._obs = None  # forces a fresh reset of every sub-env on the next step
        self.state_replaced()
        if "agent" in state:  # exploration resumes where it was: epsilon, noise scale, RNG states
            agent = self.agent
            if not _saves_agent_state(agent):
                raise TypeError(
                    f"the checkpoint holds the state of a Stateful agent, but this source's agent "
                    f"({type(agent).__name__}) has no state_dict/load_state_dict of its own (or is a torch module, "
                    "whose weights live in the LightningModule's checkpoint): build the source with the kind of "
                    "agent the checkpoint was saved with"
                )
            agent.load_state_dict(state["agent"])

    # ------------------------------------------------------------------ internals
    def _reset_seeds(self) -> list[int] | None:
        if self.seed is None:
            return None
        # the first reset uses seed + rank*N + i; resets after a restore use fresh, still distinct seeds
        base = self.seed + self.rank * self.num_envs + self._reset_count * 1_000_003
        return [base + i for i in range(self.num_envs)]

    def _reset_all(self) -> None:
        """Reset every sub-env (the first step, after a cut step, after a restore): a cut in every env's stream."""
        self.mark_cut()  # downstream stages must not join steps across it
        self._obs = self._env.reset(self._reset_seeds())
        if self._finite is not None:
            self._finite.field(self._obs, "reset observation", self._env_ids, self.total_steps)
        self._reset_count += 1
        self._fresh = np.ones(self.num_envs, dtype=bool)
        self._resetting, self._any_resetting = self._no_env, False
        self._episodes.restart_all()

    def _act(self) -> tuple[np.ndarray, dict[str, Any]]:
        obs = self._obs if self.observation_transform is None else self.observation_transform(self._obs)
        return self._agent_call(obs, self._fresh)

    def _step(self) -> TransitionBatch | None:
        actions, extras = self._act()
        obs, reward, terminated, truncated, info = self._env.step(actions, self._env_ids)
        done = terminated | truncated
        any_done = int(np.count_nonzero(done)) > 0  # (a Python bool: the stubs type the count as np.intp)
        next_obs = self._env.final_obs(obs, done, info) if any_done and self.autoreset_mode == SAME_STEP else obs
        raw_reward = reward
        reward = np.asarray(reward, dtype=np.float32)
        if self._finite is not None:
            self._finite.step(reward, next_obs, obs, self._env_ids, self._episodes.total_steps)
        full = TransitionBatch.wrap(
            {
                "obs": self._obs,
                "action": actions,
                "reward": reward,
                "next_obs": next_obs,
                "terminated": terminated,
                "truncated": truncated,
                "discount": self._discount,
                "env_id": self._env_ids,
                **extras,
            }
        )
        just_reset = self._resetting if self._any_resetting else None
        batch: TransitionBatch | None = full
        stepped = self.num_envs
        if just_reset is not None:
            # these rows only reset their sub-env: (final obs, ignored action, reset obs) is no transition
            keep = (~just_reset).nonzero()[0]
            stepped = len(keep)
            batch = full.rows(keep) if stepped else None  # (one env: a reset step yields nothing)
        # the episode returns add the env's own rewards (float64 for gymnasium's vector envs: no mixed-dtype add)
        returns = raw_reward if type(raw_reward) is np.ndarray and raw_reward.dtype == np.float64 else reward
        self._episodes.step(returns, done, any_done, just_reset, stepped)
        self._obs = obs
        if self.autoreset_mode == NEXT_STEP and self.is_vector:
            self._fresh = just_reset if just_reset is not None else self._no_env
            self._resetting, self._any_resetting = done, any_done
        else:
            self._fresh = done
            if any_done:
                self._reset_finished(done)
        if self._agent_call.on_env_steps is not None:
            self._agent_call.on_env_steps(self._episodes.total_steps)  # (the counter, not the property: per step)
        return batch

    def _reset_finished(self, done: np.ndarray) -> None:
        """Reset the sub-envs that ended where the env does not do it itself, and check their observations."""
        obs = self._env.reset_finished(done)
        if obs is None:
            return  # same-step: the vector env reset them itself, and _step checked those observations
        self._obs = obs
        if self._finite is not None:
            self._finite.field(self._obs, "reset observation", self._env_ids, self.total_steps)

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``ExperienceSource(CartPole-v1 x8, env_steps=..., episodes=...)``: the env, its sub-envs, the counters."""
        return stage_repr(
            self, f"{env_name(self.env)} x{self.num_envs}", env_steps=self.total_steps, episodes=self.episodes_finished
        )

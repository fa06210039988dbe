"""HERReplayBuffer: hindsight experience replay, relabeling goals at sampling time.

Goal-conditioned envs (the gymnasium-robotics API) observe a dict with
``achieved_goal`` and ``desired_goal`` and compute their reward from the two
(``env.unwrapped.compute_reward(achieved, desired, info)``). Hindsight
experience replay (Andrychowicz et al. 2017) replays a failed episode as if
a goal it did reach had been the goal all along. Each transition is stored
once; a sampled row is relabeled with probability
``her_ratio = 1 - 1 / (n_sampled_goal + 1)`` (``n_sampled_goal`` relabeled rows
per real one, as SB3 defines it): its ``obs["desired_goal"]`` and
``next_obs["desired_goal"]`` become the ``next_obs["achieved_goal"]`` of a step
of the same episode, and its ``reward`` (and, on request, ``terminated``) is
recomputed for that goal. Which step (``t`` the sampled step, ``T`` its
episode's length):

* ``future``: uniform over ``t .. T-1``: a goal reached by this step or a later one (the step itself included, as
  in SB3);
* ``final``: ``T-1``, the goal reached at the episode's end;
* ``episode``: uniform over ``0 .. T-1``.

Only steps of complete episodes are sampled (see
:mod:`ptl_rl.replay.episodes`): an episode becomes sampleable at its last
step and stops being sampleable when the ring overwrites its first step, so
every goal a strategy may pick is stored whenever the step is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core._trees import to_numpy
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.episodes import EpisodeIndex, EpisodePlan
from ptl_rl.replay.indexed import IndexedReplayBuffer, check_reserved_fields
from ptl_rl.replay.storage import ArrayStorage

STRATEGIES = ("future", "final", "episode")
RELABELED = "relabeled"  # the bool field a sampled batch carries: which rows got a hindsight goal
_REQUIRED_FIELDS = ("obs", "next_obs", "env_id", "terminated", "truncated")
GoalFunction = Callable[[np.ndarray, np.ndarray, Any], Any]


class HERReplayBuffer(IndexedReplayBuffer):
    """Uniform replay of the steps of complete episodes, a ``her_ratio`` share of each batch relabeled in hindsight.

    Stored batches need dict observations with ``achieved_goal`` and
    ``desired_goal`` (in ``obs`` and ``next_obs``, same trailing shape), and
    ``env_id``, ``terminated``, ``truncated``: an env's episode ends at its row
    with ``terminated | truncated``, and an env's rows must arrive in time order.
    Feed it 1-step transitions (an ``ExperienceSource``, or
    ``NStepTransform(n=1)``); n-step windows are refused, since a relabeled goal
    would change every reward of the window.

    A sampled batch (numpy from :meth:`sample`, torch after the sampler) has the
    stored fields, with in the relabeled rows ``obs[desired_goal_key]`` and
    ``next_obs[desired_goal_key]`` set to the new goal, ``reward`` (float32 [B])
    set to ``compute_reward(next_obs[achieved_goal_key], goal, {})`` and, with
    ``compute_terminated``, ``terminated`` (bool [B]) set likewise; ``truncated``,
    ``discount``, ``action`` and the extras are kept. It also carries
    ``relabeled`` (bool [B]), ``indices`` and ``generations`` (int64 [B], the
    slots drawn and their write stamps). Each row is relabeled independently
    with probability ``her_ratio``, so every row, whatever the batch size, is
    a draw from the same mixture.

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
        strategy: ``"future"`` (default), ``"final"`` or ``"episode"`` (see the module docstring).
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

    storage: ArrayStorage  # always (the buffer builds its own), so its ``fields`` are there to read

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
        _check_goal_function(compute_reward, "compute_reward")
        if compute_terminated is not None:
            _check_goal_function(compute_terminated, "compute_terminated")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if not isinstance(n_sampled_goal, (int, np.integer)) or isinstance(n_sampled_goal, bool) or n_sampled_goal < 0:
            raise ValueError(
                f"n_sampled_goal must be an integer >= 0 (relabeled rows per real one), got {n_sampled_goal!r}"
            )
        _refuse_nstep(upstream)
        super().__init__(
            upstream,
            capacity,
            prioritized=False,  # uniform over the steps of complete episodes
            alpha=0.0,
            beta=0.0,
            beta_clock="learner",
            eps=1.0,
            stratified=True,
            warmup=warmup,
            transitions_per_yield=transitions_per_yield,
            seed=seed,
            storage=None,
        )
        self.compute_reward = compute_reward
        self.compute_terminated = compute_terminated
        self.strategy = strategy
        self.n_sampled_goal = int(n_sampled_goal)
        self.her_ratio = 1.0 - 1.0 / (self.n_sampled_goal + 1)
        self.achieved_goal_key = achieved_goal_key
        self.desired_goal_key = desired_goal_key
        self.episodes = EpisodeIndex(self.capacity)

    @property
    def num_sampleable(self) -> int:
        """Stored steps that can be sampled now: those of complete episodes."""
        return int(np.count_nonzero(self.episodes.length[: len(self.storage)]))

    # ------------------------------------------------------------------ stage
    def step(self) -> HERReplayBuffer:
        waiting = not self.tree.total > 0.0
        while not self.tree.total > 0.0:  # no step of a complete episode yet: nothing to sample
            self._credit += len(self._pull())
        super().step()
        if waiting:  # like the warm-up, the wait for a first episode pays for the first yield only
            self._credit = min(self._credit, 0)
        return self

    def _add_pulled(self, batch: TransitionBatch) -> np.ndarray:
        """Add a batch pulled from upstream, first ending every episode if the stream was cut."""
        if self.consume_cut():
            # steps are missing between the last batch added and this one (the source reset its envs after an
            # interrupt or a restore, or someone pulled batches in between): no episode may run across the gap
            self.end_episodes()
        return self.add(batch)

    def end_episodes(self) -> None:
        """End every env's running episode at its last stored step: it becomes complete and sampleable.

        Called by the buffer itself when its stream is cut (the source reset its envs, batches were pulled
        behind the buffer's back, a step of its own was cut short), and by :meth:`load_state_dict`; call it
        when feeding :meth:`add` by hand from streams that were cut. The goals of a closed episode are those of
        the steps stored so far: all reached later in the same trajectory, so relabeling with them stays valid.
        """
        self.settle()
        self._journal.write(self._close_all)

    def _close_all(self) -> None:
        plan = self.episodes.plan_close()  # (changes nothing)
        self._journal.advance(lambda: self._apply(plan.slots, plan))
        self._apply(plan.slots, plan)

    # ------------------------------------------------------------------ adding
    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Store the ``B`` steps of ``batch`` and index their episodes; returns their slots (int64 [B]).

        One write of the guard, in two phases: the rows (an add cut short there is written
        again into the same slots), then the episode index, whose changes are planned first
        (changing nothing) and then applied with plain assignments (a cut there is finished
        from the plan). A batch the storage refuses (``ValueError``/``TypeError``) changes
        nothing and is forgotten.
        """
        # (no settle() first: the journal's write finishes a cut add itself, after recording this batch)
        if self.storage.fields is None:  # later batches must match the first one's fields: the storage checks that
            self._check_fields(batch)
        if len(batch) > self.capacity:  # only the newest `capacity` rows survive; index them chunk by chunk
            chunks = [self.add(batch.rows(slice(lo, lo + self.capacity))) for lo in range(0, len(batch), self.capacity)]
            return chunks[-1]
        env = np.asarray(batch["env_id"])
        if len(env) and env.min() < 0:
            raise ValueError(f"env_id must be >= 0 (it indexes the running episode of each env), got {env.min()}")
        return self._journal.write(self._store_and_index, batch)

    def _store_and_index(self, batch: TransitionBatch) -> np.ndarray:
        slots = self.storage.add(batch)
        if len(slots):
            env = np.asarray(batch["env_id"], dtype=np.int64)
            done = np.asarray(batch["terminated"], dtype=bool) | np.asarray(batch["truncated"], dtype=bool)
            plan = self.episodes.plan_add(slots, env, done)  # (changes nothing)
            self._journal.advance(lambda: self._apply(slots, plan))
            self._apply(slots, plan)
        return slots

    def _apply(self, slots: np.ndarray, plan: EpisodePlan) -> None:
        self._stamp(slots)  # (from the storage's counters, final once the rows are written)
        self.episodes.apply(plan, self.tree)

    def _check_fields(self, batch: TransitionBatch) -> None:
        """Refuse, before any change, a batch without the fields and goals that relabeling needs."""
        check_reserved_fields(batch)
        if RELABELED in batch:
            raise ValueError(f"field {RELABELED!r} is added to sampled batches by this buffer; rename the agent extra")
        missing = [name for name in _REQUIRED_FIELDS if name not in batch]
        if missing:
            raise ValueError(f"a HERReplayBuffer needs the fields {missing} to find episodes and goals; add them")
        shapes: dict[str, tuple[int, ...]] = {}
        for field in ("obs", "next_obs"):
            value = batch[field]
            keys = (self.achieved_goal_key, self.desired_goal_key)
            if not isinstance(value, dict) or any(key not in value for key in keys):
                found = sorted(value) if isinstance(value, dict) else type(value).__name__
                raise ValueError(
                    f"a HERReplayBuffer needs dict observations with the goals {list(keys)} in {field!r}; got "
                    f"{found}. Use a goal-conditioned env (gymnasium-robotics' API) or pass achieved_goal_key= and "
                    "desired_goal_key="
                )
            for key in keys:
                shapes[f"{field}.{key}"] = np.shape(value[key])[1:]
        if len(set(shapes.values())) != 1:
            raise ValueError(f"the achieved and desired goals must have one shape per row; got {shapes}")

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` steps of complete episodes, drawn uniformly, a ``her_ratio`` share of them relabeled."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.settle()
        if not self.tree.total > 0.0:
            raise ValueError(
                f"no episode has ended yet ({len(self.storage)} steps stored, none in a complete episode); HER "
                "samples only steps of complete episodes, so set warmup above the longest episode times the "
                "number of envs, or end the episodes (terminated/truncated, or end_episodes())"
            )
        slots, _ = self._draw(batch_size)
        batch = self.storage.gather(slots)
        relabeled = self.rng.random(batch_size) < self.her_ratio
        rows = np.flatnonzero(relabeled)
        if len(rows):
            self._relabel(batch, rows, slots[rows])
        batch[RELABELED] = relabeled
        return self._finish(batch, slots, None)

    def _relabel(self, batch: TransitionBatch, rows: np.ndarray, slots: np.ndarray) -> None:
        """Give ``rows`` of ``batch`` (drawn from ``slots``) a goal from their episode, and its reward."""
        _, goal_slots = self.episodes.goal_steps(slots, self.strategy, self.rng)
        stored = self.storage.fields
        assert stored is not None  # the rows to relabel were sampled from stored ones
        goals = stored["next_obs"][self.achieved_goal_key].take(goal_slots, axis=0)
        batch["obs"][self.desired_goal_key][rows] = goals
        batch["next_obs"][self.desired_goal_key][rows] = goals
        achieved = batch["next_obs"][self.achieved_goal_key][rows]
        batch["reward"][rows] = _per_row(self.compute_reward(achieved, goals, {}), len(rows), "compute_reward")
        if self.compute_terminated is not None:
            done = self.compute_terminated(achieved, goals, {})
            batch["terminated"][rows] = _per_row(done, len(rows), "compute_terminated")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """As the parent's (contents, drawable marks, stamps, RNG), plus the episode index (``weights_only``-safe).

        One RNG draws the slots, which rows are relabeled and their goals; it is saved with the rest.
        """
        self.settle()
        state = super().state_dict()
        state["episodes"] = self.episodes.state_dict(len(self.storage))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state. Episodes in flight are ended: the source starts new ones after a restore."""
        if "episodes" not in state:
            raise ValueError(
                "this state has no episode index (saved from a buffer other than a HERReplayBuffer); load it into "
                "the kind of buffer that saved it"
            )
        super().load_state_dict(state)  # (drops an add a cut left: the restored state replaces it)
        self.episodes.load_state_dict(state["episodes"])
        self.end_episodes()

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """Steps stored, steps sampleable (in complete episodes), the relabeling, and the chain upstream."""
        return stage_repr(
            self,
            **self._size_counters(),
            sampleable=self.num_sampleable,
            transitions_per_yield=self.transitions_per_yield,
            strategy=self.strategy,
            n_sampled_goal=self.n_sampled_goal,
        )


def _check_goal_function(fn: Any, name: str) -> None:
    """Raise unless ``fn`` can be called (an env passed instead of its method gets a hint)."""
    if callable(fn):
        return
    hint = " (that is an env: pass its unwrapped method)" if hasattr(fn, "unwrapped") else ""
    raise TypeError(
        f"{name} must be a function (achieved, desired, info) -> one value per row, got {type(fn).__name__}{hint}; "
        f"e.g. {name}=env.unwrapped.{name} of a gymnasium-robotics env"
    )


def _per_row(values: Any, rows: int, name: str) -> np.ndarray:
    """``values`` returned by ``name`` as one value per relabeled row ([R], or [R, 1]); raises naming the fix."""
    array = to_numpy(values)
    if array.shape == (rows,) or (array.size == rows and array.ndim == 2 and array.shape[1] == 1):
        reshaped: np.ndarray = array.reshape(rows)
        return reshaped
    raise ValueError(
        f"{name} returned shape {array.shape} for {rows} relabeled rows; it must be vectorized: goals "
        f"[R, *goal_shape] in, one value per row [R] out (as gymnasium-robotics envs do)"
    )


def _refuse_nstep(upstream: Any) -> None:
    """Refuse an upstream chain with an n-step transform (n > 1): a new goal would change every reward summed."""
    from ptl_rl.core.chain import pipeline_stages  # noqa: PLC0415
    from ptl_rl.stages.nstep import NStepTransform  # noqa: PLC0415 - nstep imports nothing from buffers, but keep it local

    for stage in pipeline_stages(upstream) if upstream is not None else []:
        if isinstance(stage, NStepTransform) and stage.n > 1:
            raise ValueError(
                f"HERReplayBuffer relabels 1-step transitions, but its upstream has NStepTransform(n={stage.n}): "
                "a relabeled goal would change every reward of the window (and where it ends), which the stored "
                "sum cannot give. Feed it the ExperienceSource directly, or use n=1"
            )

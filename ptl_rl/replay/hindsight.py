"""HindsightGoals: draws steps of complete episodes and relabels their goals at sampling time (HER).

Goal-conditioned envs (the gymnasium-robotics API) observe a dict with
``achieved_goal`` and ``desired_goal`` and compute their reward from the two
(``env.unwrapped.compute_reward(achieved, desired, info)``). Hindsight
experience replay (Andrychowicz et al. 2017) replays a failed episode as if
a goal it did reach had been the goal all along. Each transition is stored
once; a drawn row is relabeled with probability
``her_ratio = 1 - 1 / (n_sampled_goal + 1)`` (``n_sampled_goal`` relabeled rows
per real one, as SB3 defines it): its ``obs["desired_goal"]`` and
``next_obs["desired_goal"]`` become the ``next_obs["achieved_goal"]`` of a step
of the same episode, and its ``reward`` (and, on request, ``terminated``) is
recomputed for that goal. Which step (``t`` the drawn step, ``T`` its
episode's length):

* ``future``: uniform over ``t .. T-1``: a goal reached by this step or a later one (the step itself included, as
  in SB3);
* ``final``: ``T-1``, the goal reached at the episode's end;
* ``episode``: uniform over ``0 .. T-1``.

Only steps of complete episodes are drawn (see
:mod:`ptl_rl.replay.episodes`): an episode becomes drawable at its last
step and stops being drawable when the ring overwrites its first step, so
every goal a strategy may pick is stored whenever the step is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ptl_rl.core._trees import to_numpy
from ptl_rl.core.batch import Numbers, TransitionBatch
from ptl_rl.core.protocols import Storage
from ptl_rl.core.protocols.draws import Advance
from ptl_rl.replay.draws import UniformDraws, WeightedSlots
from ptl_rl.replay.episodes import EpisodeIndex, EpisodePlan
from ptl_rl.replay.feedback import check_reserved_fields
from ptl_rl.replay.storage import ArrayStorage
from ptl_rl.replay.sumtree import SumTree

STRATEGIES = ("future", "final", "episode")
RELABELED = "relabeled"  # the bool field a sampled batch carries: which rows got a hindsight goal
_REQUIRED_FIELDS = ("obs", "next_obs", "env_id", "terminated", "truncated")
GoalFunction = Callable[[np.ndarray, np.ndarray, Any], Any]


class HindsightGoals:
    """Steps of complete episodes, drawn by ``draws``, a ``her_ratio`` share of each batch relabeled in hindsight.

    Stored batches need dict observations with ``achieved_goal`` and
    ``desired_goal`` (in ``obs`` and ``next_obs``, same trailing shape), and
    ``env_id``, ``terminated``, ``truncated``: an env's episode ends at its row
    with ``terminated | truncated``, and an env's rows must arrive in time order.
    Feed it 1-step transitions (an ``ExperienceSource``, or
    ``NStepTransform(n=1)``); an n-step upstream is refused, since a relabeled
    goal would change every reward of the window. The buffer must keep its
    rows in an :class:`~ptl_rl.replay.ArrayStorage` (the goals are read from
    its arrays).

    A batch (numpy from ``sample``, torch after the sampler) has the stored
    fields, with in the relabeled rows ``obs[desired_goal_key]`` and
    ``next_obs[desired_goal_key]`` set to the new goal, ``reward`` (float32 [B])
    set to ``compute_reward(next_obs[achieved_goal_key], goal, {})`` and, with
    ``compute_terminated``, ``terminated`` (bool [B]) set likewise; ``truncated``,
    ``discount``, ``action`` and the extras are kept. It also carries
    ``relabeled`` (bool [B]), ``indices`` and ``generations`` (int64 [B], the
    slots drawn and their write stamps), and with
    :class:`~ptl_rl.replay.PrioritizedDraws` ``weights`` (float32 [B]) and
    the priority feedback link. Each row is relabeled independently with
    probability ``her_ratio``, so every row, whatever the batch size, is a
    draw from the same mixture.

    Args:
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
        draws: how the steps are drawn: ``UniformDraws(stratified=True)`` (the default) or a
            :class:`~ptl_rl.replay.PrioritizedDraws` (by the priority fed back for each step).

    Examples:
        >>> import numpy as np
        >>> import ptl_rl
        >>> reward = lambda achieved, desired, info: (achieved == desired).all(-1) - 1.0  # 0 on the goal, else -1
        >>> goals = ptl_rl.HindsightGoals(reward, strategy="final", draws=ptl_rl.PrioritizedDraws())
        >>> buffer = ptl_rl.ReplayBuffer(capacity=100, draws=goals, seed=0)
        >>> reached = np.arange(1.0, 4.0, dtype=np.float32)[:, None]  # an episode of 3 steps that missed goal 9
        >>> _ = buffer.add(ptl_rl.TransitionBatch(
        ...     obs={"achieved_goal": reached - 1, "desired_goal": np.full_like(reached, 9)},
        ...     next_obs={"achieved_goal": reached, "desired_goal": np.full_like(reached, 9)},
        ...     reward=np.full(3, -1.0, dtype=np.float32), env_id=np.zeros(3, dtype=np.int64),
        ...     terminated=np.zeros(3, dtype=bool), truncated=np.array([False, False, True])))
        >>> batch = buffer.sample(4)
        >>> batch.obs["desired_goal"][:, 0], batch.relabeled  # relabeled rows: the goal reached at the end, 3
        (array([9., 9., 3., 3.], dtype=float32), array([False, False,  True,  True]))
        >>> batch.update_priorities(np.array([1.0, 0.5, 0.0, 2.0]))  # with PrioritizedDraws, one TD error per row
        0
    """

    def __init__(
        self,
        compute_reward: GoalFunction,
        compute_terminated: GoalFunction | None = None,
        strategy: str = "future",
        n_sampled_goal: int = 4,
        achieved_goal_key: str = "achieved_goal",
        desired_goal_key: str = "desired_goal",
        draws: WeightedSlots | None = None,
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
        if draws is not None and not isinstance(draws, WeightedSlots):
            raise TypeError(
                f"draws must be a UniformDraws or a PrioritizedDraws (how steps are drawn), got {type(draws).__name__}"
            )
        self.compute_reward = compute_reward
        self.compute_terminated = compute_terminated
        self.strategy = strategy
        self.n_sampled_goal = int(n_sampled_goal)
        self.her_ratio = 1.0 - 1.0 / (self.n_sampled_goal + 1)
        self.achieved_goal_key = achieved_goal_key
        self.desired_goal_key = desired_goal_key
        self.draws: WeightedSlots = UniformDraws(stratified=True) if draws is None else draws

    @property
    def tree(self) -> SumTree:
        """The sum-tree of draw weights: 0 for a step of no complete episode."""
        return self.draws.tree

    @property
    def generations(self) -> np.ndarray:
        """The write stamp of each slot (int64 [capacity], -1 for a slot never written)."""
        return self.draws.generations

    @property
    def num_sampleable(self) -> int:
        """Stored steps that can be drawn now: those of complete episodes."""
        return int(np.count_nonzero(self.episodes.length[: len(self.storage)]))

    # ------------------------------------------------------------------ the strategy of a buffer
    def bind(self, storage: Storage, upstream: Iterator[TransitionBatch] | None) -> None:
        """Draw steps of ``storage`` (an ArrayStorage) fed by ``upstream`` (which must not sum n steps)."""
        _refuse_nstep(upstream)
        if not isinstance(storage, ArrayStorage):
            raise TypeError(
                f"HindsightGoals reads the goals from an ArrayStorage's arrays; this buffer keeps its rows in a "
                f"{type(storage).__name__}. Create the buffer without storage= (an ArrayStorage)"
            )
        self.draws.bind_weights(storage)
        self.storage: ArrayStorage = storage
        self.episodes = EpisodeIndex(storage.capacity)

    def check(self, batch: TransitionBatch) -> None:
        """Refuse, before any change, a batch without the fields and goals that relabeling needs."""
        if self.storage.fields is None:  # later batches must match the first one's fields: the storage checks that
            self._check_fields(batch)
        env = np.asarray(batch["env_id"])
        if len(env) and env.min() < 0:
            raise ValueError(f"env_id must be >= 0 (it indexes the running episode of each env), got {env.min()}")

    def added(self, slots: np.ndarray, old_size: int, batch: TransitionBatch, advance: Advance) -> None:
        """Index the episodes of the steps just written at ``slots``: planned (changing nothing), then applied.

        The plan holds absolute values, so once it is made (``advance``) a cut is
        finished by applying it again; before that the add is redone whole.
        """
        env = np.asarray(batch["env_id"], dtype=np.int64)
        done = np.asarray(batch["terminated"], dtype=bool) | np.asarray(batch["truncated"], dtype=bool)
        weight = self.draws.weight_for_new(slots, old_size)  # 1, or the largest priority of the steps kept
        plan = self.episodes.plan_add(slots, env, done)  # (changes nothing)
        advance(lambda: self._apply(slots, plan, weight))
        self._apply(slots, plan, weight)

    def end_episodes(self, advance: Advance) -> None:
        """End every env's running episode at its last stored step: it becomes complete and drawable.

        The goals of a closed episode are those of the steps stored so far: all
        reached later in the same trajectory, so relabeling with them stays valid.
        """
        weight = self.draws.weight_for_new(np.zeros(0, dtype=np.int64), len(self.storage))
        plan = self.episodes.plan_close()  # (changes nothing)
        advance(lambda: self._apply(plan.slots, plan, weight))
        self._apply(plan.slots, plan, weight)

    def _apply(self, slots: np.ndarray, plan: EpisodePlan, weight: float) -> None:
        self.draws.stamp(slots)  # (from the storage's counters, final once the rows are written)
        self.episodes.apply(plan, self.draws.tree, weight)

    def _check_fields(self, batch: TransitionBatch) -> None:
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
    def ready(self) -> bool:
        return self.draws.tree.total > 0.0

    def sample(self, rng: np.random.Generator, batch_size: int) -> TransitionBatch:
        """``batch_size`` steps of complete episodes, a ``her_ratio`` share of them relabeled (see the class)."""
        if not self.ready():
            raise ValueError(
                f"no episode has ended yet ({len(self.storage)} steps stored, none in a complete episode); HER "
                "samples only steps of complete episodes, so set warmup above the longest episode times the "
                "number of envs, or end the episodes (terminated/truncated, or end_episodes())"
            )
        slots, weights = self.draws.draw_slots(rng, batch_size)
        batch = self.storage.gather(slots)
        relabeled = rng.random(batch_size) < self.her_ratio
        rows = np.flatnonzero(relabeled)
        if len(rows):
            self._relabel(batch, rows, slots[rows], rng)
        batch[RELABELED] = relabeled
        return self.draws.finish(batch, slots, weights, self)

    def _relabel(self, batch: TransitionBatch, rows: np.ndarray, slots: np.ndarray, rng: np.random.Generator) -> None:
        """Give ``rows`` of ``batch`` (drawn from ``slots``) a goal from their episode, and its reward."""
        _, goal_slots = self.episodes.goal_steps(slots, self.strategy, rng)
        stored = self.storage.fields
        assert stored is not None  # the rows to relabel were drawn from stored ones
        goals = stored["next_obs"][self.achieved_goal_key].take(goal_slots, axis=0)
        batch["obs"][self.desired_goal_key][rows] = goals
        batch["next_obs"][self.desired_goal_key][rows] = goals
        achieved = batch["next_obs"][self.achieved_goal_key][rows]
        batch["reward"][rows] = _per_row(self.compute_reward(achieved, goals, {}), len(rows), "compute_reward")
        if self.compute_terminated is not None:
            done = self.compute_terminated(achieved, goals, {})
            batch["terminated"][rows] = _per_row(done, len(rows), "compute_terminated")

    def update_priorities(self, indices: Numbers, priorities: Numbers, generations: Numbers | None = None) -> int:
        """Set the priorities of the steps ``indices`` (see :class:`~ptl_rl.replay.PrioritizedDraws`)."""
        return self.draws.update_priorities(indices, priorities, generations, drawable="steps of complete episodes")

    # ------------------------------------------------------------------ the guard, state and repr
    def snapshot(self) -> object:
        return None  # the index changes only in the planned phase, which is finished from its plan

    def restore(self, snapshot: Any) -> None:
        """Nothing to put back: before ``advance`` nothing of the index changed."""

    def counters(self) -> dict[str, object]:
        """Steps that can be drawn now (in complete episodes) and the relabeling."""
        return {"sampleable": self.num_sampleable, "strategy": self.strategy, "n_sampled_goal": self.n_sampled_goal}

    def state_dict(self) -> dict[str, Any]:
        """Drawable marks (weights), stamps, and the episode index (``weights_only``-safe).

        One RNG, the buffer's, draws the slots, which rows are relabeled and their goals; it is saved with the rest.
        """
        state = self.draws.weights_state_dict(len(self.storage))
        state["episodes"] = self.episodes.state_dict(len(self.storage))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state (the buffer then ends the episodes in flight: the source starts new ones)."""
        if "episodes" not in state:
            raise ValueError(
                "this state has no episode index (saved from a buffer other than a HERReplayBuffer); load it into "
                "the kind of buffer that saved it"
            )
        self.draws.load_weights_state(state)  # (checks, e.g. alpha, before it changes anything)
        self.episodes.load_state_dict(state["episodes"])

    def __repr__(self) -> str:
        return f"HindsightGoals(strategy={self.strategy!r}, n_sampled_goal={self.n_sampled_goal}, draws={self.draws!r})"


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

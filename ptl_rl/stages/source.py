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

Robustness (see docs/design/robustness.md): a ``next()`` that is interrupted
(KeyboardInterrupt, an exception in the env or the agent, a non-finite value)
leaves the source marked as mid-step; the following ``next()`` resets every
sub-env before stepping, so no row ever continues an episode whose step was
lost. :attr:`ExperienceSource.stream_seq` numbers the yielded batches and
skips a number at every such reset, so downstream stages can tell that the
envs' streams were cut.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeGuard

import numpy as np

from ptl_rl.agents.checks import check_agent
from ptl_rl.core._reprs import env_name, stage_repr
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.core._trees import to_numpy, tree_leaves, tree_map
from ptl_rl.core.batch import CORE_FIELDS, TransitionBatch
from ptl_rl.envs.envpool import as_vector_env, check_autoreset_mode
from ptl_rl.core.profiling import SWITCH, StageClock, perf_counter_ns
from ptl_rl.core.protocols import Agent, EnvStepAware, RankAware, RecurrentAgent, Stateful

NEXT_STEP, SAME_STEP, DISABLED = "NextStep", "SameStep", "Disabled"
_AUTORESET_MODES = (NEXT_STEP, SAME_STEP, DISABLED)
_ASYNC_DRAIN_TIMEOUT_S = 10.0  # how long an interrupted AsyncVectorEnv call may take to finish


class Episode(NamedTuple):
    """A finished episode: its undiscounted return, length, env and the env-step count at its end."""

    ret: float
    length: int
    env_id: int
    total_steps: int


def _saves_agent_state(agent: object) -> TypeGuard[Stateful]:
    """Whether the source checkpoints ``agent``'s state: a Stateful agent, except a torch module.

    A module's ``state_dict`` is its weights, which live in the LightningModule's own checkpoint.
    """
    return isinstance(agent, Stateful) and not hasattr(agent, "parameters")


def _is_vector_env(env: Any) -> bool:
    return hasattr(env, "num_envs") and hasattr(env, "single_observation_space")


def _check_env_api(env: Any) -> None:
    missing = [name for name in ("reset", "step", "observation_space", "action_space") if not hasattr(env, name)]
    if missing:
        raise TypeError(
            f"ExperienceSource needs a gymnasium.Env or gymnasium.vector.VectorEnv, got {type(env).__name__} "
            f"(missing {', '.join(missing)}). Create one with gymnasium.make(...) or gymnasium.make_vec(...)."
        )


#: the fix for an env written for gym < 0.26, named wherever such an env is caught
_OLD_GYM_FIX = "Port it to gymnasium, or wrap it with shimmy's GymV21CompatibilityV0."
# the TypeError of calling an old gym env's reset(seed=...), directly or through a wrapper (also as an
# AsyncVectorEnv re-raises it from its worker): other TypeErrors of a reset are the env's own and pass unchanged
_SEED_KEYWORD_ERROR = re.compile(r"reset\(\) (got an unexpected keyword argument 'seed'|takes no keyword arguments)")


def _takes_seed(reset: Any) -> bool:
    """Whether ``reset`` accepts ``seed=`` (a ``seed`` parameter or ``**kwargs``); ``True`` when it cannot be told."""
    try:
        parameters = inspect.signature(reset).parameters.values()
    except (TypeError, ValueError):  # a builtin or an object inspect cannot read: left to the reset itself
        return True
    return any(p.name == "seed" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _old_gym_layer(env: Any) -> Any:
    """The first layer of ``env`` whose ``reset`` takes no ``seed`` keyword, else ``None``.

    Follows the wrappers (``.env``) down to the innermost env, and the sub-envs of a vector env that holds
    them (``.envs`` of a ``SyncVectorEnv``): a gymnasium wrapper around a gym 0.21 env takes ``seed`` itself
    and fails only when it hands it on.
    """
    layers: list[Any] = [env]
    seen: set[int] = set()
    while layers and len(seen) < 256:
        layer = layers.pop()
        if layer is None or id(layer) in seen:
            continue
        seen.add(id(layer))
        reset = _attribute(layer, "reset")
        if callable(reset) and not _takes_seed(reset):
            return layer
        subs = _attribute(layer, "envs")
        if isinstance(subs, (list, tuple)):
            layers.extend(reversed(subs))
        layers.append(_attribute(layer, "env"))
    return None


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name``, or ``None`` when it is missing or reading it raises (a property of the user's env)."""
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - the check only looks; a broken attribute is the env's to report
        return None


def _check_reset_api(env: Any) -> None:
    """Raise ``TypeError`` naming the fix if ``env`` (or a layer or sub-env of it) has an old gym ``reset()``."""
    old = _old_gym_layer(env)
    if old is None:
        return
    where = "" if old is env else f" (inside {type(env).__name__})"
    raise TypeError(
        f"{type(old).__name__}.reset(){where} takes no seed keyword: this env uses the old gym API (gym < 0.26: "
        "reset() -> obs, step() -> (obs, reward, done, info)), not gymnasium's (reset(*, seed=None, options=None) "
        f"-> (obs, info)). {_OLD_GYM_FIX}"
    )


def _autoreset_mode_of(env: Any, override: str | None) -> str:
    mode = override if override is not None else getattr(env, "metadata", {}).get("autoreset_mode", NEXT_STEP)
    mode = getattr(mode, "value", mode)  # gymnasium.vector.AutoresetMode or its string value
    if mode not in _AUTORESET_MODES:
        raise ValueError(f"unknown autoreset mode {mode!r}; expected one of {_AUTORESET_MODES}")
    return mode


def _bool_array(flags: Any) -> np.ndarray:
    if type(flags) is np.ndarray and flags.dtype == np.bool_:
        return flags  # what gymnasium's vector envs return: no conversion call on the hot path
    return np.asarray(flags, dtype=bool)


@functools.lru_cache(maxsize=64)
def _zeros(size: int, dtype: np.dtype) -> np.ndarray:
    return np.zeros(size, dtype=dtype)


def _finite_or_none(tree: Any) -> tuple[str, np.ndarray] | None:
    """The first float leaf of ``tree`` ([N, ...] arrays) holding NaN or inf, as ``(path, bad rows)``; else ``None``.

    Fast path: one dot product with zeros per float leaf: ``0 * x`` is 0 for every finite ``x``
    (it cannot overflow) and NaN for NaN and inf. Only when that is not 0 are the rows examined.
    """
    if type(tree) is np.ndarray:  # the common case, without walking a tree
        if tree.dtype.kind != "f" or tree.size == 0:
            return None
        if math.isfinite(tree.reshape(-1).dot(_zeros(tree.size, tree.dtype))):
            return None
        rows = np.flatnonzero((~np.isfinite(tree.reshape(len(tree), -1))).any(axis=1))
        return ("", rows) if len(rows) else None
    for path, leaf in tree_leaves(tree):
        bad = _finite_or_none(np.asarray(leaf))
        if bad is not None:
            return path, bad[1]
    return None


def _copy_tree(tree: Any) -> Any:
    return tree_map(np.array, tree)


def _has_float64(space: Any) -> bool:
    spaces = getattr(space, "spaces", None)
    if isinstance(spaces, Mapping):
        return any(_has_float64(s) for s in spaces.values())
    return getattr(space, "dtype", None) == np.float64


def _float64_as_float32(tree: Any) -> Any:
    return tree_map(lambda a: a.astype(np.float32) if a.dtype == np.float64 else a, tree)


def _set_rows(tree: Any, rows: np.ndarray, values: list[Any]) -> None:
    """``tree[rows] = values`` for a (dict of) array(s); ``values`` holds one unbatched obs per row."""
    if isinstance(tree, Mapping):
        for k in tree:
            _set_rows(tree[k], rows, [v[k] for v in values])
    else:
        tree[rows] = np.stack(values)


class ExperienceSource:
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
            The attribute :attr:`observation_transform` (``None`` by default)
            maps the observations before the agent sees them; yielded
            batches keep the env's own (a stage such as
            :class:`~ptl_rl.stages.normalize.NormalizeObservations` sets it).
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

    upstream = None  # a source pulls from no stage (ptl_rl.core.protocols.Stage)
    one_row_per_env = True  # each yielded batch holds at most one transition per sub-env

    stream_seq: int
    """Sequence number of the last yielded batch. It grows by one per batch and skips a number
    whenever the sub-envs were all reset outside their episodes' course (the first step, the
    step after an interrupted one, after :meth:`load_state_dict`): a consumer that saw batch
    ``s`` and then gets one numbered other than ``s + 1`` knows that the envs' streams were cut
    (or that someone else pulled batches in between) and must not join steps across the cut."""

    def __init__(
        self,
        env: Any,
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
    ) -> None:
        env = as_vector_env(env)  # an EnvPool pool: seeded resets, async mode refused (ptl_rl/envs/envpool.py)
        _check_env_api(env)
        _check_reset_api(env)  # a gym 0.21 env: refused now, not at the first next()
        if not callable(agent):
            raise TypeError(f"agent must be callable as agent(obs) -> actions, got {type(agent).__name__}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        if max_pending_episodes < 1:
            raise ValueError(f"max_pending_episodes must be >= 1, got {max_pending_episodes}")
        if int(steps_per_batch) != steps_per_batch or steps_per_batch < 1:
            raise ValueError(f"steps_per_batch must be an integer >= 1 (vector steps per batch), got {steps_per_batch}")
        self.steps_per_batch = int(steps_per_batch)
        # a chunk holds several steps of each env: stages that need one step per batch check this
        self.one_row_per_env = self.steps_per_batch == 1
        self.env = env
        self.check_finite = bool(check_finite)
        self.agent = agent
        self.gamma = float(gamma)
        self.seed = seed
        self.rank = int(rank or 0)
        self._rank_is_explicit = rank is not None
        self._cast_float64 = bool(cast_float64) and _has_float64(
            env.single_observation_space if _is_vector_env(env) else env.observation_space
        )
        self.is_vector = _is_vector_env(env)
        self.num_envs = int(env.num_envs) if self.is_vector else 1
        self.action_space = env.single_action_space if self.is_vector else env.action_space
        check_agent(agent, self.action_space)  # a bare network, or an agent for another kind of action space
        self.autoreset_mode = _autoreset_mode_of(env, autoreset_mode) if self.is_vector else DISABLED
        check_autoreset_mode(env, self.autoreset_mode)  # EnvPool: next-step only, refused now, not at an episode end
        # a float64 cast makes a fresh array anyway
        self._copy_obs = self.is_vector and not getattr(env, "copy", True) and not self._cast_float64
        action_shape = getattr(self.action_space, "shape", None)
        self._action_batch_shape = (self.num_envs, *action_shape) if action_shape is not None else None
        # what the agent is shown instead of the env's observations (NormalizeObservations sets it); batches keep
        # the env's own: a stage downstream decides what it yields
        self.observation_transform: Callable[[Any], Any] | None = None
        # the agent's optional hooks (ptl_rl.core.protocols), looked up once
        self._agent_reset_state = agent.reset_state if isinstance(agent, RecurrentAgent) else None
        self._agent_on_env_steps = agent.on_env_steps if isinstance(agent, EnvStepAware) else None

        n = self.num_envs
        self._set_env_ids()
        self._discount = np.full(n, self.gamma, dtype=np.float32)
        self._discount.flags.writeable = False
        self._no_env = np.zeros(n, dtype=bool)
        # zeros to dot with: 0 * x is 0 for finite x and NaN for NaN and inf (see _finite_or_none)
        self._reward_zeros = np.zeros(n, dtype=np.float32)
        self._obs_zeros: np.ndarray | None = None  # sized at the first step with array observations
        self._episode_return = np.zeros(n, dtype=np.float64)
        # an episode's length is the vector-step count now minus the count at its start: no per-step add
        self._vector_steps = 0
        self._episode_start = np.zeros(n, dtype=np.int64)
        self._obs: Any = None
        self._fresh = np.ones(n, dtype=bool)  # envs whose current obs starts an episode
        self._resetting = np.zeros(n, dtype=bool)  # next-step mode: the next step only resets these
        self._any_resetting = False  # whether _resetting has a True: read once per step, kept with it
        self._reset_count = 0
        # set while a step is under way: still set on entry means the previous next() was interrupted
        self._in_step = False
        self.stream_seq = 0

        self.total_steps = 0
        self.episodes_finished = 0
        self._pending_episodes: deque[Episode] = deque(maxlen=int(max_pending_episodes))
        self._recent: deque[Episode] = deque(maxlen=stats_window)
        # time accounting (ptl_rl.profile): the env step and the agent call are parts of the source's own time
        self._env_clock = StageClock("env step", "env steps")
        self._agent_clock = StageClock("agent call", "env steps")
        self.clock = StageClock("source bookkeeping", "transitions", (self._env_clock, self._agent_clock))

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> ExperienceSource:
        return self

    def __next__(self) -> TransitionBatch:
        if not SWITCH.on:
            return self._next()
        start = perf_counter_ns()
        batch = self._next()
        self.clock.add(perf_counter_ns() - start, len(batch))
        return batch

    def _next(self) -> TransitionBatch:
        # A previous next() that did not finish (KeyboardInterrupt, an exception in the env or
        # the agent) may have stepped some sub-envs without recording it: the only state known
        # to be right is a fresh episode in every sub-env. The flag is set before the reset, so
        # an interrupted reset is redone too.
        restart = self._in_step or self._obs is None
        self._in_step = True
        if restart:
            self._reset_all()
        if self.steps_per_batch == 1:
            while True:
                batch = self._step()
                if batch is not None:
                    self.stream_seq += 1
                    self._in_step = False
                    return batch
        # a chunk: fresh arrays per batch (a batch is the caller's to keep, so no buffer is reused); an interrupt
        # loses the chunk's steps, as it loses one step above, and the next call resets every sub-env
        steps: list[TransitionBatch] = []
        while len(steps) < self.steps_per_batch:
            batch = self._step()
            if batch is not None:
                steps.append(batch)
        self.stream_seq += 1
        self._in_step = False
        return TransitionBatch.concat(steps)

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
    def recent_episodes(self) -> list[Episode]:
        """The last ``stats_window`` finished episodes, oldest first (not consumed, unlike :meth:`pop_episodes`)."""
        return list(self._recent)

    def pop_episodes(self) -> list[Episode]:
        """Episodes finished since the last call (each returned once), oldest first.

        At most ``max_pending_episodes`` are kept between calls: when more finish, the oldest
        are dropped from this list (not from :meth:`episode_stats`).
        """
        episodes = list(self._pending_episodes)
        self._pending_episodes.clear()
        return episodes

    def episode_stats(self) -> dict[str, float]:
        """Mean return and length of the last ``stats_window`` episodes, and counters."""
        stats = {"env_steps": float(self.total_steps), "episodes": float(self.episodes_finished)}
        if self._recent:
            stats["return_mean"] = float(np.mean([e.ret for e in self._recent]))
            stats["length_mean"] = float(np.mean([e.length for e in self._recent]))
        return stats

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """Counters and recent episodes (plain containers, ``weights_only``-safe).

        Environment state cannot be checkpointed in general, so the episodes in
        progress are not saved: after :meth:`load_state_dict` every sub-env starts a
        new episode.
        """
        state = {
            "total_steps": self.total_steps,
            "episodes_finished": self.episodes_finished,
            "reset_count": self._reset_count,
            "recent": [[e.ret, e.length, e.env_id, e.total_steps] for e in self._recent],
        }
        if _saves_agent_state(self.agent):
            state["agent"] = self.agent.state_dict()
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.total_steps = int(state["total_steps"])
        self.episodes_finished = int(state["episodes_finished"])
        self._reset_count = int(state["reset_count"])
        self._recent.clear()
        self._recent.extend(Episode(float(r), int(n), int(e), int(t)) for r, n, e, t in state["recent"])
        self._pending_episodes.clear()
        self._obs = None  # forces a fresh reset of every sub-env on the next step
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
        self._check_env_usable()
        # a cut in every env's stream: downstream stages must not join steps across it
        self.stream_seq += 1
        seeds = self._reset_seeds()
        try:
            if self.is_vector:
                self._finish_pending_async_call()
                result = self.env.reset(seed=seeds)
            else:
                result = self.env.reset(seed=None if seeds is None else seeds[0])
        except TypeError as exc:
            # an old gym env the construction check could not see (hidden in a wrapper of the user's, or in an
            # AsyncVectorEnv's workers); any other TypeError is the env's own
            if not _SEED_KEYWORD_ERROR.search(str(exc)):
                raise
            raise TypeError(
                f"env.reset(seed=...) failed: {exc}. This env (or a sub-env, or an env inside a wrapper) uses the "
                "old gym API (gym < 0.26: reset() -> obs, step() -> (obs, reward, done, info)), whose reset() takes "
                f"no seed. {_OLD_GYM_FIX}"
            ) from exc
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                "env.reset() must return (obs, info) as in gymnasium>=0.26; this env uses the old gym API. "
                f"{_OLD_GYM_FIX}"
            )
        obs = result[0]
        self._obs = self._own_obs(obs)
        if self.check_finite:
            self._check_finite(self._obs, "reset observation")
        self._reset_count += 1
        self._fresh = np.ones(self.num_envs, dtype=bool)
        self._resetting, self._any_resetting = self._no_env, False
        self._episode_return[:] = 0.0
        self._episode_start[:] = self._vector_steps

    def _own_obs(self, obs: Any) -> Any:
        """An env's observation as the source keeps it: batched, float64 cast, copied if the env reuses its buffer."""
        if not self.is_vector:
            obs = tree_map(lambda x: np.array(x)[None], obs)
        elif self._copy_obs:
            obs = _copy_tree(obs)
        if self._cast_float64:
            obs = _float64_as_float32(obs)
        return obs

    def _act(self) -> tuple[np.ndarray, dict[str, Any]]:
        if self._agent_reset_state is not None and np.count_nonzero(self._fresh):
            self._agent_reset_state(self._fresh.copy())
        obs = self._obs if self.observation_transform is None else self.observation_transform(self._obs)
        if SWITCH.on:
            start = perf_counter_ns()
            out = self.agent(obs)
            self._agent_clock.add(perf_counter_ns() - start, self.num_envs)
        else:
            out = self.agent(obs)
        actions, extras = out if isinstance(out, tuple) else (out, None)
        if not isinstance(actions, np.ndarray):
            actions = to_numpy(actions)
        if actions.shape != self._action_batch_shape and not self._shape_fits(actions):
            n, shape = self.num_envs, (self._action_batch_shape or (0, "..."))[1:]
            raise ValueError(
                f"agent returned actions of shape {actions.shape}; expected {(n, *shape)} "
                f"(one action of shape {shape} for each of the {n} envs). "
                "Return a batch of actions with a leading env dimension, also for a single env."
            )
        return actions, self._checked_extras(extras) if extras else {}

    def _shape_fits(self, actions: np.ndarray) -> bool:
        # spaces without a fixed shape (Dict, Tuple, Text) only need one action per env
        return self._action_batch_shape is None and actions.ndim > 0 and actions.shape[0] == self.num_envs

    def _checked_extras(self, extras: Mapping[str, Any]) -> dict[str, Any]:
        arrays: dict[str, Any] = to_numpy(dict(extras))
        for name, value in arrays.items():
            if name in CORE_FIELDS:
                raise ValueError(f"agent extra {name!r} collides with a core field; rename it")
            for _, leaf in tree_leaves(value):
                if leaf.ndim == 0 or leaf.shape[0] != self.num_envs:
                    raise ValueError(
                        f"agent extra {name!r} has shape {leaf.shape}; "
                        f"expected a leading dimension of {self.num_envs} (one row per env)"
                    )
        return arrays

    def _env_step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        try:
            if SWITCH.on:
                start = perf_counter_ns()
                result = self.env.step(actions if self.is_vector else actions[0])
                self._env_clock.add(perf_counter_ns() - start, self.num_envs)
            else:
                result = self.env.step(actions if self.is_vector else actions[0])
        except Exception as exc:
            self._note_failed_sub_env(exc)
            raise
        if len(result) != 5:
            raise TypeError(
                f"env.step() returned {len(result)} values; gymnasium envs return "
                "(obs, reward, terminated, truncated, info). This env uses the old 4-tuple gym API: "
                "port it to gymnasium, or wrap it with shimmy's GymV21CompatibilityV0."
            )
        obs, reward, terminated, truncated, info = result
        obs = self._own_obs(obs)
        if not self.is_vector:
            reward, terminated, truncated = np.array([reward]), np.array([terminated]), np.array([truncated])
        return obs, reward, _bool_array(terminated), _bool_array(truncated), info

    def _step(self) -> TransitionBatch | None:
        actions, extras = self._act()
        obs, reward, terminated, truncated, info = self._env_step(actions)
        done = terminated | truncated
        any_done = int(np.count_nonzero(done)) > 0  # (a Python bool: the stubs type the count as np.intp)
        next_obs = self._final_obs_from_info(obs, done, info) if any_done and self.autoreset_mode == SAME_STEP else obs
        raw_reward = reward
        reward = np.asarray(reward, dtype=np.float32)
        if self.check_finite:
            self._check_step_finite(reward, next_obs, obs)
        batch = TransitionBatch.wrap(
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
        if just_reset is not None:
            # these rows only reset their sub-env: (final obs, ignored action, reset obs) is no transition
            batch = batch.rows((~just_reset).nonzero()[0])
        # the episode returns add the env's own rewards (float64 for gymnasium's vector envs: no mixed-dtype add)
        self._track_episodes(
            raw_reward if type(raw_reward) is np.ndarray and raw_reward.dtype == np.float64 else reward,
            done,
            any_done,
            just_reset,
        )
        self._obs = obs
        if self.autoreset_mode == NEXT_STEP and self.is_vector:
            self._fresh = just_reset if just_reset is not None else self._no_env
            self._resetting, self._any_resetting = done, any_done
        else:
            self._fresh = done
            if any_done:
                self._reset_finished(done)
        if self._agent_on_env_steps is not None:
            self._agent_on_env_steps(self.total_steps)
        return batch if just_reset is None or len(batch) else None

    def _final_obs_from_info(self, obs: Any, done: np.ndarray, info: Mapping[str, Any]) -> Any:
        if "final_obs" not in info:
            raise RuntimeError(
                "the vector env reported an episode end without info['final_obs']; it does not autoreset "
                "in same-step mode. Pass autoreset_mode='NextStep' or 'Disabled' to ExperienceSource."
            )
        ended = done.nonzero()[0]
        next_obs = _copy_tree(obs)
        _set_rows(next_obs, ended, list(info["final_obs"][ended]))
        return next_obs

    def _track_episodes(
        self, reward: np.ndarray, done: np.ndarray, any_done: bool, just_reset: np.ndarray | None
    ) -> None:
        """Add a step's ``reward`` (float [N], all envs) to the returns; close the episodes that ended."""
        self._vector_steps += 1
        if just_reset is None:
            self._episode_return += reward
            self.total_steps += len(reward)
        else:  # only resetting: no step of an episode; the next one starts after this step
            stepped = ~just_reset
            self._episode_return[stepped] += reward[stepped]
            self._episode_start[just_reset] = self._vector_steps
            self.total_steps += int(np.count_nonzero(stepped))
        if any_done:
            self._record_episodes(done.nonzero()[0])

    def _record_episodes(self, ended: np.ndarray) -> None:
        """Close the episodes of the envs ``ended`` (int [k]): one vectorized read, one Episode each."""
        steps = self.total_steps
        episodes = [
            Episode(r, n, e, steps)
            for r, n, e in zip(
                self._episode_return[ended].tolist(),
                (self._vector_steps - self._episode_start[ended]).tolist(),
                self._env_ids[ended].tolist(),
                strict=True,
            )
        ]
        self.episodes_finished += len(episodes)
        self._pending_episodes.extend(episodes)
        self._recent.extend(episodes)
        self._episode_return[ended] = 0.0
        self._episode_start[ended] = self._vector_steps

    def _reset_finished(self, done: np.ndarray) -> None:
        """Reset the sub-envs that ended (single env, or a vector env in disabled mode)."""
        if not self.is_vector:
            self._obs = self._own_obs(self.env.reset()[0])
        elif self.autoreset_mode == DISABLED:
            obs, _ = self.env.reset(options={"reset_mask": done.copy()})
            self._obs = self._own_obs(obs)
        else:
            return  # same-step: the vector env reset them itself, and _step checked those observations
        if self.check_finite:
            self._check_finite(self._obs, "reset observation")

    # ------------------------------------------------------------------ failures
    def _check_step_finite(self, reward: np.ndarray, next_obs: Any, obs: Any) -> None:
        """Check a step's rewards (float32 [N]) and observations; one ``isfinite`` on the common path."""
        zeros = self._obs_zeros
        if next_obs is obs and zeros is not None and type(obs) is np.ndarray and obs.size == zeros.size:
            # array observations, no same-step reset: two dot products with zeros, one isfinite
            probe = reward.dot(self._reward_zeros)
            if obs.dtype.kind == "f":
                probe += obs.reshape(-1).dot(zeros)
            if math.isfinite(probe):
                return
        elif zeros is None and type(obs) is np.ndarray:
            self._obs_zeros = np.zeros(obs.size, dtype=obs.dtype if obs.dtype.kind == "f" else np.float32)
        self._check_finite(reward, "reward")
        self._check_finite(next_obs, "next_obs")
        if next_obs is not obs:  # same-step resets: the reset observations are only in obs
            self._check_finite(obs, "reset observation")

    def _check_finite(self, tree: Any, field: str) -> None:
        """Raise ``FloatingPointError`` if a float leaf of ``tree`` ([N, ...]) holds NaN or inf."""
        bad = _finite_or_none(tree)
        if bad is None:
            return
        path, rows = bad
        name = f"{field}.{path}" if path else field
        sub_envs = rows.tolist()
        raise FloatingPointError(
            f"non-finite {name} (NaN or inf) from sub-env(s) {sub_envs} (env_id {self._env_ids[rows].tolist()}) "
            f"at env step {self.total_steps}; stored, it would silently turn the network's weights into NaN. "
            "Fix the env (or wrap it so it clips or replaces such values), or pass check_finite=False to "
            "ExperienceSource to turn this check off. The next next() resets every sub-env."
        )

    def _note_failed_sub_env(self, exc: BaseException) -> None:
        """Add a note naming the sub-env whose ``step()`` raised ``exc``, where that can be known."""
        index = None
        pipes = getattr(self.env, "parent_pipes", None)
        if pipes is not None:  # AsyncVectorEnv: gymnasium shuts down (pipe None) the worker that raised
            failed = [i for i, pipe in enumerate(pipes) if pipe is None]
            index = failed[0] if failed else None
        else:  # SyncVectorEnv: the frame of the sub-env's step() is in the traceback
            sub_envs = getattr(self.env, "envs", None) or ([self.env] if not self.is_vector else [])
            tb = exc.__traceback__
            while tb is not None and index is None:
                owner = tb.tb_frame.f_locals.get("self")
                index = next((i for i, e in enumerate(sub_envs) if owner is e), None)
                tb = tb.tb_next
        if index is None or not hasattr(exc, "add_note"):
            return
        note = f"ptl_rl: raised in step() of sub-env {index} (env_id {int(self._env_ids[index])}). "
        if pipes is not None:
            note += (
                "gymnasium has shut that worker down, so this AsyncVectorEnv cannot step again: "
                "build a new env and a new ExperienceSource."
            )
        else:
            note += "Calling next() again resets every sub-env and carries on."
        exc.add_note(note)

    def _check_env_usable(self) -> None:
        pipes = getattr(self.env, "parent_pipes", None) or ()
        dead = [i for i, pipe in enumerate(pipes) if pipe is None]
        if getattr(self.env, "closed", False) is True or dead:
            why = f" (gymnasium shut down the worker of sub-env(s) {dead} after it raised)" if dead else ""
            raise RuntimeError(
                f"the env of this ExperienceSource is closed{why} and cannot be stepped again. "
                "Build a new env and a new ExperienceSource (and re-chain the stages after it); "
                "the replay buffer and the model can be kept."
            )

    def _finish_pending_async_call(self) -> None:
        """After an interrupt between an AsyncVectorEnv's ``*_async`` and ``*_wait`` calls, drop the answers.

        Without this the workers' late answers would sit in the pipes and be read as the answers
        to the next call (rows from the wrong step).
        """
        state = getattr(self.env, "_state", None)
        value = getattr(state, "value", "default")
        if state is None or value == "default":  # (None has no value: the same test, said for the checker)
            return
        try:
            getattr(self.env, f"{value}_wait")(timeout=_ASYNC_DRAIN_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the answers are dropped anyway; the reset below decides
            pass
        for pipe in getattr(self.env, "parent_pipes", None) or ():
            while pipe is not None and pipe.poll():
                pipe.recv()
        self.env._state = type(state)("default")

    # ------------------------------------------------------------------ repr
    def __repr__(self) -> str:
        """``ExperienceSource(CartPole-v1 x8, env_steps=..., episodes=...)``: the env, its sub-envs, the counters."""
        return stage_repr(
            self, f"{env_name(self.env)} x{self.num_envs}", env_steps=self.total_steps, episodes=self.episodes_finished
        )

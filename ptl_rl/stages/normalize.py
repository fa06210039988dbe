"""Observation normalization and reward scaling as pipeline stages, for continuous control (PPO on MuJoCo).

    ExperienceSource(observation_transform=norm) -> NormalizeObservations -> ScaleRewards -> RolloutBuffer / ...

:class:`NormalizeObservations` updates the :class:`~ptl_rl.normalization.normalizer.ObservationNormalizer` the
source shows its agent, from the collected rows; :class:`ScaleRewards` divides rewards by the running standard
deviation of each env's discounted return; :class:`NormalizeSampledObservations` normalizes replay samples with
the statistics of the moment. The statistics are checkpointed (:func:`~ptl_rl.core.chain.pipeline_state_dict`),
count exactly the rows yielded (a step cut short is rolled back by :mod:`ptl_rl.core.guard`), refuse NaN, inf
and other shapes before anything changes, and are merged across DDP ranks by :func:`sync_statistics`. The
decisions are in ``docs/design/normalization.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, cast

import numpy as np

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.batch import TorchBatch, TransitionBatch
from ptl_rl.core.chain import pipeline_stages
from ptl_rl.core.protocols import ActingStage, SyncedStatistics
from ptl_rl.core.stage import Stage
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.normalization.normalizer import ObservationNormalizer, may_roll_back, statistics_snapshot
from ptl_rl.normalization.running_stats import Moments, RunningStatistics, _zeros, non_finite_rows
from ptl_rl.stages.per_step import PerStepStage, check_per_step_upstream, per_step_stages

_OUTPUTS = ("normalized", "raw")

_RETURNS_WORDING = (  # what, owner, fix: for RunningStatistics.with_rows' message
    "discounted returns",
    "ScaleRewards' return statistics and the returns in flight are",
    "Scale the rewards down (or clip them) before ScaleRewards, or lower gamma.",
)

_PASS_TO_SOURCE = (
    "pass the normalizer to the source: norm = ptl_rl.ObservationNormalizer(); "
    "source = ptl_rl.ExperienceSource(env, agent, observation_transform=norm); "
    "ptl_rl.NormalizeObservations(source, norm)"
)


def _check_model_view(normalizer: ObservationNormalizer | None, output: str) -> ObservationNormalizer:
    if output != "raw":
        raise ValueError(
            "with apply_in='model' the network normalizes its own inputs (normalizer.module() in the policy), so "
            "the batches must stay raw: pass output='raw', or the observations would be normalized twice"
        )
    if normalizer is None or not normalizer.has_module:
        raise ValueError(
            "apply_in='model' needs the normalizer inside the policy network: build the policy with "
            "normalizer.module() as its first layer (ObservationNormalizer(shape=obs_shape).module())"
        )
    return normalizer


def _shown_normalizer(upstream: Any, normalizer: ObservationNormalizer | None) -> ObservationNormalizer:
    """The normalizer the nearest source upstream shows its agent: the one to update (``normalizer``, if given)."""
    for stage in per_step_stages(upstream):
        if isinstance(stage, NormalizeObservations):
            raise ValueError(
                f"a {type(stage).__name__} upstream already updates the statistics this source shows its agent; "
                "chain one NormalizeObservations per source"
            )
        if isinstance(stage, ActingStage):
            source = stage
            break
    else:  # first: its message also covers remote collectors
        raise ValueError(
            "NormalizeObservations must follow an ExperienceSource (directly, or through other per-step stages "
            f"such as ScaleRewards) so that the agent acts on normalized observations; got {type(upstream).__name__}. "
            "Behind remote collectors (AsyncSource, RayWorkers) put normalizer.module() first in the policy they "
            "are sent, and pass apply_in='model', output='raw'"
        )
    check_per_step_upstream(upstream, "NormalizeObservations")
    shown, name = source.observation_transform, type(source).__name__
    if isinstance(shown, ObservationNormalizer) and (normalizer is None or normalizer is shown):
        return shown
    if normalizer is None:
        what = "the env's own observations" if shown is None else f"{shown!r}, not an ObservationNormalizer"
        raise ValueError(
            f"{name} shows its agent {what}: NormalizeObservations updates the statistics the agent acts on, "
            f"so {_PASS_TO_SOURCE}"
        )
    raise ValueError(
        f"the normalizer given is not the one {name} shows its agent ({shown!r}): the agent would act on "
        f"other statistics than those this stage updates. Hand the same object to both: {_PASS_TO_SOURCE}"
    )


class NormalizeObservations(PerStepStage):
    """Normalizes observations with running statistics of the collected ones, the statistics the agent acts on.

    Args:
        upstream: an :class:`~ptl_rl.stages.source.ExperienceSource` (or per-step stages after one, such as
            :class:`ScaleRewards`) built with ``observation_transform=normalizer``: the source shows the agent
            normalized observations, this stage updates the statistics.
        normalizer: the :class:`~ptl_rl.ObservationNormalizer` to update and apply; it must be the
            very object the source shows its agent. Default: the source's. Share it with
            :class:`NormalizeSampledObservations` and with ``normalizer.wrap_agent(...)`` for evaluation.
        output: ``"normalized"`` (default): yielded ``obs``/``next_obs`` are
            normalized, float32 ``[B, *obs_shape]``, ``obs`` bit-identical to
            what the agent acted on. Use it for on-policy rollouts, whose stored
            ``log_prob`` must match the stored ``obs``. ``"raw"``: yield the
            env's observations; for replay that normalizes at sampling time.
        apply_in: ``"source"`` (default), or ``"model"`` behind collectors in other processes
            (:class:`~ptl_rl.distributed.AsyncSource`, :class:`~ptl_rl.distributed.RayWorkers`): the
            policy applies ``normalizer.module()`` itself; needs ``output="raw"``.

    Per batch: ``obs`` is normalized with the statistics the agent used, the
    statistics take in the batch's ``obs`` rows (each observation a transition
    starts from, once; never a final observation alone, never evaluation
    data), and ``next_obs`` is normalized with the updated statistics, which
    are those the agent uses at the next step. A source that shows its agent
    no normalizer, or another one, is refused with a ``ValueError`` naming the fix.

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
        >>> seen = []
        >>> def agent(obs):  # records what it is shown
        ...     seen.append(obs.copy())
        ...     return np.zeros((len(obs), 1), dtype=np.float32)
        >>> norm = ptl_rl.ObservationNormalizer()
        >>> source = ptl_rl.ExperienceSource(env, agent, seed=0, observation_transform=norm)
        >>> stage = ptl_rl.NormalizeObservations(source, norm)
        >>> batches = [next(stage) for _ in range(3)]
        >>> bool((batches[2].obs == seen[2]).all()), bool((batches[1].next_obs == batches[2].obs).all())
        (True, True)
        >>> norm.count  # the obs rows of 3 steps of 2 envs
        6
    """

    def __init__(
        self,
        upstream: Iterator[TransitionBatch],
        normalizer: ObservationNormalizer | None = None,
        *,
        output: str = "normalized",
        apply_in: str = "source",
    ) -> None:
        if output not in _OUTPUTS:
            raise ValueError(f"output must be one of {_OUTPUTS}, got {output!r}")
        if apply_in not in ("source", "model"):
            raise ValueError(f"apply_in must be 'source' or 'model', got {apply_in!r}")
        model = apply_in == "model"
        self.normalizer = _check_model_view(normalizer, output) if model else _shown_normalizer(upstream, normalizer)
        super().__init__(upstream)
        self.output = output
        self.apply_in = apply_in
        self._committed: tuple[Moments, Moments] | None = None  # the statistics the last step made current

    def step(self) -> TransitionBatch:
        """The next batch, its ``obs``/``next_obs`` normalized (or raw); its ``obs`` rows taken into the statistics."""
        batch: TransitionBatch = self.pull()
        norm = self.normalizer
        before = norm.statistics.moments
        # refuses NaN/inf rows and other shapes before anything changes
        update = None if norm.frozen or not len(batch) else norm.with_rows(batch.obs)
        if self.output == "normalized":
            fields = dict(batch.items())
            fields["obs"] = norm.normalize_with(batch.obs, before)
            fields["next_obs"] = norm.normalize_with(batch.next_obs, before if update is None else update[1])
            batch = TransitionBatch.wrap(fields)
        if update is not None:
            self._committed = update
            norm.commit(*update)  # the modules' buffers follow
        return batch

    def snapshot(self) -> object:
        return self.normalizer.snapshot()

    def restore(self, snapshot: object) -> None:
        saved = cast(tuple[Any, ...], snapshot)  # what snapshot() returned: the normalizer's statistics
        committed, self._committed = self._committed, None
        if may_roll_back(self.normalizer.statistics, saved, committed):
            self.normalizer.restore(saved)

    def sync(self) -> bool:
        """Merge the observation statistics of every DDP rank (collective; see :func:`sync_statistics`)."""
        return self.normalizer.sync()

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        return versioned({"normalizer": self.normalizer.state_dict()}, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.normalizer.load_state_dict(state["normalizer"])

    def __repr__(self) -> str:
        return stage_repr(self, output=self.output, count=self.normalizer.count, frozen=self.normalizer.frozen)


class ScaleRewards(PerStepStage):
    """Divides rewards by the running standard deviation of the discounted return (clipped).

    Args:
        upstream: an ExperienceSource or another per-step stage (one row per env per batch).
        gamma: discount of the return whose spread is tracked (the learner's gamma).
        clip: scaled rewards are clipped to ``[-clip, clip]``; ``None``: no clipping.
        epsilon: added to the variance before the square root.

    Per env ``i`` the stage keeps ``G_i = gamma * G_i + r`` over its rows in
    order, restarting at 0 after a row with ``terminated`` or ``truncated``
    (and for every env after a cut in the stream: the source restarted its
    episodes). The statistics take in each ``G`` of the batch, then each reward
    becomes ``r / sqrt(var(G) + epsilon)``, float32 [B]. Only ``reward``
    changes; episode returns logged from the source stay the env's own.

    A batch whose reward (hence ``G``) is NaN or inf, or whose ``G`` overflows,
    is refused with a ``FloatingPointError`` naming its rows and env ids; the
    statistics and the returns in flight stay as they were (also while
    ``frozen``), and the next batch counts as after a cut.
    """

    def __init__(
        self,
        upstream: Iterator[TransitionBatch],
        gamma: float = 0.99,
        *,
        clip: float | None = 10.0,
        epsilon: float = 1e-8,
    ) -> None:
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        if clip is not None and not clip > 0:
            raise ValueError(f"clip must be > 0 or None, got {clip}")
        check_per_step_upstream(upstream, type(self).__name__)
        super().__init__(upstream)
        self.gamma = float(gamma)
        self.clip = None if clip is None else float(clip)
        self.epsilon = float(epsilon)
        self.frozen = False
        self.statistics = RunningStatistics()
        self._committed: tuple[Moments, Moments] | None = None  # the statistics the last step made current
        # replaced, never changed in place, by a step: a snapshot holds references
        self._env_ids = np.zeros(0, np.int64)  # sorted env_ids seen so far
        self._returns = np.zeros(0, np.float64)  # G of each, aligned with _env_ids
        self._last_env_id: np.ndarray | None = None  # the last read-only env_id array seen, and its positions
        self._last_pos = np.zeros(0, np.int64)

    @property
    def var(self) -> float:
        """Variance of the discounted returns seen (1.0 before the first)."""
        moments = self.statistics.moments
        return 1.0 if moments is None else float(moments.var)

    def _slots(self, env_id: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(env_ids, returns, positions)``: the arrays to use (grown by new env ids) and each row's position."""
        ids, returns = self._env_ids, self._returns
        if env_id is self._last_env_id:  # the source's own read-only env_id array: every env, same order
            return ids, returns, self._last_pos
        pos = np.searchsorted(ids, env_id)
        if len(ids) == 0 or (pos >= len(ids)).any() or (ids[np.minimum(pos, len(ids) - 1)] != env_id).any():
            ids = np.union1d(ids, env_id)
            grown = np.zeros(len(ids), np.float64)
            grown[np.searchsorted(ids, self._env_ids)] = returns
            returns = grown
            pos = np.searchsorted(ids, env_id)
        return ids, returns, pos

    def step(self) -> TransitionBatch:
        """The next batch with its rewards scaled; its returns ``G`` taken into the statistics."""
        batch: TransitionBatch = self.pull()
        if not len(batch):
            return batch  # a cut stays pending for the next rows
        restart = self.consume_cut()  # the envs started new episodes (or rows were lost): every return restarts
        env_id = batch.env_id
        ids, returns, pos = self._slots(env_id)
        returns = np.zeros_like(returns) if restart else returns.copy()
        g = returns[pos] * self.gamma + batch.reward
        if not math.isfinite(g.dot(_zeros(len(g)))):  # 0 * x: 0 for finite x, NaN for NaN and inf
            self._refuse(batch, g)
        update = None if self.frozen else self.statistics.with_rows(g, *_RETURNS_WORDING)
        moments = self.statistics.moments if update is None else update[1]
        var = 1.0 if moments is None else float(moments.var)
        scaled = (np.asarray(batch.reward, np.float64) / np.sqrt(var + self.epsilon)).astype(np.float32)
        if self.clip is not None:
            np.clip(scaled, -self.clip, self.clip, out=scaled)
        returns[pos] = np.where(batch.terminated | batch.truncated, 0.0, g)
        fields = dict(batch.items())
        fields["reward"] = scaled
        if update is not None:
            self._committed = update
            self.statistics.commit(*update)
        grown = ids is not self._env_ids
        self._env_ids, self._returns = ids, returns
        if not env_id.flags.writeable:  # read-only: it cannot change under the cache
            self._last_env_id, self._last_pos = env_id, pos
        elif grown:
            self._last_env_id = None  # the cached positions are of the shorter id list
        return TransitionBatch.wrap(fields)

    def _refuse(self, batch: TransitionBatch, g: np.ndarray) -> NoReturn:
        bad = non_finite_rows(g)
        reward = np.asarray(batch.reward)
        env_ids = np.asarray(batch.env_id)[bad].tolist()
        if not np.isfinite(reward[bad]).all():
            raise FloatingPointError(
                f"non-finite reward (NaN or inf) in row(s) {bad} (env_id {env_ids}) of the batch reaching "
                "ScaleRewards; refused: its return statistics and the returns in flight are unchanged. Taken in, "
                "it would make the variance of the returns NaN for good, and every scaled reward with it. Fix the "
                "env (or wrap it so it clips or replaces such rewards); ExperienceSource(check_finite=True), the "
                "default, refuses them at the source and names the sub-env"
            )
        raise FloatingPointError(
            f"the discounted return overflows float64 in row(s) {bad} (env_id {env_ids}) of the batch reaching "
            "ScaleRewards; refused: its return statistics and the returns in flight are unchanged. Scale the "
            "rewards down (or clip them) before ScaleRewards, or lower gamma"
        )

    def snapshot(self) -> object:
        return statistics_snapshot(self.statistics), self._env_ids, self._returns, self._last_env_id, self._last_pos

    def restore(self, snapshot: object) -> None:
        saved, self._env_ids, self._returns, self._last_env_id, self._last_pos = cast(tuple[Any, ...], snapshot)
        committed, self._committed = self._committed, None
        if may_roll_back(self.statistics, saved, committed):
            self.statistics.synced, self.statistics.local, self.statistics.moments = saved

    def sync(self) -> bool:
        """Merge the return statistics of every DDP rank (collective; see :func:`sync_statistics`)."""
        return self.statistics.sync(shape=())

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """The return statistics; the returns in flight are not saved (episodes restart after a restore)."""
        return versioned({"statistics": self.statistics.state_dict(), "frozen": self.frozen}, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; refused with nothing changed for statistics that are not finite or not scalar."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        loaded = RunningStatistics()
        loaded.load_state_dict(state["statistics"])  # checks it all before this stage changes
        if loaded.moments is not None and loaded.moments.shape != ():
            raise ValueError(
                f"the state holds statistics of shape {loaded.moments.shape}, but ScaleRewards keeps statistics of "
                "scalar returns, of shape (): this is not a ScaleRewards state"
            )
        self.statistics.load_state_dict(state["statistics"])
        self.frozen = bool(state["frozen"])
        self._returns = np.zeros_like(self._returns)
        self.state_replaced()  # the source restarts its episodes after a restore

    def __repr__(self) -> str:
        return stage_repr(self, gamma=self.gamma, count=(self.statistics.moments or Moments.empty()).count)


class NormalizeSampledObservations(Stage[TorchBatch]):
    """Normalizes ``obs``/``next_obs`` of each sampled batch with the statistics of the moment.

    For replay: collect with ``NormalizeObservations(source, norm, output="raw")``
    (the agent acts on normalized observations, the buffer stores the env's),
    then ``NormalizeSampledObservations(sampler, norm)``: every batch is
    normalized with the statistics at sampling time, never stale ones.

    Args:
        upstream: a :class:`~ptl_rl.replay.sampler.BatchSampler` (yields :class:`TorchBatch`).
        normalizer: the :class:`~ptl_rl.ObservationNormalizer` the collecting stage updates.
    """

    def __init__(self, upstream: Iterator[TorchBatch], normalizer: ObservationNormalizer) -> None:
        if not isinstance(normalizer, ObservationNormalizer):
            raise TypeError(f"normalizer must be an ObservationNormalizer, got {type(normalizer).__name__}")
        super().__init__(upstream)
        self.normalizer = normalizer

    def step(self) -> TorchBatch:
        """The next sampled batch, its ``obs``/``next_obs`` normalized with the current statistics."""
        batch: TorchBatch = self.pull()
        moments = self.normalizer.statistics.moments  # one set of statistics for obs and next_obs
        batch["obs"] = self.normalizer.normalize_with(batch["obs"], moments)
        batch["next_obs"] = self.normalizer.normalize_with(batch["next_obs"], moments)
        return batch

    def snapshot(self) -> None:
        return None  # no state: a cut step has nothing to put back

    def __repr__(self) -> str:
        return stage_repr(self, count=self.normalizer.count)


def sync_statistics(pipeline: Any) -> int:
    """Merge the running statistics of every stage of ``pipeline`` that has them across DDP ranks.

    Every :class:`~ptl_rl.core.protocols.SyncedStatistics` stage (:class:`NormalizeObservations`,
    :class:`ScaleRewards`, one of your own) is synced. A collective call under ``torch.distributed``
    (every rank at the same point: a Lightning hook); a no-op otherwise. Returns how many stages it synced.
    """
    return sum(bool(stage.sync()) for stage in pipeline_stages(pipeline) if isinstance(stage, SyncedStatistics))

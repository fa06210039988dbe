"""ObservationNormalizer: the running mean and variance of observations, and the transform that applies them.

The statistics belong to the pipeline, not to the env (as gymnasium's ``NormalizeObservation`` keeps them):
they are checkpointed, shared with evaluation (:meth:`ObservationNormalizer.wrap_agent`, frozen by
construction: applying never updates), merged across DDP ranks and carried to remote collectors inside the
policy's weights (:meth:`ObservationNormalizer.module`). The agent is shown them through the source
(``ExperienceSource(env, agent, observation_transform=norm)``); :class:`~ptl_rl.NormalizeObservations`
updates them from the collected rows. The decisions are in ``docs/design/normalization.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ptl_rl.core.protocols import Agent, ObsTree
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.normalization.module import NormalizationModule, matches_shape, shape_error
from ptl_rl.normalization.running_stats import Moments, RunningStatistics

#: What :meth:`ObservationNormalizer.snapshot` returns: the statistics' ``(synced, local, moments)``.
StatisticsSnapshot = tuple[Moments | None, Moments | None, Moments | None]


def statistics_snapshot(statistics: RunningStatistics) -> StatisticsSnapshot:
    """``statistics`` as of now: references, as every change of them replaces these values, never alters them."""
    return statistics.synced, statistics.local, statistics.moments


def may_roll_back(
    statistics: RunningStatistics, saved: StatisticsSnapshot, committed: tuple[Moments, Moments] | None
) -> bool:
    """Whether a stage may put back ``saved``, its snapshot before a step that was cut short: the statistics are
    as that step found them, or as its own commit ``committed`` left them. A change since the cut (a sync, a load,
    an ``update``) is kept: putting older statistics back would undo it (after a DDP sync, count rows twice)."""
    local, moments = statistics.local, statistics.moments
    if local is saved[1] and moments is saved[2]:
        return True
    return committed is not None and local is committed[0] and moments is committed[1]


_OBS_FIX = (
    "Clean or clip the observations before they reach the normalizer (np.nan_to_num, np.clip), or fix the env: "
    "ExperienceSource(check_finite=True), the default, refuses them at the source and names the sub-env."
)
_APPLY_FIX = (
    "Apply the statistics to observations of the env they were learned on, or normalize this env's "
    "observations with a new ObservationNormalizer(shape=env.single_observation_space.shape)."
)


class ObservationNormalizer:
    """Running mean and variance of observations, and the transform that applies them.

    Args:
        clip: normalized values are clipped to ``[-clip, clip]``; ``None``: no clipping.
        epsilon: added to the variance before the square root.
        shape: ``obs_shape``, the shape of one observation (``env.single_observation_space.shape``).
            ``None``: fixed by the first rows :meth:`update` takes in (or by a loaded state).

    Calling it maps observations ``[B, *obs_shape]`` (a numpy array or a tensor,
    any numeric dtype) to float32 (numpy) or the tensor's float dtype:
    ``clip((obs - mean) / sqrt(var + epsilon), -clip, clip)``. Before any
    observation was seen the mean is 0 and the variance 1. Calling never
    updates the statistics: only :meth:`update` (and the
    :class:`~ptl_rl.NormalizeObservations` stage, through it) does, and not while
    :attr:`frozen` is set. In a pipeline, hand it to the source, which shows it
    to the agent, and to the stage, which updates it::

        norm = ptl_rl.ObservationNormalizer()
        source = ptl_rl.ExperienceSource(env, agent, observation_transform=norm)
        stage = ptl_rl.NormalizeObservations(source, norm)

    The observation shape is fixed once known: given as ``shape=``, or at the
    first :meth:`update` (or :meth:`load_state_dict`) of a normalizer without
    one, or by :meth:`module`. From then on, input whose trailing dimensions
    are not ``obs_shape`` (``[B, *obs_shape]``; also one unbatched observation
    or ``[B, T, *obs_shape]``) is refused with a ``ValueError`` naming both
    shapes: by :meth:`update`, by every apply path (calling, :meth:`normalize`,
    :meth:`normalize_with`, tensors, the :meth:`module`), and by
    :meth:`load_state_dict` for statistics of another shape. Statistics of
    shape ``(1,)`` are never broadcast over 6-dim observations.

    :meth:`update` refuses rows holding a NaN or an inf with a
    ``FloatingPointError`` naming their indices, and leaves the statistics
    exactly as they were (taken in, one such row would make the mean and
    every normalized observation NaN for good).

    Examples:
        >>> import numpy as np
        >>> import ptl_rl
        >>> norm = ptl_rl.ObservationNormalizer(clip=5.0)
        >>> norm.update(np.array([[0.0, 10.0], [2.0, 30.0]]))
        >>> norm.mean, norm.var
        (array([ 1., 20.]), array([  1., 100.]))
        >>> norm(np.array([[1.0, 40.0]]))  # (x - mean) / std
        array([[0., 2.]], dtype=float32)
        >>> norm.update(np.array([[np.nan, 1.0]]))
        Traceback (most recent call last):
        FloatingPointError: non-finite observations (NaN or inf) in row(s) [0] of 1; refused: ...
        >>> norm.count  # unchanged
        2
    """

    def __init__(self, clip: float | None = 10.0, epsilon: float = 1e-8, shape: tuple[int, ...] | None = None) -> None:
        if clip is not None and not clip > 0:
            raise ValueError(f"clip must be > 0 or None, got {clip}")
        if not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        self.clip = None if clip is None else float(clip)
        self.epsilon = float(epsilon)
        self.shape = None if shape is None else tuple(int(n) for n in shape)
        self.frozen = False
        self.statistics = RunningStatistics()
        self._modules: list[NormalizationModule] = []  # views in networks, rewritten at every change
        self._cached: tuple[Moments | None, np.ndarray, np.ndarray] | None = None  # (moments, shift, scale)
        self._torch_cache: dict[
            tuple[torch.dtype, torch.device], tuple[Moments | None, torch.Tensor, torch.Tensor]
        ] = {}

    # ------------------------------------------------------------------ reading
    @property
    def count(self) -> int:
        """Observations the statistics hold (every rank's as of the last sync, plus this process's since)."""
        moments = self.statistics.moments
        return 0 if moments is None else moments.count

    @property
    def mean(self) -> np.ndarray | None:
        """float64 ``[*obs_shape]``; ``None`` before the first observation."""
        moments = self.statistics.moments
        return None if moments is None else moments.mean

    @property
    def var(self) -> np.ndarray | None:
        """float64 ``[*obs_shape]`` (population variance); ``None`` before the first observation."""
        moments = self.statistics.moments
        return None if moments is None else moments.var

    def _fixed_shape(self) -> tuple[int, ...] | None:
        """``obs_shape`` once known: given as ``shape=`` (or fixed by :meth:`module`), else the statistics'."""
        if self.shape is not None:
            return self.shape
        moments = self.statistics.moments
        return None if moments is None else moments.shape

    def _shift_scale(self, moments: Moments | None) -> tuple[np.ndarray, np.ndarray]:
        cached = self._cached
        if cached is not None and cached[0] is moments:
            return cached[1], cached[2]
        if moments is None:
            shift, scale = np.zeros((), np.float32), np.full((), 1.0 / np.sqrt(1.0 + self.epsilon), np.float32)
        else:
            shift = moments.mean.astype(np.float32)
            scale = (1.0 / np.sqrt(moments.var + self.epsilon)).astype(np.float32)
        self._cached = (moments, shift, scale)
        return shift, scale

    def normalize(self, obs: ObsTree) -> Any:
        """``obs`` ``[B, *obs_shape]`` normalized with the current statistics."""
        return self.normalize_with(obs, self.statistics.moments)

    def normalize_with(self, obs: ObsTree, moments: Moments | None) -> Any:
        """``obs`` ``[B, *obs_shape]`` normalized with ``moments`` (``None``: nothing seen, mean 0 and variance 1).

        ``ValueError`` if the trailing dimensions of ``obs`` are not the statistics' shape.
        """
        if isinstance(obs, torch.Tensor):
            return self._normalize_tensor(obs, moments)
        if isinstance(obs, Mapping):
            raise TypeError(
                "ObservationNormalizer normalizes array observations; for a Dict observation space normalize "
                "the Box entries with a FlattenObservation wrapper first, or leave this observation unnormalized"
            )
        x = np.asarray(obs, dtype=np.float32)
        expected = self.shape if moments is None else moments.shape
        if expected is not None and not matches_shape(x.shape, expected):
            raise shape_error(x.shape, expected, _APPLY_FIX)
        shift, scale = self._shift_scale(moments)
        out = (x - shift) * scale
        if self.clip is not None:
            np.clip(out, -self.clip, self.clip, out=out)
        return out

    def _normalize_tensor(self, obs: torch.Tensor, moments: Moments | None) -> torch.Tensor:
        expected = self.shape if moments is None else moments.shape
        if expected is not None and not matches_shape(tuple(obs.shape), expected):
            raise shape_error(tuple(obs.shape), expected, _APPLY_FIX)
        dtype = obs.dtype if obs.is_floating_point() else torch.float32
        key = (dtype, obs.device)
        cached = self._torch_cache.get(key)
        if cached is None or cached[0] is not moments:
            shift, scale = self._shift_scale(moments)
            cached = (moments, torch.as_tensor(shift, dtype=dtype, device=obs.device),
                      torch.as_tensor(scale, dtype=dtype, device=obs.device))  # fmt: skip
            self._torch_cache[key] = cached
        out = (obs.to(dtype) - cached[1]) * cached[2]
        return out if self.clip is None else out.clamp_(-self.clip, self.clip)

    def __call__(self, obs: ObsTree) -> Any:
        return self.normalize(obs)

    # ------------------------------------------------------------------ updating
    def update(self, obs: np.ndarray) -> None:
        """Add observations ``[B, *obs_shape]`` to the statistics (nothing while :attr:`frozen`).

        Raises ``ValueError`` for rows of another shape than ``obs_shape`` and ``FloatingPointError``
        naming the rows that hold a NaN or an inf; either way the statistics stay as they were.
        """
        rows = self._check_rows(obs)
        if not self.frozen:
            self.commit(*self.with_rows(rows))

    def _check_rows(self, obs: Any) -> np.ndarray:
        """``obs`` as rows ``[B, *obs_shape]``; ``ValueError`` if their shape is not the fixed one."""
        rows = _as_rows(obs)
        expected = self._fixed_shape()
        if expected is not None and rows.shape[1:] != expected:
            raise shape_error(rows.shape, expected, _APPLY_FIX)
        return rows

    def with_rows(self, obs: np.ndarray) -> tuple[Moments, Moments]:
        """The statistics after taking in ``obs`` ``[B, *obs_shape]``, to :meth:`commit`; nothing is changed yet.

        Refused as :meth:`update` says: rows of another shape, rows with a NaN or an inf.
        """
        rows = self._check_rows(obs)
        return self.statistics.with_rows(
            rows, what="observations", owner="the normalizer's statistics are", fix=_OBS_FIX
        )

    def commit(self, local: Moments, moments: Moments) -> None:
        """Make statistics computed by :meth:`with_rows` current, in the normalizer and its modules."""
        self.statistics.commit(local, moments)
        self._publish()

    def sync(self) -> bool:
        """Merge the statistics of every DDP rank (a collective call; see :meth:`RunningStatistics.sync`).

        Merged statistics with a NaN or an inf, or of another shape than ``obs_shape``, are refused
        (on every rank) with nothing changed.
        """
        synced = self.statistics.sync(shape=self._fixed_shape())
        self._publish()
        return synced

    def snapshot(self) -> StatisticsSnapshot:
        """The statistics as of now, for :meth:`restore` (references: a change replaces them, never alters them)."""
        return statistics_snapshot(self.statistics)

    def restore(self, snapshot: StatisticsSnapshot) -> None:
        """Make the statistics of :meth:`snapshot` current again, in the normalizer and its modules."""
        statistics = self.statistics
        statistics.synced, statistics.local, statistics.moments = snapshot
        self._publish()

    def module(self) -> NormalizationModule:
        """An ``nn.Module`` that applies these statistics, kept current: put it first in a policy network.

        For collectors in other processes (:class:`~ptl_rl.distributed.AsyncSource`,
        :class:`~ptl_rl.distributed.RayWorkers`): its ``shift`` and ``scale`` buffers are
        part of the policy's ``state_dict``, so every weight push carries the statistics of
        that moment, and the rows of ``policy_version`` v were chosen on observations
        normalized as of push v. Needs the observation shape (``shape=`` here, or data seen),
        and fixes it: the module's buffers have that shape.
        """
        shape = self._fixed_shape()
        if shape is None:
            raise ValueError(
                "the normalizer does not know the observation shape yet: "
                "ObservationNormalizer(shape=env.single_observation_space.shape)"
            )
        self.shape = shape  # the module's buffers have it: statistics of another shape could not be published
        module = NormalizationModule(shape, self.clip)
        self._modules.append(module)
        self._publish()
        return module

    @property
    def has_module(self) -> bool:
        """Whether :meth:`module` made a module: the statistics are applied inside a network too."""
        return bool(self._modules)

    def _publish(self) -> None:
        if self._modules:
            shift, scale = self._shift_scale(self.statistics.moments)
            for module in self._modules:
                module.load(shift, scale)

    def wrap_agent(self, agent: Agent) -> NormalizedAgent:
        """``agent`` acting on observations normalized with these statistics, for evaluation envs (frozen)."""
        return NormalizedAgent(agent, self)

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """Statistics, clip, epsilon and frozen flag (tensors and plain values, ``weights_only``-safe)."""
        return versioned(
            {"statistics": self.statistics.state_dict(), "clip": self.clip, "epsilon": self.epsilon,
             "frozen": self.frozen},
            self.STATE_VERSION,
        )  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s statistics and settings; refused with nothing changed if they do not fit.

        ``ValueError`` for statistics of another shape than ``obs_shape`` where that is fixed
        (``shape=``, data seen, a module); ``FloatingPointError`` for statistics with a NaN or an inf.
        """
        check_version(state, self.STATE_VERSION, type(self).__name__)
        loaded = RunningStatistics()
        loaded.load_state_dict(state["statistics"])  # checks it all before this normalizer changes
        expected = self._fixed_shape()
        if expected is not None and loaded.moments is not None and loaded.moments.shape != expected:
            raise ValueError(
                f"the state holds statistics of shape {loaded.moments.shape}, but this normalizer's observations "
                f"are of shape {expected} (given as shape=, or fixed by the rows it took in or its module): the "
                "shapes do not match. Load the state into a normalizer for the env it was saved from, or leave it "
                "out and start new statistics for this env"
            )
        self.statistics.load_state_dict(state["statistics"])
        self.clip = None if state["clip"] is None else float(state["clip"])
        self.epsilon = float(state["epsilon"])
        self.frozen = bool(state["frozen"])
        self._cached = None
        self._publish()

    def __repr__(self) -> str:
        return f"ObservationNormalizer(count={self.count}, clip={self.clip}, frozen={self.frozen})"


def _as_rows(obs: Any) -> np.ndarray:
    if isinstance(obs, Mapping):
        raise TypeError(
            "ObservationNormalizer normalizes array observations; for a Dict observation space normalize the Box "
            "entries with a FlattenObservation wrapper first, or leave this observation unnormalized"
        )
    rows = np.asarray(obs)
    if rows.ndim == 0 or rows.dtype.kind not in "biuf":
        raise TypeError(
            f"observations to normalize must be a numeric array [B, *obs_shape], got {rows.dtype} {rows.shape}"
        )
    return rows


class NormalizedAgent:
    """An agent that acts on observations normalized by an :class:`ObservationNormalizer` (which it never updates).

    Every other attribute (``reset_state``, ``value``, ``set_rank``, ...) is the wrapped agent's.
    """

    def __init__(self, agent: Agent, normalizer: ObservationNormalizer) -> None:
        self.agent = agent
        self.normalizer = normalizer

    def __call__(self, obs: ObsTree) -> Any:
        return self.agent(self.normalizer(obs))

    def __getattr__(self, name: str) -> Any:
        if name in ("agent", "normalizer"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.agent, name)

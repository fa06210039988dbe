"""Observation normalization and reward scaling as pipeline stages, for continuous control (PPO on MuJoCo).

    ExperienceSource -> NormalizeObservations -> ScaleRewards -> RolloutBuffer / NStepTransform -> ...

Gymnasium's ``NormalizeObservation``/``NormalizeReward`` wrappers keep their
statistics inside the env: out of checkpoints, away from the evaluation env,
unmerged across DDP ranks. Here the statistics belong to the pipeline:

* :class:`ObservationNormalizer` holds the running mean and variance of the
  observations and applies ``clip((x - mean) / sqrt(var + epsilon))``. It
  never updates itself when applied, so evaluation (``normalizer.wrap_agent``)
  is frozen by construction.
* :class:`NormalizeObservations` is the stage that updates it, from collected
  rows only. It shows the agent normalized observations (through the source's
  ``observation_transform``) and yields batches whose ``obs`` is exactly what
  the agent saw; ``next_obs`` is normalized with the statistics that include
  ``obs``, so ``next_obs`` of step t equals ``obs`` of step t+1 as the agent
  sees it. With ``output="raw"`` it yields the env's observations unchanged,
  for a replay buffer that stores raw rows and normalizes each sample with the
  statistics of the moment (:class:`NormalizeSampledObservations`).
* :class:`ScaleRewards` divides each reward by the running standard deviation
  of its env's discounted return (SB3's ``VecNormalize``, CleanRL's MuJoCo
  detail), the return restarting at ``terminated`` and at ``truncated``.

Both stages keep their statistics in :func:`~ptl_rl.core.chain.pipeline_state_dict`
(so in :class:`~ptl_rl.lightning.PipelineCheckpoint`), commit each step in one
statement (an interrupt leaves them as before or as after), and treat a gap in
the upstream's ``stream_seq`` (a peek, a source reset) as the start of new
episodes. Under DDP, :class:`~ptl_rl.callbacks.NormalizationSync` merges every
rank's statistics every few steps, and :class:`~ptl_rl.lightning.PipelineCheckpoint`
before each save (see :mod:`ptl_rl.normalization.running_stats`). The decisions are in
``docs/design/normalization.md``.

Both refuse what would corrupt their statistics, before anything changes:
a row with a NaN or an inf (``FloatingPointError`` naming the rows; the
statistics would otherwise be NaN for good), and observations of another
shape than the statistics' (``ValueError`` naming both shapes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, cast

import numpy as np
import torch
from torch import nn

from ptl_rl.core._reprs import stage_repr
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.core.batch import TorchBatch, TransitionBatch
from ptl_rl.core.protocols import Agent, NumberedStream, PerEnvStream
from ptl_rl.normalization.running_stats import Moments, RunningStatistics, _zeros, non_finite_rows
from ptl_rl.core.chain import pipeline_stages

_OUTPUTS = ("normalized", "raw")

_OBS_FIX = (
    "Clean or clip the observations before they reach the normalizer (np.nan_to_num, np.clip), or fix the env: "
    "ExperienceSource(check_finite=True), the default, refuses them at the source and names the sub-env."
)
_APPLY_FIX = (
    "Apply the statistics to observations of the env they were learned on, or normalize this env's "
    "observations with a new ObservationNormalizer(shape=env.single_observation_space.shape)."
)


_RETURNS_WORDING = (  # what, owner, fix: for RunningStatistics.with_rows' message
    "discounted returns",
    "ScaleRewards' return statistics and the returns in flight are",
    "Scale the rewards down (or clip them) before ScaleRewards, or lower gamma.",
)


def _matches(obs_shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Whether ``obs_shape`` ends with ``expected``: ``[B, *shape]``, one unbatched obs, or ``[B, T, *shape]``."""
    return obs_shape[len(obs_shape) - len(expected) :] == expected


def _shape_error(obs_shape: tuple[int, ...], expected: tuple[int, ...], fix: str) -> ValueError:
    per_row = obs_shape[1:] if len(obs_shape) > len(expected) else obs_shape
    return ValueError(
        f"observations of shape {tuple(per_row)} per row (an input of shape {tuple(obs_shape)}), but the statistics "
        f"are of shape {tuple(expected)}: the shapes do not match. {fix}"
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
    :class:`NormalizeObservations` stage, through it) does, and not while
    :attr:`frozen` is set.

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

    def normalize(self, obs: Any) -> Any:
        """``obs`` ``[B, *obs_shape]`` normalized with the current statistics."""
        return self.normalize_with(obs, self.statistics.moments)

    def normalize_with(self, obs: Any, moments: Moments | None) -> Any:
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
        if expected is not None and not _matches(x.shape, expected):
            raise _shape_error(x.shape, expected, _APPLY_FIX)
        shift, scale = self._shift_scale(moments)
        out = (x - shift) * scale
        if self.clip is not None:
            np.clip(out, -self.clip, self.clip, out=out)
        return out

    def _normalize_tensor(self, obs: torch.Tensor, moments: Moments | None) -> torch.Tensor:
        expected = self.shape if moments is None else moments.shape
        if expected is not None and not _matches(tuple(obs.shape), expected):
            raise _shape_error(tuple(obs.shape), expected, _APPLY_FIX)
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

    def __call__(self, obs: Any) -> Any:
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
            raise _shape_error(rows.shape, expected, _APPLY_FIX)
        return rows

    def with_rows(self, obs: Any) -> tuple[Moments, Moments]:
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

    def __call__(self, obs: Any) -> Any:
        return self.agent(self.normalizer(obs))

    def __getattr__(self, name: str) -> Any:
        if name in ("agent", "normalizer"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.agent, name)


class NormalizationModule(nn.Module):
    """``clip((x - shift) * scale)`` as an ``nn.Module`` whose ``shift``/``scale`` buffers travel with the weights.

    Made by :meth:`ObservationNormalizer.module`, which rewrites the buffers at every
    change of its statistics. A collector process builds its own with the same
    ``shape`` and ``clip`` (``NormalizationModule((11,), 10.0)``): the weights it is sent
    fill the buffers. Input ``[B, *shape]``, any numeric dtype; output float32.
    Input whose trailing dimensions are not ``shape``, and statistics of another
    shape given to :meth:`load`, are refused with a ``ValueError`` naming both shapes.
    """

    # buffers (state_dict entries), declared: nn.Module's __getattr__ would type them Tensor | Module
    shift: torch.Tensor
    scale: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float | None = 10.0) -> None:
        super().__init__()
        self.clip = None if clip is None else float(clip)
        self.register_buffer("shift", torch.zeros(shape, dtype=torch.float32))
        self.register_buffer("scale", torch.ones(shape, dtype=torch.float32))

    def load(self, shift: np.ndarray, scale: np.ndarray) -> None:
        """Write ``shift`` and ``scale``, each of the module's shape or ``()`` (one value for every dimension)."""
        shift_t, scale_t = torch.as_tensor(shift), torch.as_tensor(scale)
        for value in (shift_t, scale_t):
            if value.dim() and value.shape != self.shift.shape:
                raise ValueError(
                    f"statistics of shape {tuple(value.shape)} do not fit this NormalizationModule, of shape "
                    f"{tuple(self.shift.shape)}; nothing was loaded. Build the module with the shape of the "
                    "observations the statistics were learned on"
                )
        with torch.no_grad():
            self.shift.copy_(shift_t.expand_as(self.shift))
            self.scale.copy_(scale_t.expand_as(self.scale))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        expected = tuple(self.shift.shape)
        if not _matches(tuple(obs.shape), expected):
            raise _shape_error(
                tuple(obs.shape),
                expected,
                "Feed the module the observations of the env its statistics come from, or build it with this "
                "env's observation shape (ObservationNormalizer(shape=env.single_observation_space.shape).module()).",
            )
        out = (obs.to(self.shift.dtype) - self.shift) * self.scale
        return out if self.clip is None else out.clamp(-self.clip, self.clip)


def _one_row_per_env(stage: Any) -> bool:
    return isinstance(stage, PerEnvStream) and bool(stage.one_row_per_env)


def _check_per_step_upstream(upstream: Any, stage: str) -> None:
    if not _one_row_per_env(upstream):
        raise ValueError(
            f"{stage} must see one step of each env per batch, in order: put it right after the ExperienceSource "
            f"(before NStepTransform and any buffer, and with the source's steps_per_batch=1), not after "
            f"{type(upstream).__name__}"
        )


def _check_model_view(normalizer: ObservationNormalizer, output: str) -> None:
    if output != "raw":
        raise ValueError(
            "with apply_in='model' the network normalizes its own inputs (normalizer.module() in the policy), so "
            "the batches must stay raw: pass output='raw', or the observations would be normalized twice"
        )
    if not normalizer._modules:
        raise ValueError(
            "apply_in='model' needs the normalizer inside the policy network: build the policy with "
            "normalizer.module() as its first layer (ObservationNormalizer(shape=obs_shape).module())"
        )


def _find_source_with_hook(upstream: Any) -> Any:
    """The nearest stage upstream with an ``observation_transform`` hook (a source), through per-step stages."""
    for stage in reversed(pipeline_stages(upstream)):
        if hasattr(stage, "observation_transform"):
            return stage
        if not _one_row_per_env(stage):
            break
    raise ValueError(
        "NormalizeObservations must follow an ExperienceSource (directly, or through other per-step stages such "
        f"as ScaleRewards) so that the agent acts on normalized observations; got {type(upstream).__name__}. "
        "Behind remote collectors (AsyncSource, RayWorkers) put normalizer.module() first in the policy they "
        "are sent, and pass apply_in='model', output='raw'"
    )


class _PerStepStage:
    """What both normalization stages share: pass-through attributes, stream numbering, cuts."""

    one_row_per_env = True

    def __init__(self, upstream: Iterator[TransitionBatch]) -> None:
        self.upstream = upstream
        self.stream_seq = 0  # number of the last batch yielded; skips one where the env streams were cut
        self._upstream_seq: int | None = None
        self._upstream_numbered = isinstance(upstream, NumberedStream)  # its stream_seq is read at every pull
        self._in_next = False  # set while __next__ runs: still set on entry means the last call was interrupted

    @property
    def num_envs(self) -> int | None:
        return getattr(self.upstream, "num_envs", None)

    @property
    def env(self) -> Any:
        return getattr(self.upstream, "env", None)

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> TransitionBatch:
        cut = self._in_next
        self._in_next = True
        batch = next(self.upstream)
        seq = cast(NumberedStream, self.upstream).stream_seq if self._upstream_numbered else None
        gap = seq is not None and self._upstream_seq is not None and seq != self._upstream_seq + 1
        out = self._transform(batch, cut or gap)
        self._upstream_seq = seq
        self.stream_seq += 2 if (cut or gap) else 1
        self._in_next = False
        return out

    def _transform(self, batch: TransitionBatch, cut: bool) -> TransitionBatch:
        raise NotImplementedError


class NormalizeObservations(_PerStepStage):
    """Normalizes observations with running statistics of the collected ones; the agent acts on them too.

    Args:
        upstream: an :class:`~ptl_rl.stages.source.ExperienceSource` (or per-step
            stages after one, such as :class:`ScaleRewards`).
        normalizer: the statistics to update and apply (default: a new
            :class:`ObservationNormalizer` with ``clip`` and ``epsilon``).
            Share it with :class:`NormalizeSampledObservations` and with
            ``normalizer.wrap_agent(...)`` for evaluation.
        output: ``"normalized"`` (default): yielded ``obs``/``next_obs`` are
            normalized, float32 ``[B, *obs_shape]``, ``obs`` bit-identical to
            what the agent acted on. Use it for on-policy rollouts, whose stored
            ``log_prob`` must match the stored ``obs``. ``"raw"``: yield the
            env's observations; for replay that normalizes at sampling time.
        clip, epsilon: for the default normalizer.

    Per batch, in one commit: ``obs`` is normalized with the statistics the
    agent used, the statistics take in the batch's ``obs`` rows (each
    observation a transition starts from, once; never a final observation
    alone, never evaluation data), and ``next_obs`` is normalized with the
    updated statistics, which are those the agent uses at the next step.

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> import ptl_rl
        >>> env = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
        >>> seen = []
        >>> def agent(obs):  # records what it is shown
        ...     seen.append(obs.copy())
        ...     return np.zeros((len(obs), 1), dtype=np.float32)
        >>> source = ptl_rl.ExperienceSource(env, agent, seed=0)
        >>> norm = ptl_rl.NormalizeObservations(source)
        >>> batches = [next(norm) for _ in range(3)]
        >>> bool((batches[2].obs == seen[2]).all()), bool((batches[1].next_obs == batches[2].obs).all())
        (True, True)
        >>> norm.normalizer.count  # the obs rows of 3 steps of 2 envs
        6
    """

    def __init__(
        self,
        upstream: Iterator[TransitionBatch],
        normalizer: ObservationNormalizer | None = None,
        *,
        output: str = "normalized",
        apply_in: str = "source",
        clip: float | None = 10.0,
        epsilon: float = 1e-8,
    ) -> None:
        if output not in _OUTPUTS:
            raise ValueError(f"output must be one of {_OUTPUTS}, got {output!r}")
        if apply_in not in ("source", "model"):
            raise ValueError(f"apply_in must be 'source' or 'model', got {apply_in!r}")
        self.normalizer = normalizer if normalizer is not None else ObservationNormalizer(clip, epsilon)
        if apply_in == "model":
            _check_model_view(self.normalizer, output)
        else:
            source = _find_source_with_hook(upstream)  # first: its message also covers remote collectors
            _check_per_step_upstream(upstream, type(self).__name__)
            if source.observation_transform is not None:
                raise ValueError(
                    f"{type(source).__name__} already shows its agent transformed observations "
                    f"({source.observation_transform!r}); chain one NormalizeObservations per source"
                )
            source.observation_transform = self.normalizer
        super().__init__(upstream)
        self.output = output
        self.apply_in = apply_in

    def _transform(self, batch: TransitionBatch, cut: bool) -> TransitionBatch:
        norm = self.normalizer
        before = norm.statistics.moments
        if norm.frozen or not len(batch):
            update = None
            after = before
        else:
            update = norm.with_rows(batch.obs)  # refuses NaN/inf rows and other shapes before anything changes
            after = update[1]
        if self.output == "normalized":
            fields = dict(batch.items())
            fields["obs"] = norm.normalize_with(batch.obs, before)
            fields["next_obs"] = norm.normalize_with(batch.next_obs, after)
            batch = TransitionBatch.wrap(fields)
        if update is not None:
            norm.commit(*update)  # the step's one change of state (and the modules' buffers after it)
        return batch

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        return versioned({"normalizer": self.normalizer.state_dict()}, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        self.normalizer.load_state_dict(state["normalizer"])
        self._upstream_seq = None  # the source restarts its episodes after a restore

    def __repr__(self) -> str:
        return stage_repr(self, output=self.output, count=self.normalizer.count, frozen=self.normalizer.frozen)


class ScaleRewards(_PerStepStage):
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
        _check_per_step_upstream(upstream, type(self).__name__)
        super().__init__(upstream)
        self.gamma = float(gamma)
        self.clip = None if clip is None else float(clip)
        self.epsilon = float(epsilon)
        self.frozen = False
        self.statistics = RunningStatistics()
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
            self._last_env_id = None  # positions change when the id list grows
            ids = np.union1d(ids, env_id)
            grown = np.zeros(len(ids), np.float64)
            grown[np.searchsorted(ids, self._env_ids)] = returns
            returns = grown
            pos = np.searchsorted(ids, env_id)
        if not env_id.flags.writeable:  # read-only: it cannot change under the cache
            self._last_env_id, self._last_pos = env_id, pos
        return ids, returns, pos

    def _transform(self, batch: TransitionBatch, cut: bool) -> TransitionBatch:
        if not len(batch):
            return batch
        ids, returns, pos = self._slots(batch.env_id)
        returns = np.zeros_like(returns) if cut else returns.copy()
        g = returns[pos] * self.gamma + batch.reward
        if not math.isfinite(g.dot(_zeros(len(g)))):  # 0 * x: 0 for finite x, NaN for NaN and inf
            self._last_env_id = None  # the positions cached by _slots may be of ids not kept
            self._refuse(batch, g)
        try:
            update = None if self.frozen else self.statistics.with_rows(g, *_RETURNS_WORDING)
        except FloatingPointError:  # finite returns whose moments overflow float64
            self._last_env_id = None
            raise
        moments = self.statistics.moments if update is None else update[1]
        var = 1.0 if moments is None else float(moments.var)
        scaled = (np.asarray(batch.reward, np.float64) / np.sqrt(var + self.epsilon)).astype(np.float32)
        if self.clip is not None:
            np.clip(scaled, -self.clip, self.clip, out=scaled)
        returns[pos] = np.where(batch.terminated | batch.truncated, 0.0, g)
        fields = dict(batch.items())
        fields["reward"] = scaled
        if update is not None:
            self.statistics.commit(*update)
        self._env_ids, self._returns = ids, returns  # one statement: the returns move with the statistics
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
        self._upstream_seq = None

    def __repr__(self) -> str:
        return stage_repr(self, gamma=self.gamma, count=(self.statistics.moments or Moments.empty()).count)


class NormalizeSampledObservations:
    """Normalizes ``obs``/``next_obs`` of each sampled batch with the statistics of the moment.

    For replay: collect with ``NormalizeObservations(source, norm, output="raw")``
    (the agent acts on normalized observations, the buffer stores the env's),
    then ``NormalizeSampledObservations(sampler, norm)``: every batch is
    normalized with the statistics at sampling time, never stale ones.

    Args:
        upstream: a :class:`~ptl_rl.stages.sampler.BatchSampler` (yields :class:`TorchBatch`).
        normalizer: the :class:`ObservationNormalizer` the collecting stage updates.
    """

    def __init__(self, upstream: Iterator[TorchBatch], normalizer: ObservationNormalizer) -> None:
        if not isinstance(normalizer, ObservationNormalizer):
            raise TypeError(f"normalizer must be an ObservationNormalizer, got {type(normalizer).__name__}")
        self.upstream = upstream
        self.normalizer = normalizer

    def __iter__(self) -> NormalizeSampledObservations:
        return self

    def __next__(self) -> TorchBatch:
        batch = next(self.upstream)
        moments = self.normalizer.statistics.moments  # one set of statistics for obs and next_obs
        batch["obs"] = self.normalizer.normalize_with(batch["obs"], moments)
        batch["next_obs"] = self.normalizer.normalize_with(batch["next_obs"], moments)
        return batch

    def __repr__(self) -> str:
        return stage_repr(self, count=self.normalizer.count)


def sync_statistics(pipeline: Any) -> int:
    """Merge the running statistics of every normalization stage of ``pipeline`` across DDP ranks.

    A collective call under ``torch.distributed`` (every rank at the same point: a Lightning hook);
    a no-op otherwise. Returns how many stages it synced.
    """
    synced = 0
    for stage in pipeline_stages(pipeline):
        if isinstance(stage, NormalizeObservations):
            synced += stage.normalizer.sync()
        elif isinstance(stage, ScaleRewards):
            synced += stage.sync()
    return synced

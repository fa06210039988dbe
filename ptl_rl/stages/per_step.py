"""PerStepStage: the base of stages that must see one step of each env per batch, in order, right after a source.

The normalization stages are such stages: they keep per-env state across batches and act on what the
source's agent sees, so they sit before :class:`~ptl_rl.stages.nstep.NStepTransform` and any buffer. This
module checks that placement and finds the source (the :class:`~ptl_rl.core.protocols.ActingStage`) they
act through.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.chain import pipeline_stages
from ptl_rl.core.protocols import ActingStage, PerEnvStream
from ptl_rl.core.stage import Stage


def one_row_per_env(stage: Any) -> bool:
    """Whether ``stage`` yields at most one step of each env per batch, in order."""
    return isinstance(stage, PerEnvStream) and bool(stage.one_row_per_env)


def check_per_step_upstream(upstream: Any, stage: str) -> None:
    """``ValueError`` naming the fix unless ``upstream`` yields one step of each env per batch."""
    if not one_row_per_env(upstream):
        raise ValueError(
            f"{stage} must see one step of each env per batch, in order: put it right after the ExperienceSource "
            f"(before NStepTransform and any buffer, and with the source's steps_per_batch=1), not after "
            f"{type(upstream).__name__}"
        )


def per_step_stages(upstream: Any) -> Iterator[Any]:
    """The stages upstream, nearest first, through per-step ones: the walk ends after the first that is not."""
    for stage in reversed(pipeline_stages(upstream)):
        yield stage
        if not one_row_per_env(stage):
            return


def acting_stage(upstream: Any) -> ActingStage | None:
    """The nearest stage upstream that steps envs with an agent (a source), through per-step stages."""
    return next((stage for stage in per_step_stages(upstream) if isinstance(stage, ActingStage)), None)


class PerStepStage(Stage[TransitionBatch]):
    """A stage that sees (and yields) one step of each env per batch, in order; it reports the source's env count."""

    one_row_per_env = True

    @property
    def num_envs(self) -> int | None:
        """``N``, the sub-envs of the source upstream (a RolloutBuffer reads it); ``None`` behind remote collectors."""
        source = acting_stage(self.upstream)
        return None if source is None else source.num_envs

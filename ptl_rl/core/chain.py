"""Walking a pipeline: its stages in order, one stage by type, and the state of them all.

A stage is recognised by the protocols of :mod:`ptl_rl.core.protocols` alone, so a
stage of your own is walked, checkpointed and found like ptl_rl's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from ptl_rl.core.protocols import ActingStage, EpisodeCounter, Pipeline, ReplayStage, StageLike, Stateful
from ptl_rl.core.stage import Stage

PIPELINE_STATE_VERSION = 1

StageT = TypeVar("StageT")


def pipeline_stages(last: Pipeline) -> list[object]:
    """The stages of a pipeline, source first, found by following ``.upstream`` from ``last``.

    Every :class:`~ptl_rl.core.protocols.StageLike` is followed to its ``upstream``; an
    upstream that is a plain iterator (a generator) ends the walk, as its
    first element. ``last`` may also be a DataLoader made by
    :func:`~ptl_rl.lightning.to_dataloader`.
    """
    stages = []
    stage: object = getattr(getattr(last, "dataset", None), "pipeline", last)  # the loader's PipelineDataset
    while stage is not None:
        stages.append(stage)
        stage = stage.upstream if isinstance(stage, StageLike) else None
    return stages[::-1]


def find_stage(last: Pipeline, kind: type[StageT]) -> StageT:
    """The first stage of type ``kind`` in the pipeline ending at ``last``."""
    for stage in pipeline_stages(last):
        if isinstance(stage, kind):
            return stage
    raise ValueError(f"the pipeline {[type(s).__name__ for s in pipeline_stages(last)]} has no {kind.__name__}")


def find_acting_stage(last: Pipeline) -> ActingStage | None:
    """The nearest stage at or before ``last`` that steps envs with an agent (an ExperienceSource); ``None`` if none."""
    return next((stage for stage in reversed(pipeline_stages(last)) if isinstance(stage, ActingStage)), None)


def find_episode_source(last: Pipeline) -> EpisodeCounter:
    """The first stage that counts env steps and episodes: an ExperienceSource, or a stage standing in for one.

    An :class:`~ptl_rl.distributed.AsyncSource` or a Ray worker stage collects
    elsewhere and keeps the learner's copy of those counters under the same
    names (:class:`~ptl_rl.core.protocols.EpisodeCounter`), so the episode callbacks work on it too.
    """
    for stage in pipeline_stages(last):
        if isinstance(stage, EpisodeCounter):
            return stage
    raise ValueError(
        f"the pipeline {[type(s).__name__ for s in pipeline_stages(last)]} has no ExperienceSource "
        "(nor a stage with its episode counters, such as ptl_rl.distributed.AsyncSource)"
    )


def holds_replay(stage: object) -> bool:
    """Whether ``stage`` stores replay contents (a :class:`~ptl_rl.core.protocols.ReplayStage`: a replay buffer)."""
    return isinstance(stage, ReplayStage)


def _stateful_stages(last: Pipeline, include_replay: bool) -> dict[str, Stateful]:
    return {
        f"{i}:{type(stage).__name__}": stage
        for i, stage in enumerate(pipeline_stages(last))
        if isinstance(stage, Stateful) and (include_replay or not holds_replay(stage))
    }


def pipeline_state_dict(last: Pipeline, include_replay: bool = True) -> dict[str, Any]:
    """State of every :class:`~ptl_rl.core.protocols.Stateful` stage, keyed ``"<position>:<class name>"``.

    With ``include_replay=False`` replay buffers are left out: after a restore
    they start empty and warm up again, while the source's counters, the
    agent's exploration state and the n-step windows still resume.
    """
    stages = _stateful_stages(last, include_replay)
    return {
        "version": PIPELINE_STATE_VERSION,
        "include_replay": include_replay,
        "stages": {key: stage.state_dict() for key, stage in stages.items()},
    }


def load_pipeline_state_dict(last: Pipeline, state: Mapping[str, Any]) -> None:
    """Restore what :func:`pipeline_state_dict` saved into a pipeline of the same shape."""
    if "version" not in state:  # written before the state had a version: the stages' states at top level
        state = {"version": 0, "include_replay": True, "stages": state}
    if int(state["version"]) > PIPELINE_STATE_VERSION:
        raise ValueError(
            f"the pipeline state has version {state['version']}, newer than this ptl_rl understands "
            f"({PIPELINE_STATE_VERSION}); upgrade ptl_rl to load it"
        )
    stages = _stateful_stages(last, bool(state["include_replay"]))
    saved = state["stages"]
    if set(stages) != set(saved):
        raise ValueError(
            f"checkpointed pipeline has stages {sorted(saved)}, this one has {sorted(stages)}; "
            "build the same pipeline before restoring"
        )
    for key, stage in stages.items():
        stage.load_state_dict(saved[key])
        if isinstance(stage, Stage):  # what a step cut before the restore began from is not put back over it
            stage.state_replaced()

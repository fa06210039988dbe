"""FrameStorage checkpoints: a storage's parts as metadata and named arrays (views), and back.

A ``state_dict`` holds them as tensors (``weights_only``-safe); a saved directory
(:mod:`ptl_rl.replay.persist`) as ``.npy`` files. The layout is the one of the code before the composition
(issue #22's split, and the one-module code before it): a checkpoint of either loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ptl_rl.core._trees import tree_leaves
from ptl_rl.replay.frames.checks import ObsLayout
from ptl_rl.replay.frames.env_state import EnvTable
from ptl_rl.replay.frames.insert import allocate
from ptl_rl.replay.frames.links import FrameLinks
from ptl_rl.replay.frames.pool import FramePool
from ptl_rl.replay.storage import ArrayStorage


def saved_arrays(fields: ArrayStorage, pool: FramePool, links: FrameLinks, envs: EnvTable) -> dict[str, np.ndarray]:
    """Every array of an allocated storage's state, by name (views, no copies): the pool's written frames, the
    references of the stored slots, the per-env state's columns, ``field.<path>`` of each other field."""
    size = fields.size
    arrays = {
        "pool": pool.ring()[: min(pool.written, pool.size)],
        "obs_refs": links.obs_refs[:size],
        "next_refs": links.next_refs[:size],
    }
    arrays.update(envs.state.columns())
    for path, leaf in tree_leaves(fields.fields):
        arrays[f"field.{path}"] = leaf[:size]
    return arrays


def saved_meta(
    fields: ArrayStorage, pool: FramePool, layout: ObsLayout, stack_axis: int | None, n_step: int | None
) -> dict[str, Any]:
    """The counters and the layout a save holds beside its arrays (plain ``int`` / ``str`` / ``None`` / lists)."""
    return {
        "capacity": fields.capacity,
        "pool_size": pool.size,
        "stack_axis": stack_axis,
        "n_step": n_step,
        "frames_written": pool.written,
        "cursor": fields.cursor,
        "size": fields.size,
        "total_added": fields.total_added,
        "frame_key": layout.frame_key,
        "obs_keys": None if layout.keys is None else list(layout.keys),
    }


def tensor_state(meta: dict[str, Any], arrays: dict[str, np.ndarray], field_names: list[str]) -> dict[str, Any]:
    """A ``state_dict`` of the parts: ``meta``'s entries, the arrays as tensors (``weights_only``-safe), the fields."""
    state = dict(meta)
    state["arrays"] = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    state["fields"] = field_names
    return state


def load_parts(
    meta: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    *,
    fields: ArrayStorage,
    pool: FramePool,
    links: FrameLinks,
    envs: EnvTable,
    layout: ObsLayout,
    stack_axis: int | None,
    memmap_dir: str | None,
) -> int | None:
    """Fill a storage's parts from ``meta`` and ``arrays`` (as :func:`saved_meta` and :func:`saved_arrays` give
    them); returns the saved ``n_step``. Transitions waiting for ``next_obs`` stay unsampleable."""
    if int(meta["capacity"]) != fields.capacity or int(meta["pool_size"]) != pool.size:
        raise ValueError(
            f"the saved storage has capacity {meta['capacity']} and a pool of {meta['pool_size']} frames; this "
            f"one has {fields.capacity} and {pool.size}. Create it with the same capacity and extra_frames."
        )
    if meta["stack_axis"] != stack_axis:
        raise ValueError(f"the saved storage has stack_axis={meta['stack_axis']}, this one {stack_axis}; use the same")
    size = int(meta["size"])
    n_step = meta["n_step"]
    layout.frame_key = meta.get("frame_key")
    layout.keys = None if meta.get("obs_keys") is None else tuple(meta["obs_keys"])
    tree: dict[str, Any] = {}
    for name, value in arrays.items():
        if name.startswith("field."):
            _set_path(tree, name[len("field.") :].split("."), value)
    fields.load_state_dict(
        {
            "capacity": fields.capacity,
            "fields": {k: _tree_to_torch(v) for k, v in tree.items()},
            "cursor": int(meta["cursor"]),
            "size": size,
            "total_added": int(meta["total_added"]),
        }
    )
    frames = arrays["pool"]
    stack = arrays["obs_refs"].shape[1]
    if pool.frames is None:
        shape = _obs_shape(frames.shape[1:], stack, stack_axis)
        allocate(layout, pool, links, envs, shape, frames.dtype, n_step or 1, memmap_dir)
    pool.ring()[: len(frames)] = frames
    pool.written = int(meta["frames_written"])
    links.obs_refs[:size] = arrays["obs_refs"]
    links.next_refs[:size] = arrays["next_refs"]
    envs.reset(len(arrays["last"]), pool.stack, n_step or 1, pool.frame_shape, frames.dtype)
    for name, column in envs.state.columns().items():
        if name in arrays:  # (saves before "trust" existed lack it: nothing is trusted then)
            column[:] = arrays[name]
    # the envs start new episodes after a restore: no stored transition may take a later observation as next_obs,
    # and no stack is trusted to continue one stored before
    envs.state.recent[:] = -1
    envs.state.trust[:] = 0
    links.retained = ()
    return None if n_step is None else int(n_step)


def _obs_shape(frame: tuple[int, ...], stack: int, stack_axis: int | None) -> tuple[int, ...]:
    if stack_axis is None:
        return tuple(frame)
    axis = stack_axis % (len(frame) + 1)
    return (*frame[:axis], stack, *frame[axis:])


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _tree_to_torch(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _tree_to_torch(v) for k, v in tree.items()}
    return torch.from_numpy(np.array(tree))  # a copy: saved arrays are read-only memory maps (small fields only)

"""FrameStorage checkpoints: ``state_dict`` as tensors (``weights_only``-safe) or a saved directory, and back."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ptl_rl.core._trees import tree_leaves
from ptl_rl.core.versions import check_version, versioned
from ptl_rl.replay.frames.journal import FrameJournal


class FrameCheckpoint(FrameJournal):
    """The state API of a FrameStorage (its last layer before the facade)."""

    checkpoint_dir: str | None  # where state_dict saves the storage (None: the state holds the arrays)

    def _arrays(self) -> dict[str, np.ndarray]:
        """Every array of the storage's state, by name (views, no copies)."""
        size = len(self)
        kept = min(self.frames_written, self.pool_size)
        arrays = {
            "pool": self._pool()[:kept],
            "obs_refs": self._obs_refs[:size],
            "next_refs": self._next_refs[:size],
        }
        arrays.update(self._state.columns())
        for path, leaf in tree_leaves(self._fields.fields):
            arrays[f"field.{path}"] = leaf[:size]
        return arrays

    def _meta(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "pool_size": self.pool_size,
            "stack_axis": self.stack_axis,
            "n_step": self.n_step,
            "frames_written": self.frames_written,
            "cursor": self.cursor,
            "size": self.size,
            "total_added": self.total_added,
            "frame_key": self.frame_key,
            "obs_keys": None if self._obs_keys is None else list(self._obs_keys),
        }

    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """The storage as tensors (views of its arrays, ``weights_only``-safe), or a reference to a saved directory.

        With ``checkpoint_dir`` set the storage is saved there (see :meth:`save`)
        and the state is ``{"directory": path, "save_id": ...}``.
        """
        if self.pool is None:
            return versioned({"capacity": self.capacity, "fields": None}, self.STATE_VERSION)
        if self.checkpoint_dir is not None:
            from ptl_rl.replay.persist import save_to_checkpoint_dir

            return versioned(save_to_checkpoint_dir(self, self.checkpoint_dir), self.STATE_VERSION)
        state = self._meta()
        state["arrays"] = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self._arrays().items()}
        state["fields"] = list(self._fields.fields or ())
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state (or the directory it refers to); transitions waiting for ``next_obs`` stay unsampleable."""
        check_version(state, self.STATE_VERSION, type(self).__name__)
        if "directory" in state:
            from ptl_rl.replay.persist import load_directory

            load_directory(self, state["directory"], expected_save_id=state.get("save_id"))
            return
        if state.get("fields") is None:
            if self.pool is not None:
                raise ValueError("the state holds an empty storage; load it into a fresh FrameStorage")
            return
        self._restore(state, {k: v.numpy() for k, v in state["arrays"].items()})

    def _restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Fill this storage from ``meta`` and ``arrays`` (as :meth:`_meta` and :meth:`_arrays` give them)."""
        if int(meta["capacity"]) != self.capacity or int(meta["pool_size"]) != self.pool_size:
            raise ValueError(
                f"the saved storage has capacity {meta['capacity']} and a pool of {meta['pool_size']} frames; this "
                f"one has {self.capacity} and {self.pool_size}. Create it with the same capacity and extra_frames."
            )
        if meta["stack_axis"] != self.stack_axis:
            raise ValueError(
                f"the saved storage has stack_axis={meta['stack_axis']}, this one {self.stack_axis}; use the same"
            )
        self._kernel = None  # (it holds the arrays replaced here)
        size = int(meta["size"])
        self.n_step = meta["n_step"]
        self.frame_key = meta.get("frame_key")
        self._obs_keys = None if meta.get("obs_keys") is None else tuple(meta["obs_keys"])
        fields: dict[str, Any] = {}
        for name, value in arrays.items():
            if name.startswith("field."):
                _set_path(fields, name[len("field.") :].split("."), value)
        self._fields.load_state_dict(
            {
                "capacity": self.capacity,
                "fields": {k: _tree_to_torch(v) for k, v in fields.items()},
                "cursor": int(meta["cursor"]),
                "size": size,
                "total_added": int(meta["total_added"]),
            }
        )
        pool = arrays["pool"]
        sample_obs = np.zeros((1, *self._obs_shape_from(pool.shape[1:], arrays["obs_refs"].shape[1])), pool.dtype)
        if self.pool is None:
            self._allocate(sample_obs, self._obs_keys, self.frame_key)
        self._pool()[: len(pool)] = pool
        self.frames_written = int(meta["frames_written"])
        self._obs_refs[:size] = arrays["obs_refs"]
        self._next_refs[:size] = arrays["next_refs"]
        self._allocate_env_state(len(arrays["last"]))
        for name, column in self._state.columns().items():
            if name in arrays:  # (saves before "trust" existed lack it: nothing is trusted then)
                column[:] = arrays[name]
        # the envs start new episodes after a restore: no stored transition may take a later observation as next_obs,
        # and no stack is trusted to continue one stored before
        self._state.recent[:] = -1
        self._state.trust[:] = 0
        self._seen_seq = None
        self._retained = ()
        self._journal.done = True

    def _obs_shape_from(self, frame: tuple[int, ...], stack: int) -> tuple[int, ...]:
        if self.stack_axis is None:
            return tuple(frame)
        axis = self.stack_axis % (len(frame) + 1)
        return (*frame[:axis], stack, *frame[axis:])

    def save(self, directory: str | os.PathLike[str]) -> str:
        """Write the storage to ``directory`` atomically (see :func:`ptl_rl.replay.persist.save_directory`)."""
        from ptl_rl.replay.persist import save_directory

        return save_directory(self, directory)

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Fill this storage from a directory written by :meth:`save`; a half-written one is refused."""
        from ptl_rl.replay.persist import load_directory

        load_directory(self, directory)


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _tree_to_torch(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _tree_to_torch(v) for k, v in tree.items()}
    return torch.from_numpy(np.array(tree))  # a copy: saved arrays are read-only memory maps (small fields only)

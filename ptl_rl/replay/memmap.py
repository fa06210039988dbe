"""Replay storage in memory-mapped files: a replay larger than RAM lives on disk.

:class:`MemmapStorage` is an :class:`~ptl_rl.replay.ArrayStorage` whose
per-field rings are ``.npy`` files opened with ``np.lib.format.open_memmap``
in a directory of its own; everything else (``add``, ``gather``, the state
API, the field contract) is inherited unchanged. The files are scratch space,
not a save: they are overwritten as the ring turns, so a directory must hold
one storage's files only (a fresh one per buffer), and a buffer is kept with
:func:`~ptl_rl.replay.save_buffer` (an atomic directory save) or a checkpoint.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ptl_rl.core._trees import tree_leaves
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.replay.storage import ArrayStorage


def open_fresh_memmap(
    directory: str | os.PathLike[str], name: str, shape: tuple[int, ...], dtype: Any, fill: int = 0, reuse: bool = False
) -> np.memmap:
    """A new memory-mapped ``directory/name.npy`` of ``shape`` and ``dtype``, filled with ``fill``.

    Refuses to overwrite an existing file (another storage's scratch space)
    unless ``reuse`` (the caller created it itself): then a file of the same
    shape and dtype is opened as it is, not recreated, so arrays that still map
    it (a state taken from the same storage, being loaded back) stay valid.
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(os.fspath(directory), f"{name}.npy")
    if os.path.exists(path):
        if not reuse:
            raise FileExistsError(
                f"{path} exists: memmap_dir must be a fresh directory per buffer (it is scratch space, overwritten "
                "as the buffer runs); to keep a buffer use save_buffer(), to restore one load_buffer()"
            )
        existing: np.memmap[Any, np.dtype[Any]] = np.load(path, mmap_mode="r+")
        if existing.shape == tuple(shape) and existing.dtype == np.dtype(dtype):
            return existing
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    if fill:
        array[:] = fill
    return array


class MemmapStorage(ArrayStorage):
    """An :class:`~ptl_rl.replay.ArrayStorage` whose arrays are memory-mapped ``.npy`` files in ``memmap_dir``.

    One file per field leaf, ``<field>.npy`` (``obs.pixels.npy`` for a
    ``Dict`` observation's key), of shape ``[capacity, *shape]``; its size on
    disk is the array's bytes plus a 128-byte ``.npy`` header, and it can be
    read with ``np.load(path, mmap_mode="r")``. Use it as
    ``ReplayBuffer(..., storage=functools.partial(MemmapStorage, memmap_dir=path))``.

    Args:
        capacity: transitions kept; the oldest are overwritten.
        memmap_dir: directory for the files (created); must not hold another
            storage's files.
    """

    def __init__(self, capacity: int, *, memmap_dir: str | os.PathLike[str]) -> None:
        super().__init__(capacity)
        self.memmap_dir = os.fspath(memmap_dir)
        self._own_files: set[str] = set()  # files this storage created (and may recreate on a restore)

    def _new_fields(self, batch: TransitionBatch) -> dict[str, Any]:
        # shapes and contract dtypes from the RAM rings (np.zeros: no page of them is touched), then files
        fields = super()._new_fields(batch)
        return {name: _map_with_path(self._file, value, name) for name, value in fields.items()}

    def _file(self, path: str, like: np.ndarray) -> np.ndarray:
        array = open_fresh_memmap(self.memmap_dir, path, like.shape, like.dtype, reuse=path in self._own_files)
        self._own_files.add(path)
        return array

    def flush(self) -> None:
        """Write dirty pages of every file to disk (the OS does so anyway; call it before copying the files)."""
        if self.fields is not None:
            for _, leaf in tree_leaves(self.fields):
                leaf.flush()


def _map_with_path(fn: Any, tree: Any, prefix: str) -> Any:
    """``tree_map`` that also passes each leaf's dotted path."""
    if isinstance(tree, dict):
        return {k: _map_with_path(fn, v, f"{prefix}.{k}") for k, v in tree.items()}
    return fn(prefix, tree)

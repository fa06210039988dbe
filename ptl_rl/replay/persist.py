"""Saving replay storage to a directory and loading it back, atomically.

A save is a directory of ``.npy`` files (one per array, written straight from
the buffer's arrays or memory maps: no copy in RAM) and a ``manifest.json``
that lists them with their shapes, dtypes and sizes. The protocol makes a
half-written save impossible to mistake for a good one:

1. everything is written into ``<directory>.tmp-<id>`` next to the target;
2. every file is flushed and ``fsync``-ed, then the manifest is written and
   ``fsync``-ed **last** (a directory without a manifest is never loaded);
3. the temporary directory is renamed onto the target (a rename is atomic
   on POSIX); a previous save at the target is moved aside first and
   removed after.

:func:`load_directory` refuses a directory without a manifest, with a
manifest of another format or ``save_id``, or whose files do not have the
sizes the manifest lists.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ptl_rl.core._trees import tree_leaves
from ptl_rl.core.protocols import PartsStorage

if TYPE_CHECKING:
    from ptl_rl.replay.buffer import ReplayBuffer

MANIFEST = "manifest.json"
FORMAT = "ptl_rl.FrameStorage"
ARRAY_FORMAT = "ptl_rl.ArrayStorage"  # an ArrayStorage or MemmapStorage: one file per field leaf
VERSION = 1
EXTRA_STATE = "buffer_state.pt"
# checkpoint_dir keeps this many saves; older ones (and the checkpoints that refer to them) lose their replay
KEEP_SAVES = 2


def save_directory(storage: Any, directory: str | os.PathLike[str], extra_state: dict[str, Any] | None = None) -> str:
    """Write ``storage`` (a ``FrameStorage``, ``ArrayStorage`` or ``MemmapStorage``) to ``directory``; returns its path.

    ``extra_state`` (plain containers and tensors, e.g. a buffer's RNG and
    priorities) is stored beside it with ``torch.save``.
    """
    directory = os.path.abspath(os.fspath(directory))
    if os.path.exists(directory) and not os.path.exists(os.path.join(directory, MANIFEST)) and os.listdir(directory):
        raise FileExistsError(
            f"{directory} exists and is not a ptl_rl save (no {MANIFEST}); pick an empty or new directory"
        )
    save_id = uuid.uuid4().hex
    tmp = f"{directory}.tmp-{save_id}"
    os.makedirs(tmp)
    try:
        listing = {}
        kind, meta, arrays = _parts(storage)
        for name, array in arrays.items():
            filename = f"{name}.npy"
            path = os.path.join(tmp, filename)
            with open(path, "wb") as f:
                np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            listing[name] = {
                "file": filename,
                "shape": list(array.shape),
                "dtype": np.lib.format.dtype_to_descr(array.dtype),
                "bytes": os.path.getsize(path),
            }
        if extra_state is not None:
            path = os.path.join(tmp, EXTRA_STATE)
            with open(path, "wb") as f:
                torch.save(extra_state, f)
                f.flush()
                os.fsync(f.fileno())
        manifest = {
            "format": kind,
            "version": VERSION,
            "save_id": save_id,
            "meta": meta,
            "arrays": listing,
        }
        _write_synced(os.path.join(tmp, MANIFEST), json.dumps(manifest, indent=1).encode())
        _fsync_dir(tmp)
        _replace(tmp, directory, save_id)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def read_manifest(directory: str | os.PathLike[str], expected_save_id: str | None = None) -> dict[str, Any]:
    """The manifest of a complete save in ``directory``; raises naming the problem otherwise."""
    directory = os.fspath(directory)
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        partial = sorted(glob.glob(f"{glob.escape(directory)}.tmp-*"))
        hint = (
            f" (unfinished saves next to it: {partial}; they are incomplete unless they hold {MANIFEST})"
            if partial
            else ""
        )
        raise FileNotFoundError(f"no saved replay at {directory}{hint}")
    if not os.path.exists(path):
        raise ValueError(
            f"{directory} holds no {MANIFEST}: it is not a complete save (the manifest is written last, so this is "
            "a half-written or foreign directory). Load another save or start with an empty buffer."
        )
    with open(path, "rb") as f:
        manifest: dict[str, Any] = json.loads(f.read())
    if manifest.get("format") not in (FORMAT, ARRAY_FORMAT) or manifest.get("version") != VERSION:
        raise ValueError(
            f"{path} is format {manifest.get('format')!r} version {manifest.get('version')}; this ptl_rl reads "
            f"{FORMAT!r} and {ARRAY_FORMAT!r} version {VERSION}"
        )
    if expected_save_id is not None and manifest["save_id"] != expected_save_id:
        raise ValueError(
            f"{directory} holds save {manifest['save_id']}, but the checkpoint refers to save {expected_save_id}: the "
            "directory was overwritten by a later save. Resume from the latest checkpoint, or restore without replay."
        )
    for entry in manifest["arrays"].values():
        file = os.path.join(directory, entry["file"])
        if not os.path.exists(file) or os.path.getsize(file) != entry["bytes"]:
            raise ValueError(
                f"{file} is missing or has the wrong size (manifest: {entry['bytes']} bytes): the save at {directory} "
                "is damaged; load another save"
            )
    return manifest


def load_directory(
    storage: Any, directory: str | os.PathLike[str], expected_save_id: str | None = None
) -> dict[str, Any]:
    """Fill ``storage`` from a save in ``directory`` (arrays memory-mapped, streamed in); returns the manifest."""
    manifest = read_manifest(directory, expected_save_id)
    kind = FORMAT if isinstance(storage, PartsStorage) else ARRAY_FORMAT
    if manifest["format"] != kind:
        raise ValueError(
            f"{directory} holds a {manifest['format']} save; this buffer's storage is a {type(storage).__name__} "
            f"({kind}). Create the buffer with the storage= it was saved with."
        )
    arrays = {}
    for name, entry in manifest["arrays"].items():
        array = np.load(os.path.join(os.fspath(directory), entry["file"]), mmap_mode="r", allow_pickle=False)
        if list(array.shape) != entry["shape"] or np.lib.format.dtype_to_descr(array.dtype) != entry["dtype"]:
            raise ValueError(f"{entry['file']} in {directory} does not match its manifest entry; the save is damaged")
        arrays[name] = array
    if isinstance(storage, PartsStorage):
        storage.load_parts(manifest["meta"], arrays)
    else:
        _restore_array_storage(storage, manifest["meta"], arrays)
    return manifest


def save_buffer(buffer: ReplayBuffer, directory: str | os.PathLike[str]) -> str:
    """Save a replay buffer (its storage, RNG, its draw strategy's state, counters) to ``directory`` atomically."""
    state = dict(buffer.state_dict())
    state.pop("storage")  # (written as the directory's arrays)
    return save_directory(buffer.storage, directory, extra_state=state)


def load_buffer(buffer: ReplayBuffer, directory: str | os.PathLike[str]) -> None:
    """Restore a buffer saved with :func:`save_buffer` (create it with the same arguments first)."""
    manifest = read_manifest(directory)
    path = os.path.join(os.fspath(directory), EXTRA_STATE)
    state = torch.load(path, weights_only=True)
    if isinstance(buffer.storage, PartsStorage):  # a FrameStorage loads the directory as its state
        state["storage"] = {"directory": os.fspath(directory), "save_id": manifest["save_id"]}
    else:  # an ArrayStorage is loaded here; the buffer then takes its state (views of what was just loaded)
        load_directory(buffer.storage, directory, manifest["save_id"])
        state["storage"] = buffer.storage.state_dict()
    buffer.load_state_dict(state)


def save_to_checkpoint_dir(storage: Any, root: str | os.PathLike[str]) -> dict[str, Any]:
    """Save ``storage`` to a new ``root/replay-<transitions added>`` and return the reference a checkpoint keeps.

    Only the newest :data:`KEEP_SAVES` saves are kept.
    """
    root = os.path.abspath(os.fspath(root))
    os.makedirs(root, exist_ok=True)
    directory = os.path.join(root, f"replay-{storage.total_added:015d}")
    save_directory(storage, directory)
    save_id = read_manifest(directory)["save_id"]
    saves = sorted(p for p in glob.glob(os.path.join(root, "replay-*")) if ".tmp-" not in p and ".old-" not in p)
    for old in saves[:-KEEP_SAVES]:
        shutil.rmtree(old, ignore_errors=True)
    return {"directory": directory, "save_id": save_id}


def _parts(storage: Any) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """(format, meta, arrays by name) of a storage: a FrameStorage's own, or an ArrayStorage's field leaves."""
    if isinstance(storage, PartsStorage):
        return FORMAT, *storage.saved_parts()
    meta = {k: int(getattr(storage, k)) for k in ("capacity", "cursor", "size", "total_added")}
    fields = {} if storage.fields is None else storage.fields
    arrays = {f"field.{path}": leaf[: storage.size] for path, leaf in tree_leaves(fields)}
    meta["empty"] = storage.fields is None
    return ARRAY_FORMAT, meta, arrays


def _restore_array_storage(storage: Any, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Fill an ArrayStorage (or MemmapStorage: streamed into its files) from a save's ``meta`` and ``arrays``."""
    if meta.get("empty"):
        storage.load_state_dict({"capacity": meta["capacity"], "fields": None})
        return
    fields: dict[str, Any] = {}
    for name, array in arrays.items():
        *keys, leaf = name[len("field.") :].split(".")
        node = fields
        for key in keys:
            node = node.setdefault(key, {})
        node[leaf] = torch.from_numpy(np.array(array))  # (the save's files are read-only maps: copied)
    state = {k: meta[k] for k in ("capacity", "cursor", "size", "total_added")}
    storage.load_state_dict({**state, "fields": fields})


def _replace(tmp: str, directory: str, save_id: str) -> None:
    """Rename the finished ``tmp`` onto ``directory``, moving a previous save aside first."""
    old = None
    if os.path.exists(directory):
        old = f"{directory}.old-{save_id}"
        os.rename(directory, old)
    os.rename(tmp, directory)
    _fsync_dir(os.path.dirname(directory))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

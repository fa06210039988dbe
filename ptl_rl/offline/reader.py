"""Reading Minari datasets: opening one (object, local id or directory), its space checks, its episodes as rows.

How a Minari episode of ``T`` steps maps to rows (Minari >= 0.4 format), with
the field contract of live data (``docs/contract.rst``)::

    observations  [T + 1, ...]   row t: obs = observations[t], next_obs = observations[t + 1]
    actions       [T, ...]       action
    rewards       [T]            reward (float32)
    terminations  [T]  bool      terminated
    truncations   [T]  bool      truncated

so ``next_obs`` of the last row is the real final observation, never a reset
observation. Minari is an optional dependency (``pip install ptl_rl[offline]``),
imported only when a dataset is opened or written (:func:`import_minari`).
Besides :func:`open_minari_dataset`, the functions here are the ``offline``
package's own, shared by its source and recorder.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces

from ptl_rl.core._trees import tree_map

if TYPE_CHECKING:
    from minari import MinariDataset  # (Minari ships no types: Any to the checker, its class to a reader)

__all__ = ["open_minari_dataset"]

_INSTALL_HINT = "pip install 'ptl_rl[offline]'  (or: pip install 'minari[hdf5]>=0.5')"


def import_minari() -> Any:
    """The ``minari`` module, or an ImportError that says how to install it."""
    try:
        import minari
    except ImportError as error:  # the optional extra is not installed
        raise ImportError(
            f"ptl_rl's offline data support (MinariSource, MinariRecorder) needs Minari, which is not installed "
            f"({error}). Install the extra: {_INSTALL_HINT}"
        ) from error
    return minari


# ---------------------------------------------------------------------------- opening datasets
def open_minari_dataset(dataset: MinariDataset | str | os.PathLike[str]) -> MinariDataset:
    """A ``minari.MinariDataset`` from a dataset object, a local dataset id, or a directory path.

    ``dataset`` may be:

    * a ``minari.MinariDataset`` (returned as is);
    * a directory: a dataset's own directory (holding ``data/metadata.json``)
      or its ``data`` directory, e.g. one copied from another machine;
    * a dataset id such as ``"cartpole/expert-v0"`` or ``"D4RL/door/human-v2"``,
      looked up under ``$MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``).

    Nothing is ever downloaded: a dataset id that is not stored locally raises
    FileNotFoundError naming the download command to run first.
    """
    minari = import_minari()
    if isinstance(dataset, minari.MinariDataset):
        return dataset
    if not isinstance(dataset, (str, os.PathLike)):
        raise TypeError(
            f"expected a minari.MinariDataset, a dataset id or a dataset directory, got {type(dataset).__name__}"
        )
    path = pathlib.Path(dataset)
    if path.is_dir():
        for data_dir in (path, path / "data"):
            if (data_dir / "metadata.json").is_file():
                return minari.MinariDataset(data_dir)
        raise FileNotFoundError(
            f"{path} is a directory but holds no Minari dataset (no metadata.json in it or in its data/ "
            "subdirectory); pass the dataset's directory, e.g. ~/.minari/datasets/<namespace>/<name>-v0"
        )
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        return minari.load_dataset(str(dataset), download=False)
    except FileNotFoundError:
        root = get_dataset_path().resolve()
        raise FileNotFoundError(
            f"Minari dataset {str(dataset)!r} is not stored locally (looked in {root}, set by "
            "$MINARI_DATASETS_PATH). ptl_rl never downloads: fetch it first where there is internet with "
            f"`minari download {dataset}` (or minari.download_dataset({str(dataset)!r})), copy it under "
            "$MINARI_DATASETS_PATH, or pass the dataset's directory path instead of its id"
        ) from None


# ---------------------------------------------------------------------------- checks
_UNSUPPORTED_SPACES = (spaces.Tuple, spaces.Text, spaces.Sequence, spaces.Graph)


def check_space_kind(space: spaces.Space[Any], what: str, dataset_id: str) -> None:
    """Transition fields are arrays or dicts of arrays: reject the spaces Minari stores otherwise."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            check_space_kind(sub, f"{what}[{key!r}]", dataset_id)
    elif isinstance(space, _UNSUPPORTED_SPACES):
        raise TypeError(
            f"dataset {dataset_id!r}: its {what} space is {space}, which ptl_rl cannot hold in a TransitionBatch "
            "(fields are arrays or dicts of arrays). Record the env with a flattening wrapper, e.g. "
            "gymnasium.wrappers.FlattenObservation, or convert the dataset's episodes yourself"
        )


def _same_space(a: spaces.Space[Any], b: spaces.Space[Any]) -> bool:
    """Same kind, shape and dtype (and ``n`` of Discrete, keys of Dict); bounds are not compared."""
    if type(a) is not type(b):
        return False
    # (b's kind is tested too, though it is a's: `type(a) is type(b)` narrows a only)
    if isinstance(a, spaces.Dict) and isinstance(b, spaces.Dict):
        return a.spaces.keys() == b.spaces.keys() and all(_same_space(a[k], b[k]) for k in a.spaces)
    if isinstance(a, spaces.Discrete) and isinstance(b, spaces.Discrete):
        return int(a.n) == int(b.n) and int(a.start) == int(b.start)
    return a.shape == b.shape and np.dtype(a.dtype).kind == np.dtype(b.dtype).kind


def check_expected_space(
    dataset_id: str, what: str, stored: spaces.Space[Any], expected: spaces.Space[Any] | None
) -> None:
    if expected is not None and not _same_space(stored, expected):
        raise ValueError(
            f"dataset {dataset_id!r} has {what} space {stored}, but the pipeline expects {expected}. "
            f"Load a dataset recorded from this env, or build the model for the dataset's {what} space "
            f"(MinariDataset.{what}_space)"
        )


def leaf_shapes(space: spaces.Space[Any]) -> Any:
    """The per-step shape of each leaf of ``space`` (a dict for Dict spaces)."""
    if isinstance(space, spaces.Dict):
        return {k: leaf_shapes(s) for k, s in space.spaces.items()}
    return tuple(space.shape) if space.shape is not None else ()


def _check_leaves(dataset_id: str, episode_id: int, what: str, data: Any, shapes: Any, length: int) -> None:
    """Every leaf of ``data`` is an array of ``length`` entries of the space's shape."""
    if isinstance(shapes, dict):
        if not isinstance(data, Mapping) or set(data) != set(shapes):
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                f"dataset {dataset_id!r}, episode {episode_id}: {what} hold {got}, but the dataset's {what} "
                f"space has the keys {sorted(shapes)}; the stored data does not match its space"
            )
        for key, shape in shapes.items():
            _check_leaves(dataset_id, episode_id, f"{what}[{key!r}]", data[key], shape, length)
        return
    array = np.asarray(data)
    if array.shape != (length, *shapes):
        raise ValueError(
            f"dataset {dataset_id!r}, episode {episode_id}: {what} have shape {array.shape}, expected "
            f"{(length, *shapes)} ({length} entries of the space's shape {shapes}). Minari episodes of T steps "
            "store T + 1 observations (the last is the final observation) and T actions, rewards, terminations "
            "and truncations; this dataset does not, or does not match its declared spaces"
        )


_EPISODE_FIELDS = ("observations", "actions", "rewards", "terminations", "truncations")


def read_episodes(dataset: Any, indices: Sequence[int]) -> Iterator[Any]:
    """Minari's episodes ``indices``, with a missing stored field reported by name."""
    episodes = dataset.iterate_episodes(indices)
    for index in indices:
        try:
            episode = next(episodes)
        except KeyError as error:  # h5py (or arrow): the episode's group lacks a field every Minari episode has
            missing = [name for name in _EPISODE_FIELDS if repr(name) in str(error) or f'"{name}"' in str(error)]
            what = f"the field {missing[0]!r}" if missing else f"a field ({error})"
            raise ValueError(
                f"dataset {dataset.id!r}, episode {index}: the stored episode lacks {what}; every Minari episode "
                f"needs {', '.join(_EPISODE_FIELDS)}. The dataset is incomplete or was not written by Minari: "
                "re-create it (e.g. with ptl_rl.MinariRecorder) or fetch it again"
            ) from None
        yield episode


def episode_rows(
    dataset_id: str, episode: Any, obs_shapes: Any, action_shapes: Any, cast_float64: bool
) -> dict[str, Any]:
    """The ``T`` transitions of one Minari episode as field arrays (see the module docstring)."""
    episode_id = int(episode.id)
    rewards = np.asarray(episode.rewards)
    length = len(rewards)
    for what in ("terminations", "truncations"):
        if np.asarray(getattr(episode, what)).shape != (length,):
            raise ValueError(
                f"dataset {dataset_id!r}, episode {episode_id}: {what} have shape "
                f"{np.asarray(getattr(episode, what)).shape}, expected ({length},) like rewards"
            )
    _check_leaves(dataset_id, episode_id, "observations", episode.observations, obs_shapes, length + 1)
    _check_leaves(dataset_id, episode_id, "actions", episode.actions, action_shapes, length)
    terminated = np.asarray(episode.terminations, dtype=bool)
    truncated = np.asarray(episode.truncations, dtype=bool)
    ended = terminated | truncated
    if length and ended[:-1].any():
        step = int(np.flatnonzero(ended[:-1])[0])
        raise ValueError(
            f"dataset {dataset_id!r}, episode {episode_id}: step {step} of {length} is terminated/truncated, "
            "but only an episode's last step may end it; the episode spans a reset, so its next_obs would be "
            "wrong. Re-record the data one episode per Minari episode"
        )
    if length and not ended[-1]:
        # an episode cut short when recording stopped: truncated, so that a learner bootstraps from its
        # final observation and an NStepTransform does not join it to the next episode (Minari's own
        # DataCollector marks such episodes the same way)
        truncated = truncated.copy()
        truncated[-1] = True

    def own(a: Any) -> np.ndarray:
        a = np.asarray(a)
        owned: np.ndarray = a.astype(np.float32) if cast_float64 and a.dtype == np.float64 else a
        return owned

    observations = tree_map(own, episode.observations)
    return {
        "obs": tree_map(lambda a: a[:-1], observations),
        "action": np.asarray(episode.actions),
        "reward": rewards.astype(np.float32),
        "next_obs": tree_map(lambda a: a[1:], observations),
        "terminated": terminated,
        "truncated": truncated,
        "episode_id": np.full(length, episode_id, dtype=np.int64),
    }

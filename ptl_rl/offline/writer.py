"""Writing a new Minari dataset: checking its id, creating it with the stored arrays' dtypes, storing the env spec.

The ``offline`` package's own functions, used by :class:`~ptl_rl.offline.recorder.MinariRecorder`;
Minari is imported only when they are called (:func:`~ptl_rl.offline.reader.import_minari`).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from gymnasium import spaces

from ptl_rl.core._trees import tree_map
from ptl_rl.offline.reader import import_minari


def check_new_dataset_id(dataset_id: str) -> None:
    """ValueError unless ``dataset_id`` is a Minari id, FileExistsError if a dataset of that id exists already."""
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        parse_dataset_id(dataset_id)
    except ValueError:
        raise ValueError(
            f"invalid Minari dataset id {dataset_id!r}; ids look like '(namespace/)name-v<version>', "
            "e.g. 'cartpole/expert-v0'"
        ) from None
    path = get_dataset_path(dataset_id)
    if path.exists():
        raise FileExistsError(
            f"a Minari dataset {dataset_id!r} already exists at {path}; pick another id or version, or "
            f"delete it first (minari.delete_dataset({dataset_id!r}))"
        )


def _space_as_stored(space: spaces.Space[Any], sample: Any) -> spaces.Space[Any]:
    """``space`` with the dtype of the arrays that are stored (an ExperienceSource casts float64 to float32)."""
    if isinstance(space, spaces.Dict):
        return spaces.Dict({k: _space_as_stored(s, sample[k]) for k, s in space.spaces.items()})
    dtype = np.asarray(sample).dtype
    if isinstance(space, spaces.Box) and dtype != space.dtype and dtype.kind == np.dtype(space.dtype).kind:
        return spaces.Box(space.low.astype(dtype), space.high.astype(dtype), space.shape, dtype)
    return space


def create_dataset(
    dataset_id: str,
    first: Any,
    observation_space: spaces.Space[Any],
    action_space: spaces.Space[Any],
    metadata: dict[str, Any],
) -> Any:
    """A new, empty ``minari.MinariDataset``; its observation space takes the dtype of the EpisodeBuffer ``first``'s."""
    observation_space = _space_as_stored(observation_space, tree_map(lambda a: a[0], first.observations))
    with warnings.catch_warnings():
        # Minari nudges towards author/email/permalink metadata; the user passes them via **metadata
        warnings.filterwarnings("ignore", message=r".*is set to None", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"env_spec is None", category=UserWarning)
        # env=None: Minari would otherwise gym.make the env from its spec just to read spaces we pass
        return import_minari().create_dataset_from_buffers(
            dataset_id,
            [],
            env=None,
            observation_space=observation_space,
            action_space=action_space,
            jpeg_encoding=False,  # lossless: the stored rows must equal the ones the source yielded
            **metadata,
        )


def _spec_of(env: Any) -> Any:
    sub_envs = getattr(env, "envs", None)
    if sub_envs:  # a sync vector env: its first sub-env has the single env's spec
        return getattr(sub_envs[0], "spec", None)
    return getattr(env, "spec", None)


def store_env_spec(dataset: Any, env: Any, dataset_id: str) -> Any:
    """``dataset`` with ``env``'s spec stored, so that ``MinariDataset.recover_environment()`` can make the env again.

    Returns the dataset reopened with the spec, or ``dataset`` itself when
    ``env`` is ``None``, has no spec, or its spec cannot be serialized (a UserWarning says so).
    """
    spec = _spec_of(env) if env is not None else None
    if spec is None:
        return dataset
    try:
        dataset.storage.update_metadata({"env_spec": spec.to_json()})
    except (TypeError, ValueError) as error:  # a wrapper or kwarg that gymnasium cannot serialize
        warnings.warn(
            f"the spec of env {spec.id!r} cannot be stored ({error}); dataset {dataset_id!r} is written "
            "without it, so MinariDataset.recover_environment() will not work for it",
            UserWarning,
            # this function, MinariRecorder._write, record() or close(), and their caller: the user's line
            stacklevel=4,
        )
        return dataset
    return import_minari().MinariDataset(dataset.storage.data_path)

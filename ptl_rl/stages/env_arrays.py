"""What the source does to an env's arrays: flags as bool arrays, float64 as float32, copies, rows set in a tree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ptl_rl.core._trees import tree_map


def bool_array(flags: Any) -> np.ndarray:
    """``flags`` as a bool array (gymnasium's vector envs already return one: no conversion on the hot path)."""
    if type(flags) is np.ndarray and flags.dtype == np.bool_:
        return flags
    return np.asarray(flags, dtype=bool)


def copy_tree(tree: Any) -> Any:
    """A copy of every array of ``tree`` (for an env that reuses its observation buffer)."""
    return tree_map(np.array, tree)


def float64_as_float32(tree: Any) -> Any:
    """Every float64 array of ``tree`` as float32 (the dtype networks use); other arrays unchanged."""
    return tree_map(lambda a: a.astype(np.float32) if a.dtype == np.float64 else a, tree)


def set_rows(tree: Any, rows: np.ndarray, values: list[Any]) -> None:
    """``tree[rows] = values`` for a (dict of) array(s); ``values`` holds one unbatched obs per row."""
    if isinstance(tree, Mapping):
        for k in tree:
            set_rows(tree[k], rows, [v[k] for v in values])
    else:
        tree[rows] = np.stack(values)

"""Operations on trees of arrays: an array, or a (nested) dict of arrays, as Dict observations are.

Every stage handles ``obs`` the same way whether it is one array or a dict of
them, through these few functions; one place, so a new leaf type is taught to
the whole package at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias, overload

import numpy as np
import torch

#: An array (numpy or torch) or a nested dict of them (a Dict observation). The leaves' type is left open
#: (numpy arrays, tensors, or user extras of any kind pass through the same functions), so it is ``Any``
#: under one name: a signature that says ``PyTree`` means "a leaf or a dict of leaves", not "unchecked".
PyTree: TypeAlias = Any


def tree_map(fn: Callable[..., Any], tree: PyTree, *others: PyTree) -> PyTree:
    """Apply ``fn`` leaf-wise to ``tree`` (an array or nested dict of arrays).

    ``others`` must have the same dict structure; their leaves are passed as
    extra arguments.
    """
    if isinstance(tree, Mapping):
        return {k: tree_map(fn, v, *(o[k] for o in others)) for k, v in tree.items()}
    return fn(tree, *others)


def tree_leaves(tree: PyTree, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``(dotted_path, leaf)`` pairs of a nested dict in insertion order."""
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from tree_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, tree


def tree_take(tree: PyTree, rows: np.ndarray) -> PyTree:
    """The rows ``rows`` (int [R]) of every leaf [N, ...] -> [R, ...] (``ndarray.take``: a copy, faster than ``[]``)."""
    if isinstance(tree, np.ndarray):  # the common case first: no dict check on the hot path
        return tree.take(rows, axis=0)
    return {k: tree_take(v, rows) for k, v in tree.items()}


def tree_assign(store: PyTree, index: Any, value: PyTree) -> None:
    """``store[index] = value`` leaf by leaf (``store`` and ``value`` of the same structure)."""
    if isinstance(store, dict):
        for key in store:
            tree_assign(store[key], index, value[key])
    else:
        store[index] = value


@overload
def to_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray: ...


@overload
def to_numpy(x: Mapping[str, Any]) -> dict[str, Any]: ...


@overload
def to_numpy(x: object) -> Any: ...


def to_numpy(x: Any) -> Any:
    """A tensor, array-like or dict of them as numpy, on the host; bfloat16/float16 tensors become float32.

    numpy has no bfloat16, and one rule for both half types keeps what an agent
    returns under any Lightning precision in one dtype.
    """
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        return x.detach().cpu().numpy()
    if isinstance(x, Mapping):
        return {k: to_numpy(v) for k, v in x.items()}
    return np.asarray(x)

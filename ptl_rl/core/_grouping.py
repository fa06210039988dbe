"""Rows grouped by a label (usually ``env_id``): each row's position within its group, vectorised."""

from __future__ import annotations

import numpy as np


def rank_within_group(group: np.ndarray) -> np.ndarray:
    """For int labels ``group`` [B], each row's position among the earlier rows with the same label (int64 [B]).

    ``rank_within_group([3, 1, 3, 3, 1]) -> [0, 0, 1, 2, 1]``: the rows of one
    env in a batch, counted in time order, with one stable sort.
    """
    group = np.asarray(group)
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    rank = np.empty(len(group), dtype=np.int64)
    rank[order] = np.arange(len(group)) - np.searchsorted(sorted_group, sorted_group, side="left")
    return rank

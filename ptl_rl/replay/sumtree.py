"""A vectorized sum-tree (with a max-tree alongside) over non-negative leaf values: numpy, with optional compiled loops.

Every operation takes a whole batch of leaves or search targets and loops only
over the tree levels (``log2(capacity)`` of them), never over the items.
"""

from __future__ import annotations

import numpy as np

from ptl_rl.core.settings import SETTINGS, load_kernel

# The compiled loops (``_sumtree_kernel.c``, built by setup.py when a C compiler is there; optional) give the same
# trees and draws bit for bit; ptl_rl.core.settings decides whether they are used (PTL_RL_PURE_PYTHON=1: the numpy
# path) and warns once when they are not built.


_sumtree_kernel = load_kernel("_sumtree_kernel") if SETTINGS.compiled else None

# During an update of U leaves, levels at most min(16 U, this) wide are recomputed whole
# (contiguous, strided adds): there one contiguous pass is cheaper than gathering parents.
_DENSE_WIDTH = 4096
# The tree is cut at the level of (at most) this many nodes: above it nothing is stored.
# Totals, maxima and the first step of every search use that level as a flat array
# (one cumsum + searchsorted), which replaces the upper levels' Python steps.
_TOP_WIDTH = 1024


class SumTree:
    """Sums and maxima of ``capacity`` leaf values, with batched update and prefix-sum search.

    Leaves are float64 and must be finite and ``>= 0`` (the caller validates). A leaf
    of 0 means "absent": it is never returned by :meth:`find` and does not count
    for :attr:`max`. Internally the leaves are padded to a power of two ``W``;
    node ``i`` has children ``2i`` and ``2i+1`` and the leaves are nodes
    ``W .. 2W-1``. Only the levels from the leaves up to the *top level*, the
    ``top`` nodes ``top .. 2top-1`` (``top = min(W, top_width)``, 1024 by default), are kept:
    above it the top level is used as a flat array.

    Invariants (checked by the tests): every kept inner node of the sum-tree equals
    the float sum of its two children, every one of the max-tree their maximum.
    Parents are recomputed from their children, never adjusted by deltas, so
    rounding errors do not accumulate over updates.
    """

    def __init__(self, capacity: int, top_width: int = _TOP_WIDTH) -> None:
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        if top_width < 1 or top_width & (top_width - 1):
            raise ValueError(f"top_width must be a power of two, got {top_width}")
        self.capacity = int(capacity)
        self.width = 1 << (self.capacity - 1).bit_length()  # leaves, padded to a power of two
        self.depth = self.width.bit_length() - 1  # levels below the root
        self.top = min(self.width, int(top_width))
        self.top_level = self.top.bit_length() - 1  # the top level's depth: its nodes are top .. 2top-1
        self.sums = np.zeros(2 * self.width, dtype=np.float64)
        self.maxes = np.zeros(2 * self.width, dtype=np.float64)
        self._compiled = _sumtree_kernel is not None
        self._sums_right = self.sums[1:]  # take(left) on these views reads the right siblings
        self._maxes_right = self.maxes[1:]

    @property
    def compiled(self) -> bool:
        """Whether this tree runs its descent and repair loops compiled (``_sumtree_kernel``), else in numpy.

        Both give bit-identical trees and draws; set ``False`` to force numpy for this tree. The loops
        are built at install time when a C compiler is there; ``PTL_RL_PURE_PYTHON=1`` disables them.
        """
        # also checks the module, so a tree unpickled where the loops are not built takes the numpy path
        return self._compiled and _sumtree_kernel is not None

    @compiled.setter
    def compiled(self, value: bool) -> None:
        if value and _sumtree_kernel is None:
            raise RuntimeError(
                "the compiled sum-tree loops are not available: reinstall ptl_rl where a C compiler is present "
                "(pip install -e . builds them), and unset PTL_RL_PURE_PYTHON"
            )
        self._compiled = bool(value)

    # ------------------------------------------------------------------ queries
    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self.sums[self.top : 2 * self.top].sum())

    @property
    def max(self) -> float:
        """Largest leaf (0.0 when every leaf is absent)."""
        return float(self.maxes[self.top : 2 * self.top].max())

    @property
    def leaves(self) -> np.ndarray:
        """Read-only view of the leaf values, float64 [capacity]."""
        view = self.sums[self.width : self.width + self.capacity]
        view.flags.writeable = False
        return view

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values at ``indices`` (int [B]) as float64 [B]."""
        return self.sums.take(np.asarray(indices, dtype=np.int64) + self.width)

    def range_max(self, start: int, stop: int) -> float:
        """Largest leaf in ``[start, stop)`` (0.0 for an empty range); a loop over levels."""
        lo, hi = max(int(start), 0) + self.width, min(int(stop), self.capacity) + self.width
        best = 0.0
        maxes = self.maxes
        for _ in range(self.depth - self.top_level):
            if lo >= hi:
                return float(best)
            if lo & 1:
                best = max(best, maxes[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = max(best, maxes[hi])
            lo >>= 1
            hi >>= 1
        if lo < hi:
            best = max(best, maxes[lo:hi].max())
        return float(best)

    def find(self, targets: np.ndarray) -> np.ndarray:
        """Leaves whose prefix-sum interval holds each target: int64 [B].

        For a target ``u`` in ``[0, total)`` the result is the ``i`` with
        ``sum(leaves[:i]) <= u < sum(leaves[:i+1])``; targets outside are
        clipped into that range. Drawing ``u`` uniformly thus picks leaf ``i``
        with probability ``leaves[i] / total``. An absent (zero) leaf is never
        returned. ``targets`` (float [B]) is not modified.
        """
        cum0 = self._prefix_sums()
        u = np.clip(np.asarray(targets, dtype=np.float64), 0.0, np.nextafter(cum0[-1], 0.0))
        return self._search(u, cum0)[0]

    def sample(self, uniform: np.ndarray, stratified: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Leaves drawn with probability ``leaf / total``: ``(leaves int64 [B], their values float64 [B])``.

        ``uniform`` (float64 [B] in ``[0, 1)``, consumed) becomes the targets
        ``uniform * total``, or with ``stratified`` ``(i + uniform[i]) * total / B``:
        one target in each of ``B`` equal segments of the total. Scaled by the
        same prefix sums the search uses, so no target falls past the end.
        """
        cum0 = self._prefix_sums()
        count = len(uniform)
        u = uniform
        if stratified:
            u += np.arange(count)
            u *= cum0[-1] / count
        else:
            u *= cum0[-1]
        np.minimum(u, np.nextafter(cum0[-1], 0.0), out=u)  # (B-1+0.99..)/B * total may round up to total
        return self._search(u, cum0)

    def _prefix_sums(self) -> np.ndarray:
        """``[0, cumsum(top level)]``: float64 [top + 1]. Raises when every leaf is 0."""
        cum0 = np.empty(self.top + 1, dtype=np.float64)
        cum0[0] = 0.0
        np.cumsum(self.sums[self.top : 2 * self.top], out=cum0[1:])
        if not cum0[-1] > 0.0:
            raise ValueError("cannot search an empty tree: every leaf is 0")
        return cum0

    def _search(self, u: np.ndarray, cum0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Leaves and their values for targets ``u`` in ``[0, total)`` (float64 [B])."""
        # top level: binary search in its prefix sums; the rest of u is searched for inside the found node
        start = np.searchsorted(cum0[1:], u, side="right")
        rest = u - cum0[start]
        start += self.top
        node = self._descend(start, rest)
        values = self.sums[node]
        # Rounding can, rarely, steer the fast descent into an absent leaf at the edge
        # of a zero-sum subtree: redo those few targets with the careful descent.
        if not values.min() > 0.0:
            bad = values <= 0.0
            node[bad] = self._descend_careful(start[bad], u[bad] - cum0[start[bad] - self.top])
            values[bad] = self.sums[node[bad]]
        return node - self.width, values

    def _descend(self, node: np.ndarray, u: np.ndarray) -> np.ndarray:
        """From top-level nodes (int64 [B]) to the leaves holding the rests ``u`` (float64 [B]); new arrays."""
        sums = self.sums
        if self.compiled and _sumtree_kernel is not None:  # the second test narrows the type for mypy
            node = np.array(node, dtype=np.int64)
            _sumtree_kernel.descend(sums, node, np.array(u, dtype=np.float64), self.depth - self.top_level)
            return node
        for _ in range(self.depth - self.top_level):
            node = node + node  # left child
            left = sums[node]
            go_right = u >= left
            u = u - left * go_right  # (fewer numpy calls than np.where or subtract(where=))
            node = node + go_right
        return node

    def _descend_careful(self, node: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Descent from top-level ``node`` that never enters a zero-sum subtree (ends at a positive leaf)."""
        sums = self.sums
        for _ in range(self.depth - self.top_level):
            node = node << 1
            left = sums.take(node)
            go_right = (u >= left) & (sums.take(node + 1) > 0.0)
            go_right |= left <= 0.0
            u = np.where(go_right, u - left, u)
            node += go_right
        return node

    # ------------------------------------------------------------------ updates
    def update(self, indices: np.ndarray, values: np.ndarray | float) -> None:
        """Set ``leaves[indices] = values`` and repair both trees, one step per level.

        ``indices`` int [U] in ``[0, capacity)``; ``values`` float [U] or a scalar,
        finite and ``>= 0``. With repeated indices one of their values is kept
        (numpy's fancy assignment: the last one).
        """
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size == 0:
            return
        node = indices + self.width
        self.sums[node] = values
        self.maxes[node] = values
        if self.compiled and _sumtree_kernel is not None:
            if self.width > self.top:  # else the leaves are the top level: no parent to repair
                _sumtree_kernel.repair(self.sums, self.maxes, node, self.top)
            return
        dense_width = min(_DENSE_WIDTH, 16 * indices.size)
        sums, sums_right, maxes, maxes_right = self.sums, self._sums_right, self.maxes, self._maxes_right
        width = self.width
        while width > self.top:
            width >>= 1
            if width <= dense_width:
                self._rebuild_levels(width)
                return
            node = node >> 1
            left = node + node
            total = sums[left]
            total += sums_right[left]
            sums[node] = total
            largest = maxes[left]
            np.maximum(largest, maxes_right[left], out=largest)
            maxes[node] = largest

    def _rebuild_levels(self, width: int) -> None:
        """Recompute every kept inner node of the levels with ``width`` nodes and up to the top level."""
        sums, maxes = self.sums, self.maxes
        while width >= self.top:
            np.add(sums[2 * width : 4 * width : 2], sums[2 * width + 1 : 4 * width : 2], out=sums[width : 2 * width])
            np.maximum(
                maxes[2 * width : 4 * width : 2], maxes[2 * width + 1 : 4 * width : 2], out=maxes[width : 2 * width]
            )
            width >>= 1

    def set_all(self, values: np.ndarray) -> None:
        """Replace every leaf: ``values`` float [<= capacity] fills leaves ``0..len-1``, the rest become 0."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 1 or len(values) > self.capacity:
            raise ValueError(f"expected at most {self.capacity} leaf values in a 1-D array, got shape {values.shape}")
        self.sums[:] = 0.0
        self.maxes[:] = 0.0
        self.sums[self.width : self.width + len(values)] = values
        self.maxes[self.width : self.width + len(values)] = values
        if self.width > self.top:
            self._rebuild_levels(self.width >> 1)

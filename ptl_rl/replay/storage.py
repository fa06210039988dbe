"""Preallocated ring storage of transitions: one numpy array per field (leaf)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ptl_rl.core._trees import PyTree, tree_leaves, tree_map, tree_take
from ptl_rl.core.batch import TransitionBatch
from ptl_rl.core.versions import check_version, versioned

# The field contract's dtypes (docs/contract.rst). A buffer stores these fields in these dtypes whatever the first
# batch brought (SyncVectorEnv's float64 rewards, a recorded dataset's int terminals), and casts later batches to them.
CONTRACT_DTYPES = {
    "reward": np.dtype(np.float32),
    "discount": np.dtype(np.float32),
    "terminated": np.dtype(np.bool_),
    "truncated": np.dtype(np.bool_),
    "env_id": np.dtype(np.int64),
}


# Distinct batch layouts (row counts) remembered as checked; beyond that they are checked on every add.
_MAX_CHECKED_LAYOUTS = 256


class ArrayStorage:
    """A ring of ``capacity`` transitions, one preallocated array ``[capacity, *shape]`` per field.

    The arrays are allocated from the first batch added (its fields, trailing
    shapes and dtypes), except that ``reward``/``discount`` are float32,
    ``terminated``/``truncated`` bool and ``env_id`` int64 (the field
    contract), whatever the first batch held; later batches may hold those
    fields in any dtype that casts to them safely (float64 rewards, int flags).
    Every other field must match exactly, otherwise :meth:`add` raises before
    writing anything, so no stored data is lost.
    Slots are written in order and the oldest are overwritten when full.
    """

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self.fields: dict[str, PyTree] | None = None  # field -> ring array [capacity, ...] (or a dict of them)
        # (field, keys into a dict field, dtype, trailing shape) per stored array
        self._spec: list[tuple[str, tuple[str, ...], np.dtype, tuple[int, ...]]] = []
        self._flat = False  # every field one array (no dict observations): the layout cache applies
        self._checked_layouts: set[tuple[Any, ...]] = set()  # batch layouts that passed _validate
        self._last_layout: tuple[Any, ...] | None = None
        self._slot_numbers = np.zeros(0, dtype=np.int64)  # 0 .. capacity - 1, read-only (set by _allocate)
        self.cursor = 0  # next slot to write
        self.size = 0
        self.total_added = 0

    def __len__(self) -> int:
        return self.size

    # ------------------------------------------------------------------ writing
    def add(self, batch: TransitionBatch) -> np.ndarray:
        """Copy the ``B`` rows of ``batch`` into the ring; returns the slots written (int64 [B'], read-only).

        Raises ``ValueError`` before writing anything if a field's trailing shape or dtype differs
        from what the ring stores (see the class docstring): a refused batch changes nothing.
        """
        self.check(batch)
        return self.write_checked(batch)

    def check(self, batch: TransitionBatch) -> None:
        """Raise ``ValueError`` if :meth:`add` would refuse ``batch``; changes nothing the ring holds.

        The first batch allocates the ring from its own fields; if that batch is refused, the
        allocation is undone, so a refused first batch does not fix the stored layout either.
        """
        if self.fields is not None:
            self._check(batch)
            return
        self._allocate(batch)
        try:
            self._check(batch)
        except (TypeError, ValueError):
            self.fields = None  # (the next batch allocates again, from its own fields)
            raise

    def write_checked(self, batch: TransitionBatch) -> np.ndarray:
        """:meth:`add` without the check: only for a ``batch`` that passed :meth:`check` (int64 [B'], read-only)."""
        count = len(batch)
        if count == 0:
            return np.zeros(0, dtype=np.int64)
        skip = max(0, count - self.capacity)  # only the newest `capacity` rows can survive
        count -= skip
        start = self.cursor
        end = start + count
        fields = self.fields
        assert fields is not None  # check() allocated the ring
        if end <= self.capacity and not skip:
            if self._flat:
                for name, value in batch.items():
                    fields[name][start:end] = value
            else:
                for name, value in batch.items():
                    _write(fields[name], value, start, count, 0, count)
        else:
            first = min(count, self.capacity - start)
            for name, value in batch.items():
                _write(fields[name], value, start, first, skip, count)
        self.cursor = end % self.capacity
        self.size = min(self.size + count, self.capacity)
        self.total_added += count + skip
        if end <= self.capacity:
            return self._slot_numbers[start:end]
        return np.arange(start, end) % self.capacity

    def _check(self, batch: TransitionBatch) -> None:
        """Raise before any write if ``batch`` does not fit the ring: the full check once per batch layout.

        Every batch of one producer has the same fields, dtypes and trailing shapes, so the
        layouts already checked (``(name, dtype, shape)`` per field, shape including the row
        count) are remembered and a batch with one of them skips the field-by-field walk. Any
        other batch (a new row count, a changed dtype or shape, a dict field) gets the full
        :meth:`_validate`, which names the problem and the fix.
        """
        if self._flat:
            try:
                layout = tuple([(name, value.dtype, value.shape) for name, value in batch.items()])
            except AttributeError:  # a list, or a dict where an array is stored: the full check explains
                layout = None
            # the same layout as the last batch (elementwise ==, no hashing), or one checked before
            if layout == self._last_layout or layout in self._checked_layouts:
                self._last_layout = layout
                return
            self._validate(batch)
            if layout is not None and len(self._checked_layouts) < _MAX_CHECKED_LAYOUTS:
                self._checked_layouts.add(layout)
                self._last_layout = layout
        else:
            self._validate(batch)

    def _new_fields(self, batch: TransitionBatch) -> dict[str, PyTree]:
        """The ring arrays ``[capacity, *shape]`` for the fields of ``batch`` (contract dtypes), in RAM."""

        def ring(name: str, leaf: np.ndarray) -> np.ndarray:
            return np.zeros((self.capacity, *leaf.shape[1:]), dtype=CONTRACT_DTYPES.get(name, leaf.dtype))

        return {name: tree_map(lambda a, name=name: ring(name, a), value) for name, value in batch.items()}

    def _allocate(self, batch: TransitionBatch) -> dict[str, PyTree]:
        """Allocate the ring from the fields of ``batch`` (see :meth:`_new_fields`); returns the new ``fields``."""
        fields = self._new_fields(batch)
        # (field, keys into a dict field, dtype, trailing shape) per stored array
        spec = [
            (name, tuple(path.split("."))[1:] if path != name else (), leaf.dtype, leaf.shape[1:])
            for name, value in fields.items()
            for path, leaf in tree_leaves(value, name)
        ]
        # the slots of a write that does not wrap, as a read-only view: no arange per add
        slot_numbers = np.arange(self.capacity, dtype=np.int64)
        slot_numbers.flags.writeable = False
        self.fields, self._spec, self._slot_numbers = fields, spec, slot_numbers
        self._flat = all(isinstance(v, np.ndarray) for v in fields.values())
        self._checked_layouts, self._last_layout = set(), None
        return fields

    # ------------------------------------------------------------------ the guard
    def snapshot(self) -> tuple[Any, ...]:
        """What an add changes besides whole rows: the counters, and the allocation of the first add.

        A buffer takes it before each add (:class:`~ptl_rl.core.guard.WriteJournal`): an add cut
        short, even inside the first add's allocation, is undone to it and written again.
        """
        return (self.cursor, self.size, self.total_added, self.fields, self._spec, self._flat, self._slot_numbers)

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Put back a :meth:`snapshot` (before the same rows are written again)."""
        self.cursor, self.size, self.total_added, fields, self._spec, self._flat, self._slot_numbers = snapshot
        if fields is not self.fields:  # the allocation is undone: its layout cache goes with it
            self._checked_layouts, self._last_layout = set(), None
        self.fields = fields

    def _validate(self, batch: TransitionBatch) -> None:
        fields = self.fields
        assert fields is not None  # validated against the allocated ring
        if batch.keys() != fields.keys():
            missing = sorted(set(fields) - set(batch.keys()))
            extra = sorted(set(batch.keys()) - set(fields))
            raise ValueError(
                f"batch fields differ from the stored ones: missing {missing}, unexpected {extra}. "
                "Every batch added to one buffer must carry the same fields (and agent extras)."
            )
        for name, store in fields.items():
            if isinstance(store, dict):
                _check_same_keys(name, store, batch[name])
        size = len(batch)
        for name, keys, dtype, shape in self._spec:
            leaf = batch[name]
            try:
                for key in keys:
                    leaf = leaf[key]
                if (
                    leaf.shape[1:] == shape
                    and leaf.shape[0] == size
                    and (leaf.dtype == dtype or (name in CONTRACT_DTYPES and _casts_to_contract(leaf.dtype, dtype)))
                ):
                    continue
            except (KeyError, IndexError, TypeError, AttributeError):
                leaf = np.asarray(leaf, dtype=object)
            path = ".".join((name, *keys))
            if np.ndim(leaf) and len(leaf) != size:
                raise ValueError(
                    f"field {path!r} has {len(leaf)} rows but the batch has {size} (its first field's rows): "
                    "every field of a batch holds one row per transition"
                )
            raise ValueError(
                f"field {path!r} has rows of shape {tuple(leaf.shape[1:])} and dtype {leaf.dtype}; the buffer stores "
                f"rows of shape {shape} and dtype {dtype} (allocated from the first batch). "
                f"Cast it with .astype({dtype}) or reshape it before adding."
            )

    # ------------------------------------------------------------------ reading
    def gather(self, indices: np.ndarray) -> TransitionBatch:
        """The transitions at ``indices`` (int [B]) as a new batch (a copy)."""
        # ndarray.take is several times faster than fancy indexing for rows of 2-D arrays
        if self.fields is None:
            raise ValueError("the storage holds no transitions yet: add a batch before gathering rows")
        return TransitionBatch.wrap({name: tree_take(v, indices) for name, v in self.fields.items()})

    # ------------------------------------------------------------------ state
    STATE_VERSION = 1

    def state_dict(self) -> dict[str, Any]:
        """Stored rows as tensors in slot order, plus the cursor (``weights_only``-safe).

        The tensors are views of the ring's arrays, not copies: saving a large
        replay does not double its memory. Write the state out (``torch.save``)
        before the buffer changes again.
        """
        if self.fields is None:
            return versioned({"capacity": self.capacity, "fields": None}, self.STATE_VERSION)
        state = {
            "capacity": self.capacity,
            "fields": {
                name: tree_map(lambda a: torch.from_numpy(a[: self.size]), v) for name, v in self.fields.items()
            },
            "cursor": self.cursor,
            "size": self.size,
            "total_added": self.total_added,
        }
        return versioned(state, self.STATE_VERSION)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, self.STATE_VERSION, type(self).__name__)
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"state holds a buffer of capacity {state['capacity']}, this buffer has capacity {self.capacity}; "
                "create the buffer with the checkpoint's capacity"
            )
        if state["fields"] is None:
            self.fields, self.cursor, self.size, self.total_added = None, 0, 0, 0
            return
        rows = TransitionBatch({name: tree_map(lambda t: t.numpy(), v) for name, v in state["fields"].items()})
        self.fields = None
        fields = self._allocate(rows)
        self.size = int(state["size"])
        for name, value in rows.items():
            _write(fields[name], value, 0, self.size, 0, self.size)
        self.cursor = int(state["cursor"])
        self.total_added = int(state["total_added"])


def _check_same_keys(path: str, stored: dict[str, Any], given: Any) -> None:
    """Raise unless the dict field ``given`` has the stored keys at every level (an extra key would be dropped)."""
    if not isinstance(given, dict):
        raise ValueError(
            f"field {path!r} is a {type(given).__name__}; the buffer stores a dict with keys {sorted(stored)} "
            "(allocated from the first batch). Every batch must carry the same observation structure."
        )
    if given.keys() != stored.keys():
        missing, extra = sorted(set(stored) - set(given)), sorted(set(given) - set(stored))
        raise ValueError(
            f"dict field {path!r} has keys {sorted(given)}; the buffer stores {sorted(stored)} (missing {missing}, "
            f"unexpected {extra}). Every batch must carry the same observation keys; make the env's observation "
            "space fixed, or store the extra key in another buffer."
        )
    for key, value in stored.items():
        if isinstance(value, dict):
            _check_same_keys(f"{path}.{key}", value, given[key])


def _casts_to_contract(given: np.dtype, stored: np.dtype) -> bool:
    """Whether a contract field's values in ``given`` dtype may be stored as ``stored`` (float64 -> float32, ...)."""
    if stored == np.bool_:
        return given.kind in "biu"  # 0/1 flags from recorded data
    return np.can_cast(given, stored, casting="same_kind")


def _write(store: Any, value: Any, start: int, first: int, skip: int, count: int) -> None:
    """Write ``value[skip:skip+count]`` at ring slots ``start..``, wrapping after ``first`` rows."""
    if isinstance(store, dict):
        for k in store:
            _write(store[k], value[k], start, first, skip, count)
        return
    store[start : start + first] = value[skip : skip + first]
    if first < count:
        store[: count - first] = value[skip + first : skip + count]

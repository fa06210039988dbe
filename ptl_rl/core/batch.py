"""The struct-of-arrays batch that flows between stages, and its torch twin.

A batch maps field names to arrays that share a leading dimension ``B`` (one
row per transition). A field is either an array or, for ``gymnasium.spaces.Dict``
observations, a (possibly nested) dict of arrays. Agent extras (``log_prob``,
``value``, a hidden state, ...) are ordinary fields next to the core ones.

Core fields (the field contract, ``docs/contract.rst``): ``obs``, ``action``,
``reward`` (float32, [B]), ``next_obs``, ``terminated`` and ``truncated``
(bool, [B]), ``discount`` (float32, [B]), ``env_id`` (int64, [B]).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Any, Protocol, TypeAlias, TypeVar

import numpy as np
import torch

from ptl_rl.core._trees import tree_leaves, tree_map
from ptl_rl.core.clock import SETTINGS, StageClock, perf_counter_ns

CORE_FIELDS = (
    "obs",
    "action",
    "reward",
    "next_obs",
    "terminated",
    "truncated",
    "discount",
    "env_id",
)


# A Lightning precision plugin ("bf16-true", "64-true") rebuilds a batch from its fields, which drops the batch's
# own link to its priority feedback; integer tensors such as ``indices`` pass through that rebuild as the same
# objects, so the link rides on the ``indices`` tensor too, as an attribute, and leaves with it.
_FEEDBACK_ATTRIBUTE = "_ptl_rl_priority_feedback"

#: A field of a batch: an array (numpy in a :class:`TransitionBatch`, torch in a :class:`TorchBatch`) or, for
#: ``Dict`` observations, a (nested) dict of them. (A string: the alias refers to itself.)
FieldTree: TypeAlias = "np.ndarray | torch.Tensor | Mapping[str, FieldTree]"

#: A 1-D array of numbers as a caller holds it (TD errors, priorities, slots): numpy, a torch tensor on any
#: device, or a list.
Numbers: TypeAlias = np.ndarray | torch.Tensor | Sequence[float]


class PriorityLink(Protocol):
    """The link a batch sampled by priority carries back to its buffer (a :class:`~ptl_rl.replay.PriorityFeedback`).

    ``link(td_errors)`` writes ``|td_errors|`` (float [B]) as the rows' priorities and returns the number of
    stale rows ignored; ``link.select(index)`` is the link of the rows ``index`` (slice, bool mask or indices).
    """

    def __call__(self, td_errors: torch.Tensor | np.ndarray, /) -> int: ...

    def select(self, index: np.ndarray | torch.Tensor | slice, /) -> PriorityLink: ...


def _link_feedback(indices: torch.Tensor, feedback: PriorityLink) -> None:
    setattr(indices, _FEEDBACK_ATTRIBUTE, feedback)


def _linked_feedback(indices: torch.Tensor) -> PriorityLink | None:
    link: PriorityLink | None = getattr(indices, _FEEDBACK_ATTRIBUTE, None)
    return link


class _FieldBatch:
    """Shared behaviour of the numpy and torch batches: attribute access to fields.

    A batch is a read-write mapping from field names to arrays, so Lightning
    treats it as the collections it knows: ``iter(batch)``, ``keys()``,
    ``values()`` and ``items()`` go over the fields, and Lightning infers the
    batch size, moves the batch to a device and converts it under a
    ``precision`` plugin. Unlike a dict, ``len(batch)`` is the number of
    transitions (rows), not the number of fields.
    """

    __slots__ = ("_feedback", "_fields")
    _fields: dict[str, Any]  # (declared for the checker: slots, set with object.__setattr__)
    _feedback: PriorityLink | None

    def __init__(self, fields: Mapping[str, FieldTree] | None = None, **kwargs: FieldTree) -> None:
        merged = dict(fields or {})
        merged.update(kwargs)
        object.__setattr__(self, "_fields", merged)
        object.__setattr__(self, "_feedback", None)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r}; fields are {sorted(self._fields)}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._fields[name] = value

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._fields[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def keys(self) -> KeysView[str]:
        return self._fields.keys()

    def values(self) -> ValuesView[Any]:
        return self._fields.values()

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._fields.items()

    def get(self, key: str, default: object = None) -> Any:
        return self._fields.get(key, default)

    def __len__(self) -> int:
        """Number of transitions (rows) in the batch."""
        for value in self._fields.values():
            while isinstance(value, dict):
                value = next(iter(value.values()))
            rows: int = value.shape[0]
            return rows
        return 0

    @property
    def extras(self) -> dict[str, Any]:
        """The fields that are not core fields (agent extras, ``indices``, ...)."""
        return {k: v for k, v in self._fields.items() if k not in CORE_FIELDS}

    def __repr__(self) -> str:
        lines = [
            f"  {path}: {tuple(leaf.shape)} {leaf.dtype}"
            for name, value in self._fields.items()
            for path, leaf in tree_leaves(value, name)
        ]
        return f"{type(self).__name__}(size={len(self)},\n" + "\n".join(lines) + "\n)"

    def __getstate__(self) -> dict[str, Any]:
        return self._fields

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "_fields", state)
        object.__setattr__(self, "_feedback", None)  # the buffer link does not travel through pickling

    # ------------------------------------------------------------------ priority feedback
    def attach_priority_feedback(self, feedback: PriorityLink) -> None:
        """Link this batch to the prioritized buffer that sampled it (called by the buffer).

        ``feedback`` is callable as ``feedback(td_errors) -> int`` and has
        ``select(index)`` for a subset of rows; ``rows``, ``to_torch`` and ``to``
        pass it on, so it survives Lightning's move of the batch to a device.
        """
        object.__setattr__(self, "_feedback", feedback)

    def _pass_feedback(self, new: BatchT, index: np.ndarray | torch.Tensor | slice | None = None) -> BatchT:
        own = self._own_feedback()
        if own is not None:
            feedback = own if index is None else own.select(index)
            object.__setattr__(new, "_feedback", feedback)
            indices = new._fields.get("indices")
            if isinstance(indices, torch.Tensor):
                _link_feedback(indices, feedback)
        return new

    def _own_feedback(self) -> PriorityLink | None:
        own: PriorityLink | None = self._feedback
        if own is not None:
            return own
        indices = self._fields.get("indices")
        return _linked_feedback(indices) if isinstance(indices, torch.Tensor) else None

    def update_priorities(self, td_errors: torch.Tensor | np.ndarray) -> int:
        """Feed the TD errors of this batch back as priorities ``|td_errors|``: one call from ``training_step``.

        ``td_errors``: float [B] (or [B, 1]), one per row in the batch's order; a
        torch tensor on any device (detached here) or a numpy array. Rows whose
        slot was overwritten since sampling are ignored; returns their number.
        Only batches sampled from a prioritized buffer have this link.
        """
        feedback = self._own_feedback()
        if feedback is None:
            raise TypeError(
                "this batch was not sampled from a prioritized buffer, so it has no priorities to update; "
                "sample it from a buffer that draws by priority: ReplayBuffer(..., draws=PrioritizedDraws(...)), "
                "a PrioritizedReplayBuffer, or SequenceReplayBuffer(prioritized=True)"
            )
        return feedback(td_errors)


def _from_numpy(tree: Any) -> Any:
    """Zero-copy tensors from numpy arrays (a read-only array is copied: torch needs writable memory)."""
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(tree if tree.flags.writeable else tree.copy())
    if isinstance(tree, Mapping):
        return {k: _from_numpy(v) for k, v in tree.items()}
    return torch.as_tensor(tree)


BatchT = TypeVar("BatchT", bound=_FieldBatch)


class TransitionBatch(_FieldBatch):
    """A struct-of-arrays batch of ``B`` transitions held in numpy arrays.

    Index it with a string for a field (``batch["obs"]``), read fields as
    attributes (``batch.reward``), and select rows with :meth:`rows`.

    Examples:
        >>> import numpy as np
        >>> from ptl_rl import TransitionBatch
        >>> batch = TransitionBatch({
        ...     "obs": np.zeros((3, 2), dtype=np.float32),
        ...     "reward": np.array([1.0, 0.0, 2.0], dtype=np.float32),
        ... })
        >>> len(batch), batch.obs.shape, batch["reward"]  # len counts rows, not fields
        (3, (3, 2), array([1., 0., 2.], dtype=float32))
        >>> batch.rows(batch.reward > 0).reward
        array([1., 2.], dtype=float32)
        >>> len(TransitionBatch.concat([batch, batch])), sorted(batch.keys())
        (6, ['obs', 'reward'])
        >>> batch.to_torch().reward  # zero copy: the tensors share the arrays' memory
        tensor([1., 0., 2.])
    """

    __slots__ = ()

    @classmethod
    def wrap(cls, fields: dict[str, Any]) -> TransitionBatch:
        """A batch over ``fields`` itself (not a copy of the dict): for a stage that built the dict just for it."""
        batch = object.__new__(cls)
        object.__setattr__(batch, "_fields", fields)
        object.__setattr__(batch, "_feedback", None)
        return batch

    def rows(self, index: np.ndarray | slice) -> TransitionBatch:
        """A new batch with the rows ``index`` (bool mask, int indices or a slice)."""
        if type(index) is np.ndarray and index.dtype.kind in "iu":
            # int indices (every per-step caller): ndarray.take, a third of the cost of [] on small arrays
            fields = {
                k: v.take(index, axis=0) if type(v) is np.ndarray else tree_map(lambda a: a[index], v)
                for k, v in self._fields.items()
            }
        else:
            fields = {k: tree_map(lambda a: a[index], v) for k, v in self._fields.items()}
        return self._pass_feedback(TransitionBatch.wrap(fields), index)

    def to_torch(self, device: torch.device | str | None = None, pin_memory: bool = False) -> TorchBatch:
        """Convert to a :class:`TorchBatch`.

        Without ``device`` and ``pin_memory`` the tensors share memory with the
        numpy arrays (zero copy). With ``pin_memory`` they are copied into
        page-locked memory first, so that a later ``.to("cuda", non_blocking=True)``
        overlaps with compute.
        """

        if device is None and not pin_memory:
            return self._pass_feedback(TorchBatch({k: _from_numpy(v) for k, v in self._fields.items()}))

        def convert(a: np.ndarray) -> torch.Tensor:
            t: torch.Tensor = _from_numpy(a)
            if pin_memory:
                t = t.pin_memory()
            return t if device is None else t.to(device, non_blocking=pin_memory)

        return self._pass_feedback(TorchBatch({k: tree_map(convert, v) for k, v in self._fields.items()}))

    @staticmethod
    def concat(batches: Iterable[TransitionBatch]) -> TransitionBatch:
        """Concatenate batches with the same fields along the leading dimension."""
        batches = list(batches)
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        return TransitionBatch(
            {
                k: tree_map(lambda *leaves: np.concatenate(leaves), first[k], *(b[k] for b in batches[1:]))
                for k in first.keys()
            }
        )


class TorchBatch(_FieldBatch):
    """The torch twin of :class:`TransitionBatch`: the object ``training_step`` receives.

    Fields are tensors with the same names and shapes as the numpy batch
    (``batch.obs``, ``batch.reward``, ...). It has a ``to(device)`` method, so
    Lightning moves it to the module's device by itself.
    """

    __slots__ = ("_transfer_clock",)

    def __init__(self, fields: Mapping[str, FieldTree] | None = None, **kwargs: FieldTree) -> None:
        super().__init__(fields, **kwargs)
        object.__setattr__(self, "_transfer_clock", None)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        object.__setattr__(self, "_transfer_clock", None)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TorchBatch:
        """The batch with every tensor on ``device``: ``self`` when they all are already (Lightning's CPU case)."""
        device = torch.device(device)
        if all(leaf.device == device for _, value in self._fields.items() for _, leaf in tree_leaves(value)):
            return self
        start = perf_counter_ns()
        moved = TorchBatch(
            {k: tree_map(lambda t: t.to(device, non_blocking=non_blocking), v) for k, v in self._fields.items()}
        )
        clock = self._transfer_clock
        if clock is not None and SETTINGS.profiling:  # the copy is queued (non_blocking) or done: the host's part
            clock.add(perf_counter_ns() - start, len(moved))
        return self._pass_feedback(moved)

    def time_transfers(self, clock: StageClock) -> TorchBatch:
        """Add the time of this batch's moves to another device (``to``) to ``clock``; returns the batch."""
        object.__setattr__(self, "_transfer_clock", clock)
        return self

    def rows(self, index: torch.Tensor | slice) -> TorchBatch:
        """A new batch with the rows ``index``."""
        return self._pass_feedback(
            TorchBatch({k: tree_map(lambda t: t[index], v) for k, v in self._fields.items()}), index
        )

    def as_tuple(self, fields: Iterable[str]) -> tuple[Any, ...]:
        """The tensors of ``fields`` in that order, e.g. ``batch.as_tuple(BOLTS_FIELDS)``."""
        return tuple(self._fields[name] for name in fields)


# What older Lightning RL modules (Lightning Bolts' DQN and its copies) unpack in ``training_step``:
# ``states, actions, rewards, dones, next_states = batch``, with ``dones`` = ``terminated``. Such a module
# bootstraps with a fixed ``gamma``; that is exact only for 1-step data (``discount == gamma``). For n-step data
# it must use the ``discount`` field instead (see ``to_dataloader(..., as_tuple=...)``).
BOLTS_FIELDS = ("obs", "action", "reward", "terminated", "next_obs")

# A batch is a mapping of fields (see _FieldBatch); registered rather than inherited so that ``len`` keeps
# counting rows, which every stage relies on.
Mapping.register(TransitionBatch)
Mapping.register(TorchBatch)

"""Lightning's warnings that a pipeline loader triggers by design, ignored only while a Trainer runs it.

The adapter's loader has a length (``steps_per_epoch``) over an
``IterableDataset`` and no worker processes: collection parallelism lives in
vector envs and remote collectors, so that the agent always acts with the
learner's weights. Lightning warns about both at ``fit``. ptl_rl's callbacks
and :class:`~ptl_rl.RLDataModule` ignore those two warnings from their
``setup`` to their ``teardown`` (the Trainer's run) and no longer: the
program's own warning filters are never changed outside that call.
"""

from __future__ import annotations

import warnings
from typing import Any

#: Lightning's messages about what the adapter does on purpose
MESSAGES = (
    r"Your `IterableDataset` has `__len__` defined",
    r"The 'train_dataloader' does not have many workers",
)


class ExpectedWarnings:
    """Ignores :data:`MESSAGES` between :meth:`enter` and :meth:`exit`; removes exactly the filters it added."""

    def __init__(self) -> None:
        self._added: list[Any] = []

    def enter(self) -> None:
        if self._added:
            return
        for message in MESSAGES:
            warnings.filterwarnings("ignore", message=message)
            self._added.append(warnings.filters[0])

    def exit(self) -> None:
        filters: list[Any] = warnings.filters  # type: ignore[assignment]  # (a list at run time)
        for entry in self._added:
            if entry in filters:
                filters.remove(entry)
        self._added = []
        warnings._filters_mutated()  # type: ignore[attr-defined]  # (the cache of already-shown warnings)

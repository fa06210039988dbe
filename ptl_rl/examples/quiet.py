"""Hide the lines Lightning prints that a user of the examples and notebooks cannot act on.

Lightning prints, at every ``Trainer``: "GPU available: False, used: False" and
"TPU available: False, using: 0 TPU cores" (on a machine without either there
is nothing to do about them), a tip advertising its cloud logger
("litlogger"), and, at ``fit``, a ``FutureWarning`` that torch raises about
Lightning's own use of ``LeafSpec`` (Lightning's code, not yours). Everything
else stays: "GPU available: True, used: False" (you can pass
``--accelerator gpu``), "GPU available but not used", ``max_steps`` reached,
your own warnings and Lightning's other warnings.

The library never calls this (a library must not change a program's warning
filters or logging); the examples use :func:`quiet_lightning` around their
``Trainer``, and the notebooks call :func:`hide_lightning_noise` once, as a
program may. Standard library only.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: the loggers Lightning's ``rank_zero_info`` writes through (whichever of the two packages is imported)
RANK_ZERO_LOGGERS = (
    "pytorch_lightning.utilities.rank_zero",
    "lightning.pytorch.utilities.rank_zero",
    "lightning_fabric.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
)
#: Lightning's lines that need no action: no GPU or TPU to use, and the logger advertisement
NOISE = re.compile(r"^(GPU available: False|TPU available: False|.*try installing \[litlogger\])")
#: torch's deprecation warning raised from Lightning's own ``utilities/_pytree.py``
LEAFSPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not NOISE.match(record.getMessage())


def hide_lightning_noise() -> Callable[[], None]:
    """Hide Lightning's no-GPU/no-TPU lines, the litlogger tip and the ``LeafSpec`` FutureWarning from now on.

    Returns a function that undoes it (removes the logging filters; the
    warning filter stays, see :func:`quiet_lightning` for a scoped version).
    """
    warnings.filterwarnings("ignore", message=LEAFSPEC_WARNING, category=FutureWarning)
    drop = _DropNoise()
    loggers = [logging.getLogger(name) for name in RANK_ZERO_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)

    def undo() -> None:
        for logger in loggers:
            logger.removeFilter(drop)

    return undo


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """:func:`hide_lightning_noise` inside the ``with`` block only (warning filters and logging restored after)."""
    with warnings.catch_warnings():
        undo = hide_lightning_noise()
        try:
            yield
        finally:
            undo()

"""One set of Lightning classes for both Lightning packages.

Lightning ships twice: ``pytorch_lightning`` (a core dependency of ptl_rl) and
the unified ``lightning`` package (``import lightning as L``, classes under
``lightning.pytorch``). A Trainer accepts only callbacks and DataModules of its
own package, and its class checks are plain ``isinstance``. So ptl_rl's
callbacks and DataModule inherit from the classes of *both* packages when
``lightning`` is installed: one object then works with whichever Trainer the
user's project builds, without the user choosing. The hooks of the two base
classes are the same no-op defaults, so which one the method resolution order
picks does not matter.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

try:  # the unified package is optional
    import lightning.pytorch as lpl

    LIGHTNING_PACKAGES: tuple[Any, ...] = (pl, lpl)
except ImportError:  # pragma: no cover - exercised only where `lightning` is not installed
    LIGHTNING_PACKAGES = (pl,)

CALLBACK_BASES: tuple[type, ...] = tuple(package.Callback for package in LIGHTNING_PACKAGES)
DATAMODULE_BASES: tuple[type, ...] = tuple(package.LightningDataModule for package in LIGHTNING_PACKAGES)
TRAINER_TYPES: tuple[type, ...] = tuple(package.Trainer for package in LIGHTNING_PACKAGES)
MODULE_TYPES: tuple[type, ...] = tuple(package.LightningModule for package in LIGHTNING_PACKAGES)


class Callback(*CALLBACK_BASES):  # type: ignore[misc]
    """Base of ptl_rl's callbacks: a ``Callback`` of every installed Lightning package."""


class DataModule(*DATAMODULE_BASES):  # type: ignore[misc]
    """Base of ptl_rl's DataModule: a ``LightningDataModule`` of every installed Lightning package."""

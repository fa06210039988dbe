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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pytorch_lightning as pl
import torch

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


# ---------------------------------------------------------------------- what the callbacks use of a Trainer
# The callbacks' hooks take the Trainer and the LightningModule of either package, whose classes are distinct:
# these protocols name the members the callbacks use, and both packages' classes have them (checked by mypy at
# the end of this module).


class LoggerLike(Protocol):
    """A Lightning logger, as the callbacks write to it: ``log_metrics(metrics, step)``."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...


class StrategyLike(Protocol):
    """A Lightning strategy, as the callbacks reduce a value over the ranks with it."""

    def reduce(self, tensor: torch.Tensor, *, reduce_op: str) -> torch.Tensor: ...


class TrainerLike(Protocol):
    """The members of a Lightning ``Trainer`` (either package) that ptl_rl's callbacks read, and ``should_stop``."""

    should_stop: bool

    @property
    def global_step(self) -> int: ...

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def max_steps(self) -> int: ...

    @property
    def loggers(self) -> Sequence[LoggerLike]: ...

    @property
    def strategy(self) -> StrategyLike: ...

    @property
    def log_dir(self) -> str | None: ...

    @property
    def default_root_dir(self) -> str: ...


class ModuleLike(Protocol):
    """The members of a ``LightningModule`` (either package) that ptl_rl's callbacks call: ``log``, ``log_dict``."""

    def log(
        self,
        name: str,
        value: float | torch.Tensor,
        *,
        prog_bar: bool = ...,
        logger: bool | None = ...,
        on_step: bool | None = ...,
        on_epoch: bool | None = ...,
        batch_size: int | None = ...,
    ) -> None: ...

    def log_dict(
        self,
        dictionary: Mapping[str, float | torch.Tensor],
        *,
        prog_bar: bool = ...,
        logger: bool | None = ...,
        on_step: bool | None = ...,
        on_epoch: bool | None = ...,
        batch_size: int | None = ...,
    ) -> None: ...


def trainer_callbacks(trainer: TrainerLike) -> list[Any]:
    """``trainer.callbacks``: Lightning's callback connector sets it, so the ``Trainer`` class does not declare it."""
    callbacks: list[Any] = getattr(trainer, "callbacks")  # noqa: B009 - an attribute mypy does not know
    return callbacks


if TYPE_CHECKING:  # the Lightning classes of both packages are TrainerLike and ModuleLike (mypy checks these)

    def _pl_classes_fit(trainer: pl.Trainer, module: pl.LightningModule) -> tuple[TrainerLike, ModuleLike]:
        return trainer, module

    def _lpl_classes_fit(trainer: lpl.Trainer, module: lpl.LightningModule) -> tuple[TrainerLike, ModuleLike]:
        return trainer, module

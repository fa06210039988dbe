"""Fixtures shared by the whole suite.

The suite is split by kind: ``unit/`` (one component, fast), ``property/``
(components against brute-force references, hypothesis and chi-square),
``integration/`` (Lightning, DDP, processes, Ray, notebooks, docs, the
command lines) and ``learning/`` (agents that must reach a return). The
helpers they share (scripted envs, statistics, the n-step reference,
collectors) live in ``support/``, which pytest puts on ``sys.path``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest

LIGHTNING_PACKAGES = ["pytorch_lightning", "lightning.pytorch"]


@pytest.fixture(params=LIGHTNING_PACKAGES)
def L(request: pytest.FixtureRequest) -> ModuleType:  # noqa: N802 - the name users give the package
    """Each Lightning package in turn: ``pytorch_lightning`` and ``lightning.pytorch`` (``import lightning as L``)."""
    return importlib.import_module(request.param)


@pytest.fixture
def restore_torch_threads() -> Iterator[None]:
    """Put torch's thread count back after a test that runs an example (the examples pin it to one)."""
    import torch  # noqa: PLC0415 - only the tests that use this fixture pay for torch here

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)

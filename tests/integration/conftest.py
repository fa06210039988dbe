"""Fixtures of the integration tests that several files share."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from paths import REPO, SUPPORT


@pytest.fixture(scope="session")
def ray_session() -> Iterator[ModuleType]:
    """One local Ray for the whole test session (it takes seconds and ~0.7 GB to start), shared by every test file.

    Ray can be initialised once per process, so the files that need it (``test_ray.py``,
    ``test_replay_shards.py``) share this fixture rather than each starting its own.
    Token authentication is switched off for this throwaway local cluster; a
    shared cluster should run with RAY_AUTH_MODE=token (see docs/design/scale-out.md).
    The actors import the test helpers and this checkout's ptl_rl through PYTHONPATH.
    """
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    path = os.pathsep.join([str(REPO), str(SUPPORT), *[p for p in sys.path if p]])
    ray.init(
        address="local",  # a new local Ray, never one another process on this machine started
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield ray
    ray.shutdown()

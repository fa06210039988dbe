"""Where things are, for tests that start processes or read files outside the test tree."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent  # the test helpers (scripted envs, collectors, ...)
TESTS = SUPPORT.parent
REPO = TESTS.parent

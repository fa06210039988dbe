"""Faults injected between any two statements of chosen code: exceptions and KeyboardInterrupts at line ``k``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType
from typing import Any


class InjectedFault(Exception):
    """Stands for any exception raised inside next() (a bug in an env, the agent, ...)."""


class Injector:
    """Raises an exception at the ``k``-th line executed in one kind of target code, through ``sys.settrace``.

    ``targets`` maps a kind ("stages", "env", "agent") to a test ``CodeType -> bool``. The
    exception is raised from the trace function, so it appears in the traced frame exactly
    between two of its statements (Python then turns the trace off by itself). Lines of every
    kind are counted, so a clean call tells how many lines of each kind one call runs.
    """

    def __init__(self, targets: dict[str, Callable[[CodeType], bool]]) -> None:
        self.targets = targets
        self.kind_of: dict[CodeType, str | None] = {}
        self.counts = dict.fromkeys(targets, 0)
        self.target: str | None = None
        self.k = 0
        self.fired = False
        self.where: CodeType | None = None  # the code the last fault was raised in
        self.line = 0  # and its line

    def run(self, fn: Callable[[], Any], target: str | None = None, k: int = 0, exc: BaseException | None = None):
        """Call ``fn`` and raise ``exc`` at the ``k``-th line of kind ``target`` (none if ``target`` is None)."""
        self.counts = dict.fromkeys(self.targets, 0)
        self.target, self.k, self.exc, self.fired = target, k, exc, False
        previous = sys.gettrace()
        sys.settrace(self._global)
        try:
            return fn()
        finally:
            sys.settrace(previous)

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        code = frame.f_code
        if code not in self.kind_of:
            self.kind_of[code] = next((kind for kind, test in self.targets.items() if test(code)), None)
        kind = self.kind_of[code]
        if kind is None:
            return None

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line" and not self.fired:
                self.counts[kind] += 1
                if kind == self.target and self.counts[kind] == self.k:
                    self.fired, self.where, self.line = True, frame.f_code, frame.f_lineno
                    raise self.exc
            return local

        return local

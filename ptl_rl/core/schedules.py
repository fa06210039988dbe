"""Values that change with a step count (exploration epsilon, noise scale, importance-sampling beta)."""

from __future__ import annotations

from collections.abc import Callable

Schedule = Callable[[int], float]


class LinearSchedule:
    """``start`` at step 0, moving linearly to ``end`` at ``duration`` steps, then constant.

    Call it with a step count: ``LinearSchedule(1.0, 0.05, 10_000)(5_000) == 0.525``.
    """

    def __init__(self, start: float, end: float, duration: int) -> None:
        if duration < 0:
            raise ValueError(f"duration must be >= 0, got {duration}")
        self.start, self.end, self.duration = float(start), float(end), int(duration)

    def __call__(self, step: int) -> float:
        if self.duration == 0 or step >= self.duration:
            return self.end
        return self.start + (self.end - self.start) * step / self.duration

    def __repr__(self) -> str:
        return f"LinearSchedule({self.start}, {self.end}, {self.duration})"


class Constant:
    """The same ``value`` at every step: what a plain number means where a schedule is accepted."""

    def __init__(self, value: float) -> None:
        self.value = float(value)

    def __call__(self, step: int) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"Constant({self.value})"


def as_schedule(value: float | Schedule) -> Schedule:
    """``value`` if it is already a schedule (``step -> float``), else a :class:`Constant` of it."""
    return value if callable(value) else Constant(value)

"""The package's small shared helpers, against brute force."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ptl_rl.core._grouping import rank_within_group
from ptl_rl.core.schedules import Constant, LinearSchedule, as_schedule


@given(st.lists(st.integers(-3, 5), max_size=40))
def test_rank_within_group_counts_earlier_rows_of_the_same_label(labels):
    expected = [labels[:i].count(label) for i, label in enumerate(labels)]
    got = rank_within_group(np.asarray(labels, dtype=np.int64))
    assert got.dtype == np.int64 and got.tolist() == expected


@given(st.floats(-10, 10), st.floats(-10, 10), st.integers(0, 1000), st.integers(0, 2000))
def test_linear_schedule_interpolates_then_holds(start, end, duration, step):
    schedule = LinearSchedule(start, end, duration)
    expected = end if step >= duration else start + (end - start) * step / duration
    assert np.isclose(schedule(step), expected)


def test_as_schedule_keeps_callables_and_wraps_numbers():
    schedule = LinearSchedule(1.0, 0.0, 10)
    assert as_schedule(schedule) is schedule
    constant = as_schedule(0.25)
    assert isinstance(constant, Constant) and constant(0) == constant(10**9) == 0.25
    assert repr(constant) == "Constant(0.25)"

"""FrameStorage.add cut short at every line by an interrupt, then continued: the replay stays exact.

For every line of ``ptl_rl/replay/frames/`` that an add executes (a batch that wraps the
ring, holds episode ends and rows of several envs, n-step tails), a
``KeyboardInterrupt`` is raised there (the ``Injector`` of test_robustness,
through ``sys.settrace``). Right after the interrupt every sampleable
transition must already rebuild the env's own stacks (nothing half written is
sampleable); after more adds the buffer must hold exactly what an uninterrupted
twin holds: the same sampleable slots, bit-identical fields and observations.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest
from test_frame_storage import check_against_reference, make_env, random_agent, recorders, reference
from test_robustness import Injector

from ptl_rl import (
    ExperienceSource,
    FrameStorage,
    NStepTransform,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    SequenceReplayBuffer,
)
from ptl_rl.replay.frames import _frame_insert

CAPACITY = 13
FRAMES_DIR = os.path.dirname(sys.modules["ptl_rl.replay.frames"].__file__)  # the package's modules


def in_frames(code) -> bool:
    return os.path.dirname(code.co_filename) == FRAMES_DIR


def recorded_batches(n: int, count: int = 80):
    env = make_env("NextStep")
    stream = NStepTransform(ExperienceSource(env, random_agent(3, 2), seed=6), n=n, gamma=0.9)
    batches = [next(stream) for _ in range(count)]
    target = pick_target(batches, CAPACITY)
    return batches[: target + 4], reference(recorders(env), n, False)


def pick_target(batches, capacity: int) -> int:
    """Index of a batch with an episode end, two or more envs, that wraps the ring of ``capacity``."""
    total = 0
    for i, b in enumerate(batches):
        done = np.asarray(b["terminated"] | b["truncated"])
        wraps = total >= capacity and (total % capacity) + len(b) > capacity
        if i > 3 and done.any() and len(np.unique(b["env_id"])) >= 2 and wraps:
            return i
        total += len(b)
    raise AssertionError("no batch wraps the ring with an episode end")


def make_buffer(kind: str, n: int, check: bool, compiled: bool = False):
    storage = functools.partial(FrameStorage, stack_axis=0, n_step=n, extra_frames=400, check=check)
    if kind == "uniform":
        buffer = ReplayBuffer(None, CAPACITY, seed=0, storage=storage)
    elif kind == "prioritized":
        buffer = PrioritizedReplayBuffer(None, CAPACITY, seed=0, storage=storage)
    else:
        buffer = SequenceReplayBuffer(None, CAPACITY, length=2, seed=0, storage=storage)
    buffer.storage.compiled = compiled  # the compiled insert (one call no interrupt splits) or the Python path
    return buffer


COMPILED = [False, pytest.param(True, marks=pytest.mark.skipif(_frame_insert is None, reason="not built"))]


def assert_exact(buffer, table, twin=None, where: str = "") -> None:
    """Every sampleable slot of ``buffer`` (a buffer, or a storage) is the env's own; all equal ``twin``'s."""
    storage = buffer if isinstance(buffer, FrameStorage) else buffer.storage
    every = np.arange(len(storage))
    ok = storage.sampleable(every)
    if ok.any():
        check_against_reference(storage.gather(every[ok]), table, False)
    if twin is not None:
        theirs_storage = twin if isinstance(twin, FrameStorage) else twin.storage
        assert np.array_equal(ok, theirs_storage.sampleable(every)), where
        mine, theirs = storage.gather(every[ok]), theirs_storage.gather(every[ok])
        for name in theirs.keys():
            np.testing.assert_array_equal(mine[name], theirs[name], err_msg=f"{where}: {name}")


@pytest.mark.parametrize("compiled", COMPILED)
@pytest.mark.parametrize("kind", ["uniform", "prioritized", "sequence"])
@pytest.mark.parametrize("n,check", [(3, True), (3, False), (1, True)])
def test_add_interrupted_at_every_line_is_redone(kind, n, check, compiled):
    batches, table = recorded_batches(n)
    target = len(batches) - 4
    # (not the counters' getters: a buffer reading them before its add is interrupted in its own code, before
    # the add began; the batch is then lost, which a numbered upstream's stream_seq reports to the storage)
    getters = {"size", "cursor", "total_added", "__len__"}
    injector = Injector({"frames": lambda code: in_frames(code) and code.co_name not in getters})
    twin = make_buffer(kind, n, check, compiled)
    for b in batches[:target]:
        twin.add(b)
    injector.run(lambda: twin.add(batches[target]))
    lines = injector.counts["frames"]
    assert lines > 30 or (compiled and lines >= 5)  # (compiled: the Python lines around the kernel call)
    for b in batches[target + 1 :]:
        twin.add(b)
    assert_exact(twin, table)
    # every buffer's journal records the batch before any storage code runs (SequenceReplayBuffer's saves the
    # storage's snapshot, the first frames line): a cut at any line of the storage is redone
    for k in range(1, lines + 1):
        buffer = make_buffer(kind, n, check, compiled)
        for b in batches[:target]:
            buffer.add(b)
        with pytest.raises(KeyboardInterrupt):
            injector.run(lambda: buffer.add(batches[target]), "frames", k, KeyboardInterrupt())  # noqa: B023
        assert_exact(buffer, table, where=f"line {k}, right after the interrupt")
        for b in batches[target + 1 :]:
            buffer.add(b)
        assert_exact(buffer, table, twin, where=f"line {k}")
        assert buffer.storage.total_added == twin.storage.total_added


@pytest.mark.parametrize("compiled", COMPILED)
@pytest.mark.parametrize("n,check", [(3, True), (3, False), (1, True)])
def test_add_called_on_the_storage_and_cut_at_every_line_is_redone_by_the_storage(n, check, compiled):
    # no buffer: the storage's own journal (the guard's WriteJournal) records the batch on the first line of
    # FrameStorage.add; a cut anywhere after it is done again, in full, by settle() or by the next add
    batches, table = recorded_batches(n)
    target = len(batches) - 4
    getters = {"size", "cursor", "total_added", "__len__"}
    injector = Injector({"frames": lambda code: in_frames(code) and code.co_name not in getters})
    twin = make_buffer("uniform", n, check, compiled).storage
    for b in batches[:target]:
        twin.add(b)
    injector.run(lambda: twin.add(batches[target]))
    lines = injector.counts["frames"]
    assert lines > 30 or (compiled and lines >= 5)
    for b in batches[target + 1 :]:
        twin.add(b)
    for k in range(2, lines + 1):  # (line 1 is add's own: a cut there is before the batch was recorded)
        storage = make_buffer("uniform", n, check, compiled).storage
        for b in batches[:target]:
            storage.add(b)
        with pytest.raises(KeyboardInterrupt):
            injector.run(lambda: storage.add(batches[target]), "frames", k, KeyboardInterrupt())  # noqa: B023
        assert_exact(storage, table, where=f"line {k}, right after the interrupt")
        if k % 2:  # (half the cuts are finished by settle(), half by the next add)
            storage.settle()
            assert storage.total_added == sum(len(b) for b in batches[: target + 1]), f"line {k}"
        for b in batches[target + 1 :]:
            storage.add(b)
        assert_exact(storage, table, twin, where=f"line {k}")
        assert storage.total_added == twin.total_added


@pytest.mark.parametrize("compiled", COMPILED)
@pytest.mark.parametrize("check", [True, False])
def test_first_add_interrupted_at_every_line_is_redone(check, compiled):
    # the first add allocates (the stack depth is only known then): an interrupt anywhere in it, allocation
    # included, must leave a buffer whose next add redoes it, not one stuck with the pre-allocation layout
    n = 3
    batches, table = recorded_batches(n)
    batches = batches[:20]
    storage_file = sys.modules["ptl_rl.replay.storage"].__file__
    injector = Injector({"storage": lambda code: in_frames(code) or code.co_filename == storage_file})
    twin = make_buffer("uniform", n, check, compiled)
    injector.run(lambda: twin.add(batches[0]))
    lines = injector.counts["storage"]
    assert lines > 30
    for b in batches[1:]:
        twin.add(b)
    for k in range(1, lines + 1):
        buffer = make_buffer("uniform", n, check, compiled)
        with pytest.raises(KeyboardInterrupt):
            injector.run(lambda: buffer.add(batches[0]), "storage", k, KeyboardInterrupt())  # noqa: B023
        for b in batches[1:]:
            buffer.add(b)
        assert_exact(buffer, table, twin, where=f"line {k}")
        assert buffer.storage.total_added == twin.storage.total_added


@pytest.mark.parametrize("compiled", COMPILED)
def test_two_interrupts_in_a_row_lose_batches_but_store_nothing_wrong(compiled):
    # an add cut short is redone by the next pull's add; if a second interrupt cuts that redo, the batch just
    # pulled is lost. The redone batch must keep the number it was pulled with, or the batch after the lost
    # one looks contiguous and its stacks are trusted to continue from the wrong step
    n = 3
    injector = Injector({"frames": in_frames})

    def pipeline():
        env = make_env("NextStep")
        stream = NStepTransform(ExperienceSource(env, random_agent(3, 2), seed=6), n=n, gamma=0.9)
        storage = functools.partial(FrameStorage, stack_axis=0, extra_frames=400)
        buffer = ReplayBuffer(stream, 300, warmup=0, transitions_per_yield=1, seed=0, storage=storage)
        buffer.storage.compiled = compiled
        for _ in range(12):
            next(buffer)
        return env, buffer

    env, buffer = pipeline()
    injector.run(lambda: next(buffer))
    lines = injector.counts["frames"]
    cuts = 0
    for first in range(1, lines + 1, 3):
        for second in (1, 4, 9, 17, 30, 60, 120):
            env, buffer = pipeline()
            for k in (first, second):
                try:
                    injector.run(lambda: next(buffer), "frames", k, KeyboardInterrupt())  # noqa: B023
                except KeyboardInterrupt:
                    cuts += 1
            for _ in range(15):
                next(buffer)
            storage = buffer.storage
            every = np.arange(len(storage))
            ok = storage.sampleable(every)
            assert len(every) - ok.sum() <= 3 * n  # lost batches leave no dead slots: only the newest rows wait
            check_against_reference(storage.gather(every[ok]), reference(recorders(env), n, False), False)
    assert cuts > lines // 3  # the interrupts did land

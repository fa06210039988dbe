"""AsyncSource: rows equal to the in-process pipeline and to brute force, versions, staleness, shutdown, failures."""

from __future__ import annotations

import _thread
import functools
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
import torch
from collectors import ShiftPolicy, check_rows, concat_rows, flood_collector, scripted_collector
from faults import InjectedFault, Injector
from paths import REPO, SUPPORT
from scripted_env import obs_code

from ptl_rl import BatchSampler, ExperienceSource, ReplayBuffer, TransitionBatch, find_stage, to_dataloader
from ptl_rl.core import guard, stage
from ptl_rl.distributed import AsyncSource, CollectorError, WorkerInfo, async_source, intake
from ptl_rl.distributed.common import worker_rank

HERE = str(SUPPORT)  # the collectors' module, for processes that import it
ROOT = str(REPO)


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def _push(source: AsyncSource, policy: ShiftPolicy) -> int:
    with torch.no_grad():
        policy.shift.fill_(source.version + 1)  # the weights of version v act with shift v
    return source.push_weights()


def test_rows_equal_in_process_pipeline_and_brute_force() -> None:
    """Without weight pushes the async stage yields exactly the batches of the same pipeline run in-process."""
    factory = functools.partial(scripted_collector, n=3)
    reference = factory(WorkerInfo(0, 0, 0, 1)).pipeline
    expected = [next(reference) for _ in range(40)]
    with AsyncSource(factory) as source:
        got = [next(source) for _ in range(40)]
        assert source.running
    for want, have in zip(expected, got, strict=True):
        assert set(have.keys()) == set(want.keys()) | {"policy_version"}
        for key in want.keys():
            np.testing.assert_array_equal(have[key], want[key], err_msg=key)
        assert (have["policy_version"] == 0).all()
    check_rows(concat_rows(got))
    assert source.total_steps >= 40 and source.episodes_finished > 0


def test_steps_per_message_joins_batches_in_order() -> None:
    """steps_per_message=K: each message holds the rows of K consecutive in-process batches, counters add up."""
    factory = functools.partial(scripted_collector, n=3)
    reference = factory(WorkerInfo(0, 0, 0, 1)).pipeline
    expected = [next(reference) for _ in range(5 * 4)]
    with AsyncSource(factory, steps_per_message=4, queue_size=2) as source:
        got = [next(source) for _ in range(5)]
        steps = source.total_steps
    for k, have in enumerate(got):
        want = expected[4 * k : 4 * k + 4]
        for key in want[0].keys():
            np.testing.assert_array_equal(have[key], np.concatenate([w[key] for w in want]), err_msg=key)
    check_rows(concat_rows(got))
    # the env steps of every batch in the messages taken in (the collector may be ahead), not one per message
    assert steps >= find_stage(reference, ExperienceSource).total_steps > 5 * 4
    with pytest.raises(ValueError, match="steps_per_message"):
        AsyncSource(factory, steps_per_message=0)


def test_shared_memory_ring_carries_large_arrays_exactly() -> None:
    """With a ring so small that every message wraps around and waits for the learner, rows are still exact."""
    factory = functools.partial(scripted_collector, n=3, padded=True)
    reference = factory(WorkerInfo(0, 0, 0, 1)).pipeline
    expected = [next(reference) for _ in range(2 * 40)]
    # a message holds ~6 (up to 18) rows of 2 KiB of pad: a 64 KiB ring wraps every few messages and fills
    with AsyncSource(factory, steps_per_message=2, queue_size=4, shared_memory_mb=1 / 16) as source:
        got = [next(source) for _ in range(40)]
    for k, have in enumerate(got):
        want = TransitionBatch.concat(expected[2 * k : 2 * k + 2])
        assert set(have.keys()) == set(want.keys()) | {"policy_version"}
        for key in want.keys():
            np.testing.assert_array_equal(have[key], want[key], err_msg=key)
        assert have["pad"].flags.owndata, "copied out of the ring: a later message cannot overwrite it"
    rows = concat_rows(got)
    np.testing.assert_array_equal(rows["pad"], np.repeat(obs_code(rows["obs"]).astype(np.float32)[:, None], 512, 1))
    check_rows(rows)


def test_shared_memory_ring_too_small_is_a_clear_error() -> None:
    factory = functools.partial(scripted_collector, n=3, padded=True)
    with AsyncSource(factory, steps_per_message=64, shared_memory_mb=1 / 64) as source:
        with pytest.raises(CollectorError, match="do not fit the shared-memory ring.*shared_memory_mb"):
            next(source)
    with pytest.raises(ValueError, match="shared_memory_mb"):
        AsyncSource(factory, shared_memory_mb=0)


def test_versions_staleness_and_composition_with_replay() -> None:
    """AsyncSource -> ReplayBuffer -> BatchSampler -> to_dataloader; pushed weights act, rows carry their version."""
    policy = ShiftPolicy()
    source = AsyncSource(functools.partial(scripted_collector, n=2), policy=policy, queue_size=4)
    buffer = ReplayBuffer(source, capacity=10_000, warmup=30, transitions_per_yield=6, seed=0)
    loader = to_dataloader(BatchSampler(buffer, batch_size=16), steps_per_epoch=60)
    taken = 0
    try:
        for step, batch in enumerate(loader):
            assert batch["policy_version"].dtype == torch.int64
            taken += 1
            if step % 5 == 4:
                _push(source, policy)
        stats = source.staleness_stats()
    finally:
        source.close()
    assert taken == 60 and source.version == 12
    stored = buffer.storage.gather(np.arange(len(buffer)))
    check_rows(concat_rows([stored]), n=2)
    versions = np.asarray(stored["policy_version"])
    assert versions.max() >= 8, "the collector did not act with pushed weights"
    # the replay ratio is the in-process one: the learner waits for its transitions (6 per yield, warm-up first)
    assert 30 + 6 * 59 <= len(buffer) <= 30 + 6 * 59 + 4 * 3 + 6
    assert stats["staleness_max"] >= 0 and stats["dropped_stale"] == 0
    assert not source.running


def test_staleness_bound_drops_old_rows() -> None:
    """Rows older than max_staleness versions when the learner takes them are dropped and counted."""
    policy = ShiftPolicy()
    source = AsyncSource(functools.partial(scripted_collector, n=1), policy=policy, max_staleness=1, queue_size=8)
    try:
        first = next(source)  # the queue fills up behind it with version-0 batches
        deadline = time.monotonic() + 20
        while source._data_q.qsize() < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(3):
            _push(source, policy)  # version 3: what waits in the queue is 3 versions old
        rows = [next(source) for _ in range(20)]
        stats = source.staleness_stats()
    finally:
        source.close()
    got = concat_rows([first, *rows])
    check_rows(got, n=1)
    assert (source.version - np.asarray(concat_rows(rows)["policy_version"]) <= 1).all()
    assert stats["dropped_stale"] >= 8, stats
    assert stats["staleness_max"] <= 1


def test_close_and_consumer_exception_leave_no_process() -> None:
    source = AsyncSource(scripted_collector)
    next(source)
    pid = source.pid
    source.close()
    assert _gone(pid) and not source.running
    with pytest.raises(ValueError, match="consumer failed"), AsyncSource(scripted_collector) as source:
        next(source)
        pid = source.pid
        raise ValueError("consumer failed")
    assert _gone(pid)


@pytest.fixture
def python_sigint_handler():
    """Python's own SIGINT handler, as a notebook kernel has it: ``_thread.interrupt_main`` does nothing under
    another (an earlier test of the session may have left one), and the test would not be interrupted at all."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("python_sigint_handler")
def test_keyboard_interrupt_in_next_stops_the_collector_and_next_restarts_it() -> None:
    """A notebook interrupt while next() waits: no collector left; the next call starts fresh episodes."""
    source = AsyncSource(functools.partial(scripted_collector, n=1, step_sleep=0.2))
    try:
        next(source)
        pid = source.pid
        timer = threading.Timer(0.3, _thread.interrupt_main)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            for _ in range(100):
                next(source)
        timer.join()
        assert _gone(pid) and not source.running
        batch = next(source)  # a new process, a new incarnation: other env ids, new episodes
        assert source.pid != pid and source.incarnation == 2
        assert (np.asarray(batch["env_id"]) >= 3).all() and (np.asarray(batch["obs"])[:, 1] >= 1000).all()
    finally:
        source.close()


CUT_TARGETS = {
    "stage": lambda code: code.co_filename in (async_source.__file__, intake.__file__),
    "guard": lambda code: code.co_filename in (guard.__file__, stage.__file__),
}


def test_a_next_cut_at_any_line_leaves_no_collector_behind_and_counts_every_message_once() -> None:
    """Interrupts and exceptions between any two statements of AsyncSource's step (waiting, receiving, taking a
    message in) and of the guard around it: a step cut short leaves no collector running, the next next() starts a
    fresh one and skips a stream number, every row is right and the episode counters agree with the episodes
    handed out, each counted once."""
    source = AsyncSource(functools.partial(scripted_collector, n=2), queue_size=2)
    injector = Injector(CUT_TARGETS)
    got, popped, restarts, left_running = [], [], 0, 0
    try:
        got.append(next(source))  # started: a steady call's lines are counted below
        injector.run(lambda: got.append(next(source)))
        lines = dict(injector.counts)
        assert lines["stage"] > 10 and lines["guard"] > 5, lines
        for kind in CUT_TARGETS:
            for k in range(1, lines[kind] + 1):
                pid = source.pid
                fault = KeyboardInterrupt() if k % 2 else InjectedFault()
                try:
                    injector.run(lambda: got.append(next(source)), kind, k, fault)  # noqa: B023 - run at once
                except (KeyboardInterrupt, InjectedFault) as raised:
                    assert raised is fault
                if not injector.fired:
                    continue
                in_step = kind == "stage" and injector.where is not AsyncSource.snapshot.__code__
                if in_step:  # the step was cut: its collector is stopped at once (unless cut before its handler)
                    left_running += source.running
                    assert source.running or _gone(pid), (kind, k)
                seq = source.stream_seq
                popped += source.pop_episodes()
                got.append(next(source))
                restarted = source.pid != pid
                restarts += restarted
                assert restarted or not in_step, (kind, k)  # the guard's restore drops it in any case
                assert _gone(pid) if restarted else source.running, (kind, k)
                assert source.stream_seq == seq + (2 if restarted else 1), (kind, k)  # a restart is a cut
        assert left_running <= 1 and restarts >= lines["stage"] - 1, (left_running, restarts, lines)
        popped += source.pop_episodes()
        assert source.episodes_finished == len(popped) > 0
        assert source.recent_episodes() == popped[-len(source.recent_episodes()) :]
        stamps = [e.total_steps for e in popped]
        assert stamps == sorted(stamps) and stamps[-1] <= source.total_steps
        check_rows(concat_rows(got), n=2)
    finally:
        source.close()


def test_collector_crash_surfaces_with_its_traceback() -> None:
    source = AsyncSource(functools.partial(scripted_collector, n=1, fail_at=5))
    with pytest.raises(CollectorError, match=r"RuntimeError: scripted failure in env \d at step 5") as info:
        for _ in range(50):
            next(source)
    assert "Traceback" in str(info.value) and "collectors.py" in str(info.value)
    assert not source.running


def test_killed_collector_is_reported() -> None:
    source = AsyncSource(functools.partial(scripted_collector, n=1))
    try:
        next(source)
        os.kill(source.pid, signal.SIGKILL)
        with pytest.raises(CollectorError, match="killed by signal SIGKILL"):
            for _ in range(1000):
                next(source)
    finally:
        source.close()


def _within(seconds: float, work) -> None:
    """Run ``work`` in a thread; fail (instead of hanging the suite) if it is not done in ``seconds``."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if errors:
        raise errors[0]


LARGE = functools.partial(scripted_collector, n=3, padded=True)  # ~0.8 MB messages at 64 steps: > a pipe's 64 KiB


def test_collector_killed_in_the_middle_of_a_large_message_is_reported_not_waited_for() -> None:
    """The learner does not keep the queue's write end: a message cut short by the collector's death is an EOF."""
    source = AsyncSource(LARGE, steps_per_message=64, queue_size=4)
    try:
        next(source)
        time.sleep(1.0)  # the queue fills; the collector's feeder thread waits in the middle of a message
        os.kill(source.pid, signal.SIGKILL)

        def drain() -> None:
            with pytest.raises(CollectorError, match="killed by signal SIGKILL"):
                for _ in range(100):
                    next(source)

        _within(20.0, drain)
    finally:
        source.close()


def test_close_while_large_messages_are_in_flight_returns() -> None:
    """close() drains the queue while the collector exits, maybe in the middle of a message: it must not hang.

    The collector sends 8 MiB messages as fast as the pipe takes them, so it exits while its feeder thread is
    writing one, and the learner, draining, is reading it (this hung for good when the learner kept its copy of
    the write end)."""
    for _ in range(4):
        source = AsyncSource(flood_collector, steps_per_message=2, queue_size=4)
        next(source)
        pid = source.pid
        time.sleep(0.5)
        _within(20.0, source.close)
        assert _gone(pid)


def test_collector_exits_when_the_learner_process_dies() -> None:
    """No orphan: a learner killed with SIGKILL (no cleanup runs) leaves a collector that exits by itself."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path[:0] = [{ROOT!r}, {HERE!r}]
        from collectors import scripted_collector
        from ptl_rl.distributed import AsyncSource
        source = AsyncSource(scripted_collector)
        next(source)
        print(source.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.strip(), proc.stderr
    child = int(proc.stdout.split()[0])
    assert _gone(child, within=10.0), "the collector outlived its learner"


def test_a_factory_the_collector_cannot_import_is_refused_before_any_process_starts(monkeypatch) -> None:
    with pytest.raises(TypeError, match="module-level function or a functools.partial of one, not a lambda"):
        AsyncSource(lambda info: scripted_collector(info))

    def nested(info):  # pragma: no cover - never called
        return scripted_collector(info)

    with pytest.raises(TypeError, match="cannot be sent to the collector process"):
        AsyncSource(functools.partial(nested, seed=0))
    assert AsyncSource(functools.partial(scripted_collector)).pid is None  # (a fixed one is taken; nothing started)
    # a function of a notebook's __main__ pickles by name, but a fresh interpreter has no such module to import
    notebook_fn = functools.partial(scripted_collector)
    monkeypatch.setattr(scripted_collector, "__module__", "__main__")
    monkeypatch.setitem(sys.modules, "__main__", type(sys)("__main__"))  # (a module without __file__)
    monkeypatch.setattr(sys.modules["__main__"], "scripted_collector", scripted_collector, raising=False)
    with pytest.raises(TypeError, match="defined in a notebook or an interactive session"):
        AsyncSource(notebook_fn)


def test_a_message_read_from_an_exited_collector_is_delivered_first() -> None:
    """The queue was empty, then the collector turned out dead but had sent its error just before: that error
    (read aside while checking on the process) is what next() raises, not a generic "exited" message."""

    class Queue:
        def __init__(self) -> None:
            self.replies = [queue.Empty(), ("error", "RuntimeError", "the env broke", "Traceback: env.step")]

        def get(self, timeout: float = 0.0):
            if not self.replies:
                raise EOFError  # nothing more: the collector's end is closed
            reply = self.replies.pop(0)
            if isinstance(reply, BaseException):
                raise reply
            return reply

    class Exited:
        pid, exitcode = 12345, 1

        def is_alive(self) -> bool:
            return False

        def join(self, timeout: float | None = None) -> None:
            pass

    source = AsyncSource(scripted_collector)
    source._proc, source._data_q, source._stop = Exited(), Queue(), threading.Event()
    try:
        with pytest.raises(CollectorError, match="RuntimeError: the env broke"):
            next(source)
    finally:
        source._proc = None  # (nothing real to stop)


def _acts_with_pushed_weights(source: AsyncSource, batches: int = 6) -> np.ndarray:
    """The versions of ``batches`` batches, after checking that every row acted with the weights pushed as its version
    (``check_rows``: action = code + shift, and the weights pushed as v have shift v)."""
    rows = concat_rows([next(source) for _ in range(batches)])
    check_rows(rows, n=1)
    return np.unique(rows["policy_version"])


def test_weights_pushed_while_no_collector_runs_are_the_ones_that_act() -> None:
    """Whatever the source's state (not started, closed, crashed), rows of version v were chosen by the weights
    pushed as v: not by the learner's module as it is when the next collector happens to start."""
    policy = ShiftPolicy()
    factory = functools.partial(scripted_collector, n=1, fail_at=40)  # incarnation 0 crashes; later ones run
    source = AsyncSource(factory, policy=policy, queue_size=2)
    try:
        # before the first next(): push v1 (shift 1), then the learner trains on without pushing
        _push(source, policy)
        with torch.no_grad():
            policy.shift.fill_(7)
        assert _acts_with_pushed_weights(source, 2).tolist() == [1]
        with pytest.raises(CollectorError, match="scripted failure"):
            for _ in range(100):
                next(source)
        # after a crash: an explicit state_dict, while the module holds other weights
        assert source.push_weights({"shift": torch.tensor(2.0)}) == 2
        assert _acts_with_pushed_weights(source).tolist() == [2]
        # after a close: the weights of the version last pushed while running, not the module's newer ones
        _push(source, policy)
        assert _acts_with_pushed_weights(source).max() == 3
        source.close()
        with torch.no_grad():
            policy.shift.fill_(9)
        assert _acts_with_pushed_weights(source).tolist() == [3]
        source.close()
        # after a close, pushed before the restart
        assert source.push_weights({"shift": torch.tensor(4.0)}) == 4
        assert _acts_with_pushed_weights(source).tolist() == [4]
    finally:
        source.close()
    assert source.incarnation == 4 and float(policy.shift) == 9.0, "a push never changes the learner's module"


def test_a_pushed_state_dict_that_does_not_fit_the_policy_is_a_clear_error() -> None:
    source = AsyncSource(scripted_collector, policy=ShiftPolicy())
    with pytest.raises(ValueError, match=r"missing \['shift'\].*state_dict\(\) of the policy"):
        source.push_weights({"bias": torch.tensor(1.0)})
    assert source.version == 0, "a refused push publishes no version"


def test_worker_ranks_are_disjoint_across_ddp_ranks_workers_and_restarts() -> None:
    """worker_rank is one-to-one on (DDP rank, worker, incarnation) for every world size and worker count, and a
    single process keeps worker + num_workers * incarnation (what AsyncSource and one RayWorkers always had)."""
    for world_size, num_workers in [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2), (4, 3)]:
        keys = [
            (r, w, i) for r in range(world_size) for w in range(num_workers) for i in range(6)
        ]  # six incarnations: more restarts than workers or ranks
        ranks = [worker_rank(w, i, num_workers, r, world_size) for r, w, i in keys]
        assert len(set(ranks)) == len(keys), (world_size, num_workers)
        assert all(rank % world_size == r for rank, (r, _, _) in zip(ranks, keys, strict=True)), "a rank owns a class"
    assert [worker_rank(w, i, 3) for i in range(2) for w in range(3)] == list(range(6))
    with pytest.raises(ValueError, match="DDP rank must be in"):
        worker_rank(0, 0, 2, ddp_rank=2, world_size=2)


def test_check_rows_follows_a_collector_past_any_number_of_episodes() -> None:
    """The scripted collectors' episodes are defined for every episode number (a restart under load can let an env
    run hundreds of episodes): rows far past the first 200 episodes are still checked, and a wrong one is caught."""
    pipeline = scripted_collector(WorkerInfo(0, 0, 0, 1), n=3).pipeline
    rows = concat_rows([next(pipeline) for _ in range(1_500)])
    rows["policy_version"] = np.zeros(len(rows["action"]), np.int64)  # in-process: the factory's weights, shift 0
    assert rows["obs"][:, 1].max() >= 250, "the run should pass the old 200-episode scripts"
    check_rows(rows)
    late = np.flatnonzero(rows["obs"][:, 1] >= 250)
    for field in ("terminated", "reward"):
        wrong = {k: v.copy() for k, v in rows.items()}
        wrong[field][late[0]] = 1 - wrong[field][late[0]] if field == "terminated" else wrong[field][late[0]] + 1
        with pytest.raises(AssertionError):
            check_rows(wrong)

"""FrameStorage's compiled insert against its Python path: bit-identical storages after every add.

Two storages get the same batches, one with the compiled insert
(``ptl_rl.replay._frame_insert``) and one forced onto the Python path
(``compiled = False``, what ``PTL_RL_PURE_PYTHON=1`` does for all). After every
add every array (pool, frame references, per-env state, pending frames, the
other fields) and every counter must be equal, and so must the sampled
batches. Streams: random synthetic ones (hypothesis: stack depth, n-step,
capacity and pool sizes that wrap and overflow, frames drawn from a small
alphabet so that stacks repeat and episodes restart with equal frames,
episode ends, rows of one env several times in a batch, envs missing from a
batch, any order; checked, trusted and numbered-upstream trust), and the
scripted envs of test_frame_storage in all three autoreset modes, through
``NStepTransform`` and ``ReplayBuffer.add``.
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_frame_storage import check_against_reference, make_env, random_agent, recorders, reference

from ptl_rl import ExperienceSource, FrameStorage, NStepTransform, ReplayBuffer, TransitionBatch
from ptl_rl.replay import frames as frames_module
from ptl_rl.replay.frames.compiled import _SlotWindows
from ptl_rl.replay.frames.env_state import EnvState

compiled = pytest.mark.skipif(
    frames_module._frame_insert is None, reason="ptl_rl.replay._frame_insert is not built (no C compiler?)"
)


def test_extension_is_built_in_ci():
    """A compile that failed silently (setup.py builds the extension as optional) must not pass CI unseen."""
    if frames_module._frame_insert is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but ptl_rl.replay._frame_insert was not built: see the pip install log")
        pytest.skip("ptl_rl.replay._frame_insert is not built: FrameStorage uses its Python path")
    assert hasattr(frames_module._frame_insert, "Kernel")


class Numbered:
    """An upstream stand-in whose ``stream_seq`` the test sets (a numbered upstream makes ``check=None`` trust)."""

    def __init__(self, n: int) -> None:
        self.n, self.stream_seq = n, 0


def snapshot_of(storage: FrameStorage) -> dict[str, object]:
    out: dict[str, object] = {
        "counters": (storage.cursor, storage.size, storage.total_added, storage.frames_written, storage._stream.seen),
    }
    if storage.pool is None:
        return out
    links, envs = storage._links, storage._envs
    out.update(pool=storage.pool.copy(), obs_refs=links.obs_refs.copy(), next_refs=links.next_refs.copy())
    out.update(state=envs.state.array.copy(), pending=envs.pending.copy())
    for name, array in storage._fields.fields.items():
        out[f"field.{name}"] = np.array(array, copy=True)
    # what a cut resolves from: the newest batches' first transition number, env ids and next_obs frames
    out["retained.first"] = tuple(first for first, _ in links.retained)
    for k, (_, rows_of) in enumerate(links.retained):
        out[f"retained.{k}.env"] = np.array(rows_of["env_id"])
        out[f"retained.{k}.next"] = np.array(rows_of["next_obs"])
    return out


def assert_same(a: FrameStorage, b: FrameStorage, where: str) -> None:
    sa, sb = snapshot_of(a), snapshot_of(b)
    assert sa.keys() == sb.keys(), where
    for key in sa:
        if isinstance(sa[key], np.ndarray):
            np.testing.assert_array_equal(sa[key], sb[key], err_msg=f"{where}: {key}")
        else:
            assert sa[key] == sb[key], f"{where}: {key}"


def assert_same_samples(a: FrameStorage, b: FrameStorage) -> None:
    every = np.arange(len(a))
    ok = a.sampleable(every)
    np.testing.assert_array_equal(ok, b.sampleable(every))
    if ok.any():
        mine, theirs = a.gather(every[ok]), b.gather(every[ok])
        for name in theirs.keys():
            np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)


class Counting:
    """Counts the adds the compiled insert took on a storage: its adds less those it left to the Python path."""

    def __init__(self, storage: FrameStorage) -> None:
        self.adds = self.left = 0
        kernel = storage._kernel  # (the storage's CompiledInsert: None when compiled is off)
        add, fallback = kernel.add, kernel.fallback

        def counted_add(batch):
            self.adds += 1
            return add(batch)

        def counted_fallback(batch):
            self.left += 1
            return fallback(batch)

        storage._writer, kernel.fallback = counted_add, counted_fallback  # (the writer an add calls)

    @property
    def taken(self) -> int:
        return self.adds - self.left


class LeftToPython(Exception):
    """Raised by :func:`left_to_python`'s fallback: the compiled insert did not take the batch."""


def left_to_python(storage: FrameStorage, batch: TransitionBatch) -> bool:
    """Whether the compiled insert leaves ``batch`` to the Python path (then it has changed nothing: see callers)."""
    kernel = storage._kernel
    fallback = kernel.fallback

    def refuse(batch):
        raise LeftToPython

    kernel.fallback = refuse
    try:
        kernel.add(batch)
    except LeftToPython:
        return True
    finally:
        kernel.fallback = fallback
    return False


def synthetic_batches(seed: int, num_envs: int, stack: int, n: int, steps: int, p_end: float, alphabet: int, zero_pad):
    """Stacked 1-step (n = 1: rows of any envs, an env possibly several times, any order) or n-step transitions."""
    rng = np.random.default_rng(seed)
    frame = (2, 3)

    def new_frame():
        return np.full(frame, rng.integers(0, alphabet), dtype=np.uint8) + np.arange(6, dtype=np.uint8).reshape(frame)

    def fresh_stack():
        first = new_frame()
        pad = np.zeros_like(first) if zero_pad else first
        return np.stack([pad] * (stack - 1) + [first])

    stacks = [fresh_stack() for _ in range(num_envs)]

    def step(env: int):
        obs = stacks[env]
        nxt = np.concatenate([obs[1:], new_frame()[None]])
        end = rng.random() < p_end
        trunc = end and rng.random() < 0.5
        stacks[env] = fresh_stack() if end else nxt
        return obs, nxt, end and not trunc, trunc

    def batch_of(envs):
        rows = [step(e) for e in envs]
        return TransitionBatch(
            obs=np.stack([r[0] for r in rows]),
            action=rng.integers(0, 4, len(envs)),
            reward=rng.standard_normal(len(envs)).astype(np.float32),
            next_obs=np.stack([r[1] for r in rows]),
            terminated=np.array([r[2] for r in rows]),
            truncated=np.array([r[3] for r in rows]),
            discount=np.full(len(envs), 0.9, np.float32),
            env_id=np.asarray(envs, dtype=np.int64),
        )

    if n == 1:
        out = []
        for _ in range(steps):
            kind = rng.integers(0, 4)
            if kind < 2:  # a vector step: every env once, in order (the compiled insert's main case)
                envs = list(range(num_envs))
            elif kind == 2:  # some envs, any order
                envs = list(rng.permutation(num_envs)[: rng.integers(1, num_envs + 1)])
            else:  # an env several times (consecutive steps of it), interleaved with others
                envs = sorted(rng.integers(0, num_envs, rng.integers(1, 2 * num_envs + 1)).tolist())
                envs = [int(e) for e in rng.permutation(envs)] if rng.random() < 0.3 else envs
            out.append(batch_of(envs))
        return out

    class Vector:
        def __iter__(self):
            return self

        def __next__(self):
            return batch_of(list(range(num_envs)))

    nstep = NStepTransform(Vector(), n=n, gamma=0.9)
    return [next(nstep) for _ in range(steps)]


@compiled
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    num_envs=st.integers(1, 4),
    stack=st.integers(2, 4),
    n=st.sampled_from([1, 3]),
    capacity=st.integers(3, 40),
    extra=st.integers(0, 24),
    p_end=st.sampled_from([0.0, 0.05, 0.3]),
    alphabet=st.integers(1, 4),
    zero_pad=st.booleans(),
    check=st.sampled_from([False, True, None]),
    cut_every=st.sampled_from([0, 7]),
)
def test_compiled_insert_equals_python_path(
    seed, num_envs, stack, n, capacity, extra, p_end, alphabet, zero_pad, check, cut_every
):
    batches = synthetic_batches(seed, num_envs, stack, n, 40, p_end, alphabet, zero_pad)
    make = functools.partial(FrameStorage, capacity, stack_axis=0, n_step=n, extra_frames=extra, check=check)
    fast, pure = make(), make()
    fast.compiled, pure.compiled = True, False  # (True also under PTL_RL_PURE_PYTHON=1: the module is built)
    counting = Counting(fast)
    upstreams = (Numbered(n), Numbered(n))
    if check is None:  # trust from a numbered upstream (with cuts in its numbering)
        fast.bind_upstream(upstreams[0])
        pure.bind_upstream(upstreams[1])
    for i, batch in enumerate(batches):
        for up in upstreams:
            up.stream_seq += 2 if cut_every and i % cut_every == cut_every - 1 else 1
        outcomes = []
        for storage in (fast, pure):
            try:
                outcomes.append(("slots", storage.add(batch).tolist()))
            except ValueError as error:  # (frames too many for a tiny pool: both refuse alike)
                outcomes.append(("error", str(error)))
        assert outcomes[0] == outcomes[1], f"add {i}"
        assert_same(fast, pure, f"add {i}")
    assert_same_samples(fast, pure)
    if extra >= 8 * stack and p_end == 0.0 and capacity >= num_envs:  # (a batch larger than the ring: Python path)
        assert counting.taken > 0  # (the compiled insert did run in this example)


@compiled
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_compiled_insert_through_a_buffer_equals_python_path_and_env_record(mode, n, padding):
    """ExperienceSource -> NStepTransform -> ReplayBuffer.add (the compiled insert, check=None trusted), wrapping."""
    env = make_env(mode, padding)
    stream = NStepTransform(ExperienceSource(env, random_agent(3, 5), seed=2), n=n, gamma=0.9)
    recorded = []
    for _ in range(70):
        batch = next(stream)
        recorded.append((batch, stream.stream_seq))
    table = reference(recorders(env), n, False)
    make = functools.partial(FrameStorage, stack_axis=0, extra_frames=300)
    ups = (Numbered(n), Numbered(n))
    fast_buffer = ReplayBuffer(ups[0], 23, seed=0, storage=make)
    pure_buffer = ReplayBuffer(ups[1], 23, seed=0, storage=make)
    fast_buffer.storage.compiled, pure_buffer.storage.compiled = True, False
    counting = Counting(fast_buffer.storage)
    for i, (batch, seq) in enumerate(recorded):
        ups[0].stream_seq = ups[1].stream_seq = seq
        np.testing.assert_array_equal(fast_buffer.add(batch), pure_buffer.add(batch))
        assert_same(fast_buffer.storage, pure_buffer.storage, f"add {i}")
    assert counting.taken > len(recorded) // 3
    assert_same_samples(fast_buffer.storage, pure_buffer.storage)
    for _ in range(3):
        sampled = fast_buffer.sample(16)
        np.testing.assert_array_equal(sampled["obs"], pure_buffer.sample(16)["obs"])
        check_against_reference(sampled, table, False)


@compiled
def test_compiled_insert_is_left_for_layouts_it_does_not_cover():
    """Stacks on the last axis, Dict observations, a cast dtype: the Python path, same result as before."""
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 255, (2, 5, 5, 4), dtype=np.uint8)
    batch = TransitionBatch(
        obs=obs, next_obs=obs, action=np.zeros(2, np.int64), reward=np.zeros(2, np.float64),
        terminated=np.zeros(2, bool), truncated=np.zeros(2, bool), env_id=np.arange(2),
    )  # fmt: skip
    last_axis = FrameStorage(10, stack_axis=-1, n_step=1, check=False)
    last_axis.compiled = True
    last_axis.add(batch)
    assert left_to_python(last_axis, batch) and last_axis._kernel.state == "not covered"
    first_axis = FrameStorage(10, stack_axis=0, n_step=1, check=False)
    first_axis.compiled = True
    first_axis.add(batch)
    assert left_to_python(first_axis, batch)  # float64 rewards stored as float32
    assert first_axis.total_added == 2


@compiled
def test_the_kernel_takes_the_batch_dict_and_state_arrays_it_was_not_bound_with():
    """The kernel looks the bound keys up in the batch's dict itself: a key more or one missing is not covered
    (nothing written). It holds the state arrays of the bind; other ones (not rebound) are read for the call."""
    batches = synthetic_batches(4, 3, 4, 2, 40, 0.1, 3, False)
    make = functools.partial(FrameStorage, 30, stack_axis=0, n_step=2, extra_frames=100, check=False)
    fast, pure = make(), make()
    fast.compiled, pure.compiled = True, False
    counting = Counting(fast)
    for batch in batches[:10]:
        fast.add(batch), pure.add(batch)
    before = snapshot_of(fast)
    extra = TransitionBatch({**batches[10], "info": np.zeros(len(batches[10]))})
    missing = TransitionBatch({k: v for k, v in batches[10].items() if k != "reward"})
    for odd in (extra, missing):
        assert left_to_python(fast, odd)
        after = snapshot_of(fast)
        assert before.keys() == after.keys()
        for key in before:
            np.testing.assert_equal(after[key], before[key], err_msg=key)
    envs = fast._envs
    state = envs.state
    envs.state = EnvState(state.array.copy(), fast.stack, 2)  # (replaced without the kernel binding again)
    envs.spare = envs.state.spare()
    taken = counting.taken
    for i, batch in enumerate(batches[10:]):
        np.testing.assert_array_equal(fast.add(batch), pure.add(batch))
        assert_same(fast, pure, f"add {i}")
    assert counting.taken == taken + len(batches) - 10
    assert envs.state.array is not state.array and envs.spare.array is not state.array


@compiled
@pytest.mark.parametrize("check", [False, True])
def test_long_batches_of_few_envs_wrap_alike(check):
    """Batches of ~70 steps of 2 envs (an env many times: occurrence groups), wrapping a ring of 100."""
    rng = np.random.default_rng(1)
    make = functools.partial(FrameStorage, 100, stack_axis=0, n_step=1, extra_frames=500, check=check)
    fast, pure = make(), make()
    fast.compiled, pure.compiled = True, False
    counting = Counting(fast)
    stream = synthetic_batches(int(rng.integers(0, 1000)), 2, 3, 1, 400, 0.02, 3, False)
    for i in range(0, len(stream) - 35, 35):  # 35 batches of 1-4 rows joined into one (~70 rows)
        batch = TransitionBatch.concat(stream[i : i + 35])
        order = np.argsort(batch["env_id"], kind="stable")  # every row of env 0, then env 1: time order per env
        batch = batch.rows(order)
        np.testing.assert_array_equal(fast.add(batch), pure.add(batch))
        assert_same(fast, pure, f"batch at {i}")
    # checked, an env twice in a batch is left to the Python path: it backs up the pending stacks that the
    # env's second write overwrites, for a caller that rolls the add back (docs/design/pixel-replay.md)
    assert counting.taken > 3 if not check else counting.taken == 0
    assert_same_samples(fast, pure)


@compiled
def test_a_storage_with_a_kernel_copies_and_pickles():
    """The compiled kernel (a C object holding the arrays) is dropped on copy and bound again by the next add."""
    batches = synthetic_batches(2, 3, 4, 3, 30, 0.1, 3, False)
    storage = FrameStorage(50, stack_axis=0, n_step=3, check=False)
    storage.compiled = True
    for batch in batches[:15]:
        storage.add(batch)
    assert storage._kernel.state == "bound"
    twin = pickle.loads(pickle.dumps(storage))
    other = copy.deepcopy(storage)
    for batch in batches[15:]:
        for s in (storage, twin, other):
            s.add(batch)
    assert_same(twin, storage, "pickled")
    assert_same(other, storage, "deep-copied")
    assert twin._kernel.state == "bound"


@compiled
@pytest.mark.parametrize("check", [False, True])
def test_plain_unpickled_and_strided_arrays_store_alike(check):
    """Plain numpy arrays and arrays whose dtype is another object (unpickled, as AsyncSource delivers them) are
    read through the buffer protocol; strided fields go to the Python path: all store alike."""
    batches = synthetic_batches(5, 3, 4, 3, 60, 0.1, 3, False)
    make = functools.partial(FrameStorage, 40, stack_axis=0, n_step=3, extra_frames=200, check=check)
    in_place, exported, strided, pure = make(), make(), make(), make()
    for storage in (in_place, exported, strided):
        storage.compiled = True
    pure.compiled = False
    counts = Counting(in_place), Counting(exported), Counting(strided)
    for i, batch in enumerate(batches):
        unpickled = pickle.loads(pickle.dumps(batch))
        assert unpickled["action"].dtype is not batch["action"].dtype  # (else this tests nothing)
        spread = TransitionBatch({k: v for k, v in batch.items()})
        spread["reward"] = np.repeat(np.asarray(batch["reward"]), 2)[::2]  # equal values, not contiguous
        for storage, b in ((in_place, batch), (exported, unpickled), (strided, spread), (pure, batch)):
            storage.add(b)
        for storage in (in_place, exported, strided):
            assert_same(storage, pure, f"add {i}")
    # (a one-row strided field is contiguous all the same: those adds stay compiled)
    assert counts[0].taken > 10 and counts[1].taken > 10 and counts[2].taken < counts[0].taken // 2


def test_the_kernel_is_plain_c_on_buffers():
    """The C file reads no Python attribute and no numpy object layout: only buffers, integers, tuples and the
    batch's dict, looked up with key objects handed over at bind time (data, not names spelt in C).

    A rename in ``ptl_rl/replay/frames/`` cannot break the compiled path silently, and no numpy version is
    tied to the build (issue #22). Its arguments are checked when the kernel is built and on every insert.
    """
    source = (Path(frames_module.__file__).parent.parent / "_frame_insert.c").read_text()
    banned = ("GetAttr", "SetAttr", "PyArrayObject", "->descr", "numpy/", "GetItemString", "FromString", "_Py_ID")
    for name in banned:
        assert name not in source, name
    # every string literal is a format code, a method, module or target name, never a key or an attribute
    literals = set(re.findall(r'"(_?[a-z_]+)"', source))
    assert literals <= {"l", "q", "insert", "_frame_insert", "avx"}, literals


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 50), counts=st.lists(st.integers(1, 60), min_size=1, max_size=6))
def test_slot_windows_give_the_wrapped_slots_of_every_count_and_cursor(capacity, counts):
    """The compiled insert's slots, windows[count][cursor], equal (cursor + arange(count)) % capacity, read-only,
    and a window made before a larger count grew the shared array stays right."""
    windows = _SlotWindows(capacity)
    made = []
    for count in counts:
        count = min(count, capacity)  # (the kernel writes at most capacity rows)
        made.append((count, windows[count]))
        for earlier_count, window in made:
            assert window is windows[earlier_count]
            for cursor in range(capacity):
                np.testing.assert_array_equal(window[cursor], (cursor + np.arange(earlier_count)) % capacity)
    assert not windows[made[0][0]][0].flags.writeable

"""SumTree and PrioritizedReplayBuffer against direct reference computations."""

from __future__ import annotations

import io

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stats import SIGNIFICANCE, chi_square_quantile, chi_square_statistic

from ptl_rl import (
    BatchSampler,
    LinearSchedule,
    PrioritizedReplayBuffer,
    SumTree,
    TransitionBatch,
    to_dataloader,
)
from ptl_rl.replay import sumtree as sumtree_module

EPS = 1e-6
KERNEL = sumtree_module._sumtree_kernel
# the numpy loops always; the compiled ones where setup.py built them (CI builds them: gcc is there)
TREE_PATHS = [False] + ([True] if KERNEL is not None else [])


def make_tree(capacity: int, top_width: int, compiled: bool) -> SumTree:
    tree = SumTree(capacity, top_width=top_width)
    tree.compiled = compiled
    return tree


# ---------------------------------------------------------------------- helpers
def transitions(n: int, start: int = 0) -> TransitionBatch:
    """``n`` CartPole-shaped transitions; ``action`` holds a running id (start, start+1, ...)."""
    ids = np.arange(start, start + n)
    return TransitionBatch(
        obs=np.repeat(ids[:, None], 4, axis=1).astype(np.float32),
        action=ids.astype(np.int64),
        reward=np.ones(n, dtype=np.float32),
        next_obs=np.zeros((n, 4), dtype=np.float32),
        terminated=np.zeros(n, dtype=bool),
        truncated=np.zeros(n, dtype=bool),
        discount=np.full(n, 0.99, dtype=np.float32),
        env_id=np.zeros(n, dtype=np.int64),
    )


class ReferencePER:
    """A direct, loop-based model of the buffer's priorities: slot -> leaf, and the ring's bookkeeping."""

    def __init__(self, capacity: int, alpha: float) -> None:
        self.capacity, self.alpha = capacity, alpha
        self.leaf = np.zeros(capacity)
        self.gen = np.full(capacity, -1)
        self.size = self.cursor = self.added = 0

    def add(self, n: int) -> None:
        written = [(self.cursor + i) % self.capacity for i in range(min(n, self.capacity))]
        kept = [s for s in range(self.size) if s not in written]
        best = max((self.leaf[s] for s in kept), default=0.0) or 1.0
        skip = max(0, n - self.capacity)
        for i, s in enumerate(written):
            self.leaf[s] = best
            self.gen[s] = self.added + skip + i
        self.added += n
        self.cursor = (self.cursor + len(written)) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def update(self, idx: np.ndarray, prio: np.ndarray, gens: np.ndarray) -> int:
        stale = 0
        for i, p, g in zip(idx, prio, gens, strict=True):
            if self.gen[i] != g:
                stale += 1
                continue
            self.leaf[i] = (p + EPS) ** self.alpha
        return stale


def assert_tree_invariants(tree: SumTree) -> None:
    w = tree.width
    for level in range(tree.top_level, tree.depth):
        lo, hi = 1 << level, 2 << level
        np.testing.assert_array_equal(
            tree.sums[lo:hi], tree.sums[2 * lo : 2 * hi : 2] + tree.sums[2 * lo + 1 : 2 * hi : 2]
        )
        np.testing.assert_array_equal(
            tree.maxes[lo:hi], np.maximum(tree.maxes[2 * lo : 2 * hi : 2], tree.maxes[2 * lo + 1 : 2 * hi : 2])
        )
    assert (tree.sums[w + tree.capacity :] == 0).all()


# ---------------------------------------------------------------------- sum-tree
tree_ops = st.lists(
    st.tuples(
        st.lists(st.integers(0, 10_000), min_size=0, max_size=40),
        st.lists(st.sampled_from([0.0, 1e-9, 0.5, 1.0, 3.0, 1e6]) | st.floats(0, 100), min_size=40, max_size=40),
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.parametrize("compiled", TREE_PATHS, ids=lambda c: "compiled" if c else "numpy")
@settings(max_examples=60, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 300), top_width=st.sampled_from([1, 2, 8, 2048]), ops=tree_ops, data=st.data())
def test_sum_tree_matches_a_reference_under_random_updates(compiled, capacity, top_width, ops, data) -> None:
    tree = make_tree(capacity, top_width, compiled)
    ref = np.zeros(capacity)
    for raw, values in ops:
        idx = np.array([i % capacity for i in raw], dtype=np.int64)
        vals = np.array(values[: len(idx)])
        tree.update(idx, vals)
        for i, v in zip(idx, vals, strict=True):  # later duplicates win, as documented
            ref[i] = v
        assert_tree_invariants(tree)
        np.testing.assert_array_equal(tree.leaves, ref)
        assert tree.total == pytest.approx(ref.sum(), rel=1e-12, abs=1e-300)
        assert tree.max == ref.max()
        lo = data.draw(st.integers(0, capacity))
        hi = data.draw(st.integers(lo, capacity))
        assert tree.range_max(lo, hi) == (ref[lo:hi].max() if hi > lo else 0.0)
        if ref.sum() > 0:
            check_find(tree, ref, np.random.default_rng(len(ops)))


def check_find(tree: SumTree, ref: np.ndarray, rng: np.random.Generator) -> None:
    cum = np.cumsum(ref)
    total = tree.total
    # random targets, every boundary of the prefix sums, and the extremes
    targets = np.concatenate([rng.random(64) * total, cum[:-1], [0.0, total, np.nextafter(total, 0), total * 2]])
    leaves = tree.find(targets)
    assert leaves.dtype == np.int64
    assert (ref[leaves] > 0).all(), "find returned an absent (zero) leaf"
    clipped = np.clip(targets, 0, np.nextafter(total, 0))
    lower = cum[leaves] - ref[leaves]
    tol = 1e-9 * total
    assert (lower - tol <= clipped).all() and (clipped < cum[leaves] + tol).all()


@pytest.mark.parametrize("compiled", TREE_PATHS, ids=lambda c: "compiled" if c else "numpy")
@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    capacity=st.integers(2, 20_000),
    present=st.floats(0.001, 0.5),
    seed=st.integers(0, 2**16),
)
def test_find_never_returns_an_absent_leaf_even_at_rounding_edges(compiled, capacity, present, seed) -> None:
    rng = np.random.default_rng(seed)
    values = np.where(rng.random(capacity) < present, rng.choice([1e-12, 1e-3, 1.0, 1e9], capacity), 0.0)
    values[rng.integers(capacity)] = 0.1  # at least one present leaf
    tree = make_tree(capacity, int(rng.choice([1, 4, 2048])), compiled)
    tree.set_all(values)
    assert_tree_invariants(tree)
    cum = np.cumsum(values)
    edges = np.concatenate([cum, np.nextafter(cum, 0), np.nextafter(cum, np.inf), rng.random(200) * tree.total])
    found = tree.find(edges)
    assert (values[found] > 0).all()


@pytest.mark.skipif(KERNEL is None, reason="the compiled sum-tree loops are not built")
@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    capacity=st.integers(1, 5000),
    top_width=st.sampled_from([1, 2, 16, 1024]),
    seed=st.integers(0, 2**16),
    stratified=st.booleans(),
)
def test_compiled_loops_give_the_numpy_trees_and_draws_bit_for_bit(capacity, top_width, seed, stratified) -> None:
    rng = np.random.default_rng(seed)
    trees = [make_tree(capacity, top_width, compiled) for compiled in (False, True)]
    for _ in range(6):
        idx = rng.integers(0, capacity, rng.integers(1, 300))  # repeated slots included: the last value wins
        values = np.where(rng.random(len(idx)) < 0.2, 0.0, rng.exponential(size=len(idx)) ** 3)
        uniform = rng.random(128)
        for tree in trees:
            tree.update(idx, values)
        np.testing.assert_array_equal(trees[0].sums, trees[1].sums)
        np.testing.assert_array_equal(trees[0].maxes, trees[1].maxes)
        if trees[0].total > 0:
            draws = [tree.sample(uniform.copy(), stratified) for tree in trees]
            np.testing.assert_array_equal(draws[0][0], draws[1][0])
            np.testing.assert_array_equal(draws[0][1], draws[1][1])


@pytest.mark.skipif(KERNEL is None, reason="the compiled sum-tree loops are not built")
def test_compiled_loops_refuse_wrong_arrays_instead_of_writing_outside_the_tree() -> None:
    sums, maxes = np.zeros(16), np.zeros(16)
    with pytest.raises(IndexError, match="outside the tree"):
        KERNEL.repair(sums, maxes, np.array([16], dtype=np.int64), 2)
    with pytest.raises(IndexError, match="outside the tree"):
        KERNEL.descend(sums, np.array([4], dtype=np.int64), np.zeros(1), 2)  # 4 << 2 reaches past node 15
    with pytest.raises(TypeError, match="int64"):
        KERNEL.repair(sums, maxes, np.array([9], dtype=np.int32), 2)
    with pytest.raises(TypeError, match="float64"):
        KERNEL.descend(sums.astype(np.float32), np.array([2], dtype=np.int64), np.zeros(1), 2)
    assert not sums.any() and not maxes.any()


def test_forcing_the_compiled_loops_where_they_are_not_built_names_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(sumtree_module, "_sumtree_kernel", None)
    tree = SumTree(8)
    assert not tree.compiled
    with pytest.raises(RuntimeError, match="C compiler"):
        tree.compiled = True


def test_find_on_an_empty_tree_raises() -> None:
    with pytest.raises(ValueError, match="empty tree"):
        SumTree(8).find(np.array([0.0]))


# ---------------------------------------------------------------------- sampling frequencies
per_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 60)),
        st.tuples(st.just("update"), st.integers(1, 64), st.integers(0, 2**16)),
        st.tuples(st.just("stale"), st.integers(1, 64), st.integers(0, 2**16)),
    ),
    min_size=1,
    max_size=10,
)


def run_ops(buffer: PrioritizedReplayBuffer, ref: ReferencePER, ops) -> None:
    """Apply adds, updates of a fresh sample, and updates after the sampled slots may have been overwritten."""
    next_id = 0
    for op in ops:
        if op[0] == "add":
            buffer.add(transitions(op[1], next_id))
            ref.add(op[1])
            next_id += op[1]
            continue
        if len(buffer) == 0:
            continue
        batch = buffer.sample(min(op[1], len(buffer)))
        rng = np.random.default_rng(op[2])
        prio = rng.choice([0.0, 0.01, 1.0, 7.0, 250.0], len(batch)) * rng.random(len(batch))
        if op[0] == "stale":  # overwrite some slots between sampling and updating
            extra = int(rng.integers(1, buffer.capacity + 1))
            buffer.add(transitions(extra, next_id))
            ref.add(extra)
            next_id += extra
        stale = buffer.update_priorities(batch["indices"], prio, batch["generations"])
        assert stale == ref.update(batch["indices"], prio, batch["generations"])


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(1, 120),
    alpha=st.sampled_from([0.0, 0.5, 0.6, 1.0, 2.0]),
    stratified=st.booleans(),
    ops=per_ops,
)
def test_sampling_frequencies_are_proportional_to_priority_to_the_alpha(capacity, alpha, stratified, ops) -> None:
    buffer = PrioritizedReplayBuffer(capacity=capacity, alpha=alpha, warmup=0, seed=7, stratified=stratified)
    ref = ReferencePER(capacity, alpha)
    run_ops(buffer, ref, [("add", 1), *ops])
    np.testing.assert_allclose(buffer.draws.priorities(), ref.leaf[: ref.size], rtol=1e-12)
    np.testing.assert_array_equal(buffer.draws.generations[: ref.size], ref.gen[: ref.size])

    counts = np.zeros(capacity)
    for _ in range(80):  # 80 batches of up to 500: 40k draws for the larger buffers
        np.add.at(counts, buffer.sample(min(500, len(buffer)))["indices"], 1)
    probs = ref.leaf / ref.leaf.sum()
    assert counts[ref.size :].sum() == 0
    stat, dof = chi_square_statistic(counts, probs)
    if dof >= 1:
        assert stat < chi_square_quantile(dof, SIGNIFICANCE), (stat, dof)


def test_chi_square_detects_a_biased_sampler() -> None:
    """The frequency test has power: sampling by p instead of p**alpha is rejected."""
    rng = np.random.default_rng(0)
    p = np.linspace(0.1, 2.0, 50) ** 0.6
    wrong = np.linspace(0.1, 2.0, 50)
    counts = np.bincount(rng.choice(50, 40_000, p=wrong / wrong.sum()), minlength=50).astype(float)
    stat, dof = chi_square_statistic(counts, p / p.sum())
    assert stat > chi_square_quantile(dof, SIGNIFICANCE)
    right = np.bincount(rng.choice(50, 40_000, p=p / p.sum()), minlength=50).astype(float)
    assert chi_square_statistic(right, p / p.sum())[0] < chi_square_quantile(dof, SIGNIFICANCE)


def test_chi_square_quantile_matches_table_values() -> None:
    # standard chi-square table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4)
    assert chi_square_quantile(1, 0.05) == pytest.approx(3.841, abs=1e-3)
    assert chi_square_quantile(10, 0.05) == pytest.approx(18.307, abs=1e-3)
    assert chi_square_quantile(10, 1e-3) == pytest.approx(29.588, abs=1e-3)
    assert chi_square_quantile(100, 0.01) == pytest.approx(135.807, abs=1e-3)


# ---------------------------------------------------------------------- weights and beta
@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    capacity=st.integers(2, 200),
    alpha=st.sampled_from([0.0, 0.4, 1.0]),
    beta=st.sampled_from([0.0, 0.4, 1.0]),
    ops=per_ops,
)
def test_importance_weights_equal_a_direct_computation(capacity, alpha, beta, ops) -> None:
    buffer = PrioritizedReplayBuffer(capacity=capacity, alpha=alpha, beta=beta, warmup=0, seed=3)
    ref = ReferencePER(capacity, alpha)
    run_ops(buffer, ref, [("add", 2), *ops])
    batch = buffer.sample(min(32, len(buffer)))
    probs = ref.leaf[: ref.size] / ref.leaf[: ref.size].sum()
    w = (ref.size * probs[batch["indices"]]) ** -beta
    expected = w / w.max()  # normalised by the largest weight in the batch
    assert batch["weights"].dtype == np.float32
    np.testing.assert_allclose(batch["weights"], expected, rtol=1e-5)
    assert batch["weights"].max() == pytest.approx(1.0)


def test_beta_anneals_on_the_learner_clock_and_on_the_env_clock() -> None:
    learner = PrioritizedReplayBuffer(capacity=100, beta=LinearSchedule(0.4, 1.0, 10), warmup=0)
    learner.add(transitions(20))
    assert learner.draws.beta == pytest.approx(0.4)
    for _ in range(5):
        learner.sample(4)
    assert learner.draws.beta == pytest.approx(0.7)
    for _ in range(20):
        learner.sample(4)
    assert learner.draws.beta == pytest.approx(1.0)

    env = PrioritizedReplayBuffer(capacity=100, beta=LinearSchedule(0.5, 1.0, 100), beta_clock="env", warmup=0)
    env.add(transitions(50))
    env.sample(4)
    assert env.draws.beta == pytest.approx(0.75)


def test_weights_use_the_beta_of_the_schedule_at_sampling_time() -> None:
    buffer = PrioritizedReplayBuffer(capacity=10, alpha=1.0, beta=LinearSchedule(0.0, 1.0, 1), warmup=0, seed=0)
    buffer.add(transitions(10))
    buffer.update_priorities(np.arange(10), np.arange(1, 11, dtype=float))
    assert (buffer.sample(10)["weights"] == 1.0).all()  # beta 0 at step 0
    second = buffer.sample(10)  # beta 1
    leaves = buffer.draws.priorities(second["indices"])
    np.testing.assert_allclose(second["weights"], leaves.min() / leaves, rtol=1e-6)


# ---------------------------------------------------------------------- new items, stale updates
def test_new_items_get_the_max_priority_currently_stored_not_a_historical_max() -> None:
    buffer = PrioritizedReplayBuffer(capacity=4, alpha=1.0, warmup=0)
    buffer.add(transitions(4))
    buffer.update_priorities(np.arange(4), np.array([100.0, 2.0, 3.0, 1.0]))
    buffer.add(transitions(1, 4))  # overwrites slot 0, the one holding 100: max among the rest is 3
    assert buffer.draws.priorities()[0] == pytest.approx(3.0 + EPS)
    buffer.update_priorities([0, 1, 2, 3], [0.5, 0.5, 0.5, 0.5])
    buffer.add(transitions(2, 5))
    np.testing.assert_allclose(buffer.draws.priorities(), [0.5 + EPS] * 4)


def test_an_empty_buffer_starts_new_items_at_priority_one() -> None:
    buffer = PrioritizedReplayBuffer(capacity=8, alpha=0.6, warmup=0)
    buffer.add(transitions(3))
    np.testing.assert_array_equal(buffer.draws.priorities(), [1.0, 1.0, 1.0])
    buffer.add(transitions(20))  # more rows than capacity: nothing older survives
    np.testing.assert_array_equal(buffer.draws.priorities(), np.ones(8))


def test_a_stale_update_does_not_change_the_new_items_priority() -> None:
    buffer = PrioritizedReplayBuffer(capacity=8, alpha=1.0, warmup=0, seed=1)
    buffer.add(transitions(8))
    batch = buffer.sample(8)
    buffer.add(transitions(3, 8))  # overwrites slots 0, 1, 2
    before = buffer.draws.priorities()
    stale = batch.update_priorities(np.full(8, 50.0))
    overwritten = np.isin(batch["indices"], [0, 1, 2])
    assert stale == overwritten.sum() > 0
    assert buffer.draws.stale_updates == stale
    after = buffer.draws.priorities()
    np.testing.assert_array_equal(after[[0, 1, 2]], before[[0, 1, 2]])
    fresh = np.unique(batch["indices"][~overwritten])
    np.testing.assert_allclose(after[fresh], 50.0 + EPS)


# ---------------------------------------------------------------------- bad input
def snapshot(buffer: PrioritizedReplayBuffer) -> tuple[np.ndarray, ...]:
    return buffer.draws.tree.sums.copy(), buffer.draws.tree.maxes.copy(), buffer.draws.generations.copy()


@pytest.mark.parametrize(
    "indices, priorities, generations, message",
    [
        ([0, 1, 2], [1.0, np.nan, 1.0], None, "finite"),
        ([0, 1, 2], [1.0, np.inf, 1.0], None, "finite"),
        ([0, 1, 2], [1.0, -0.5, 1.0], None, r">= 0.*td.abs\(\)"),
        ([0, 1, 2], [1.0, 1.0], None, "2 priorities .* 3 rows"),
        ([0, 1, 2], [[1.0, 2.0, 3.0]], None, "shape"),
        ([0, 1, 99], [1.0, 1.0, 1.0], None, "slots in"),
        ([0, -1, 2], [1.0, 1.0, 1.0], None, "slots in"),
        ([0, 1, 2], [1.0, 1.0, 1.0], [0, 1], "generations"),
        ([0, 1, 2], [1e300, 1.0, 1.0], None, "overflows"),
    ],
)
def test_bad_priorities_raise_a_clear_error_and_leave_the_tree_unchanged(
    indices, priorities, generations, message
) -> None:
    buffer = PrioritizedReplayBuffer(capacity=16, alpha=2.0, warmup=0)
    buffer.add(transitions(10))
    buffer.update_priorities(np.arange(10), np.linspace(0.1, 3, 10))
    before = snapshot(buffer)
    with pytest.raises(ValueError, match=message):
        buffer.update_priorities(indices, priorities, generations)
    for a, b in zip(before, snapshot(buffer), strict=True):
        np.testing.assert_array_equal(a, b)


def test_wrong_number_of_td_errors_through_the_batch_leaves_the_tree_unchanged() -> None:
    buffer = PrioritizedReplayBuffer(capacity=16, warmup=0, seed=0)
    buffer.add(transitions(16))
    batch = buffer.sample(8).to_torch()
    before = snapshot(buffer)
    with pytest.raises(ValueError, match="7 priorities"):
        batch.update_priorities(torch.ones(7))
    with pytest.raises(ValueError, match="finite"):
        batch.update_priorities(torch.tensor([1.0] * 7 + [float("nan")]))
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        batch.update_priorities(torch.ones(8, 3))
    for a, b in zip(before, snapshot(buffer), strict=True):
        np.testing.assert_array_equal(a, b)


def test_invalid_construction_arguments_raise() -> None:
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplayBuffer(capacity=4, alpha=-1, warmup=0)
    with pytest.raises(ValueError, match="eps"):
        PrioritizedReplayBuffer(capacity=4, eps=0.0, warmup=0)
    with pytest.raises(ValueError, match="beta_clock"):
        PrioritizedReplayBuffer(capacity=4, beta_clock="wall", warmup=0)
    buffer = PrioritizedReplayBuffer(capacity=4, warmup=0)
    with pytest.raises(ValueError, match="cannot be stored"):
        buffer.add(TransitionBatch(obs=np.zeros((2, 1)), weights=np.zeros(2)))


# ---------------------------------------------------------------------- feedback through torch
def test_batch_feedback_survives_to_torch_to_device_and_rows() -> None:
    buffer = PrioritizedReplayBuffer(capacity=32, alpha=1.0, warmup=0, seed=0)
    buffer.add(transitions(32))
    batch = buffer.sample(6)
    moved = batch.to_torch().to(torch.device("cpu"))
    assert set(moved.keys()) >= {"indices", "weights", "generations"}
    assert moved.indices.dtype == torch.int64 and moved.weights.dtype == torch.float32
    td = torch.tensor([-1.0, 2.0, -3.0, 4.0, 5.0, -6.0], dtype=torch.float64)
    assert moved.update_priorities(td) == 0
    # numpy input, [B, 1] shape and a row subset through rows()
    batch = buffer.sample(6)
    sub = batch.to_torch().rows(torch.tensor([True, False, True, False, False, False]))
    sub.update_priorities(np.array([[7.0], [9.0]]))
    np.testing.assert_allclose(buffer.draws.priorities(batch["indices"][[0, 2]]), [7.0 + EPS, 9.0 + EPS])
    half = buffer.sample(6).to_torch().to("cpu").rows(slice(0, 3))
    half.update_priorities(torch.full((3,), 2.0, dtype=torch.bfloat16))
    np.testing.assert_allclose(buffer.draws.priorities(half.indices.numpy()), 2.0 + EPS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_td_errors_on_the_gpu_are_accepted() -> None:
    buffer = PrioritizedReplayBuffer(capacity=32, alpha=1.0, warmup=0, seed=0)
    buffer.add(transitions(32))
    batch = buffer.sample(8).to_torch().to("cuda")
    batch.update_priorities(torch.full((8,), 3.0, device="cuda"))
    np.testing.assert_allclose(buffer.draws.priorities(batch.indices.cpu().numpy()), 3.0 + EPS)


def test_a_uniform_batch_has_no_priorities_to_update() -> None:
    from ptl_rl import ReplayBuffer

    buffer = ReplayBuffer(capacity=8, warmup=0)
    buffer.add(transitions(8))
    with pytest.raises(TypeError, match="not sampled from a prioritized buffer"):
        buffer.sample(4).to_torch().update_priorities(torch.ones(4))


def endless_transitions(per_step: int = 4):
    step = 0
    while True:
        yield transitions(per_step, step)
        step += per_step


class TDModule(pl.LightningModule):
    """Feeds |obs[:, 0] - 3| back as priority from training_step, through the DataLoader adapter."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen_weights: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        pred = self.layer(batch.obs).squeeze(-1)
        td = pred - batch.reward
        self.seen_weights.append(batch.weights)
        batch.update_priorities(td.detach())
        return (batch.weights * td**2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def test_priorities_flow_back_from_training_step_through_lightning() -> None:
    buffer = PrioritizedReplayBuffer(endless_transitions(), capacity=200, warmup=64, transitions_per_yield=4, seed=0)
    sampler = BatchSampler(buffer, batch_size=16)
    module = TDModule()
    trainer = pl.Trainer(
        max_steps=6,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=to_dataloader(sampler, steps_per_epoch=3))
    assert buffer.draws.applied_updates + buffer.draws.stale_updates == 6 * 16
    assert len(module.seen_weights) == 6
    assert not np.allclose(buffer.draws.priorities(), 1.0)


# ---------------------------------------------------------------------- state
def test_state_round_trip_restores_priorities_generations_and_rng() -> None:
    buffer = PrioritizedReplayBuffer(capacity=50, alpha=0.7, beta=LinearSchedule(0.4, 1.0, 100), warmup=0, seed=5)
    rng = np.random.default_rng(0)
    buffer.add(transitions(70))
    for _ in range(5):
        batch = buffer.sample(16)
        buffer.add(transitions(3, 100))
        batch.update_priorities(rng.normal(size=16))
    blob = io.BytesIO()
    torch.save(buffer.state_dict(), blob)
    blob.seek(0)
    state = torch.load(blob, weights_only=True)

    restored = PrioritizedReplayBuffer(capacity=50, alpha=0.7, beta=LinearSchedule(0.4, 1.0, 100), warmup=0, seed=99)
    restored.load_state_dict(state)
    np.testing.assert_array_equal(restored.draws.priorities(), buffer.draws.priorities())
    np.testing.assert_array_equal(restored.draws.generations, buffer.draws.generations)
    np.testing.assert_array_equal(restored.draws.tree.sums, buffer.draws.tree.sums)
    np.testing.assert_array_equal(restored.draws.tree.maxes, buffer.draws.tree.maxes)
    assert restored.draws.stale_updates == buffer.draws.stale_updates and restored.draws.beta == buffer.draws.beta
    for _ in range(3):
        a, b = buffer.sample(16), restored.sample(16)
        np.testing.assert_array_equal(a["indices"], b["indices"])
        np.testing.assert_array_equal(a["weights"], b["weights"])
        np.testing.assert_array_equal(a["action"], b["action"])
        td = rng.normal(size=16)
        a.update_priorities(td)
        b.update_priorities(td)
    # the next insert lands on the same slot with the same stamp and priority
    np.testing.assert_array_equal(buffer.add(transitions(2, 500)), restored.add(transitions(2, 500)))
    np.testing.assert_array_equal(restored.draws.priorities(), buffer.draws.priorities())


def test_loading_a_state_with_another_alpha_raises() -> None:
    buffer = PrioritizedReplayBuffer(capacity=8, alpha=0.5, warmup=0)
    buffer.add(transitions(4))
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplayBuffer(capacity=8, alpha=0.6, warmup=0).load_state_dict(buffer.state_dict())


def test_prioritized_buffer_works_as_a_pipeline_stage() -> None:
    buffer = PrioritizedReplayBuffer(endless_transitions(2), capacity=40, warmup=10, transitions_per_yield=2, seed=0)
    stage = iter(buffer)
    assert next(stage) is buffer and len(buffer) == 10
    next(stage)
    assert len(buffer) == 12
    batch = next(iter(BatchSampler(buffer, batch_size=8)))
    assert batch.obs.shape == (8, 4) and batch.weights.shape == (8,)

"""HERReplayBuffer against brute force: which steps may be drawn, which goals each may get, and with what reward.

Every row names itself: ``action`` is its running number, and its
observation holds ``(env, episode, t)`` (``next_obs``: ``t + 1``), so the
achieved goal of step ``k`` of an episode is ``(env, episode, k + 1)``. The
reference is computed from the rows added, independently of the buffer: a
step is sampleable when its episode ended (a ``terminated``/``truncated``
row, or a cut) and every step of the episode is among the last ``capacity``
rows added.
"""

from __future__ import annotations

import io
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stats import SIGNIFICANCE, chi_square_quantile, chi_square_statistic
from test_robustness import Injector

from ptl_rl import ExperienceSource, HERReplayBuffer, NStepTransform, TransitionBatch

STRATEGIES = ("future", "final", "episode")
ORIGINAL_GOAL = -1.0
STORED_REWARD = -5.0


def distance_reward(achieved: np.ndarray, desired: np.ndarray, info: dict) -> np.ndarray:
    """A reward that tells goals apart: minus the L1 distance (float32 [R])."""
    assert info == {}
    return -np.abs(achieved - desired).sum(-1).astype(np.float32)


def reached(achieved: np.ndarray, desired: np.ndarray, info: dict) -> np.ndarray:
    return (achieved == desired).all(-1)


# ---------------------------------------------------------------------- recorded episodes
def build_rows(ends: list[list[int]], batch_sizes: list[int], lockstep: bool, seed: int) -> list[list[dict]]:
    """Rows of several envs in batches (time order kept per env).

    ``ends[env]`` lists per row 0 (the episode goes on), 1 (terminated), 2 (truncated) or 3 (both). With
    ``lockstep`` every batch holds the next row of each env that has one (a vector env step); otherwise the rows
    are interleaved at random and cut into batches of ``batch_sizes`` (cycled).
    """
    rng = np.random.default_rng(seed)
    per_env = [[dict(env=env, end=end) for end in env_ends] for env, env_ends in enumerate(ends)]
    if lockstep:
        longest = max(map(len, per_env))
        return [[rows[i] for rows in per_env if i < len(rows)] for i in range(longest)]
    turns = np.concatenate([np.full(len(rows), env) for env, rows in enumerate(per_env)])
    rng.shuffle(turns)
    position = [0] * len(per_env)
    flat = []
    for env in turns:
        flat.append(per_env[env][position[env]])
        position[env] += 1
    batches, lo, i = [], 0, 0
    while lo < len(flat):
        size = batch_sizes[i % len(batch_sizes)]
        batches.append(flat[lo : lo + size])
        lo, i = lo + size, i + 1
    return batches


def number_episodes(batches: list[list[dict]], cuts: set[int]) -> list[dict]:
    """Give every row its running number, episode and step; a cut before batch ``i`` ends every running episode."""
    episode_of: dict[int, int] = {}
    step_of: dict[int, int] = {}
    episodes = 0
    rows = []
    for i, batch in enumerate(batches):
        if i in cuts:
            step_of = {env: 0 for env in step_of}
        for row in batch:
            env = row["env"]
            if step_of.get(env, 0) == 0:
                episode_of[env], episodes = episodes, episodes + 1
            row.update(number=len(rows), episode=episode_of[env], t=step_of.get(env, 0), batch=i)
            step_of[env] = 0 if row["end"] else row["t"] + 1
            rows.append(row)
    return rows


def as_batch(rows: list[dict]) -> TransitionBatch:
    n = len(rows)
    ids = np.array([[r["env"], r["episode"], r["t"]] for r in rows], dtype=np.float32).reshape(n, 3)
    after = ids + np.array([0, 0, 1], dtype=np.float32)
    end = np.array([r["end"] for r in rows], dtype=np.int64)
    goal = np.full((n, 3), ORIGINAL_GOAL, dtype=np.float32)
    return TransitionBatch(
        obs={"observation": ids, "achieved_goal": ids.copy(), "desired_goal": goal},
        action=np.array([r["number"] for r in rows], dtype=np.int64),
        reward=np.full(n, STORED_REWARD, dtype=np.float32),
        next_obs={"observation": after, "achieved_goal": after.copy(), "desired_goal": goal.copy()},
        terminated=(end & 1).astype(bool),
        truncated=(end & 2).astype(bool),
        discount=np.full(n, 0.9, dtype=np.float32),
        env_id=np.array([r["env"] for r in rows], dtype=np.int64),
    )


def reference_episodes(rows: list[dict], capacity: int, cuts: set[int], closed_at_end: bool) -> dict[int, list[dict]]:
    """The complete episodes (their rows in time order) once all ``rows`` are added, by brute force."""
    episodes: dict[int, list[dict]] = {}
    for row in rows:
        episodes.setdefault(row["episode"], []).append(row)
    stored_from = len(rows) - capacity
    complete = {}
    for episode, steps in episodes.items():
        # ended: by its last row's flags, by a cut after its last row, or by the close at the end
        ended = bool(steps[-1]["end"]) or any(cut > steps[-1]["batch"] for cut in cuts) or closed_at_end
        if ended and steps[0]["number"] >= stored_from:
            complete[episode] = steps
    return complete


def fill(buffer: HERReplayBuffer, batches: list[list[dict]], cuts: set[int]) -> None:
    for i, batch in enumerate(batches):
        if i in cuts:
            buffer.end_episodes()
        buffer.add(as_batch(batch))


layouts = st.fixed_dictionaries(
    {
        "ends": st.lists(
            st.lists(st.sampled_from([0, 0, 0, 0, 1, 2, 3]), min_size=1, max_size=25), min_size=1, max_size=4
        ),
        "batch_sizes": st.lists(st.integers(1, 7), min_size=1, max_size=4),
        "lockstep": st.booleans(),
        "seed": st.integers(0, 2**16),
        "capacity": st.integers(3, 40),
        "cuts": st.sets(st.integers(1, 12), max_size=2),
        "close_at_end": st.booleans(),
    }
)


def build(layout: dict, strategy: str, **kwargs) -> tuple[HERReplayBuffer, list[dict], dict[int, list[dict]]]:
    batches = build_rows(layout["ends"], layout["batch_sizes"], layout["lockstep"], layout["seed"])
    cuts = {c for c in layout["cuts"] if c < len(batches)}
    rows = number_episodes(batches, cuts)
    buffer = HERReplayBuffer(
        None, layout["capacity"], compute_reward=distance_reward, strategy=strategy, seed=layout["seed"], **kwargs
    )
    fill(buffer, batches, cuts)
    if layout["close_at_end"]:
        buffer.end_episodes()
    return buffer, rows, reference_episodes(rows, layout["capacity"], cuts, layout["close_at_end"])


def eligible_steps(strategy: str, t: int, length: int) -> range:
    return {"future": range(t, length), "final": range(length - 1, length), "episode": range(length)}[strategy]


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts, strategy=st.sampled_from(STRATEGIES), terminal=st.booleans())
def test_sampled_rows_and_goals_match_brute_force(layout, strategy, terminal):
    kwargs = {"compute_terminated": reached} if terminal else {}
    buffer, rows, complete = build(layout, strategy, n_sampled_goal=3, **kwargs)
    by_number = {row["number"]: row for row in rows}
    sampleable = {row["number"] for steps in complete.values() for row in steps}

    # the drawable slots are exactly the steps of complete episodes, and each lists its episode in time order
    stored = buffer.storage.gather(np.arange(len(buffer)))["action"]
    drawable = np.flatnonzero(buffer.draws.episodes.length[: len(buffer)] > 0)
    assert set(stored[drawable].tolist()) == sampleable
    assert buffer.draws.num_sampleable == len(sampleable)
    for slot in drawable:
        episode = complete[by_number[int(stored[slot])]["episode"]]
        assert stored[buffer.draws.episodes.episode_slots(slot)].tolist() == [r["number"] for r in episode]
    if not sampleable:
        with pytest.raises(ValueError, match="no episode has ended yet"):
            buffer.sample(4)
        return

    batch = buffer.sample(512)
    for i, number in enumerate(batch["action"].tolist()):
        row = by_number[number]
        assert number in sampleable, f"row {row} is not in a complete stored episode"
        ids = np.array([row["env"], row["episode"], row["t"]], dtype=np.float32)
        np.testing.assert_array_equal(batch["obs"]["observation"][i], ids)
        np.testing.assert_array_equal(batch["next_obs"]["achieved_goal"][i], ids + [0, 0, 1])
        assert batch["truncated"][i] == bool(row["end"] & 2) and batch["discount"][i] == np.float32(0.9)
        goal = batch["obs"]["desired_goal"][i]
        np.testing.assert_array_equal(batch["next_obs"]["desired_goal"][i], goal)
        if not batch["relabeled"][i]:
            assert (goal == ORIGINAL_GOAL).all() and batch["reward"][i] == STORED_REWARD
            assert batch["terminated"][i] == bool(row["end"] & 1)
            continue
        # the goal is the achieved goal (after the step) of an eligible step of the same episode
        length = len(complete[row["episode"]])
        allowed = [
            np.array([row["env"], row["episode"], k + 1], dtype=np.float32)
            for k in eligible_steps(strategy, row["t"], length)
        ]
        assert any((goal == a).all() for a in allowed), (row, goal, strategy, length)
        achieved = ids + [0, 0, 1]
        assert batch["reward"][i] == distance_reward(achieved[None], goal[None], {})[0]
        expected_terminated = (achieved == goal).all() if terminal else bool(row["end"] & 1)
        assert batch["terminated"][i] == expected_terminated
    # the slots named in the batch hold its rows
    np.testing.assert_array_equal(stored[batch["indices"]], batch["action"])


# ---------------------------------------------------------------------- frequencies
def long_buffer(strategy: str, n_sampled_goal: int, seed: int = 0) -> tuple[HERReplayBuffer, list[dict]]:
    """3 envs, lockstep, episodes of 1 to 9 steps ending in every way, a ring that has wrapped."""
    rng = np.random.default_rng(seed)
    ends = []
    for _ in range(3):
        env_ends = []
        while len(env_ends) < 120:
            length = int(rng.integers(1, 10))
            env_ends += [0] * (length - 1) + [int(rng.integers(1, 4))]
        ends.append(env_ends)
    batches = build_rows(ends, [3], lockstep=True, seed=seed)
    rows = number_episodes(batches, set())
    buffer = HERReplayBuffer(
        None, 200, compute_reward=distance_reward, strategy=strategy, n_sampled_goal=n_sampled_goal, seed=seed
    )
    fill(buffer, batches, set())
    return buffer, rows


@pytest.mark.parametrize("batch_size", [1, 7, 64])
@pytest.mark.parametrize("n_sampled_goal", [0, 1, 4])
def test_relabeled_share_is_her_ratio(n_sampled_goal, batch_size):
    buffer, _ = long_buffer("future", n_sampled_goal)
    her_ratio = 1 - 1 / (n_sampled_goal + 1)
    assert buffer.draws.her_ratio == her_ratio
    draws = 20_000 // batch_size
    relabeled = sum(int(buffer.sample(batch_size)["relabeled"].sum()) for _ in range(draws))
    total = draws * batch_size
    if n_sampled_goal == 0:
        assert relabeled == 0
        return
    # every row is relabeled independently: even a batch of one is relabeled with probability her_ratio
    stat, dof = chi_square_statistic(np.array([relabeled, total - relabeled]), np.array([her_ratio, 1 - her_ratio]))
    assert stat < chi_square_quantile(dof, SIGNIFICANCE), (relabeled / total, her_ratio)


@pytest.mark.parametrize("strategy", ["future", "episode"])
def test_goal_step_is_uniform_over_the_eligible_steps(strategy):
    """Grouped by how many steps are eligible (``T - t`` for future, ``T`` for episode), the offset of the
    drawn step is uniform; the groups are independent, so their statistics and degrees of freedom add up."""
    buffer, rows = long_buffer(strategy, n_sampled_goal=4, seed=1)
    by_number = {row["number"]: row for row in rows}
    lengths: dict[int, int] = {}
    for row in rows:
        lengths[row["episode"]] = max(lengths.get(row["episode"], 0), row["t"] + 1)
    counts = np.zeros((10, 10), dtype=np.int64)  # [eligible steps, offset of the drawn one]
    for _ in range(300):
        batch = buffer.sample(256)
        for i in np.flatnonzero(batch["relabeled"]):
            row = by_number[int(batch["action"][i])]
            k = int(batch["obs"]["desired_goal"][i][2]) - 1
            first = row["t"] if strategy == "future" else 0
            counts[lengths[row["episode"]] - first, k - first] += 1
    stat, dof = 0.0, 0
    for eligible in range(2, 10):
        group = counts[eligible, :eligible]
        assert counts[eligible, eligible:].sum() == 0
        s, d = chi_square_statistic(group, np.full(eligible, 1 / eligible))
        stat, dof = stat + s, dof + d
    assert counts[1, 1:].sum() == 0
    assert dof > 20 and stat < chi_square_quantile(dof, SIGNIFICANCE), (stat, dof)


def test_steps_are_drawn_uniformly_among_the_sampleable_ones():
    buffer, _ = long_buffer("final", n_sampled_goal=1, seed=2)
    stored = buffer.storage.gather(np.arange(len(buffer)))["action"]
    sampleable = stored[buffer.draws.episodes.length[: len(buffer)] > 0]
    assert 0 < len(sampleable) < len(buffer)  # the ring wrapped: some episodes lost their first step
    counts = np.zeros(stored.max() + 1, dtype=np.int64)
    for _ in range(200):
        np.add.at(counts, buffer.sample(256)["action"], 1)
    assert counts[np.setdiff1d(stored, sampleable)].sum() == 0
    stat, dof = chi_square_statistic(counts[sampleable], np.full(len(sampleable), 1 / len(sampleable)))
    assert stat < chi_square_quantile(dof, SIGNIFICANCE)


# ---------------------------------------------------------------------- state
def test_state_round_trip_keeps_the_index_and_the_rng():
    buffer, _ = long_buffer("future", n_sampled_goal=4, seed=3)
    running = [dict(env=env, end=0, number=5_000 + env, episode=500 + env, t=0, batch=0) for env in (0, 2)]
    buffer.add(as_batch(running))  # two episodes in flight
    buffer.sample(32)  # move the RNG
    blob = io.BytesIO()
    torch.save(buffer.state_dict(), blob)
    blob.seek(0)
    restored = HERReplayBuffer(None, 200, compute_reward=distance_reward, seed=123)
    restored.load_state_dict(torch.load(blob, weights_only=True))
    # a restore ends the episodes in flight (the source starts new ones): the same as ending them here
    assert (buffer.draws.episodes.env_steps > 0).any()
    buffer.end_episodes()
    for name in ("step", "prev", "length", "order", "last_slot", "env_steps"):
        np.testing.assert_array_equal(
            getattr(restored.draws.episodes, name), getattr(buffer.draws.episodes, name), err_msg=name
        )
    for _ in range(3):
        a, b = buffer.sample(64), restored.sample(64)
        for name in ("action", "reward", "relabeled", "indices", "generations"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        np.testing.assert_array_equal(a["obs"]["desired_goal"], b["obs"]["desired_goal"])
    # and it goes on: a step added after the restore starts a new episode
    restored.add(as_batch([dict(env=1, end=0, number=10_000, episode=999, t=0, batch=0)]))
    assert (
        restored.draws.episodes.env_steps.tolist() == [0, 1, 0]
        and restored.draws.episodes.step[restored.storage.cursor - 1] == 0
    )


# ---------------------------------------------------------------------- interrupts
def _batches() -> list[TransitionBatch]:
    """3 envs with episode ends, in batches of one row per env and of several rows per env."""
    ends = [[0, 0, 1, 0, 2, 0, 0, 0, 3, 0], [0, 2, 0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 3, 0, 1, 0, 0, 2]]
    batches = build_rows(ends, [5, 2, 4], lockstep=False, seed=4)
    number_episodes(batches, set())
    return [as_batch(batch) for batch in batches]


def _state(buffer: HERReplayBuffer) -> dict[str, np.ndarray]:
    stored = buffer.storage.gather(np.arange(len(buffer)))
    index = buffer.draws.episodes
    return {
        "action": stored["action"],
        "observation": stored["obs"]["observation"],
        "terminated": stored["terminated"],
        **{
            name: np.asarray(getattr(index, name)).copy()
            for name in ("step", "prev", "length", "last_slot", "env_steps")
        },
        "start": np.where(index.length > 0, index.start, -1),
        "order": index.order[index._order_positions(index.start[index.length > 0], index.length[index.length > 0])],
        "counters": np.array([index.written, index.order_written, buffer.storage.total_added]),
        "leaves": buffer.draws.tree.leaves[: buffer.capacity].copy(),
        "sums": buffer.draws.tree.sums.copy(),
        "generations": buffer.draws.generations.copy(),
    }


@pytest.mark.parametrize("then", ["add", "sample", "state_dict"])
@pytest.mark.parametrize(
    "target", ["ptl_rl.replay.hindsight", "ptl_rl.replay.buffer", "ptl_rl.replay.episodes", "ptl_rl.replay.storage"]
)
def test_add_interrupted_anywhere_is_completed_or_undone(target, then):
    """An interrupt at any line of a wrapping add leaves the buffer as if the add ran in full (or, at its very
    first lines, never ran), once the next add, sample or state_dict has run."""
    batches = _batches()
    capacity = 12
    target_file = sys.modules[target].__file__
    injector = Injector({"target": lambda code: code.co_filename == target_file})

    def build() -> HERReplayBuffer:
        return HERReplayBuffer(None, capacity, compute_reward=distance_reward, seed=0)

    wrap = next(i for i in range(len(batches)) if sum(map(len, batches[: i + 1])) > capacity + 3)
    clean, never_called = build(), build()
    for i, batch in enumerate(batches):
        clean.add(batch)
        if i != wrap:
            never_called.add(batch)
    probe = build()
    for batch in batches[:wrap]:
        probe.add(batch)
    injector.run(lambda: probe.add(batches[wrap]))
    lines = injector.counts["target"]
    assert lines >= 8  # (in buffer.py only the add and its write run: the rest is in the other targets)
    outcomes = {"done": _state(clean), "undone": _state(never_called)}
    seen = []
    for k in range(1, lines + 1):
        buffer = build()
        for batch in batches[:wrap]:
            buffer.add(batch)
        with pytest.raises(KeyboardInterrupt):
            injector.run(lambda: buffer.add(batches[wrap]), "target", k, KeyboardInterrupt())  # noqa: B023
        if then == "sample" and buffer.draws.tree.total > 0:
            buffer.sample(4)
        elif then == "state_dict":
            buffer.state_dict()
        for batch in batches[wrap + 1 :]:
            buffer.add(batch)
        got = _state(buffer)
        same = [name for name, state in outcomes.items() if all(np.array_equal(got[f], v) for f, v in state.items())]
        assert same, f"line {k}: the interrupted add was neither completed nor left undone"
        seen.append(same[0])
    # only the first lines of add (the checks, before anything is recorded) may leave it undone
    undone = [k for k, outcome in enumerate(seen, 1) if outcome == "undone"]
    first_lines = 80 if target.endswith(("hindsight", "buffer")) else 0  # (the strategy's checks, the buffer's add)
    assert undone == list(range(1, len(undone) + 1)) and len(undone) <= first_lines, seen


def test_end_episodes_interrupted_anywhere_then_called_again_ends_them_once():
    batches = _batches()
    episodes_file = sys.modules["ptl_rl.replay.episodes"].__file__
    her_files = (sys.modules["ptl_rl.replay.hindsight"].__file__, sys.modules["ptl_rl.replay.buffer"].__file__)
    injector = Injector({"target": lambda code: code.co_filename in (episodes_file, *her_files)})

    def filled() -> HERReplayBuffer:
        buffer = HERReplayBuffer(None, 30, compute_reward=distance_reward, seed=0)
        for batch in batches[:4]:
            buffer.add(batch)
        return buffer

    clean = filled()
    assert (clean.draws.episodes.env_steps > 0).any()
    injector.run(clean.end_episodes)
    lines = injector.counts["target"]
    for batch in batches[4:]:
        clean.add(batch)
    expected = _state(clean)
    for k in range(1, lines + 1):
        buffer = filled()
        with pytest.raises(KeyboardInterrupt):
            injector.run(buffer.end_episodes, "target", k, KeyboardInterrupt())
        buffer.end_episodes()  # the caller saw the interrupt and ends them again
        for batch in batches[4:]:
            buffer.add(batch)
        got = _state(buffer)
        assert all(np.array_equal(got[f], v) for f, v in expected.items()), f"line {k}"


# ---------------------------------------------------------------------- behind a source
class TokenGoalEnv(gym.Env):
    """Episodes of 1 to 6 steps (terminated or truncated) whose goals name them: ``(token, t)``."""

    def __init__(self) -> None:
        box = gym.spaces.Box(-np.inf, np.inf, (2,), dtype=np.float64)
        self.observation_space = gym.spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        goal = np.array([self.token, self.t], dtype=np.float64)
        return {"observation": goal, "achieved_goal": goal.copy(), "desired_goal": np.full(2, -1.0)}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.token, self.t = float(self.np_random.random()), 0
        self.length = int(self.np_random.integers(1, 7))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        self.t += 1
        end = self.t >= self.length
        terminated = end and self.length % 2 == 0
        return self._obs(), -1.0, terminated, end and not terminated, {}


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_behind_a_source_episodes_are_real_and_never_span_a_peek(mode):
    """From a vector env in each autoreset mode, with peeks at the source that the buffer never sees: every
    episode the buffer can draw goals from is consecutive steps of one real episode, and relabeled goals too."""
    env = gym.vector.SyncVectorEnv([TokenGoalEnv] * 3, autoreset_mode=gym.vector.AutoresetMode(mode))
    source = ExperienceSource(env, lambda obs: np.zeros(len(obs["observation"]), dtype=np.int64), seed=5)
    buffer = HERReplayBuffer(source, 90, compute_reward=distance_reward, strategy="episode", warmup=0, seed=5)
    for i in range(200):
        if i % 17 == 9:
            next(source)  # a peek: those steps never reach the buffer
        next(buffer)
    stored = buffer.storage.gather(np.arange(len(buffer)))
    obs, after = stored["obs"]["observation"], stored["next_obs"]["observation"]
    drawable = np.flatnonzero(buffer.draws.episodes.length[: len(buffer)] > 0)
    assert len(drawable) > 30
    cut_short = 0
    for slot in drawable:
        steps = buffer.draws.episodes.episode_slots(slot)
        np.testing.assert_array_equal(after[steps[:-1]], obs[steps[1:]])  # step i+1 starts where step i ended
        last = steps[-1]
        cut_short += not (stored["terminated"][last] or stored["truncated"][last])
    assert cut_short > 0  # some episodes were ended by a peek
    batch = buffer.sample(500)
    goals = batch["obs"]["desired_goal"][batch["relabeled"]]
    tokens = batch["obs"]["observation"][batch["relabeled"], 0]
    np.testing.assert_array_equal(goals[:, 0], tokens)  # a goal of the same episode


# ---------------------------------------------------------------------- refused input
def test_refusals_name_the_problem():
    good = as_batch([dict(env=0, end=0, number=0, episode=0, t=0, batch=0)])
    buffer = HERReplayBuffer(None, 10, compute_reward=distance_reward)
    flat = TransitionBatch({**dict(good.items()), "obs": np.zeros((1, 3), dtype=np.float32)})
    with pytest.raises(ValueError, match="dict observations with the goals"):
        buffer.add(flat)
    wrong_shape = dict(good.items())
    wrong_shape["next_obs"] = {**good["next_obs"], "desired_goal": np.zeros((1, 2), dtype=np.float32)}
    with pytest.raises(ValueError, match="one shape per row"):
        buffer.add(TransitionBatch(wrong_shape))
    with pytest.raises(ValueError, match="'relabeled' is added to sampled batches"):
        buffer.add(TransitionBatch({**dict(good.items()), "relabeled": np.zeros(1, dtype=bool)}))
    with pytest.raises(ValueError, match=r"needs the fields \['env_id'\]"):
        buffer.add(TransitionBatch({k: v for k, v in good.items() if k != "env_id"}))
    assert len(buffer) == 0
    buffer.add(good)
    with pytest.raises(ValueError, match="no episode has ended yet"):
        buffer.sample(1)
    with pytest.raises(ValueError, match="strategy must be one of"):
        HERReplayBuffer(None, 10, compute_reward=distance_reward, strategy="random")
    with pytest.raises(ValueError, match="n_sampled_goal must be an integer >= 0"):
        HERReplayBuffer(None, 10, compute_reward=distance_reward, n_sampled_goal=-1)
    with pytest.raises(TypeError, match="that is an env: pass its unwrapped method"):
        HERReplayBuffer(None, 10, compute_reward=TokenGoalEnv())
    source = ExperienceSource(gym.vector.SyncVectorEnv([TokenGoalEnv]), lambda obs: np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError, match=r"NStepTransform\(n=3\)"):
        HERReplayBuffer(NStepTransform(source, 3, 0.9), 10, compute_reward=distance_reward)
    HERReplayBuffer(NStepTransform(source, 1, 0.9), 10, compute_reward=distance_reward)  # 1-step: fine


def test_a_reward_function_that_is_not_vectorized_is_refused():
    buffer = HERReplayBuffer(None, 10, compute_reward=lambda a, d, info: -1.0, seed=0)
    buffer.add(as_batch([dict(env=0, end=2, number=0, episode=0, t=0, batch=0)]))
    with pytest.raises(ValueError, match=r"compute_reward returned shape \(\) for \d+ relabeled rows"):
        buffer.sample(16)


def test_ranks_draw_differently_and_repr_names_the_relabeling():
    buffers = [long_buffer("future", 4, seed=0)[0] for _ in range(3)]
    buffers[1].set_rank(1)
    a, b, c = (buffer.sample(64)["action"] for buffer in buffers)
    assert (a == c).all() and not (a == b).all()
    text = repr(buffers[0])
    assert text.startswith("HERReplayBuffer(size=200/200, warmup=200, sampleable=") and "strategy=future" in text
    assert "n_sampled_goal=4" in text

"""Recurrent PPO: the recurrent actor-critic agent and RolloutBuffer(sequence_length=L), against raw references.

The scripted envs record their own steps (``tests/support/scripted_env.py``), so
the references below know nothing of the buffer's layout: sequences are checked
against each env's raw rollout, and the learner's sequence pass against the
values the agent recorded while acting.
"""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted_env import BOTH, TERM, TRUNC, ids_of, make_env, obs_code
from torch import nn

import ptl_rl

MODES = ["NextStep", "SameStep", "Disabled"]


class IdEncoder(nn.Module):
    """ScriptedEnv observations ``[env, episode, step]`` (int64) -> tanh features."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(3, width)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(obs.float() * 0.3))


def id_net(action_space, kind: str = "lstm", width: int = 8) -> ptl_rl.RecurrentActorCritic:
    torch.manual_seed(0)
    head = ptl_rl.action_head(action_space, width, gain=1.0)  # not the small default: log-probs differ per row
    return ptl_rl.RecurrentActorCritic(
        IdEncoder(width), ptl_rl.RecurrentCore(width, width, kind), head, nn.Linear(width, 1)
    )


def ragged_layouts() -> list[list[tuple[int, str]]]:
    """Episodes of 1 to 9 steps ending in every way, at different times in each of 3 envs."""
    return [
        [(3, TERM), (7, TRUNC), (1, BOTH), (5, TERM)] * 4,
        [(9, TRUNC), (2, TERM), (4, TERM)] * 4,
        [(1, TERM), (6, BOTH), (2, TRUNC)] * 5,
    ]


def pipeline(mode: str, length: int, *, kind: str = "lstm", box: bool = False, num_minibatches: int = 3):
    env = make_env(ragged_layouts(), mode, box_action=box)
    net = id_net(env.single_action_space, kind)
    agent = ptl_rl.RecurrentActorCriticAgent(net, env.single_action_space, seed=0)
    source = ptl_rl.ExperienceSource(env, agent, gamma=0.9, seed=0)
    rollout = ptl_rl.RolloutBuffer(
        source, 12, epochs=2, num_minibatches=num_minibatches, sequence_length=length, seed=1
    )
    return rollout, agent, net


# ---------------------------------------------------------------------- the key property
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("length", "kind", "box"), [(5, "lstm", False), (12, "gru", False), (40, "lstm", True)])
def test_the_learners_sequence_pass_reproduces_the_acting_log_prob_and_value(mode, length, kind, box):
    """Weights unchanged: re-running every sequence from its stored initial state, zeroed at its episode starts,
    gives the log-prob and value the agent recorded at every real row (several envs, episodes ending mid-sequence)."""
    rollout, agent, _ = pipeline(mode, length, kind=kind, box=box)
    checked = starts_inside = 0
    for _ in range(3 * rollout.batches_per_rollout):  # three rollouts: later ones start mid-episode
        batch = next(rollout)
        with torch.no_grad():
            log_prob, entropy, value = agent.evaluate_sequences(batch)
        mask = batch.mask
        torch.testing.assert_close(log_prob[mask], batch.log_prob[mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(value[mask], batch.value[mask], rtol=1e-5, atol=1e-5)
        assert torch.isfinite(entropy).all() and torch.isfinite(value).all()
        checked += int(mask.sum())
        starts_inside += int(batch.episode_start[:, 1:].sum())
    assert checked >= 3 * 2 * 36 and starts_inside > 0


layout_st = st.lists(st.tuples(st.integers(1, 6), st.sampled_from([TERM, TRUNC, BOTH])), min_size=1, max_size=4)


@settings(max_examples=15, deadline=None)
@given(
    layouts=st.lists(layout_st, min_size=1, max_size=3),
    mode=st.sampled_from(MODES),
    length=st.integers(1, 20),
    steps=st.integers(1, 10),
)
def test_any_layout_and_sequence_length_reproduce_the_acting_values(layouts, mode, length, steps):
    env = make_env(layouts, mode)
    net = id_net(env.single_action_space)
    agent = ptl_rl.RecurrentActorCriticAgent(net, env.single_action_space, seed=0)
    source = ptl_rl.ExperienceSource(env, agent, gamma=0.9, seed=0)
    rollout = ptl_rl.RolloutBuffer(source, steps, epochs=1, num_minibatches=1, sequence_length=length, seed=0)
    for _ in range(3):
        batch = next(rollout)
        with torch.no_grad():
            log_prob, _, value = agent.evaluate_sequences(batch)
        mask = batch.mask
        assert int(mask.sum()) == len(rollout.rollout)
        torch.testing.assert_close(log_prob[mask], batch.log_prob[mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(value[mask], batch.value[mask], rtol=1e-5, atol=1e-5)


def test_without_the_resets_the_pass_would_differ():
    """The test above can fail: ignoring episode_start changes the rows after a start inside a sequence."""
    rollout, agent, _ = pipeline("NextStep", 12)
    batch = next(rollout)
    assert batch.episode_start[:, 1:].any()
    batch["episode_start"] = torch.zeros_like(batch.episode_start)
    with torch.no_grad():
        _, _, value = agent.evaluate_sequences(batch)
    assert not torch.allclose(value[batch.mask], batch.value[batch.mask], atol=1e-4)


# ---------------------------------------------------------------------- the layout against the raw rollout
def env_sequences(rollout: ptl_rl.RolloutBuffer) -> dict[int, list[int]]:
    """Each env's rows of the rollout served, as obs codes in time order (the brute-force reference)."""
    flat = rollout.rollout
    assert flat is not None
    codes = obs_code(ids_of(flat["obs"]))
    env = np.asarray(flat["env_id"])
    steps = {e: [c for c, x in zip(codes.tolist(), env.tolist(), strict=True) if x == e] for e in np.unique(env)}
    return {int(e): rows for e, rows in steps.items()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("length", [1, 4, 13, 100])
def test_each_row_once_per_epoch_in_time_ordered_sequences_with_their_states_and_starts(mode, length):
    rollout, _, _ = pipeline(mode, length, num_minibatches=2)
    for _ in range(2):  # two rollouts
        batches = [next(rollout) for _ in range(rollout.batches_per_rollout)]
        reference = env_sequences(rollout)
        raw = {int(c): i for i, c in enumerate(obs_code(ids_of(rollout.rollout["obs"])).tolist())}
        for epoch in range(2):
            seen: list[int] = []
            for batch in batches[epoch * 2 : epoch * 2 + 2]:
                codes = obs_code(batch.obs.numpy())
                assert batch.obs.shape[1] == length and batch.mask.shape == codes.shape
                for seq, mask, start, hidden in zip(codes, batch.mask.numpy(), batch.episode_start.numpy(),
                                                    batch.hidden.numpy(), strict=True):  # fmt: skip
                    real = seq[mask].tolist()
                    assert mask[: len(real)].all(), "padding only after the real rows"
                    assert (seq[~mask] == real[-1]).all(), "padding repeats the last real row"
                    rows = reference[int(real[0] // 10_000**2)]  # obs code = (env * 10^4 + episode) * 10^4 + step
                    at = rows.index(real[0])
                    assert at % length == 0, "sequences are cut every L rows from the env's first row"
                    assert rows[at : at + len(real)] == real, "consecutive rows of one env, in time order"
                    assert len(real) == min(length, len(rows) - at)
                    # the initial state is the stored state of the first row
                    np.testing.assert_array_equal(hidden[0], rollout.rollout["hidden"][raw[real[0]]])
                    # an episode starts where the previous row of the env ended (or its step id is 0 there)
                    steps_in_episode = np.asarray([c % 10_000 for c in real])
                    expected = steps_in_episode == 0
                    if at == 0 and rollout.rollouts_collected > 1:
                        expected[0] = start[0]  # continues from the previous rollout: checked below
                    np.testing.assert_array_equal(start[: len(real)], expected)
                    assert not start[len(real) :].any()
                    seen += real
            assert sorted(seen) == sorted(c for rows in reference.values() for c in rows), "once per epoch"


def test_a_rollouts_first_row_starts_an_episode_exactly_when_the_previous_rollouts_last_row_ended():
    rollout, _, _ = pipeline("SameStep", 100, num_minibatches=1)
    for _ in range(4):
        batch = next(rollout)
        for _ in range(rollout.batches_per_rollout - 1):
            next(rollout)
        first = batch.episode_start[:, 0].numpy()
        step_ids = batch.obs[:, 0, 2].numpy()  # ScriptedEnv: the step number within the episode
        np.testing.assert_array_equal(first, step_ids == 0)


counts_st = st.lists(st.integers(1, 30), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(counts=counts_st, length=st.integers(1, 35))
def test_sequence_layout_against_brute_force(counts, length):
    """Any ragged row counts: the [Q, L] layout covers every flat row once, in time order per env, padded at ends."""
    rollout = ptl_rl.RolloutBuffer(None, 1, num_envs=len(counts), num_minibatches=1, sequence_length=length)
    flat, mask = rollout.sequence_layout(np.array(counts), length)
    # brute force: the time-major flat order of finish(), and each env's rows cut every L
    order = [(t, e) for t in range(max(counts)) for e in range(len(counts)) if t < counts[e]]
    expected, expected_mask = [], []
    for e, c in enumerate(counts):
        for first in range(0, c, length):
            expected.append([order.index((min(t, c - 1), e)) for t in range(first, first + length)])
            expected_mask.append([t < c for t in range(first, first + length)])
    assert flat.tolist() == expected
    assert mask.tolist() == expected_mask
    assert sorted(flat[mask].tolist()) == list(range(sum(counts)))


def test_minibatch_normalization_uses_the_real_rows_only():
    rollout, _, _ = pipeline("NextStep", 7, num_minibatches=1)
    batch = next(rollout)
    real = batch.advantage[batch.mask]
    assert (~batch.mask).any()
    torch.testing.assert_close(real.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(real.std(unbiased=False), torch.tensor(1.0), atol=1e-4, rtol=0)
    assert (batch.advantage[~batch.mask] == 0).all()


# ---------------------------------------------------------------------- bootstrapping
@pytest.mark.parametrize("mode", MODES)
def test_next_value_is_the_value_from_the_state_after_the_row(mode):
    """Inside an episode V(next_obs_t) from the state after row t is exactly the value recorded at row t + 1."""
    rollout, agent, _ = pipeline(mode, 100, num_minibatches=1)
    next(rollout)
    flat = rollout.rollout
    env = np.asarray(flat["env_id"])
    done = np.asarray(flat["terminated"]) | np.asarray(flat["truncated"])
    pairs = [(i, j) for e in np.unique(env) for i, j in zip(*[np.flatnonzero(env == e)[k:] for k in (0, 1)],
                                                          strict=False) if not done[i]]  # fmt: skip
    rows = np.array([i for i, _ in pairs])
    got = agent.next_value({k: flat[k][rows] for k in ("obs", "next_obs", "hidden")})
    np.testing.assert_allclose(got, np.asarray(flat["value"])[[j for _, j in pairs]], rtol=1e-5, atol=1e-6)


def test_gae_bootstraps_each_envs_last_row_through_next_value():
    """A rollout's returns at each env's last unfinished row: reward + discount * next_value (lambda irrelevant)."""
    rollout, agent, _ = pipeline("Disabled", 100, num_minibatches=1)
    next(rollout)
    assert_last_rows_bootstrap_through_next_value(rollout.rollout, agent)


def assert_last_rows_bootstrap_through_next_value(flat, agent) -> None:
    """At each env's last unfinished row of a collected rollout: returns == reward + discount * next_value."""
    env = np.asarray(flat["env_id"])
    for e in np.unique(env):
        last = np.flatnonzero(env == e)[-1]
        if flat["terminated"][last]:
            continue
        v = agent.next_value({k: flat[k][[last]] for k in ("obs", "next_obs", "hidden")})[0]
        expected = flat["reward"][last] + flat["discount"][last] * v
        assert flat["returns"][last] == pytest.approx(expected, rel=1e-5, abs=1e-5)


# ---------------------------------------------------------------------- the agent
def test_agent_returns_the_state_it_acted_from_and_commits_the_next():
    env = make_env(ragged_layouts(), "NextStep")
    net = id_net(env.single_action_space)
    agent = ptl_rl.RecurrentActorCriticAgent(net, env.single_action_space, seed=0)
    obs = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0]])
    _, first = agent(obs)
    assert set(first) == {"log_prob", "value", "hidden"} and not first["hidden"].any()
    held = agent.state.clone()
    _, second = agent(obs)
    np.testing.assert_array_equal(second["hidden"], held.numpy())
    agent.reset_state(np.array([False, True, False]))
    assert not agent.state[1].any() and agent.state[0].equal(net.step(torch.as_tensor(obs), held)[2][0])
    np.testing.assert_array_equal(second["hidden"], held.numpy())  # handed-out states are never rewritten
    with pytest.raises(ValueError, match="one agent acts for one ExperienceSource"):
        agent(obs[:2])


def test_agent_state_dict_holds_the_sampling_state_not_the_hidden_states():
    env = make_env(ragged_layouts(), "NextStep")
    agent = ptl_rl.RecurrentActorCriticAgent(id_net(env.single_action_space), env.single_action_space, seed=0)
    obs = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0]])
    agent(obs)
    buf = io.BytesIO()
    torch.save(agent.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    twin = ptl_rl.RecurrentActorCriticAgent(id_net(env.single_action_space), env.single_action_space, seed=5)
    twin.load_state_dict(state)
    agent.reset_state(np.ones(3, dtype=bool))
    np.testing.assert_array_equal(agent(obs)[0], twin(obs)[0])  # the same RNG state, both from zeros
    assert twin.state is not None


def test_refusals_name_the_problem():
    env = make_env(ragged_layouts(), "NextStep")
    space = env.single_action_space
    with pytest.raises(TypeError, match="initial_state"):
        ptl_rl.RecurrentActorCriticAgent(nn.Linear(3, 5), space)
    agent = ptl_rl.RecurrentActorCriticAgent(id_net(space), space)
    with pytest.raises(TypeError, match="evaluate_sequences"):
        agent.distribution(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="sequence_length must be >= 1"):
        ptl_rl.RolloutBuffer(None, 8, num_envs=2, sequence_length=0)
    with pytest.raises(ValueError, match="exceeds the 4 sequences"):
        ptl_rl.RolloutBuffer(None, 8, num_envs=2, num_minibatches=5, sequence_length=4)
    with pytest.raises(ValueError, match="reset has shape"):
        ptl_rl.RecurrentCore(2, 3)(torch.zeros(2, 4, 2), torch.zeros(2, 6), reset=torch.zeros(2, 3, dtype=torch.bool))


def test_a_rollout_with_a_recurrent_agent_needs_no_value_method():
    """The recurrent agent has no value(obs) (its values need a state): the buffer accepts its next_value."""
    rollout, agent, _ = pipeline("NextStep", 6)
    assert not hasattr(agent, "value") and isinstance(agent, ptl_rl.core.protocols.TransitionCritic)
    assert "episode_start" in next(rollout).keys()
    assert repr(rollout).startswith("RolloutBuffer(envs=3, steps_per_env=12, sequence_length=6, held=")


# ---------------------------------------------------------------------- checkpoints
def test_state_dict_roundtrip_restarts_collection_with_every_env_starting_an_episode():
    rollout, _, _ = pipeline("NextStep", 5)
    for _ in range(rollout.batches_per_rollout + 1):
        next(rollout)
    buf = io.BytesIO()
    torch.save(ptl_rl.pipeline_state_dict(rollout), buf)
    buf.seek(0)
    ptl_rl.load_pipeline_state_dict(rollout, torch.load(buf, weights_only=True))
    batches = [next(rollout) for _ in range(rollout.batches_per_rollout)]
    assert rollout.rollouts_collected == 3
    firsts = [b for b in batches[:3]]
    zero_step = torch.cat([b.obs[:, 0, 2] == 0 for b in firsts])
    at_start = torch.cat([b.episode_start[:, 0] for b in firsts])
    assert torch.equal(zero_step, at_start)


# ---------------------------------------------------------------------- behind the normalization stages
def test_behind_normalize_observations_and_scale_rewards_the_sequences_match_what_the_agent_saw():
    """NormalizeObservations shows the agent normalized observations and ScaleRewards rescales rewards: the
    rollout's sequences carry the obs the agent acted on (the pass reproduces its log-probs and values), the
    ``hidden`` extra passes through, and GAE bootstraps from the normalized ``next_obs`` with the scaled reward."""
    env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    torch.manual_seed(0)
    net = ptl_rl.RecurrentActorCritic(
        nn.Sequential(nn.Linear(4, 8), nn.Tanh()),
        ptl_rl.RecurrentCore(8, 8),
        ptl_rl.action_head(env.single_action_space, 8, gain=1.0),
        nn.Linear(8, 1),
    )
    agent = ptl_rl.RecurrentActorCriticAgent(net, env.single_action_space, seed=0)
    norm = ptl_rl.ObservationNormalizer()
    source = ptl_rl.ExperienceSource(env, agent, gamma=0.9, seed=0, observation_transform=norm)
    normalized = ptl_rl.NormalizeObservations(source, norm)
    scaled = ptl_rl.ScaleRewards(normalized, gamma=0.9)
    rollout = ptl_rl.RolloutBuffer(scaled, 16, epochs=1, num_minibatches=1, sequence_length=5, seed=0)
    starts_inside = 0
    for _ in range(6):  # later rollouts: the statistics have moved, episodes start mid-sequence
        batch = next(rollout)
        mask = batch.mask
        with torch.no_grad():
            log_prob, _, value = agent.evaluate_sequences(batch)
        torch.testing.assert_close(log_prob[mask], batch.log_prob[mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(value[mask], batch.value[mask], rtol=1e-5, atol=1e-5)
        assert batch.hidden.shape[-1] == 16  # the LSTM's [h, c], passed through both stages
        starts_inside += int(batch.episode_start[:, 1:].sum())
    assert starts_inside > 0
    flat = rollout.rollout
    assert not np.allclose(flat["reward"], 1.0), "CartPole's rewards of 1 are scaled"
    assert abs(float(np.mean(flat["obs"]))) < 0.5 and 0.3 < float(np.std(flat["obs"])) < 3, "obs are normalized"
    assert_last_rows_bootstrap_through_next_value(flat, agent)

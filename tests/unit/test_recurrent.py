"""RecurrentCore, RecurrentDQNAgent and sequence_nstep_targets, each against an independent reference."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ptl_rl
from ptl_rl import RecurrentCore, RecurrentDQNAgent, sequence_nstep_targets


class TinyRecurrentQ(nn.Module):
    """obs float [N, D] -> Q [N, A] through a RecurrentCore: the shape of network the agent expects."""

    def __init__(self, obs_dim: int = 3, num_actions: int = 2, hidden: int = 5, kind: str = "lstm") -> None:
        super().__init__()
        self.core = RecurrentCore(obs_dim, hidden, kind)
        self.head = nn.Linear(hidden, num_actions)

    def initial_state(self, batch_size: int) -> torch.Tensor:
        return self.core.initial_state(batch_size)

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, state = self.core.step(obs.float(), state)
        return self.head(out), state


# ---------------------------------------------------------------------- the core against torch's own sequence modules
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_core_sequence_equals_torchs_lstm_and_gru_with_the_same_weights(kind):
    torch.manual_seed(0)
    core = RecurrentCore(3, 4, kind)
    reference = (nn.LSTM if kind == "lstm" else nn.GRU)(3, 4, batch_first=True)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(reference, f"{name}_l0").data.copy_(getattr(core.cell, name).data)
    x, start = torch.randn(2, 7, 3), torch.randn(2, core.state_size)
    out, states = core(x, start)
    if kind == "lstm":
        expected, (h, c) = reference(x, (start[None, :, :4].contiguous(), start[None, :, 4:].contiguous()))
        torch.testing.assert_close(states[:, -1], torch.cat([h[0], c[0]], dim=1))
    else:
        expected, h = reference(x, start[None].contiguous())
        torch.testing.assert_close(states[:, -1], h[0])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(states[:, :, :4], expected)  # h is the first H entries of every state


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_masked_positions_carry_the_state_as_if_they_were_not_there(kind):
    torch.manual_seed(1)
    core = RecurrentCore(2, 3, kind)
    x = torch.randn(1, 6, 2)
    mask = torch.tensor([[False, False, True, True, True, False]])  # front and end padding, as windows have
    start = core.initial_state(1)
    _, states = core(x, start, mask)
    real, real_states = x[:, 2:5], core(x[:, 2:5], start)[1]
    torch.testing.assert_close(states[:, 2:5], real_states)
    torch.testing.assert_close(states[:, :2], start.expand(2, -1)[None])  # nothing happened yet
    torch.testing.assert_close(states[:, 5], real_states[:, -1])
    assert real.shape == (1, 3, 2)


def test_core_step_by_step_equals_the_sequence():
    torch.manual_seed(2)
    core = RecurrentCore(2, 3, "lstm")
    x, state = torch.randn(4, 5, 2), torch.randn(4, 6)
    _, states = core(x, state)
    for t in range(5):
        state = core.step(x[:, t], state)[1]
        torch.testing.assert_close(states[:, t], state)


def test_core_refuses_bad_kinds_and_state_shapes():
    with pytest.raises(ValueError, match="kind must be one of"):
        RecurrentCore(2, 3, "rnn")
    core = RecurrentCore(2, 3, "lstm")
    with pytest.raises(ValueError, match=r"expected \(4, 6\).*initial_state"):
        core.step(torch.zeros(4, 2), torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"initial_state"):
        core(torch.zeros(4, 5, 2), torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"\[batch, time, features\]"):
        core(torch.zeros(4, 2), torch.zeros(4, 6))


# ---------------------------------------------------------------------- n-step targets against a brute-force walk
def brute_force_targets(reward, discount, terminated, truncated, mask, next_values, n):
    """Walk each window position by position, as the field contract's target rule folded k times."""
    batch, length = reward.shape
    out = np.zeros((batch, length))
    for b in range(batch):
        for t in range(length):
            total, running, last = 0.0, 1.0, t
            for u in range(t, min(t + n, length)):
                if not mask[b, u]:
                    break
                total += running * reward[b, u]
                running *= discount[b, u]
                last = u
                if terminated[b, u] or truncated[b, u]:
                    break
            out[b, t] = total + running * (1.0 - terminated[b, last]) * next_values[b, last]
    return out


@st.composite
def windows(draw):
    """Windows as a SequenceReplayBuffer gives them: front padding, real steps, end padding after an episode end."""
    batch, length = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    mask = np.zeros((batch, length), dtype=bool)
    terminated, truncated = np.zeros_like(mask), np.zeros_like(mask)
    for b in range(batch):
        front = draw(st.integers(0, length - 1))
        real = draw(st.integers(1, length - front))
        mask[b, front : front + real] = True
        end = draw(st.sampled_from(["none", "term", "trunc", "both"]))
        if end != "none":  # an episode end can only be the window's last real step
            terminated[b, front + real - 1] = end in ("term", "both")
            truncated[b, front + real - 1] = end in ("trunc", "both")
    gamma = draw(st.sampled_from([1.0, 0.9, 0.5]))
    return {
        "reward": rng.normal(size=(batch, length)).astype(np.float32),
        "discount": np.full((batch, length), gamma, dtype=np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "mask": mask,
        "next_values": rng.normal(size=(batch, length)).astype(np.float32),
        "n": draw(st.integers(1, 6)),
    }


@settings(max_examples=200, deadline=None)
@given(w=windows())
def test_sequence_nstep_targets_equal_a_brute_force_walk(w):
    n = w.pop("n")
    got = sequence_nstep_targets(*(torch.from_numpy(v) for v in w.values()), n)
    expected = brute_force_targets(*w.values(), n)
    real = w["mask"]  # padded positions are left out of losses; only real ones are specified
    np.testing.assert_allclose(got.numpy()[real], expected[real], rtol=1e-5, atol=1e-5)


def test_one_step_targets_are_the_field_contracts_rule():
    reward, discount = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.9, 0.9]])
    terminated, truncated = torch.tensor([[False, True]]), torch.tensor([[False, False]])
    values = torch.tensor([[10.0, 20.0]])
    got = sequence_nstep_targets(reward, discount, terminated, truncated, torch.ones(1, 2, dtype=torch.bool), values, 1)
    torch.testing.assert_close(got, torch.tensor([[1.0 + 0.9 * 10.0, 2.0]]))


def test_sequence_nstep_targets_refuse_bad_input():
    ones = torch.ones(2, 3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        sequence_nstep_targets(ones, ones, ones, ones, ones, ones, 0)
    with pytest.raises(ValueError, match=r"must all be \[B, T\]"):
        sequence_nstep_targets(ones, ones, ones, ones, ones, torch.ones(2, 4), 2)


# ---------------------------------------------------------------------- the agent
def test_agent_returns_the_state_it_acted_from_and_keeps_the_next():
    torch.manual_seed(3)
    net = TinyRecurrentQ()
    agent = RecurrentDQNAgent(net, ptl_rl.ArgmaxSelector())
    obs = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    actions, extras = agent(obs)
    np.testing.assert_array_equal(extras["hidden"], np.zeros((2, 10), np.float32))  # a fresh agent: zeros
    q, state = net.step(torch.from_numpy(obs), net.initial_state(2))
    np.testing.assert_array_equal(actions, q.argmax(1).numpy())
    torch.testing.assert_close(agent.state, state)
    _, extras = agent(obs)
    np.testing.assert_allclose(extras["hidden"], state.detach().numpy())


def test_reset_state_zeroes_only_the_masked_envs_and_never_rewrites_handed_out_states():
    torch.manual_seed(4)
    agent = RecurrentDQNAgent(TinyRecurrentQ(), ptl_rl.ArgmaxSelector())
    obs = np.ones((3, 3), dtype=np.float32)
    agent(obs)
    _, extras = agent(obs)
    before = extras["hidden"].copy()
    held = agent.state.clone()
    agent.reset_state(np.array([False, True, False]))
    torch.testing.assert_close(agent.state[[0, 2]], held[[0, 2]])
    assert (agent.state[1] == 0).all()
    np.testing.assert_array_equal(extras["hidden"], before)  # no in-place change reached a stored extra
    agent.reset_state(np.ones(3, dtype=bool))
    assert agent.state is None  # a full reset forgets the number of envs as well
    _, extras = agent(np.ones((5, 3), dtype=np.float32))  # so a source with another N can use it after
    assert extras["hidden"].shape == (5, 10) and not extras["hidden"].any()


def test_agent_refuses_another_number_of_envs_and_a_network_without_state():
    agent = RecurrentDQNAgent(TinyRecurrentQ())
    agent(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="holds the state of 2 envs but got 4 observations.*another agent"):
        agent(np.zeros((4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="one agent per ExperienceSource"):
        agent.reset_state(np.ones(3, dtype=bool))
    with pytest.raises(TypeError, match="initial_state.*step.*RecurrentCore"):
        RecurrentDQNAgent(nn.Linear(3, 2))
    with pytest.raises(TypeError, match="selector"):
        RecurrentDQNAgent(TinyRecurrentQ(), 0.1)


def test_the_source_checks_the_q_width_against_the_env():
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    agent = RecurrentDQNAgent(TinyRecurrentQ(obs_dim=4, num_actions=3))
    source = ptl_rl.ExperienceSource(env, agent, seed=0)
    with pytest.raises(ValueError, match="outputs 3 Q-values.*needs 2"):
        next(source)
    with pytest.raises(TypeError, match="Discrete"):
        ptl_rl.ExperienceSource(gym.make("Pendulum-v1"), RecurrentDQNAgent(TinyRecurrentQ(obs_dim=3)))


def test_state_dict_holds_the_selector_not_the_hidden_states():
    epsilon = ptl_rl.EpsilonGreedySelector(0.5, seed=0)
    agent = RecurrentDQNAgent(TinyRecurrentQ(), epsilon)
    agent(np.ones((2, 3), dtype=np.float32))
    state = agent.state_dict()
    assert set(state) == {"selector", "state_version"}
    draws = [epsilon.rng.random() for _ in range(3)]
    other = RecurrentDQNAgent(TinyRecurrentQ(), ptl_rl.EpsilonGreedySelector(0.1, seed=9))
    other(np.ones((2, 3), dtype=np.float32))
    other.load_state_dict(torch.load(_saved(state), weights_only=True))
    assert other.state is None and other.selector.epsilon == 0.5
    assert [other.selector.rng.random() for _ in range(3)] == draws


def _saved(state):
    import io  # noqa: PLC0415

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer

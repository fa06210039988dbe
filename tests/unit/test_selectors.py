"""Epsilon-greedy selection that decides who explores before the Q-values exist (issue 21).

The reference is epsilon-greedy written out in the test with the Q-values
computed first: ``random(n) < epsilon`` picks the explorers, then
``integers(0, A, k)`` their actions. ``select_lazily`` (and ``selector(q)``,
which calls it) must give the same actions and leave the generator in the same
state, and ``DQNAgent`` must skip the forward pass exactly on the steps where
every env explores.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ptl_rl import ArgmaxSelector, DQNAgent, EpsilonGreedySelector


@settings(max_examples=60, deadline=None)
@given(
    epsilon=st.sampled_from([0.0, 0.05, 0.5, 0.95, 1.0]),
    n=st.integers(1, 6),
    num_actions=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_lazy_selection_draws_what_the_eager_one_draws(epsilon, n, num_actions, seed):
    scores = np.random.default_rng(seed).normal(size=(20, n, num_actions)).astype(np.float32)
    eager, lazy = EpsilonGreedySelector(epsilon, seed=seed), EpsilonGreedySelector(epsilon, seed=seed)
    reference = np.random.default_rng(seed)
    for q in scores:
        explore = reference.random(n) < epsilon
        expected = q.argmax(-1)
        if explore.any():
            expected[explore] = reference.integers(0, num_actions, int(explore.sum()))
        asked = []
        lazy_actions = lazy.select_lazily(n, num_actions, lambda q=q, asked=asked: asked.append(1) or q)
        np.testing.assert_array_equal(lazy_actions, expected)
        np.testing.assert_array_equal(eager(q), expected)
        assert lazy_actions.dtype == np.int64 and lazy_actions.shape == (n,)
        # Q-values were asked for once, and only if some env took the argmax
        assert len(asked) == (0 if explore.all() else 1)
    assert lazy.rng.bit_generator.state == eager.rng.bit_generator.state == reference.bit_generator.state


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.body(obs)


class EagerOnly:
    """The same selector without ``select_lazily``: the agent must compute Q-values at every call."""

    def __init__(self, selector: EpsilonGreedySelector) -> None:
        self.selector = selector

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        return self.selector(scores)


def test_dqn_agent_skips_the_forward_pass_only_when_every_env_explores():
    torch.manual_seed(0)
    lazy_net = Counted()
    eager_net = Counted()
    eager_net.load_state_dict(lazy_net.state_dict())
    space = spaces.Discrete(2)
    lazy = DQNAgent(lazy_net, EpsilonGreedySelector(0.5, seed=3), action_space=space)
    eager = DQNAgent(eager_net, EagerOnly(EpsilonGreedySelector(0.5, seed=3)), action_space=space)
    draws = np.random.default_rng(3)  # the selectors' own stream, to count the all-explore steps independently
    obs = np.random.default_rng(1).normal(size=(200, 2, 4)).astype(np.float32)
    all_explore = 0
    for step, o in enumerate(obs):
        np.testing.assert_array_equal(lazy(o), eager(o))
        explore = draws.random(2) < 0.5
        if explore.any():
            draws.integers(0, 2, int(explore.sum()))
        all_explore += bool(explore.all()) and step > 0  # the first call always runs the network (width check)
    assert eager_net.calls == 200
    assert lazy_net.calls == 200 - all_explore and 30 < all_explore < 70


def test_without_a_known_action_space_the_agent_always_runs_the_network():
    net = Counted()
    agent = DQNAgent(net, EpsilonGreedySelector(1.0, seed=0))
    for _ in range(5):
        agent(np.zeros((3, 4), dtype=np.float32))
    assert net.calls == 5


def test_a_selector_swapped_in_later_is_the_one_used():
    net = Counted()
    agent = DQNAgent(net, EpsilonGreedySelector(1.0, seed=0), action_space=spaces.Discrete(2))
    obs = np.ones((1, 4), dtype=np.float32)
    agent(obs), agent(obs)
    assert net.calls == 1  # the first call checks the width; then every env explores: no forward pass
    agent.selector = ArgmaxSelector()
    greedy = int(net.body(torch.from_numpy(obs)).argmax())
    assert [int(agent(obs)[0]) for _ in range(3)] == [greedy] * 3 and net.calls == 4

"""An agent whose output does not fit the env's action space is reported by ptl_rl, before an action reaches the env.

Issue 19, item 6: a Q-network with 3 outputs on CartPole (2 actions) used to run
until it picked action 2 and then failed with gymnasium's bare
``AssertionError``. The width is checked when the source is built if the
network shows it (it ends in ``nn.Linear`` or an action head), else at the
agent's first call. The envs here record every action they are given, so the
tests see independently of ptl_rl what reached them.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from torch import nn

import ptl_rl
from ptl_rl import DQNAgent, EpsilonGreedySelector, ExperienceSource, StochasticPolicyAgent


class ActionLog(gym.Wrapper):
    """Keeps every action the env is stepped with (before CartPole checks it)."""

    def __init__(self, env: gym.Env, log: list) -> None:
        super().__init__(env)
        self.log = log

    def step(self, action):
        self.log.append(int(action))
        return self.env.step(action)


def logged_cartpole(num_envs: int = 16) -> tuple[gym.vector.VectorEnv, list[int]]:
    log: list[int] = []
    fns = [lambda: ActionLog(gym.make("CartPole-v1"), log) for _ in range(num_envs)]
    return gym.vector.SyncVectorEnv(fns), log


class Opaque(nn.Module):
    """A network whose output width shows only when it runs (its last step is not a layer)."""

    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.body = nn.Linear(4, outputs)

    def forward(self, obs):
        return self.body(obs) * 1.0


def explore(net: nn.Module) -> DQNAgent:
    return DQNAgent(net, EpsilonGreedySelector(1.0, seed=0))  # epsilon 1: every action drawn at random


# ---------------------------------------------------------------------- Q-networks
def test_q_network_with_more_outputs_than_actions_is_refused_when_the_source_is_built():
    env, log = logged_cartpole()
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    with pytest.raises(ValueError, match=r"DQNAgent's network outputs 3 Q-values.*Discrete\(2\).*\.n = 2 outputs"):
        ExperienceSource(env, explore(net))
    assert log == []


@pytest.mark.parametrize("outputs", [1, 3])
def test_q_network_whose_width_shows_only_when_it_runs_is_refused_before_its_first_action(outputs):
    env, log = logged_cartpole()
    source = ExperienceSource(env, explore(Opaque(outputs)), seed=0)  # nothing to see before a forward pass
    with pytest.raises(ValueError, match=rf"outputs {outputs} Q-values.*Discrete\(2\)"):
        next(source)
    assert log == [], "an action reached the env"


def test_exploration_draws_only_the_envs_actions_and_all_of_them():
    env, log = logged_cartpole()
    source = ExperienceSource(env, explore(Opaque(2)), seed=0)
    for _ in range(20):
        next(source)
    assert len(log) >= 20 * 16 - 16 and set(log) == {0, 1}


def test_q_agent_given_the_space_checks_its_network_at_once():
    with pytest.raises(ValueError, match=r"outputs 3 Q-values.*Discrete\(2\)"):
        DQNAgent(nn.Linear(4, 3), action_space=gym.spaces.Discrete(2))
    DQNAgent(nn.Linear(4, 2), action_space=gym.spaces.Discrete(2))


def test_a_discrete_space_that_does_not_start_at_zero_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"starts at 1.*Shift the env's actions to start at 0"):
        DQNAgent(nn.Linear(4, 3), action_space=gym.spaces.Discrete(3, start=1))


# ---------------------------------------------------------------------- categorical policies
def test_logits_policy_with_the_wrong_width_is_refused_when_the_source_is_built():
    env, log = logged_cartpole()
    with pytest.raises(ValueError, match=r"StochasticPolicyAgent's network outputs 3 logits.*Discrete\(2\)"):
        ExperienceSource(env, StochasticPolicyAgent(nn.Linear(4, 3)))
    source = ExperienceSource(env, StochasticPolicyAgent(Opaque(3), seed=0), seed=0)
    with pytest.raises(ValueError, match=r"outputs 3 logits.*Discrete\(2\)"):
        next(source)
    assert log == []


def test_policy_built_for_a_space_with_other_actions_is_refused():
    env, _ = logged_cartpole()
    three = gym.spaces.Discrete(3)
    actor = nn.Sequential(nn.Linear(4, 8), ptl_rl.action_head(three, 8))
    with pytest.raises(ValueError, match=r"built for the action space Discrete\(3\).*Discrete\(2\)"):
        ExperienceSource(env, StochasticPolicyAgent(actor, three))


def test_policy_head_of_another_width_than_its_own_space_is_refused():
    space = gym.spaces.Discrete(2)
    with pytest.raises(ValueError, match=r"outputs 3 logits.*Discrete\(2\)"):
        StochasticPolicyAgent(nn.Sequential(nn.Linear(4, 8), ptl_rl.action_head(gym.spaces.Discrete(3), 8)), space)
    multi = gym.spaces.MultiDiscrete([2, 3])
    with pytest.raises(ValueError, match=r"outputs 4 logits.*MultiDiscrete\(\[2 3\]\).*needs 5"):
        StochasticPolicyAgent(nn.Linear(4, 4), multi)
    StochasticPolicyAgent(nn.Linear(4, 5), multi)

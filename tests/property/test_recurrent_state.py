"""A recurrent agent's per-env hidden state, against an independent replay of each env's own record.

The scripted envs record every step they take (``tests/support/scripted_env.py``).
The reference replays the agent's network on those observations env by env,
one observation at a time, from zeros at each episode's first step, so it
knows nothing of the agent's bookkeeping (its rows, its masks, the source's
autoreset handling). Every stored ``hidden`` extra must be the reference's
state before that step: a state that leaked from another env, or across an
episode start, or that a lost step advanced, differs from it.
"""

from __future__ import annotations

import io
import sys
from types import CodeType
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_env import (
    BOTH,
    MODES,
    TERM,
    TRUNC,
    concat_batches,
    env_attr,
    ids_of,
    make_env,
    obs_code,
    scripted_batches,
)
from torch import nn

import ptl_rl
from ptl_rl import ExperienceSource, RecurrentCore, RecurrentDQNAgent

NUM_ACTIONS = 5  # ScriptedEnv's Discrete(5)


class IdQNet(nn.Module):
    """Q-values from ScriptedEnv observations (``[env, episode, step]`` ids, or a dict with them) through an LSTM."""

    def __init__(self, kind: str = "lstm") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.core = RecurrentCore(3, 6, kind)
        self.head = nn.Linear(6, NUM_ACTIONS)

    def initial_state(self, batch_size: int) -> torch.Tensor:
        return self.core.initial_state(batch_size)

    def step(self, obs: Any, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = obs["id"] if isinstance(obs, dict) else obs
        out, state = self.core.step(ids.float() * 0.3, state)
        return self.head(out), state


class IdScale(nn.Module):
    """ScriptedEnv ids (int64 [N, 3]) -> float features, the actor-critic's encoder."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float() * 0.3


def id_actor_critic() -> ptl_rl.RecurrentActorCritic:
    """The actor-critic twin of IdQNet: the same LSTM on the ids, then logits over the 5 actions and a value."""
    torch.manual_seed(0)
    return ptl_rl.RecurrentActorCritic(IdScale(), RecurrentCore(3, 6), nn.Linear(6, NUM_ACTIONS), nn.Linear(6, 1))


@torch.no_grad()
def reference_states(net: Any, records: list[list[tuple]]) -> dict[int, np.ndarray]:
    """obs code -> the state the agent should have acted from: each env alone, zeros at each episode's first step."""
    expected = {}
    for record in records:
        state = None
        for obs, *_ in record:
            if obs[2] == 0:  # the first observation of an episode
                state = net.initial_state(1)
            expected[int(obs_code(obs))] = state[0].numpy().copy()
            state = net.step(torch.as_tensor(obs[None]), state)[-1]  # the new state is the last output
    return expected


def check_states(batches: list[Any], records: list[list[tuple]], net: Any) -> int:
    """Every row's ``hidden`` equals the reference's state for its observation; returns the rows checked."""
    batches = [b for b in batches if b is not None and len(b)]
    got = concat_batches(batches)
    expected = reference_states(net, records)
    codes = obs_code(ids_of(got["obs"]))
    assert len(np.unique(codes)) == len(codes), "a step was yielded twice"
    for r, code in enumerate(codes.tolist()):
        assert code in expected, f"row {r}: observation {ids_of(got['obs'])[r]} is not in the env's record"
        np.testing.assert_allclose(got["hidden"][r], expected[code], rtol=1e-5, atol=1e-6, err_msg=f"row {r}")
    return len(codes)


def records_of(env: Any) -> list[list[tuple]]:
    return env_attr(env, "record")


def ragged_layouts(num_envs: int) -> list[list[tuple[int, str]]]:
    """Episode ends at different steps in every env, ends that coincide, length-1 episodes, all three kinds."""
    base = [[(1, TERM), (4, TRUNC), (2, BOTH), (3, TERM)], [(3, TRUNC), (1, TRUNC), (5, TERM)], [(2, TERM)] * 4]
    return base[:num_envs]


# ---------------------------------------------------------------------- every autoreset mode
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("mode", MODES)
def test_no_state_leaks_across_envs_or_episode_starts(mode, kind):
    layouts = ragged_layouts(1 if mode == "single" else 3)
    env = make_env(layouts, mode, dict_obs=kind == "gru")  # dict observations too: the agent reads obs["id"]
    net = IdQNet(kind)
    source = ExperienceSource(env, RecurrentDQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=0)), seed=3)
    batches = list(scripted_batches(source, layouts, extra_steps=4))
    rows = check_states(batches, records_of(env), net)
    assert rows == sum(len(r) for r in records_of(env))  # nothing lost without a fault
    starts = concat_batches(batches)["hidden"][ids_of(concat_batches(batches)["obs"])[:, 2] == 0]
    assert len(starts) >= len(layouts) and not starts.any(), "an episode's first step acted from a non-zero state"


layout_st = st.lists(st.tuples(st.integers(1, 5), st.sampled_from([TERM, TRUNC, BOTH])), min_size=1, max_size=5)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts=st.lists(layout_st, min_size=1, max_size=4), chunk=st.sampled_from([1, 2]), seed=st.integers(0, 99))
def test_random_layouts_and_chunks_keep_every_state_right(mode, layouts, chunk, seed):
    layouts = layouts[:1] if mode == "single" else layouts
    env = make_env(layouts, mode)
    net = IdQNet()
    agent = RecurrentDQNAgent(net, ptl_rl.EpsilonGreedySelector(0.3, seed=seed))
    source = ExperienceSource(env, agent, seed=seed, steps_per_batch=chunk)
    check_states(list(scripted_batches(source, layouts, extra_steps=2)), records_of(env), net)


# ---------------------------------------------------------------------- interrupts inside the agent, and peeks
class LineInterrupt:
    """Raise KeyboardInterrupt at the k-th line run inside ``codes`` (through sys.settrace), between two statements."""

    def __init__(self, codes: set[CodeType], k: int) -> None:
        self.codes, self.k, self.lines = codes, k, 0

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code in self.codes:
            return self._local
        return None

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
            if self.lines == self.k:
                raise KeyboardInterrupt
        return self._local


AGENT_CODES = {
    RecurrentDQNAgent.__call__.__wrapped__.__code__,
    RecurrentDQNAgent.reset_state.__code__,
    RecurrentDQNAgent._acting_state.__code__,  # the shared PerEnvState's, which the call runs first
}


ACTOR_CRITIC_CODES = {
    ptl_rl.RecurrentActorCriticAgent.__call__.__wrapped__.__code__,
    ptl_rl.RecurrentActorCriticAgent.reset_state.__code__,
    ptl_rl.RecurrentActorCriticAgent._acting_state.__code__,
    ptl_rl.RecurrentActorCriticAgent._outputs.__code__,  # the sampling agent's, run inside the call
}


def next_interrupted(source: ExperienceSource, k: int, codes: set[CodeType] = AGENT_CODES) -> tuple[Any, bool]:
    """``next(source)`` with a KeyboardInterrupt at the k-th line of the agent's code; (batch or None, fired)."""
    tracer = LineInterrupt(codes, k)
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return next(source), False
    except KeyboardInterrupt:
        return None, True
    finally:
        sys.settrace(previous)


@pytest.mark.parametrize("agent_kind", ["dqn", "actor_critic"])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_an_interrupt_at_any_line_of_the_agent_leaves_every_later_state_right(mode, agent_kind):
    """Interrupt the agent at its 1st, 2nd, ... line (across reset_state and the call) on successive steps: the
    rows that come out are still those of the reference, and the source carries on (it resets every env).
    Both recurrent agents: the Q-value one and the actor-critic one (recurrent PPO), which share PerEnvState."""
    layouts = [[(3, TERM), (2, TRUNC)] * 6, [(4, TRUNC), (1, BOTH)] * 6, [(2, BOTH), (5, TERM)] * 5]
    env = make_env(layouts, mode)
    if agent_kind == "dqn":
        net: Any = IdQNet()
        agent: Any = RecurrentDQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=1))
        codes = AGENT_CODES
    else:
        net = id_actor_critic()
        agent = ptl_rl.RecurrentActorCriticAgent(net, env.single_action_space, seed=1)
        codes = ACTOR_CRITIC_CODES
    source = ExperienceSource(env, agent, seed=0)
    batches, fired, k = [], 0, 1
    while k < 40:
        batch, hit = next_interrupted(source, k, codes)
        batches.append(batch)
        if hit:
            fired += 1
            k += 1
            batches.append(next(source))  # the step after an interrupt resets every env, then acts
        else:
            k = 40  # k is past the agent's lines in one step: every line has been interrupted once
    assert fired >= 10, "the interrupts did not land in the agent"
    batches += [next(source) for _ in range(6)]
    check_states(batches, records_of(env), net)


def test_peeking_at_the_source_behind_a_sequence_buffer_keeps_stored_states_right():
    """next(source) behind the buffer's back: the peeked rows are lost to the buffer (it ends its episodes at
    the gap), the agent's states follow the envs regardless, and every window's states match the reference."""
    layouts = [[(30, TRUNC)] * 4, [(17, TERM)] * 6, [(9, TERM), (25, TRUNC)] * 3]
    env = make_env(layouts, "NextStep")
    net = IdQNet()
    source = ExperienceSource(env, RecurrentDQNAgent(net, ptl_rl.EpsilonGreedySelector(0.5, seed=2)), seed=0)
    buffer = ptl_rl.SequenceReplayBuffer(source, capacity=400, length=4, burn_in=3, pad_end=True, warmup=0, seed=0)
    for step in range(60):
        next(buffer)
        if step % 7 == 3:
            next(source)  # a peek
    windows = buffer.sample(200)
    expected = reference_states(net, records_of(env))
    codes = obs_code(ids_of(windows["obs"]))
    for b in range(len(codes)):
        for t in np.flatnonzero(windows["mask"][b]):
            np.testing.assert_allclose(windows["hidden"][b, t], expected[int(codes[b, t])], rtol=1e-5, atol=1e-6)
        # the stored state at position 0 is the state to replay the window from (padding repeats the first step)
        first = np.flatnonzero(windows["mask"][b])[0]
        np.testing.assert_array_equal(windows["hidden"][b, 0], windows["hidden"][b, first])


# ---------------------------------------------------------------------- checkpoints
def test_a_restored_pipeline_restarts_every_state_from_zeros_and_keeps_exploring_where_it_was():
    """The per-env states are not part of the pipeline state (the source restarts every episode after a restore);
    the agent's selector is: the restored run's epsilon draws continue the saved run's."""
    layouts = [[(6, TRUNC)] * 8, [(4, TERM)] * 12]

    def build(first_episode: int = 0) -> tuple[Any, ExperienceSource, IdQNet]:
        env = make_env(layouts, "SameStep", first_episode=first_episode)
        net = IdQNet()
        selector = ptl_rl.EpsilonGreedySelector(0.5, seed=5)
        return env, ExperienceSource(env, RecurrentDQNAgent(net, selector), seed=0), net

    env, source, net = build()
    for _ in range(7):
        next(source)
    assert source.agent.state is not None and source.agent.state.abs().sum() > 0  # mid-episode states exist
    saved = io.BytesIO()
    torch.save(ptl_rl.pipeline_state_dict(source), saved)
    rng_state = source.agent.selector.rng.bit_generator.state

    env2, restored, net2 = build(first_episode=100)
    saved.seek(0)
    ptl_rl.load_pipeline_state_dict(restored, torch.load(saved, weights_only=True))
    assert restored.agent.selector.rng.bit_generator.state == rng_state
    first = next(restored)
    assert not first["hidden"].any(), "the first step after a restore acts from zeros in every env"
    check_states([first, *(next(restored) for _ in range(10))], records_of(env2), net2)

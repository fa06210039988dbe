"""Every state_dict names its format version; a newer format is refused clearly, an unversioned one still loads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ptl_rl
from ptl_rl.state import STATE_VERSION_KEY


def _rows(n: int) -> ptl_rl.TransitionBatch:
    ids = np.arange(n)
    return ptl_rl.TransitionBatch(
        obs=ids[:, None].astype(np.float32),
        action=ids.astype(np.int64),
        reward=np.ones(n, dtype=np.float32),
        next_obs=ids[:, None].astype(np.float32) + 1,
        terminated=ids % 5 == 4,
        truncated=np.zeros(n, dtype=bool),
        discount=np.full(n, 0.9, dtype=np.float32),
        env_id=ids % 2,
    )


def _filled(buffer: Any) -> Any:
    buffer.add(_rows(12))
    return buffer


def _rollout() -> ptl_rl.RolloutBuffer:
    return ptl_rl.RolloutBuffer(None, 4, num_envs=2, value_fn=lambda obs: np.zeros(len(obs)))


STATEFUL: dict[str, Callable[[], Any]] = {
    "ReplayBuffer": lambda: _filled(ptl_rl.ReplayBuffer(None, 16, warmup=0)),
    "ReplayBuffer(replacement=False)": lambda: _filled(ptl_rl.ReplayBuffer(None, 16, warmup=0, replacement=False)),
    "PrioritizedReplayBuffer": lambda: _filled(ptl_rl.PrioritizedReplayBuffer(None, 16, warmup=0)),
    "SequenceReplayBuffer": lambda: _filled(ptl_rl.SequenceReplayBuffer(None, 16, length=2, warmup=0)),
    "RolloutBuffer": _rollout,
    "ArrayStorage": lambda: _filled(ptl_rl.buffers.ArrayStorage(16)),
    "EpsilonGreedySelector": lambda: ptl_rl.EpsilonGreedySelector(0.1, seed=0),
}


@pytest.fixture(params=sorted(STATEFUL))
def stateful(request: pytest.FixtureRequest) -> tuple[str, Callable[[], Any]]:
    return request.param, STATEFUL[request.param]


def test_state_names_its_version_and_round_trips(stateful):
    name, build = stateful
    state = build().state_dict()
    assert isinstance(state[STATE_VERSION_KEY], int) and state[STATE_VERSION_KEY] >= 1
    build().load_state_dict(state)


def test_a_newer_format_is_refused_naming_the_fix(stateful):
    name, build = stateful
    state = build().state_dict()
    state[STATE_VERSION_KEY] += 1
    with pytest.raises(ValueError, match=r"newer than .* upgrade ptl_rl"):
        build().load_state_dict(state)


def test_a_state_written_before_versions_still_loads(stateful):
    name, build = stateful
    state = build().state_dict()
    del state[STATE_VERSION_KEY]
    build().load_state_dict(state)


def test_versioned_states_survive_weights_only_loading(tmp_path):
    state = STATEFUL["PrioritizedReplayBuffer"]().state_dict()
    torch.save(state, tmp_path / "state.pt")
    assert torch.load(tmp_path / "state.pt", weights_only=True)[STATE_VERSION_KEY] == state[STATE_VERSION_KEY]

"""Replay states saved before the buffers were composed of a storage and a draw strategy still load and sample alike.

``tests/support/data/replay_states_v1.pt`` was written by ``tests/support/replay_checkpoint.py`` at commit
4448689, when the prioritized, sequence and hindsight buffers were subclasses of ``IndexedReplayBuffer`` and
their draw state (priorities, generation stamps, episode links) sat at the top level of the state (format 1).
Loaded into a fresh buffer of today's code, with ``weights_only=True``, each buffer must sample the batch the
old buffer sampled right after its save, bit for bit, and keep taking adds and priority updates.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from replay_checkpoint import BUILDERS, DATA, SAMPLE, rows


def assert_same(got, expected, path: str = "") -> None:
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected), path
        for key in expected:
            assert_same(got[key], expected[key], f"{path}.{key}")
        return
    np.testing.assert_array_equal(np.asarray(got), expected.numpy(), err_msg=path)
    assert np.asarray(got).dtype == expected.numpy().dtype, path


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_format_1_state_loads_and_samples_the_same(name):
    saved = torch.load(DATA, weights_only=True)[name]
    assert saved["state"]["state_version"] == 1
    build, prioritized = BUILDERS[name]
    buffer = build()
    buffer.load_state_dict(saved["state"])
    assert_same(buffer.sample(SAMPLE), saved["expected"])
    # and it goes on: adds (the envs start new episodes), samples, priority feedback, a state of today's format
    buffer.add(rows(100, 9))
    batch = buffer.sample(4)
    if prioritized:
        assert batch.update_priorities(np.ones(4)) == 0
    if name == "her":  # (a restore ends the episodes in flight, which makes their steps sampleable: end them here too)
        buffer.end_episodes()
    again = build()
    again.load_state_dict(buffer.state_dict())
    assert_same(again.sample(SAMPLE), {k: _torch(v) for k, v in buffer.sample(SAMPLE).items()})


def _torch(x):
    return {k: _torch(v) for k, v in x.items()} if isinstance(x, dict) else torch.from_numpy(np.array(x))

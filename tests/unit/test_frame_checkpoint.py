"""A FrameStorage checkpoint written by the code before issue #22's split still loads and samples alike.

``tests/support/data/frame_storage_v1.pt`` was written by ``tests/support/frame_checkpoint.py`` at
commit 7044503 (``ptl_rl/replay/frames.py`` as one module, the compiled insert writing the counters):
a ``ReplayBuffer`` state over a ``FrameStorage`` (array and Dict observations) and the batch that buffer
sampled right after the save. Loaded into a fresh buffer of today's code, with ``weights_only=True``,
the buffer must sample the same batch, bit for bit, and keep taking adds.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from frame_checkpoint import CAPACITY, DATA, N_STEP, SAMPLE, make_storage, stream

from ptl_rl import NStepTransform, ReplayBuffer


def assert_same(got, expected, path: str = "") -> None:
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected), path
        for key in expected:
            assert_same(got[key], expected[key], f"{path}.{key}")
        return
    np.testing.assert_array_equal(np.asarray(got), expected.numpy(), err_msg=path)
    assert np.asarray(got).dtype == expected.numpy().dtype, path


@pytest.mark.parametrize("kind", ["array", "dict"])
def test_saved_frame_storage_loads_and_samples_the_same(kind):
    saved = torch.load(DATA, weights_only=True)[kind]
    buffer = ReplayBuffer(None, CAPACITY, seed=99, storage=make_storage(kind == "dict"))
    buffer.load_state_dict(saved["state"])
    assert len(buffer) == CAPACITY
    twin = copy.deepcopy(buffer)
    assert_same(buffer.sample(SAMPLE), saved["expected"])
    # a pickled copy samples the same too, and both take further adds (the envs start new episodes)
    again = pickle.loads(pickle.dumps(twin))
    assert_same(again.sample(SAMPLE), saved["expected"])
    nstep = NStepTransform(iter(stream(8, kind == "dict", seed=1)), n=N_STEP, gamma=0.9)
    for _ in range(5):
        batch = next(nstep)
        buffer.add(batch)
        again.add(batch)
    assert_same(again.sample(SAMPLE), {k: _torch(v) for k, v in buffer.sample(SAMPLE).items()})


def _torch(x):
    return {k: _torch(v) for k, v in x.items()} if isinstance(x, dict) else torch.from_numpy(np.array(x))

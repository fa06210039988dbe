"""Normalization behind a collector in another process: the statistics travel with the weights.

The learner's ``NormalizeObservations(..., apply_in="model", output="raw")`` learns from the
rows that arrive; its ``module()`` is the policy's first layer, so every ``push_weights``
carries the statistics of that moment. Brute force: each row of ``policy_version`` v must have
been seen by the collector's network exactly as the statistics pushed as v normalize it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from normalized_collector import (
    CLIP,
    OBS_SHAPE,
    check_rows_per_version,
    normalized_cartpole_collector,
    policy_network,
)

import ptl_rl
from ptl_rl.distributed import AsyncSource
from ptl_rl.normalization.module import NormalizationModule


def test_rows_of_each_version_were_normalized_with_the_statistics_pushed_as_that_version():
    norm = ptl_rl.ObservationNormalizer(clip=CLIP, shape=OBS_SHAPE)
    policy = policy_network()
    policy[0] = norm.module()  # the learner's copy: its buffers follow the statistics
    snapshots = {0: (policy[0].shift.clone(), policy[0].scale.clone())}
    source = AsyncSource(normalized_cartpole_collector, policy=policy)
    stage = ptl_rl.NormalizeObservations(source, norm, output="raw", apply_in="model")
    rows = []
    try:
        for i in range(60):
            batch = next(stage)
            rows.append({k: np.array(batch[k]) for k in ("obs", "seen", "policy_version")})
            if i % 6 == 5:
                version = source.push_weights()
                snapshots[version] = (policy[0].shift.clone(), policy[0].scale.clone())
    finally:
        source.close()
    assert check_rows_per_version(rows, snapshots) >= 3, "the collector never moved on to newer weights"
    obs = np.concatenate([r["obs"] for r in rows])
    # the learner's statistics hold exactly the rows it took in, which stay raw in the batches
    assert norm.count == len(obs)
    np.testing.assert_allclose(norm.mean, obs.astype(np.float64).mean(0), rtol=1e-9, atol=1e-9)
    late = snapshots[max(snapshots)]
    assert not torch.equal(late[0], snapshots[0][0])  # the statistics that travelled did change


def test_model_normalization_is_refused_without_the_module_or_with_normalized_output():
    norm = ptl_rl.ObservationNormalizer(shape=OBS_SHAPE)
    source = AsyncSource(normalized_cartpole_collector, policy=policy_network())
    with pytest.raises(ValueError, match="normalizer.module"):
        ptl_rl.NormalizeObservations(source, norm, output="raw", apply_in="model")
    norm.module()
    with pytest.raises(ValueError, match="output='raw'"):
        ptl_rl.NormalizeObservations(source, norm, apply_in="model")
    with pytest.raises(ValueError, match="apply_in='model'"):
        ptl_rl.NormalizeObservations(source, norm)  # no source here to show the agent the normalizer: says what to do
    with pytest.raises(ValueError, match="shape"):
        ptl_rl.ObservationNormalizer().module()


def test_module_follows_every_change_and_a_restore():
    norm = ptl_rl.ObservationNormalizer(clip=None, shape=(3,))
    module = norm.module()
    x = torch.tensor([[1.0, -2.0, 30.0]])
    rows = np.random.default_rng(0).normal(5.0, 3.0, size=(50, 3))
    norm.update(rows)
    torch.testing.assert_close(module(x), torch.as_tensor(norm(x.numpy())))
    other = ptl_rl.ObservationNormalizer(clip=None, shape=(3,))
    twin = other.module()
    other.load_state_dict(norm.state_dict())
    torch.testing.assert_close(twin(x), module(x))
    assert isinstance(module, NormalizationModule) and set(module.state_dict()) == {"shift", "scale"}

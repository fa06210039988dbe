"""Learning test: hindsight relabeling lets DQN solve 10-bit flipping, where DQN on the same budget does not.

The HER paper's bit-flipping env (``tests/support/bit_flip.py``) gives a reward
of -1 on every step until the state equals the goal, and random exploration
reaches a 10-bit goal about once in a thousand episodes, so plain DQN sees almost no
signal. Both arms run the same pipeline and budget (``tests/support/her_bitflip.py``);
only ``n_sampled_goal`` differs (4 vs 0). ``benchmarks/her_bitflip.py`` runs more seeds.
"""

from __future__ import annotations

import pytest
import torch
from her_bitflip import Config, train

BUDGET = 20_000  # env steps per arm; DQN + HER reaches a greedy success rate of 1.0 in about 5,000 (seed 0)


@pytest.mark.learning
def test_dqn_with_her_solves_10_bit_flipping_and_dqn_without_does_not(restore_torch_threads) -> None:
    torch.set_num_threads(1)
    her = train(Config(n_bits=10, her=True, env_steps=BUDGET, seed=0))
    plain = train(Config(n_bits=10, her=False, env_steps=BUDGET, seed=0))
    assert her["env_steps"] < BUDGET + 16 and plain["env_steps"] < BUDGET + 16
    assert her["success_rate"] >= 0.9, her
    assert plain["success_rate"] <= 0.1, plain

"""Learning test: SAC with hindsight relabeling reaches sparse goals, SAC without it does not (the same budget).

``PointGoal-v0`` (``tests/support/point_goal.py``) pays -1 on every step
off a goal of radius 0.05 in a 2x2 square, so random exploration almost never
sees a reward of 0. Both arms are the SAC example with the same flags and seed;
only ``--her``/``--no-her`` differs. The FetchReach records with the same
example are in ``benchmarks/results/fetch_reach.json``.
"""

from __future__ import annotations

import pytest
import torch

from ptl_rl.examples import sac

BUDGET = 6_000  # env steps per arm; with HER the greedy success rate is 1.0 from about 4,000 (seed 0)
FLAGS = [
    "--env-id", "point_goal:PointGoal-v0", "--env-steps", str(BUDGET), "--seed", "0", "--hidden", "64",
    "--gamma", "0.95", "--learning-starts", "500", "--final-eval-episodes", "50",
    "--no-progress-bar", "--runs-dir", "",
]  # fmt: skip


@pytest.mark.learning
def test_sac_with_her_reaches_sparse_goals_and_sac_without_does_not(restore_torch_threads) -> None:
    torch.set_num_threads(1)
    her = sac.train(sac.parse_args([*FLAGS, "--her"]))
    plain = sac.train(sac.parse_args([*FLAGS, "--no-her"]))
    assert her["env_steps"] <= BUDGET + 1 and plain["env_steps"] <= BUDGET + 1
    assert her["success_rate"] >= 0.9, her
    assert plain["success_rate"] <= 0.1, plain

"""Learning test: on CartPole without velocities recurrent PPO learns, the same network without memory does not.

Reaching 475 takes the LSTM arm 110k-140k env steps on seeds 0-2 within a 200k budget
(``benchmarks/recurrent_ppo_cartpole.py``, its table in docs/benchmarks.rst), 4-5 CPU
minutes; the feed-forward arm's greedy return stays between 38 and 47 at every evaluation. This test runs
both arms of the example for 30k env steps (seed 0, the example's defaults otherwise, the learning rate and
clip range annealed over those 30k; about 2 CPU minutes together) and asserts the gap: a shortened run of the
LSTM arm ended at 241 (evaluations 9, 23, 276, 155, 250, 273), the feed-forward arm stays near 40.
"""

from __future__ import annotations

import pytest
import torch

from ptl_rl.examples import recurrent_ppo

BUDGET = ["--env-steps", "30000", "--seed", "0", "--no-progress-bar", "--runs-dir", "", "--no-tensorboard"]


@pytest.mark.learning
@pytest.mark.timeout(1800)  # two training runs, about 2 CPU minutes: allow for a loaded machine
def test_recurrent_ppo_learns_to_balance_without_velocities_and_the_feed_forward_network_does_not(
    restore_torch_threads,
) -> None:
    torch.set_num_threads(1)
    lstm = recurrent_ppo.train(recurrent_ppo.parse_args(["--core", "lstm", *BUDGET]))
    mlp = recurrent_ppo.train(recurrent_ppo.parse_args(["--feed-forward", *BUDGET]))
    history = {name: [round(ret) for _, ret in run["eval_history"]] for name, run in (("lstm", lstm), ("mlp", mlp))}
    assert mlp["final_eval_return"] <= 60.0, (mlp["final_eval_return"], history)
    assert lstm["final_eval_return"] >= 150.0, (lstm["final_eval_return"], history)
    assert lstm["final_eval_return"] >= 3 * mlp["final_eval_return"], history

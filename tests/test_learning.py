"""Learning test: the reference DQN solves CartPole-v1 within its env-step budget."""

from __future__ import annotations

import pytest
import torch

from ptl_rl.examples import dqn


@pytest.fixture
def restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.learning
def test_dqn_solves_cartpole_within_50k_env_steps(restore_torch_threads) -> None:
    # the CLI defaults, one seed: python -m ptl_rl.examples.dqn --env-id CartPole-v1 --env-steps 50000 --seed 0
    args = dqn.parse_args(["--env-id", "CartPole-v1", "--env-steps", "50000", "--seed", "0", "--no-progress-bar"])
    result = dqn.train(args)

    history = ", ".join(f"{steps}: {ret:.0f}" for steps, ret in result["eval_history"])
    # EnvStepLimit stops at the first batch boundary at or past the budget: at most a few vector steps over it
    assert result["env_steps"] <= args.env_steps + args.num_envs * (args.n_step + 1), result
    assert result["final_eval_return"] >= 475.0, (
        f"final greedy return {result['final_eval_return']:.1f} < 475 after {result['env_steps']} env steps "
        f"(greedy mean return by env step: {history})"
    )

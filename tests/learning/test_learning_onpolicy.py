"""Learning tests: PPO and A2C solve CartPole-v1, SAC solves Pendulum-v1, within their env-step budgets.

Each runs the example's ``train`` with its default hyperparameters and one
seed, stopping once a greedy evaluation (20 episodes; SAC 10) reaches the
threshold, then re-evaluates the stopped policy on 100 fresh episodes.
Runtimes here, one thread: PPO and A2C a few seconds, SAC about a minute.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytorch_lightning")


def history(result: dict) -> str:
    return ", ".join(f"{steps}: {ret:.0f}" for steps, ret in result["eval_history"])


@pytest.mark.learning
def test_ppo_cartpole_reaches_475_within_100k_env_steps() -> None:
    from ptl_rl.examples import ppo

    args = ppo.parse_args(["--env-steps", "100000", "--seed", "0", "--no-progress-bar", "--runs-dir", ""])
    result = ppo.train(args)
    assert result["solved_at_env_steps"] is not None, f"greedy evaluations by env step: {history(result)}"
    assert result["solved_at_env_steps"] <= 100_000 + args.num_envs * args.steps_per_env * 2, result
    assert result["final_eval_return"] >= 400.0, result  # the stopped policy also holds up on 100 fresh episodes


@pytest.mark.learning
def test_a2c_cartpole_reaches_475_within_100k_env_steps() -> None:
    from ptl_rl.examples import a2c

    args = a2c.parse_args(["--env-steps", "100000", "--seed", "0", "--no-progress-bar", "--runs-dir", ""])
    result = a2c.train(args)
    assert result["solved_at_env_steps"] is not None, f"greedy evaluations by env step: {history(result)}"
    assert result["final_eval_return"] >= 400.0, result  # the stopped policy also holds up on 100 fresh episodes


@pytest.mark.learning
def test_sac_pendulum_return_at_least_minus_200_within_20k_env_steps() -> None:
    from ptl_rl.examples import sac

    args = sac.parse_args(["--env-steps", "20000", "--seed", "0", "--no-progress-bar", "--runs-dir", ""])
    result = sac.train(args)
    assert result["solved_at_env_steps"] is not None, f"greedy evaluations by env step: {history(result)}"
    assert result["final_eval_return"] >= -200.0, result  # 100 fresh episodes of the stopped policy

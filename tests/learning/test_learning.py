"""Learning tests: the reference DQN, plain and Rainbow-lite, solves CartPole-v1 within its env-step budget."""

from __future__ import annotations

from typing import Any

import pytest

from ptl_rl.examples import dqn

QUIET = ["--no-progress-bar", "--runs-dir", ""]  # no run directory: tests/integration/test_examples_cli.py checks those


def train_and_check_solved(argv: list[str]) -> dict[str, Any]:
    """Train the example with ``argv``; assert it stays within budget and its final greedy return is >= 475."""
    args = dqn.parse_args(argv)
    result = dqn.train(args)

    history = ", ".join(f"{steps}: {ret:.0f}" for steps, ret in result["eval_history"])
    # EnvStepLimit stops at the first batch boundary at or past the budget: at most a few vector steps over it
    assert result["env_steps"] <= args.env_steps + args.num_envs * (args.n_step + 1), result
    assert result["final_eval_return"] >= 475.0, (
        f"final greedy return {result['final_eval_return']:.1f} < 475 after {result['env_steps']} env steps "
        f"(greedy mean return by env step: {history})"
    )
    return result


@pytest.mark.learning
def test_dqn_solves_cartpole_within_50k_env_steps(restore_torch_threads) -> None:
    # the CLI defaults, one seed: python -m ptl_rl.examples.dqn --env-id CartPole-v1 --env-steps 50000 --seed 0
    train_and_check_solved(["--env-id", "CartPole-v1", "--env-steps", "50000", "--seed", "0", *QUIET])


@pytest.mark.learning
def test_rainbow_lite_dqn_solves_cartpole_within_50k_env_steps(restore_torch_threads) -> None:
    # prioritized replay + 3-step returns + dueling head, one seed:
    # python -m ptl_rl.examples.dqn --rainbow --env-id CartPole-v1 --env-steps 50000 --seed 0
    argv = ["--rainbow", "--env-id", "CartPole-v1", "--env-steps", "50000", "--seed", "0", *QUIET]
    args = dqn.parse_args(argv)
    assert (args.prioritized, args.dueling, args.n_step) == (True, True, 3)
    train_and_check_solved(argv)

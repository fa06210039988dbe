"""The SAC example on goal envs (dict observations): --her resolution, clear errors, relabeled replay, success rate."""

from __future__ import annotations

import pytest
import torch

from ptl_rl.examples import sac

GOAL_ENV = ["--env-id", "point_goal:PointGoal-v0"]
QUIET = ["--no-progress-bar", "--runs-dir", ""]


def test_her_is_on_for_goal_envs_unless_turned_off_and_off_for_box_envs() -> None:
    assert sac.parse_args(GOAL_ENV).her is True
    assert sac.parse_args([*GOAL_ENV, "--no-her"]).her is False
    assert sac.parse_args(["--env-id", "Pendulum-v1"]).her is False


def test_her_on_an_env_without_goals_is_a_usage_error_that_names_the_keys(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sac.parse_args(["--env-id", "Pendulum-v1", "--her"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--her needs a goal env" in err and "desired_goal" in err


def test_fetch_reach_ids_of_any_version_get_the_sb3_zoo_recipe() -> None:
    # gymnasium-robotics is not a test dependency: the recipe choice is read from the id alone
    assert sac._goal_recipe("gymnasium_robotics:FetchReach-v4") == "FetchReach"
    assert sac._goal_recipe("FetchReach-v1") == "FetchReach"
    assert sac._goal_recipe("FetchReachDense-v4") == "FetchReach"
    assert sac._goal_recipe("Pendulum-v1") is None
    assert sac.RECIPES["FetchReach"]["gamma"] == 0.95 and sac.RECIPES["FetchReach"]["her"] is True


def test_the_goal_networks_read_observation_and_desired_goal_only() -> None:
    env = __import__("gymnasium").make("point_goal:PointGoal-v0")
    inputs, width = sac.input_layer(env.observation_space)
    obs = {
        "observation": torch.arange(8.0).reshape(2, 4),
        "achieved_goal": torch.full((2, 2), 99.0),  # left out: part of "observation" in the Fetch tasks
        "desired_goal": torch.tensor([[10.0, 11.0], [12.0, 13.0]]),
    }
    assert width == 6
    assert torch.equal(inputs(obs), torch.tensor([[0.0, 1, 2, 3, 10, 11], [4, 5, 6, 7, 12, 13]]))


def test_a_short_her_run_replays_relabeled_goals_and_reports_a_success_rate(monkeypatch) -> None:
    seen = {}
    real_replay_stage = sac.replay_stage

    def spy(buffer, gradient_steps):
        seen["buffer"] = buffer  # the replay stage of the pipeline
        return real_replay_stage(buffer, gradient_steps)

    monkeypatch.setattr(sac, "replay_stage", spy)
    flags = ["--env-steps", "700", "--learning-starts", "300", "--batch-size", "64", "--final-eval-episodes", "3"]
    flags += ["--n-sampled-goal", "3", "--goal-strategy", "final"]
    summary = sac.train(sac.parse_args([*GOAL_ENV, *flags, *QUIET]))
    buffer = seen["buffer"]
    assert (buffer.draws.strategy, buffer.draws.n_sampled_goal) == ("final", 3)
    batch = buffer.sample(2_000)
    assert 0.70 < batch.relabeled.mean() < 0.80  # her_ratio = 1 - 1/(3 + 1) = 0.75
    assert summary["success_rate"] in {0.0, 1 / 3, 2 / 3, 1.0}

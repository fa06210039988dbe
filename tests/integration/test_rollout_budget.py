"""The on-policy examples train whole rollouts: ``--env-steps`` is rounded up to them, each gets all its updates.

``python -m ptl_rl.examples.ppo --env-id Hopper-v5 --env-steps 4096`` (2048-step
rollouts) used to take 321 gradient steps: the env-step limit fired as the second
rollout was collected, which was then trained on for one step. Now the budget buys
``ceil(env_steps / (num_envs * steps_per_env))`` rollouts (the ``--env-steps``
help says so), every rollout collected gets its ``--update-epochs x
--num-minibatches`` gradient steps, a stop on a confirmed target waits for the
rollout's last update too, and the summary (``summary.json`` and the printed line)
reports the env steps taken. Under gymnasium's next-step autoreset a rollout holds
``num_envs * steps_per_env`` transitions plus those of the sub-envs that ran ahead
while another reset (``RolloutBuffer``), so the env steps taken are at least
``rollouts * num_envs * steps_per_env``, not exactly that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ptl_rl.examples import a2c, cli, ppo, recurrent_ppo

NUM_ENVS, STEPS_PER_ENV = 2, 16
ROLLOUT = NUM_ENVS * STEPS_PER_ENV  # 32 env steps per rollout
EPOCHS, MINIBATCHES = 2, 2

QUIET = ["--eval-every", "0", "--final-eval-episodes", "0", "--no-progress-bar", "--no-tensorboard"]
PPO_FLAGS = ["--update-epochs", str(EPOCHS), "--num-minibatches", str(MINIBATCHES), "--hidden", "16"]
EXAMPLES = {
    "ppo": (ppo, PPO_FLAGS, EPOCHS * MINIBATCHES),
    "recurrent_ppo": (recurrent_ppo, [*PPO_FLAGS, "--sequence-length", "8"], EPOCHS * MINIBATCHES),
    "a2c": (a2c, ["--hidden", "16"], 1),  # one gradient step on each whole rollout
}


def run(name: str, budget: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str):
    module, flags, _ = EXAMPLES[name]
    argv = ["--env-id", "CartPole-v1", "--num-envs", str(NUM_ENVS), "--steps-per-env", str(STEPS_PER_ENV),
            "--env-steps", str(budget), *flags, *QUIET, "--runs-dir", str(tmp_path), *extra]  # fmt: skip
    summary = module.train(module.parse_args(argv))
    printed = capsys.readouterr().out
    written = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    return summary, written, printed


@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.parametrize("budget", [3 * ROLLOUT + ROLLOUT // 2, 4 * ROLLOUT], ids=["3.5-rollouts", "4-rollouts"])
def test_the_budget_buys_whole_rollouts_each_trained_in_full(name, budget, tmp_path, capsys, restore_torch_threads):
    summary, written, printed = run(name, budget, tmp_path, capsys)
    rollouts = 4  # 3.5 rollouts rounded up; 4 exactly
    assert summary["rollouts"] == rollouts
    assert summary["gradient_steps"] == rollouts * EXAMPLES[name][2]  # not one step on a last, partial rollout
    env_steps = summary["env_steps"]
    assert env_steps == written["env_steps"] and rollouts * ROLLOUT <= env_steps < rollouts * 2 * ROLLOUT
    assert summary["stopped"] == written["stopped"] == "env-step budget"
    assert (written["rollouts"], written["env_steps_budget"], written["env_steps_per_rollout"]) == (4, budget, ROLLOUT)
    assert (
        f"; {env_steps} env steps in {rollouts} whole rollouts (--env-steps {budget} rounded up to rollouts of "
        f"{ROLLOUT}), {rollouts * EXAMPLES[name][2]} gradient steps, " in printed
    )


@pytest.mark.parametrize("name", ["ppo", "recurrent_ppo"])
def test_a_confirmed_target_stops_after_the_rollouts_last_update(name, tmp_path, capsys, restore_torch_threads):
    # any return reaches -1: the first evaluation, due once the first rollout is collected, stops the run
    target = ["--eval-every", str(ROLLOUT), "--eval-episodes", "2", "--solved-return", "-1", "--confirm-episodes", "1"]
    summary, written, printed = run(name, 10 * ROLLOUT, tmp_path, capsys, *target)
    env_steps = summary["env_steps"]
    assert summary["stopped"] == "target return confirmed" and summary["solved_at_env_steps"] == env_steps >= ROLLOUT
    assert summary["rollouts"] == 1
    assert summary["gradient_steps"] == EPOCHS * MINIBATCHES  # the whole rollout's updates, then the stop
    assert [steps for steps, _ in written["eval_history"]] == [env_steps]
    assert f"; {env_steps} env steps in 1 whole rollouts, {EPOCHS * MINIBATCHES} gradient steps, " in printed


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_the_help_says_how_the_budget_is_rounded(name, capsys):
    with pytest.raises(SystemExit):
        EXAMPLES[name][0].parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert " ".join(cli.ROLLOUT_BUDGET_HELP.split()) in text
    assert (
        "rounded up to whole rollouts: ceil(env-steps / (num-envs x steps-per-env)) rollouts, each trained in full"
        in text
    )

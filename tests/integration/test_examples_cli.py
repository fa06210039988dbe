"""The examples' command lines: help, usage errors, run directories, the plot, the shared flags.

Runs use tiny budgets (a few seconds each); whether the examples learn is the
learning tests' job (test_learning*.py, test_pixel_dqn.py, test_offline.py).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from paths import REPO, SUPPORT

from ptl_rl.examples import cli, env_ids

ROOT = REPO
TESTS = SUPPORT  # catch_env, for dqn_atari's smoke run
EXAMPLES = ["dqn", "dqn_atari", "apex_dqn", "a2c", "ppo", "sac", "offline_bc", "r2d2", "recurrent_ppo"]
RUN_FILES = {"config.json", "hparams.yaml", "metrics.csv", "episodes.csv", "evaluations.csv", "summary.json"}

# tiny runs: (module, argv); every one evaluates at least once and writes a run directory (apex_dqn's runs on the
# session's Ray, in test_apex_example.py)
TINY = {
    "dqn": ["--env-steps", "1500", "--learning-starts", "500", "--eval-every", "500", "--eval-episodes", "2",
            "--final-eval-episodes", "2"],
    "dqn_atari": ["--env-id", "catch_env:PixelCatch-v0", "--network", "small", "--env-steps", "800", "--num-envs", "2",
                  "--buffer-size", "1000", "--learning-starts", "300", "--batch-size", "16", "--eval-every", "400",
                  "--eval-episodes", "2", "--final-eval-episodes", "2", "--accelerator", "cpu", "--log-every", "20"],
    "a2c": ["--env-steps", "1200", "--eval-every", "600", "--eval-episodes", "2", "--final-eval-episodes", "2"],
    "ppo": ["--env-steps", "1024", "--steps-per-env", "16", "--update-epochs", "2", "--eval-every", "512",
            "--eval-episodes", "2", "--final-eval-episodes", "2"],
    "sac": ["--env-steps", "500", "--learning-starts", "300", "--batch-size", "64", "--hidden", "32",
            "--eval-every", "250", "--eval-episodes", "1", "--final-eval-episodes", "1", "--action-noise", "ou"],
    "offline_bc": ["--epochs", "1", "--steps-per-epoch", "20", "--final-eval-episodes", "2"],
    "r2d2": ["--env-steps", "1200", "--learning-starts", "400", "--length", "4", "--burn-in", "2", "--batch-size", "8",
             "--eval-every", "600", "--eval-episodes", "2", "--final-eval-episodes", "2"],
    "recurrent_ppo": ["--env-steps", "1024", "--steps-per-env", "16", "--sequence-length", "8", "--update-epochs", "2",
                      "--num-minibatches", "2", "--eval-every", "512", "--eval-episodes", "2",
                      "--final-eval-episodes", "2"],
}  # fmt: skip


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -c code args...`` from the repository root, with the tests folder importable (catch_env)."""
    env = {"PYTHONPATH": f"{ROOT}:{TESTS}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def run_example(module, argv: list[str]) -> dict:
    """What ``python -m ptl_rl.examples.<module> ARGV`` does, in-process: parse, train; returns the summary."""
    return module.train(module.parse_args(argv))


# the example runs as `python -m`; afterwards, report whether torch or Lightning were imported
RUN_AS_MAIN = """
import runpy, sys
name, argv = sys.argv[1], sys.argv[2:]
sys.argv = [name, *argv]
try:
    runpy.run_module(f"ptl_rl.examples.{name}", run_name="__main__")
except SystemExit as exit:
    heavy = sorted(m for m in ("torch", "pytorch_lightning", "lightning") if m in sys.modules)
    print("HEAVY:", ",".join(heavy), file=sys.stderr)
    raise
"""


# ---------------------------------------------------------------------- help and usage errors
@pytest.mark.parametrize("name", EXAMPLES)
def test_help_names_the_module(name, capsys):
    module = __import__(f"ptl_rl.examples.{name}", fromlist=["parse_args"])
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m ptl_rl.examples.{name}")


def test_python_dash_m_answers_help():
    """The command line itself. An example imports torch and Lightning at its top (it reads top to bottom, as
    CleanRL's scripts do), so its ``--help`` pays for them: docs/design/examples.md, "--help after the imports"."""
    done = run_python(RUN_AS_MAIN, "dqn", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m ptl_rl.examples.dqn")


def test_plot_help_imports_neither_torch_nor_lightning():
    """The plot command reads CSV and JSON only: where it runs (a laptop with copied runs) torch may be absent."""
    done = run_python(RUN_AS_MAIN, "plot", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m ptl_rl.examples.plot")
    assert "HEAVY: \n" in done.stderr, f"--help imported {done.stderr.split('HEAVY:')[-1].strip()}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_flag_has_help_and_shows_its_default(name, monkeypatch):
    """Catch the parser as ``cli.parse`` receives it and read its options."""
    module = __import__(f"ptl_rl.examples.{name}", fromlist=["parse_args"])
    seen = {}

    def capture(parser, *args, **kwargs):
        seen["parser"] = parser
        raise SystemExit(0)

    monkeypatch.setattr(cli, "parse", capture)
    with pytest.raises(SystemExit):
        module.parse_args([])
    parser = seen["parser"]
    options = [action for action in parser._actions if action.option_strings and action.dest != "help"]
    assert len(options) >= 15
    missing = [action.option_strings[0] for action in options if not action.help]
    assert not missing, f"flags without help text: {missing}"
    text = parser.format_help()
    assert text.count("(default:") == len(options), "ArgumentDefaultsHelpFormatter shows each default"


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_mistyped_env_id_exits_2_with_a_suggestion(name, capsys):
    module = __import__(f"ptl_rl.examples.{name}", fromlist=["parse_args"])
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--env-id", "CartPol-v1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: python -m ptl_rl.examples.{name}" in err
    assert "--env-id CartPol-v1: no such gymnasium env; did you mean CartPole-v1" in err


def test_a_mistyped_env_id_on_the_command_line_is_a_usage_line_not_a_traceback():
    done = run_python(RUN_AS_MAIN, "dqn", "--env-id", "CartPol-v1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "error: --env-id CartPol-v1: no such gymnasium env; did you mean CartPole-v1" in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--time-limit", "1:xx"], "is not SS, MM:SS or HH:MM:SS"),
        (["--grad-clip", "-1"], "--grad-clip must be >= 0"),
        (["--train-freq", "0"], "--train-freq must be >= 1"),
        (["--env-id", "Pendulum-v1"], "DQN needs Discrete actions, but Pendulum-v1 has Box"),
    ],
)
def test_bad_shared_flags_end_in_a_usage_error(argv, message, capsys):
    from ptl_rl.examples import dqn

    with pytest.raises(SystemExit) as exit_info:
        dqn.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_time_limit_reads_seconds_minutes_and_hours():
    assert cli.time_limit("5400") == 5400
    assert cli.time_limit("01:30:00") == 5400
    assert cli.time_limit("1:30") == 90
    assert cli.time_limit("0:00:02.5") == 2.5


def test_target_return_defaults_to_the_envs_reward_threshold():
    from ptl_rl.examples import ppo, sac

    assert ppo.parse_args([]).solved_return == 475.0  # CartPole-v1's registered threshold
    assert ppo.parse_args(["--env-id", "Acrobot-v1"]).solved_return == -100.0
    assert ppo.parse_args(["--env-id", "Acrobot-v1", "--solved-return", "inf"]).solved_return is None
    assert sac.parse_args([]).solved_return == -200.0  # Pendulum-v1 has none: the example's own target
    assert sac.parse_args(["--env-id", "MountainCarContinuous-v0"]).solved_return == 90.0
    assert ppo.parse_args(["--eval-episodes", "7"]).confirm_episodes == 7  # none: as many as an evaluation


# ---------------------------------------------------------------------- run directories
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny run of each example, in-process (the imports are paid once): name -> (summary, run directory)."""
    import torch

    threads = torch.get_num_threads()
    base = tmp_path_factory.mktemp("runs")
    sys.path.insert(0, str(TESTS))  # catch_env for dqn_atari
    done = {}
    try:
        for name, argv in TINY.items():
            module = __import__(f"ptl_rl.examples.{name}", fromlist=["train"])
            summary = run_example(module, [*argv, "--seed", "3", "--no-progress-bar", "--runs-dir", str(base)])
            done[name] = (summary, Path(summary["run_dir"]))
    finally:
        sys.path.remove(str(TESTS))
        torch.set_num_threads(threads)
    return done


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("name", list(TINY))
def test_a_run_writes_its_directory(name, runs):
    summary, run_dir = runs[name]
    env_part = {
        "dqn_atari": "catch_env-PixelCatch-v0",
        "sac": "Pendulum-v1",
        "r2d2": "CartPoleNoVelocity-v1",
        "recurrent_ppo": "CartPoleNoVelocity-v1",
    }.get(name, "CartPole-v1")
    assert run_dir.name.startswith(f"{name}_{env_part}_3_2")  # then the start time, YYYYmmdd-HHMMSS
    files = {path.name for path in run_dir.iterdir()}
    assert RUN_FILES <= files, f"missing {RUN_FILES - files}"
    pytest.importorskip("tensorboard")
    assert any(path.name.startswith("events.out.tfevents") for path in (run_dir / "tensorboard").iterdir())


@pytest.mark.parametrize("name", list(TINY))
def test_the_run_directory_holds_config_summary_episodes_and_evaluations(name, runs):
    summary, run_dir = runs[name]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["algo"] == name and config["seed"] == 3 and config["env_id"]
    hparams = (run_dir / "hparams.yaml").read_text()
    for key in ("env_id:", "seed: 3", "time_limit:", "grad_clip:"):
        assert key in hparams

    written = json.loads((run_dir / "summary.json").read_text())
    for key in ("final_eval_return", "env_steps", "wall_time_s", "stopped", "gradient_steps"):
        assert key in written
    assert written["env_steps"] == summary["env_steps"] and written["gradient_steps"] > 0

    evaluations = read_rows(run_dir / "evaluations.csv")
    kinds = [row["kind"] for row in evaluations]
    assert kinds[-1] == "final" and int(evaluations[-1]["episodes"]) == config["final_eval_episodes"]
    assert float(evaluations[-1]["return_mean"]) == pytest.approx(summary["final_eval_return"])
    if name == "offline_bc":  # no env steps while training from a dataset
        assert summary["env_steps"] == 0 and kinds == ["final"]
        return
    periodic = [row for row in evaluations if row["kind"] == "eval"]
    assert periodic, "the tiny budget covers at least one evaluation"
    # evaluation history against env steps: each at or just past a multiple of --eval-every
    eval_steps = [int(row["env_steps"]) for row in periodic]
    assert eval_steps == [steps for steps, _ in summary["eval_history"]]
    assert all(steps >= config["eval_every"] * (i + 1) for i, steps in enumerate(eval_steps))
    assert eval_steps == sorted(eval_steps) and eval_steps[-1] <= summary["env_steps"]

    episodes = read_rows(run_dir / "episodes.csv")
    assert len(episodes) == summary["episodes"] > 0, "every finished training episode is written once"
    steps = [int(row["env_steps"]) for row in episodes]
    assert steps == sorted(steps) and steps[-1] <= summary["env_steps"]
    assert all(int(row["length"]) >= 1 for row in episodes)


def test_dqn_hparams_name_env_seed_nstep_and_epsilon(runs):
    _, run_dir = runs["dqn"]
    hparams = (run_dir / "hparams.yaml").read_text()
    for key in ("env_id: CartPole-v1", "seed: 3", "n_step: 3", "eps_start:", "eps_end:", "eps_decay_steps:",
                "epsilon: linear", "train_freq: 4", "gradient_steps: 1", "hidden: 64"):  # fmt: skip
        assert key in hparams, key


#: Lightning's lines a user cannot act on (no GPU/TPU here, an advertisement, a warning about Lightning's own code)
LIGHTNING_NOISE = ("GPU available: False", "TPU available: False", "litlogger", "LeafSpec")


def test_the_command_line_writes_a_run_directory(tmp_path):
    """One run through ``python -m`` end to end, progress bar on (the others run in-process)."""
    argv = [*TINY["dqn"], "--eval-every", "0", "--log-every", "50", "--runs-dir", str(tmp_path)]
    done = run_python(RUN_AS_MAIN, "dqn", *argv, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = tmp_path.iterdir()
    assert RUN_FILES <= {path.name for path in run_dir.iterdir()}
    assert f"run directory {run_dir}" in done.stdout
    output = done.stdout + done.stderr
    noise = [line for line in output.splitlines() if any(needle in line for needle in LIGHTNING_NOISE)]
    assert not noise, f"the run printed Lightning's noise: {noise}"
    # the progress bar's env_steps: integers, the last one the count the summary reports
    shown = re.findall(r"env_steps=([0-9.]+)", output)
    assert shown and all(value.isdigit() for value in shown), f"env_steps shown as {sorted(set(shown))}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert int(shown[-1]) == summary["env_steps"], (shown[-1], summary["env_steps"])


def test_tensorboard_defaults_to_what_is_installed_and_help_says_so(monkeypatch, capsys):
    from ptl_rl.examples import dqn

    monkeypatch.setattr(cli, "tensorboard_available", lambda: False)
    assert dqn.parse_args([]).tensorboard is False
    with pytest.raises(SystemExit) as exit_info:
        dqn.parse_args(["--tensorboard"])  # asked for, and not there: say so instead of skipping it silently
    assert exit_info.value.code == 2
    assert "--tensorboard: the tensorboard package is not installed; pip install" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dqn.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "installed, which it is not: pip install" in help_text and "(default: False)" in help_text

    monkeypatch.setattr(cli, "tensorboard_available", lambda: True)
    assert dqn.parse_args([]).tensorboard is True and dqn.parse_args(["--no-tensorboard"]).tensorboard is False


def test_a_missing_dataset_is_a_one_line_error_before_anything_is_recorded(tmp_path, capsys):
    from ptl_rl.examples import offline_bc

    for dataset, message in [
        ("does/not/exist-v0", "error: --dataset does/not/exist-v0: no such Minari dataset stored locally"),
        (str(tmp_path), "a directory without a Minari dataset"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            offline_bc.parse_args(["--dataset", dataset])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_plot_help_states_each_default_once(capsys):
    from ptl_rl.examples import plot

    with pytest.raises(SystemExit):
        plot.parse_args(["--help"])
    entries = re.split(r"\n  (?=-)", capsys.readouterr().out)
    title = " ".join(next(entry for entry in entries if entry.startswith("--title")).split())
    assert title.lower().count("default") == 1, title


def test_empty_runs_dir_writes_nothing(tmp_path, monkeypatch, restore_torch_threads):
    from ptl_rl.examples import dqn

    monkeypatch.chdir(tmp_path)
    argv = [*TINY["dqn"], "--env-steps", "600", "--eval-every", "0", "--no-progress-bar", "--runs-dir", ""]
    summary = run_example(dqn, argv)
    assert summary["run_dir"] is None and not list(tmp_path.iterdir())


# ---------------------------------------------------------------------- the plot command
def test_plot_writes_a_png_of_several_runs(runs, tmp_path):
    pytest.importorskip("matplotlib")
    from ptl_rl.examples import plot

    output = plot.main([str(runs["dqn"][1]), str(runs["a2c"][1]), str(runs["sac"][1]), "-o", str(tmp_path / "c.png")])
    data = output.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_rejects_a_folder_that_is_not_a_run(tmp_path, capsys):
    from ptl_rl.examples import plot

    with pytest.raises(SystemExit) as exit_info:
        plot.parse_args([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "not a run directory (no episodes.csv)" in capsys.readouterr().err


def test_moving_average_matches_a_brute_force_mean():
    from ptl_rl.examples.plot import moving_average

    values = list(np.random.default_rng(0).normal(size=50))
    expected = [np.mean(values[max(0, i - 6) : i + 1]) for i in range(50)]
    np.testing.assert_allclose(moving_average(values, 7), expected)


# ---------------------------------------------------------------------- stopping
class FakeTrainer:
    should_stop = False


class FakeModule:
    def __init__(self, q_net):
        self.q_net = q_net

    def log(self, *args, **kwargs):
        pass


def test_a_crossing_that_fresh_episodes_do_not_confirm_keeps_training(monkeypatch, tmp_path):
    """An example's ``Evaluation`` (DQN's here; the others' have the same rule) with ``reporting.Run`` playing."""
    import ptl_rl
    from ptl_rl.examples import dqn, reporting

    argv = ["--eval-every", "100", "--eval-episodes", "4", "--solved-return", "10", "--confirm-episodes", "6",
            "--seed", "5", "--runs-dir", str(tmp_path), "--no-tensorboard"]  # fmt: skip
    args = dqn.parse_args(argv)
    model = dqn.DQN(4, 2)
    source = type("Source", (), {"total_steps": 0, "pop_episodes": lambda self: []})()
    run = reporting.Run("dqn", args, model, source)
    evaluation = dqn.Evaluation(args, run, source, env=None)
    # periodic evaluation means 12 (crosses), 8, 11 (crosses); confirmations 7 (fails), 10 (confirms)
    scripted = iter([12.0, 7.0, 8.0, 11.0, 10.0])
    seeds = []

    def evaluate(env, agent, episodes, seed):
        seeds.append(seed)
        return np.full(episodes, next(scripted))

    monkeypatch.setattr(ptl_rl, "evaluate", evaluate)
    trainer = FakeTrainer()
    for steps in (100, 200, 300):
        source.total_steps = steps
        evaluation.on_train_batch_end(trainer, FakeModule(model.q_net), None, None, 0)
        assert trainer.should_stop == (steps == 300), steps
    rows = [
        (int(row["env_steps"]), row["kind"], int(row["episodes"])) for row in read_rows(run.path / "evaluations.csv")
    ]
    assert rows == [(100, "eval", 4), (100, "confirm", 6), (200, "eval", 4), (300, "eval", 4), (300, "confirm", 6)]
    assert run.solved_at == 300 and run.confirmations == [(100, 7.0), (300, 10.0)]
    assert run.history == [(100, 12.0), (200, 8.0), (300, 11.0)]
    # evaluation k from seed + 10000 + 1000 k, its confirmation from seed + 500000 + 1000 k: all apart
    assert seeds == [10_005, 500_005, 11_005, 12_005, 502_005]


def test_time_limit_stops_training_and_says_so(tmp_path, restore_torch_threads):
    from ptl_rl.examples import dqn

    argv = ["--env-steps", "10000000", "--time-limit", "3", "--eval-every", "0", "--final-eval-episodes", "1",
            "--no-progress-bar", "--runs-dir", str(tmp_path)]  # fmt: skip
    summary = run_example(dqn, argv)
    assert summary["stopped"] == "time limit"
    assert 3 <= summary["train_time_s"] and summary["env_steps"] < 10_000_000
    assert json.loads((Path(summary["run_dir"]) / "summary.json").read_text())["stopped"] == "time limit"


# ---------------------------------------------------------------------- gradient clipping
@pytest.mark.parametrize(("name", "argv"), [("dqn", TINY["dqn"]), ("sac", TINY["sac"])])
def test_grad_clip_bounds_every_optimizer_steps_gradient_norm(name, argv, monkeypatch, restore_torch_threads):
    """DQN and SAC both optimize by hand (manual optimization) and clip through clip_gradients."""
    import pytorch_lightning as pl
    import torch

    module = __import__(f"ptl_rl.examples.{name}", fromlist=["train"])
    clip_gradients = pl.LightningModule.clip_gradients
    norms = []

    def spy(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norms.append((gradient_clip_val, float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))))

    monkeypatch.setattr(pl.LightningModule, "clip_gradients", spy)
    run_example(module, [*argv, "--eval-every", "0", "--grad-clip", "0.01", "--no-progress-bar", "--runs-dir", ""])
    assert norms and all(value == 0.01 for value, _ in norms)
    assert max(norm for _, norm in norms) <= 0.01 * (1 + 1e-4)


# ---------------------------------------------------------------------- grouped gradient steps
@pytest.mark.parametrize("group", [1, 4])
def test_dqn_batches_per_step_counts_every_gradient_step(group, monkeypatch, restore_torch_threads):
    """--batches-per-step K: one Lightning step of K gradient steps; the summary and target syncs count each one."""
    import torch

    from ptl_rl.examples import dqn

    steps = []
    step = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        steps.append(1)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    argv = [*TINY["dqn"], "--eval-every", "0", "--batches-per-step", str(group), "--hidden", "12", "7",
            "--no-progress-bar", "--runs-dir", ""]  # fmt: skip
    summary = run_example(dqn, argv)
    assert summary["gradient_steps"] == len(steps) > 100
    # 1500 env steps, learning from 500 on, one gradient step per 4 env steps: 250, less the batches pulled ahead
    # (Lightning's prefetch, the budget check between steps), plus up to K - 1 more for a group that straddles it
    assert 246 <= summary["gradient_steps"] <= 250 + group - 1


def test_dqn_hidden_takes_one_or_two_widths(capsys):
    from ptl_rl.examples import dqn

    assert dqn.parse_args(["--hidden", "32"]).hidden == 32
    assert dqn.parse_args(["--hidden", "120", "84"]).hidden == [120, 84]
    net = dqn.QNetwork(4, 2, [120, 84])
    assert [layer.out_features for layer in net.net if hasattr(layer, "out_features")] == [120, 84, 2]
    for bad in (["--hidden", "1", "2", "3"], ["--hidden", "0"], ["--batches-per-step", "0"]):
        with pytest.raises(SystemExit):
            dqn.parse_args(bad)
    assert "--hidden takes one or two positive widths" in capsys.readouterr().err


def test_ppo_anneals_the_learning_rate_once_per_rollout(monkeypatch, restore_torch_threads):
    """PPO optimizes by hand, so it steps its epoch-interval scheduler itself: once per rollout, to lr * (1 - k/K)."""
    import torch

    from ptl_rl.examples import ppo

    seen = []
    step = torch.optim.lr_scheduler.LambdaLR.step

    def spy(self, *args, **kwargs):
        step(self, *args, **kwargs)
        seen.append(self.get_last_lr()[0])

    monkeypatch.setattr(torch.optim.lr_scheduler.LambdaLR, "step", spy)
    argv = [*TINY["ppo"], "--eval-every", "0", "--anneal", "--lr", "0.001", "--no-progress-bar", "--runs-dir", ""]
    summary = run_example(ppo, argv)
    rollouts = summary["rollouts"]
    assert rollouts >= 4
    # the scheduler's own first step at construction, then one per rollout
    np.testing.assert_allclose(seen, [0.001 * (1 - k / rollouts) for k in range(rollouts + 1)], rtol=1e-6)


# ---------------------------------------------------------------------- burst training
@pytest.mark.parametrize(("train_freq", "gradient_steps"), [(1, 1), (4, 1), (8, 3), (5, 16)])
def test_burst_takes_g_batches_every_k_env_steps(train_freq, gradient_steps):
    import gymnasium as gym

    import ptl_rl
    from ptl_rl.examples.burst import replay_stage

    env = gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="sync")
    source = ptl_rl.ExperienceSource(env, lambda obs: np.zeros(len(obs), dtype=np.int64), seed=0)
    buffer = ptl_rl.ReplayBuffer(source, capacity=1_000, warmup=50, transitions_per_yield=train_freq, seed=0)
    sampler = ptl_rl.BatchSampler(replay_stage(buffer, gradient_steps), batch_size=8)
    steps_at_batch = [(next(sampler), source.total_steps)[1] for _ in range(12 * gradient_steps)]
    # brute force: batch i follows burst i // G, which follows the warm-up and (i // G) * K more env steps
    first = max(50, train_freq)
    expected = [first + (i // gradient_steps) * train_freq for i in range(12 * gradient_steps)]
    assert steps_at_batch == expected
    env.close()


# ---------------------------------------------------------------------- SAC exploration noise
def test_ou_noise_has_the_asked_std_and_correlation_and_restarts_each_episode():
    import gymnasium as gym

    import ptl_rl
    from ptl_rl.examples.sac import NoisyAgent

    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

    class Zero:
        """A stand-in for the policy agent: policy action 0, after its warm-up."""

        total_steps, warmup_steps = 10, 0
        rescaler = ptl_rl.ActionRescaler(space)

        def __call__(self, obs):
            return np.zeros((1, 1), np.float32), {"policy_action": np.zeros((1, 1), np.float32)}

    agent = NoisyAgent(Zero(), "ou", std=0.3, theta=0.05, num_envs=1, act_dim=1, seed=0)
    samples = np.array([agent(None)[1]["policy_action"][0, 0] for _ in range(40_000)], dtype=np.float64)
    assert abs(samples.std() - 0.3) < 0.03
    lag1 = np.corrcoef(samples[:-1], samples[1:])[0, 1]
    assert abs(lag1 - 0.95) < 0.02  # 1 - theta
    env_action, extras = agent(None)
    np.testing.assert_allclose(env_action, 2.0 * extras["policy_action"], rtol=1e-6)  # rescaled to [-2, 2]
    agent.reset_state(np.array([True]))
    assert agent.state[0, 0] == 0.0


def test_sac_action_noise_flags():
    from ptl_rl.examples import sac

    args = sac.parse_args(["--action-noise", "ou", "--noise-std", "0.8", "--noise-theta", "0.02"])
    assert (args.action_noise, args.noise_std, args.noise_theta) == ("ou", 0.8, 0.02)
    with pytest.raises(SystemExit):
        sac.parse_args(["--noise-theta", "0"])


# ---------------------------------------------------------------------- videos (--video-every)
def test_help_names_what_videos_need_and_how_to_install_it(capsys):
    from ptl_rl.examples import dqn

    with pytest.raises(SystemExit):
        dqn.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--video-every" in text and "--video-episodes" in text and "--video-format {mp4,gif}" in text
    assert "imageio-ffmpeg (MP4) and pillow (GIF)" in text and 'pip install "ptl_rl[video]"' in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--video-every", "100", "--runs-dir", ""], "--video-every writes into the run directory"),
        (["--video-every", "100", "--video-episodes", "0"], "--video-episodes >= 1"),
        (["--video-every", "100", "--video-format", "avi"], "invalid choice: 'avi'"),
    ],
)
def test_bad_video_flags_end_in_a_usage_error(argv, message, capsys):
    from ptl_rl.examples import dqn

    with pytest.raises(SystemExit) as exit_info:
        dqn.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_videos_without_their_packages_are_refused_when_the_flags_are_parsed(monkeypatch, capsys):
    from ptl_rl.examples import dqn

    monkeypatch.setattr(cli, "missing_video_packages", lambda fmt: ["imageio-ffmpeg"] if fmt == "mp4" else [])
    assert dqn.parse_args(["--video-every", "100", "--video-format", "gif"]).video_every == 100
    with pytest.raises(SystemExit) as exit_info:
        dqn.parse_args(["--video-every", "100"])
    assert exit_info.value.code == 2
    assert '--video-every: writing videos needs imageio-ffmpeg; pip install "ptl_rl[video]"' in capsys.readouterr().err
    assert dqn.parse_args([]).video_every == 0  # off by default: nothing is needed


def test_an_env_that_cannot_render_is_refused_when_the_flags_are_parsed(capsys):
    from ptl_rl.examples import dqn_atari

    with pytest.raises(SystemExit) as exit_info:
        dqn_atari.parse_args(["--env-id", "catch_env:PixelCatch-v0", "--video-every", "100"])
    assert exit_info.value.code == 2
    assert "--video-every: catch_env:PixelCatch-v0 cannot render rgb_array frames" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_a_run_with_videos_writes_one_file_per_recording_into_its_directory(name, tmp_path, restore_torch_threads):
    pytest.importorskip("imageio_ffmpeg", reason="the video extra")
    pytest.importorskip("pygame", reason="the video extra")
    from videos import decode_mp4

    module = __import__(f"ptl_rl.examples.{name}", fromlist=["train"])
    argv = [*TINY[name], "--eval-every", "0", "--video-every", "250", "--no-progress-bar", "--runs-dir", str(tmp_path)]
    summary = run_example(module, argv)
    videos = summary["videos"]
    steps = [entry["env_steps"] for entry in videos]
    assert len(steps) >= 2 and steps[-1] == summary["env_steps"] and steps == sorted(set(steps))
    written = sorted((Path(summary["run_dir"]) / "videos").iterdir())
    assert [str(path) for path in written] == [entry["paths"][0] for entry in videos]
    for entry, path in zip(videos, written, strict=True):
        assert len(decode_mp4(path)) == entry["lengths"][0] + 1
    assert json.loads((Path(summary["run_dir"]) / "summary.json").read_text())["videos"] == videos


def test_dqn_atari_films_the_colour_screen_of_the_env_its_agent_sees_preprocessed():
    pytest.importorskip("ale_py", reason="the atari extra")
    from ptl_rl.examples import dqn_atari

    env_ids.register_ale()
    env = dqn_atari.make_single_env("ALE/Pong-v5", 4, render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and env.render().shape == (210, 160, 3)
    assert dqn_atari.make_single_env("ALE/Pong-v5", 4).render_mode is None  # the training envs never render


def test_the_progress_bar_shows_env_steps_as_digits(monkeypatch):
    # tqdm writes a number in the shorter of its .3g form and its digits: 10,000 as 1e+4
    import io
    from types import SimpleNamespace

    from tqdm import tqdm

    from ptl_rl.examples.reporting import EnvStepsProgressBar

    lightnings_bar = EnvStepsProgressBar.__mro__[1]  # TQDMProgressBar of the Lightning package the examples use
    monkeypatch.setattr(lightnings_bar, "get_metrics", lambda self, trainer, module: {"env_steps": 9808.0})
    bar = EnvStepsProgressBar(SimpleNamespace(total_steps=10_000), refresh_rate=1)  # type: ignore[arg-type]
    shown = tqdm(total=1, file=io.StringIO())
    shown.set_postfix(bar.get_metrics(None, None))  # type: ignore[arg-type]
    assert "env_steps=10000" in shown.postfix

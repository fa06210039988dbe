"""README.rst promises two commands; CI must run the very same test command."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys

import pytest
from paths import REPO

ROOT = REPO


def readme_commands() -> list[str]:
    return [
        line.strip()
        for line in (ROOT / "README.rst").read_text().splitlines()
        if line.strip().startswith("python3 -m venv")
    ]


def test_readme_gives_a_demo_and_a_test_command() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    demo, tests = commands
    assert "constraints.txt" in demo and "ptl_rl.examples.dqn" in demo
    assert "constraints.txt" in tests and "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert readme_commands()[1] in ci_lines


def test_ci_runs_the_readme_checks_and_the_type_checker() -> None:
    """The lint and type-check lines README.rst gives are lines of .ci/run, mypy on the whole package among them."""
    readme = [line.strip() for line in (ROOT / "README.rst").read_text().splitlines()]
    checks = [line for line in readme if line.startswith((".venv/bin/ruff", ".venv/bin/mypy"))]
    assert ".venv/bin/mypy ptl_rl" in checks
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert all(line in ci_lines for line in checks), checks
    # the checker CI runs is the one the constraints pin, installed by the dev extra
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    assert any(re.fullmatch(r"mypy==[\d.]+", line) for line in constraints)
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert any(line.strip().startswith("mypy") for line in config["options.extras_require"]["dev"].splitlines())


def readme_code_block(after: str) -> str:
    """The first ``.. code-block:: python`` of README.rst after the line ``after``."""
    lines = (ROOT / "README.rst").read_text().splitlines()
    start = lines.index(".. code-block:: python", lines.index(after)) + 2
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block)


def test_the_readme_pipeline_example_runs() -> None:
    namespace: dict = {}
    exec(compile(readme_code_block("The pipeline, stage by stage"), "README.rst", "exec"), namespace)  # noqa: S102
    assert len(namespace["buffer"]) >= 1_000
    assert namespace["loader"] is not None


def test_the_readme_user_stage_example_runs() -> None:
    namespace: dict = {}
    exec(compile(readme_code_block("Your own stages, storages and agents"), "README.rst", "exec"), namespace)  # noqa: S102
    clip, sampler = namespace["clip"], namespace["sampler"]
    assert clip.clipped == namespace["source"].total_steps >= 256  # CartPole's every reward of 1.0 was clipped
    assert next(sampler).reward.max().item() <= 0.5 * (1 + 0.99 + 0.99**2) + 1e-6
    assert " <- ClipRewards <- ExperienceSource(" in repr(sampler)


def test_the_readme_lightning_project_example_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the Trainer writes its logs and checkpoints here
    namespace: dict = {}
    code = readme_code_block("Using ptl_rl in an existing Lightning project")
    exec(compile(code, "README.rst", "exec"), namespace)  # noqa: S102
    trainer = namespace["trainer"]
    assert 200 <= trainer.global_step <= 300 and "eval/return_mean" in trainer.callback_metrics
    checkpoint_callback = trainer.checkpoint_callback
    assert checkpoint_callback.best_model_path and checkpoint_callback.last_model_path


def test_the_scaling_out_example_trains_from_a_background_collector(tmp_path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    (tmp_path / "collectors.py").write_text(readme_code_block("Scaling out"))
    train = readme_code_block("The learner (``train.py``) trains on what the collector sends; an")
    assert "max_steps=2_000" in train
    (tmp_path / "train.py").write_text(train.replace("max_steps=2_000", "max_steps=20, enable_progress_bar=False"))
    run = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "max_steps=20` reached" in run.stderr + run.stdout


# ---------------------------------------------------------------------- what a new user reads and types
def readme_text() -> str:
    return (ROOT / "README.rst").read_text()


def after_quick_start() -> str:
    text = readme_text()
    return text[text.index(readme_commands()[1]) + len(readme_commands()[1]) :]


def test_commands_after_the_quick_start_use_the_venv_it_made() -> None:
    """The quick start never activates .venv: a bare python/pip would be another interpreter."""
    bare = re.findall(r"(?<![\w/.-])(?:python3?|pip) (?:-m|install)\b[^`\n]*", after_quick_start())
    assert not bare, f"commands without .venv/bin/: {bare}"


def test_extras_install_from_the_clone() -> None:
    """No release is on a package index: ``pip install 'ptl_rl[x]'`` finds nothing, ``-e ".[x]"`` works."""
    text = readme_text()
    assert not re.findall(r"ptl_rl\[\w+\]", text)
    extras = set(re.findall(r'-e "\.\[(\w+)\]"', text))
    declared = configparser.ConfigParser()
    declared.read(ROOT / "setup.cfg")
    assert {"offline", "ray", "envpool", "atari"} <= extras <= set(declared["options.extras_require"])


def test_the_stated_dependency_ranges_are_setup_cfgs() -> None:
    declared = configparser.ConfigParser()
    declared.read(ROOT / "setup.cfg")
    ranges = [line.strip() for line in declared["options"]["install_requires"].splitlines() if line.strip()]
    stated = " ".join(readme_text()[: readme_text().index("Documentation\n")].split())
    assert all(f"``{requirement}``" in stated for requirement in ranges), (ranges, stated)


def test_each_suite_folder_lists_what_its_tests_cover() -> None:
    """The README names the folder that holds the EnvPool tests; check it against the files."""
    folders = dict(re.findall(r"``(tests/\w+)`` \(([^)]*)\)", " ".join(readme_text().split())))
    for folder, covers in folders.items():
        has_envpool = any(
            re.search(r"^\s*(import envpool|\w+ = pytest\.importorskip\(.envpool.\))", path.read_text(), re.M)
            for path in (ROOT / folder).glob("test_*.py")
        )
        assert has_envpool == ("EnvPool" in covers), (folder, covers)


def test_plain_dqn_flags_give_plain_dqn() -> None:
    from ptl_rl.examples import dqn

    (flags,) = re.findall(r"plain DQN is\s+``([^`]+)``", readme_text())
    args = dqn.parse_args(flags.split())
    assert args.n_step == 1 and not args.double and not args.prioritized and not args.dueling, flags


def test_quick_start_says_where_the_run_goes_and_when_it_stops() -> None:
    import gymnasium as gym

    from ptl_rl.examples import dqn, runs

    text = readme_text()
    quick = " ".join(text[text.index("Quick start") : text.index(readme_commands()[1])].split())
    args = dqn.parse_args(readme_commands()[0].split("ptl_rl.examples.dqn")[1].split())
    prefix = runs.run_name("dqn", args.env_id, args.seed).rsplit("_", 1)[0]
    assert f"``{args.runs_dir}/{prefix}_" in quick, quick
    assert args.solved_return == gym.spec(args.env_id).reward_threshold
    assert f"{args.solved_return:g}" in quick and "stops early" in quick


def test_the_catch_claim_is_what_the_learning_test_checks() -> None:
    test = (ROOT / "tests" / "learning" / "test_pixel_dqn.py").read_text()
    (steps,) = re.findall(r'"--env-steps", "(\d+)"', test.split("CATCH_ARGS")[1].split("]")[0])
    (solved,) = re.findall(r'"--solved-return", "([\d.]+)"', test)
    (final,) = re.findall(r'result\["final_eval_return"\] >= ([\d.]+)', test)
    text = readme_text()
    claim = " ".join(text[text.index("The test suite trains the same module") :].split("\n\n")[0].split())
    for number in (f"{int(steps):,}", solved, final):
        assert number in claim, (number, claim)


def test_git_ignores_what_the_readme_commands_write() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("curves.png", "runs/dqn_CartPole-v1_0_20250101-000000/summary.json"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
        assert done.returncode == 0, f"{path} is not ignored by git"


def test_every_benchmark_table_in_the_readme_is_a_scripts_table_of_the_committed_records() -> None:
    """README's benchmark tables are the literal ``--table`` output of each script over its committed records."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "_records.py"), "--check"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_prioritized_benchmark_writes_a_dated_record_with_every_repeat(tmp_path) -> None:
    """A short run of ``prioritized.py`` appends a record (date, commit, load, machine, medians, repeats) to the
    file it is given, and its ``--table`` reads it back: the form every README figure comes from."""
    results = tmp_path / "prioritized.json"
    script = [sys.executable, str(ROOT / "benchmarks" / "prioritized.py"), "--results", str(results)]
    done = subprocess.run(
        [*script, "--size", "2000", "--rounds", "1", "--calls", "3"], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = json.loads(results.read_text())
    for key in ("date", "commit", "load", "machine", "config", "medians", "repeats"):
        assert key in record, key
    assert record["machine"]["cores"] >= 1 and record["load"]["before"] is not None
    table = subprocess.run([*script, "--table"], capture_output=True, text=True, timeout=120, check=False)
    assert table.returncode == 0 and record["date"][:10] in table.stdout, table.stdout

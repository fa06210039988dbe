"""README.rst promises two commands; CI must run the very same test command."""

from __future__ import annotations

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

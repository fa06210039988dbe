"""README.rst promises two commands; CI must run the very same test command."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def test_the_readme_pipeline_example_runs() -> None:
    lines = (ROOT / "README.rst").read_text().splitlines()
    start = lines.index(".. code-block:: python") + 2
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    namespace: dict = {}
    exec(compile("\n".join(block), "README.rst", "exec"), namespace)  # noqa: S102
    assert len(namespace["buffer"]) >= 1_000
    assert namespace["loader"] is not None

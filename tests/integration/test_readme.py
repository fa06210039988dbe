"""README.rst and the docs pages against what they describe: the commands CI runs, the code examples (run here),
the claims that tests and records back, and the README's size (a summary; the manual is docs/)."""

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


def code_block(page: str, after: str) -> str:
    """The first ``.. code-block:: python`` of ``page`` (README.rst or a docs page) after the line ``after``."""
    lines = (ROOT / page).read_text().splitlines()
    start = lines.index(".. code-block:: python", lines.index(after)) + 2
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block)


def run_block(page: str, after: str) -> dict:
    namespace: dict = {}
    exec(compile(code_block(page, after), page, "exec"), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize(
    ("page", "after"),
    [("README.rst", "In a notebook, stage by stage"), ("docs/pipeline.rst", "The pipeline, stage by stage")],
)
def test_the_pipeline_example_runs(page: str, after: str) -> None:
    namespace = run_block(page, after)
    assert len(namespace["buffer"]) >= 1_000
    assert namespace["loader"] is not None


@pytest.mark.parametrize(
    ("page", "after"),
    [("README.rst", "Your own stages, storages and agents"), ("docs/extending.rst", "Writing a stage")],
)
def test_the_user_stage_example_runs(page: str, after: str) -> None:
    import ptl_rl

    namespace = run_block(page, after)
    clip, sampler = namespace["clip"], namespace["sampler"]
    assert isinstance(clip, ptl_rl.Stage)  # the example teaches the base class, with step() and self.pull()
    assert clip.clipped == namespace["source"].total_steps >= 256  # CartPole's every reward of 1.0 was clipped
    assert next(sampler).reward.max().item() <= 0.5 * (1 + 0.99 + 0.99**2) + 1e-6
    assert " <- ClipRewards <- ExperienceSource(" in repr(sampler)


@pytest.mark.parametrize(
    ("page", "after"),
    [("README.rst", "In an existing Lightning project"), ("docs/lightning.rst", "Lightning integration")],
)
def test_the_lightning_project_example_runs(page: str, after: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the Trainer writes its logs and checkpoints here
    trainer = run_block(page, after)["trainer"]
    assert 200 <= trainer.global_step <= 300 and "eval/return_mean" in trainer.callback_metrics
    checkpoint_callback = trainer.checkpoint_callback
    assert checkpoint_callback.best_model_path and checkpoint_callback.last_model_path


def test_the_scaling_out_example_trains_from_a_background_collector(tmp_path) -> None:
    page = "docs/scaling.rst"
    (tmp_path / "collectors.py").write_text(code_block(page, "Scaling out"))
    train = code_block(page, "The learner (``train.py``) trains on what the collector sends; an")
    assert "max_steps=2_000" in train
    (tmp_path / "train.py").write_text(train.replace("max_steps=2_000", "max_steps=20, enable_progress_bar=False"))
    run = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "max_steps=20` reached" in run.stderr + run.stdout


# ---------------------------------------------------------------------- what a new user reads and types
README_MAX_LINES = 400  # what ptl_rl is, the quick start, the picture, the two ways in, features, one table, tests
DOCS_PAGES = sorted((ROOT / "docs").glob("*.rst"))


def readme_text() -> str:
    return (ROOT / "README.rst").read_text()


def page_text(page: str) -> str:
    return (ROOT / page).read_text()


def section(text: str, title: str) -> str:
    """The text of the section ``title`` (its underline included) up to the next heading of any level."""
    lines = text.splitlines()
    start = next(
        i for i, line in enumerate(lines[:-1]) if line == title and re.fullmatch(r"([=\-~^])\1+", lines[i + 1])
    )
    end = next(
        (i for i in range(start + 2, len(lines) - 1) if lines[i] and re.fullmatch(r"([=\-~^])\1{2,}", lines[i + 1])),
        len(lines),
    )
    return "\n".join(lines[start:end])


def test_the_readme_is_a_summary() -> None:
    """The README says what ptl_rl is and how to start; the manual is the docs site."""
    lines = readme_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.rst has {len(lines)} lines; move detail to a docs page"


def test_the_readme_links_point_at_files_that_exist() -> None:
    links = re.findall(r"`[^`<>]+<([^`<>\s]+)>`_", readme_text())
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local), links
    assert all((ROOT / link).is_file() for link in local), [link for link in local if not (ROOT / link).is_file()]
    # every concept page, but those the README's own sections make (home, quick start, development) and the index
    taken = {"docs/index.rst", "docs/quickstart.rst", "docs/development.rst", "docs/design.rst"}
    pages = {f"docs/{path.name}" for path in DOCS_PAGES} - taken
    assert pages <= set(local), f"docs pages the README's feature list does not link: {pages - set(local)}"


def test_commands_after_the_quick_start_use_the_venv_it_made() -> None:
    """The quick start never activates .venv: a bare python/pip would be another interpreter (README and docs)."""
    text = readme_text()
    after = text[text.index(readme_commands()[0]) + len(readme_commands()[0]) :]
    texts = {"README.rst": after, **{f"docs/{path.name}": path.read_text() for path in DOCS_PAGES}}
    for page, text in texts.items():
        kept = "\n".join(line for line in text.splitlines() if not line.strip().startswith("python3 -m venv"))
        bare = re.findall(r"(?<![\w/.-])(?:python3?|pip) (?:-m|install)\b[^`\n]*", kept)
        assert not bare, f"commands without .venv/bin/ in {page}: {bare}"


def test_extras_install_from_the_clone() -> None:
    """No release is on a package index: ``pip install 'ptl_rl[x]'`` finds nothing, ``-e ".[x]"`` works."""
    text = readme_text() + "".join(path.read_text() for path in DOCS_PAGES)
    assert not re.findall(r"ptl_rl\[\w+\]", text)
    extras = set(re.findall(r'-e "\.\[(\w+)\]"', text))
    declared = configparser.ConfigParser()
    declared.read(ROOT / "setup.cfg")
    assert {"offline", "ray", "envpool", "atari"} <= extras <= set(declared["options.extras_require"])


def test_the_stated_dependency_ranges_are_setup_cfgs() -> None:
    declared = configparser.ConfigParser()
    declared.read(ROOT / "setup.cfg")
    ranges = [line.strip() for line in declared["options"]["install_requires"].splitlines() if line.strip()]
    stated = " ".join(section(readme_text(), "Quick start").split())
    assert all(f"``{requirement}``" in stated for requirement in ranges), (ranges, stated)


def test_each_suite_folder_lists_what_its_tests_cover() -> None:
    """The development page names the folder that holds the EnvPool tests; check it against the files."""
    folders = dict(re.findall(r"``(tests/\w+)`` \(([^)]*)\)", " ".join(page_text("docs/development.rst").split())))
    assert set(folders) == {"tests/unit", "tests/property", "tests/integration", "tests/learning"}, folders
    for folder, covers in folders.items():
        has_envpool = any(
            re.search(r"^\s*(import envpool|\w+ = pytest\.importorskip\(.envpool.\))", path.read_text(), re.M)
            for path in (ROOT / folder).glob("test_*.py")
        )
        assert has_envpool == ("EnvPool" in covers), (folder, covers)


def test_the_readme_states_the_fast_subset_command() -> None:
    tests = section(readme_text(), "Running the tests")
    assert '.venv/bin/python -m pytest -m "not learning"' in tests
    assert re.search(r"whole\s+suite took \d+ minutes", tests), tests
    assert re.search(r"fast\s+subset.*took \d+ minutes", tests, re.S), tests


def test_plain_dqn_flags_give_plain_dqn() -> None:
    from ptl_rl.examples import dqn

    (flags,) = re.findall(r"plain DQN is\s+``([^`]+)``", page_text("docs/examples.rst"))
    args = dqn.parse_args(flags.split())
    assert args.n_step == 1 and not args.double and not args.prioritized and not args.dueling, flags


def test_quick_start_says_where_the_run_goes_and_when_it_stops() -> None:
    import gymnasium as gym

    from ptl_rl.examples import dqn, runs

    quick = " ".join(section(readme_text(), "Quick start").split())
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
    text = page_text("docs/pixels.rst")
    claim = " ".join(text[text.index("The test suite trains the same module") :].split("\n\n")[0].split())
    for number in (f"{int(steps):,}", solved, final):
        assert number in claim, (number, claim)


def test_git_ignores_what_the_readme_commands_write() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("curves.png", "runs/dqn_CartPole-v1_0_20250101-000000/summary.json"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
        assert done.returncode == 0, f"{path} is not ignored by git"


def test_every_benchmark_table_is_a_scripts_table_of_the_committed_records() -> None:
    """The tables of docs/benchmarks.rst (every one) and of README.rst (its one results table) are the literal
    ``--table`` output of each script over its committed records."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "_records.py"), "--check"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_prioritized_benchmark_writes_a_dated_record_with_every_repeat(tmp_path) -> None:
    """A short run of ``prioritized.py`` appends a record (date, commit, load, machine, medians, repeats) to the
    file it is given, and its ``--table`` reads it back: the form every benchmark figure comes from."""
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

"""An Atari env id on an install without ale-py names the ``atari`` extra, and suggests no unrelated env.

``python -m ptl_rl.examples.dqn --env-id ALE/Pong-v5`` without ale-py used to say
only "no such gymnasium env", and ``Pong-v5`` suggested ``Ant-v5`` (the names share
"-v5"). ale-py is installed in the test environment, so these tests make it look
absent: its ids leave gymnasium's registry and ``import ale_py`` fails, which is
how the examples' command line finds out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import pytest
from gymnasium.envs.registration import registry

from ptl_rl.examples import dqn, env_ids


@pytest.fixture
def saved_registry() -> Iterator[None]:
    """Put gymnasium's registry and ``sys.modules["ale_py"]`` back as they were, in step with each other.

    A test may register ALE's ids or take them out, and import ale_py or hide it; ale_py registers its ids
    only when first imported, so an imported ale_py without its ids would fail later tests.
    """
    saved, ale_py = dict(registry), sys.modules.get("ale_py")
    yield
    registry.clear()
    registry.update(saved)
    if ale_py is None:
        sys.modules.pop("ale_py", None)
    else:
        sys.modules["ale_py"] = ale_py


@pytest.fixture
def without_ale_py(saved_registry, monkeypatch) -> None:
    """As on an install without the atari extra: no ALE ids registered, and ale_py cannot be imported."""
    for env_id in [i for i in registry if str(registry[i].entry_point).startswith("ale_py")]:
        del registry[env_id]
    monkeypatch.setitem(sys.modules, "ale_py", None)  # `import ale_py` raises ImportError


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        dqn.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("env_id", "game"),
    [
        ("ALE/Pong-v5", "Pong"),
        ("Pong-v5", "Pong"),
        ("PongNoFrameskip-v4", "Pong"),
        ("BreakoutDeterministic-v4", "Breakout"),
        ("SpaceInvaders-v5", "SpaceInvaders"),
        ("seaquest-ram-v4", "seaquest"),
        ("ALE/MsPacman-ram-v5", "MsPacman"),
    ],
)
def test_an_atari_id_without_ale_py_names_the_atari_extra(env_id, game, without_ale_py, capsys):
    err = usage_error(["--env-id", env_id], capsys)
    assert f"--env-id {env_id}: {game} is an Atari game; gymnasium has ALE's Atari envs (ALE/{game}-v5, " in err
    assert "only with ale-py, which is not installed here" in err
    assert 'Install the atari extra: pip install -c constraints.txt -e ".[atari]"' in err
    assert "Ant" not in err and "did you mean" not in err and "no such gymnasium env" not in err


def test_an_ale_id_of_no_known_game_still_names_the_extra(without_ale_py, capsys):
    err = usage_error(["--env-id", "ALE/NewGame-v5"], capsys)
    assert "ALE/* ids are Atari games; gymnasium has ALE's Atari envs only with ale-py" in err
    assert '".[atari]"' in err


def test_a_gymnasium_env_named_like_an_atari_game_is_not_taken_for_one(without_ale_py, capsys):
    err = usage_error(["--env-id", "Blackjack-v2"], capsys)  # gymnasium's toy-text Blackjack-v1, mistyped
    assert "no such gymnasium env; did you mean Blackjack-v1" in err and "atari" not in err


def test_suggestions_compare_names_not_version_suffixes(without_ale_py):
    assert env_ids.similar_env_ids("Pong-v5") == []  # not Ant-v5: only "-v5" is alike
    assert env_ids.similar_env_ids("CartPol-v1")[0] == "CartPole-v1"
    assert env_ids.similar_env_ids("Hoper-v5")[0] == "Hopper-v5"
    assert "MountainCarContinuous-v0" in env_ids.similar_env_ids("MountainCarContinous-v0")


def test_with_ale_py_an_atari_id_registers_on_demand_and_a_v5_name_points_to_its_namespace(saved_registry, capsys):
    pytest.importorskip("ale_py", reason="the atari extra")
    # as in a fresh process: gymnasium has ALE's ids only once ale_py is imported, which registers them
    for env_id in [i for i in registry if str(registry[i].entry_point).startswith("ale_py")]:
        del registry[env_id]
    del sys.modules["ale_py"]  # imported again by the check (saved_registry puts things back after the test)
    parser = argparse.ArgumentParser(prog="check")
    env_ids.check_registered(parser, "ALE/Pong-v5")  # dqn's check too, not only dqn_atari's
    assert "ALE/Pong-v5" in registry
    with pytest.raises(SystemExit):
        env_ids.check_registered(parser, "Pong-v5")
    err = capsys.readouterr().err
    assert "no such gymnasium env; did you mean ALE/Pong-v5" in err and "Ant" not in err

"""The Ape-X example: N Ray workers with their own epsilons write into K prioritized shards; the learner samples them.

A pixel smoke run (Catch, stacked uint8 frames through frame-deduplicating shards) checks what reaches
``training_step`` against the frames' own arithmetic; the learning test checks CartPole is learnt.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ptl_rl.examples import apex_dqn

pytest.importorskip("ray")

QUIET = ["--no-progress-bar", "--worker-cpus", "0.5"]  # two workers fit the session's 2-CPU Ray


def test_worker_epsilons_follow_the_apex_formula() -> None:
    assert apex_dqn.apex_epsilons(0.4, 7.0, 1) == [0.4]
    assert apex_dqn.apex_epsilons(0.4, 7.0, 2) == pytest.approx([0.4, 0.4**8])
    assert apex_dqn.apex_epsilons(0.4, 7.0, 3) == pytest.approx([0.4, 0.4**4.5, 0.4**8])


def test_bad_apex_flags_end_in_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit):
        apex_dqn.parse_args(["--num-shards", "0"])
    assert "--num-shards must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        apex_dqn.parse_args(["--num-shards", "4", "--buffer-size", "100", "--batch-size", "64"])
    assert "give at least --num-shards x --batch-size = 256" in capsys.readouterr().err


# 2 envs per worker: worker w's env ids are 2w and 2w + 1, so whichever worker starts first fills both shards
PIXEL_SMOKE = [
    "--env-id", "catch_env:PixelCatch-v0", "--network", "small", "--env-steps", "400", "--num-workers", "2",
    "--num-envs", "2", "--num-shards", "2", "--buffer-size", "2000", "--extra-frames", "1000",
    "--learning-starts", "120", "--batch-size", "16", "--rows-per-step", "4", "--push-every", "5",
    "--steps-per-call", "2", "--lr", "1e-3", "--eval-every", "200", "--eval-episodes", "2",
    "--final-eval-episodes", "2", "--log-every", "20", "--seed", "3",
]  # fmt: skip


def test_pixel_smoke_through_frame_deduplicating_shards(ray_session, monkeypatch, tmp_path, restore_torch_threads):
    """Catch's stacked uint8 frames go from two workers (two envs each) into two FrameStorage shards and reach
    training_step as uint8 stacks; each row's next_obs is its obs shifted by the steps its discount says (rebuilt
    from the shards' single frames); priorities come back, weights are pushed, and the run writes its directory."""
    batches = []
    training_step = apex_dqn.AtariDQN.training_step

    def recording_step(self, batch, batch_idx):
        batches.append({k: batch[k].detach().clone() for k in ("obs", "next_obs", "discount", "weights", "shard")})
        return training_step(self, batch, batch_idx)

    monkeypatch.setattr(apex_dqn.AtariDQN, "training_step", recording_step)
    args = apex_dqn.parse_args([*PIXEL_SMOKE, *QUIET, "--runs-dir", str(tmp_path)])
    summary = apex_dqn.train(args)

    assert summary["gradient_steps"] == len(batches) > 0
    gamma = args.gamma
    for batch in batches:
        assert batch["obs"].dtype == batch["next_obs"].dtype == torch.uint8, "pixels stay uint8 to training_step"
        assert tuple(batch["obs"].shape) == tuple(batch["next_obs"].shape) == (16, 4, 14, 14)
        assert batch["weights"].dtype == torch.float32 and batch["weights"].shape == (16,)
        assert 0 < float(batch["weights"].min()) and float(batch["weights"].max()) == pytest.approx(1.0)
        assert set(batch["shard"].tolist()) <= {0, 1}
        # an n-step row (n <= 3, fewer at an episode's end) ends m steps later: next_obs's frames are obs's
        # shifted by m (FrameStackObservation repeats the first frame at a start, so the shift holds there too)
        obs, next_obs = batch["obs"].numpy(), batch["next_obs"].numpy()
        steps = np.rint(np.log(batch["discount"].numpy()) / math.log(gamma)).astype(int)
        assert set(steps.tolist()) <= {1, 2, 3}
        for row, m in enumerate(steps):
            np.testing.assert_array_equal(next_obs[row, : 4 - m], obs[row, m:])
    assert summary["worker_epsilons"] == pytest.approx([0.4, 0.4**8])
    assert summary["env_steps"] >= 400 and summary["weight_pushes"] > 0
    assert summary["applied_priority_updates"] > 0
    assert all(size > 0 for size in summary["shard_sizes"]), summary["shard_sizes"]
    # the workers' last calls may have stored rows after the learner's last count (the workers are then closed)
    assert sum(summary["shard_sizes"]) >= summary["rows_stored"] > 0
    run_dir = tmp_path / next(p.name for p in tmp_path.iterdir())
    written = json.loads((run_dir / "summary.json").read_text())
    assert written["rows_stored"] == summary["rows_stored"] and written["algo"] == "apex_dqn"
    config = json.loads((run_dir / "config.json").read_text())
    assert config["replay_storage"] == "FrameStorage" and config["worker_epsilons"] == summary["worker_epsilons"]
    kinds = [line.split(",")[2] for line in (run_dir / "evaluations.csv").read_text().splitlines()[1:]]
    assert "eval" in kinds and kinds[-1] == "final"


# stops once 10 greedy episodes and 10 fresh ones reach 200 (CartPole's full 475 takes longer and adds nothing here)
CARTPOLE = [
    "--env-steps", "25000", "--eval-every", "2500", "--eval-episodes", "10", "--solved-return", "200",
    "--confirm-episodes", "10", "--final-eval-episodes", "20",
]  # fmt: skip


@pytest.mark.learning
@pytest.mark.timeout(600)
def test_apex_dqn_learns_cartpole_with_two_workers_and_two_shards(ray_session, restore_torch_threads) -> None:
    """2 workers (epsilons 0.4 and 0.4 ** 8), 2 prioritized shards: the greedy policy balances far beyond what an
    untrained one does (random play: about 22)."""
    argv = [*CARTPOLE, "--seed", "1", "--runs-dir", "", *QUIET]
    summary = apex_dqn.train(apex_dqn.parse_args(argv))
    history = [(steps, round(ret)) for steps, ret in summary["eval_history"]]
    assert summary["final_eval_return"] >= 150.0, (summary["final_eval_return"], history)
    assert all(size > 0 for size in summary["shard_sizes"]) and summary["weight_pushes"] > 0

"""Two DDP processes on the CPU (gloo): different data per rank, per-rank checkpoint state, a shared stop.

The run is a script (tests/support/ddp_run.py) started in its own process group with
a timeout, so a hang fails this test instead of stalling CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import SUPPORT

from ptl_rl import CHECKPOINT_KEY

SCRIPT = SUPPORT / "ddp_run.py"
TIMEOUT_S = 240


def run_phase(phase: str, out: Path, package: str) -> None:
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), phase, str(out), package],
        start_new_session=True,  # rank 1 is a child of rank 0: kill the whole group on a hang
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the DDP {phase} run hung for {TIMEOUT_S} s:\n{output[-4000:]}")
    assert process.returncode == 0, f"the DDP {phase} run failed:\n{output[-4000:]}"


@pytest.mark.parametrize("package", ["pytorch_lightning", "lightning.pytorch"])
def test_two_ranks_collect_different_data_stop_together_and_resume_their_own_state(tmp_path, package) -> None:
    run_phase("train", tmp_path, package)
    ranks = [torch.load(tmp_path / f"train_rank{r}.pt", weights_only=True) for r in range(2)]

    # different data: distinct env ids and seeds, so different observations in every batch
    assert set(ranks[0]["at_end"]["env_ids"].tolist()) == {0, 1}
    assert set(ranks[1]["at_end"]["env_ids"].tolist()) == {2, 3}
    assert not any(torch.equal(a, b) for a, b in zip(ranks[0]["batches"], ranks[1]["batches"], strict=False))
    # the env-step budget (400 over both ranks) stopped both ranks at the same step
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == len(ranks[0]["batches"]) == len(ranks[1]["batches"])
    assert 400 <= ranks[0]["at_end"]["total_steps"] + ranks[1]["at_end"]["total_steps"] <= 400 + 2 * 8

    run_phase("resume", tmp_path, package)
    resumed = [torch.load(tmp_path / f"resume_rank{r}.pt", weights_only=True) for r in range(2)]
    for rank in range(2):
        before, after = ranks[rank]["at_end"], resumed[rank]["at_start"]
        assert after["total_steps"] == before["total_steps"] and after["epsilon"] == before["epsilon"]
        assert after["size"] == before["size"] and torch.equal(after["obs"], before["obs"])  # its own replay
        assert after["buffer_rng"] == before["buffer_rng"]
        assert after["env_ids"].tolist() == before["env_ids"].tolist()
    assert not torch.equal(resumed[0]["at_start"]["obs"], resumed[1]["at_start"]["obs"])
    # the budget is already spent: both ranks stop after their first batch, together
    assert resumed[0]["global_step"] == resumed[1]["global_step"] == ranks[0]["global_step"] + 1


# one package: the test above runs both
@pytest.mark.parametrize("package", ["pytorch_lightning"])
def test_grouped_gradient_steps_keep_ranks_in_step_and_in_sync(tmp_path, package) -> None:
    """batches_per_step=3 under DDP: every group holds 3 batches on both ranks, the budget stops both at the same
    step, and manual_backward's gradient averaging keeps the two ranks' weights equal."""
    run_phase("grouped", tmp_path, package)
    ranks = [torch.load(tmp_path / f"grouped_rank{r}.pt", weights_only=True) for r in range(2)]
    assert set(ranks[0]["env_ids"].tolist()) == {0, 1} and set(ranks[1]["env_ids"].tolist()) == {2, 3}
    assert ranks[0]["group_sizes"] == ranks[1]["group_sizes"] and set(ranks[0]["group_sizes"]) == {3}
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 3 * len(ranks[0]["group_sizes"]) > 0
    assert 400 <= ranks[0]["total_steps"] + ranks[1]["total_steps"]
    for ours, theirs in zip(ranks[0]["weights"], ranks[1]["weights"], strict=True):
        torch.testing.assert_close(ours, theirs)


NORMALIZATION_SCRIPT = SUPPORT / "ddp_normalization_run.py"


# one package: the DDP test above runs both, and a 2-rank run costs about a minute of CI
@pytest.mark.parametrize("package", ["lightning.pytorch"])
def test_normalization_statistics_are_merged_across_ranks_each_row_once(tmp_path, package) -> None:
    process = subprocess.run(
        [sys.executable, str(NORMALIZATION_SCRIPT), str(tmp_path), package],
        capture_output=True, text=True, timeout=TIMEOUT_S, start_new_session=True,
    )  # fmt: skip
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"norm_rank{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["env_ids"].tolist() != ranks[1]["env_ids"].tolist()  # each rank its own envs
    # brute force: the mean and variance of the union of both ranks' raw observation rows
    union = torch.cat([r["raw_obs"] for r in ranks]).double()
    for r in ranks:
        assert r["count"] == len(union) and r["local_count"] == 0
        torch.testing.assert_close(r["mean"], union.mean(0), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(r["var"], union.var(0, unbiased=False), rtol=1e-8, atol=1e-9)
    assert ranks[0]["return_count"] == ranks[1]["return_count"] == len(union)
    # the checkpoint (written by rank 0) holds both ranks' pipelines, each with the merged statistics
    saved = torch.load(tmp_path / "norm.ckpt", weights_only=True)[CHECKPOINT_KEY]["ranks"]
    counts = [s["stages"]["2:NormalizeObservations"]["normalizer"]["statistics"]["synced"]["count"] for s in saved]
    assert counts == [len(union), len(union)]


# one package: the first test runs both
@pytest.mark.parametrize("package", ["pytorch_lightning"])
def test_only_rank_zero_renders_and_writes_videos(tmp_path, package) -> None:
    pytest.importorskip("imageio_ffmpeg", reason="the video extra")
    pytest.importorskip("pygame", reason="the video extra")
    run_phase("video", tmp_path, package)
    ranks = [torch.load(tmp_path / f"video_rank{r}.pt", weights_only=True) for r in range(2)]
    recordings = ranks[0]["recordings"]
    # 400 env steps over both ranks: recordings just past 100, 200, 300 and 400, where the budget stops training
    # (the end of training adds none: its count was just recorded)
    assert len(recordings) == 4 and [entry["env_steps"] for entry in recordings] == sorted(
        entry["env_steps"] for entry in recordings
    )
    lengths = [entry["lengths"][0] for entry in recordings]
    assert ranks[0]["renders"] == sum(lengths) + len(lengths) + 1  # the frames, plus the check when fit started
    assert ranks[1]["renders"] == 0 and ranks[1]["recordings"] == []
    assert ranks[0]["next_record"] == ranks[1]["next_record"]  # both ranks keep the rhythm, for checkpoints
    written = sorted(path.name for path in (tmp_path / "videos").iterdir())
    assert written == sorted(Path(entry["paths"][0]).name for entry in recordings)

"""The Atari DQN example: a CNN DQN learns a pixel env (Catch) on the CPU; an ALE smoke run checks the replay size."""

from __future__ import annotations

import pytest
import torch

from ptl_rl.examples import dqn_atari

CATCH_ARGS = [
    "--env-id", "catch_env:PixelCatch-v0", "--network", "small", "--env-steps", "8000", "--num-envs", "4",
    "--buffer-size", "5000", "--extra-frames", "2000", "--learning-starts", "500", "--batch-size", "64",
    "--train-every", "4", "--lr", "1e-3", "--target-sync-every", "100", "--eps-fraction", "0.4", "--eps-end", "0.05",
    "--n-step", "3", "--eval-every", "1000", "--eval-episodes", "50", "--solved-return", "0.95",
    "--final-eval-episodes", "50", "--no-progress-bar", "--accelerator", "cpu", "--log-every", "100", "--runs-dir", "",
]  # fmt: skip

PONG_ARGS = [
    "--env-id", "ALE/Pong-v5", "--env-steps", "2000", "--num-envs", "4", "--buffer-size", "3000",
    "--learning-starts", "1000", "--train-every", "16", "--eval-every", "0", "--final-eval-episodes", "0",
    "--no-progress-bar", "--accelerator", "cpu", "--log-every", "50", "--runs-dir", "",
]  # fmt: skip


@pytest.mark.learning
def test_cnn_dqn_learns_pixel_catch(monkeypatch):
    """Stacked uint8 frames through a FrameStorage replay: the greedy policy catches (nearly) every ball.

    Random play scores about -0.6; seed 0 solves it (greedy mean >= 0.9) at about 3k env steps, ~30 s on 2 cores.
    """
    dtypes = set()
    training_step = dqn_atari.AtariDQN.training_step

    def recording_step(self, batch, batch_idx):
        dtypes.update({batch.obs.dtype, batch.next_obs.dtype})
        return training_step(self, batch, batch_idx)

    monkeypatch.setattr(dqn_atari.AtariDQN, "training_step", recording_step)
    result = dqn_atari.train(dqn_atari.parse_args([*CATCH_ARGS, "--seed", "0"]))
    assert dtypes == {torch.uint8}, "pixels must reach training_step as uint8"
    assert result["solved_at_env_steps"] is not None, result["eval_history"]
    assert result["final_eval_return"] >= 0.8, result


def test_atari_pong_smoke():
    """A few thousand steps of ALE/Pong-v5 with the Nature CNN; the replay holds ~one 84x84 frame per transition."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    result = dqn_atari.train(dqn_atari.parse_args(PONG_ARGS))
    assert result["env_steps"] >= 2000 and result["gradient_steps"] > 0
    assert result["naive_bytes_per_transition"] == 2 * 4 * 84 * 84
    ratio = result["replay_bytes_per_transition"] / result["naive_bytes_per_transition"]
    assert ratio <= 0.135, f"{result['replay_bytes_per_transition']:.0f} B per transition ({ratio:.3f}x naive)"

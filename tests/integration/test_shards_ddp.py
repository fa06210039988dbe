"""Two DDP learners (CPU, gloo) sampling the same replay shards: each its own random stream, the same steps.

The test process holds the Ray session and the shards (90 rows, each carrying its id in ``obs``); both
ranks of tests/support/ddp_shards_run.py join that cluster and unpickle the same ``ReplayShards``. The
reference is one ``ShardedReplay`` in this process, given each rank in turn (``set_rank``): a rank's
batches must be exactly the ones its stream draws, so the ranks differ by their streams alone.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from paths import SUPPORT

import ptl_rl
from ptl_rl.distributed import ReplayShards, ShardedReplay

ray = pytest.importorskip("ray")

SCRIPT = SUPPORT / "ddp_shards_run.py"
TIMEOUT_S = 180
SEED, BATCH, MAX_STEPS = 7, 8, 10  # as in the script
ENVS, ROWS_PER_ENV = 6, 15


def test_two_ddp_ranks_sample_the_same_shards_with_their_own_streams_and_stop_together(ray_session, tmp_path) -> None:
    factory = functools.partial(
        ptl_rl.ReplayBuffer, capacity=100, draws=ptl_rl.PrioritizedDraws(alpha=0.6, beta=0.4)
    )  # (a partial of ptl_rl's own class: the ranks unpickle it without the test's modules)
    shards = ReplayShards(factory, 3)
    try:
        ids = np.arange(ENVS * ROWS_PER_ENV)
        writer = shards.writer()
        writer.add(ptl_rl.TransitionBatch(obs=ids[:, None].astype(np.float32), env_id=ids % ENVS, reward=ids * 0.0))
        writer.flush()
        (tmp_path / "address").write_text(ray.get_runtime_context().gcs_address)
        (tmp_path / "shards.pkl").write_bytes(pickle.dumps(shards))
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(tmp_path), "pytorch_lightning"],
            start_new_session=True,  # rank 1 is a child of rank 0: kill the whole group on a hang
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            output, _ = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"the DDP run hung for {TIMEOUT_S} s:\n{output[-4000:]}")
        assert process.returncode == 0, f"the DDP run failed:\n{output[-4000:]}"
        ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

        # both ranks ran the same steps and the run ended
        assert [r["global_step"] for r in ranks] == [MAX_STEPS, MAX_STEPS]
        assert [len(r["rows"]) for r in ranks] == [MAX_STEPS, MAX_STEPS]
        assert [r["rank"] for r in ranks] == [0, 1]  # each took its rank from the Trainer
        # distinct batches: no step drew the same rows on both ranks
        assert all(not torch.equal(a, b) for a, b in zip(ranks[0]["rows"], ranks[1]["rows"], strict=True))
        # each rank's batches are exactly its own stream's draws (same seed, rank r), from these shards
        for rank, recorded in enumerate(ranks):
            reference = ShardedReplay(shards, warmup=BATCH, seed=SEED, prefetch=1)
            reference.set_rank(rank)
            next(iter(reference))  # (warm-up, as the rank's loader did)
            for rows, shard in zip(recorded["rows"], recorded["shards"], strict=True):
                expected = reference.sample(BATCH)
                assert rows.tolist() == expected.obs[:, 0].astype(np.int64).tolist()
                assert shard.tolist() == expected["shard"].tolist()
                assert (shard.numpy() == rows.numpy() % ENVS % 3).all()  # every row from the shard of its env
    finally:
        shards.close()

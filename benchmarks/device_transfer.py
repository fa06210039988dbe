"""Host-to-GPU batches: ``BatchSampler(device=..., pin_memory=...)`` and a grouped Lightning run on a GPU.

Needs a CUDA device (run it where one is lent). Two parts:

1. Transfer. CartPole-shaped (batch 256) and Atari-shaped (batch 32 of 4x84x84 uint8) replays
   sampled straight to the GPU, pageable vs pinned, against a bare ``torch.from_numpy(...).to``
   of the same gathered arrays (the hand-written limit). The GPU copy is asynchronous, so every
   timed batch ends with a ``torch.cuda.synchronize()``. Median of ``--repeats`` runs; the ratio
   is the limit's time over ptl_rl's (> 1: ptl_rl faster).
2. Correctness. Every tensor of a pinned, GPU-placed batch equals the CPU batch drawn with the
   same seed; a ``to_dataloader(..., batches_per_step=K)`` run under ``Trainer(accelerator="gpu")``
   gets every batch of each group on the GPU, and its weights match a plain loop's on the GPU.

    python benchmarks/device_transfer.py [--repeats 5] [--batches 300]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import gymnasium as gym
import lightning as L  # noqa: N812
import numpy as np
import torch
from torch import nn

import ptl_rl


def filled_replay(obs_shape: tuple[int, ...], dtype: np.dtype, rows: int = 20_000) -> ptl_rl.ReplayBuffer:
    rng = np.random.default_rng(0)
    buffer = ptl_rl.ReplayBuffer(None, rows, warmup=0, seed=0)
    for start in range(0, rows, 1_000):
        n = 1_000
        obs = rng.integers(0, 255, (n, *obs_shape)) if dtype == np.uint8 else rng.normal(size=(n, *obs_shape))
        buffer.add(
            ptl_rl.TransitionBatch(
                obs=obs.astype(dtype),
                action=rng.integers(0, 4, n),
                reward=rng.normal(size=n).astype(np.float32),
                next_obs=obs.astype(dtype),
                terminated=np.zeros(n, bool),
                truncated=np.zeros(n, bool),
                discount=np.full(n, 0.99, np.float32),
                env_id=np.full(n, start // 1_000, np.int64),
            )
        )
    return buffer


def time_batches(make_batch, batches: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(batches):
        batch = make_batch()
    torch.cuda.synchronize()
    del batch
    return (time.perf_counter() - start) / batches * 1e6


WORKLOADS = (("CartPole, 256", (4,), np.float32, 256), ("Atari, 32", (4, 84, 84), np.uint8, 32))


def bare_copy(buffer: ptl_rl.ReplayBuffer, size: int) -> dict[str, torch.Tensor]:
    """The hand-written limit: the same draw and gather, then ``torch.from_numpy(...).to("cuda")`` per field."""
    sample = buffer.sample(size)
    return {name: torch.from_numpy(np.ascontiguousarray(sample[name])).to("cuda") for name in sample.keys()}


def transfer_row(label: str, buffer: ptl_rl.ReplayBuffer, size: int, repeats: int, batches: int) -> None:
    pageable = ptl_rl.BatchSampler(buffer, size, device="cuda")
    pinned = ptl_rl.BatchSampler(buffer, size, device="cuda", pin_memory=True)
    ways = {"bare": lambda: bare_copy(buffer, size), "pageable": lambda: next(pageable), "pinned": lambda: next(pinned)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):  # interleaved
        for name, make_batch in ways.items():
            times[name].append(time_batches(make_batch, batches))
    med = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"{label:14s} us/batch: bare {med['bare']:7.1f}  pageable {med['pageable']:7.1f}  "
        f"pinned {med['pinned']:7.1f}  ratio bare/pageable {med['bare'] / med['pageable']:.2f}  "
        f"bare/pinned {med['bare'] / med['pinned']:.2f}"
    )


def transfer(repeats: int, batches: int) -> None:
    for label, shape, dtype, size in WORKLOADS:
        transfer_row(label, filled_replay(shape, dtype), size, repeats, batches)


def pinned_batches_equal_cpu_batches() -> None:
    buffer = filled_replay((4, 84, 84), np.uint8, rows=4_000)
    state = buffer.state_dict()
    cpu = ptl_rl.BatchSampler(buffer, 16)
    first = [next(cpu) for _ in range(5)]
    buffer.load_state_dict(state)  # the same draws again
    gpu = ptl_rl.BatchSampler(buffer, 16, device="cuda", pin_memory=True)
    for a in first:
        b = next(gpu)
        for name in a.keys():
            assert b[name].device.type == "cuda", name
            torch.testing.assert_close(b[name].cpu(), a[name], rtol=0, atol=0)
    print("pinned GPU batches equal the CPU batches of the same draws: ok")


def grouped_run_on_gpu(group: int = 3, steps: int = 12) -> None:
    def build():
        env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)).cuda()
        source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector()), seed=0)
        buffer = ptl_rl.ReplayBuffer(source, 500, warmup=16, transitions_per_yield=2, seed=0)
        return net, ptl_rl.BatchSampler(buffer, 8)

    def loss_of(net, batch):
        q = net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
        return torch.nn.functional.mse_loss(q, batch.reward)

    net, sampler = build()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(steps):
        batch = next(sampler).to("cuda")
        optimizer.zero_grad()
        loss_of(net, batch).backward()
        optimizer.step()
    reference = [p.detach().cpu() for p in net.parameters()]

    class Grouped(L.LightningModule):
        def __init__(self, net):
            super().__init__()
            self.net, self.automatic_optimization, self.devices = net, False, set()

        def training_step(self, group, batch_idx):
            optimizer = self.optimizers()
            for batch in group.batches():
                self.devices.add(batch.obs.device.type)
                optimizer.zero_grad()
                self.manual_backward(loss_of(self.net, batch))
                optimizer.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.net.parameters(), lr=0.1)

    net, sampler = build()
    module = Grouped(net)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="gpu", devices=1, max_steps=steps, default_root_dir=root, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(module, train_dataloaders=ptl_rl.to_dataloader(sampler, batches_per_step=group))
    assert module.devices == {"cuda"}, module.devices
    for ours, theirs in zip(net.parameters(), reference, strict=True):
        torch.testing.assert_close(ours.detach().cpu(), theirs, rtol=1e-5, atol=1e-6)
    print(f"grouped run (K={group}) under Trainer(accelerator='gpu'): batches on cuda, weights = plain loop: ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device; torch sees none")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    pinned_batches_equal_cpu_batches()
    grouped_run_on_gpu()
    transfer(args.repeats, args.batches)


if __name__ == "__main__":
    main()

"""Collection throughput: ExperienceSource + NStepTransform(n=3) vs a hand-written loop.

Both drive the same 8 CartPole-v1 envs (gymnasium SyncVectorEnv) with the same
4-64-2 MLP (argmax of its output, torch on the CPU, one thread). The raw loop
only steps and acts; the pipeline also checks the agent's output, tracks
episodes, folds 3-step returns and emits transition batches. Prints env
steps/s of each and their ratio (goal >= 0.95).

    python benchmarks/collection.py [--steps 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import ptl_rl


def make_env(num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2))


def raw_loop(num_envs: int, vector_steps: int) -> float:
    """Env steps/s of the hand-written limit: step, act, nothing else."""
    env, net = make_env(num_envs), make_net()
    obs, _ = env.reset(seed=0)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(vector_steps):
            actions = net(torch.as_tensor(obs)).argmax(-1).numpy()
            obs, _, _, _, _ = env.step(actions)
    elapsed = time.perf_counter() - start
    env.close()
    return num_envs * vector_steps / elapsed


def pipeline(num_envs: int, vector_steps: int) -> float:
    """Env steps/s of ExperienceSource -> NStepTransform(n=3), every emitted batch consumed."""
    env, net = make_env(num_envs), make_net()
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector()), seed=0)
    nstep = ptl_rl.NStepTransform(source, n=3, gamma=0.99)
    target = num_envs * vector_steps
    start = time.perf_counter()
    while source.total_steps < target:
        next(nstep)
    elapsed = time.perf_counter() - start
    env.close()
    return source.total_steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    vector_steps = args.steps // args.num_envs
    raw_loop(args.num_envs, 200), pipeline(args.num_envs, 200)  # warm up both paths
    raw, ours = [], []
    for _ in range(args.repeats):  # interleaved, so drifts of the machine hit both alike
        raw.append(raw_loop(args.num_envs, vector_steps))
        ours.append(pipeline(args.num_envs, vector_steps))
    raw_best, ours_best = max(raw), max(ours)
    print(f"raw env+policy loop : {raw_best:10.0f} env steps/s (best of {args.repeats}, median {np.median(raw):.0f})")
    print(f"source + n-step(3)  : {ours_best:10.0f} env steps/s (best of {args.repeats}, median {np.median(ours):.0f})")
    print(f"ratio (goal >= 0.95): {ours_best / raw_best:.3f} best, {np.median(ours) / np.median(raw):.3f} median")


if __name__ == "__main__":
    main()

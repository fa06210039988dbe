"""Collection throughput: ExperienceSource + NStepTransform(n=3) vs a hand-written loop.

Both drive the same 8 CartPole-v1 envs (gymnasium SyncVectorEnv) with the same
4-64-2 MLP (argmax of its output, torch on the CPU, one thread). The raw loop
only steps and acts; the pipeline also checks the agent's output, tracks
episodes, folds 3-step returns and emits transition batches. Prints env
steps/s of each and their ratio (goal >= 0.95).
Rates use the process's CPU time (single-threaded: torch uses one thread), so
other load on the machine does not skew the ratio.

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


def make_net(balancing: bool = False) -> nn.Module:
    """The 4-64-2 MLP. Freshly initialised it loses CartPole in ~10 steps, so
    episode ends (the slow path) come at almost every vector step; with
    ``balancing`` its weights encode "push towards where the pole falls"
    (argmax of +-(angle + angular velocity)), which keeps episodes hundreds of
    steps long, as late in training."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2))
    if balancing:
        with torch.no_grad():
            for p in net.parameters():
                p.zero_()
            net[0].weight[0, 2:] = 1.0  # h0 = relu(angle + angular velocity)
            net[0].weight[1, 2:] = -1.0  # h1 = relu(-(angle + angular velocity))
            net[2].weight[1, 0] = net[2].weight[0, 1] = 1.0  # right if h0 wins, left if h1 wins
    return net


def raw_loop(num_envs: int, vector_steps: int, balancing: bool) -> float:
    """Env steps/s of the hand-written limit: step, act, nothing else."""
    env, net = make_env(num_envs), make_net(balancing)
    obs, _ = env.reset(seed=0)
    start = time.process_time()
    with torch.no_grad():
        for _ in range(vector_steps):
            actions = net(torch.as_tensor(obs)).argmax(-1).numpy()
            obs, _, _, _, _ = env.step(actions)
    elapsed = time.process_time() - start
    env.close()
    return num_envs * vector_steps / elapsed


def pipeline(num_envs: int, vector_steps: int, balancing: bool) -> float:
    """Env steps/s of ExperienceSource -> NStepTransform(n=3), every emitted batch consumed."""
    env, net = make_env(num_envs), make_net(balancing)
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector()), seed=0)
    nstep = ptl_rl.NStepTransform(source, n=3, gamma=0.99)
    target = num_envs * vector_steps
    start = time.process_time()
    while source.total_steps < target:
        next(nstep)
    elapsed = time.process_time() - start
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
    for balancing, label in ((False, "fresh MLP, ~10-step episodes"), (True, "balancing MLP, long episodes")):
        raw_loop(args.num_envs, 200, balancing), pipeline(args.num_envs, 200, balancing)  # warm up both paths
        raw, ours = [], []
        for _ in range(args.repeats):  # interleaved, so drifts of the machine hit both alike
            raw.append(raw_loop(args.num_envs, vector_steps, balancing))
            ours.append(pipeline(args.num_envs, vector_steps, balancing))
        raw_best, ours_best = max(raw), max(ours)
        print(f"{label}:")
        print(f"  raw env+policy loop : {raw_best:9.0f} env steps/s (best of {args.repeats})")
        print(f"  source + n-step(3)  : {ours_best:9.0f} env steps/s (best of {args.repeats})")
        print(f"  ratio (goal >= 0.95): {ours_best / raw_best:.3f} best, {np.median(ours) / np.median(raw):.3f} median")


if __name__ == "__main__":
    main()

"""DQN on the bit-flipping env, with and without hindsight relabeling, in a plain training loop.

The pipeline is the library's: ``ExperienceSource`` over a vector env of
:class:`~bit_flip.BitFlipEnv`, a ``DQNAgent`` whose network reads the dict
observation (state and desired goal, concatenated), a ``HERReplayBuffer``
and a ``BatchSampler``. Without HER the buffer is the same with
``n_sampled_goal=0``: the same episodes and draws, no relabeled row, so the
two arms differ only in relabeling. Used by the learning test and by
``benchmarks/her_bitflip.py``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from bit_flip import BitFlipEnv, bit_flip_vector_env
from torch import nn

import ptl_rl


@dataclass
class Config:
    """The recipe (defaults: 10 bits, 16 envs, 40k env steps, one gradient step per 4 env steps)."""

    n_bits: int = 10
    her: bool = True
    n_sampled_goal: int = 4
    strategy: str = "future"
    env_steps: int = 40_000
    num_envs: int = 16
    seed: int = 0
    gamma: float = 0.98
    lr: float = 1e-3
    hidden: int = 256
    batch_size: int = 128
    capacity: int = 100_000
    warmup: int = 1_000
    transitions_per_update: int = 4  # env steps collected per gradient step
    target_tau: float = 0.05  # Polyak rate of the target network, every gradient step
    eps_end: float = 0.1
    eps_decay_steps: int = 10_000
    eval_episodes: int = 200


class GoalQNetwork(nn.Module):
    """Q-values [B, n_bits] from ``obs["observation"]`` and ``obs["desired_goal"]`` (float32 [B, n_bits] each)."""

    def __init__(self, n_bits: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2 * n_bits, hidden), nn.ReLU(), nn.Linear(hidden, n_bits))

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.body(torch.cat([obs["observation"], obs["desired_goal"]], dim=-1))


def success_rate(net: nn.Module, n_bits: int, episodes: int, seed: int) -> float:
    """Greedy episodes on fresh envs (their own seeds): the share that reaches the goal."""
    env = bit_flip_vector_env(min(episodes, 50), n_bits)
    source = ptl_rl.ExperienceSource(env, ptl_rl.DQNAgent(net, ptl_rl.ArgmaxSelector()), seed=seed)
    reached = []
    while len(reached) < episodes:
        batch = next(source)
        reached += batch["terminated"][batch["terminated"] | batch["truncated"]].tolist()
    env.close()
    return float(np.mean(reached[:episodes]))


def train(config: Config) -> dict[str, Any]:
    """Train DQN with ``config``; returns the greedy success rate at the end, its history and the costs."""
    torch.manual_seed(config.seed)
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    env = bit_flip_vector_env(config.num_envs, config.n_bits)
    net = GoalQNetwork(config.n_bits, config.hidden)
    target = ptl_rl.TargetNet(net)
    epsilon = ptl_rl.LinearSchedule(1.0, config.eps_end, config.eps_decay_steps)
    agent = ptl_rl.DQNAgent(net, ptl_rl.EpsilonGreedySelector(epsilon, seed=config.seed))
    source = ptl_rl.ExperienceSource(env, agent, gamma=config.gamma, seed=config.seed)
    buffer = ptl_rl.HERReplayBuffer(
        source,
        config.capacity,
        compute_reward=BitFlipEnv.compute_reward,
        compute_terminated=BitFlipEnv.compute_terminated,  # reaching the (new) goal ends the episode
        strategy=config.strategy,
        n_sampled_goal=config.n_sampled_goal if config.her else 0,
        warmup=config.warmup,
        transitions_per_yield=config.transitions_per_update,
        seed=config.seed,
    )
    sampler = ptl_rl.BatchSampler(buffer, config.batch_size)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    history = []
    next_eval = config.env_steps // 4
    for batch in sampler:
        with torch.no_grad():
            best_next = target(batch.next_obs).max(dim=1).values
            goal = batch.reward + batch.discount * (~batch.terminated) * best_next
        q = net(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
        loss = F.smooth_l1_loss(q, goal)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        target.soft_sync(config.target_tau)
        if source.total_steps >= next_eval:
            history.append((source.total_steps, success_rate(net, config.n_bits, 50, seed=10_000 + len(history))))
            next_eval += config.env_steps // 4
        if source.total_steps >= config.env_steps:
            break
    env.close()
    final = success_rate(net, config.n_bits, config.eval_episodes, seed=99_999)
    return {
        "config": asdict(config),
        "success_rate": final,
        "history": history,
        "env_steps": source.total_steps,
        "episodes": source.episodes_finished,
        "training_success_rate": float(np.mean([e.ret > -config.n_bits for e in source.recent_episodes()])),
        "wall_s": time.perf_counter() - start_wall,
        "cpu_s": time.process_time() - start_cpu,
    }

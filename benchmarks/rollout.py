"""On-policy throughput: ExperienceSource -> RolloutBuffer vs a hand-written CleanRL-style rollout loop, and PPO.

Part 1, the rollout stage. Both sides drive the same CartPole-v1 vector env
(gymnasium SyncVectorEnv) with the same actor and critic MLPs (64-64 tanh,
torch on the CPU, one thread): per vector step one actor and one critic
forward pass, a categorical sample and its log-prob. Per rollout both compute
GAE and serve ``epochs x num_minibatches`` shuffled minibatches (index
gathers, nothing trained). The raw loop writes into preallocated torch
buffers and, like CleanRL, ignores truncation bootstrapping and next-step
autoreset rows (less work than the stage does); the stage also tracks
episodes, bootstraps truncations with an extra batched critic call, and
returns TorchBatches. Prints transitions/s of each (CPU time of this process,
median of the interleaved repeats) and the ratio of the medians (goal >= 0.9).
Transitions are counted alike: under next-step autoreset the raw loop's reset
steps are not transitions.

Part 2, PPO. Wall time until the greedy policy of ``ptl_rl.examples.ppo``
(defaults) first reaches a mean return of 475 on CartPole-v1, per seed; and
the training throughput (env steps/s of wall time over a fixed budget, no
evaluation, median of the repeats) of the example (Lightning + pipeline, its
setup included) vs a plain PyTorch PPO loop with the same hyperparameters,
networks and update count.

Each run appends a record (date, commit, load, machine, arguments, medians,
every repeat: ``_records.py``) to ``benchmarks/results/rollout.json``.

    python benchmarks/rollout.py [--steps 40000] [--repeats 5] [--ppo-seeds 1 2 3] [--ppo-steps 25600]
    python benchmarks/rollout.py --table      # the docs' tables, from the records
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

import _records
import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ptl_rl
from ptl_rl.examples import ppo


def make_env(num_envs: int, mode: str) -> gym.vector.VectorEnv:
    return gym.make_vec(
        "CartPole-v1", num_envs=num_envs, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}
    )


def make_nets(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """The PPO example's actor (ending in a CategoricalHead) and critic."""
    torch.manual_seed(seed)
    return ppo.actor_critic(4, gym.spaces.Discrete(2), 64)


def logits_of(actor: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """The raw logits of the example's actor, bypassing its distribution object."""
    return actor[1].logits(actor[0](obs))


# ---------------------------------------------------------------------------- part 1: the rollout stage
def raw_rollouts(num_envs: int, mode: str, rollouts: int, t: int, epochs: int, minibatches: int) -> float:
    """Transitions/s of a CleanRL-style loop: act, step, store, GAE, K epochs of minibatch gathers."""
    env, (actor, critic) = make_env(num_envs, mode), make_nets()
    gen = torch.Generator().manual_seed(0)
    obs_buf = torch.zeros(t, num_envs, 4)
    act_buf = torch.zeros(t, num_envs, dtype=torch.long)
    logp_buf, rew_buf, val_buf = (torch.zeros(t, num_envs) for _ in range(3))
    done_buf = torch.zeros(t, num_envs)
    obs, _ = env.reset(seed=0)
    transitions, resetting = 0, np.zeros(num_envs, dtype=bool)
    start = time.process_time()
    for _ in range(rollouts):
        for step in range(t):
            obs_t = torch.as_tensor(obs)
            with torch.inference_mode():  # the cheapest way to run the policy, as the agents do
                log_probs = torch.log_softmax(logits_of(actor, obs_t), -1)
                gumbel = -torch.log(-torch.log(torch.rand(log_probs.shape, generator=gen)))
                action = (log_probs + gumbel).argmax(-1)
                value = critic(obs_t).squeeze(-1)
            obs, reward, term, trunc, _ = env.step(action.numpy())
            obs_buf[step], act_buf[step], val_buf[step] = obs_t, action, value
            logp_buf[step] = log_probs.gather(-1, action[:, None]).squeeze(-1)
            rew_buf[step], done_buf[step] = torch.as_tensor(reward), torch.as_tensor(term | trunc)
            transitions += num_envs - int(resetting.sum()) if mode == "NextStep" else num_envs
            resetting = term | trunc
        with torch.inference_mode():
            next_value = critic(torch.as_tensor(obs)).squeeze(-1)
        advantage, last = torch.zeros(t, num_envs), torch.zeros(num_envs)
        for step in reversed(range(t)):
            nv = next_value if step == t - 1 else val_buf[step + 1]
            not_done = 1.0 - done_buf[step]
            delta = rew_buf[step] + 0.99 * nv * not_done - val_buf[step]
            last = delta + 0.99 * 0.95 * not_done * last
            advantage[step] = last
        returns = advantage + val_buf
        tensors = (obs_buf, act_buf, logp_buf, advantage, returns, val_buf)
        flat = [x.reshape(t * num_envs, *x.shape[2:]) for x in tensors]
        for _ in range(epochs):
            for rows in torch.randperm(t * num_envs).chunk(minibatches):
                mb = [x[rows] for x in flat]
                mb[3] = (mb[3] - mb[3].mean()) / (mb[3].std() + 1e-8)
    elapsed = time.process_time() - start
    env.close()
    return transitions / elapsed


def stage_rollouts(num_envs: int, mode: str, rollouts: int, t: int, epochs: int, minibatches: int) -> float:
    """Transitions/s of ExperienceSource -> RolloutBuffer, every minibatch of every rollout drawn."""
    env, (actor, critic) = make_env(num_envs, mode), make_nets()
    agent = ptl_rl.ActorCriticAgent(actor, critic, env.single_action_space, seed=0)
    source = ptl_rl.ExperienceSource(env, agent, gamma=0.99, seed=0)
    rollout = ptl_rl.RolloutBuffer(source, t, epochs=epochs, num_minibatches=minibatches, gae_lambda=0.95, seed=0)
    start = time.process_time()
    for _ in range(rollouts * rollout.batches_per_rollout):
        next(rollout)
    elapsed = time.process_time() - start
    env.close()
    return source.total_steps / elapsed


def bench_stage(args: argparse.Namespace, medians: dict, repeats: dict) -> None:
    t, n = args.steps_per_env, args.num_envs
    rollouts = max(1, args.steps // (t * n))
    for mode in ("NextStep", "SameStep"):
        shape = (n, mode, 2, t, args.epochs, args.minibatches)
        raw_rollouts(*shape), stage_rollouts(*shape)  # warm up both paths
        raw, ours = [], []
        for _ in range(args.repeats):  # interleaved, so drifts of the machine hit both alike
            raw.append(raw_rollouts(n, mode, rollouts, t, args.epochs, args.minibatches))
            ours.append(stage_rollouts(n, mode, rollouts, t, args.epochs, args.minibatches))
        ratio = float(np.median(ours) / np.median(raw))
        print(f"[{mode} autoreset, {n} envs x {t} steps, {args.epochs} epochs x {args.minibatches} minibatches]")
        print(f"  raw rollout loop      : {np.median(raw):9.0f} transitions/s (CPU time, median of {args.repeats})")
        print(f"  source + RolloutBuffer: {np.median(ours):9.0f} transitions/s")
        print(f"  ratio (goal >= 0.9)   : {ratio:.3f}")
        medians[mode] = {"raw": float(np.median(raw)), "ptl_rl": float(np.median(ours)), "ratio": ratio}
        repeats[mode] = {"raw": raw, "ptl_rl": ours}


# ---------------------------------------------------------------------------- part 2: PPO
def raw_ppo(args: argparse.Namespace, env_steps: int) -> float:
    """Env steps/s of a plain PyTorch PPO with the example's defaults (no Lightning, no ptl_rl)."""
    a = ppo.parse_args([])
    n, t = a.num_envs, a.steps_per_env
    env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync")
    actor, critic = make_nets(0)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=a.lr, eps=1e-5)
    num_rollouts = env_steps // (n * t)
    obs, _ = env.reset(seed=0)
    obs_buf, act_buf = torch.zeros(t, n, 4), torch.zeros(t, n, dtype=torch.long)
    logp_buf, rew_buf, val_buf, done_buf = (torch.zeros(t, n) for _ in range(4))
    start = time.perf_counter()
    for k in range(num_rollouts):
        frac = 1.0 - k / num_rollouts
        for group in optimizer.param_groups:
            group["lr"] = a.lr * frac
        for step in range(t):
            obs_t = torch.as_tensor(obs)
            with torch.no_grad():
                log_probs = torch.log_softmax(logits_of(actor, obs_t), -1)
                action = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
                val_buf[step] = critic(obs_t).squeeze(-1)
            obs, reward, term, trunc, _ = env.step(action.numpy())
            obs_buf[step], act_buf[step] = obs_t, action
            logp_buf[step] = log_probs.gather(-1, action[:, None]).squeeze(-1)
            rew_buf[step], done_buf[step] = torch.as_tensor(reward), torch.as_tensor(term | trunc)
        with torch.no_grad():
            next_value = critic(torch.as_tensor(obs)).squeeze(-1)
        advantage, last = torch.zeros(t, n), torch.zeros(n)
        for step in reversed(range(t)):
            nv = next_value if step == t - 1 else val_buf[step + 1]
            not_done = 1.0 - done_buf[step]
            last = rew_buf[step] + a.gamma * nv * not_done - val_buf[step] + a.gamma * a.gae_lambda * not_done * last
            advantage[step] = last
        flat_obs, flat_act, flat_logp = obs_buf.reshape(-1, 4), act_buf.reshape(-1), logp_buf.reshape(-1)
        flat_adv, flat_ret = advantage.reshape(-1), (advantage + val_buf).reshape(-1)
        clip = a.clip_coef * frac
        for _ in range(a.update_epochs):
            for rows in torch.randperm(n * t).chunk(a.num_minibatches):
                log_probs = torch.log_softmax(logits_of(actor, flat_obs[rows]), -1)
                ratio = (log_probs.gather(-1, flat_act[rows, None]).squeeze(-1) - flat_logp[rows]).exp()
                adv = flat_adv[rows]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                v_loss = 0.5 * F.mse_loss(critic(flat_obs[rows]).squeeze(-1), flat_ret[rows])
                optimizer.zero_grad()
                (pg_loss + a.vf_coef * v_loss).backward()
                nn.utils.clip_grad_norm_(params, a.grad_clip)
                optimizer.step()
    elapsed = time.perf_counter() - start
    env.close()
    return num_rollouts * n * t / elapsed


def example_ppo(seed: int, extra: list[str]) -> dict:
    return ppo.train(ppo.parse_args(["--seed", str(seed), "--no-progress-bar", "--final-eval-episodes", "10", *extra]))


def bench_ppo(args: argparse.Namespace, medians: dict, repeats: dict) -> None:
    print("[PPO on CartPole-v1, ptl_rl.examples.ppo defaults: time to a greedy mean return >= 475 (20 episodes)]")
    medians["ppo_solved"] = {}
    for seed in args.ppo_seeds:
        r = example_ppo(seed, [])
        steps, seconds = r["solved_at_env_steps"], r["solved_after_s"]
        outcome = f"{steps} env steps, {seconds:.1f} s (evaluations included)" if steps else "not solved"
        print(f"  seed {seed}: {outcome}")
        medians["ppo_solved"][str(seed)] = {"env_steps": steps, "wall_s": seconds}
    budget = ["--env-steps", str(args.ppo_steps), "--eval-every", "0", "--solved-return", "inf"]
    ours, raw = [], []
    for _ in range(args.repeats):  # interleaved, so drifts of the machine hit both alike
        r = example_ppo(0, budget)
        ours.append(r["env_steps"] / r["train_time_s"])
        raw.append(raw_ppo(args, args.ppo_steps))
    ratio = float(np.median(ours) / np.median(raw))
    print(f"[PPO training throughput, {args.ppo_steps} env steps, no evaluation, wall time, median of {args.repeats}]")
    print(f"  plain PyTorch PPO loop : {np.median(raw):8.0f} env steps/s")
    print(f"  Lightning + ptl_rl     : {np.median(ours):8.0f} env steps/s (incl. setup)")
    print(f"  ratio                  : {ratio:.3f}")
    medians["ppo_throughput"] = {"raw": float(np.median(raw)), "ptl_rl": float(np.median(ours)), "ratio": ratio}
    repeats["ppo_throughput"] = {"raw": raw, "ptl_rl": ours}


def table(records: list[dict]) -> str:
    """The docs' tables: the rollout stage and PPO training against their raw loops; PPO's time to 475."""
    cell, rows = _records.cell, []
    labels = {
        "NextStep": "rollout stage, next-step autoreset (CPU)",
        "SameStep": "rollout stage, same-step autoreset (CPU)",
        "ppo_throughput": "PPO training, Lightning + ptl_rl (wall)",
    }
    for key, label in labels.items():
        held = _records.having(records, key)
        if held:
            raw, ours = cell(held, (key, "raw"), "{:,.0f}"), cell(held, (key, "ptl_rl"), "{:,.0f}")
            goal = ">= 0.9" if key != "ppo_throughput" else "-"
            rows.append([label, raw, ours, cell(held, (key, "ratio"), "{:.2f}"), goal, _records.runs(held)])
    out = [_records.rst_table(["transitions/s", "raw loop", "ptl_rl", "ratio", "goal", "run (UTC)"], rows)]
    solved = []
    for seed in dict.fromkeys(seed for r in records for seed in r["medians"].get("ppo_solved", {})):
        held = _records.having(records, "ppo_solved", seed)
        steps = [s for r in held if (s := r["medians"]["ppo_solved"][seed]["env_steps"]) is not None]
        unsolved = len(held) - len(steps)
        reached = _records.span(steps, "{:,.0f}") + (f" ({unsolved} not solved)" if unsolved else "")
        seconds = cell(held, ("ppo_solved", seed, "wall_s"), "{:.0f}")
        solved.append([f"seed {seed}", reached if steps else "not solved", seconds, _records.runs(held)])
    if solved:
        header = ["PPO example, CartPole-v1", "env steps to 475", "wall s (evaluations included)", "run (UTC)"]
        out.append(_records.rst_table(header, solved))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps-per-env", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40_000, help="transitions per rollout-stage measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ppo-seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--ppo-steps", type=int, default=25_600, help="env-step budget of the PPO throughput runs")
    parser.add_argument("--skip-ppo", action="store_true")
    _records.add_options(parser, "rollout")
    args = parser.parse_args()
    if args.table:
        print(table(_records.select(args)))
        return
    run = _records.Run("rollout", args, args.results)
    torch.set_num_threads(1)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)  # keep the report readable
    warnings.filterwarnings("ignore", message=".*(LeafSpec|does not have many workers|IterableDataset).*")
    medians: dict = {}
    repeats: dict = {}
    bench_stage(args, medians, repeats)
    if not args.skip_ppo:
        bench_ppo(args, medians, repeats)
    run.save(medians, repeats)


if __name__ == "__main__":
    main()

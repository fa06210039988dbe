"""Collector factories and a brute-force row checker for the scale-out tests (AsyncSource, Ray workers).

The factories run in other processes, so they live in an importable module
(a spawned process or a Ray actor imports them by name).

Rewards and actions are pure functions of the observation code here, so a
row can be checked without the env's own record (which stays in the other
process): ScriptedEnv observations are ``[env, episode, step]``; the reward of
the step taken in ``[i, e, s]`` is :func:`code_reward` of that code, the agent's
action is ``(code + shift) % NUM_ACTIONS`` where ``shift`` is the policy's one
weight, which the learner sets to the version number it pushes.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from scripted_env import BOTH, NUM_ACTIONS, TERM, TRUNC, ScriptedEnv, ids_of, obs_code

from ptl_rl import ExperienceSource, NStepTransform
from ptl_rl.distributed import Collector, WorkerInfo

EPISODE_STRIDE = 1000  # incarnation k of a worker numbers its episodes from k * EPISODE_STRIDE
# (the tests run each incarnation for well under 1000 episodes: a few thousand env steps at most)


def code_reward(code: np.ndarray) -> np.ndarray:
    """The reward of the step taken in the observation with this code (float32, exact)."""
    return (((np.asarray(code, dtype=np.int64) * 2654435761) % 1000) / 100.0 - 5.0).astype(np.float32)


class _CodeRewards:
    """Stands in for ScriptedEnv's reward generator: the reward becomes a function of the step's start."""

    def __init__(self, env: ScriptedEnv) -> None:
        self.env = env

    def normal(self) -> float:
        env = self.env  # called after the step counter moved on: the step started at _step - 1
        return float(code_reward(obs_code(np.array([env.index, env._episode, env._step - 1]))))


class CodeRewardEnv(ScriptedEnv):
    """A ScriptedEnv whose rewards are :func:`code_reward` and whose episodes follow :func:`episode_script` by
    episode number, endlessly; it can be told to fail, or to cost time per step."""

    def __init__(
        self, index: int, *args: Any, fail_at: int | None = None, step_sleep: float = 0.0, **kwargs: Any
    ) -> None:
        super().__init__(index, (), *args, **kwargs)
        self.episodes = EndlessScript(index)  # (ScriptedEnv copies a script into a list: this one has no end)
        self._reward_rng = _CodeRewards(self)
        self.fail_at = fail_at
        self.step_sleep = step_sleep
        self.steps = 0

    def _script_index(self) -> int:
        return self._episode  # the script is indexed by the episode number itself, whatever the first one is

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise RuntimeError(f"scripted failure in env {self.index} at step {self.steps}")
        if self.step_sleep:
            time.sleep(self.step_sleep)
        return super().step(action)


class ShiftPolicy(torch.nn.Module):
    """One weight, ``shift``; the learner pushes ``shift = version`` so each row shows which weights acted."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = torch.nn.Parameter(torch.zeros(()))


class ShiftAgent:
    """Acts ``(obs code + shift) % NUM_ACTIONS``, deterministic: a row's action tells the weights it was taken with."""

    def __init__(self, policy: ShiftPolicy) -> None:
        self.policy = policy

    def __call__(self, obs: Any) -> np.ndarray:
        shift = int(round(float(self.policy.shift.detach())))
        return (obs_code(ids_of(obs)) + shift) % NUM_ACTIONS


PAD = 512  # float32 values per row of the padded agent's extra: 2 KiB, enough for AsyncSource's shared-memory ring


class PaddedShiftAgent(ShiftAgent):
    """A ShiftAgent whose extra ``pad`` (float32 [N, PAD]) repeats each row's observation code: large, and checkable."""

    def __call__(self, obs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        code = obs_code(ids_of(obs)).astype(np.float32)
        return super().__call__(obs), {"pad": np.repeat(code[:, None], PAD, axis=1)}


KINDS = (TERM, TRUNC, BOTH)


def episode_script(env: Any, episode: Any) -> tuple[Any, Any]:
    """``(length, kind index into KINDS)`` of episode number ``episode`` of env ``env`` (ints or int arrays).

    A pure function of the two numbers, defined for every episode: however far a
    collector runs (restarts under load let one run thousands of episodes), its
    episodes and the checker's idea of them cannot run out or disagree.
    """
    env, episode = np.asarray(env, dtype=np.int64), np.asarray(episode, dtype=np.int64)
    return 2 + (3 * env + 5 * episode) % 7, (env + episode) % 3


class EndlessScript(Sequence):
    """The script of one env as a sequence indexed by episode number, endless: ``script[e] = (length, kind)``."""

    def __init__(self, env: int) -> None:
        self.env = int(env)

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, episode: int) -> tuple[int, str]:  # type: ignore[override]
        length, kind = episode_script(self.env, episode)
        return int(length), KINDS[int(kind)]


def scripted_collector(
    info: WorkerInfo,
    *,
    num_envs: int = 3,
    n: int = 3,
    gamma: float = 0.9,
    mode: str = "NextStep",
    fail_at: int | None = None,
    fail_worker: int | None = None,
    step_sleep: float = 0.0,
    seed: int = 7,
    padded: bool = False,
) -> Collector:
    """``num_envs`` CodeRewardEnvs in a SyncVectorEnv, ExperienceSource(rank=info.rank), NStepTransform(n).

    ``padded``: the agent adds a 2 KiB extra per row (:class:`PaddedShiftAgent`).
    """
    fail = fail_at if fail_worker is None or fail_worker == info.worker else None
    fail = fail if info.incarnation == 0 else None  # a restarted worker runs cleanly
    fns = [
        functools.partial(
            CodeRewardEnv,
            i,
            first_episode=EPISODE_STRIDE * info.incarnation,
            fail_at=fail,
            step_sleep=step_sleep,
        )
        for i in range(num_envs)
    ]
    env = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode(mode))
    policy = ShiftPolicy()
    agent = (PaddedShiftAgent if padded else ShiftAgent)(policy)
    source = ExperienceSource(env, agent, gamma=gamma, seed=seed, rank=info.rank)
    pipeline = NStepTransform(source, n, gamma) if n > 1 else source
    return Collector(pipeline, policy)


class _Repeat:
    """A stage that hands out the same ready batch at every ``next()``: a collector as fast as its queue."""

    def __init__(self, source: ExperienceSource, batch: Any) -> None:
        self.upstream, self.batch = source, batch

    def __iter__(self) -> _Repeat:
        return self

    def __next__(self) -> Any:
        return self.batch


def flood_collector(info: WorkerInfo, *, rows: int = 64, row_bytes: int = 65_536) -> Collector:
    """Sends ``rows`` rows of ``row_bytes`` each (4 MiB by default) per batch, with no env work in between."""
    from ptl_rl import TransitionBatch  # noqa: PLC0415

    env = gym.vector.SyncVectorEnv([functools.partial(CodeRewardEnv, 0)])
    source = ExperienceSource(env, lambda obs: np.zeros(len(obs), np.int64), rank=info.rank)
    obs = np.zeros((rows, row_bytes), np.uint8)
    batch = TransitionBatch(
        obs=obs, action=np.zeros(rows, np.int64), reward=np.zeros(rows, np.float32), next_obs=obs,
        terminated=np.zeros(rows, bool), truncated=np.zeros(rows, bool), discount=np.ones(rows, np.float32),
        env_id=np.full(rows, info.rank, np.int64), policy_version=np.zeros(rows, np.int64),
    )  # fmt: skip
    return Collector(_Repeat(source, batch), None)


def check_rows(rows: dict[str, Any], *, num_envs: int = 3, n: int = 3, gamma: float = 0.9) -> None:
    """Assert that every row is a true n-step transition of its env, by brute force from the observation codes.

    For a row starting in ``[i, e, s]`` with ``discount = gamma**k``: ``k <= n``,
    ``next_obs = [i, e, s + k]``, ``reward = sum_j gamma**j * code_reward([i, e, s + j])``,
    the flags are those the script gives to step ``s + k`` of episode ``e``
    (and ``k < n`` only at an episode end), ``env_id % num_envs == i``, and the
    action is ``(code + policy_version) % NUM_ACTIONS``.
    """
    obs, next_obs = np.asarray(rows["obs"]), np.asarray(rows["next_obs"])
    i, e, s = obs[:, 0], obs[:, 1], obs[:, 2]
    k = np.rint(np.log(np.asarray(rows["discount"], dtype=np.float64)) / np.log(gamma)).astype(np.int64)
    assert ((k >= 1) & (k <= n)).all(), np.unique(k)
    np.testing.assert_array_equal(np.asarray(rows["env_id"]) % num_envs, i)
    np.testing.assert_array_equal(next_obs, np.stack([i, e, s + k], axis=1))
    expected_reward = np.zeros(len(i))
    for j in range(n):  # a loop over window positions
        term = code_reward(obs_code(np.stack([i, e, s + j], axis=1))).astype(np.float64)
        expected_reward += np.where(j < k, gamma**j * term, 0.0)
    np.testing.assert_allclose(np.asarray(rows["reward"], dtype=np.float64), expected_reward, rtol=1e-5, atol=1e-5)
    length, kind = episode_script(i, e)
    ends = s + k == length
    assert (s + k <= length).all(), "a window runs past its episode's end"
    assert (ends | (k == n)).all(), "a short window that is not at an episode end"
    np.testing.assert_array_equal(rows["terminated"], ends & np.isin(kind, (KINDS.index(TERM), KINDS.index(BOTH))))
    np.testing.assert_array_equal(rows["truncated"], ends & np.isin(kind, (KINDS.index(TRUNC), KINDS.index(BOTH))))
    version = np.asarray(rows["policy_version"])
    np.testing.assert_array_equal(np.asarray(rows["action"]), (obs_code(obs) + version) % NUM_ACTIONS)


def concat_rows(batches: Sequence[Any]) -> dict[str, np.ndarray]:
    """The fields of ``batches`` concatenated (numpy, or torch converted to numpy)."""

    def leaf(x: Any) -> np.ndarray:
        return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

    return {k: np.concatenate([leaf(b[k]) for b in batches]) for k in batches[0].keys()}


def row_priority(obs: Any, reward: Any) -> np.ndarray:
    """The initial priority a worker gives a row (float64 [B]): a function of the row alone, so the learner can
    recompute it by brute force from the stored rows (a stand-in for the worker's own TD error)."""
    return 0.25 + 0.5 * (obs_code(ids_of(obs)) % 7) + np.abs(np.asarray(reward, dtype=np.float64))


class _AttachPriorities:
    """A stage of a collector's chain: attaches each row's initial priority as ``INITIAL_PRIORITY_FIELD``."""

    def __init__(self, upstream: Any) -> None:
        self.upstream = upstream

    def __iter__(self) -> _AttachPriorities:
        return self

    def __next__(self) -> Any:
        from ptl_rl.distributed import INITIAL_PRIORITY_FIELD  # noqa: PLC0415

        batch = next(self.upstream)
        batch[INITIAL_PRIORITY_FIELD] = row_priority(batch["obs"], batch["reward"])
        return batch


def prioritizing_collector(info: WorkerInfo, **kwargs: Any) -> Collector:
    """:func:`scripted_collector` whose rows carry their initial priority (:func:`row_priority`), Ape-X style."""
    built = scripted_collector(info, **kwargs)
    return Collector(_AttachPriorities(built.pipeline), built.policy)

"""A scripted gymnasium env that records its own raw trajectory, for exact pipeline tests.

Every observation is ``[env_index, episode, step]`` (int64), so an observation
names exactly one point of one episode of one env: a final observation
``[i, e, L]`` can never be confused with the reset observation ``[i, e + 1, 0]``.
The env records every ``step`` call (obs, action, reward, next_obs,
terminated, truncated) itself, independently of ptl_rl, and every seed it was
reset with.

The episode layout is a script: a list of ``(length, kind)`` with ``kind`` in
``("term", "trunc", "both")``. After the script the env plays one endless episode, so a
vector env whose sub-envs finish their scripts at different times keeps
stepping. Rewards are random (float32-exact values from ``reward_seed``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

TERM, TRUNC, BOTH = "term", "trunc", "both"  # BOTH: terminated and truncated at once
NUM_ACTIONS = 5
MODES = ("NextStep", "SameStep", "Disabled", "single")
_CODE_BASE = 10_000  # obs code = (index * base + episode) * base + step


class ScriptedEnv(gym.Env):
    """One env with a given episode layout; see the module docstring.

    Args:
        index: the env's number, the first entry of every observation.
        episodes: the script, ``[(length, "term" | "trunc" | "both"), ...]``.
        reward_seed: seeds the rewards (with ``index``).
        dict_obs: observations are ``{"id": [3] int64, "pos": [2] float32}``.
        box_action: the action space is ``Box(-1, 1, (2,))`` instead of ``Discrete(5)``.
        first_episode: number of the first episode (tells apart the episodes of two runs).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        index: int,
        episodes: Sequence[tuple[int, str]],
        reward_seed: int = 0,
        dict_obs: bool = False,
        box_action: bool = False,
        first_episode: int = 0,
    ) -> None:
        self.index = int(index)
        self.episodes = [(int(length), str(kind)) for length, kind in episodes]
        assert all(length >= 1 and kind in (TERM, TRUNC, BOTH) for length, kind in self.episodes)
        self.dict_obs = dict_obs
        self.first_episode = int(first_episode)
        id_space = spaces.Box(0, 2**40, shape=(3,), dtype=np.int64)
        if dict_obs:
            pos_space = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
            self.observation_space = spaces.Dict({"id": id_space, "pos": pos_space})
        else:
            self.observation_space = id_space
        self.action_space = (
            spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32) if box_action else spaces.Discrete(NUM_ACTIONS)
        )
        self._reward_rng = np.random.default_rng([int(reward_seed), self.index])
        self.record: list[tuple[np.ndarray, Any, float, np.ndarray, bool, bool]] = []
        self.reset_seeds: list[int | None] = []
        self._episode = self.first_episode - 1
        self._step = 0
        self._active = False

    # the raw (obs id, ...) trajectory and the script are what the tests compare against
    def _script_index(self) -> int:
        return self._episode - self.first_episode

    def _obs(self) -> Any:
        ident = np.array([self.index, self._episode, self._step], dtype=np.int64)
        if not self.dict_obs:
            return ident
        return {"id": ident, "pos": np.array([self._episode * 0.5, self._step * 0.25], dtype=np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.reset_seeds.append(seed)
        self._episode += 1
        self._step = 0
        self._active = True
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if not self._active:
            raise RuntimeError(f"ScriptedEnv {self.index}: step() without reset() after the episode ended")
        obs = _ident(self._obs())
        self._step += 1
        k = self._script_index()
        terminated = truncated = False
        if k < len(self.episodes):
            length, kind = self.episodes[k]
            if self._step == length:
                terminated, truncated = kind in (TERM, BOTH), kind in (TRUNC, BOTH)
        reward = float(np.float32(self._reward_rng.normal()))
        next_obs = self._obs()
        self.record.append((obs, np.array(action).copy(), reward, _ident(next_obs), terminated, truncated))
        self._active = not (terminated or truncated)
        return next_obs, reward, terminated, truncated, {}


def _ident(obs: Any) -> np.ndarray:
    return np.array(obs["id"] if isinstance(obs, dict) else obs, dtype=np.int64).copy()


def obs_code(ident: np.ndarray) -> np.ndarray:
    """One int64 per observation id ``[..., 3]``: unique over (env index, episode, step)."""
    ident = np.asarray(ident, dtype=np.int64)
    return (ident[..., 0] * _CODE_BASE + ident[..., 1]) * _CODE_BASE + ident[..., 2]


def ids_of(obs: Any) -> np.ndarray:
    """The ``[B, 3]`` id part of a batched observation (array or dict)."""
    return np.asarray(obs["id"] if isinstance(obs, dict) else obs)


# ---------------------------------------------------------------------- envs
def make_env(
    layouts: Sequence[Sequence[tuple[int, str]]],
    mode: str,
    *,
    dict_obs: bool = False,
    box_action: bool = False,
    reward_seed: int = 0,
    asynchronous: bool = False,
    copy: bool = True,
    first_episode: int = 0,
) -> Any:
    """A single ScriptedEnv (``mode == "single"``, one layout) or a vector env of them."""
    fns = [
        functools.partial(
            ScriptedEnv,
            i,
            layout,
            reward_seed=reward_seed,
            dict_obs=dict_obs,
            box_action=box_action,
            first_episode=first_episode,
        )
        for i, layout in enumerate(layouts)
    ]
    if mode == "single":
        assert len(fns) == 1
        return fns[0]()
    autoreset = gym.vector.AutoresetMode(mode)
    if asynchronous:
        return gym.vector.AsyncVectorEnv(fns, copy=copy, autoreset_mode=autoreset)
    return gym.vector.SyncVectorEnv(fns, copy=copy, autoreset_mode=autoreset)


def env_attr(env: Any, name: str) -> list[Any]:
    """``name`` of every sub-env (a list of one for a single env); works across processes."""
    if isinstance(env, gym.vector.VectorEnv):
        return list(env.get_attr(name))
    return [getattr(env, name)]


def concat_batches(batches: Sequence[Any]) -> dict[str, Any]:
    """Row-concatenate batches (a test-side twin of ``TransitionBatch.concat``, into a plain dict of copies)."""

    def cat(*leaves: Any) -> Any:
        if isinstance(leaves[0], dict):
            return {k: cat(*(leaf[k] for leaf in leaves)) for k in leaves[0]}
        return np.concatenate([np.asarray(leaf) for leaf in leaves])

    return {k: cat(*(b[k] for b in batches)) for k in batches[0].keys()}


def raw_transitions(records: Sequence[Sequence[tuple]]) -> dict[str, np.ndarray]:
    """The envs' own records as flat arrays: env, obs [M, 3], action, reward, next_obs, terminated, truncated."""
    rows = [(i, *r) for i, record in enumerate(records) for r in record]
    if not rows:
        return {"env": np.zeros(0, np.int64), "code": np.zeros(0, np.int64)}
    env, obs, action, reward, next_obs, term, trunc = zip(*rows, strict=True)
    out = {
        "env": np.array(env, dtype=np.int64),
        "obs": np.stack(obs),
        "action": np.stack(action),
        "reward": np.array(reward, dtype=np.float32),
        "next_obs": np.stack(next_obs),
        "terminated": np.array(term, dtype=bool),
        "truncated": np.array(trunc, dtype=bool),
    }
    out["code"] = obs_code(out["obs"])
    return out


def recorded_episodes(records: Sequence[Sequence[tuple]]) -> list[tuple[int, int, float]]:
    """Finished episodes of each env in order: ``(env index, length, return)``."""
    episodes = []
    for i, record in enumerate(records):
        length, ret = 0, 0.0
        for _, _, reward, _, term, trunc in record:
            length += 1
            ret += reward
            if term or trunc:
                episodes.append((i, length, ret))
                length, ret = 0, 0.0
    return episodes


# ---------------------------------------------------------------------- agent and driver
class ScriptedAgent:
    """Random actions, extras derived from the observation, and checks of the hook protocol.

    Extras: ``log_prob`` = -obs code (float64) and ``hidden`` = (episode, step)
    (float32 [N, 2]), so a test can tell whether they stayed aligned with their
    rows. ``reset_state(mask)`` must announce exactly the envs whose observation
    in the next call is a new episode's first one; ``on_env_steps`` must be
    called once after every step.
    """

    def __init__(self, num_envs: int, *, box_action: bool = False, seed: int = 0) -> None:
        self.num_envs = num_envs
        self.box_action = box_action
        self.rng = np.random.default_rng(seed)
        self.pending = np.zeros(num_envs, dtype=bool)
        self.calls = 0
        self.reset_calls = 0
        self.env_steps: list[int] = []

    def reset_state(self, mask: np.ndarray) -> None:
        mask = np.asarray(mask)
        assert mask.dtype == bool and mask.shape == (self.num_envs,), mask
        assert mask.any(), "reset_state called with an empty mask"
        self.pending |= mask
        self.reset_calls += 1

    def on_env_steps(self, total_steps: int) -> None:
        assert isinstance(total_steps, int)
        assert len(self.env_steps) == self.calls - 1, "on_env_steps must follow each step exactly once"
        self.env_steps.append(total_steps)

    def __call__(self, obs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        assert len(self.env_steps) == self.calls, "on_env_steps was not called after the previous step"
        ids = ids_of(obs)
        assert ids.shape == (self.num_envs, 3), ids.shape
        first = ids[:, 2] == 0
        assert np.array_equal(self.pending, first), (
            f"reset_state announced {self.pending} but first observations of episodes are {first} (obs {ids})"
        )
        self.pending[:] = False
        self.calls += 1
        if self.box_action:
            actions = self.rng.uniform(-1, 1, size=(self.num_envs, 2)).astype(np.float32)
        else:
            actions = self.rng.integers(0, NUM_ACTIONS, size=self.num_envs)
        extras = {"log_prob": -obs_code(ids).astype(np.float64), "hidden": ids[:, 1:].astype(np.float32)}
        return actions, extras


def scripted_batches(source: Any, layouts: Sequence[Sequence[tuple[int, str]]], extra_steps: int = 0):
    """Yield the source's batches until every env has ended all its scripted episodes, then ``extra_steps`` more.

    Stops with an AssertionError if the source loses episode ends (it would run forever).
    """
    rank_offset = source.rank * source.num_envs
    ends = np.zeros(len(layouts), dtype=np.int64)
    wanted = np.array([len(layout) for layout in layouts])
    budget = 2 * sum(length for layout in layouts for length, _ in layout) + 10
    while (ends < wanted).any():
        batch = next(source)
        env = batch["env_id"] - rank_offset
        np.add.at(ends, env, batch["terminated"] | batch["truncated"])
        yield batch
        budget -= 1
        assert budget > 0, f"source ran far past the script: episode ends seen {ends}, scripted {wanted}"
    for _ in range(extra_steps):
        yield next(source)

"""Brute-force n-step transitions straight from a scripted env's own record (the reference for n-step tests)."""

from __future__ import annotations

import numpy as np
from scripted_env import obs_code


def reference_nstep(records, n, gamma, env_id_offset=0):
    """Brute force, straight from the envs' records: one row per (env, episode, step), sorted by obs code.

    A window of ``k = min(n, steps left in the episode)`` steps; reward = sum gamma**i r,
    discount = gamma**k, next_obs = next_obs of the window's last step, flags = flags of
    that step if the episode ended inside the window. The episode still running when the
    record stops is ended by ``flush()``: its windows that never filled up (k < n) are
    emitted as truncated, the full ones were emitted earlier without flags.
    """
    rows = []
    for i, record in enumerate(records):
        episodes, current = [], []
        for step in record:
            current.append(step)
            if step[4] or step[5]:
                episodes.append((current, True))
                current = []
        if current:
            episodes.append((current, False))
        for steps, ended in episodes:
            m = len(steps)
            for t in range(m):
                k = min(n, m - t)
                window = steps[t : t + k]
                reward = 0.0
                for j in range(k):
                    reward += gamma**j * window[j][2]
                last = window[-1]
                if ended:
                    terminated, truncated = (last[4], last[5]) if t + k == m else (False, False)
                else:
                    terminated, truncated = False, m - t < n
                rows.append(
                    (
                        int(obs_code(steps[t][0])),
                        i + env_id_offset,
                        steps[t][1],
                        reward,
                        gamma**k,
                        int(obs_code(last[3])),
                        terminated,
                        truncated,
                    )
                )
    rows.sort(key=lambda r: r[0])
    if not rows:
        return None
    code, env, action, reward, discount, next_code, terminated, truncated = zip(*rows, strict=True)
    return {
        "code": np.array(code),
        "env_id": np.array(env),
        "action": np.stack(action),
        "reward": np.array(reward),
        "discount": np.array(discount),
        "next_code": np.array(next_code),
        "terminated": np.array(terminated, dtype=bool),
        "truncated": np.array(truncated, dtype=bool),
    }

"""How a finished rollout is cut into minibatches: epochs of shuffled indices, the sequence layout, advantage scaling.

A rollout is the flat, time-major batch of
:meth:`~ptl_rl.replay.rollout.RolloutBuffer.finish` (row ``t`` of every env
that has one, then ``t + 1``). Single-transition minibatches index its rows;
sequence minibatches (recurrent PPO) index sequences of ``L`` consecutive rows
of one env, laid out once per rollout by :func:`sequence_layout`.
"""

from __future__ import annotations

import numpy as np

from ptl_rl.core.batch import TransitionBatch


def normalized(advantage: np.ndarray) -> np.ndarray:
    """(a - mean) / (std + 1e-8), float32; a single row normalizes to 0."""
    standardized: np.ndarray = ((advantage - advantage.mean()) / (advantage.std() + 1e-8)).astype(np.float32)
    return standardized


def normalized_like(advantage: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``advantage`` standardized by the mean and std of its rows where ``mask`` is True (same shape)."""
    real = advantage[mask]
    standardized: np.ndarray = ((advantage - real.mean()) / (real.std() + 1e-8)).astype(np.float32)
    return standardized


def epoch_schedule(rng: np.random.Generator, size: int, epochs: int, num_minibatches: int) -> list[np.ndarray]:
    """``epochs * num_minibatches`` int64 index arrays into ``size`` items; each epoch is a fresh permutation.

    The parts of one epoch differ in size by at most one item.
    """
    return [part for _ in range(epochs) for part in np.array_split(rng.permutation(size), num_minibatches)]


def sequence_layout(counts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut each env's rows into sequences of ``length``: (flat rows int64 [Q, L], mask bool [Q, L]).

    ``counts`` int [N] are the rows per env; the flat rollout orders rows
    time-major (row ``t`` of every env that has one, then ``t + 1``). Env
    ``e`` gives ``ceil(counts[e] / L)`` sequences, in env order then time
    order; positions past an env's last row repeat that row, with mask False.
    """
    counts = np.asarray(counts, dtype=np.int64)
    steps = np.arange(int(counts.max()))[:, None]
    flat = np.full((len(steps), len(counts)), -1, dtype=np.int64)
    valid = steps < counts[None, :]
    flat[valid] = np.arange(int(valid.sum()))  # boolean assignment runs in the same time-major order
    per_env = -(-counts // length)  # ceil
    env = np.repeat(np.arange(len(counts)), per_env)
    first = (np.arange(len(env)) - np.repeat(np.cumsum(per_env) - per_env, per_env)) * length
    position = first[:, None] + np.arange(length)[None, :]  # [Q, L] time index in the env's sequence
    mask = position < counts[env][:, None]
    position = np.minimum(position, counts[env][:, None] - 1)  # padding repeats the last real row
    return flat[position, env[:, None]], mask


def sequence_minibatch(
    rollout: TransitionBatch, layout: np.ndarray, layout_mask: np.ndarray, sequences: np.ndarray, normalize: bool
) -> TransitionBatch:
    """The ``sequences`` (int [B_seq], indices into the [Q, L] ``layout``) as one [B_seq, L, ...] batch.

    Adds ``mask`` (bool [B_seq, L]) and clears ``episode_start`` on padding;
    with ``normalize``, standardizes ``advantage`` over the valid rows (0 on padding).
    """
    batch = rollout.rows(layout[sequences])  # a [B_seq, L] index: every field becomes [B_seq, L, ...]
    mask = layout_mask[sequences]
    batch["mask"] = mask
    batch["episode_start"] = batch["episode_start"] & mask
    if normalize:  # statistics of the real rows: padding repeats rows
        advantage = batch["advantage"]
        batch["advantage"] = np.where(mask, normalized_like(advantage, mask), 0.0).astype(np.float32)
    return batch

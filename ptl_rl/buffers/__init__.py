"""Replay storage and buffers."""

from ptl_rl.buffers.replay import ReplayBuffer
from ptl_rl.buffers.storage import ArrayStorage

__all__ = ["ArrayStorage", "ReplayBuffer"]

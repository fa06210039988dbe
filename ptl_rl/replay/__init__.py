"""Replay storage and buffers."""

from ptl_rl.replay.buffer import ReplayBuffer
from ptl_rl.replay.draws import PriorityDraws, SlotDraws
from ptl_rl.replay.episodes import EpisodeIndex
from ptl_rl.replay.frames import FrameStorage
from ptl_rl.replay.her import HERReplayBuffer
from ptl_rl.replay.indexed import IndexedReplayBuffer
from ptl_rl.replay.memmap import MemmapStorage
from ptl_rl.replay.persist import load_buffer, save_buffer
from ptl_rl.replay.prioritized import PrioritizedReplayBuffer, PriorityFeedback
from ptl_rl.replay.rollout import RolloutBuffer
from ptl_rl.replay.sequence import SequenceReplayBuffer
from ptl_rl.replay.shuffle import ShuffledPasses
from ptl_rl.replay.storage import ArrayStorage
from ptl_rl.replay.sumtree import SumTree

__all__ = [
    "ArrayStorage",
    "EpisodeIndex",
    "FrameStorage",
    "HERReplayBuffer",
    "IndexedReplayBuffer",
    "MemmapStorage",
    "PriorityDraws",
    "PrioritizedReplayBuffer",
    "PriorityFeedback",
    "ReplayBuffer",
    "RolloutBuffer",
    "SequenceReplayBuffer",
    "ShuffledPasses",
    "SlotDraws",
    "SumTree",
    "load_buffer",
    "save_buffer",
]

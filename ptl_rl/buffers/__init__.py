"""Replay storage and buffers."""

from ptl_rl.buffers.draws import PriorityDraws, SlotDraws
from ptl_rl.buffers.episodes import EpisodeIndex
from ptl_rl.buffers.frames import FrameStorage
from ptl_rl.buffers.her import HERReplayBuffer
from ptl_rl.buffers.indexed import IndexedReplayBuffer
from ptl_rl.buffers.memmap import MemmapStorage
from ptl_rl.buffers.persist import load_buffer, save_buffer
from ptl_rl.buffers.prioritized import PrioritizedReplayBuffer, PriorityFeedback
from ptl_rl.buffers.replay import ReplayBuffer
from ptl_rl.buffers.rollout import RolloutBuffer
from ptl_rl.buffers.sequence import SequenceReplayBuffer
from ptl_rl.buffers.shuffle import ShuffledPasses
from ptl_rl.buffers.storage import ArrayStorage
from ptl_rl.buffers.sumtree import SumTree
from ptl_rl.buffers.unfinished import UnfinishedAdd

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
    "UnfinishedAdd",
    "load_buffer",
    "save_buffer",
]

"""Replay: storages, the strategies that draw batches from them, and the buffers composed of the two."""

from ptl_rl.replay.buffer import ReplayBuffer
from ptl_rl.replay.draws import UniformDraws, WeightedSlots
from ptl_rl.replay.episodes import EpisodeIndex
from ptl_rl.replay.feedback import PriorityFeedback
from ptl_rl.replay.frames import FrameStorage
from ptl_rl.replay.her import HERReplayBuffer
from ptl_rl.replay.hindsight import HindsightGoals
from ptl_rl.replay.memmap import MemmapStorage
from ptl_rl.replay.persist import load_buffer, save_buffer
from ptl_rl.replay.prioritized import PrioritizedReplayBuffer
from ptl_rl.replay.priority_draws import PrioritizedDraws
from ptl_rl.replay.rollout import RolloutBuffer
from ptl_rl.replay.sequence import SequenceReplayBuffer
from ptl_rl.replay.shuffle import ShuffledPasses
from ptl_rl.replay.storage import ArrayStorage
from ptl_rl.replay.sumtree import SumTree
from ptl_rl.replay.windows import SequenceWindows

__all__ = [
    "ArrayStorage",
    "EpisodeIndex",
    "FrameStorage",
    "HERReplayBuffer",
    "HindsightGoals",
    "MemmapStorage",
    "PrioritizedDraws",
    "PrioritizedReplayBuffer",
    "PriorityFeedback",
    "ReplayBuffer",
    "RolloutBuffer",
    "SequenceReplayBuffer",
    "SequenceWindows",
    "ShuffledPasses",
    "SumTree",
    "UniformDraws",
    "WeightedSlots",
    "load_buffer",
    "save_buffer",
]

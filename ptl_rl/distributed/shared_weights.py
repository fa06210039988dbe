"""The learner's policy weights in shared memory: one copy, written in place at each push, with its version beside it.

One copy, written in place, so no queue of weight snapshots grows behind a slow
collector. The collector process reads ``version_value`` before each env step and,
when it changed, loads ``tensors`` under ``lock`` (see
:func:`~ptl_rl.distributed.collector_process.collector_main`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ptl_rl.distributed.common import weights_of


class SharedWeights:
    """A shared-memory copy of a policy's ``state_dict``, its version (a shared int64) and the lock around writes.

    Args:
        ctx: the multiprocessing context the collector processes start in.
    """

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self.tensors: dict[str, torch.Tensor] | None = None  # name -> shared tensor, allocated at first use
        self.version_value: Any = None  # a shared int64 Value, read by the collector: the version the tensors hold
        self.lock: Any = None
        self.published: int | None = None  # the same version, learner-side (None: not written since a restore)

    def allocate(self, policy: Any, version: int) -> None:
        """Allocate the shared copy once, shaped as ``policy``'s weights (it is written in place at every push)."""
        if self.tensors is None:
            self.tensors = {k: v.clone().share_memory_() for k, v in weights_of(policy).items()}
            self.version_value = self._ctx.Value("q", version, lock=False)

    def new_lock(self) -> None:
        # a lock per process: one killed while copying the weights would leave its lock held for good
        self.lock = self._ctx.Lock()

    def check_fits(self, state: Mapping[str, torch.Tensor]) -> None:
        """Raise unless ``state`` has every key of the policy's weights, each with its shape."""
        assert self.tensors is not None
        missing = sorted(set(self.tensors) - set(state))
        wrong = [k for k in self.tensors if k in state and tuple(state[k].shape) != tuple(self.tensors[k].shape)]
        if missing or wrong:
            raise ValueError(
                f"the pushed weights do not fit the policy (missing {missing}, other shapes for {wrong}); "
                "push a state_dict() of the policy module given to AsyncSource(policy=...), or None for its own"
            )

    def write(self, state_dict: Mapping[str, torch.Tensor], version: int, *, reader_running: bool) -> bool:
        """Copy ``state_dict`` in as ``version``; ``False`` (nothing written) if the lock stays held for 10 s.

        Without a running reader nothing is waited for (a dead collector may
        even have left the lock held).
        """
        assert self.tensors is not None
        if not reader_running:
            self._copy(state_dict, version)
            return True
        if not self.lock.acquire(timeout=10.0):
            return False
        try:
            self._copy(state_dict, version)
        finally:
            self.lock.release()
        return True

    def _copy(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        assert self.tensors is not None
        with torch.no_grad():
            for name, tensor in self.tensors.items():
                tensor.copy_(state_dict[name])
        self.version_value.value = int(version)
        self.published = int(version)

"""What runs in an AsyncSource's collector process: build the collector, step it, send its batches to the learner.

The messages on the data queue, child to learner (plain tuples, pickled by the queue):

* ``("batch", payload, steps, episodes)``: the rows of ``steps_per_message``
  pipeline batches, ``payload`` a :class:`~ptl_rl.core.batch.TransitionBatch`
  (or, with a shared-memory ring, what
  :meth:`~ptl_rl.distributed.shm_ring.RingWriter.pack` made of one),
  ``steps`` the env steps taken since the previous message, ``episodes`` the
  episodes that ended in them;
* ``("error", type name, message, formatted traceback)``: the collector
  failed; it is the last message.

Weights go the other way through one shared-memory copy of the policy's
``state_dict`` beside a version counter (:class:`~ptl_rl.distributed.shared_weights.SharedWeights`).
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import traceback
from typing import Any

import torch

from ptl_rl.core.batch import TransitionBatch
from ptl_rl.distributed.common import BuiltCollector, Factory, WorkerInfo
from ptl_rl.distributed.shm_ring import RingWriter

POLL_S = 0.1  # how often a blocked side looks at the other one (stop flag, parent alive, child alive)


def _learner_alive() -> bool:
    # the learner is not the OS parent under forkserver; multiprocessing's parent sentinel works for both methods
    parent = multiprocessing.parent_process()
    return parent is None or parent.is_alive()


def _put(data_q: Any, message: tuple[Any, ...], stop: Any) -> bool:
    """Put ``message``, waiting while the queue is full; ``False`` when told to stop or orphaned."""
    while not stop.is_set() and _learner_alive():
        try:
            data_q.put(message, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def collector_main(
    factory: Factory,
    info: WorkerInfo,
    data_q: Any,
    stop: Any,
    weights: dict[str, torch.Tensor] | None,
    version: Any,
    lock: Any,
    counters: tuple[int, int] | None,
    steps_per_message: int = 1,
    ring: tuple[torch.Tensor, Any] | None = None,
) -> None:
    """Body of the collector process: build, then step and send until told to stop or the parent is gone."""
    # Ctrl-C in a terminal reaches the whole process group: the learner decides when the collector stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)  # the learner owns the cores for its gradient steps
    error_sent = False

    def keep_going() -> bool:
        return not stop.is_set() and _learner_alive()

    try:
        writer = RingWriter(*ring) if ring is not None else None
        collector = BuiltCollector(factory, info)
        if counters is not None:
            collector.restore_counters(*counters)
        last_steps = collector.source.total_steps
        while not stop.is_set() and _learner_alive():
            batches, episodes = [], []
            for _ in range(steps_per_message):
                if weights is not None and version.value != collector.version:
                    with lock:  # the learner writes these tensors in place under the same lock
                        collector.set_weights(version.value, weights)
                elif weights is None and collector.version < 0:
                    collector.set_weights(0, None)
                batch, steps, ended = collector.next_batch()
                batches.append(batch)
                episodes += ended
            # one message per steps_per_message batches: the queue's fixed cost (pickle, pipe write, the
            # learner's wake-up and unpickle) is paid once for all of them
            batch = TransitionBatch.concat(batches)
            # large arrays go through shared memory, the queue carries where they are; None: told to stop
            message = batch if writer is None else writer.pack(batch, keep_going)
            if message is None:
                break
            if not _put(data_q, ("batch", message, steps - last_steps, episodes), stop):
                break
            last_steps = steps
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the learner, which raises it
        error_sent = _put(data_q, ("error", type(exc).__name__, str(exc), traceback.format_exc()), stop)
    if error_sent:  # the learner is reading: wait until the queue's feeder thread has really sent the error
        data_q.close()
        data_q.join_thread()
    else:  # exiting must never wait for a learner that stopped reading
        data_q.cancel_join_thread()

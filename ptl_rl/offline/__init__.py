"""Offline data: Minari datasets read into the pipeline, and episodes recorded out of it (the ``offline`` extra).

Both directions keep the field contract of live data (``docs/contract.rst``); see ``docs/design/offline.md``.

* ``reader`` -- opening a Minari dataset (``open_minari_dataset``), the install hint, the space checks,
  and a Minari episode's steps as transition rows.
* ``source`` -- ``MinariSource``: a dataset's episodes yielded as 1-step batches, one row per lane.
* ``buffer`` -- ``minari_replay_buffer``: a standalone ReplayBuffer filled with a whole dataset in one call.
* ``writer`` -- creating a new Minari dataset with the dtypes of the stored arrays, storing the env's spec.
* ``recorder`` -- ``MinariRecorder``: a source's batches passed through and written as Minari episodes.
"""

"""Offline data: Minari datasets read into the pipeline, and episodes recorded out of it (the ``offline`` extra)."""

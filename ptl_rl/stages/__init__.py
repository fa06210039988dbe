"""The pipeline's stages before and after replay: the source, n-step, normalization and the batch sampler.

Each stage is an iterator over what it yields that wraps the one before it
(its ``upstream``). Replay buffers are stages too; they live in
:mod:`ptl_rl.replay`, which sits above this package.
"""

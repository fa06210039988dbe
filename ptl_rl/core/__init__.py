"""The bottom layer: what flows between stages and what a part must have to join a chain.

The batch types (:mod:`~ptl_rl.core.batch`), the protocols of a stage, a
storage, an agent and an env (:mod:`~ptl_rl.core.protocols`), walking a chain
(:mod:`~ptl_rl.core.chain`), clocks, state versions, rank seeds and schedules.
Nothing here imports a module of another ``ptl_rl`` subpackage.
"""

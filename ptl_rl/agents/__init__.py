"""Agents: callables from a batch of observations to a batch of actions, their selectors and action heads.

Above :mod:`ptl_rl.core` only: an agent knows nothing of the stages that call it.
"""

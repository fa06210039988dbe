"""Agents: callables from a batch of observations to a batch of actions, their selectors and action heads.

Above :mod:`ptl_rl.core` only: an agent knows nothing of the stages that call it. The modules:

* :mod:`~ptl_rl.agents.tensors`: numpy observations onto a network's device and dtype (``obs_to_tensor``).
* :mod:`~ptl_rl.agents.seeding`: one seeded generator per device; the state of an agent that samples.
* :mod:`~ptl_rl.agents.checks`: construction-time checks of an agent, its arguments and the env's action space.
* :mod:`~ptl_rl.agents.selectors`: Q-values -> actions (argmax, epsilon-greedy).
* :mod:`~ptl_rl.agents.distributions`: action distributions and heads, Box action rescaling.
* :mod:`~ptl_rl.agents.dqn`: ``DQNAgent``, the selector hooks, ``TargetNet``.
* :mod:`~ptl_rl.agents.stochastic`: ``StochasticPolicyAgent``, ``ActorCriticAgent``, ``PolicyAgent``.
* :mod:`~ptl_rl.agents.deterministic`: ``DeterministicActorAgent`` (DDPG/TD3 exploration noise).
* :mod:`~ptl_rl.agents.recurrent`: ``RecurrentCore``, ``PerEnvState``, ``RecurrentDQNAgent``.
* :mod:`~ptl_rl.agents.recurrent_policy`: ``RecurrentActorCritic`` and its agent (recurrent PPO).
* :mod:`~ptl_rl.agents.recurrent_targets`: ``sequence_nstep_targets``, n-step targets inside replayed windows.
"""

"""Recurrent PPO on CartPole without velocities, against the same network with its memory cut, over several seeds.

    .venv/bin/python benchmarks/recurrent_ppo_cartpole.py              # LSTM and feed-forward, seeds 0-2
    .venv/bin/python benchmarks/recurrent_ppo_cartpole.py --arms lstm --seeds 3 4
    .venv/bin/python benchmarks/recurrent_ppo_cartpole.py --table      # the table of the recorded runs

Both arms run ``ptl_rl/examples/recurrent_ppo.py`` with its defaults (the
flags are in each record) on ``CartPoleNoVelocity-v1`` (cart position and
pole angle only): ``--core lstm`` and ``--core mlp`` (``--feed-forward``: the
LSTM cells replaced by ReLU layers of the same width; the same pipeline,
rollouts, loss and budget). The default budget is docs/benchmarks.rst's 200,000 env
steps. Training stops early once a greedy evaluation (20 episodes) reaches
475 and 20 fresh episodes confirm it; the score is the final greedy mean
return over 20 fresh episodes. Each run appends one record to
``benchmarks/results/recurrent_ppo_cartpole.json`` (the run's summary, the
commit and the load average); runs already recorded for the same commit are
skipped. The runner is ``benchmarks/_recurrent_arms.py``, shared with R2D2-lite.
"""

from __future__ import annotations

from _recurrent_arms import ROOT, main

if __name__ == "__main__":
    main("recurrent_ppo", ROOT / "benchmarks" / "results" / "recurrent_ppo_cartpole.json", __doc__, env_steps=200_000)

"""Reference algorithms as LightningModules with a command line, built only from the public ptl_rl API.

Each module is one algorithm, readable top to bottom; run one with
``python -m ptl_rl.examples.<name> --help`` (for instance ``dqn``).
"""

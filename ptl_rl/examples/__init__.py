"""Reference algorithms as LightningModules with a command line, built only from the public ptl_rl API.

Each module is one algorithm, readable top to bottom: its flags, networks,
LightningModule, pipeline, Trainer with its callbacks, ``fit``, final
evaluation and summary. Run one with ``python -m ptl_rl.examples.<name> --help``
(for instance ``dqn``). Beside them: ``cli`` (the shared flags and the env
check), ``reporting`` and ``runs`` (what a run writes down), ``plot``,
``burst`` (a pipeline stage), ``partial_obs`` (an env) and ``quiet``.
"""

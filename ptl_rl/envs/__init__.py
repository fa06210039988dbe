"""Environments as the source steps them: the checks of a gymnasium env's API, and the EnvPool adapter."""

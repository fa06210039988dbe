"""A run's directory, ``<runs-dir>/<algo>_<env>_<seed>_<time>/``, and everything an example writes into it.

Layout (every file is written as the run goes, so a run stopped early still
leaves its episodes and evaluations behind)::

    config.json        every flag, plus what the example derived from them (the epsilon schedule, ...)
    hparams.yaml       the same, as Lightning's CSVLogger writes it (with the module's own hyperparameters)
    metrics.csv        Lightning's logged metrics (losses, episode/return, eval/return_mean, ...)
    episodes.csv       env_steps, return, length, env_id, wall_time_s: every finished training episode
    evaluations.csv    env_steps, gradient_steps, kind, episodes, return_mean, return_std, wall_time_s
    summary.json       final return, env steps, wall time, why training stopped, ...
    tensorboard/       TensorBoard event files (when tensorboard is installed)
    videos/            env_steps_<9 digits>_episode_<i>.mp4 (or .gif): greedy episodes, with --video-every

Only the standard library and Lightning are imported here; the files are
plain CSV and JSON, which :mod:`ptl_rl.examples.plot` reads without torch.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EPISODE_FIELDS = ("env_steps", "return", "length", "env_id", "wall_time_s")
EVALUATION_FIELDS = ("env_steps", "gradient_steps", "kind", "episodes", "return_mean", "return_std", "wall_time_s")


def run_name(algo: str, env_id: str, seed: int, when: float | None = None) -> str:
    """``<algo>_<env>_<seed>_<YYYYmmdd-HHMMSS>``; characters of the env id that paths dislike become ``-``."""
    env = re.sub(r"[^A-Za-z0-9._-]+", "-", env_id).strip("-")
    return f"{algo}_{env}_{seed}_{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}"


def tensorboard_available() -> bool:
    """Whether Lightning's TensorBoardLogger can write (the ``tensorboard`` or ``tensorboardX`` package)."""
    return any(importlib.util.find_spec(name) is not None for name in ("tensorboard", "tensorboardX"))


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars, tuples, paths and non-finite floats made JSON-safe (NaN -> None)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class RunDirectory:
    """Creates ``<runs_dir>/<algo>_<env>_<seed>_<time>/`` (a ``-2``, ``-3``... suffix if that exists) and writes it.

    Args:
        runs_dir: the parent folder (created if missing).
        algo, env_id, seed: name the run.
    """

    def __init__(self, runs_dir: str | Path, algo: str, env_id: str, seed: int) -> None:
        self.start = time.perf_counter()
        base = Path(runs_dir) / run_name(algo, env_id, seed)
        base.parent.mkdir(parents=True, exist_ok=True)
        path, attempt = base, 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:  # two runs started in the same second
                attempt += 1
                path = base.with_name(f"{base.name}-{attempt}")
        self.path = path
        # opened on first use: Lightning's CSVLogger warns about a directory that already holds files
        self._files: dict[str, Any] = {}

    def _append(self, name: str, fields: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        """Append ``rows`` to the CSV file ``name`` (written with its header ``fields`` on first use)."""
        handle = self._files.get(name)
        if handle is None:
            handle = self._files[name] = open(self.path / name, "w", newline="")  # noqa: SIM115 - closed by close()
            csv.writer(handle).writerow(fields)
        csv.writer(handle).writerows(rows)
        handle.flush()  # a run stopped early still leaves everything so far

    def elapsed(self) -> float:
        """Seconds since the directory was created (the run's wall clock)."""
        return time.perf_counter() - self.start

    def write_json(self, name: str, data: Mapping[str, Any]) -> Path:
        """Write ``data`` as indented JSON to ``name`` in the run directory; returns the file's path."""
        target = self.path / name
        target.write_text(json.dumps(jsonable(data), indent=2, sort_keys=False) + "\n")
        return target

    def record_episodes(self, episodes: list[Any]) -> None:
        """Append finished episodes (:class:`ptl_rl.Episode`: ``ret``, ``length``, ``env_id``, ``total_steps``)."""
        if not episodes:
            return
        now = round(self.elapsed(), 3)
        self._append(
            "episodes.csv", EPISODE_FIELDS, [(e.total_steps, float(e.ret), e.length, e.env_id, now) for e in episodes]
        )

    def record_evaluation(
        self, env_steps: int, gradient_steps: int, kind: str, returns: Any, wall_time_s: float | None = None
    ) -> None:
        """Append one evaluation: ``kind`` is ``eval`` (periodic), ``confirm`` (fresh episodes) or ``final``."""
        returns = [float(r) for r in returns]
        mean = sum(returns) / len(returns)
        std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
        wall = self.elapsed() if wall_time_s is None else wall_time_s
        row = (env_steps, gradient_steps, kind, len(returns), mean, std, round(wall, 3))
        self._append("evaluations.csv", EVALUATION_FIELDS, [row])

    def loggers(self, tensorboard: bool = True) -> list[Any]:
        """Lightning loggers writing here: a CSVLogger (``metrics.csv``, ``hparams.yaml``), and TensorBoard's.

        The TensorBoard logger is left out when ``tensorboard`` is false or the
        package is not installed (``pip install tensorboard``, or the
        ``examples`` extra).
        """
        from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger  # noqa: PLC0415 - plot.py reads runs without Lightning

        loggers: list[Any] = [CSVLogger(self.path, name="", version="")]
        if tensorboard and tensorboard_available():
            loggers.append(TensorBoardLogger(self.path, name="tensorboard", version="", default_hp_metric=False))
        return loggers

    def close(self) -> None:
        """Close the CSV files, first creating those that got no row (a run without episodes or evaluations)."""
        for name, fields in (("episodes.csv", EPISODE_FIELDS), ("evaluations.csv", EVALUATION_FIELDS)):
            self._append(name, fields, [])
        for handle in self._files.values():
            handle.close()
        self._files.clear()


def read_csv(path: str | Path) -> dict[str, list[Any]]:
    """Columns of a CSV file written by :class:`RunDirectory`: numbers as floats, other cells as strings."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns: dict[str, list[Any]] = {}
    for row in rows:
        for key, cell in row.items():
            try:
                value: Any = float(cell)
            except (TypeError, ValueError):
                value = cell
            columns.setdefault(key, []).append(value)
    return columns

"""Shared by the benchmark scripts: the records they append, the facts of the machine, the docs' tables.

Every benchmark run appends one record to ``benchmarks/results/<name>.json``
(a JSON list, oldest first). A record of ``e2e.py``, ``collection.py``,
``buffer.py``, ``prioritized.py``, ``pixels.py``, ``lightning_overhead.py``,
``rollout.py``, ``sequence.py``, ``scaleout.py``, ``shard_wire.py``, ``shards.py``,
``before_after.py``, ``call_counts.py``, ``own_cost.py`` and ``vs_ptan.py`` holds:

``benchmark``
    the script (and for ``scaleout.py`` its part: ``scaleout dqn``, ...).
``date``
    when the run started, UTC, ISO 8601 (``2026-12-06T07:12:03Z``).
``commit``
    the short git HEAD, with ``-dirty`` when tracked files differed from it;
    ``changed`` lists those files (the first 40), so a reader sees whether
    the measured code (``ptl_rl/``, ``benchmarks/``) was among them.
``load``
    ``os.getloadavg()`` (1, 5 and 15 minutes) ``before`` and ``after`` the run.
``machine``
    ``cores``, ``cpu_model`` (``/proc/cpuinfo``), and the versions of
    ``python``, ``numpy``, ``torch``, ``ptl_rl`` and of each peer compared
    (``peers``: ``None`` for a peer that is not installed).
``config``
    the command-line arguments of the run.
``wall_s``
    how long the run took.
``medians``
    what the tables show: per measurement, the median over the repeats (and
    the ratios the script printed, each computed within this run).
``repeats``
    every repeat's value, in the order they ran.

``--table`` (every script) prints its table(s) from the records, with no
measuring: the text ``docs/benchmarks.rst`` carries (and ``README.rst``, for
the one results table it shows; ``docs/design/robustness.md`` and
``layering.md``, for the guard's cost and the redesign's before/after table),
each row naming the run(s) it comes from;
where several records hold a row, a cell gives the range over them.
``--results PATH`` reads and appends another file (a trial run, a test), and
``--since DATE`` / ``--last N`` restrict the table to newer or to the latest
records. The records of ``mujoco.py``, ``her_bitflip.py``, ``fetch_reach.py``,
``r2d2_cartpole.py`` and ``recurrent_ppo_cartpole.py`` keep their own fields
(see each script) and get ``date`` and ``machine`` too; older ones have no
date and are shown as ``undated``.

    .venv/bin/python benchmarks/_records.py --check    # every --table output is on its pages, verbatim
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
UNDATED = "undated"
# the pages that paste --table outputs, and the scripts whose tables each must hold verbatim: the benchmarks page
# every table, the README its one results table
BENCHMARKS_PAGE = "docs/benchmarks.rst"
PAGE_TABLES = {
    BENCHMARKS_PAGE: (
        "mujoco.py",
        "her_bitflip.py",
        "fetch_reach.py",
        "r2d2_cartpole.py",
        "recurrent_ppo_cartpole.py",
        "e2e.py",
        "collection.py",
        "buffer.py",
        "prioritized.py",
        "sequence.py",
        "rollout.py",
        "lightning_overhead.py",
        "pixels.py",
        "scaleout.py",
        "guard.py",
        "shard_wire.py",
        "shards.py",
        "vs_ptan.py",
    ),
    "README.rst": ("mujoco.py",),
    "docs/design/replay-service.md": ("shards.py",),
    "docs/design/robustness.md": ("guard.py",),
    "docs/design/layering.md": ("before_after.py", "call_counts.py", "own_cost.py", "vs_ptan.py"),
}
# a script whose table has no rows until its first record is committed: checked from then on
AWAITING_RECORDS = {
    "guard.py": RESULTS / "guard.json",
    "before_after.py": RESULTS / "before_after.json",
    "call_counts.py": RESULTS / "call_counts.json",
    "own_cost.py": RESULTS / "own_cost.json",
    "shards.py": RESULTS / "shards.json",
    "vs_ptan.py": RESULTS / "vs_ptan.json",
}
_OPTIONS = ("table", "results", "since", "last")  # the options added by add_options: not part of a run's config


# ---------------------------------------------------------------------------- facts
def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(*args: str, root: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    return done.stdout.rstrip("\n") if done.returncode == 0 else ""  # porcelain lines start with a space


def changed_files(paths: Sequence[str] = (), root: Path = ROOT) -> list[str]:
    """Tracked files (under ``paths``, or anywhere) of the checkout ``root`` that differ from its HEAD."""
    out = _git("status", "--porcelain", "-uno", "--", *paths, root=root)
    return [line[3:] for line in out.splitlines() if line.strip()]


def commit(paths: Sequence[str] = (), root: Path = ROOT) -> str:
    """The short HEAD of ``root`` (this checkout), with ``-dirty`` when tracked files (under ``paths``, or
    anywhere) differ from it."""
    dirty = "-dirty" if changed_files(paths, root) else ""
    return (_git("rev-parse", "--short", "HEAD", root=root) or "unknown") + dirty


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``None`` if absent); ptl_rl's from the checkout it runs."""
    if distribution == "ptl_rl" and "ptl_rl" in sys.modules:
        return getattr(sys.modules["ptl_rl"], "__version__", None)
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        module = sys.modules.get(distribution.replace("-", "_"))
        return getattr(module, "__version__", None) if module else None


def machine(peers: Iterable[str] = ()) -> dict[str, Any]:
    """Cores, CPU model, and the versions of Python, numpy, torch, ptl_rl and the ``peers`` compared."""
    facts: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        **{name: version(name) for name in ("numpy", "torch", "ptl_rl")},
    }
    peers = list(peers)
    if peers:
        facts["peers"] = {name: version(name) for name in peers}
    return facts


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------- records
def results_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def load(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else []


def append(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` to the JSON list in ``path``: under a lock, and never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:  # two benchmark processes may finish at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = [*load(path), record]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(records, indent=1, default=str) + "\n")
        tmp.replace(path)


class Run:
    """One benchmark run: stamps the start (date, commit, load) and appends the record at :meth:`save`.

    ``config`` is the run's arguments (an ``argparse.Namespace`` or a dict);
    the options of :func:`add_options` are left out of it.
    """

    def __init__(self, benchmark: str, config: Any, path: Path, peers: Iterable[str] = ()) -> None:
        config = dict(vars(config) if isinstance(config, argparse.Namespace) else config)
        self.path, self.peers = path, list(peers)
        self.record: dict[str, Any] = {
            "benchmark": benchmark,
            "date": utc_now(),
            "commit": commit(),
            "changed": changed_files()[:40],
            "load": {"before": loadavg()},
            "config": {k: v for k, v in config.items() if k not in _OPTIONS},
        }
        self.start = time.perf_counter()

    def save(self, medians: dict[str, Any], repeats: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """Add load after, machine, duration, ``medians``, ``repeats`` (and ``extra`` fields); append the record."""
        self.record["load"]["after"] = loadavg()
        self.record["machine"] = machine(self.peers)
        self.record["wall_s"] = round(time.perf_counter() - self.start, 1)
        self.record.update(medians=medians, repeats=repeats, **extra)
        append(self.path, self.record)
        print(f"record appended to {_shown(self.path)} ({self.record['date']}, {self.record['commit']})")
        return self.record


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def add_checkouts(parser: argparse.ArgumentParser, before_help: str = "checkout of the code before the change") -> None:
    """``--before`` and ``--after``: the two checkouts a comparing script (``before_after.py``, ...) runs on."""
    parser.add_argument("--before", type=Path, help=before_help)
    parser.add_argument("--after", type=Path, default=ROOT, help="checkout of the code after it (this one)")


def require_before(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A comparing run needs ``--before`` (only ``--table`` goes without)."""
    if args.before is None:
        parser.error("--before PATH is required (a checkout of the earlier code)")


def add_options(parser: argparse.ArgumentParser, name: str) -> None:
    """``--table``, ``--results``, ``--since`` and ``--last``: the options every benchmark script shares."""
    parser.add_argument("--table", action="store_true", help="print the docs' table(s) from the records and exit")
    parser.add_argument("--results", type=Path, default=results_path(name), help="the JSON file of records")
    parser.add_argument("--since", default=None, help="--table: only records of this date (UTC, ISO) or later")
    parser.add_argument("--last", type=int, default=None, help="--table: only the latest N records")


def select(args: argparse.Namespace, benchmark: str | None = None) -> list[dict[str, Any]]:
    """The records ``--table`` shows: of ``benchmark`` (when given), ``--since`` a date, the ``--last`` N."""
    records = load(args.results)
    if benchmark is not None:
        records = [r for r in records if r.get("benchmark") == benchmark]
    if args.since:
        records = [r for r in records if r.get("date", "") >= args.since]
    return records[-args.last :] if args.last else records


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


# ---------------------------------------------------------------------------- tables
def date_of(record: dict[str, Any]) -> str:
    """The record's start as ``2026-12-06 07:12`` (UTC), or ``undated`` for a record from before dates."""
    date = record.get("date")
    return date[:16].replace("T", " ") if date else UNDATED


def runs(records: Sequence[dict[str, Any]]) -> str:
    """Which runs a row comes from: one date, or the first and last date and the count."""
    dated = sorted(date_of(r) for r in records if r.get("date"))
    undated = len(records) - len(dated)
    if not dated:
        return UNDATED if undated <= 1 else f"{undated} {UNDATED}"
    first, last, count = dated[0], dated[-1], len(dated)
    if count == 1:
        text = first
    elif first == last:  # to the minute
        text = f"{first} ({count} runs)"
    else:
        text = f"{first} to {last[11:] if last[:10] == first[:10] else last} ({count} runs)"
    return text + (f", {undated} {UNDATED}" if undated else "")


def span(values: Iterable[float], fmt: str = "{:.2f}") -> str:
    """One value, or the range ``low-high`` of several (``low to high`` when the values carry signs)."""
    values = sorted(values)
    if not values:
        return "-"
    low, high = fmt.format(values[0]), fmt.format(values[-1])
    if low == high:
        return low
    signed = values[0] < 0 or low.startswith("+")  # "-3 to +2", "+1.0% to +4.0%": a dash would read as a sign
    return f"{low} to {high}" if signed else f"{low}-{high}"


def mean_sd(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    """``mean +- sample SD (n=k)`` (``statistics.stdev``); one value has no SD: ``mean (n=1)``."""
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{fmt.format(mean)} (n=1)"
    return f"{fmt.format(mean)} +- {fmt.format(statistics.stdev(values))} (n={len(values)})"


def rst_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A reStructuredText simple table (the first column must not be empty in any row)."""
    cells = [list(header), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    rule = "  ".join("=" * w for w in widths)

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    return "\n".join([rule, line(header), rule, *(line(r) for r in rows), rule])


def column(records: Sequence[dict[str, Any]], get: Callable[[dict[str, Any]], float | None], fmt: str) -> str:
    """The range over ``records`` of ``get(record)`` (records where it is ``None`` left out)."""
    return span((v for v in (get(r) for r in records) if v is not None), fmt)


def cell(records: Sequence[dict[str, Any]], keys: str | Sequence[str], fmt: str, scale: float = 1.0) -> str:
    """The range over ``records`` of ``record["medians"][keys...] * scale`` (records without it left out)."""
    read = get(*([keys] if isinstance(keys, str) else keys))
    return span((v * scale for v in (read(r) for r in records) if v is not None), fmt)


def having(records: Sequence[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    """The records whose ``medians`` hold the nested ``keys``."""
    out = []
    for r in records:
        node: Any = r.get("medians", {})
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            out.append(r)
    return out


def get(*keys: str) -> Callable[[dict[str, Any]], Any]:
    """``record["medians"][k1][k2]...``, ``None`` where absent."""

    def read(record: dict[str, Any]) -> Any:
        node: Any = record.get("medians", {})
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    return read


# ---------------------------------------------------------------------------- the pages check
def _literal_text(text: str) -> str:
    """``text`` with the 4-space indent of literal blocks removed: a plain-text table is pasted as one (``::``)."""
    return "\n".join(line[4:] if line.startswith("    ") else line for line in text.splitlines())


def table_blocks(script: str) -> list[str] | None:
    """The blocks (separated by blank lines) that ``script --table`` prints, or ``None`` if it failed."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--table"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        print(f"{script} --table failed:\n{done.stderr[-2000:]}")
        return None
    return [b for b in done.stdout.strip("\n").split("\n\n") if b.strip()]


def check(pages: dict[str, Sequence[str]] = PAGE_TABLES, root: Path = ROOT) -> int:
    """Run each page's scripts' ``--table``; every block of the output must be on the page verbatim (a plain-text
    table in a literal block counts). Returns the number of failures."""
    failures, outputs = 0, {}
    for page, scripts in pages.items():
        raw = (root / page).read_text()
        texts = (raw, _literal_text(raw))
        for script in scripts:
            waiting = AWAITING_RECORDS.get(script)
            if waiting is not None and not waiting.exists():
                print(f"{script:26s} no records yet ({_shown(waiting)}): not checked on {page}")
                continue
            if script not in outputs:
                outputs[script] = table_blocks(script)
            blocks = outputs[script]
            if blocks is None:
                failures += 1
                continue
            missing = [b for b in blocks if not any(b in text for text in texts)]
            failures += bool(missing)
            print(f"{script:26s} {len(blocks) - len(missing)}/{len(blocks)} blocks in {page}")
            for block in missing:
                print("  missing:\n    " + block.replace("\n", "\n    "))
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"check {BENCHMARKS_PAGE}, README.rst and the design pages against the scripts' --table",
    )
    args = parser.parse_args()
    if args.check:
        raise SystemExit(1 if check() else 0)
    parser.print_help()


if __name__ == "__main__":
    main()

"""Plot the learning curves of one or more example runs to a PNG.

    python -m ptl_rl.examples.plot runs/dqn_* -o curves.png

Each run directory (written by an example, see :mod:`ptl_rl.examples.runs`)
becomes one colour: its training episodes' returns against env steps, faint,
with their moving average over ``--smooth`` episodes drawn over them, and its
greedy evaluations (``evaluations.csv``) as markers (circles: periodic, squares:
confirmations on fresh episodes, a star: the final evaluation). A dashed line
marks the target return when the runs share one. Reads CSV and JSON only;
matplotlib is imported after the arguments are checked, and its absence is a
one-line error naming the fix.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptl_rl.examples.runs import read_csv

MARKERS = {"eval": "o", "confirm": "s", "final": "*"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m ptl_rl.examples.plot",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("runs", nargs="+", type=Path, help="run directories (each with episodes.csv)")
    p.add_argument("-o", "--output", type=Path, default=Path("curves.png"), help="the PNG to write")
    p.add_argument("--smooth", type=int, default=20, help="episodes in the moving average of the returns")
    p.add_argument("--title", default=None, help="figure title; without one, the runs' algorithms and envs")
    p.add_argument("--dpi", type=int, default=120, help="resolution of the PNG")
    args = p.parse_args(argv)
    missing = [str(run) for run in args.runs if not (run / "episodes.csv").is_file()]
    if missing:
        p.error(f"not a run directory (no episodes.csv): {', '.join(missing)}; pass directories under runs/")
    if args.smooth < 1:
        p.error(f"--smooth must be >= 1, got {args.smooth}")
    return args


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``min(window, i + 1)`` values at each index ``i`` (early points average fewer)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(window, i + 1))
    return out


def load_run(run: Path) -> dict[str, Any]:
    """A run's episodes, evaluations and summary (``{}`` if it has none yet, e.g. still running)."""
    summary_file, config_file = run / "summary.json", run / "config.json"
    evaluations_file = run / "evaluations.csv"
    return {
        "episodes": read_csv(run / "episodes.csv"),
        "evaluations": read_csv(evaluations_file) if evaluations_file.is_file() else {},
        "summary": json.loads(summary_file.read_text()) if summary_file.is_file() else {},
        "config": json.loads(config_file.read_text()) if config_file.is_file() else {},
    }


def plot(runs: Sequence[Path], output: Path, smooth: int = 20, title: str | None = None, dpi: int = 120) -> Path:
    """Draw the runs' curves into ``output`` (PNG); returns its path."""
    try:
        import matplotlib  # noqa: PLC0415 - imported only when plotting

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as error:
        raise SystemExit(
            f"plotting needs matplotlib ({error}); install it: pip install matplotlib (or the 'examples' extra)"
        ) from None
    fig, ax = plt.subplots(figsize=(8, 5))
    targets, names = set(), []
    for i, run in enumerate(runs):
        data = load_run(run)
        colour = f"C{i % 10}"
        episodes, evaluations, config = data["episodes"], data["evaluations"], data["config"]
        steps, returns = episodes.get("env_steps", []), episodes.get("return", [])
        if steps:
            ax.plot(steps, returns, color=colour, alpha=0.15, linewidth=0.8)
            ax.plot(steps, moving_average(returns, smooth), color=colour, linewidth=1.8, label=run.name)
        else:
            ax.plot([], [], color=colour, label=f"{run.name} (no episodes)")
        for kind, marker in MARKERS.items():
            rows = [j for j, k in enumerate(evaluations.get("kind", [])) if k == kind]
            if rows:
                ax.scatter(
                    [evaluations["env_steps"][j] for j in rows],
                    [evaluations["return_mean"][j] for j in rows],
                    color=colour,
                    marker=marker,
                    s=90 if kind == "final" else 30,
                    edgecolors="black",
                    linewidths=0.5,
                    zorder=3,
                )
        target = config.get("solved_return")
        if target is not None:
            targets.add(float(target))
        names.append(f"{config.get('algo', '?')} {config.get('env_id', '?')}")
    if len(targets) == 1:
        ax.axhline(targets.pop(), color="grey", linestyle="--", linewidth=1, label="target return")
    for kind, marker in MARKERS.items():  # legend entries for the marker kinds
        ax.scatter([], [], color="white", edgecolors="black", marker=marker, label=f"{kind} evaluation")
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"episode return (moving average of {smooth})")
    ax.set_title(title or ", ".join(sorted(set(names))))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=dpi)
    plt.close(fig)
    return output


def main(argv: Sequence[str] | None = None) -> Path:
    args = parse_args(argv)
    path = plot(args.runs, args.output, args.smooth, args.title, args.dpi)
    print(f"wrote {path} ({len(args.runs)} run{'s' if len(args.runs) != 1 else ''})")
    return path


if __name__ == "__main__":
    main()

"""The notebooks in notebooks/: committed executed and clean, and still running top to bottom.

Two checks per notebook:

* the committed file is what a reader should see: every code cell executed,
  in order, without errors, with at least one plot, and no path of the
  machine it was executed on in any output (``notebooks/execute.py`` runs a
  notebook and scrubs them);
* executed again now, in a fresh kernel that imports this checkout's
  ``ptl_rl``, every cell runs without an error and the scrubber leaves no
  machine path in the fresh outputs.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat
import numpy as np
import pytest
from paths import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# substrings that only a machine-specific path would put in an output
MACHINE_PATHS = ("/work/", "/home/", ".venv", "/tmp/", "/Users/")
NOTEBOOK_TIMEOUT_S = 300  # one notebook, kernel start included; each runs in a few tens of seconds
# Lightning's lines a reader cannot act on (no GPU/TPU here, an advertisement, a warning about Lightning's own code)
LIGHTNING_NOISE = ("GPU available: False", "TPU available: False", "litlogger", "LeafSpec")


def _load_execute_module():
    spec = importlib.util.spec_from_file_location("notebook_execute", REPO / "notebooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _output_texts(notebook: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, text) of every output, images excluded (their base64 could match by chance)."""
    texts = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            shown = {k: v for k, v in output.items() if k != "data"}
            shown["data"] = {k: v for k, v in output.get("data", {}).items() if not k.startswith("image/")}
            texts.append((index, json.dumps(shown)))
    return texts


def _machine_paths(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        f"cell {index}: {needle!r} in {text[max(0, text.find(needle) - 60) : text.find(needle) + 60]!r}"
        for index, text in _output_texts(notebook)
        for needle in MACHINE_PATHS
        if needle in text
    ]


def _noise(notebook: nbformat.NotebookNode) -> list[str]:
    texts = _output_texts(notebook)
    return [f"cell {index}: {needle!r}" for index, text in texts for needle in LIGHTNING_NOISE if needle in text]


def _printed(notebook: nbformat.NotebookNode, label: str) -> tuple[int, float]:
    """(cell index, value) of the output line ``<label>: <number>``."""
    for index, text in _output_texts(notebook):
        found = re.search(re.escape(label) + r": (-?\d+(?:\.\d+)?)", text)
        if found:
            return index, float(found.group(1))
    raise AssertionError(f"no output line {label!r}")


def _claims(markdown: str) -> list[tuple[str, float]]:
    """("above" | "below", number) for every "above ... -1200" / "below -200" the text states."""
    return [
        (word, float(number.replace(",", "")))
        for word, number in re.findall(r"\b(above|below)\b[^\d\n-]{0,30}(-?\d[\d,]*(?:\.\d+)?)", markdown)
    ]


def test_there_are_nine_notebooks() -> None:
    assert [p.name[:3] for p in NOTEBOOKS] == [f"0{i}_" for i in range(1, 10)], NOTEBOOKS


def test_scrub_replaces_machine_paths_and_keeps_the_rest() -> None:
    execute = _load_execute_module()
    text = (
        f"{execute.REPO}/ptl_rl/replay/buffer.py:42: UserWarning: w\n"
        f"{sys.prefix}/lib/python3.11/site-packages/lightning/pytorch/trainer.py:7: PossibleUserWarning\n"
        f"Restored all states from the checkpoint at {tempfile.gettempdir()}/tmpab12cd/last.ckpt\n"
        "Checkpoint directory /home/someone/runs/x exists; see /work/other/file.txt"
    )
    scrubbed = execute.scrub_text(text)
    assert not [needle for needle in MACHINE_PATHS if needle in scrubbed], scrubbed
    for kept in ("ptl_rl/replay/buffer.py:42: UserWarning", "lightning/pytorch/trainer.py:7", "/last.ckpt"):
        assert kept in scrubbed, scrubbed
    # a prefix replaces whole path components only, and mkdtemp's random names become one fixed name
    assert "<tmp>/<tempdir>/last.ckpt" in scrubbed, scrubbed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    counts = [cell.execution_count for cell in _code_cells(notebook)]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts}; run it top to bottom with "
        "`python notebooks/execute.py notebooks/<name>.ipynb` before committing"
    )
    errors = [o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name} was committed with an error output: {errors[0].get('ename')}"
    images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, f"{path.name} has no plot in its committed outputs"
    found = _machine_paths(notebook)
    assert not found, f"{path.name} outputs hold machine paths (scrub with notebooks/execute.py): {found[:3]}"
    noise = _noise(notebook)
    assert not noise, f"{path.name} outputs hold Lightning's noise (hide_lightning_noise() in its imports): {noise}"


def test_sac_notebook_text_states_what_its_run_printed() -> None:
    notebook = nbformat.read(REPO / "notebooks" / "04_continuous_sac.ipynb", as_version=4)
    index, value = _printed(notebook, "greedy mean return over 10 fresh episodes")
    text = "\n".join(cell.source for cell in notebook.cells[index + 1 :] if cell.cell_type == "markdown")
    claims = _claims(text)
    assert claims, "the text after the evaluation says where the short run ends"
    for word, bound in claims:
        assert (value > bound) if word == "above" else (value < bound), f"printed {value}, text says {word} {bound}"


def test_custom_env_notebook_compares_with_the_best_possible_return() -> None:
    notebook = nbformat.read(REPO / "notebooks" / "05_custom_env.ipynb", as_version=4)
    _, greedy = _printed(notebook, "greedy mean return over 20 fresh episodes")
    _, best = _printed(notebook, "shortest path on the same 20 episodes (the best possible)")
    assert greedy <= best, "no policy beats the shortest path on the same episodes"
    # brute force over every start and goal position of the 7 x 7 grid: -0.1 per step, +1 on the goal (one step
    # into a wall when starting on it at the edge, two steps otherwise)
    returns = []
    for px, py, gx, gy in itertools.product(range(7), repeat=4):
        steps = abs(px - gx) + abs(py - gy) or (1 if {px, py} & {0, 6} else 2)
        returns.append(1.0 - 0.1 * (steps - 1))
    text = " ".join(notebook.cells[-1].source.split())
    (stated,) = re.findall(r"best possible mean return is about (\d\.\d+)", text)
    assert float(stated) == round(float(np.mean(returns)), 2), (stated, np.mean(returns))


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernel inherits the environment: make it import this checkout's ptl_rl, whatever is installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    execute = _load_execute_module()
    notebook = execute.execute(path)  # raises CellExecutionError, with the cell and its traceback, on an error
    counts = [cell.execution_count for cell in _code_cells(notebook)]
    assert counts == list(range(1, len(counts) + 1))
    execute.scrub(notebook)
    found = _machine_paths(notebook)
    assert not found, f"notebooks/execute.py leaves machine paths in {path.name}'s outputs: {found[:3]}"
    assert not _noise(notebook), f"{path.name} prints Lightning's noise: {_noise(notebook)}"

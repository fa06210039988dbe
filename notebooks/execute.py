"""Execute notebooks in place and scrub machine paths from their outputs, ready to commit.

    PYTHONPATH=$PWD python notebooks/execute.py notebooks/0*.ipynb

Each notebook runs top to bottom in a fresh ``python3`` kernel started in
``notebooks/`` (so execution counts are in order and the outputs are the ones
a reader gets), then every output is scrubbed: absolute paths of this machine
(the repository, the Python installation, the temporary directory, the home
directory) are replaced by short placeholders, because committed outputs must
not carry one developer's paths. ``tests/integration/test_notebooks.py`` checks both.
"""

from __future__ import annotations

import re
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300  # per cell


def _prefixes() -> list[tuple[str, str]]:
    """(absolute prefix, placeholder), longest first so the most specific one wins."""
    pairs = {
        str(REPO): "<repo>",
        sys.prefix: "<python>",
        sys.base_prefix: "<python>",
        sysconfig.get_paths()["purelib"]: "<site-packages>",
        tempfile.gettempdir(): "<tmp>",
        str(Path.home()): "~",
    }
    pairs.update({p: "<site-packages>" for p in site.getsitepackages()})
    return sorted(((k, v) for k, v in pairs.items() if len(k) > 1), key=lambda kv: -len(kv[0]))


# whatever is left after the known prefixes: any absolute path under these roots
_LEFTOVER = re.compile(r"(/(?:work|home|tmp|root|Users)/|[A-Za-z]:\\Users\\)[^\s'\"]*")


# a directory made by tempfile.mkdtemp: its random name would change the outputs at every run
_MKDTEMP = re.compile(r"<tmp>/tmp[\w-]{6,}")


def scrub_text(text: str) -> str:
    """Replace this machine's absolute paths in ``text`` by placeholders."""
    for prefix, placeholder in _prefixes():
        # whole path components only: the prefix /tmp must not eat the start of /tmpab12cd
        text = re.sub(re.escape(prefix) + r"(?![\w.-])", lambda _match, p=placeholder: p, text)
    return _LEFTOVER.sub("<path>", _MKDTEMP.sub("<tmp>/<tempdir>", text))


def scrub(notebook: nbformat.NotebookNode) -> None:
    """Scrub every text output of ``notebook`` in place (streams, results, errors)."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = scrub_text(output["text"])
            for mime, value in output.get("data", {}).items():
                if mime.startswith("text/") and isinstance(value, str):
                    output["data"][mime] = scrub_text(value)
            if "traceback" in output:
                output["traceback"] = [scrub_text(line) for line in output["traceback"]]


def execute(path: Path) -> nbformat.NotebookNode:
    """Run ``path`` top to bottom in a fresh kernel; return the executed notebook (unsaved)."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        record_timing=False,  # no per-cell timestamps: re-executing an unchanged notebook gives an empty diff
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    return notebook


def main(paths: list[str]) -> None:
    for name in paths:
        path = Path(name).resolve()
        notebook = execute(path)
        scrub(notebook)
        nbformat.write(notebook, path)
        print(f"executed and scrubbed {path.relative_to(REPO)}")


if __name__ == "__main__":
    main(sys.argv[1:])

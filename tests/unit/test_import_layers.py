"""No import cycle inside ``ptl_rl``: its modules form layers, each importing only the ones below it.

The graph is read from the source with ``ast``, not by importing: every ``import`` statement counts, also one
inside a function (a lazy import that papers over a cycle) and one under ``if TYPE_CHECKING:`` (a type-only
import is a dependency of the design too: a module that needs another's types to be read sits above it). The one
exception is the package's face, ``ptl_rl/__init__.py``, whose ``TYPE_CHECKING`` imports are the list of the
public API and never run. Importing ``a.b.c`` from outside the package ``a.b`` also runs ``a/b/__init__.py``, so
that package is an edge too.

On top of no cycle between modules, the subpackages form layers (:data:`LAYERS`): a package imports only from
lower layers, and every module holds one concept in at most ~400 lines (:data:`MAX_LINES`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from paths import REPO


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root`` (the directory of ``package``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, root: Path, package: str) -> set[str]:
    """The modules an import statement loads: the named module (or submodules), then the packages above them."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:  # a relative import, resolved against the importer's package
        here = importer.split(".") if is_package else importer.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join([*here, node.module] if node.module else here)
    if base.split(".")[0] != package:
        return {base}
    directory = root.joinpath(*base.split(".")[1:])
    found = set()
    for alias in node.names:
        # `from p import m` imports the submodule m when there is one (a .py, a compiled module, a package)
        is_module = any(directory.glob(f"{alias.name}.*")) or (directory / alias.name).is_dir()
        found.add(f"{base}.{alias.name}" if is_module else base)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.AST, type_checking: bool = True) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` at any depth; those under ``if TYPE_CHECKING:`` only if ``type_checking``."""
    found = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            pending.extend(node.orelse)  # the body never runs; an else branch does
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its source (functions and type-only included).

    The package's own ``__init__`` counts only its run-time imports: its type-only ones list the public API.
    """
    modules = module_files(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in imports(tree, type_checking=name != package):
            for target in _targets(node, name, is_package, root, package):
                # the packages above a module run first, except those the importer is already inside
                above = [p for p in _ancestors(target) if p != name and p not in _ancestors(name)]
                edges.update(m for m in (*above, target) if m in modules and m != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None`` when the graph is acyclic (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        state[module] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_ptl_rl_has_no_import_cycle():
    graph = import_graph(REPO / "ptl_rl", "ptl_rl")
    assert len(graph) > 50 and "ptl_rl.lightning.adapter" in graph  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_old_lightning_callbacks_cycle_is_gone():
    graph = import_graph(REPO / "ptl_rl", "ptl_rl")
    lightning = {m for m in graph if m.startswith("ptl_rl.lightning")}
    assert "ptl_rl.callbacks" not in set().union(*(graph[m] for m in lightning))


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import helper\n",
            "b.py": "def helper():\n    from pkg import a  # lazy, still a cycle\n    return a\n",
            "c.py": "import pkg.a\n",
        },
    )
    assert find_cycle(import_graph(root, "pkg")) == ["pkg.a", "pkg.b", "pkg.a"]


def test_a_cycle_through_a_package_init_and_a_relative_import_is_found(tmp_path):
    root = _write(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "from pkg.sub.deep import thing\n",  # runs pkg/sub/__init__.py first
            "sub/__init__.py": "from .. import low\n",
            "sub/deep.py": "thing = 1\n",
        },
    )
    assert find_cycle(import_graph(root, "pkg")) == ["pkg.low", "pkg.sub", "pkg.low"]


def test_a_package_importing_its_own_modules_is_no_cycle(tmp_path):
    root = _write(
        tmp_path,
        {
            "__init__.py": "",
            "sub/__init__.py": "from pkg.sub.one import x\nfrom pkg.sub.two import y\n",
            "sub/one.py": "x = 1\n",
            "sub/two.py": "from pkg.sub.one import x\ny = x\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert graph["pkg.sub"] == {"pkg.sub.one", "pkg.sub.two"} and graph["pkg.sub.two"] == {"pkg.sub.one"}
    assert find_cycle(graph) is None


def test_imports_for_annotations_only_are_a_cycle_too_except_in_the_package_face(tmp_path):
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    root = _write(tmp_path, {"__init__.py": "", "a.py": "import pkg.b\nclass A: ...\n", "b.py": typing_only})
    assert find_cycle(import_graph(root, "pkg")) == ["pkg.a", "pkg.b", "pkg.a"]
    (root / "b.py").write_text("x = 1\n")
    (root / "__init__.py").write_text(typing_only)  # the face's list of names: a.py importing pkg.b runs it
    assert find_cycle(import_graph(root, "pkg")) is None


# ---------------------------------------------------------------------------- layers of packages
#: The subpackages (and stand-alone modules) bottom up. A module imports from its own package or from a
#: lower layer only; packages in one layer do not import each other. See docs/design/layering.md.
LAYERS: list[set[str]] = [
    {"ptl_rl.core"},
    {"ptl_rl.agents", "ptl_rl.envs", "ptl_rl.normalization"},
    {"ptl_rl.stages"},
    {"ptl_rl.replay", "ptl_rl.evaluation", "ptl_rl.video"},
    {"ptl_rl.lightning"},
    {"ptl_rl.distributed", "ptl_rl.offline", "ptl_rl.callbacks"},
    {"ptl_rl.examples"},
]


def package_of(module: str) -> str:
    """``ptl_rl.replay.frames.pool`` -> ``ptl_rl.replay``; the face ``ptl_rl`` is its own."""
    return ".".join(module.split(".")[:2])


def test_every_module_belongs_to_a_layer():
    layered = set().union(*LAYERS)
    graph = import_graph(REPO / "ptl_rl", "ptl_rl")
    loose = sorted({package_of(m) for m in graph} - layered - {"ptl_rl"})
    assert not loose, f"place {loose} in LAYERS (and in the module map of docs/design/layering.md)"


def test_imports_run_down_the_layers():
    level = {package: i for i, layer in enumerate(LAYERS) for package in layer}
    graph = import_graph(REPO / "ptl_rl", "ptl_rl")
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module != "ptl_rl"
        for target in targets
        if target != "ptl_rl"
        and package_of(target) != package_of(module)
        and level[package_of(target)] >= level[package_of(module)]
    )
    assert not upward, "imports that do not run down the layers:\n" + "\n".join(upward)


MAX_LINES = 400
#: Modules allowed above MAX_LINES, each with the reason it is one concept.
_ONE_FILE = "an example is one algorithm read top to bottom in one file (CleanRL's form), not split by line count"
LONG_MODULES: dict[str, str] = {
    "ptl_rl/examples/dqn.py": _ONE_FILE,
    "ptl_rl/examples/r2d2.py": _ONE_FILE,
    "ptl_rl/examples/sac.py": _ONE_FILE + "; SAC with HER goals and its noise options",
}


def test_one_concept_per_module_in_at_most_400_lines():
    too_long = {
        str(path.relative_to(REPO)): n
        for path in sorted((REPO / "ptl_rl").rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
        and str(path.relative_to(REPO)) not in LONG_MODULES
    }
    assert not too_long, f"modules over {MAX_LINES} lines (split them by concept): {too_long}"

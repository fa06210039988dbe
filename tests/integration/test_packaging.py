"""The packaging check's own rules (``.ci/package_contents.py``) on hand-made archives, and its pins.

CI's ``.ci/package_check`` builds real packages, which pass; these tests make
sure each rule of the contents check also fails when its problem is there.
"""

from __future__ import annotations

import configparser
import importlib.util
import io
import re
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from paths import REPO


def load_contents_check():
    spec = importlib.util.spec_from_file_location("package_contents", REPO / ".ci" / "package_contents.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


contents = load_contents_check()
MODULES = ("ptl_rl/__init__.py", "ptl_rl/replay/__init__.py", "ptl_rl/replay/frames.py")
SO = "ptl_rl/replay/_frame_insert.cpython-311-x86_64-linux-gnu.so"
SUMTREE_SO = "ptl_rl/replay/_sumtree_kernel.cpython-311-x86_64-linux-gnu.so"


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A checkout in miniature: three modules, a version and setup.cfg's install_requires."""
    root = tmp_path / "src"
    for name in MODULES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text('__version__ = "1.2.3"\n' if name == "ptl_rl/__init__.py" else "")
    (root / "setup.cfg").write_text("[options]\ninstall_requires =\n    torch>=2.2\n    numpy>=1.24\n")
    return root


def sdist(tmp_path: Path, names: set[str]) -> Path:
    path = tmp_path / "ptl_rl-1.2.3.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name in sorted(names):
            info = tarfile.TarInfo(f"ptl_rl-1.2.3/{name}")
            archive.addfile(info, io.BytesIO(b""))
    return path


GOOD_SDIST = set(contents.SDIST_NEEDS) | set(MODULES) | {"CHANGELOG.md", "ptl_rl.egg-info/PKG-INFO"}


def wheel(tmp_path: Path, names: set[str], tag: str = "cp311-cp311-linux_x86_64", requires=("torch>=2.2",)) -> Path:
    path = tmp_path / f"ptl_rl-1.2.3-{tag}.whl"
    meta = "Metadata-Version: 2.4\nName: ptl_rl\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    meta += 'Requires-Dist: ray>=2.9; extra == "ray"\n'
    with zipfile.ZipFile(path, "w") as archive:
        for name in sorted(names):
            archive.writestr(name, b"")
        archive.writestr("ptl_rl-1.2.3.dist-info/METADATA", meta)
        archive.writestr("ptl_rl-1.2.3.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
    return path


GOOD_WHEEL = set(MODULES) | {"ptl_rl/py.typed"}
REQUIRES = ("torch>=2.2", "numpy>=1.24")


def test_a_complete_sdist_passes(tmp_path, src) -> None:
    contents.check_sdist(sdist(tmp_path, GOOD_SDIST), src)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"add": "tests/test_x.py"}, "tests"),
        ({"add": "docs/index.rst"}, "docs"),
        ({"add": SO}, SO),
        ({"add": "ptl_rl/__pycache__/frames.cpython-311.pyc"}, "__pycache__"),
        ({"drop": "ptl_rl/replay/_frame_insert.c"}, "_frame_insert.c"),
        ({"drop": "README.rst"}, "README.rst"),
        ({"drop": "ptl_rl/replay/frames.py"}, "frames.py"),
    ],
)
def test_the_sdist_check_names_what_is_wrong(tmp_path, src, change, named) -> None:
    names = (GOOD_SDIST | {change.get("add")}) - {change.get("drop"), None}
    with pytest.raises(SystemExit, match=re.escape(named)):
        contents.check_sdist(sdist(tmp_path, names), src)


def test_wheels_with_and_without_the_extension_pass_as_what_they_are(tmp_path, src) -> None:
    contents.check_wheel(wheel(tmp_path, GOOD_WHEEL | {SO, SUMTREE_SO}, requires=REQUIRES), src, "compiled")
    contents.check_wheel(wheel(tmp_path, GOOD_WHEEL, requires=REQUIRES), src, "fallback")
    for partial in (set(), {SO}, {SUMTREE_SO}):
        with pytest.raises(SystemExit, match="should hold each compiled module once"):
            contents.check_wheel(wheel(tmp_path, GOOD_WHEEL | partial, requires=REQUIRES), src, "compiled")
    for stray in ({SO}, {SUMTREE_SO}):
        with pytest.raises(SystemExit, match="built without a compiler, holds compiled modules"):
            contents.check_wheel(wheel(tmp_path, GOOD_WHEEL | stray, requires=REQUIRES), src, "fallback")


@pytest.mark.parametrize(
    ("names", "kwargs", "message"),
    [
        (GOOD_WHEEL | {"tests/test_x.py"}, {}, "outside ptl_rl/"),
        (GOOD_WHEEL | {"ptl_rl/replay/_frame_insert.c"}, {}, "C sources"),
        (GOOD_WHEEL - {"ptl_rl/py.typed"}, {}, "py.typed"),
        (GOOD_WHEEL - {"ptl_rl/replay/frames.py"}, {}, "frames.py"),
        (GOOD_WHEEL | {"ptl_rl/stray.py"}, {}, "not in the source tree"),
        (GOOD_WHEEL, {"tag": "py3-none-any"}, "platform-independent"),
        (GOOD_WHEEL, {"requires": ("torch>=2.2",)}, "Requires-Dist"),
    ],
)
def test_the_wheel_check_names_what_is_wrong(tmp_path, src, names, kwargs, message) -> None:
    kwargs.setdefault("requires", REQUIRES)
    with pytest.raises(SystemExit, match=re.escape(message)):
        contents.check_wheel(wheel(tmp_path, names, **kwargs), src, "fallback")


def pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_the_pinned_build_tools_satisfy_pyproject() -> None:
    """The release build pins setuptools through constraints.txt: the pin must meet pyproject's requirement."""
    build_system = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
    requires = [Requirement(requirement) for requirement in build_system["requires"]]
    pinned = pins()
    assert {r.name for r in requires} <= set(pinned), "pin every build requirement in constraints.txt"
    assert all(r.specifier.contains(pinned[r.name]) for r in requires), (requires, pinned)
    assert "build" in pinned


def test_pyproject_leaves_the_metadata_to_setup_cfg() -> None:
    """The project's shape is fixed: metadata in setup.cfg; a [project] table would take it over."""
    assert set(tomllib.loads((REPO / "pyproject.toml").read_text())) == {"build-system"}
    declared = configparser.ConfigParser()
    declared.read(REPO / "setup.cfg")
    assert declared["metadata"]["name"] == "ptl_rl"


def test_ci_runs_the_packaging_check_after_the_tests_and_linters() -> None:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert lines[-1] == "bash .ci/package_check"
    assert any("pytest" in line for line in lines[:-1]) and any("ruff" in line for line in lines[:-1])

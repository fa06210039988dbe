"""What the sdist and the wheels of ptl_rl must and must not contain; run by ``.ci/package_check``.

Usage::

    python package_contents.py sdist SDIST SRC
    python package_contents.py wheel WHEEL SRC compiled|fallback

SRC is the copy of the checkout the packages were built from (the files git
knows). The package's modules are compared with SRC's ``ptl_rl/**/*.py`` and ``*.pyi``, so a
subpackage that packaging drops (no ``__init__.py``, a wrong ``find:``) fails
here rather than at a user's import. Only the standard library is used.
"""

from __future__ import annotations

import configparser
import fnmatch
import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

#: top-level entries of the sdist: what building needs, the metadata setuptools writes, and the changelog
SDIST_TOP = {
    "ptl_rl",
    "ptl_rl.egg-info",
    "setup.py",
    "setup.cfg",
    "pyproject.toml",
    "MANIFEST.in",
    "README.rst",
    "LICENSE",
    "CHANGELOG.md",
    "PKG-INFO",
}
#: files a build from the sdist reads: setup.cfg's long_description and license_files, the C source, PEP 561
SDIST_NEEDS = {
    "setup.py",
    "setup.cfg",
    "pyproject.toml",
    "README.rst",
    "LICENSE",
    "PKG-INFO",
    "ptl_rl/py.typed",
    "ptl_rl/replay/_frame_insert.c",
    "ptl_rl/replay/_sumtree_kernel.c",
}
#: build outputs and caches that must be in no package
JUNK = ("*.so", "*.pyc", "*.pyo", "*.o", "__pycache__", ".*")
#: the optional compiled modules (setup.py): each once in a compiled wheel, none in a fallback one
EXTENSIONS = ("ptl_rl/replay/_frame_insert.*.so", "ptl_rl/replay/_sumtree_kernel.*.so")


def fail(problems: list[str], what: str) -> None:
    if problems:
        raise SystemExit(f"package contents: {what}:\n  " + "\n  ".join(problems))


def version(src: Path) -> str:
    return re.search(r'^__version__ = "([^"]+)"', (src / "ptl_rl" / "__init__.py").read_text(), re.M).group(1)


def modules(src: Path) -> set[str]:
    """The package's modules and their type stubs (``*.pyi``, PEP 561: they ship beside the compiled modules)."""
    files = [*(src / "ptl_rl").rglob("*.py"), *(src / "ptl_rl").rglob("*.pyi")]
    return {path.relative_to(src).as_posix() for path in files}


def junk(names: set[str]) -> list[str]:
    return sorted(
        name
        for name in names
        if any(fnmatch.fnmatch(part, pattern) for part in PurePosixPath(name).parts for pattern in JUNK)
    )


def check_sdist(sdist: Path, src: Path) -> None:
    top = f"ptl_rl-{version(src)}"
    with tarfile.open(sdist) as archive:
        members = [member for member in archive.getmembers() if member.isfile()]
    outside = sorted(member.name for member in members if not member.name.startswith(top + "/"))
    fail(outside, f"{sdist.name} has files outside {top}/")
    names = {member.name[len(top) + 1 :] for member in members}
    unexpected = sorted({name.split("/")[0] for name in names} - SDIST_TOP)
    fail(unexpected, f"{sdist.name} has top-level entries that are not needed to build (see MANIFEST.in)")
    fail(junk(names), f"{sdist.name} carries build outputs or hidden files")
    missing = sorted(SDIST_NEEDS - names) + sorted(modules(src) - names)
    fail(missing, f"{sdist.name} lacks files that a build from it needs")
    print(f"{sdist.name}: {len(names)} files, {', '.join(sorted(SDIST_TOP & {n.split('/')[0] for n in names}))}")


def required(src: Path) -> set[str]:
    """setup.cfg's install_requires, as written there (one requirement per line)."""
    cfg = configparser.ConfigParser()
    cfg.read(src / "setup.cfg")
    return {line.strip() for line in cfg["options"]["install_requires"].splitlines() if line.strip()}


def check_wheel(wheel: Path, src: Path, kind: str) -> None:
    dist_info = f"ptl_rl-{version(src)}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
        tags = Parser().parsestr(archive.read(f"{dist_info}/WHEEL").decode()).get_all("Tag")
    outside = sorted(name for name in names if name.split("/")[0] not in ("ptl_rl", dist_info))
    fail(outside, f"{wheel.name} installs files outside ptl_rl/ (docs, tests, build outputs?)")
    extension = sorted(name for name in names if any(fnmatch.fnmatch(name, pattern) for pattern in EXTENSIONS))
    for pattern in EXTENSIONS:
        found = [name for name in extension if fnmatch.fnmatch(name, pattern)]
        if kind == "compiled" and len(found) != 1:
            fail([f"{pattern}: {found}"], f"{wheel.name} should hold each compiled module once")
    if kind == "fallback" and extension:
        fail(extension, f"{wheel.name}, built without a compiler, holds compiled modules")
    fail(junk(names - set(extension)), f"{wheel.name} carries build outputs or hidden files")
    stray = sorted(name for name in names if name.endswith((".c", ".h")))
    fail(stray, f"{wheel.name} ships C sources (they belong to the sdist)")
    package = {name for name in names if name.startswith("ptl_rl/")}
    missing = sorted((modules(src) | {"ptl_rl/py.typed"}) - package)
    fail(missing, f"{wheel.name} lacks files of the package")
    extra = sorted(package - modules(src) - {"ptl_rl/py.typed", *extension})
    fail(extra, f"{wheel.name} has package files that are not in the source tree")
    requires = {requirement for requirement in metadata.get_all("Requires-Dist") if "extra ==" not in requirement}
    if requires != required(src):
        fail([f"wheel: {sorted(requires)}", f"setup.cfg: {sorted(required(src))}"], "Requires-Dist != setup.cfg")
    if tags != [tag for tag in tags if not tag.endswith("-any")]:
        fail(tags, f"{wheel.name} claims to be platform-independent, but setup.py declares a C extension")
    print(f"{wheel.name} ({kind}): {len(package)} package files, tags {tags}, extension {extension or 'none'}")


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "sdist":
        check_sdist(Path(argv[1]), Path(argv[2]))
    elif len(argv) == 4 and argv[0] == "wheel" and argv[3] in ("compiled", "fallback"):
        check_wheel(Path(argv[1]), Path(argv[2]), argv[3])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

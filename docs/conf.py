"""Sphinx configuration of the ptl_rl documentation site.

Build it with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``
(``tests/integration/test_docs.py`` runs the same build, warnings as errors).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parent.parent
# Document the checkout the docs live in, not whatever copy of ptl_rl the environment has installed.
sys.path.insert(0, str(ROOT))

import ptl_rl  # noqa: E402

project = "ptl_rl"
author = "the ptl_rl developers"
copyright = "the ptl_rl developers, Apache-2.0"
release = ptl_rl.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
templates_path: list[str] = []

# Docstrings are Google style ("Args:", "Returns:", "Examples:").
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
autoclass_content = "both"

# The design record's headings are linked between pages as "file.md#heading".
myst_heading_anchors = 3

html_theme = "alabaster"
html_theme_options = {"description": "RL experience pipelines for PyTorch Lightning", "fixed_sidebar": True}
html_static_path: list[str] = []

# Every reference to a ptl_rl object must resolve; references to other libraries (numpy, torch, gymnasium, ...) have
# no inventory to resolve against offline, so they stay plain text.
nitpicky = True
# Modules have no pages of their own (objects are documented under the names users import), so a :mod: reference
# stays plain text.
nitpick_ignore_regex = [
    (r"py:.*", r"(?!ptl_rl\b).*"),
    (r"py:mod", r".*"),
    # type variables: a signature's placeholder (a stage's output type, a callable's result), no object to link
    (r"py:(class|obj)", r"ptl_rl\.core\.(stage|guard|protocols(\.\w+)?)\.(T|T_co|R|SnapshotT)"),
    (r"py:(class|obj)", r"ptl_rl\.offline\.source\.FillableT"),
]
# Internal helpers that docstrings name for the curious reader but that are not part of the API.
nitpick_ignore = [
    ("py:class", "ptl_rl.distributed.intake.StalenessTracker"),
    ("py:func", "ptl_rl.replay.persist.save_directory"),
    # a FrameStorage's snapshot holds its per-env state (a part of the storage, not of the API)
    ("py:class", "ptl_rl.replay.frames.env_state.EnvState"),
    # type variables: a signature's placeholder (find_stage returns an instance of the class it is given), no object
    ("py:class", "ptl_rl.core.chain.StageT"),
]


# -- README sections -------------------------------------------------------------------------------------------------
# Pages reuse the README's prose by section title, so the two never drift apart: when a README section is renamed,
# the build fails (warnings are errors) and names the title it could not find.

_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+])\1+\s*$")


def readme_section(title: str, readme: Path = ROOT / "README.rst", intro: bool = False) -> list[str]:
    """The body lines of the README section called ``title``, up to the next heading of the same or a higher level.

    With ``intro`` only the text before its first subsection.
    """
    lines = readme.read_text(encoding="utf-8").splitlines()
    levels: list[str] = []  # adornment characters in the order they first appear = heading levels
    headings: list[tuple[int, int]] = []  # (line index of the title, level)
    for i in range(len(lines) - 1):
        underline = lines[i + 1]
        if lines[i].strip() and _ADORNMENT.match(underline) and len(underline.rstrip()) >= len(lines[i].rstrip()):
            if underline[0] not in levels:
                levels.append(underline[0])
            headings.append((i, levels.index(underline[0])))
    for k, (i, level) in enumerate(headings):
        if lines[i].strip() == title:
            end = next((j for j, lv in headings[k + 1 :] if intro or lv <= level), len(lines))
            return lines[i + 2 : end]
    found = ", ".join(repr(lines[i].strip()) for i, _ in headings)
    raise ValueError(f"README.rst has no section {title!r} (its sections: {found}); update the docs page that asks")


class ReadmeSection(SphinxDirective):
    """``.. readme-section:: Title`` inserts the body of the README section ``Title`` here."""

    required_arguments = 1
    final_argument_whitespace = True
    option_spec = {"intro": directives.flag}

    def run(self) -> list[nodes.Node]:
        readme = ROOT / "README.rst"
        self.env.note_dependency(str(readme))
        try:
            body = readme_section(self.arguments[0], readme, intro="intro" in self.options)
        except ValueError as error:
            raise self.error(str(error)) from None
        self.state_machine.insert_input(StringList(body, str(readme)), str(readme))
        return []


# -- Docstrings inherited from Lightning ----------------------------------------------------------------------------
# A ptl_rl class that overrides a Lightning hook without a docstring would show Lightning's docstring, written for
# Lightning's own docs (roles and labels that do not exist here). Such members are left out: they are standard hooks.


def _docstring_from_outside(obj: object, name: str) -> bool:
    """Whether autodoc would show ``obj`` (member ``name``) with a docstring inherited from a class outside ptl_rl."""
    if getattr(obj, "__doc__", None) is not None or "." not in getattr(obj, "__qualname__", ""):
        return False
    owner: object = sys.modules.get(getattr(obj, "__module__", ""), None)
    for part in obj.__qualname__.split(".")[:-1]:
        owner = getattr(owner, part, None)
    for base in getattr(owner, "__mro__", ())[1:]:
        if getattr(vars(base).get(name), "__doc__", None):
            return not base.__module__.startswith("ptl_rl")
    return False


def _skip_foreign_docstrings(app, what, name, obj, skip, options):  # noqa: ANN001, ANN201 - Sphinx event signature
    return True if _docstring_from_outside(obj, name) else None


# -- Cross-references by the name a module uses --------------------------------------------------------------------
# Docstrings refer to objects by their defining module (``ptl_rl.replay.buffer.ReplayBuffer``, ``~ptl_rl.core.batch.
# TransitionBatch``), but the site documents each once, under the name users import (``ptl_rl.ReplayBuffer``). A
# reference that finds nothing is resolved to the documented object whose name ends the same way.


_SUFFIX_PREFIXES = ("ptl_rl.", "ptl_rl.replay.", "ptl_rl.distributed.", "ptl_rl.core.protocols.", "ptl_rl.lightning.")


def _resolve_by_suffix(app, env, node, contnode):  # noqa: ANN001, ANN201 - Sphinx event signature
    if node.get("refdomain") != "py":
        return None
    from sphinx.util.nodes import make_refnode

    objects = env.get_domain("py").objects
    parts = node["reftarget"].lstrip("~.").split(".")
    if parts[0] != "ptl_rl":
        return None
    for start in range(1, len(parts)):
        if not parts[start - 1].islower():
            break  # drop module names only: "ptl_rl.x.Unknown.state_dict" must not become "state_dict"
        for prefix in _SUFFIX_PREFIXES:
            entry = objects.get(prefix + ".".join(parts[start:]))
            if entry is not None:
                return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode)
    return None


# -- Base classes ---------------------------------------------------------------------------------------------------
# "Bases:" names only what a reader can look up: a private or internal base (a mixin, the Lightning-package shim of
# ptl_rl.lightning._compat) is replaced by its own bases.


def _public_names() -> set[int]:
    import ptl_rl.distributed
    import ptl_rl.replay

    return {id(getattr(m, n)) for m in (ptl_rl, ptl_rl.replay, ptl_rl.distributed) for n in m.__all__}


def _public_bases(app, name, obj, options, bases):  # noqa: ANN001, ANN201 - Sphinx event signature
    public = _public_names()

    def expand(base: type) -> list[type]:
        origin = getattr(base, "__origin__", base)  # a generic base, Stage[TransitionBatch], shows as written
        if origin is object or (origin.__module__.startswith("ptl_rl") and id(origin) not in public):
            return [b for parent in getattr(origin, "__bases__", ()) for b in expand(parent)]
        return [base]

    expanded = [b for base in bases for b in expand(base)]
    bases[:] = list(dict.fromkeys(expanded))


def setup(app):  # noqa: ANN001, ANN201 - Sphinx's extension hook
    app.add_directive("readme-section", ReadmeSection)
    app.connect("autodoc-skip-member", _skip_foreign_docstrings)
    app.connect("missing-reference", _resolve_by_suffix)
    app.connect("autodoc-process-bases", _public_bases)
    return {"parallel_read_safe": True}

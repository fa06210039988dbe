"""Builds the documentation site as CI does: Sphinx, every warning an error.

A broken cross-reference, a docstring whose markup does not parse, a README section a docs page includes by title
that was renamed, a design page missing from the site: each fails here with Sphinx's own messages.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from paths import REPO

ROOT = REPO

pytest.importorskip("sphinx", reason="the docs need the docs extra: pip install -e '.[docs]'")
pytest.importorskip("myst_parser", reason="the docs need the docs extra: pip install -e '.[docs]'")


# Sphinx 9's own extensions (napoleon) and myst-parser use APIs Sphinx 11 removes; not ours to fix, and not what
# this test is about: the build's warnings go to the warnings file below.
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning", "ignore::DeprecationWarning")
def test_docs_build_without_warnings(tmp_path: Path) -> None:
    from sphinx.cmd.build import build_main

    # In this process, which has imported torch and Lightning already (a subprocess would spend seconds on that).
    # -E: read every page afresh (a cached environment would hide the warnings of unchanged pages).
    warnings = tmp_path / "warnings.txt"
    args = ["-W", "--keep-going", "-E", "-q", "-b", "html", "-w", str(warnings), "-d", str(tmp_path / "doctrees")]
    status = build_main([*args, str(ROOT / "docs"), str(tmp_path / "html")])
    problems = warnings.read_text(encoding="utf-8") if warnings.exists() else ""
    assert status == 0 and not problems, f"the docs build failed (exit {status}), warnings are errors:\n{problems}"
    html = tmp_path / "html"
    for page in ["index", "contract", "pipeline", "api/buffers", "design/core", "changelog"]:
        assert (html / f"{page}.html").is_file(), f"the site has no {page}.html"
    # the autodoc pages really hold the docstrings, examples included
    buffers = (html / "api" / "buffers.html").read_text(encoding="utf-8")
    assert "Proportional prioritized replay" in buffers and "update_priorities" in buffers
    assert "Examples" in buffers


def _conf():
    spec = importlib.util.spec_from_file_location("ptl_rl_docs_conf", ROOT / "docs" / "conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


README = """Title
=====

Intro text.

First
-----

first body

Sub
~~~

sub body

Second
------

second body
"""


def test_readme_section_takes_a_section_with_its_subsections(tmp_path: Path) -> None:
    readme = tmp_path / "README.rst"
    readme.write_text(README)
    section = _conf().readme_section
    assert section("First", readme) == ["", "first body", "", "Sub", "~~~", "", "sub body", ""]
    assert section("Sub", readme) == ["", "sub body", ""]
    assert section("Second", readme) == ["", "second body"]
    assert section("Title", readme, intro=True) == ["", "Intro text.", ""]


def test_readme_section_names_the_sections_it_has_when_a_title_is_missing(tmp_path: Path) -> None:
    readme = tmp_path / "README.rst"
    readme.write_text(README)
    with pytest.raises(ValueError, match=r"no section 'Third' \(its sections: 'Title', 'First', 'Sub', 'Second'\)"):
        _conf().readme_section("Third", readme)

"""The package's front door: lazy public names, no heavy imports until one is used."""

from __future__ import annotations

import subprocess
import sys

import ptl_rl


def test_every_public_name_resolves_from_the_module_that_defines_it():
    assert sorted(ptl_rl.__all__) == sorted(ptl_rl._PUBLIC_API)
    for name in ptl_rl.__all__:
        value = getattr(ptl_rl, name)
        assert value is getattr(sys.modules[ptl_rl._PUBLIC_API[name]], name), name


def test_subpackages_resolve_as_attributes_after_a_plain_import():
    assert ptl_rl.replay.FrameStorage is ptl_rl.FrameStorage
    assert ptl_rl.distributed.__name__ == "ptl_rl.distributed"


def test_unknown_names_raise_attribute_error():
    try:
        ptl_rl.NoSuchStage  # noqa: B018
    except AttributeError as error:
        assert "NoSuchStage" in str(error)
    else:
        raise AssertionError("an unknown name resolved")


def test_importing_the_package_loads_neither_torch_nor_lightning():
    heavy = "('torch', 'pytorch_lightning', 'lightning')"
    code = f"import sys, ptl_rl; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

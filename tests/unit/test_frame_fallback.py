"""FrameStorage without its compiled insert: a build with no C compiler has no ``_frame_insert`` module.

Each case runs in a fresh interpreter, so that the import of ``ptl_rl.replay.frames`` sees the module
missing (or ``PTL_RL_PURE_PYTHON=1``) as an installed package without the extension would. The storage must
then take the Python path for every add and store exactly what the compiled insert stores here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import REPO, SUPPORT

from ptl_rl.replay import frames

FILL = """
import hashlib, json, sys
sys.path.insert(0, {support!r})
from frame_checkpoint import stream
from ptl_rl import FrameStorage, NStepTransform, ReplayBuffer
from ptl_rl.replay import frames
import functools, numpy as np
buffer = ReplayBuffer(None, 24, seed=0, storage=functools.partial(FrameStorage, stack_axis=0, extra_frames=16))
nstep = NStepTransform(iter(stream(40, False)), n=2, gamma=0.9)
buffer.storage.bind_upstream(nstep)
for _ in range(36):
    buffer.add(next(nstep))
storage = buffer.storage
every = np.arange(len(storage))
ok = storage.sampleable(every)
batch = storage.gather(every[ok])
kernel = "off" if storage._kernel is None else storage._kernel.state
digest = hashlib.sha256()
for key in sorted(batch.keys()):
    digest.update(np.ascontiguousarray(batch[key]).tobytes())
try:
    storage.compiled = True
    refused = None
except ValueError as error:
    refused = str(error)
print(json.dumps({{
    "module": frames._frame_insert is not None, "compiled_insert": frames.COMPILED_INSERT,
    "kernel": kernel, "sampleable": int(ok.sum()), "digest": digest.hexdigest(), "refused": refused,
}}))
"""


def run(prelude: str, env: dict[str, str] | None = None) -> dict:
    code = prelude + FILL.format(support=str(SUPPORT))
    environ = {k: v for k, v in os.environ.items() if k != "PTL_RL_PURE_PYTHON"}  # (the parent's setting: not ours)
    environ.update(PYTHONPATH=str(REPO), **(env or {}))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, cwd=REPO)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["warned"] = out.stderr.count("compiled kernels are not built")
    return result


@pytest.mark.skipif(frames._frame_insert is None, reason="the compiled insert is not built: nothing to compare")
def test_without_the_extension_every_add_takes_the_python_path_and_stores_the_same():
    compiled = run("")
    # (None in sys.modules makes `from ptl_rl.replay import _frame_insert` raise ImportError, as a missing .so)
    missing = run("import sys; sys.modules['ptl_rl.replay._frame_insert'] = None\n")
    pure = run("", {"PTL_RL_PURE_PYTHON": "1"})
    assert compiled["module"] and compiled["compiled_insert"] and compiled["kernel"] == "bound"
    assert not missing["module"] and not missing["compiled_insert"] and missing["kernel"] == "off"
    assert "not built" in missing["refused"]  # (asking for the compiled insert says why it cannot be had)
    assert pure["module"] and not pure["compiled_insert"] and pure["kernel"] == "off"
    assert compiled["sampleable"] > 10
    assert missing["digest"] == compiled["digest"] == pure["digest"]
    assert missing["sampleable"] == compiled["sampleable"] == pure["sampleable"]
    # one warning says what is missing and what it costs; none when the kernels are there or not wanted
    assert missing["warned"] == 1 and compiled["warned"] == 0 and pure["warned"] == 0

"""Metadata lives in setup.cfg; this file only declares the optional compiled parts (frame insert, sum-tree loops)."""

from setuptools import Extension, setup

# optional=True: a failed compile (no C compiler, no Python headers) warns and installs the pure-Python path;
# the module needs only the CPython C API (no numpy headers), so nothing but setuptools and a compiler.
setup(
    ext_modules=[
        Extension("ptl_rl.replay._frame_insert", ["ptl_rl/replay/_frame_insert.c"], optional=True),
        Extension("ptl_rl.replay._sumtree_kernel", ["ptl_rl/replay/_sumtree_kernel.c"], optional=True),
    ]
)

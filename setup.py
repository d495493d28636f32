"""Build the CPU version of vmem's encoding kernels (vmem/csrc/) with cffi, if a C compiler is there.

The extension is optional: without a compiler the install still succeeds and the codecs use their NumPy
reference implementations (vmem warns once). Metadata lives in pyproject.toml.
"""

import sys
from pathlib import Path

from setuptools import setup

ext_modules = []
try:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "vmem" / "csrc"))
    from build_cpu import ffibuilder

    ext = ffibuilder.distutils_extension(tmpdir="build/native")
    ext.optional = True  # a failed compile is a warning, not a failed install
    ext_modules.append(ext)
except Exception as exc:  # cffi missing or the C source cannot be generated: pure Python install
    print(f"vmem: native kernels are not built ({exc}); codecs will use NumPy", file=sys.stderr)

setup(ext_modules=ext_modules)

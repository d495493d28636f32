"""The types vmem's signatures share, for annotations only.

``Array`` is an array on a device: a NumPy array on the CPU and simulated devices, a CuPy array on CUDA
(CuPy mirrors NumPy's interface; where CuPy is not installed, or ships no types, mypy reads its half of the
union as unknown and checks the array code against NumPy's API). ``Xp`` is the array namespace that made
it: the ``numpy`` or ``cupy`` module.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Sequence, Union

import numpy as np

__all__ = ["Array", "CData", "GpuArray", "ShapeLike", "Xp"]

if TYPE_CHECKING:
    import cupy

    Array = Union[np.ndarray, cupy.ndarray]
else:  # at run time annotations are strings (``from __future__ import annotations``); this is for introspection
    Array = np.ndarray

Xp = ModuleType

if TYPE_CHECKING:
    #: an array on a CUDA device (where CuPy is not installed, or ships no types, mypy reads it as unknown)
    GpuArray = cupy.ndarray
else:
    GpuArray = np.ndarray

#: a shape as NumPy takes one: a length, or lengths
ShapeLike = Union[int, Sequence[int]]

#: a C value made or returned through cffi (a cuDNN handle, a pointer, an array of records): cffi ships no
#: types, so this names what mypy cannot check
CData = Any

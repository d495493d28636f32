"""``cupyx.scipy.special`` on the stand-in."""

from __future__ import annotations

import math
from typing import Any

import numpy as _np

_erf = _np.vectorize(math.erf, otypes=[_np.float64])


def erf(x: Any, out: Any = None) -> Any:
    from cupy import _arg, _device, _unsupported, ndarray

    if not isinstance(x, ndarray):
        raise _unsupported(x)
    values = _erf(_arg(x, True)).astype(x.dtype)
    if out is None:
        return _device(values)
    if not isinstance(out, ndarray):
        raise _unsupported(out)
    out._a[...] = values
    return out

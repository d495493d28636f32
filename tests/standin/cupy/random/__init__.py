"""``cupy.random`` on the stand-in: draws in float32 or float64 only, as CuPy's generator
(``cupy/random/_generator_api.pyx``: "Unsupported dtype ... for standard_normal")."""

from __future__ import annotations

from typing import Any

import numpy as _np

_FLOATS = (_np.dtype(_np.float32), _np.dtype(_np.float64))


def _check(dtype: Any, what: str) -> _np.dtype:
    dt = _np.dtype(dtype)
    if dt not in _FLOATS:
        raise TypeError(f"Unsupported dtype {dt.name} for {what}")
    return dt


class Generator:
    def __init__(self, seed: Any = None):
        self._rng = _np.random.default_rng(seed)

    def _out(self, values: _np.ndarray, out: Any) -> Any:
        from .. import _device, _state, _unsupported, ndarray

        # a graph would draw the numbers of its capture again at every launch (the generator's state is the
        # host's): vmem's rule, which CuPy does not check
        _state.refuse_in_capture("a random draw (a graph repeats the numbers drawn at capture)")

        if out is None:
            return _device(values)
        if not isinstance(out, ndarray):
            raise _unsupported(out)
        if out.dtype != values.dtype or out.shape != values.shape:
            raise ValueError("out: its dtype and shape must be the draw's")
        out._a[...] = values
        return out

    def standard_normal(self, size: Any = None, dtype: Any = _np.float64, out: Any = None) -> Any:
        dt = _check(dtype, "standard_normal")
        shape = out.shape if out is not None else size
        return self._out(self._rng.standard_normal(shape, dtype=dt), out)

    def random(self, size: Any = None, dtype: Any = _np.float64, out: Any = None) -> Any:
        dt = _check(dtype, "random")
        shape = out.shape if out is not None else size
        return self._out(self._rng.random(shape, dtype=dt), out)

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = None, dtype: Any = _np.float64) -> Any:
        dt = _check(dtype, "uniform")
        return self._out(self._rng.uniform(low, high, size).astype(dt), None)

    def integers(
        self, low: int, high: Any = None, size: Any = None, dtype: Any = _np.int64, endpoint: bool = False
    ) -> Any:
        return self._out(self._rng.integers(low, high, size, dtype=dtype, endpoint=endpoint), None)


def default_rng(seed: Any = None) -> Generator:
    return Generator(seed)

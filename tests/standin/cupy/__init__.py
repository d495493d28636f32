"""A stand-in for CuPy 14 on the CPU, for tests only: ``CudaDevice`` runs on it unchanged.

Arrays are NumPy arrays over host memory standing for device memory (one region per ``cuda.Memory``, at
real addresses, so that raw pointers, copies and the kernels' CPU build all work), wrapped so that they are
*not* NumPy arrays. What CuPy refuses, the stand-in refuses:

- a NumPy array where a CuPy array is expected (operands of element-wise functions and operators,
  ``out=``, kernel arguments): ``TypeError: Unsupported type <class 'numpy.ndarray'>``;
- implicit conversion to NumPy (``numpy.asarray(x)``, ``__array__``): ``TypeError``, as CuPy's "Implicit
  conversion to a NumPy array is not allowed";
- random draws in a type other than float32 and float64 (``standard_normal(dtype=float16)``);
- kernel arguments the driver would read wrongly (see :mod:`cupy.cuda.function`).

What CuPy allows but costs a synchronization on a GPU is counted (:data:`cupy._state.COUNTERS`): ``bool``,
``int``, ``float`` of a device value (implicit reads), ``get``/``asnumpy``/``item`` (explicit reads), and
host arrays made device arrays (uploads). Reductions return 0-d device arrays, as CuPy's do.

Streams run their work as it is enqueued (so order is kept trivially); cuDNN's library is the stand-in's
(``tests/standin/cudnn.py``), computing with the CPU device's convolutions.

Under stream capture (``Stream.begin_capture``; see :mod:`cupy.cuda.stream`) every kernel of the array
module, as every raw kernel, copy, fill and cuDNN call, is recorded, not run: its result arrays are made
(from the current allocator) and filled when the graph is launched. What cannot be captured is refused as
CUDA refuses it: reads to the host (``get``, ``item``, ``bool``...) and uploads from host memory
(synchronizations), and random draws (a graph would repeat the numbers drawn at capture at every launch:
vmem's rule, not CUDA's). Allocations from CuPy's default pool during a capture are counted
(``capture_pool_allocations``): the pool hands such memory to other work once it is freed, while the graph
still writes it at every launch.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as _np

from . import _state, cuda, random  # noqa: F401
from .cuda.memory import get_default_memory_pool  # noqa: F401

__version__ = "14.2.0-standin"

# the types, as CuPy re-exports NumPy's
float16, float32, float64 = _np.float16, _np.float32, _np.float64
int8, int16, int32, int64 = _np.int8, _np.int16, _np.int32, _np.int64
uint8, uint16, uint32, uint64 = _np.uint8, _np.uint16, _np.uint32, _np.uint64
bool_ = _np.bool_
dtype = _np.dtype
finfo, iinfo = _np.finfo, _np.iinfo
newaxis = None
inf, nan, pi, e = _np.inf, _np.nan, _np.pi, _np.e


def _unsupported(x: Any) -> TypeError:
    return TypeError(f"Unsupported type {type(x)}")


class ndarray:
    """A device array: ``ndarray(shape, dtype, memptr=...)`` views device memory at a pointer."""

    __slots__ = ("_a", "_mem", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape: Any, dtype: Any = float, memptr: Any = None, strides: Any = None, order: str = "C"):
        dt = _np.dtype(dtype)
        shape = (int(shape),) if isinstance(shape, (int, _np.integer)) else tuple(int(s) for s in shape)
        nbytes = int(_np.prod(shape, dtype=_np.int64)) * dt.itemsize
        if memptr is None:
            memptr = cuda.memory.alloc(nbytes)
        buf, offset = memptr.buffer()
        self._a = _np.ndarray(shape, dt, buffer=buf, offset=offset, strides=strides, order=order)
        self._mem = memptr.mem

    # -- what it is ----------------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _view(self._a.T, self))
    device = property(lambda self: cuda.Device(0))

    @property
    def data(self) -> cuda.MemoryPointer:
        return cuda.MemoryPointer(self._mem, self._a.__array_interface__["data"][0] - self._mem.ptr)

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self._a
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (a.__array_interface__["data"][0], False),
            "strides": None if a.flags.c_contiguous else a.strides,
            "version": 3,
        }

    # -- to the host -------------------------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: Any = None) -> _np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
            "array explicitly."
        )

    def get(self, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> _np.ndarray:
        _state.refuse_in_capture("a read of a device array to the host")
        _state.COUNTERS.explicit_reads += 1
        if out is not None:
            if not isinstance(out, _np.ndarray):
                raise TypeError("out must be a numpy.ndarray")
            out[...] = self._a
            return out
        return _np.array(self._a, order=order)

    def set(self, arr: _np.ndarray, stream: Any = None) -> None:
        if not isinstance(arr, _np.ndarray):
            raise TypeError("set takes a numpy.ndarray")
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError("set: the shape and dtype must match")
        _state.refuse_in_capture("a copy from pageable host memory (set)")
        _state.COUNTERS.upload()
        self._a[...] = arr

    def item(self) -> Any:
        _state.refuse_in_capture("a read of a device value to the host (item)")
        _state.COUNTERS.explicit_reads += 1
        return self._a.item()

    def tolist(self) -> Any:
        _state.refuse_in_capture("a read of a device array to the host (tolist)")
        _state.COUNTERS.explicit_reads += 1
        return self._a.tolist()

    def _implicit(self, kind: str) -> _np.ndarray:
        _state.refuse_in_capture(f"a read of a device value to the host ({kind})")
        _state.COUNTERS.implicit(kind)
        return self._a

    def __bool__(self) -> bool:
        return bool(self._implicit("bool"))

    def __int__(self) -> int:
        return int(self._implicit("int"))

    def __float__(self) -> float:
        return float(self._implicit("float"))

    def __index__(self) -> int:
        return self._implicit("index").__index__()

    def __complex__(self) -> complex:
        return complex(self._implicit("complex"))

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Any:
        for i in range(len(self._a)):
            yield self[i]

    def __repr__(self) -> str:
        return f"standin.{self._a!r}"

    __str__ = __repr__

    # -- indexing ----------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> "ndarray":
        a, k = self._a, _key(key)
        return _compute(lambda: a[k], (self,), lambda: a[_zeroed(k)])

    def __setitem__(self, key: Any, value: Any) -> None:
        _state.COUNTERS.call("setitem")
        if isinstance(value, _np.ndarray):
            _state.refuse_in_capture("a copy from pageable host memory (assignment of a NumPy array)")
            _state.COUNTERS.upload()
        elif isinstance(value, (list, tuple)):
            raise _unsupported(value)
        a, k, v = self._a, _key(key), value._a if isinstance(value, ndarray) else value

        def work() -> None:
            a[k] = v

        _state.submit_current(work)

    # -- methods -----------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("ctypes", "tofile", "tobytes", "dump", "dumps", "byteswap", "setflags"):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._a, name)
        if not callable(attr):
            return _result(attr, (self,))

        def method(*args: Any, **kwargs: Any) -> Any:
            if name not in _VIEWS:
                _state.COUNTERS.call(name)
            out = kwargs.get("out")
            if out is not None and not isinstance(out, ndarray):
                raise _unsupported(out)
            a = [_arg(x, False) for x in args]
            kw = {k: _arg(v, False) for k, v in kwargs.items()}
            if out is not None:
                _state.submit_current(lambda: attr(*a, **kw))
                return out
            return _compute(lambda: attr(*a, **kw), (self,))

        return method

    def astype(
        self, dtype: Any, order: str = "K", casting: Any = None, subok: Any = None, copy: bool = True
    ) -> "ndarray":
        dt = _np.dtype(dtype)
        if not copy and dt == self.dtype:
            return self
        _state.COUNTERS.call("astype")
        out = ndarray(self.shape, dt)
        kw = {"casting": "unsafe" if casting is None else casting}  # astype's default, in CuPy as in NumPy
        src, dst = self._a, out._a
        _state.submit_current(lambda: _np.copyto(dst, src, **kw))
        return out

    def copy(self, order: str = "C") -> "ndarray":
        _state.COUNTERS.call("copy")
        out = ndarray(self.shape, self.dtype)
        src, dst = self._a, out._a
        _state.submit_current(lambda: _np.copyto(dst, src))
        return out

    def view(self, dtype: Any = None) -> "ndarray":
        return _view(self._a.view() if dtype is None else self._a.view(dtype), self)

    def reshape(self, *shape: Any, order: str = "C") -> "ndarray":
        a = self._a
        return _compute(lambda: a.reshape(*shape, order=order), (self,))

    def fill(self, value: Any) -> None:
        if isinstance(value, (ndarray, _np.ndarray)):
            raise _unsupported(value)
        _state.COUNTERS.call("fill")
        a = self._a
        _state.submit_current(lambda: a.fill(value))

    # -- NumPy's protocols: NumPy's functions on CuPy arrays run CuPy's ------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        fn = globals().get(ufunc.__name__)
        if method != "__call__" or fn is None:
            return NotImplemented
        return fn(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        fn = globals().get(func.__name__)
        if fn is None or not callable(fn):
            return NotImplemented
        return fn(*args, **kwargs)


#: functions whose result's size depends on the data: CuPy reads it to the host
_SYNCHRONIZING = frozenset({"nonzero", "unique", "count_nonzero", "allclose", "array_equal"})
#: functions that write into an argument and return None (``put``)
_IN_PLACE = frozenset({"put"})
#: methods that make views, not kernels
_VIEWS = frozenset({"reshape", "view", "transpose", "swapaxes", "squeeze", "ravel"})


def _view(a: _np.ndarray, of: ndarray) -> ndarray:
    out = object.__new__(ndarray)
    out._a, out._mem = a, of._mem
    return out


def _key(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(_key(k) for k in key)
    if isinstance(key, ndarray):
        return key._a
    if isinstance(key, _np.ndarray) and key.ndim > 0:
        _state.COUNTERS.upload()  # CuPy sends a NumPy index array to the device
    return key


def _device(a: _np.ndarray) -> ndarray:
    """A host result moved into new device memory (the allocator's, as CuPy's results are)."""
    out = ndarray(a.shape, a.dtype)
    out._a[...] = a
    return out


def _zeroed(key: Any) -> Any:
    """An index with its integer arrays zeroed: the same result shape, whatever they hold."""
    if isinstance(key, tuple):
        return tuple(_zeroed(k) for k in key)
    if isinstance(key, _np.ndarray) and key.dtype.kind in "iu":
        return _np.zeros_like(key)
    return key


def _compute(work: Any, parents: tuple, probe_work: Any = None) -> Any:
    """The result of a kernel of the array module over ``parents``: now, or where the current stream
    captures, new arrays of the result's shape and type (made now, from the current allocator) filled by
    ``work`` when the graph runs. A view of a parent is no kernel: it is made now either way.
    ``probe_work``: the same shape and type whatever the data (an index's arrays zeroed), for work that
    may fail on the values a capture's arrays hold before the graph has run."""
    if _state.current_capture() is None:
        return _result(work(), parents)
    with _np.errstate(all="ignore"):
        probe = (probe_work or work)()  # for the result's shape and type: the data are not the graph's yet
    if isinstance(probe, _np.ndarray) and builtins.any(
        isinstance(p, ndarray) and probe.size and _np.may_share_memory(probe, p._a) for p in parents
    ):
        return _result(probe, parents)
    if isinstance(probe, tuple):
        outs = tuple(ndarray(_np.shape(v), _np.asarray(v).dtype) for v in probe)
    elif isinstance(probe, (_np.ndarray, _np.generic)):
        outs = (ndarray(_np.shape(probe), probe.dtype),)
    else:
        return probe

    def fill() -> None:
        got = work()
        for o, v in zip(outs, got if isinstance(probe, tuple) else (got,)):
            o._a[...] = v

    _state.submit_current(fill)
    return outs if isinstance(probe, tuple) else outs[0]


def _result(r: Any, parents: tuple) -> Any:
    """NumPy's result of work on ``parents``: a view of one of them stays a view of its memory, a new
    array or scalar becomes device memory (0-d for a scalar, as CuPy's reductions), anything else as is."""
    if isinstance(r, _np.ndarray):
        for p in parents:
            if isinstance(p, ndarray) and r.size and _np.may_share_memory(r, p._a):
                return _view(r, p)
        return _device(r)
    if isinstance(r, _np.generic):
        return _device(_np.asarray(r))
    if isinstance(r, tuple):
        return tuple(_result(x, parents) for x in r)
    if isinstance(r, list):
        return [_result(x, parents) for x in r]
    return r


def _arg(x: Any, elementwise: bool) -> Any:
    """A CuPy argument as NumPy takes it: device arrays unwrapped; NumPy arrays refused, as CuPy does
    (sequences too where a function takes arrays element-wise)."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, _np.ndarray):
        raise _unsupported(x)
    if isinstance(x, (list, tuple)):
        if elementwise:
            raise _unsupported(x)
        return type(x)(_arg(v, False) for v in x)
    return x


def _parents(args: tuple, kwargs: dict) -> tuple:
    found = [a for a in args if isinstance(a, ndarray)]
    for a in args:
        if isinstance(a, (list, tuple)):
            found += [v for v in a if isinstance(v, ndarray)]
    return tuple(found)


def _wrap(name: str, elementwise: bool) -> Any:
    np_fn = getattr(_np, name)

    def fn(*args: Any, **kwargs: Any) -> Any:
        _state.COUNTERS.call(name)
        out = kwargs.pop("out", None)
        a = [_arg(x, elementwise) for x in args]
        kw = {k: _arg(v, False) for k, v in kwargs.items()}
        if out is not None:
            outs = out if isinstance(out, tuple) else (out,)
            for o in outs:
                if not isinstance(o, ndarray):
                    raise _unsupported(o)
            kw["out"] = tuple(o._a for o in outs) if isinstance(out, tuple) else out._a
            _state.submit_current(lambda: np_fn(*a, **kw))
            return out
        if name in _SYNCHRONIZING:
            _state.refuse_in_capture(f"{name} (its result's size is read to the host)")
        if name in _IN_PLACE:  # writes its first argument, returns nothing: a kernel in stream order
            kw.setdefault("mode", "wrap")  # CuPy's default (NumPy's is "raise")
            _state.submit_current(lambda: np_fn(*a, **kw))
            return None
        return _compute(lambda: np_fn(*a, **kw), _parents(args, kwargs))

    fn.__name__ = name
    return fn


_UFUNCS = """add subtract multiply divide true_divide floor_divide negative positive power square sqrt
reciprocal exp exp2 expm1 log log2 log10 log1p tanh sinh cosh sin cos tan arctan arctanh abs absolute sign
maximum minimum fmax fmin greater greater_equal less less_equal equal not_equal logical_and logical_or
logical_not logical_xor isfinite isnan isinf bitwise_and bitwise_or bitwise_xor invert left_shift
right_shift trunc floor ceil rint remainder mod fmod clip copysign signbit""".split()
_FUNCTIONS = """sum mean max min amax amin nanmax nanmin nansum prod argmax argmin any all cumsum cumprod
var std matmul dot vdot tensordot einsum where take take_along_axis put repeat tile concatenate stack
vstack hstack pad reshape ravel transpose swapaxes moveaxis squeeze expand_dims broadcast_to flip
packbits unpackbits nonzero count_nonzero sort argsort unique isclose allclose array_equal outer
zeros_like ones_like empty_like full_like diff round around""".split()

for _name in _UFUNCS:
    if hasattr(_np, _name):
        globals()[_name] = _wrap(_name, True)


def _at(name: str) -> Any:
    """``cupy.<ufunc>.at(a, indices, b)``: CuPy's scatter (``ufunc.at``, for the ufuncs with an atomic form),
    in place on ``a`` in stream order."""
    np_fn = getattr(_np, name)

    def at(a: Any, indices: Any, b: Any = None) -> None:
        _state.COUNTERS.call(f"{name}.at")
        if not isinstance(a, ndarray):
            raise _unsupported(a)
        idx = _arg(indices, False)
        args = () if b is None else (_arg(b, False),)
        _state.submit_current(lambda: np_fn.at(a._a, idx, *args))

    return at


for _name in ("add", "subtract", "maximum", "minimum"):  # CuPy's ufuncs that take .at
    globals()[_name].at = _at(_name)
for _name in _FUNCTIONS:
    if hasattr(_np, _name):
        globals()[_name] = _wrap(_name, False)


def _binary(name: str, swap: bool = False, inplace: bool = False) -> Any:
    def op(self: ndarray, other: Any) -> Any:
        if isinstance(other, _np.ndarray) or isinstance(other, (list, tuple)):
            raise _unsupported(other)
        fn = globals()[name]
        if inplace:
            return fn(self, other, out=self)
        return fn(other, self) if swap else fn(self, other)

    return op


for _dunder, _fn_name in {
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "truediv": "true_divide",
    "floordiv": "floor_divide",
    "pow": "power",
    "mod": "remainder",
    "and": "bitwise_and",
    "or": "bitwise_or",
    "xor": "bitwise_xor",
    "lshift": "left_shift",
    "rshift": "right_shift",
    "matmul": "matmul",
}.items():
    setattr(ndarray, f"__{_dunder}__", _binary(_fn_name))
    setattr(ndarray, f"__r{_dunder}__", _binary(_fn_name, swap=True))
    if _dunder != "matmul":
        setattr(ndarray, f"__i{_dunder}__", _binary(_fn_name, inplace=True))
for _dunder, _fn_name in {
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
    "eq": "equal",
    "ne": "not_equal",
}.items():
    setattr(ndarray, f"__{_dunder}__", _binary(_fn_name))
ndarray.__neg__ = lambda self: negative(self)  # type: ignore[attr-defined]  # noqa: F821
ndarray.__pos__ = lambda self: self.copy()
ndarray.__abs__ = lambda self: absolute(self)  # type: ignore[attr-defined]  # noqa: F821
ndarray.__invert__ = lambda self: invert(self)  # type: ignore[attr-defined]  # noqa: F821
ndarray.__hash__ = None  # type: ignore[assignment]


# -- making arrays -----------------------------------------------------------------------------------
def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return ndarray(shape, dtype, order=order)


def _filled(shape: Any, dtype: Any, value: Any, order: str = "C") -> ndarray:
    out = ndarray(shape, dtype, order=order)
    a = out._a
    _state.submit_current(lambda: a.fill(value))
    return out


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _filled(shape, dtype, 0, order)


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _filled(shape, dtype, 1, order)


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    if isinstance(fill_value, (ndarray, _np.ndarray)):
        raise _unsupported(fill_value)
    return _filled(shape, _np.asarray(fill_value).dtype if dtype is None else dtype, fill_value, order)


def arange(*args: Any, dtype: Any = None) -> ndarray:
    return _compute(lambda: _np.arange(*args, dtype=dtype), ())  # a kernel of its scalars, as CuPy's


def _upload() -> None:
    _state.refuse_in_capture("a copy from pageable host memory (an array made from host data)")
    _state.COUNTERS.upload()


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K", ndmin: int = 0) -> ndarray:
    if isinstance(obj, ndarray):
        a = obj._a
        return _compute(lambda: _np.array(a, dtype=dtype, order=order, ndmin=ndmin), ())
    _upload()
    return _device(_np.array(obj, dtype=dtype, order=order, ndmin=ndmin))


def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    if isinstance(a, ndarray):
        return a if dtype is None or _np.dtype(dtype) == a.dtype else a.astype(dtype)
    interface = getattr(a, "__cuda_array_interface__", None)
    if interface is not None:  # another library's device array: viewed where it is, no copy
        dt, shape = _np.dtype(interface["typestr"]), tuple(interface["shape"])
        strides = interface.get("strides")
        span = dt.itemsize * (
            int(_np.prod(shape))
            if strides is None
            else 1 + builtins.sum((n - 1) * s for n, s in zip(shape, strides)) // dt.itemsize
        )
        mem = cuda.UnownedMemory(interface["data"][0], span, a)
        view = ndarray(shape, dt, memptr=cuda.MemoryPointer(mem, 0), strides=strides)
        return view if dtype is None or _np.dtype(dtype) == dt else view.astype(dtype)
    _upload()
    return _device(_np.asarray(a, dtype=dtype))


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    if isinstance(a, ndarray):
        if a.flags.c_contiguous and (dtype is None or _np.dtype(dtype) == a.dtype):
            return a
        src = a._a
        return _compute(lambda: _np.ascontiguousarray(src, dtype=dtype), ())
    _upload()
    return _device(_np.ascontiguousarray(a, dtype=dtype))


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> _np.ndarray:
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)
    return _np.asarray(a, order=order)


def copyto(dst: ndarray, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    if not isinstance(dst, ndarray):
        raise _unsupported(dst)
    if isinstance(src, _np.ndarray):
        raise _unsupported(src)  # CuPy copies between device arrays (a NumPy source: asarray it first)
    d, v, w = dst._a, src._a if isinstance(src, ndarray) else src, where._a if isinstance(where, ndarray) else where
    _state.submit_current(lambda: _np.copyto(d, v, casting=casting, where=w))


def may_share_memory(a: Any, b: Any, max_work: Any = None) -> bool:
    if not (isinstance(a, ndarray) and isinstance(b, ndarray)):
        return False
    return bool(_np.may_share_memory(a._a, b._a))


def shares_memory(a: Any, b: Any, max_work: Any = None) -> bool:
    return may_share_memory(a, b)


def get_array_module(*args: Any) -> Any:
    import sys

    return sys.modules[__name__] if builtins.any(isinstance(a, ndarray) for a in args) else _np


def result_type(*args: Any) -> _np.dtype:
    return _np.result_type(*[a.dtype if isinstance(a, ndarray) else a for a in args])


def can_cast(from_: Any, to: Any, casting: str = "safe") -> bool:
    return bool(_np.can_cast(from_.dtype if isinstance(from_, ndarray) else from_, to, casting))

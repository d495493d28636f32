"""How a device runs the layers' array work: the ``ops`` a :class:`~vmem.nn.Ctx` carries.

Layers never ask which device they are on. They hand their big products, their elementwise work over
rows and their column sums to ``ctx.ops``, which the device chose:

- :class:`HostOps` (NumPy): work cut into pieces fixed by the shapes alone (:mod:`vmem.nn.lanes`) and
  run in turn. A device with cores to spare runs the same pieces side by side (the CPU device's
  ``vmem.device.lanes.LaneOps``); the pieces, hence the results bit for bit, are the same either way.
- :class:`ArrayOps` (any other array module, CuPy on a GPU): one call per operation, no pieces, and
  column sums in blocks of rows (one pass over millions of rows and few columns keeps only a few
  thread blocks of a GPU busy).

A Ctx made without ``ops`` gets :class:`HostOps`: layers called on their own run on NumPy, in turn.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from .lanes import LANES, deal, lanes_for, rows_worth_cutting, split

if TYPE_CHECKING:
    from .._typing import Array
    from .._typing import Xp

__all__ = ["ArrayOps", "HostOps"]


class ArrayOps:
    """Array work on ``xp`` one operation at a time (a GPU's array module: the device parallelizes)."""

    #: Whether the arrays are host (NumPy) arrays whose work is cut into pieces by shape.
    host = False

    def __init__(self, xp: Xp):
        self.xp = xp
        #: float64 sums of float32 columns, by length, on a device (not the host's, whose lanes may sum at
        #: once): made at their first use, then reused (work on one stream, in order), so that a step's
        #: column sums into given arrays allocate nothing
        self._sums: dict[int, Array] = {}

    def run(self, work: Callable[[int], None], lanes: int = LANES) -> None:
        """``work(lane)`` for each of ``lanes`` lanes, in turn."""
        for lane in range(lanes):
            work(lane)

    def pull(self, work: Callable[[int, int], None], pieces: int, lanes: int = LANES) -> None:
        """``work(lane, piece)`` for every piece in ``range(pieces)``, each lane taking the next piece as
        soon as it is done with its last one (a lane slowed by another process takes fewer). Only for
        pieces whose results do not depend on the lane that computes them (disjoint outputs; ``lane`` picks
        the scratch space). Where the lanes run in turn, lane 0 takes every piece, in order. The first error
        is re-raised once every lane has stopped; after one, the lanes take no new pieces."""
        taken = iter(range(pieces))
        lock = threading.Lock()
        failed = threading.Event()

        def lane(i: int) -> None:
            while not failed.is_set():
                with lock:
                    piece = next(taken, None)
                if piece is None:
                    return
                try:
                    work(i, piece)
                except BaseException:
                    failed.set()
                    raise

        self.run(lane, max(1, min(lanes, pieces)))  # in turn, lane 0 takes every piece before lane 1 looks

    def matmul(self, a: Array, b: Array, out: Array) -> Array:
        """``xp.matmul(a, b, out=out)``."""
        return self.xp.matmul(a, b, out=out)

    def linear(self, x: Array, w: Array, b: Array | None, y: Array, workspace: Array | None = None) -> None:
        """``y = x @ w.T (+ b)`` over the last axis (:class:`~vmem.nn.Linear`'s forward); ``workspace``: the
        op's (a device may keep copies there)."""
        self.matmul(x, w.T, out=y)
        if b is not None:
            y += b

    def linear_backward(
        self,
        dy: Array,
        x: Array,
        w: Array,
        dx: Array | None,
        dw: Array,
        db: Array | None,
        workspace: Array | None = None,
    ) -> None:
        """The gradients of :meth:`linear` on 2-D rows: ``dw = dy.T @ x``, ``db`` the column sums of ``dy``
        where given, ``dx = dy @ w`` where wanted."""
        self.matmul(dy.T, x, out=dw)
        if db is not None:
            self.column_sum(dy, out=db)
        if dx is not None:
            self.matmul(dy, w, out=dx)

    def rows(self, n: int, work: Callable[[slice], None], size: int) -> None:
        """``work(piece)`` over ``n`` rows (the first axis of the arrays it touches): here, all at once.
        For work whose every result depends only on its own rows, so that any cut gives the same."""
        work(slice(0, n))

    def each(self, sizes: list[int], work: Callable[[int], None]) -> None:
        """``work(i)`` for every item of independent elementwise work of ``sizes`` elements: in order."""
        for i in range(len(sizes)):
            work(i)

    def relu(self, x: Array, y: Array) -> None:
        """``y = max(x, 0)`` (NaN passes, -0 becomes +0); ``y`` may be ``x``: the same array, never two views
        of one buffer (an array module may copy an input that overlaps its output)."""
        self.xp.maximum(x, 0, out=y)

    def relu_backward(self, y: Array, dy: Array, dx: Array) -> None:
        """``dx = dy * (y > 0)``; ``dx`` may be ``dy`` (in place on the shared gradient buffer)."""
        self.xp.multiply(dy, y > 0, out=dx)

    def maxpool_forward(self, x: Array, y: Array, arg: Any, kernel: tuple, stride: tuple, packed: bool) -> bool:
        """Max pooling of channels-last ``x`` into ``y`` and each maximum's window position into ``arg`` (4
        bits each, two to a byte, with ``packed``) in one pass, for windows without padding or dilation that
        do not overlap; False where these ops have no such pass (the layer then pools its own way)."""
        return False

    def maxpool_backward(
        self, dy: Array, arg: Any, dx: Array, kernel: tuple, stride: tuple, packed: bool, relu: Array | None = None
    ) -> bool:
        """``dx`` from ``dy`` and the argmax map :meth:`maxpool_forward` wrote, in one pass; with ``relu`` (the
        output of a ReLU before the pool), ReLU's backward in the same pass (as :meth:`relu_backward` of the
        pool's gradient). False where these ops have no such pass."""
        return False

    def erf(self, x: Array, out: Array) -> Array:
        """The error function, element-wise, into ``out``: ``scipy.special.erf`` of the array module's SciPy
        (``cupyx.scipy.special`` for CuPy, which the CUDA device's ops name)."""
        return self.special.erf(x, out=out)

    @property
    def special(self) -> Any:
        """The array module's ``scipy.special`` (cupyx's for CuPy)."""
        import importlib

        return importlib.import_module(f"{'cupyx.scipy' if self.xp.__name__ == 'cupy' else 'scipy'}.special")

    def column_sum(self, a: Array, out: Array | None = None) -> Array:
        """The sum of a 2-D array's rows (``a.sum(axis=0)``) into ``out`` if given (else in ``a``'s type):
        float32 rows accumulated in float64 and rounded once (a few values per column: a float32 sum over
        N*H*W rows, added one after another, loses digits as the rows grow, and batch norm's gradient is a
        difference of such sums); other types by blocks of about sqrt(M) rows, then their partial sums."""
        if np.dtype(a.dtype) == np.float32:
            if self.host:
                return _rounded(self.xp.sum(a, axis=0, dtype=np.float64), a.dtype, out)
            n = a.shape[1]
            total = self._sums.get(n)
            if total is None:
                total = self._sums[n] = self.xp.empty(n, np.float64)
            return _rounded(self.xp.sum(a, axis=0, dtype=np.float64, out=total), a.dtype, out)
        m = a.shape[0]
        if m < 4096:
            return self.xp.sum(a, axis=0, out=out)
        g = _block_rows(m)
        partial = a.reshape(m // g, g, a.shape[1]).sum(axis=1)
        return self.xp.sum(partial, axis=0, out=out)


@functools.cache
def _scipy_special() -> Any:
    """``scipy.special``, or None where SciPy is not installed (an optional extra)."""
    try:
        import scipy.special as special
    except ImportError:
        return None
    return special


class HostOps(ArrayOps):
    """NumPy arrays, work cut into pieces fixed by the shapes (see :mod:`vmem.nn.lanes`), run in turn."""

    host = True
    xp: Xp = np  # (for subclasses that make no ArrayOps of their own: the CPU device's LaneOps)

    def __init__(self) -> None:
        super().__init__(np)

    def erf(self, x: Array, out: Array) -> Array:
        """SciPy's ``special.erf`` where SciPy is installed, else the standard library's, value by value
        (exact, and about a hundred times slower)."""
        special = _scipy_special()
        if special is not None:
            return special.erf(x, out=out)
        import math

        out[...] = np.frompyfunc(math.erf, 1, 1)(x)
        return out

    def matmul(self, a: Array, b: Array, out: Array) -> Array:
        """``np.matmul(a, b, out=out)``; a large product split over the rows of ``out`` (its first axis) into
        one piece per lane, whether or not the lanes run at once."""
        if a.ndim != out.ndim or out.shape[0] < LANES or lanes_for(out.size * a.shape[-1]) < LANES:
            return np.matmul(a, b, out=out)
        pieces = split(out.shape[0])
        b_split = b.ndim == a.ndim and b.ndim > 2  # batched: b's leading axis goes along with a's

        def work(lane: int) -> None:
            s = pieces[lane]
            np.matmul(a[s], b[s] if b_split else b, out=out[s])

        self.run(work, len(pieces))
        return out

    def rows(self, n: int, work: Callable[[slice], None], size: int) -> None:
        """``work(piece)`` for each lane's piece of ``n`` rows where the work covers about a million values
        or more (``size``); else ``work(slice(0, n))``."""
        if not rows_worth_cutting(n, size):
            work(slice(0, n))
            return
        pieces = split(n)
        self.run(lambda lane: work(pieces[lane]), len(pieces))

    def each(self, sizes: list[int], work: Callable[[int], None]) -> None:
        """``work(i)`` for every item, dealt to the lanes (:func:`~vmem.nn.lanes.deal`)."""
        shares = deal(sizes)

        def share(lane: int) -> None:
            for i in shares[lane]:
                work(i)

        self.run(share, len(shares))

    def relu(self, x: Array, y: Array) -> None:
        self.rows(y.shape[0], lambda r: self.xp.maximum(x[r], 0, out=y[r]), y.size)

    def relu_backward(self, y: Array, dy: Array, dx: Array) -> None:
        self.rows(dy.shape[0], lambda r: self.xp.multiply(dy[r], y[r] > 0, out=dx[r]), dy.size)

    def column_sum(self, a: Array, out: Array | None = None) -> Array:
        """NumPy's own ``sum(axis=0)``; float32 rows accumulated in float64 and rounded once (see
        :meth:`ArrayOps.column_sum`)."""
        if a.dtype == np.float32:
            return super().column_sum(a, out)
        return np.sum(a, axis=0, out=out)


def _rounded(total: Array, dtype: Any, out: Array | None) -> Array:
    """``total`` (a float64 sum) rounded once into ``out``, or into a new array of ``dtype``."""
    if out is None:
        return total.astype(dtype)
    out[...] = total
    return out


def _block_rows(m: int) -> int:
    """The largest divisor of ``m`` not above its square root."""
    for g in range(math.isqrt(m), 0, -1):
        if m % g == 0:
            return g
    return 1

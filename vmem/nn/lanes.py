"""Lanes: how the CPU layers share two cores without BLAS's own threads.

On a two-core budget the CPU device runs a step with BLAS single-threaded and gives the layers two
*lanes*: the layers split their big products (and the convolution its chunks of columns) into pieces
fixed by the shapes alone, give the pieces to the lanes, and run the lanes at once, one on each core.
Pieces with disjoint outputs are pulled by the lanes as they finish (:func:`pull`), so a core slowed by
another process takes fewer; partial sums are dealt by index (:func:`run`), so they add up in a fixed order.
This beats BLAS's own two threads for the thin products of convolutions (64 to 512 output channels)
and hides the single-threaded NumPy work (gathering columns) behind the other lane's product. Where
the budget is one core, or more than two, the same pieces run one after the other (with BLAS's
threads at the budget), so on a machine of up to two cores the results are the same bit for bit
whatever the load: every product is computed by one BLAS thread, piece by piece, in the same order.

Which applies is :attr:`vmem.threads.CoreBudget.lanes`, set by :meth:`~vmem.threads.CoreBudget.limit`
for the step it brackets; outside a step (layers called on their own) the lanes run in turn.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from .. import threads

__all__ = ["LANES", "run", "pull", "matmul", "split", "rows", "deal", "each", "lanes_for"]

#: Lanes a layer's work runs on at once (where the step's core budget is two cores).
LANES = threads.LANES
#: Products smaller than this (multiply-adds, about 1 ms on one core) are not split: a lane's hand-off
#: costs tens of microseconds, and a second busy thread delays the memory stream's copies (the CPU
#: device's copies run on a thread of their own), which small work does not repay.
_SPLIT_MIN = 1 << 26
#: Nor is elementwise work over fewer values than this.
_ROWS_MIN = 1 << 20


_inside = threading.local()


def run(work: Callable[[int], None], lanes: int = LANES) -> None:
    """Run ``work(lane)`` for each of ``lanes`` lanes: at once where the step has lanes, else in turn
    (also inside a lane: lanes do not nest). The first error raised is re-raised after every lane has
    finished."""
    if lanes < 2 or threads.BUDGET.lanes < lanes or getattr(_inside, "on", False):
        for lane in range(lanes):
            work(lane)
        return

    def inside(lane: int) -> None:
        _inside.on = True
        try:
            work(lane)
        finally:
            _inside.on = False

    futures = [threads.LANE.submit(inside, lane) for lane in range(1, lanes)]
    try:
        inside(0)
    finally:
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


def pull(work: Callable[[int, int], None], pieces: int, lanes: int = LANES) -> None:
    """``work(lane, piece)`` for every piece in ``range(pieces)``, each lane taking the next piece as soon
    as it is done with its last one: a lane slowed by another process (or a virtual machine's other
    tenants) takes fewer pieces instead of keeping the other waiting. Only for pieces whose results do
    not depend on the lane that computes them (disjoint outputs; ``lane`` picks the scratch space):
    then the results are the same bit for bit whichever lane ran what. Where the lanes run in turn,
    lane 0 takes every piece, in order. Errors as :func:`run`; after one, the lanes take no new pieces."""
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

    run(lane, max(1, min(lanes, pieces)))  # in turn, lane 0 takes every piece before lane 1 looks


def lanes_for(macs: int) -> int:
    """Lanes worth dealing a product of ``macs`` multiply-adds to (a shape-only rule: 1 or LANES)."""
    return LANES if macs >= _SPLIT_MIN else 1


def split(rows: int, lanes: int = LANES) -> list[slice]:
    """``rows`` cut into ``lanes`` contiguous pieces (the first ones a row longer where it does not divide)."""
    cuts = [rows * i // lanes for i in range(lanes + 1)]
    return [slice(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def matmul(xp: Any, a: Any, b: Any, out: Any) -> Any:
    """``xp.matmul(a, b, out=out)``; on NumPy, a large product is split over the rows of ``out`` (its first
    axis) into one piece per lane, whether or not the lanes run at once (see the module's notes)."""
    if xp is not np or a.ndim != out.ndim or out.shape[0] < LANES or lanes_for(out.size * a.shape[-1]) < LANES:
        return xp.matmul(a, b, out=out)
    pieces = split(out.shape[0])
    b_split = b.ndim == a.ndim and b.ndim > 2  # batched: b's leading axis goes along with a's

    def work(lane: int) -> None:
        s = pieces[lane]
        np.matmul(a[s], b[s] if b_split else b, out=out[s])

    run(work, len(pieces))
    return out


def rows(xp: Any, n: int, work: Callable[[slice], None], size: int) -> None:
    """``work(piece)`` for each lane's piece of ``n`` rows (the first axis of the arrays it touches), where
    the work is on NumPy and covers about a million values or more (``size``); else
    ``work(slice(0, n))``. For work whose every result depends only on its own rows (elementwise
    operations, pooling over an image), so the results are the same however it is cut."""
    if xp is not np or n < LANES or size < _ROWS_MIN:
        work(slice(0, n))
        return
    pieces = split(n)
    run(lambda lane: work(pieces[lane]), len(pieces))


def deal(sizes: list[int], lanes: int = LANES) -> list[list[int]]:
    """Indices of ``sizes`` (elements of elementwise work) dealt to ``lanes`` lanes, largest first to
    the lane with least so far (ties to the lower lane), each lane's indices in their original order:
    a balanced share that depends on the sizes alone. Less work than a lane pays for: one share."""
    if sum(sizes) < _ROWS_MIN:
        return [list(range(len(sizes)))]
    loads = [0] * lanes
    shares: list[list[int]] = [[] for _ in range(lanes)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        lane = loads.index(min(loads))
        shares[lane].append(i)
        loads[lane] += sizes[i]
    return [sorted(share) for share in shares]


def each(xp: Any, sizes: list[int], work: Callable[[int], None]) -> None:
    """``work(i)`` for every item ``i`` of independent elementwise work of ``sizes`` elements: on NumPy,
    dealt to the lanes (:func:`deal`); else in order."""
    shares = deal(sizes) if xp is np else [list(range(len(sizes)))]

    def share(lane: int) -> None:
        for i in shares[lane]:
            work(i)

    run(share, len(shares))

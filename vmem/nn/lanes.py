"""Lanes: how the CPU layers share two cores without BLAS's own threads, as rules of shape alone.

On a two-core budget the CPU device runs a step with BLAS single-threaded and gives the layers two
*lanes*: the layers split their big products (and the convolution its chunks of columns) into pieces
fixed by the shapes alone, give the pieces to the lanes, and run the lanes at once, one on each core.
Pieces with disjoint outputs are pulled by the lanes as they finish (``ops.pull``), so a core slowed by
another process takes fewer; partial sums are dealt by index (``ops.run``), so they add up in a fixed order.
This beats BLAS's own two threads for the thin products of convolutions (64 to 512 output channels)
and hides the single-threaded NumPy work (gathering columns) behind the other lane's product. Where
the budget is one core, or more than two, the same pieces run one after the other (with BLAS's
threads at the budget), so on a machine of up to two cores the results are the same bit for bit
whatever the load: every product is computed by one BLAS thread, piece by piece, in the same order.

This module holds the rules (how many lanes, how work is cut); who runs the pieces, and whether at once,
is the device's: the ``ops`` of the layers' Ctx (:mod:`vmem.nn.ops`).
"""

from __future__ import annotations

__all__ = ["LANES", "split", "deal", "lanes_for", "rows_worth_cutting"]

#: Lanes a layer's work runs on at once (where the step's core budget is two cores).
LANES = 2
#: Products smaller than this (multiply-adds, about 1 ms on one core) are not split: a lane's hand-off
#: costs tens of microseconds, and a second busy thread delays the memory stream's copies (the CPU
#: device's copies run on a thread of their own), which small work does not repay.
_SPLIT_MIN = 1 << 26
#: Nor is elementwise work over fewer values than this.
_ROWS_MIN = 1 << 20


def lanes_for(macs: int) -> int:
    """Lanes worth dealing a product of ``macs`` multiply-adds to (a shape-only rule: 1 or LANES)."""
    return LANES if macs >= _SPLIT_MIN else 1


def rows_worth_cutting(n: int, size: int) -> bool:
    """Whether elementwise work over ``n`` rows and ``size`` values is cut into a piece per lane."""
    return n >= LANES and size >= _ROWS_MIN


def split(rows: int, lanes: int = LANES) -> list[slice]:
    """``rows`` cut into ``lanes`` contiguous pieces (the first ones a row longer where it does not divide)."""
    cuts = [rows * i // lanes for i in range(lanes + 1)]
    return [slice(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


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

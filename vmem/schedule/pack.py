"""Offline placement of a step's blocks in the arena: the schedule is static, so every block's lifetime is
known before the step runs and the blocks can be packed so that the arena needs little more than the
peak of live bytes.

Two families of placements, and the one with the lowest top wins:

- **Sweeps** over time, in allocation order, keeping the free gaps below the highest live block in a
  sorted list: first fit (the lowest gap that holds the block) and best fit (the smallest such gap).
  O(n log n) in practice (the number of gaps stays small), so they scale to schedules of any size.
- **Greedy by size, lifetime or end** (TensorFlow Lite's arena planner and variants): blocks in order of
  size (ties: the later-freed first, or the longer-lived), of lifetime, or of when they are freed, each at
  the lowest (or tightest) gap among the already-placed blocks live at the same time.
  They cost O(n^2), so they run only on schedules of up to ``GREEDY_LIMIT`` blocks, where they matter
  most: VGG-16 at batch 256 under vdnn-conv packs to 15.5 GiB by the sweeps, 12.4 GiB largest-first and
  11.6 GiB (its live peak) largest-first with the later-freed first. ``"thorough"`` (the placement of a
  last-resort plan), where a capacity is given that none of them fits but the live bytes do: largest first
  again with the ties in ``SHUFFLES`` seeded random orders, since which lane of the arena two equal maps
  take decides whether a small map that lives from the forward to the backward finds a gap between them
  (VGG-16 at batch 268 with its signs on the host, 8 GiB: no fixed order fits; 6 of 40 shuffles do).

Persistent buffers sit first, contiguously, as the trainer allocates them before any step.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, insort
from typing import Callable, Iterable, NamedTuple

from .steps import (
    Accumulate,
    AccumulateParam,
    Alloc,
    Backward,
    CopyOut,
    Decode,
    Encode,
    Forward,
    Free,
    Loss,
    Offload,
    Prefetch,
    Recompute,
    Release,
    Schedule,
    Step,
    AllReduce,
    WaitAllReduce,
    Broadcast,
    Update,
    Upload,
    WaitPrefetch,
    handlers,
)

__all__ = ["Life", "lifetimes", "pack", "place", "peak_live", "GREEDY_LIMIT", "STRATEGIES"]

#: Greedy orders run only on schedules with at most this many blocks (their cost grows with the square).
GREEDY_LIMIT = 400
#: ``"thorough"``, with a capacity that no fixed order fits but the live bytes do: this many largest-first
#: placements with the blocks of a size in a seeded random order (the same every run)
SHUFFLES = 32
STRATEGIES = ("auto", "sweep", "greedy", "thorough")

_OPEN, _CLOSE = "open", "close"
# the memory effect of each step kind (the one table this consumer dispatches on)
_EFFECT = handlers(
    {
        Alloc: _OPEN,
        Free: _CLOSE,
        Release: _CLOSE,
        Offload: None,
        Upload: None,
        Forward: None,
        Recompute: None,
        Loss: None,
        Backward: None,
        Accumulate: None,
        AccumulateParam: None,
        Update: None,
        AllReduce: None,
        WaitAllReduce: None,
        Broadcast: None,
        Prefetch: None,
        WaitPrefetch: None,
        Encode: None,
        Decode: None,
        CopyOut: None,
    },
    "pack",
)


class Life(NamedTuple):
    """A block's aligned size and its live range in steps: allocated at ``start``, free after ``end``."""

    size: int
    start: int
    end: int


def _align(n: int, alignment: int) -> int:
    return -(-max(n, 1) // alignment) * alignment


def lifetimes(steps: list[Step], alignment: int) -> list[Life]:
    """One Life per allocation, in step order (a block never freed lives to the end of the step)."""
    open_: dict = {}
    lives: list[Life | None] = []
    for index, st in enumerate(steps):
        effect = _EFFECT[type(st)]
        if effect is _OPEN:
            open_[st.buffer.key] = (len(lives), index)  # type: ignore[union-attr]
            lives.append(None)
        elif effect is _CLOSE:
            slot, start = open_.pop(st.key)  # type: ignore[union-attr]
            lives[slot] = Life(_align(_size_of(steps[start]), alignment), start, index)
    end = len(steps)
    for slot, start in open_.values():
        lives[slot] = Life(_align(_size_of(steps[start]), alignment), start, end)
    return lives  # type: ignore[return-value]


def _size_of(st: Step) -> int:
    return st.buffer.nbytes  # type: ignore[union-attr]


def peak_live(lives: Iterable[Life]) -> int:
    """The most bytes live at once: no placement can have a lower top."""
    events = sorted([(life.start, life.size) for life in lives] + [(life.end, -life.size) for life in lives])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def _sweep(lives: list[Life], base: int, best_fit: bool) -> tuple[int, list[int]]:
    """Place blocks in allocation order into the free gaps below the highest live block."""
    events = sorted(
        [(life.start, 1, i) for i, life in enumerate(lives)] + [(life.end, 0, i) for i, life in enumerate(lives)]
    )
    offs: list[int] = []  # free gaps below the frontier, by offset
    sizes: list[int] = []
    frontier = top = base
    offsets = [0] * len(lives)
    for _, is_alloc, i in events:
        size = lives[i].size
        if is_alloc:
            chosen = -1
            for g, gap in enumerate(sizes):
                if gap >= size and (chosen < 0 or (best_fit and gap < sizes[chosen])):
                    chosen = g
                    if not best_fit or gap == size:
                        break
            if chosen < 0:
                offsets[i] = frontier
                frontier += size
                top = max(top, frontier)
            else:
                offsets[i] = offs[chosen]
                if sizes[chosen] == size:
                    del offs[chosen], sizes[chosen]
                else:
                    offs[chosen] += size
                    sizes[chosen] -= size
            continue
        lo, hi = offsets[i], offsets[i] + size
        if hi == frontier:  # the highest block: the frontier drops, through the gap below it
            frontier = lo
            if offs and offs[-1] + sizes[-1] == frontier:
                frontier = offs.pop()
                sizes.pop()
            continue
        g = bisect_left(offs, lo)
        if g < len(offs) and offs[g] == hi:  # merge with the gap above
            sizes[g] += size
            offs[g] = lo
        else:
            offs.insert(g, lo)
            sizes.insert(g, size)
        if g > 0 and offs[g - 1] + sizes[g - 1] == lo:  # merge with the gap below
            sizes[g - 1] += sizes[g]
            del offs[g], sizes[g]
    return top, offsets


_ORDERS: tuple[Callable[[tuple[int, Life]], tuple], ...] = (
    lambda il: (-il[1].size, -(il[1].end - il[1].start), il[1].start),  # largest first
    lambda il: (-il[1].size, -il[1].end, il[1].start),  # largest first, the later-freed of a size first
    lambda il: (-(il[1].end - il[1].start), -il[1].size, il[1].start),  # longest-lived first
    lambda il: (-il[1].end, -il[1].size),  # the latest-freed first (what backward frees last sits lowest)
)


def _greedy(
    lives: list[Life],
    base: int,
    order: Callable[[tuple[int, Life]], tuple],
    tightest: bool,
    beat: int | None = None,
) -> tuple[int, list[int]] | None:
    """Place blocks in ``order``, each at the lowest (or tightest) gap among the placed blocks live at the
    same time. None as soon as the top reaches ``beat`` (a placement no lower than one already made)."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, end offset, start, end), sorted by offset
    offsets = [0] * len(lives)
    top = base
    for i, (size, start, stop) in sorted(enumerate(lives), key=order):
        offset, chosen, gap_size = base, -1, 0
        for o, e, s0, s1 in placed:  # the gaps between blocks live at the same time, by offset
            if s0 >= stop or s1 <= start:
                continue
            gap = o - offset
            if gap >= size:
                if not tightest:
                    chosen = offset
                    break
                if chosen < 0 or gap < gap_size:
                    chosen, gap_size = offset, gap
            if e > offset:  # (the hot loop: a comparison, not max())
                offset = e
        if chosen >= 0:
            offset = chosen
        offsets[i] = offset
        if offset + size > top:
            top = offset + size
            if beat is not None and top >= beat:
                return None
        insort(placed, (offset, offset + size, start, stop))
    return top, offsets


def pack(
    lives: list[Life], base: int = 0, strategy: str = "auto", capacity: int | None = None
) -> tuple[int, list[int]]:
    """(top, offset of each life): the best of the sweeps and, where the schedule is small enough (or
    ``strategy="greedy"``), the greedy orders. ``strategy="sweep"`` runs the sweeps only. With
    ``capacity`` (the arena's size) ``"auto"`` places the blocks only as tightly as they must be to fit
    it: the sweeps' placement where it fits, or where the live bytes alone do not (nothing fits); else the
    first greedy order's whose top fits (each abandoned once above the capacity); else, as without a
    capacity, the tightest (the pool may still fit it, placing the blocks that overflow elsewhere).
    ``"thorough"``: as ``"auto"``, then :data:`SHUFFLES` more orders before giving up (for a plan that is
    the last resort: each is one more placement of the whole step)."""
    top, offsets, _ = _pack(lives, base, strategy, capacity)
    return top, offsets


def _pack(
    lives: list[Life], base: int, strategy: str, capacity: int | None, live: int | None = None
) -> tuple[int, list[int], tuple[int, float]]:
    """:func:`pack`, and the capacities ``[lo, hi)`` at which it places the blocks the same (``live``: the
    live bytes' peak, :func:`peak_live`, where the caller has it)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; use one of {', '.join(STRATEGIES)}")
    thorough = strategy == "thorough"
    strategy = "auto" if thorough else strategy
    anywhere = (0, math.inf)
    candidates = []
    if strategy != "greedy":
        candidates += [_sweep(lives, base, best_fit) for best_fit in (False, True)]
    greedy = strategy == "greedy" or (strategy == "auto" and len(lives) <= GREEDY_LIMIT)
    # no packing is tighter than the live bytes
    floor = base + (peak_live(lives) if live is None else live) if greedy else 0
    swept = min(c[0] for c in candidates) if candidates else math.inf
    valid: tuple[int, float] = anywhere
    if strategy == "auto" and greedy:
        if swept <= floor:
            greedy = False  # the sweeps reach the live bytes: the greedy orders are not run
        elif capacity is not None and swept <= capacity:
            greedy, valid = False, (int(swept), math.inf)  # the sweeps' placement fits
        elif capacity is not None and floor > capacity:
            greedy, valid = False, (0, floor)  # nothing fits: the quickest placement
        elif capacity is not None:
            # the first order whose placement fits, each abandoned once above the capacity
            for order in _ORDERS:
                for tightest in (False, True):
                    placed = _greedy(lives, base, order, tightest, capacity + 1)
                    if placed is not None:  # the same at every capacity from its top up to this one
                        return (*placed, (placed[0], capacity + 1))
            # then largest first, blocks of a size in a seeded random order: near the live bytes, where
            # the place of a few equal blocks decides whether the small long-lived ones find a gap
            for seed in range(SHUFFLES if thorough else 0):
                rng = random.Random(seed)
                ties = [rng.random() for _ in lives]
                placed = _greedy(lives, base, lambda il: (-il[1].size, ties[il[0]]), False, capacity + 1)
                if placed is not None:
                    return (*placed, (placed[0], capacity + 1))
            # none fits by its top: the tightest, as without a capacity, below (the pool, placing a block
            # its planned place cannot take wherever it fits, may still fit it)
            valid = (floor, capacity + 1)
    if greedy:
        orders = [(order, tightest) for order in _ORDERS for tightest in (False, True)]
        if strategy == "greedy":  # the allocation-order greedy the sweeps stand for
            orders += [(lambda il: (il[1].start, -il[1].size), t) for t in (False, True)]
        for order, tightest in orders:
            # an order whose top reaches the lowest so far is abandoned: min() keeps the first of equals
            placed = _greedy(lives, base, order, tightest, min(c[0] for c in candidates) if candidates else None)
            if placed is None:
                continue
            candidates.append(placed)
            if strategy == "auto" and placed[0] <= floor:
                return (*placed, valid)
    top, offsets = min(candidates, key=lambda c: c[0]) if candidates else (base, [])
    return top, offsets, valid


def place(schedule: Schedule, strategy: str = "auto", capacity: int | None = None) -> Schedule:
    """Plan an arena offset for every allocation of the step; returns the schedule (its Alloc steps now
    carry their offsets, its ``live_bytes`` the most bytes in use at once). ``capacity``: the arena's size,
    where the placement needs only to fit it (:func:`pack`; the schedule's ``placed_for`` says at which
    capacities the same placement would be made)."""
    alignment = schedule.alignment
    base = sum(_align(b.nbytes, alignment) for b in schedule.persistent)
    lives = lifetimes(schedule.steps, alignment)
    live = peak_live(lives)
    top, offsets, valid = _pack(lives, base, strategy, capacity, live)
    steps, k = schedule.steps, 0
    for index, st in enumerate(steps):
        if type(st) is Alloc:
            steps[index] = Alloc(st.buffer, offsets[k])  # (replace() is slow on the hot path)
            k += 1
    schedule.live_bytes = base + live
    schedule.placed_for = None if capacity is None else valid
    schedule.placed_top = int(top)
    return schedule

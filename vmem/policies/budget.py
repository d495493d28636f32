"""The smallest budget a plan fits in, and the largest batch: searches, pure (the caller says what fits)."""

from __future__ import annotations

from typing import Callable

__all__ = ["least_memory", "largest_fitting"]


def largest_fitting(fits: Callable[[int], bool], most: int, unfit: int | None = None) -> int:
    """The largest ``n`` in 1..``most`` for which ``fits(n)`` holds (fitting at ``n`` is taken to mean
    fitting at every smaller one): 0 where ``fits(1)`` does not. Doubles from 1 until a try does not fit,
    then bisects; ``unfit``, a value known not to fit (at most ``most + 1``), starts the bisection at once."""
    if most < 1 or (unfit is not None and unfit <= 1) or not fits(1):
        return 0
    good, bad = 1, unfit if unfit is not None and unfit <= most + 1 else None
    while bad is None and good < most:
        trial = min(good * 2, most)
        if fits(trial):
            good = trial
        else:
            bad = trial
    if bad is None:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def least_memory(
    fits: Callable[[int], bool], peak: int, alignment: int = 256, most: int | None = None, tolerance: float = 0.0
) -> int | None:
    """The smallest capacity, a multiple of ``alignment``, at which ``fits(capacity)`` holds: what a plan
    whose peak is ``peak`` needs once its blocks are placed (packing and alignment can take more than the
    peak). Doubles from the peak until it fits (up to ``most``, default 4x the peak; None beyond), then
    bisects to the alignment, or with ``tolerance`` only until the answer is within that fraction of the
    peak above the least (fewer replays). A plan's blocks sit at offsets packed before the replay, so
    whether it fits grows with the capacity; the answer is checked to fit."""

    def up(n: int) -> int:
        return -(-n // alignment) * alignment

    most = 4 * peak if most is None else most
    lo, hi = up(peak) - alignment, up(peak)  # lo: known not to fit (below the peak)
    while not fits(hi):
        if hi >= most:
            return None
        lo, hi = hi, min(up(2 * hi - up(peak) + alignment), up(most))
    while hi - lo > max(alignment, int(tolerance * peak)):
        mid = up((lo + hi) // 2)
        if mid >= hi:
            break
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi

"""Offline packing: random lifetimes against the invariants (tinygrad's planner test: no two live buffers
overlap), and the zoo's schedules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vmem
from vmem.schedule.lower import lower
from vmem.schedule.pack import STRATEGIES, Life, lifetimes, pack, peak_live


@st.composite
def lives(draw):
    """A random sequence of allocations and frees (sizes in 256-byte units), as a schedule makes them."""
    n = draw(st.integers(0, 60))
    live, out, t = [], [], 0
    for _ in range(2 * n):
        if live and (len(out) >= n or draw(st.booleans())):
            i = live.pop(draw(st.integers(0, len(live) - 1)))
            out[i] = out[i]._replace(end=t)
        elif len(out) < n:
            live.append(len(out))
            out.append(Life(256 * draw(st.integers(1, 64)), t, -1))
        t += 1
    return [life._replace(end=t) if life.end < 0 else life for life in out]  # never freed: live to the end


def check(lives_: list[Life], base: int, top: int, offsets: list[int]) -> None:
    assert len(offsets) == len(lives_)
    for i, (a, o) in enumerate(zip(lives_, offsets)):
        assert o >= base and o + a.size <= top, "every block inside the arena"
        for b, p in zip(lives_[i + 1 :], offsets[i + 1 :]):
            if a.start < b.end and b.start < a.end:  # live at the same time
                assert o + a.size <= p or p + b.size <= o, f"{a}@{o} overlaps {b}@{p}"
    assert top - base >= peak_live(lives_), "no placement beats the live-bytes peak"


@settings(max_examples=150, deadline=None)
@given(lives(), st.sampled_from([0, 4096]), st.sampled_from(STRATEGIES))
def test_no_two_live_blocks_overlap_and_the_top_is_never_below_the_live_peak(lives_, base, strategy):
    top, offsets = pack(lives_, base, strategy)
    check(lives_, base, top, offsets)


@settings(max_examples=60, deadline=None)
@given(lives())
def test_auto_is_never_worse_than_either_family(lives_):
    auto = pack(lives_, 0, "auto")[0]
    assert auto <= pack(lives_, 0, "sweep")[0]
    assert auto == min(pack(lives_, 0, "sweep")[0], pack(lives_, 0, "greedy")[0])  # small: both families run


def test_contiguous_when_everything_lives_for_the_whole_step():
    lives_ = [Life(256 * k, 0, 10) for k in (3, 1, 2)]
    top, offsets = pack(lives_, 1024, "sweep")
    assert top == 1024 + 256 * 6 and offsets == [1024, 1024 + 3 * 256, 1024 + 4 * 256]  # in allocation order


def test_a_freed_gap_is_reused_and_the_frontier_drops():
    # a (t0-t2), b (t1-t5), c (t3-t4) fits in a's gap; d (t6-t7) starts at the bottom again
    lives_ = [Life(512, 0, 2), Life(256, 1, 5), Life(512, 3, 4), Life(1024, 6, 7)]
    top, offsets = pack(lives_, 0, "sweep")
    assert offsets == [0, 512, 0, 0] and top == 1024


def test_bad_strategy_is_refused():
    with pytest.raises(ValueError, match="strategy"):
        pack([], 0, "fastest")


@pytest.mark.parametrize("policy", ["baseline", "vdnn-all", "gist", "vdnn-conv:sync=event"])
def test_zoo_schedules_satisfy_the_invariants(policy):
    net = vmem.models.get("mini_googlenet", image_size=16)
    program = net.build(8)
    schedule = lower(program, vmem.policies.get(policy).decide(program, vmem.device("sim:titan-x").spec))
    lives_ = lifetimes(schedule.steps, schedule.alignment)
    base = sum(-(-b.nbytes // 256) * 256 for b in schedule.persistent)
    offsets = [st.offset for st in schedule.steps if type(st).__name__ == "Alloc"]
    top = max(o + life.size for o, life in zip(offsets, lives_))
    check(lives_, base, top, offsets)


def _every_order(lives_: list[Life], base: int) -> tuple[int, list[int]]:
    """``pack(..., "auto")`` restated without its shortcuts: both sweeps, then every greedy order run to
    the end, the first to reach the live bytes taken, else the lowest (the first of equals)."""
    from vmem.schedule.pack import _ORDERS, _greedy, _sweep

    candidates = [_sweep(lives_, base, best_fit) for best_fit in (False, True)]
    floor = base + peak_live(lives_)
    if min(c[0] for c in candidates) > floor:
        for order in _ORDERS:
            for tightest in (False, True):
                placed = _greedy(lives_, base, order, tightest)
                candidates.append(placed)
                if placed[0] <= floor:
                    return placed
    return min(candidates, key=lambda c: c[0])


@settings(max_examples=150, deadline=None)
@given(lives(), st.sampled_from([0, 4096]))
def test_abandoning_an_order_that_cannot_win_places_every_block_as_running_them_all_does(lives_, base):
    assert pack(lives_, base, "auto") == _every_order(lives_, base)


@settings(max_examples=150, deadline=None)
@given(lives(), st.integers(0, 96))
def test_with_a_capacity_the_greedy_orders_run_only_where_they_can_make_the_blocks_fit(lives_, units):
    floor, capacity = peak_live(lives_), 256 * units
    swept = pack(lives_, 0, "sweep")
    placed = pack(lives_, 0, "auto", capacity)
    if floor > capacity or swept[0] <= capacity:  # nothing fits, or the sweeps' placement does
        assert placed == swept
    elif pack(lives_, 0, "auto")[0] <= capacity:  # the tightest fits: so does the first order that fits
        assert placed[0] <= capacity
    else:  # no greedy order fits: the tightest, as without a capacity
        assert placed == pack(lives_, 0, "auto")
    check(lives_, 0, *placed)
    # the capacities at which the same placement is made, as the planner's oracle reuses it
    from vmem.schedule.pack import _pack

    lo, hi = _pack(lives_, 0, "auto", capacity)[2]
    assert lo <= capacity < hi
    for other in (lo, hi - 256, hi, max(lo - 256, 0)):
        if lo <= other < hi:
            assert pack(lives_, 0, "auto", other) == placed

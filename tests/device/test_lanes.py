"""The lanes of the CPU layers: pieces fixed by the shapes, run side by side on a two-core budget and in
turn otherwise, with the same bits either way."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from vmem import nn, threads
from vmem.device.hostconv import HostConv, backend as conv, catalog, workspace_bytes
from vmem.device.lanes import LaneOps
from vmem.nn import Ctx, PASSES, lanes, physical
from vmem.nn.ops import ArrayOps

#: The CPU device's lanes.
OPS = LaneOps()


@pytest.fixture
def budget(monkeypatch):
    """Run a body under a pinned core budget (restored after), counting the lanes run side by side;
    products of any size go to the lanes (the tests' are small)."""
    monkeypatch.setattr(lanes, "_SPLIT_MIN", 1)
    before = threads.BUDGET.fixed
    side_by_side = []
    real_submit = threads.LANE.submit
    monkeypatch.setattr(threads.LANE, "submit", lambda *a: side_by_side.append(1) or real_submit(*a))

    def under(n: int, fn):
        threads.BUDGET.fix(n)
        with threads.BUDGET.limit():
            assert threads.BUDGET.lanes == (2 if n == 2 else 1)
            return fn()

    under.side_by_side = side_by_side
    yield under
    threads.BUDGET.fix(before)
    threads.LANE.shutdown()
    assert threads.BUDGET.lanes == 1  # only a step has lanes


def _conv_step(layer, shape, x, w, b, dy):
    ws = max(workspace_bytes(layer, shape, p, "im2col", 4) for p in PASSES)
    ctx = Ctx(
        xp=np,
        params={"weight": w, "bias": b},
        grads={"weight": np.empty_like(w), "bias": np.empty_like(b)},
        workspace=np.empty(ws, np.uint8),
        algo="im2col",
        ops=OPS,
        conv=HostConv(),
    )
    y = np.empty(physical(layer.output_shape([shape])), np.float32)
    layer.forward(ctx, [x], y)
    dx = np.empty_like(x)
    layer.backward(ctx, dy, [x], None, [dx])
    return y, dx, ctx.grads["weight"], ctx.grads["bias"]


@pytest.mark.parametrize(
    "k, s, p, shape", [(3, 1, 1, (8, 16, 12, 12)), (5, 2, 2, (6, 8, 15, 13)), (1, 1, 0, (64, 64, 16, 16))]
)
def test_convolution_same_bits_side_by_side_or_in_turn(k, s, p, shape, budget, monkeypatch):
    monkeypatch.setattr(catalog, "_COL_VALUES", 64)
    monkeypatch.setattr(catalog, "_COL_MIN_ROWS", 1)
    rng = np.random.default_rng(2)
    layer = nn.Conv2d(shape[1], 24 if k > 1 else 128, k, stride=s, padding=p)
    x = rng.standard_normal(physical(shape)).astype(np.float32)
    w = rng.standard_normal((layer.out_channels, k, k, shape[1])).astype(np.float32) * 0.1
    b = rng.standard_normal(layer.out_channels).astype(np.float32)
    dy = rng.standard_normal(physical(layer.output_shape([shape]))).astype(np.float32)
    one = budget(1, lambda: _conv_step(layer, shape, x, w, b, dy))
    assert not budget.side_by_side
    two = budget(2, lambda: _conv_step(layer, shape, x, w, b, dy))
    assert budget.side_by_side  # the two-core budget did run the lanes side by side
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)
    if k == 1:  # the 1x1 convolution is one product split over the lanes: it still adds up (float64 reference)
        w1 = w.reshape(layer.out_channels, shape[1]).astype(np.float64)
        np.testing.assert_allclose(two[0], x.astype(np.float64) @ w1.T + b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "a_shape, b_shape", [((512, 1024), (1024, 300)), ((8, 256, 64), (8, 64, 256)), ((4096, 96), (96, 512))]
)
def test_matmul_pieces_same_bits_and_right(a_shape, b_shape, budget):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    out_shape = np.matmul(a[..., :1, :], b).shape[:-2] + (a_shape[-2], b_shape[-1])
    outs = {}
    for n in (1, 2):
        out = np.empty(out_shape, np.float32)
        budget(n, lambda: OPS.matmul(a, b, out))
        outs[n] = out
    assert budget.side_by_side
    np.testing.assert_array_equal(outs[1], outs[2])
    np.testing.assert_allclose(outs[2], np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-3)


def test_small_work_is_not_split(budget, monkeypatch):
    """Under about a millisecond of work a second lane does not pay: products, elementwise work and a
    convolution pass below the thresholds stay whole (and the convolution's workspace has one lane)."""
    monkeypatch.setattr(lanes, "_SPLIT_MIN", 1 << 26)
    a = np.ones((64, 64), np.float32)
    out = np.empty((64, 64), np.float32)
    budget(2, lambda: OPS.matmul(a, np.eye(64, dtype=np.float32), out))
    x = np.ones((8, 1000), np.float32)
    budget(2, lambda: OPS.rows(8, lambda r: np.maximum(x[r], 0, out=x[r]), x.size))
    assert not budget.side_by_side
    np.testing.assert_array_equal(out, a)
    small, big = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1)
    assert len(conv._im2col_layout(small, (32, 16, 8, 8), "forward")[2]) == 1  # 9.4M multiply-adds
    assert len(conv._im2col_layout(big, (64, 64, 32, 32), "forward")[2]) == 2  # 2.4G


def test_an_error_in_a_lane_is_raised_after_both_finish(budget):
    finished = []

    def work(lane: int) -> None:
        if lane == 1:
            raise ValueError("lane 1 failed")
        threading.Event().wait(0.05)
        finished.append(lane)

    with pytest.raises(ValueError, match="lane 1 failed"):
        budget(2, lambda: OPS.run(work))
    assert finished == [0]


def test_lanes_do_not_nest(budget):
    """A lane that splits its own work runs the pieces in turn (the lane pool would wait on itself)."""
    seen = []

    def inner(lane: int) -> None:
        seen.append((threading.current_thread().name, lane))

    budget(2, lambda: OPS.run(lambda lane: OPS.run(inner)))
    assert len(seen) == 4 and len(budget.side_by_side) == 1


def test_pull_runs_every_piece_once_in_order_when_in_turn(budget):
    seen = []
    budget(1, lambda: OPS.pull(lambda lane, piece: seen.append((lane, piece)), 5))
    assert seen == [(0, i) for i in range(5)] and not budget.side_by_side


def test_pull_a_slow_lane_takes_fewer_pieces(budget):
    """The lanes take pieces as they finish: while lane 1 is held on its first piece, lane 0 takes all
    the others (no timing margin: lane 0 waits for lane 1 to hold a piece, and lane 1 is released only
    once lane 0 has done the rest)."""
    taken = {0: [], 1: []}
    held, rest_done = threading.Event(), threading.Event()

    def work(lane: int, piece: int) -> None:
        taken[lane].append(piece)
        if lane == 1:
            held.set()
            assert rest_done.wait(30)
        elif len(taken[0]) == 1:
            assert held.wait(30)  # lane 1 has its piece
        if lane == 0 and len(taken[0]) == 5:
            rest_done.set()

    budget(2, lambda: OPS.pull(work, 6))
    assert budget.side_by_side
    assert len(taken[1]) == 1 and len(taken[0]) == 5
    assert sorted(taken[0] + taken[1]) == list(range(6))


def test_pull_stops_taking_pieces_after_an_error(budget):
    taken = []

    def work(lane: int, piece: int) -> None:
        taken.append(piece)
        if piece == 0:
            raise ValueError("piece 0 failed")
        threading.Event().wait(0.01)

    with pytest.raises(ValueError, match="piece 0 failed"):
        budget(2, lambda: OPS.pull(work, 1000))
    assert len(taken) < 1000


def test_split_covers_the_rows():
    assert lanes.split(5) == [slice(0, 2), slice(2, 5)]
    assert lanes.split(1) == [slice(0, 1)]


@pytest.mark.parametrize(
    "layer, shape",
    [
        (nn.ReLU(), (6, 8, 10, 10)),
        (nn.MaxPool2d(2), (6, 8, 10, 10)),  # 2x2 tiles, nibbles: 5*5*8 codes an image, whole bytes
        (nn.MaxPool2d(3, stride=2), (5, 6, 11, 11)),  # overlapping windows
        (nn.MaxPool2d(2), (5, 3, 6, 6)),  # 27 codes an image: images share a byte, so not cut
    ],
)
def test_elementwise_and_pooling_same_bits_cut_or_whole(layer, shape, budget, monkeypatch):
    """ReLU and max pooling cut their work between images on a two-core budget: the output, the packed
    argmax map and the gradient are those of the whole batch at once."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(physical(shape)).astype(np.float32)
    out = physical(layer.output_shape([shape]))
    dy = rng.standard_normal(out).astype(np.float32)
    aux = {k: np.zeros(a.shape, a.dtype) for k, a in layer.aux_specs([shape]).items()}

    def step():
        ctx = Ctx(xp=np, params={}, grads={}, aux={k: v.copy() for k, v in aux.items()}, ops=OPS)
        y = np.empty(out, np.float32)
        layer.forward(ctx, [x], y)
        dx = np.empty_like(x)
        layer.backward(ctx, dy, [x], y, [dx])
        return y, dx, *ctx.aux.values()

    whole = step()  # outside a step: no lanes, and the pieces are too small to cut
    monkeypatch.setattr(lanes, "_ROWS_MIN", 1)
    cut = budget(2, step)
    assert bool(budget.side_by_side) == (shape != (5, 3, 6, 6))
    for a, b in zip(whole, cut):
        np.testing.assert_array_equal(a, b)


def test_deal_balances_by_size_and_keeps_order(monkeypatch):
    assert lanes.deal([10, 1, 1, 8]) == [[0, 1, 2, 3]]  # too little work for two lanes
    monkeypatch.setattr(lanes, "_ROWS_MIN", 1)
    assert lanes.deal([10, 1, 1, 8]) == [[0], [1, 2, 3]]
    assert lanes.deal([5]) == [[0], []]
    assert lanes.deal([3, 3, 3, 3]) == [[0, 2], [1, 3]]


def test_each_runs_every_item_once(budget, monkeypatch):
    monkeypatch.setattr(lanes, "_ROWS_MIN", 1)
    seen = []
    budget(2, lambda: OPS.each([5, 1, 1, 4], seen.append))
    assert sorted(seen) == [0, 1, 2, 3] and budget.side_by_side
    seen.clear()
    ArrayOps(object()).each([5, 1], seen.append)  # not NumPy: in order, on this thread
    assert seen == [0, 1]

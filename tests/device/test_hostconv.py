"""The host's convolution algorithms (the CPU device's backend) agree within float32 rounding and differ in workspace; Winograd's
native transforms do what their NumPy references do."""

from __future__ import annotations

import numpy as np
import pytest

from vmem import nn
from vmem.nn import Ctx, physical
from vmem.device.hostconv import ALGORITHMS, HostConv, algorithms, catalog, winograd, workspace_bytes
from vmem.nn import lanes
from vmem.nn.base import PASSES


def run(layer, shape, algo, x, w, b, dy):
    ws = max(workspace_bytes(layer, shape, p, algo, 4) for p in PASSES)
    ctx = Ctx(
        xp=np,
        params={"weight": w, "bias": b},
        grads={"weight": np.empty_like(w), "bias": np.empty_like(b)},
        workspace=np.empty(ws, np.uint8) if ws else None,
        algo=algo,
        conv=HostConv(),
    )
    y = np.empty(physical(layer.output_shape([shape])), np.float32)
    layer.forward(ctx, [x], y)
    dx = np.empty_like(x)
    layer.backward(ctx, dy, [x], None, [dx])
    return y, dx, ctx.grads["weight"], ctx.grads["bias"]


@pytest.fixture(params=["whole", "chunked", "planes"])
def chunking(request, monkeypatch):
    """Run each case as it is, with tiny chunks (so that every chunked loop runs many times), and as work
    worth two lanes with big chunks (Winograd's whole-batch chunk, split by tiles and planes)."""
    if request.param == "planes":
        monkeypatch.setattr(lanes, "_SPLIT_MIN", 1)
        monkeypatch.setattr(winograd, "_CHUNK_VALUES", 1 << 30)
    if request.param == "chunked":
        monkeypatch.setattr(catalog, "_COL_VALUES", 64)
        monkeypatch.setattr(catalog, "_COL_MIN_ROWS", 1)
        monkeypatch.setattr(catalog, "_IMPLICIT_ROWS", 1)
        monkeypatch.setattr(winograd, "_CHUNK_VALUES", 1)
        monkeypatch.setattr(winograd, "_CHUNK_MIN_TILES", 1)
    return request.param


@pytest.mark.parametrize(
    "k, s, p, shape",
    [
        (3, 1, 1, (8, 16, 12, 12)),
        (5, 2, 2, (4, 8, 15, 13)),
        (11, 4, 2, (2, 3, 35, 35)),
        (1, 1, 0, (4, 32, 6, 6)),
        (3, 1, 0, (3, 16, 9, 8)),
        (3, 1, 2, (2, 20, 7, 5)),
    ],
)
def test_algorithms_agree_in_float32(k, s, p, shape, chunking):
    rng = np.random.default_rng(1)
    layer = nn.Conv2d(shape[1], 24, k, stride=s, padding=p)
    x = rng.standard_normal(physical(shape)).astype(np.float32)
    w = rng.standard_normal((24, k, k, shape[1])).astype(np.float32) * 0.1
    b = rng.standard_normal(24).astype(np.float32)
    dy = rng.standard_normal(physical(layer.output_shape([shape]))).astype(np.float32)
    offered = algorithms(layer, shape)["forward"]
    assert ("winograd" in offered) == (k == 3 and s == 1)
    results = [run(layer, shape, a, x, w, b, dy) for a in offered]
    for ref, other in zip(results[0], results[1]):
        scale = np.abs(ref).max()
        np.testing.assert_allclose(other, ref, rtol=0, atol=2e-5 * scale)


@pytest.mark.parametrize("shape, k", [((8, 32, 4, 4), 48), ((5, 16, 7, 6), 16)])
def test_winograd_whole_batch_chunk_same_bits_side_by_side_or_in_turn(shape, k, monkeypatch):
    """Small maps (a chunk a lane) run as one chunk of the whole batch: pieces of tiles and planes, pulled
    by the lanes; the same bits whether the lanes run side by side or in turn, and im2col's result."""
    from vmem import threads

    monkeypatch.setattr(lanes, "_SPLIT_MIN", 1)
    n, c, h, w = shape
    assert winograd.layout(n, c, h, w, k, h, w, "backward_filter", 2)[2] == []
    rng = np.random.default_rng(4)
    layer = nn.Conv2d(c, k, 3, padding=1)
    x = rng.standard_normal(physical(shape)).astype(np.float32)
    wt = rng.standard_normal((k, 3, 3, c)).astype(np.float32) * 0.1
    b = rng.standard_normal(k).astype(np.float32)
    dy = rng.standard_normal(physical(layer.output_shape([shape]))).astype(np.float32)
    pinned, outs = threads.BUDGET.fixed, {}
    try:
        for budget in (1, 2):
            threads.BUDGET.fix(budget)
            with threads.BUDGET.limit():
                outs[budget] = run(layer, shape, "winograd", x, wt, b, dy)
    finally:
        threads.BUDGET.fix(pinned)
        threads.LANE.shutdown()
    ref = run(layer, shape, "im2col", x, wt, b, dy)
    for one, two, r in zip(outs[1], outs[2], ref):
        np.testing.assert_array_equal(one, two)
        np.testing.assert_allclose(two, r, rtol=0, atol=2e-5 * np.abs(r).max())


def test_implicit_needs_much_less_workspace_than_im2col():
    layer = nn.Conv2d(64, 64, 3, padding=1)
    shape = (64, 64, 32, 32)
    for p in PASSES:
        big = workspace_bytes(layer, shape, p, "im2col", 4)
        small = workspace_bytes(layer, shape, p, "implicit", 4)
        assert big >= 2 * small > 0
    # im2col: two lanes, each with a chunk of two images (2,048 rows of 576 columns) and their padded copy
    assert workspace_bytes(layer, shape, "forward", "im2col", 4) == 2 * 4 * (2048 * 576 + 2 * 34 * 34 * 64)
    # backward-filter adds lane 1's partial dW and, in each lane (16 chunks each), a product to add in
    assert (
        workspace_bytes(layer, shape, "backward_filter", "im2col", 4)
        == 2 * 4 * (2048 * 576 + 2 * 34 * 34 * 64) + 3 * 4 * 64 * 576
    )
    assert workspace_bytes(layer, shape, "forward", "implicit", 4) == 4 * (4 * 32 * 32) * (64 + 64)  # 4 images a step


def test_implicit_workspace_does_not_grow_with_the_batch():
    layer = nn.Conv2d(64, 64, 3, padding=1)
    sizes = {workspace_bytes(layer, (n, 64, 32, 32), "forward", "implicit", 4) for n in (4, 64, 256)}
    assert len(sizes) == 1


def test_gemm_convolution_needs_no_workspace():
    layer = nn.Conv2d(64, 32, 1)
    assert all(workspace_bytes(layer, (8, 64, 7, 7), p, a, 4) == 0 for p in PASSES for a in ALGORITHMS)


def test_unknown_algorithm_is_named():
    with pytest.raises(ValueError, match="'fft'"):
        workspace_bytes(nn.Conv2d(3, 4, 3), (1, 3, 8, 8), "forward", "fft", 4)


def test_winograd_is_offered_for_3x3_stride_1_with_enough_channels():
    assert algorithms(nn.Conv2d(64, 64, 3, padding=1), (8, 64, 16, 16))["forward"] == list(ALGORITHMS)
    assert "winograd" not in algorithms(nn.Conv2d(3, 64, 3, padding=1), (8, 3, 16, 16))["forward"]  # too thin
    assert "winograd" not in algorithms(nn.Conv2d(64, 64, 3, stride=2, padding=1), (8, 64, 16, 16))["forward"]
    assert "winograd" not in algorithms(nn.Conv2d(64, 64, 5, padding=2), (8, 64, 16, 16))["forward"]


def test_winograd_on_a_convolution_it_cannot_compute_names_the_layer():
    layer = nn.Conv2d(16, 16, 3, stride=2, padding=1)
    layer.name = "conv7"
    with pytest.raises(ValueError, match="conv7.*winograd.*stride 1"):
        workspace_bytes(layer, (2, 16, 8, 8), "forward", "winograd", 4)


def test_winograd_needs_less_workspace_than_im2col_on_a_wide_layer():
    layer = nn.Conv2d(128, 128, 3, padding=1)
    shape = (64, 128, 16, 16)
    for p in PASSES:
        assert 0 < workspace_bytes(layer, shape, p, "winograd", 4) < workspace_bytes(layer, shape, p, "im2col", 4)


@pytest.mark.skipif(winograd._lib is None, reason="vmem's native kernels are not built")
@pytest.mark.parametrize(
    "shape, pad", [((3, 7, 9, 20), (1, 1)), ((2, 4, 4, 70), (1, 1)), ((2, 6, 5, 17), (0, 2)), ((1, 8, 8, 64), (2, 0))]
)
def test_winograd_native_transforms_match_their_numpy_references(shape, pad, monkeypatch):
    """Tile transforms within float32 rounding (the C sums in another order); filter transforms bit for
    bit; odd sizes, border tiles and channel counts that are not a multiple of the C code's blocks."""
    rng = np.random.default_rng(0)
    nb, h, w, c = shape
    k = 24
    ho, wo = h + 2 * pad[0] - 2, w + 2 * pad[1] - 2
    th, tw = -(-ho // 2), -(-wo // 2)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal((nb, ho, wo, k)).astype(np.float32)
    wt = rng.standard_normal((k, 3, 3, c)).astype(np.float32)
    bias = rng.standard_normal(k).astype(np.float32)
    tiles = nb * th * tw

    def transforms():
        v = np.full(16 * winograd._plane_stride(tiles, c), np.nan, np.float32)
        m = np.full(16 * winograd._plane_stride(tiles, k), np.nan, np.float32)
        u = np.full(16 * winograd._plane_stride(k, c), np.nan, np.float32)
        t = np.empty(12 * k * c, np.float32)
        y = np.full((nb, ho, wo, k), np.nan, np.float32)
        dw = np.full_like(wt, np.nan)
        out = {
            "v": winograd.input_transform(x, v, th, tw, pad).copy(),
            "m": winograd.output_adjoint(dy, m, th, tw).copy(),
            "u": winograd.filter_transform(wt, u, t).copy(),
            "u_flipped": winograd.filter_transform(wt, u, t, flip=True).copy(),
        }
        winograd.filter_gradient(u, t, dw)
        m[...] = rng_m
        winograd.output_transform(m, y, th, tw, bias)
        out.update(dw=dw, y=y)
        return out

    rng_m = np.random.default_rng(1).standard_normal(16 * winograd._plane_stride(tiles, k)).astype(np.float32)
    native = transforms()
    monkeypatch.setattr(winograd, "_lib", None)
    reference = transforms()
    for name in ("u", "u_flipped", "dw"):
        np.testing.assert_array_equal(native[name], reference[name], err_msg=name)
    for name in ("v", "m", "y"):
        assert np.isfinite(native[name]).all(), name
        np.testing.assert_allclose(
            native[name], reference[name], rtol=0, atol=1e-5 * np.abs(reference[name]).max(), err_msg=name
        )


@pytest.mark.parametrize(
    "cin, cout, groups, k, s, p", [(6, 6, 6, 3, 1, 1), (4, 8, 4, 3, 2, 1), (6, 4, 2, 3, 1, 1), (8, 8, 2, 1, 1, 0)]
)
def test_a_grouped_convolution_is_its_groups_convolved_apart(cin, cout, groups, k, s, p):
    """Forward, input and filter gradients of a grouped (and depthwise) convolution equal those of each group
    run as a convolution of its own (the plain algorithms), put together; only the implicit algorithm is offered."""
    rng = np.random.default_rng(0)
    shape = (3, cin, 7, 6)
    layer = nn.Conv2d(cin, cout, k, stride=s, padding=p, groups=groups)
    assert algorithms(layer, shape) == {pass_: ["implicit"] for pass_ in PASSES}
    x = rng.standard_normal(physical(shape)).astype(np.float32)
    w = rng.standard_normal((cout, k, k, cin // groups)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    dy = rng.standard_normal(physical(layer.output_shape([shape]))).astype(np.float32)
    y, dx, dw, db = run(layer, shape, "implicit", x, w, b, dy)
    cg, kg = cin // groups, cout // groups
    for q in range(groups):
        one = nn.Conv2d(cg, kg, k, stride=s, padding=p)
        ins, outs = slice(q * cg, (q + 1) * cg), slice(q * kg, (q + 1) * kg)
        want = run(
            one, (3, cg, 7, 6), "im2col", np.ascontiguousarray(x[..., ins]), w[outs], b[outs],
            np.ascontiguousarray(dy[..., outs]),
        )  # fmt: skip
        np.testing.assert_allclose(y[..., outs], want[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(dx[..., ins], want[1], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(dw[outs], want[2], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(db[outs], want[3], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("groups, d, s, p", [(1, 2, 1, 2), (1, (2, 3), 2, 1), (3, 2, 1, 1)])
def test_a_dilated_convolution_is_the_dense_one_with_zeros_between_its_taps(groups, d, s, p):
    """Forward and input gradient equal those of a convolution whose (dilated-size) filters hold the taps
    with zeros between (run by im2col); the filter gradient is that one's at the taps. Only the implicit
    algorithm is offered."""
    rng = np.random.default_rng(1)
    cin, cout, k, shape = 6, 6, 3, (2, 6, 9, 8)
    layer = nn.Conv2d(cin, cout, k, stride=s, padding=p, groups=groups, dilation=d)
    assert algorithms(layer, shape) == {pass_: ["implicit"] for pass_ in PASSES}
    dh, dw_ = layer.dilation
    eh, ew = layer.extent
    x = rng.standard_normal(physical(shape)).astype(np.float32)
    w = rng.standard_normal((cout, k, k, cin // groups)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    dy = rng.standard_normal(physical(layer.output_shape([shape]))).astype(np.float32)
    y, dx, dw, db = run(layer, shape, "implicit", x, w, b, dy)
    dense = np.zeros((cout, eh, ew, cin // groups), np.float32)
    dense[:, ::dh, ::dw_] = w
    wide = nn.Conv2d(cin, cout, (eh, ew), stride=s, padding=p, groups=groups)
    want = run(wide, shape, "implicit" if groups > 1 else "im2col", x, dense, b, dy)
    np.testing.assert_allclose(y, want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx, want[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw, want[2][:, ::dh, ::dw_], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, want[3], rtol=1e-4, atol=1e-5)

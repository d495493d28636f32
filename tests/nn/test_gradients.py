"""Every layer's backward against finite differences in float64, over several shapes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.nn.gradcheck import check_layer
import vmem
from vmem import nn

CONV_CASES = [
    # (in_channels, out_channels, kernel, stride, padding, input NCHW)
    (3, 4, 3, 1, 1, (2, 3, 5, 5)),
    (2, 3, 3, 2, 1, (2, 2, 7, 6)),  # odd sizes, stride 2
    (3, 2, (3, 2), (2, 1), (0, 1), (1, 3, 6, 5)),  # rectangular
    (4, 5, 1, 1, 0, (2, 4, 3, 3)),  # 1x1: plain GEMM
    (2, 3, 5, 3, 2, (2, 2, 9, 8)),  # 5x5 stride 3
    (1, 2, 2, 1, 0, (1, 1, 4, 3)),
]


@pytest.mark.parametrize(
    "algo",
    ["im2col", "implicit", ("im2col", "implicit"), ("implicit", "im2col")],
    ids=["im2col", "implicit", "data-im2col-filter-implicit", "data-implicit-filter-im2col"],
)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"k{c[2]}s{c[3]}p{c[4]}")
def test_conv2d(case, algo):
    cin, cout, k, s, p, shape = case
    checked = check_layer(nn.Conv2d(cin, cout, k, stride=s, padding=p), [shape], algo=algo)
    assert checked == ["x0", "weight", "bias"]


@pytest.mark.parametrize(
    "algo",
    ["winograd", ("winograd", "im2col"), ("im2col", "winograd")],
    ids=["winograd", "data-winograd-filter-im2col", "data-im2col-filter-winograd"],
)
@pytest.mark.parametrize(
    "case",
    [(3, 4, 3, 1, 1, (2, 3, 5, 5)), (2, 3, 3, 1, 0, (2, 2, 6, 5)), (2, 2, 3, 1, 2, (1, 2, 4, 3))],
    ids=["p1-odd", "p0", "p2"],
)
def test_conv2d_winograd(case, algo, monkeypatch):
    """Winograd F(2x2, 3x3) in float64 (its NumPy transforms), also in chunks of one image, and as one
    chunk of the whole batch split by tiles and planes."""
    from vmem.device.hostconv import winograd

    cin, cout, k, s, p, shape = case
    layer = nn.Conv2d(cin, cout, k, stride=s, padding=p)
    assert check_layer(layer, [shape], algo=algo) == ["x0", "weight", "bias"]
    monkeypatch.setattr(winograd, "_CHUNK_VALUES", 1)
    monkeypatch.setattr(winograd, "_CHUNK_MIN_TILES", 1)
    check_layer(layer, [shape], algo=algo)
    # and as one chunk of the whole batch, split by tiles and planes (small maps worth two lanes)
    from vmem.nn import lanes

    monkeypatch.setattr(lanes, "_SPLIT_MIN", 1)
    monkeypatch.setattr(winograd, "_CHUNK_VALUES", 1 << 30)
    ho, wo = layer.output_shape([shape])[2:]
    assert winograd.layout(shape[0], cin, shape[2], shape[3], cout, ho, wo, "forward", 2)[2] == []
    check_layer(layer, [shape], algo=algo)


@pytest.mark.parametrize("algo", ["im2col", "implicit"])
@pytest.mark.parametrize("case", CONV_CASES[:3], ids=lambda c: f"k{c[2]}s{c[3]}p{c[4]}")
def test_conv2d_in_tiny_chunks(case, algo, monkeypatch):
    from vmem.device.hostconv import catalog

    monkeypatch.setattr(catalog, "_COL_VALUES", 8)
    monkeypatch.setattr(catalog, "_COL_MIN_ROWS", 1)
    monkeypatch.setattr(catalog, "_IMPLICIT_ROWS", 1)
    cin, cout, k, s, p, shape = case
    check_layer(nn.Conv2d(cin, cout, k, stride=s, padding=p), [shape], algo=algo)


@pytest.mark.parametrize(
    "cin, cout, groups, k, s, p, shape",
    [
        (4, 4, 4, 3, 1, 1, (2, 4, 5, 5)),  # depthwise
        (4, 8, 4, 3, 2, 1, (2, 4, 6, 5)),  # depthwise, two filters a channel, strided
        (6, 4, 2, 3, 1, 0, (1, 6, 5, 4)),  # two groups of three channels
        (6, 6, 3, 1, 1, 0, (2, 6, 3, 3)),  # grouped 1x1 (ResNeXt): not the plain GEMM
    ],
)
def test_grouped_conv2d(cin, cout, groups, k, s, p, shape):
    layer = nn.Conv2d(cin, cout, k, stride=s, padding=p, groups=groups)
    assert check_layer(layer, [shape], algo="implicit") == ["x0", "weight", "bias"]


@pytest.mark.parametrize("groups, d, s, p", [(1, 2, 1, 2), (1, (1, 3), 2, 1), (2, 2, 1, 1)])
def test_dilated_conv2d(groups, d, s, p):
    layer = nn.Conv2d(4, 4, 3, stride=s, padding=p, groups=groups, dilation=d)
    assert check_layer(layer, [(2, 4, 8, 9)], algo="implicit") == ["x0", "weight", "bias"]


def test_conv2d_without_bias():
    assert check_layer(nn.Conv2d(2, 3, 3, padding=1, bias=False), [(2, 2, 4, 4)]) == ["x0", "weight"]


@pytest.mark.parametrize("shape", [(3, 5), (1, 7), (4, 1)])
def test_linear(shape):
    assert check_layer(nn.Linear(shape[1], 3), [shape]) == ["x0", "weight", "bias"]


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 7)])
def test_relu(shape):
    check_layer(nn.ReLU(), [shape])


@pytest.mark.parametrize(
    "perm, shape", [((0, 2, 1), (2, 3, 4)), ((0, 3, 1, 2), (2, 3, 4, 5)), ((0, 2, 3, 1), (2, 3, 4, 5))]
)
def test_transpose(perm, shape):
    check_layer(nn.Transpose(perm), [shape])  # 4-D: permuted through the stored channels-last order


@pytest.mark.parametrize("layer", [nn.Sub, nn.Div], ids=["sub", "div"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 7)])
def test_sub_and_div(layer, shape):
    stored = nn.physical(shape)
    b = np.random.default_rng(1).uniform(0.5, 2.0, stored) * np.where(np.arange(stored[-1]) % 2, 1, -1)
    assert check_layer(layer(), [shape, shape], inputs={1: b}) == ["x0", "x1"]  # divisors away from zero


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 7)])
def test_erf(shape):
    check_layer(nn.Erf(), [shape])


@pytest.mark.parametrize("approximate", nn.GELU.APPROXIMATIONS)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 7)])
def test_gelu(shape, approximate):
    check_layer(nn.GELU(approximate), [shape])


@pytest.mark.parametrize("op", nn.ConstantOp.OPS)
@pytest.mark.parametrize("shape, value", [((2, 3, 4, 5), (3, 1, 1)), ((3, 7), (7,)), ((2, 3, 4), ())])
def test_constant_op(op, shape, value):
    """The constant is a buffer (made random by the check, non-zero): only the input has a gradient."""
    assert check_layer(nn.ConstantOp(op, np.full(value, 0.7)), [shape]) == ["x0"]


@pytest.mark.parametrize("shape, value", [((2, 6, 4), (6, 4)), ((2, 3, 4, 5), (3, 1, 1)), ((3, 7), (1, 7))])
@pytest.mark.parametrize("op", nn.ConstantOp.OPS)
def test_a_trainable_constant_is_a_parameter(shape, value, op):
    """A learned position table added to a sequence, a layer scale multiplying a block's output: the value's
    gradient is summed over the axes it broadcasts along; multiplying or dividing, backward reads the input
    (and the layer is not in place)."""
    init = np.random.default_rng(2).uniform(0.5, 1.5, value)
    layer = nn.ConstantOp(op, init, trainable=True)
    assert check_layer(layer, [shape]) == ["x0", "value"]
    assert (layer.needs == {"x"} and not layer.inplace) == (op in ("mul", "div"))


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 7)])
def test_clip(shape):
    check_layer(nn.Clip(-0.5, 0.7), [shape])  # ReLU6's shape: both bounds crossed by the standard normal input


@pytest.mark.parametrize(
    "k, s, p, ceil, shape",
    [
        (2, 2, 0, False, (2, 3, 4, 6)),
        (3, 2, 0, False, (2, 2, 7, 7)),  # overlapping windows (AlexNet)
        (3, 2, 0, True, (1, 2, 8, 8)),  # ceil mode (GoogLeNet)
        (3, 1, 1, False, (2, 2, 5, 4)),  # padded (inception pool branch)
        (2, 2, 0, True, (1, 2, 5, 5)),  # odd size, partial last window
    ],
)
@pytest.mark.parametrize("layer", [nn.MaxPool2d, nn.AvgPool2d])
def test_pooling(layer, k, s, p, ceil, shape):
    check_layer(layer(k, stride=s, padding=p, ceil_mode=ceil), [shape])


@pytest.mark.parametrize("pads", [(0, 1, 1, 0), (2, 0, 1, 3)])
def test_pad2d(pads):
    check_layer(nn.Pad2d(pads, value=0.5), [(2, 3, 4, 5)])


@pytest.mark.parametrize("layer", [nn.MaxPool2d, nn.AvgPool2d])
@pytest.mark.parametrize("ceil", [False, True])
def test_dilated_pooling(layer, ceil):
    check_layer(layer(2, stride=2, padding=1, ceil_mode=ceil, dilation=(2, 3)), [(2, 2, 7, 9)])


def test_avgpool_excluding_padding():
    check_layer(nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), [(2, 2, 5, 5)])


@pytest.mark.parametrize("shape", [(4, 3, 2, 3), (2, 5, 3, 3)])
@pytest.mark.parametrize("train", [True, False])
def test_batchnorm(shape, train):
    assert check_layer(nn.BatchNorm2d(shape[1]), [shape], train=train) == ["x0", "weight", "bias"]


@pytest.mark.parametrize("train", [True, False])
def test_dropout(train):
    check_layer(nn.Dropout(0.3), [(3, 2, 4, 4)], train=train)


def test_flatten():
    check_layer(nn.Flatten(), [(2, 3, 4, 5)])


@pytest.mark.parametrize("n", [2, 3])
def test_add(n):
    assert check_layer(nn.Add(), [(2, 3, 4, 4)] * n) == [f"x{i}" for i in range(n)]


def test_concat():
    check_layer(nn.Concat(), [(2, 3, 4, 4), (2, 1, 4, 4), (2, 5, 4, 4)])
    check_layer(nn.Concat(), [(3, 2), (3, 4)])


def test_softmax_cross_entropy():
    loss = nn.SoftmaxCrossEntropy()
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 4))
    labels = rng.integers(0, 4, 5)
    probs = np.empty_like(logits)
    d = np.empty_like(logits)
    value = loss.forward(np, logits, labels, probs)
    loss.backward(np, probs, labels, d)
    ref = -np.mean(np.log(np.exp(logits)[np.arange(5), labels] / np.exp(logits).sum(1)))
    assert value == pytest.approx(ref, rel=1e-12)
    eps = 1e-6
    for idx in [(0, 0), (2, 3), (4, 1)]:
        up, down = logits.copy(), logits.copy()
        up[idx] += eps
        down[idx] -= eps
        num = (loss.forward(np, up, labels, probs.copy()) - loss.forward(np, down, labels, probs.copy())) / (2 * eps)
        assert d[idx] == pytest.approx(num, abs=1e-7)


# -- sequence layers (float64 finite differences) ----------------------------------------------------
def test_embedding_gives_the_weight_a_gradient_and_the_ids_none():
    ids = np.array([[0, 3, 3, 1], [2, 0, 4, 4]])
    assert check_layer(nn.Embedding(5, 3), [(2, 4)], inputs={0: ids}, no_grad=(0,)) == ["weight"]


@pytest.mark.parametrize("index", [0, 2])
def test_split(index):
    assert check_layer(nn.Split(3, index, axis=2), [(2, 4, 6)]) == ["x0"]


@pytest.mark.parametrize(
    "shapes", [[(2, 3, 4), (2, 3, 4)], [(2, 5, 4), (2, 1, 4)], [(1, 3, 4), (2, 3, 1)], [(2, 3), (2, 3), (2, 3)]]
)
def test_broadcasting_add(shapes):
    assert check_layer(nn.Add(), shapes) == [f"x{i}" for i in range(len(shapes))]


@pytest.mark.parametrize(
    "layer, shape",
    [
        (nn.Reshape((6,)), (2, 3, 2)),
        (nn.ExpandDims(1), (2, 5)),
        (nn.ExpandDims(2), (2, 3)),
        (nn.Reshape((1, 3, 4, 5)), (2, 3, 4, 5)),  # a 4-D map (stored channels-last) to a 5-D tensor: a copy
        (nn.Reshape((2, 5, 3)), (2, 5, 3, 2)),  # and back from a 3-D one
    ],
)
def test_reshapes(layer, shape):
    check_layer(layer, [shape])


@pytest.mark.parametrize(
    "axis, shapes",
    [(1, [(2, 3, 4), (2, 2, 4)]), (2, [(2, 3, 4), (2, 3, 1), (2, 3, 2)]), (1, [(2, 3, 4, 4), (2, 2, 4, 4)])],
)
def test_concat_on_any_axis(axis, shapes):
    check_layer(nn.Concat(axis=axis), shapes)


@pytest.mark.parametrize("axis, shape", [(-1, (2, 3, 5)), (1, (2, 4, 3)), (1, (3, 6))])
def test_softmax(axis, shape):
    check_layer(nn.Softmax(axis=axis), [shape])


@pytest.mark.parametrize(
    "transpose_b, shapes",
    [
        (False, [(2, 3, 4), (2, 4, 5)]),
        (True, [(2, 3, 4), (2, 5, 4)]),
        (False, [(2, 3, 1, 2, 4), (2, 1, 2, 4, 3)]),  # leading axes broadcast both ways
        (True, [(2, 1, 1, 2, 4), (2, 2, 3, 5, 4)]),
    ],
)
def test_batched_matmul(transpose_b, shapes):
    assert check_layer(nn.MatMul(transpose_b), shapes) == ["x0", "x1"]


def test_identity():
    check_layer(nn.Identity(), [(2, 3, 4)])


@pytest.mark.parametrize("axes, shape", [((1,), (2, 3, 4)), ((-1, 1), (2, 3, 4)), ((2, 4), (2, 3, 2, 4, 2))])
def test_mean(axes, shape):
    check_layer(nn.Mean(axes), [shape])


@pytest.mark.parametrize(
    "indices, axis, shape", [([2, 0, 2], 1, (2, 3, 4)), ([1], -1, (2, 3, 2)), ([0, 1], 2, (3, 5, 2))]
)
def test_take(indices, axis, shape):
    check_layer(nn.Take(indices, axis), [shape])  # a position taken twice: its gradient summed


def test_linear_over_a_sequence():
    assert check_layer(nn.Linear(4, 3), [(2, 5, 4)]) == ["x0", "weight", "bias"]


@pytest.mark.parametrize("shape", [(3, 6), (2, 4, 5)])
def test_layernorm(shape):
    assert check_layer(nn.LayerNorm(shape[-1]), [shape]) == ["x0", "weight", "bias"]


def test_length_mask():
    ids = np.array([[3, 4, 0, 0], [5, 0, 0, 0]])
    check_layer(nn.LengthMask(pad=0, value=-3.0), [(2, 4), (2, 4)], inputs={1: ids}, no_grad=(1,))


@pytest.mark.parametrize("shape", [(3, 4), (3, 2, 5)])
def test_step_mask(shape):
    """A recurrence's step over samples of lengths 0, 2 and 5 at step 1: the first sample's state passes
    through (its gradient to the old state), the others' take the new one."""
    lengths = np.array([0, 2, 5])
    assert check_layer(nn.StepMask(1), [shape, shape, shape[:1]], inputs={2: lengths}, no_grad=(2,)) == ["x0", "x1"]
    with pytest.raises(vmem.errors.ShapeError, match="one per sample"):
        nn.StepMask(1).output_shape([shape, shape, (shape[0], 1)])


@pytest.mark.parametrize("shape", [(3, 4), (2, 5)])
def test_sigmoid_tanh_mul(shape):
    check_layer(nn.Sigmoid(), [shape])
    check_layer(nn.Tanh(), [shape])
    check_layer(nn.Mul(), [shape, shape])


def test_four_dimensional_tensors_are_refused_where_an_axis_would_be_ambiguous():
    from vmem.errors import ShapeError

    for layer, shapes in [
        (nn.Mean((2,)), [(2, 3, 4, 4)]),
        (nn.Take([0], 2), [(2, 3, 4, 4)]),
        (nn.Softmax(1), [(2, 3, 4, 4)]),
        (nn.Split(2, 0, axis=2), [(2, 3, 4, 4)]),
        (nn.Concat(axis=2), [(2, 3, 4, 4)] * 2),
        (nn.Linear(4, 2), [(2, 3, 4, 4)]),
    ]:
        with pytest.raises(ShapeError, match="4"):
            layer.output_shape(shapes)


@pytest.mark.parametrize("size", [1, 3, 4, 5])
def test_local_response_norm(size):
    """AlexNet's LRN (ONNX's window: (size - 1) // 2 channels before, the rest after), even sizes too."""
    check_layer(nn.LocalResponseNorm(size, alpha=0.3, beta=0.75, k=2.0), [(2, 6, 3, 4)])


def test_local_response_norm_is_onnx_s_formula():
    """Against ONNX's definition, written out channel by channel (NCHW)."""
    from vmem.nn import Ctx, physical

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 3, 3))
    size, alpha, beta, k = 4, 0.5, 0.75, 1.5
    want = np.empty_like(x)
    for c in range(7):
        lo, hi = max(0, c - (size - 1) // 2), min(6, c + size // 2)
        want[:, c] = x[:, c] / (k + alpha / size * (x[:, lo : hi + 1] ** 2).sum(axis=1)) ** beta
    layer = nn.LocalResponseNorm(size, alpha=alpha, beta=beta, k=k)
    y = np.empty(physical(x.shape))
    layer.forward(Ctx(xp=np), [np.ascontiguousarray(x.transpose(0, 2, 3, 1))], y)
    assert np.allclose(y.transpose(0, 3, 1, 2), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("cmp", nn.Select.CMPS)
def test_select_gives_its_constants_and_no_gradient(cmp):
    """Finite differences of a piecewise-constant output are zero (away from the threshold): nothing flows."""
    layer = nn.Select(cmp, 0.25, -1e4, np.arange(4.0))
    assert check_layer(layer, [(2, 3, 4)], inputs={0: np.linspace(-2, 2, 24).reshape(2, 3, 4) + 0.01}) == ["x0"]
    x = np.array([[0.0, 0.25, np.nan, -1.0]])
    y = np.empty_like(x)
    nn.Select(cmp, 0.25, -np.inf, np.arange(4.0)).forward(_ctx(), [x], y)
    holds = {
        ">": x > 0.25,
        "<": x < 0.25,
        ">=": x >= 0.25,
        "<=": x <= 0.25,
        "==": x == 0.25,
        "!=": x != 0.25,
        "isnan": np.isnan(x),
        "notnan": ~np.isnan(x),
    }[cmp]
    np.testing.assert_array_equal(y, np.where(holds, -np.inf, np.arange(4.0)))


def _ctx():
    from vmem.nn import Ctx

    return Ctx(xp=np, params={}, grads={}, aux={}, train=False)


@pytest.mark.parametrize("shape, to", [((2, 1, 4), (3, 4)), ((2, 3, 1, 5, 1), (3, 2, 5, 4)), ((3, 1), (5,))])
def test_expand(shape, to):
    assert check_layer(nn.Expand(to), [shape]) == ["x0"]


def test_select_of_nan_zeroes_nan_and_passes_the_gradient_elsewhere():
    """``Select("isnan", 0, 0.0, None)`` (attention's NaN-to-zero after a softmax): NaN becomes 0, nothing
    else changes, and the gradient passes wherever the input is kept."""
    layer = nn.Select("isnan", 0, 0.0, None)
    assert check_layer(layer, [(2, 3, 4)]) == ["x0"]
    x = np.array([[np.nan, 1.5, -np.inf]])
    y = np.empty_like(x)
    layer.forward(_ctx(), [x], y)
    np.testing.assert_array_equal(y, [[0.0, 1.5, -np.inf]])
    dx = np.empty_like(x)
    layer.backward(_ctx(), np.ones_like(x), [x], None, [dx])
    np.testing.assert_array_equal(dx, [[0.0, 1.0, 1.0]])


@pytest.mark.parametrize("if_true, if_false", [(None, -0.5), (0.5, None)])
def test_select_passes_the_gradient_where_it_chooses_the_input(if_true, if_false):
    """A bound written out (``Where(x < lo, lo, x)``): the gradient flows where x is chosen, nowhere else."""
    layer = nn.Select("<", 0.1, if_true, if_false)
    assert layer.needs == frozenset({"x"})
    assert check_layer(layer, [(2, 3, 4)], inputs={0: np.linspace(-2, 2, 24).reshape(2, 3, 4) + 0.01}) == ["x0"]
    with pytest.raises(ValueError, match="at most one"):
        nn.Select("<", 0.0, None, None)


@pytest.mark.parametrize(
    "shapes",
    [
        [(2, 3, 4, 5), (2, 3, 1, 1)],  # a squeeze-and-excitation gate over its map
        [(2, 3, 1, 1), (2, 3, 4, 5)],  # the same, the other way round
        [(2, 3, 4, 5), (1, 3, 4, 5)],  # a tensor shared by every sample
        [(2, 5, 7), (2, 5, 1)],
    ],
    ids=["gate", "gate-first", "batch", "rows"],
)
@pytest.mark.parametrize("layer", [nn.Mul, nn.Sub, nn.Div], ids=["mul", "sub", "div"])
def test_products_of_computed_tensors_broadcast(layer, shapes):
    """Mul, Sub and Div of two computed tensors broadcast axes of length 1, each input's gradient summed
    over the axes it was stretched along; shapes that do not broadcast are refused by name."""
    stored = nn.physical(shapes[1])
    b = np.random.default_rng(1).uniform(0.5, 2.0, stored) * np.where(np.arange(stored[-1]) % 2, 1, -1)
    assert check_layer(layer(), shapes, inputs={1: b}) == ["x0", "x1"]
    assert layer().output_shape(shapes) == tuple(max(a, c) for a, c in zip(*shapes))
    with pytest.raises(vmem.errors.ShapeError, match=f"cannot {layer.verb} shapes"):
        layer().output_shape([(2, 3, 4), (2, 2, 4)])


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("shape, value, axis", [((2, 5, 4), (1, 4), 1), ((3, 4, 6), (4, 2), 2)])
def test_tokens_joined_to_a_sequence(shape, value, axis, first):
    """Learned tokens joined to every sample's sequence (ViT's class token): the input's gradient is its part
    of the output's, the tokens' their part summed over the batch; 4-D maps and mismatched shapes refused."""
    layer = nn.Tokens(np.random.default_rng(3).standard_normal(value), axis=axis, first=first)
    assert check_layer(layer, [shape]) == ["x0", "value"]
    with pytest.raises(vmem.errors.ShapeError, match="cannot join tokens"):
        nn.Tokens(np.zeros((1, 3)), axis=1).output_shape([(2, 5, 4)])
    with pytest.raises(vmem.errors.ShapeError, match="not 4-D maps"):
        nn.Tokens(np.zeros((1, 4, 4)), axis=1).output_shape([(2, 3, 4, 4)])


@pytest.mark.parametrize("exponent", [3.0, 2.0, 0.5, -1.0, 1.0, [[1.0, 2.0, 3.0, 0.5]]])
def test_power(exponent):
    """``nn.Power``: x ** exponent (one number, or an array broadcast along the other axes), on positive
    inputs (where every exponent's power is defined), against finite differences."""
    x = np.linspace(0.5, 2.0, 24).reshape(2, 3, 4)
    assert check_layer(nn.Power(exponent), [(2, 3, 4)], inputs={0: x}) == ["x0"]
    y = np.empty_like(x)
    nn.Power(exponent).forward(_ctx_with(nn.Power(exponent), x.shape), [x], y)
    np.testing.assert_allclose(y, x ** np.asarray(exponent), rtol=1e-15)
    with pytest.raises(ValueError, match="not finite"):
        nn.Power(np.inf)


def _ctx_with(layer, shape):
    from vmem.nn import Ctx

    specs = layer.param_specs([shape])
    return Ctx(xp=np, params={k: s.value for k, s in specs.items()}, grads={}, aux={}, train=False)

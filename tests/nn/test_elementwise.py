"""Sigmoid, Tanh and Mul (the element-wise ops of gated and attention layers): backward against finite
differences in float64, what backward needs, and lossless offload and in-place use in a gated network."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from tests.lossless import all_equal, weights_under
from tests.nn.gradcheck import check_layer
from vmem import nn
from vmem.errors import ShapeError


@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 4, 5)])
@pytest.mark.parametrize("make", [nn.Sigmoid, nn.Tanh], ids=["sigmoid", "tanh"])
def test_sigmoid_and_tanh_backward(make, shape):
    assert check_layer(make(), [shape]) == ["x0"]


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 4, 4)])
def test_mul_backward(shape):
    assert check_layer(nn.Mul(), [shape, shape]) == ["x0", "x1"]


def test_what_backward_needs_and_shapes():
    assert nn.Sigmoid.needs == nn.Tanh.needs == frozenset({"y"}) and nn.Mul.needs == frozenset({"x"})
    assert nn.Sigmoid.inplace and nn.Tanh.inplace and not nn.Mul.inplace
    with pytest.raises(ShapeError, match="multiply"):
        nn.Mul().output_shape([(2, 3), (2, 4)])


def gated(image=8):
    """conv -> tanh, gated by sigmoid(conv) through an element-wise product (a GRU/LSTM-style gate)."""
    g = vmem.Graph(input_shape=(3, image, image), name="gated")
    a = g.add(nn.Tanh(), g.add(nn.Conv2d(3, 6, 3, padding=1), g.input))
    b = g.add(nn.Sigmoid(), g.add(nn.Conv2d(3, 6, 3, padding=1), g.input))
    m = g.add(nn.Mul(), a, b)
    g.add(nn.Linear(6 * image * image, 10), g.add(nn.Flatten(), m))
    return g


def test_the_gate_runs_in_place_and_offload_is_lossless():
    program = gated().build(4)
    assert sum(op.inplace for op in program.ops if op.kind in ("tanh", "sigmoid")) == 2
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 4)
    assert all_equal(weights_under(gated, ("baseline", "vdnn-all", "layerwise"), x, y))


@pytest.mark.parametrize("op", nn.ConstantOp.OPS)
def test_a_constant_op_combines_the_stored_map_with_its_logical_constant(op):
    """A per-channel constant (C, 1, 1) meets the channels of a map stored channels-last; the constant is the
    layer's buffer (not trained) and the network initialises it to the value given."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    value = np.array([0.5, -2.0, 4.0]).reshape(3, 1, 1)
    want = {"add": x + value, "sub": x - value, "rsub": value - x, "mul": x * value, "div": x / value}[op]
    layer = nn.ConstantOp(op, value)
    (spec,) = layer.param_specs([x.shape]).values()
    assert not spec.trainable and spec.shape == (1, 1, 1, 3)
    y = np.empty((2, 4, 5, 3))
    layer.forward(nn.Ctx(xp=np, params={"value": spec.value}), [x.transpose(0, 2, 3, 1)], y)
    np.testing.assert_allclose(y.transpose(0, 3, 1, 2), want)
    net = vmem.Sequential(nn.Flatten(), input_shape=(3, 4, 5))
    g = vmem.Graph(input_shape=(3, 4, 5))
    g.add(nn.Flatten(), g.add(nn.ConstantOp(op, value), g.input))
    params = g.init(seed=1).params
    np.testing.assert_array_equal(params["constop1.value"], spec.value.astype(np.float32))
    assert g.num_params() == 0 and net.num_params() == 0
    with pytest.raises(vmem.errors.ShapeError, match="does not broadcast"):
        nn.ConstantOp(op, np.ones((2, 3, 1, 1))).output_shape([x.shape])  # a batch axis of 2


def test_erf_without_scipy_is_the_standard_librarys(monkeypatch):
    import math

    from vmem.nn import ops

    x = np.linspace(-4, 4, 33)
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(ops.HostOps().erf(x, np.empty_like(x)), want, rtol=1e-15, atol=1e-15)
    monkeypatch.setattr(ops, "_scipy_special", lambda: None)
    np.testing.assert_array_equal(ops.HostOps().erf(x, np.empty_like(x)), want)


@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 4, 5)])
@pytest.mark.parametrize(
    "make",
    [nn.HardSigmoid, lambda: nn.HardSigmoid(0.2, 0.5), nn.HardSwish, nn.SiLU],
    ids=["hardsigmoid", "hardsigmoid-onnx", "hardswish", "silu"],
)
def test_mobilenet_and_efficientnet_activations_backward(make, shape):
    """MobileNetV3's hard-swish and hard-sigmoid and EfficientNet's SiLU, against finite differences in
    float64 (the standard normal input crosses hard-sigmoid's corners at -2.5 and 2.5 with ONNX's slope)."""
    layer = make()
    assert check_layer(layer, [shape]) == ["x0"]


def test_the_hard_activations_are_pytorchs():
    """The values PyTorch's ``nn.Hardswish``, ``nn.Hardsigmoid`` and ``nn.SiLU`` give, written out: the
    corners at -3 and 3, and what backward needs."""
    from tests.nn.gradcheck import make_ctx

    x = np.array([[-4.0, -3.0, -1.5, 0.0, 1.5, 3.0, 4.0]])
    want = {
        "hardswish": x * np.clip(x + 3, 0, 6) / 6,
        "hardsigmoid": np.clip(x + 3, 0, 6) / 6,
        "silu": x / (1 + np.exp(-x)),
    }
    for layer in (nn.HardSwish(), nn.HardSigmoid(), nn.SiLU()):
        y = np.empty_like(x)
        layer.forward(make_ctx(layer, [x.shape], np.random.default_rng(0)), [x], y)
        np.testing.assert_allclose(y, want[layer.kind], rtol=1e-15, atol=0)
    assert nn.HardSwish.needs == nn.SiLU.needs == {"x"} and nn.HardSigmoid.needs == {"y"} and nn.HardSigmoid.inplace
    with pytest.raises(ValueError, match="alpha"):
        nn.HardSigmoid(alpha=0)

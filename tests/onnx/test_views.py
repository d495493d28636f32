"""The batch axis where the model puts it (``vmem.onnx._views``): a model that transposes its batch axis away,
merges it with the heads and splits it again imports, gives onnxruntime's output and trains; an op that would
mix samples along the axis that holds the batch is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem.errors import OnnxError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

T, E, H = 3, 8, 2


def _model(nodes, inits=None, out_shape=None):
    graph = helper.make_graph(
        nodes,
        "views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", T, E])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _heads():
    """(N, T, E) -> (T, N, E) -> (T, N * H, E / H) -> (N * H, T, E / H), a softmax over each head's features,
    -> (N, H, T, E / H) -> (N, T, H, E / H) -> (N, T, E), then a linear layer: attention's moves, without it."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        helper.make_node("Reshape", ["t", "s1"], ["r"]),  # (T, N * H, d): 0 keeps T, -1 takes N * H
        helper.make_node("Transpose", ["r"], ["q"], perm=[1, 0, 2]),
        helper.make_node("Softmax", ["q"], ["p"], axis=-1),
        helper.make_node("Reshape", ["p", "s2"], ["u"]),  # (N, H, T, d)
        helper.make_node("Transpose", ["u"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["v", "s3"], ["w"]),  # (N, T, E)
        helper.make_node("MatMul", ["w", "W"], ["y"]),
    ]
    inits = {
        "s1": np.array([0, -1, E // H], np.int64),
        "s2": np.array([-1, H, T, E // H], np.int64),
        "s3": np.array([0, 0, E], np.int64),
        "W": rng.standard_normal((E, 5)).astype(np.float32),
    }
    return _model(nodes, inits)


def test_a_model_that_moves_and_merges_its_batch_axis_imports_and_gives_onnxruntimes_output():
    model = _heads()
    net = vmem.onnx.load(model)
    x = np.random.default_rng(1).standard_normal((4, T, E)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict(x), want, rtol=1e-5, atol=1e-6)
    # the moves are bookkeeping: the features split into heads (a view), the softmax, merged back, the product
    assert [type(layer).__name__ for layer in net.layers] == ["Reshape", "Softmax", "Reshape", "Linear"]


def test_it_trains():
    net = vmem.onnx.load(_heads())
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((6, T, E)).astype(np.float32), rng.integers(0, 5, (6, T))
    with vmem.Trainer(net, optimizer=vmem.optim.SGD(lr=0.5)) as trainer:
        first = trainer.step(x, y).loss
        for _ in range(5):
            last = trainer.step(x, y).loss
    assert np.isfinite(last) and last < first


@pytest.mark.parametrize(
    "node, message",
    [
        (helper.make_node("Softmax", ["t"], ["y"], axis=1), r"softmaxes along axis 1, which holds the batch"),
        (
            helper.make_node("ReduceMean", ["t"], ["y"], axes=[1], keepdims=0),
            r"averages over axis 1, which holds the batch",
        ),
    ],
)
def test_an_op_along_the_axis_that_holds_the_batch_is_refused_by_name(node, message):
    model = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]), node])
    with pytest.raises(OnnxError, match=message + r".*batch=False"):
        vmem.onnx.load(model)


def test_an_output_whose_batch_axis_moved_is_refused_with_what_to_do():
    model = _model([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2])])
    with pytest.raises(OnnxError, match=r"output with the batch in axis 1 of \(3, 1, 8\).*batch=False"):
        vmem.onnx.load(model)

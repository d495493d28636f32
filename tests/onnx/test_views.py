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


def _model(nodes, inits=None, out_shape=None, batch="N"):
    graph = helper.make_graph(
        nodes,
        "views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, T, E])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _heads(static: int | None = None):
    """(N, T, E) -> (T, N, E) -> (T, N * H, E / H) -> (N * H, T, E / H), a softmax over each head's features,
    -> (N, H, T, E / H) -> (N, T, H, E / H) -> (N, T, E), then a linear layer: attention's moves, without it.
    ``static``: exported at that batch size, written in the input's shape and in every reshape (as an
    export without a symbolic batch axis writes them)."""
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
    if static is not None:
        n = static
        inits.update(
            s1=np.array([T, n * H, E // H], np.int64),
            s2=np.array([n, H, T, E // H], np.int64),
            s3=np.array([n, T, E], np.int64),
        )
        return _model(nodes, inits, batch=n)
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


def test_a_model_exported_at_a_fixed_batch_reads_its_reshapes_batch_and_runs_at_any():
    """Exported at batch 2, the model writes 2 (and 2 x heads where the batch is merged with them) in its
    reshapes: vmem reads the axis that holds it as the batch, and the network computes at batch 4 what the
    model exported with a symbolic batch computes."""
    static, dynamic = vmem.onnx.load(_heads(static=2)), vmem.onnx.load(_heads())
    x = np.random.default_rng(1).standard_normal((2, T, E)).astype(np.float32)
    want = ort.InferenceSession(_heads(static=2).SerializeToString()).run(None, {"x": x})[0]
    x4 = np.random.default_rng(3).standard_normal((4, T, E)).astype(np.float32)
    with vmem.Trainer(static) as a, vmem.Trainer(dynamic) as b:
        np.testing.assert_allclose(a.predict(x), want, rtol=1e-5, atol=1e-6)
        assert np.array_equal(a.predict(x4), b.predict(x4))
    assert [type(layer).__name__ for layer in static.layers] == ["Reshape", "Softmax", "Reshape", "Linear"]


def test_a_model_exported_at_batch_1_is_refused_naming_the_remedy():
    """At batch 1 the batch cannot be told apart from the other axes of length 1 in the model's shapes."""
    with pytest.raises(OnnxError, match=r"exported at batch 1.*dynamic_shapes.*dynamic_axes"):
        vmem.onnx.load(_heads(static=1))


def test_as_strided_written_as_a_gather_of_the_flattened_tensor_is_a_reshape_and_a_transpose():
    """The dynamo exporter writes ``Tensor.as_strided`` (ConvNeXt's head) as a Gather of the flattened tensor
    at constant indices ``arange(n).reshape(shape).transpose(perm)`` (at the example batch): vmem reads it as
    the reshape and the transpose, the batch where the shape holds the example's, so it runs at any batch."""
    n = 2
    idx = np.arange(n * T * E, dtype=np.int64).reshape(n, T, E).transpose(0, 2, 1)
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["f"]),
        helper.make_node("Gather", ["f", "idx"], ["g"], axis=0),  # (n, E, T)
        helper.make_node("ReduceMean", ["g"], ["y"], axes=[2], keepdims=0),
    ]
    model = _model(nodes, {"flat": np.array([-1], np.int64), "idx": idx}, batch=n)
    net = vmem.onnx.load(model)
    x = np.random.default_rng(5).standard_normal((n, T, E)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    x4 = np.random.default_rng(6).standard_normal((4, T, E)).astype(np.float32)
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict(x), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(trainer.predict(x4), x4.mean(axis=1), rtol=1e-6, atol=1e-6)
    other = idx.reshape(-1)[::-1].reshape(idx.shape).copy()  # not a reshape and a transpose: still refused
    with pytest.raises(OnnxError, match="gathers along axis 0, which holds the batch"):
        vmem.onnx.load(_model(nodes, {"flat": np.array([-1], np.int64), "idx": other}, batch=n))


def test_every_reading_of_a_reshape_ends():
    """Reading a reshape through a view tries each axis for the example batch: each try ends, taken or
    refused (an axis of the model's size already met, the batch not yet, once split it again forever)."""
    import itertools

    from vmem.onnx._builder import BATCH, _Refuse, _Tensor
    from vmem.onnx._views import _reshaped

    x = _Tensor(None, (1, 6, 48))  # the model's (T, N, 3 * 16): attention's packed projections, batch second
    for dims in itertools.permutations([6, 3, 3, 16]):
        for k in range(4):
            trial = list(dims)
            trial[k] = trial[k] * BATCH // 3 if trial[k] % 3 == 0 else trial[k]
            try:
                _reshaped(x, ((1,), (0,), (2,)), trial)
            except _Refuse:
                pass


@pytest.mark.parametrize("moved", [False, True], ids=["batch-first", "batch-moved"])
def test_a_constant_the_same_for_every_sample_written_out_at_the_example_batch_broadcasts(moved):
    """An export at a fixed batch writes a constant made for the batch (a padding mask's zeros, filled
    where a mask is added) out along it, every row the same: vmem reads one row, broadcast, at any batch."""
    n = 2
    rng = np.random.default_rng(7)
    row = rng.standard_normal((1, T, E)).astype(np.float32)
    c = np.repeat(row, n, axis=0) if not moved else np.repeat(row.transpose(1, 0, 2), n, axis=1)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2])] if moved else []
    nodes += [
        helper.make_node("Add", ["t" if moved else "x", "C"], ["a"]),
        helper.make_node("ReduceMean", ["a"], ["y"], axes=[0 if moved else 1], keepdims=0),
    ]
    model = _model(nodes, {"C": c}, batch=n)
    net = vmem.onnx.load(model)
    x = rng.standard_normal((n, T, E)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    x4 = rng.standard_normal((4, T, E)).astype(np.float32)
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict(x), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(trainer.predict(x4), (x4 + row).mean(axis=1), rtol=1e-5, atol=1e-6)


def test_attentions_nan_to_zero_after_its_softmax_imports_and_exports_back():
    """PyTorch's exporters write scaled_dot_product_attention's softmax followed by ``Where(IsNaN(p), 0, p)``
    (a row every position of which is masked): one ``nn.Select("isnan", ...)``, written back as IsNaN."""
    nodes = [
        helper.make_node("Softmax", ["x"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["y"]),
    ]
    model = _model(nodes, {"zero": np.array(0.0, np.float32)})
    net = vmem.onnx.load(model)
    assert [type(layer).__name__ for layer in net.layers] == ["Softmax", "Select"]
    x = np.random.default_rng(8).standard_normal((3, T, E)).astype(np.float32)
    x[1, 0] = -np.inf  # a row masked everywhere: its softmax is NaN, then 0
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    with vmem.Trainer(net) as trainer:
        got = trainer.predict(x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not np.isnan(got).any() and not got[1, 0].any()
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        vmem.onnx.save(net, f"{folder}/back.onnx")
        back = onnx.load(f"{folder}/back.onnx")
        assert "IsNaN" in {n.op_type for n in back.graph.node}
        again = ort.InferenceSession(f"{folder}/back.onnx")
        np.testing.assert_allclose(again.run(None, {again.get_inputs()[0].name: x})[0], got, rtol=1e-6, atol=1e-7)


def test_a_power_of_a_computed_tensor_imports_trains_and_exports_back():
    """``Pow(x, 3)`` (GPT-2's tanh GELU written out) is one ``nn.Power``, trained, and written back as Pow."""
    nodes = [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("MatMul", ["p", "W"], ["y"])]
    w = np.random.default_rng(9).standard_normal((E, 5)).astype(np.float32)
    model = _model(nodes, {"three": np.array(3.0, np.float32), "W": w})
    net = vmem.onnx.load(model)
    assert [type(layer).__name__ for layer in net.layers] == ["Power", "Linear"]
    x = np.random.default_rng(10).standard_normal((4, T, E)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict(x), want, rtol=1e-5, atol=1e-5)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        vmem.onnx.save(net, f"{folder}/back.onnx")
        assert "Pow" in {n.op_type for n in onnx.load(f"{folder}/back.onnx").graph.node}
        back = ort.InferenceSession(f"{folder}/back.onnx")
        np.testing.assert_allclose(back.run(None, {back.get_inputs()[0].name: x})[0], want, rtol=1e-5, atol=1e-5)

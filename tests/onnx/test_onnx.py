"""vmem.onnx: models built with onnx.helper import into networks whose outputs equal onnxruntime's; what
cannot be imported is refused by name before anything is built; vmem networks export to models onnxruntime
runs with the same outputs; an imported network trains as the same network built by hand."""

from __future__ import annotations

import os

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.errors import OnnxError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RTOL, ATOL = 1e-3, 1e-5  # the tolerance against onnxruntime


def _model(nodes, inits, shape=(3, 8, 8), out="y", opset=17, batch="N", name="m"):
    rng = np.random.default_rng(0)
    tensors = [numpy_helper.from_array(np.asarray(v(rng) if callable(v) else v), k) for k, v in inits.items()]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, *shape])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        tensors,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _normal(*shape, scale=0.3):
    return lambda rng: (rng.standard_normal(shape) * scale).astype(np.float32)


def _positive(*shape):
    return lambda rng: (rng.uniform(0.5, 1.5, shape)).astype(np.float32)


def _check(model, batch=3, **load):
    """The imported network's output (evaluation mode) equals onnxruntime's."""
    net = vmem.onnx.load(model, **load)
    x = np.random.default_rng(1).standard_normal((batch, *net.input_shape)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    with vmem.Trainer(net) as trainer:
        got = trainer.predict(x)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    return net


def _cnn(opset):
    """conv-bn-relu-maxpool, a residual add, a concat, clip (ReLU6), avgpool, flatten of a 2x2 map, gemm,
    dropout, softmax: every layer kind a CNN export has."""
    clip = (
        [helper.make_node("Clip", ["c2"], ["r2"], min=0.0, max=6.0)]
        if opset < 11
        else [helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"])]
    )
    dropout = (
        helper.make_node("Dropout", ["g1"], ["d1"], ratio=0.25)
        if opset < 12
        else helper.make_node("Dropout", ["g1", "ratio"], ["d1"])
    )
    nodes = [
        helper.make_node(
            "Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="/f/conv1/Conv"
        ),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["n1"], epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        *clip,
        helper.make_node("Add", ["r2", "p1"], ["a1"]),
        helper.make_node("Concat", ["a1", "p1"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["f1"], axis=1),
        helper.make_node("Gemm", ["f1", "w3", "b3"], ["g1"], transB=1),
        dropout,
        helper.make_node("Softmax", ["d1"], ["y"], axis=1),
    ]
    inits = {
        "w1": _normal(4, 3, 3, 3),
        "b1": _normal(4),
        "g": _positive(4),
        "beta": _normal(4),
        "mean": _normal(4),
        "var": _positive(4),
        "w2": _normal(4, 4, 3, 3),
        "lo": np.float32(0.0),
        "hi": np.float32(6.0),
        "w3": _normal(5, 8 * 2 * 2),
        "b3": _normal(5),
        "ratio": np.float32(0.25),
    }
    return _model(nodes, inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 13, 17, 18])
def test_a_cnn_imports_with_onnxruntime_outputs_at_each_opset(opset):
    net = _check(_cnn(opset))
    kinds = [layer.kind for layer in net.layers]
    assert kinds == [
        "conv", "batchnorm", "relu", "maxpool", "conv", "clip", "add", "concat", "avgpool", "flatten", "linear",
        "dropout", "softmax",
    ]  # fmt: skip
    assert net.layers[0].name == "f.conv1"  # from the node's name (PyTorch's scope path /f/conv1/Conv)
    assert net.num_params() == 4 * 27 + 4 + 8 + 4 * 36 + 5 * 32 + 5
    assert net.sources["f.conv1.weight"] == "w1" and net.sources[f"{net.layers[1].name}.running_var"] == "var"
    assert net.layers[1].momentum == pytest.approx(0.1)  # ONNX's 0.9 (weight of the old value) is Torch's 0.1


def test_the_batch_axis_of_a_shape_computation_stays_symbolic():
    """x.view(x.size(0), -1) as exporters write it (Shape, Gather, Unsqueeze, Concat, Reshape) and a global
    average pool: the imported network runs at any batch size."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3]),
        helper.make_node("GlobalAveragePool", ["c"], ["gap"]),
        helper.make_node("Shape", ["gap"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["gap", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w2"], ["y"]),
    ]
    inits = {
        "w": _normal(6, 3, 3, 3),
        "zero": np.int64(0),
        "axes": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
        "w2": _normal(6, 4),
    }
    model = _model(nodes, inits, opset=13)
    for batch in (1, 5):
        net = _check(model, batch=batch)
    assert [layer.kind for layer in net.layers] == ["conv", "avgpool", "flatten", "linear"]


def test_a_symbolic_input_shape_is_given_at_load():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Flatten", ["r"], ["f"])]
    nodes.append(helper.make_node("Gemm", ["f", "w"], ["y"]))
    model = _model(nodes, {"w": _normal(3 * 1 * 1, 2)}, shape=(3, "H", "W"))
    with pytest.raises(OnnxError, match=r"input_shape=\(3, 224, 224\)"):
        vmem.onnx.load(model)
    _check(model, input_shape=(3, 1, 1))


@pytest.mark.parametrize("opset", [13, 17])
def test_arithmetic_with_constants_imports_and_exports(tmp_path, opset):
    """The normalisation an export starts with ((x - mean) / std per channel), a scale, a bias per channel,
    1 - x and a constant divided into a map: each a ConstantOp, and back to the same ONNX ops. The bias a
    layer's output is given trains (a weight of the model's computation); the normalisation applied to the
    input (the model's buffers) and the scalars do not."""
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["a"]),
        helper.make_node("Div", ["a", "std"], ["b"]),
        helper.make_node("Conv", ["b", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["half", "c"], ["d"]),
        helper.make_node("Add", ["d", "bias"], ["e"]),
        helper.make_node("Sub", ["one", "e"], ["f"]),
        helper.make_node("Flatten", ["f"], ["g"]),
        helper.make_node("Gemm", ["g", "w2"], ["h"], transB=1),
        helper.make_node("Add", ["h", "zero"], ["y"]),  # + 0: nothing
    ]
    inits = {
        "mean": np.array([0.4, 0.5, 0.6], np.float32).reshape(3, 1, 1),
        "std": np.array([0.2, 0.25, 0.3], np.float32).reshape(3, 1, 1),
        "w": _normal(4, 3, 3, 3),
        "half": np.float32(0.5),
        "bias": _normal(4, 1, 1),
        "one": np.float32(1.0),
        "w2": _normal(6, 4 * 8 * 8),
        "zero": np.float32(0.0),
    }
    net = _check(_model(nodes, inits, opset=opset))
    assert [layer.kind for layer in net.layers].count("constop") == 5 and net.num_params() == 4 * 27 + 4 + 6 * 256
    assert [layer.trainable for layer in net.layers if layer.kind == "constop"] == [False, False, False, True, False]
    vmem.onnx.save(net, tmp_path / "m.onnx", opset=opset)
    ops = [n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node]
    assert ops[:2] == ["Sub", "Div"] and ops.count("Mul") == 1 and ops.count("Sub") == 2
    _check(_rename_input(tmp_path / "m.onnx"))  # and onnxruntime runs the export with the same outputs


_GELUS = {  # 0.5 x (1 + erf(x / sqrt 2)) in the orders exporters write it, after a linear layer (h)
    "scale-last": [
        helper.make_node("Div", ["h", "sqrt2"], ["a"]),
        helper.make_node("Erf", ["a"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["b"]),
        helper.make_node("Mul", ["h", "b"], ["c"]),
        helper.make_node("Mul", ["c", "half"], ["y"]),
    ],
    "scale-first": [
        helper.make_node("Mul", ["h", "half"], ["hh"]),
        helper.make_node("Mul", ["h", "rsqrt2"], ["a"]),
        helper.make_node("Erf", ["a"], ["e"]),
        helper.make_node("Add", ["one", "e"], ["b"]),
        helper.make_node("Mul", ["hh", "b"], ["y"]),
    ],
    "scale-on-bracket": [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(2**0.5))),
        helper.make_node("Div", ["h", "k"], ["a"]),
        helper.make_node("Erf", ["a"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["b"]),
        helper.make_node("Mul", ["b", "half"], ["c"]),
        helper.make_node("Mul", ["c", "h"], ["y"]),
    ],
    "op": [helper.make_node("Gelu", ["h"], ["y"])],
}


@pytest.mark.parametrize("form", list(_GELUS))
def test_gelu_as_exporters_write_it_becomes_one_layer(tmp_path, form):
    """A transformer's feed-forward activation: one nn.GELU (backward reads its input alone, where the ops
    would stash three buffers), exported as ONNX's Gelu from opset 20 and as the ops before."""
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1), *_GELUS[form]]
    inits = {
        "w": _normal(16, 12, scale=1.0),
        "sqrt2": np.float32(2**0.5),
        "rsqrt2": np.float32(2**-0.5),
        "one": np.float32(1),
        "half": np.float32(0.5),
    }
    net = _check(_model(nodes, inits, shape=(12,), opset=20 if form == "op" else 17))
    assert [layer.kind for layer in net.layers] == ["linear", "gelu"]
    for opset in (17, 20):
        vmem.onnx.save(net, tmp_path / "gelu.onnx", opset=opset)
        again = _check(_rename_input(tmp_path / "gelu.onnx"))
        assert [layer.kind for layer in again.layers] == ["linear", "gelu"]


def test_a_gelu_whose_parts_are_read_elsewhere_stays_ops():
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1), *_GELUS["scale-last"][:-1]]
    nodes += [helper.make_node("Mul", ["c", "half"], ["g"]), helper.make_node("Add", ["g", "e"], ["y"])]
    inits = {
        "w": _normal(16, 12, scale=1.0),
        "sqrt2": np.float32(2**0.5),
        "one": np.float32(1),
        "half": np.float32(0.5),
    }
    net = _check(_model(nodes, inits, shape=(12,)))
    assert "gelu" not in [layer.kind for layer in net.layers] and "erf" in [layer.kind for layer in net.layers]


def test_a_model_of_two_inputs_imports_and_exports(tmp_path):
    """An image and a per-sample gate on its pooled features: the network's two inputs, in the model's order."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Mul", ["f", "gate"], ["g"]),
        helper.make_node("Gemm", ["g", "w2"], ["y"], transB=1),
    ]
    rng = np.random.default_rng(0)
    model = _model(nodes, {"w": _normal(4, 3, 3, 3), "w2": _normal(5, 4)})
    model.graph.input.append(helper.make_tensor_value_info("gate", TensorProto.FLOAT, ["N", 4]))
    net = vmem.onnx.load(model)
    assert [n.name for n in net.inputs] == ["input", "gate"] and net.input_shapes() == [(3, 8, 8), (4,)]
    x, gate = rng.standard_normal((3, 3, 8, 8)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "gate": gate})[0]
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict((x, gate)), want, rtol=RTOL, atol=ATOL)
    vmem.onnx.save(net, tmp_path / "two.onnx")
    back = ort.InferenceSession(str(tmp_path / "two.onnx"))
    assert [i.name for i in back.get_inputs()] == ["input", "gate"]
    np.testing.assert_allclose(back.run(None, {"input": x, "gate": gate})[0], want, rtol=RTOL, atol=ATOL)


def test_attention_with_a_padding_mask_imports():
    """Self-attention as exporters write it: per-head (N, heads, T, d) tensors made by Reshape and Transpose
    (held as 5-D tensors: vmem's 4-D ones are images), scaled scores, a mask unsqueezed to (N, 1, 1, T) and
    turned into a bias, Softmax, a layer norm, the first token gathered; a MatMul's bias added after it
    becomes the Linear's own, trainable."""
    t, f, heads = 4, 8, 2
    d = f // heads
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q0"]),
        helper.make_node("Add", ["q0", "bq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        *[
            n
            for name in "qkv"
            for n in (
                helper.make_node("Reshape", [name, "split"], [f"{name}4"]),
                helper.make_node("Transpose", [f"{name}4"], [f"{name}h"], perm=[0, 2, 1, 3]),
            )
        ],
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qh", "kt"], ["s0"]),
        helper.make_node("Div", ["s0", "scale"], ["s1"]),
        helper.make_node("Unsqueeze", ["mask", "axes"], ["m4"]),
        helper.make_node("Sub", ["one", "m4"], ["m5"]),
        helper.make_node("Mul", ["m5", "big"], ["bias"]),
        helper.make_node("Add", ["s1", "bias"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vh"], ["c0"]),
        helper.make_node("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["c1", "merge"], ["c2"]),
        helper.make_node("LayerNormalization", ["c2", "gamma", "beta"], ["n"], epsilon=1e-5),
        helper.make_node("Gather", ["n", "zero"], ["first"], axis=1),
        helper.make_node("Gemm", ["first", "wo"], ["y"], transB=1),
    ]
    inits = {
        "wq": _normal(f, f, scale=0.5), "bq": _normal(f), "wk": _normal(f, f, scale=0.5), "wv": _normal(f, f),
        "split": np.array([0, t, heads, d], np.int64), "scale": np.float32(d**0.5),
        "axes": np.array([1, 2], np.int64), "one": np.float32(1), "big": np.float32(-1e4),
        "merge": np.array([0, t, f], np.int64), "gamma": _positive(f), "beta": _normal(f),
        "zero": np.array(0, np.int64), "wo": _normal(3, f),
    }  # fmt: skip
    model = _model(nodes, inits, shape=(t, f))
    model.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", t]))
    net = vmem.onnx.load(model)
    assert net.sources["matmul.bias"] == "bq" and net.num_params() == 3 * f * f + f + 2 * f + 3 * f
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, t, f)).astype(np.float32)
    mask = np.ones((3, t), np.float32)
    mask[1, 2:] = 0
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "mask": mask})[0]
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict((x, mask)), want, rtol=RTOL, atol=ATOL)


def test_token_ids_look_up_an_embedding():
    """An integer input (token ids) through Gather of a table: a vmem Embedding, its table trainable."""
    nodes = [
        helper.make_node("Gather", ["table", "x"], ["e"]),
        helper.make_node("Reshape", ["e", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "w"], ["y"], transB=1),
    ]
    inits = {"table": _normal(10, 4), "flat": np.array([0, 12], np.int64), "w": _normal(2, 12)}
    model = _model(nodes, inits, shape=(3,))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    net = vmem.onnx.load(model)
    assert [layer.kind for layer in net.layers] == ["embedding", "reshape", "linear"]
    ids = np.random.default_rng(0).integers(0, 10, (5, 3))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": ids})[0]
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict(ids), want, rtol=RTOL, atol=ATOL)


def test_tensorflow_style_padding_imports_and_exports(tmp_path):
    """SAME padding with stride 2 (one more row and column after than before), an explicit Pad, a max
    pooling padded wider than half its window: a Pad2d first, the layer then padding nothing."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
        helper.make_node("Pad", ["c", "pads", "zero"], ["p"], mode="constant"),
        helper.make_node("MaxPool", ["p"], ["m"], kernel_shape=[3, 3], pads=[2, 2, 2, 2]),
        helper.make_node("Flatten", ["m"], ["f"]),
        helper.make_node("Gemm", ["f", "w2"], ["y"], transB=1),
    ]
    inits = {
        "w": _normal(4, 3, 3, 3),
        "pads": np.array([0, 0, 1, 0, 0, 0, 0, 2], np.int64),
        "zero": np.float32(0.5),
        "w2": _normal(2, 4 * 7 * 8),
    }
    net = _check(_model(nodes, inits))
    assert [layer.kind for layer in net.layers][:4] == ["pad", "conv", "pad", "pad"]
    vmem.onnx.save(net, tmp_path / "tf.onnx")
    _check(_rename_input(tmp_path / "tf.onnx"))


def test_dilated_and_grouped_convolutions_import_and_export(tmp_path):
    """An atrous convolution (DeepLab's), a grouped one dilated along its width, padded asymmetrically (a
    Pad2d first)."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("Conv", ["c", "w2"], ["d"], group=2, dilations=[1, 2], pads=[0, 2, 1, 0]),
        helper.make_node("GlobalAveragePool", ["d"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"]),
    ]
    net = _check(_model(nodes, {"w": _normal(4, 3, 3, 3), "w2": _normal(6, 2, 3, 2)}))
    convs = [layer for layer in net.layers if layer.kind == "conv"]
    assert [(c.dilation, c.groups) for c in convs] == [((2, 2), 1), ((1, 2), 2)]
    vmem.onnx.save(net, tmp_path / "atrous.onnx")
    _check(_rename_input(tmp_path / "atrous.onnx"))


def _rename_input(path):
    """A model vmem.onnx.save wrote, its input called x as the tests' models' are."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        node.input[:] = ["x" if i == "input" else i for i in node.input]
    model.graph.input[0].name = "x"
    return model


def test_what_cannot_be_imported_is_refused_by_node_op_and_opset():
    nodes = [
        helper.make_node("MaxPool", ["x"], ["c"], kernel_shape=[3, 3], storage_order=1, name="columns"),
        helper.make_node("LRN", ["c"], ["l"], size=3, name="norm"),  # downstream of a refused node: not named again
        helper.make_node("Conv", ["x", "w3"], ["d"], kernel_shape=[3], name="line"),
        helper.make_node("Add", ["l", "d"], ["y"]),
    ]
    model = _model(nodes, {"w": _normal(3, 3, 3, 3), "w3": _normal(3, 3, 3)}, opset=17)
    with pytest.raises(OnnxError) as info:
        vmem.onnx.load(model)
    text = str(info.value)
    assert "2 node(s) cannot be imported" in text and "opset 17" in text
    assert "node 'columns' (MaxPool v12): storage_order=1" in text
    assert "node 'line' (Conv v11): weights of shape (3, 3, 3): vmem has 2-D convolutions only" in text
    assert "'norm'" not in text and "Ops vmem converts: Add, AveragePool" in text

    d2s = _model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=1, name="d2s")], {})
    with pytest.raises(OnnxError, match=r"node 'd2s' \(DepthToSpace v13\): not supported"):
        vmem.onnx.load(d2s)


def test_models_vmem_cannot_take_are_refused_with_the_reason(tmp_path):
    old = _model([helper.make_node("Relu", ["x"], ["y"])], {}, opset=7)
    with pytest.raises(OnnxError, match="opset 7 is older"):
        vmem.onnx.load(old)
    tied = _model(
        [
            helper.make_node("Flatten", ["x"], ["f"]),
            helper.make_node("MatMul", ["f", "w"], ["h"], name="a"),
            helper.make_node("MatMul", ["h", "w"], ["y"], name="b"),
        ],
        {"w": _normal(4, 4)},
        shape=(4, 1, 1),
    )
    with pytest.warns(UserWarning, match=r"1 initializer\(s\) are parameters of more than one layer.*'w' \(a,"):
        untied = vmem.onnx.load(tied)  # merged equal initializers look the same: each layer its own copy
    assert sorted(untied.params) == ["a.weight", "b.weight"] and untied.sources == {"a.weight": "w"}
    with pytest.raises(FileNotFoundError, match="missing.onnx: no such ONNX file"):
        vmem.onnx.load(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model at all")
    with pytest.raises(OnnxError, match="junk.onnx: not a readable ONNX model"):
        vmem.onnx.load(junk)
    reshape = _model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="fold_batch")], {"s": np.array([-1, 4], np.int64)}
    )
    with pytest.raises(
        OnnxError, match="'fold_batch'.*batch in axis 0 of \\(48, 4\\) merged.*keep the batch axis first"
    ):
        vmem.onnx.load(reshape)


def _zoo_like():
    """A network with every layer the exporter writes that a CNN uses, in vmem's API."""
    g = vmem.Graph(input_shape=(3, 8, 8), name="zoo_like")
    c = g.add(nn.Conv2d(3, 6, 3, padding=1, bias=False), g.input)
    b = g.add(nn.BatchNorm2d(6), c)
    r = g.add(nn.ReLU(), b)
    p = g.add(nn.MaxPool2d(2), r)
    c2 = g.add(nn.Conv2d(6, 6, 3, padding=1), p)
    k = g.add(nn.Clip(0, 6), c2)
    a = g.add(nn.Add(), k, p)
    cat = g.add(nn.Concat(), a, p)
    q = g.add(nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), cat)
    f = g.add(nn.Flatten(), q)
    h = g.add(nn.Linear(12 * 3 * 3, 7), f)
    d = g.add(nn.Dropout(0.2), h)
    g.add(nn.Tanh(), d)
    return g.init(seed=3)


@pytest.mark.parametrize("fold", [False, True], ids=["bn-kept", "bn-folded"])
@pytest.mark.parametrize("opset", [13, 17, 18])
def test_an_exported_network_runs_in_onnxruntime_with_its_outputs(tmp_path, opset, fold):
    net = _zoo_like()
    # batch norm's running statistics away from (0, 1), as after training
    net.params["batchnorm1.running_mean"] = np.linspace(-0.5, 0.5, 6).astype(np.float32)
    net.params["batchnorm1.running_var"] = np.linspace(0.5, 2.0, 6).astype(np.float32)
    path = tmp_path / "net.onnx"
    vmem.onnx.save(net, path, opset=opset, fold_batch_norm=fold)
    model = onnx.load(str(path))
    assert ("BatchNormalization" in {n.op_type for n in model.graph.node}) is not fold
    x = np.random.default_rng(2).standard_normal((4, 3, 8, 8)).astype(np.float32)
    with vmem.Trainer(net) as trainer:
        want = trainer.predict(x)
    got = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    again = vmem.onnx.load(path)  # and back: the same outputs
    with vmem.Trainer(again) as trainer:
        np.testing.assert_allclose(trainer.predict(x), want, rtol=RTOL, atol=ATOL)


def _tensor_ops():
    """A network of the layers that reshape, take and reduce tensors (and pool with dilated windows)."""
    g = vmem.Graph(input_shape=(4, 6, 6), name="tensor_ops")
    p = g.add(nn.MaxPool2d(2, stride=1, dilation=2), g.input)  # (4, 4, 4)
    q = g.add(nn.AvgPool2d(2, stride=1, dilation=(1, 2), count_include_pad=False), g.input)  # (4, 5, 4)
    heads = g.add(nn.Reshape((2, 2, 4, 4)), p)  # a map into a 5-D tensor: a copy from channels-last
    lhs = g.add(nn.Take([1, 0, 1], axis=2), heads)  # (2, 3, 4, 4)
    rhs = g.add(nn.Mean((2,)), heads)  # (2, 1, 4, 4): broadcast in the product
    prod = g.add(nn.MatMul(), lhs, rhs)  # (2, 3, 4, 4)
    back = g.add(nn.Reshape((6, 4, 4)), prod)  # into a 4-D map
    flat = g.add(nn.Flatten(), g.add(nn.Identity(), back))
    side = g.add(nn.Reshape((80,)), q)
    g.add(nn.Concat(axis=1), flat, side)
    return g.init(seed=5)


@pytest.mark.parametrize("opset", [19, 21])
def test_tensor_ops_export_and_import_with_their_outputs(tmp_path, opset):
    net = _tensor_ops()
    path = tmp_path / "ops.onnx"
    with pytest.raises(OnnxError, match=r"'avgpool1' \(AvgPool2d\): dilated windows need opset 19"):
        vmem.onnx.save(net, path, opset=18)
    assert not path.exists()
    vmem.onnx.save(net, path, opset=opset)
    x = np.random.default_rng(2).standard_normal((3, 4, 6, 6)).astype(np.float32)
    with vmem.Trainer(net) as trainer:
        want = trainer.predict(x)
    got = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    with vmem.Trainer(vmem.onnx.load(path)) as trainer:
        np.testing.assert_allclose(trainer.predict(x), want, rtol=RTOL, atol=ATOL)


def test_steps_stacked_along_a_new_axis_export_as_vmem_runs_them(tmp_path):
    """ExpandDims (how an unrolled recurrence stacks its steps, ``vmem.models``' and an imported LSTM's) writes
    the Reshape of the input's own shape with the new axis (it wrote the batch and the new axis alone)."""
    g = vmem.Graph(input_shape=(6,), name="stacked")
    a = g.add(nn.ExpandDims(1), g.add(nn.Linear(6, 4), g.input))  # (N, 1, 4)
    b = g.add(nn.ExpandDims(1), g.add(nn.Tanh(), g.add(nn.Linear(6, 4), g.input)))
    g.add(nn.Linear(8, 3), g.add(nn.Flatten(), g.add(nn.Concat(axis=1), a, b)))
    net = g.init(seed=0)
    vmem.onnx.save(net, tmp_path / "stacked.onnx")
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    with vmem.Trainer(net) as trainer:
        want = trainer.predict(x)
    got = ort.InferenceSession(str(tmp_path / "stacked.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_a_model_without_a_batch_axis_imports_with_batch_false():
    """Its ops work along its first axis: refused as a batch (saying what to do), imported as one sample."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),  # (6, 4)
        helper.make_node("MatMul", ["t", "w"], ["m"]),  # (6, 5)
        helper.make_node("ReduceMean", ["m"], ["y"], axes=[0], keepdims=0),  # (5,)
    ]
    graph = helper.make_graph(
        nodes,
        "sample",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(OnnxError, match=r"multiplies along axis 1, which holds the batch .*batch=False"):
        vmem.onnx.load(model)
    net = vmem.onnx.load(model, batch=False)
    assert net.input_shape == (4, 6) and net.output_shape(3) == (3, 5)
    assert net.sources == {"matmul.weight": "w"}  # trainable
    xs = np.random.default_rng(1).standard_normal((3, 4, 6)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString())
    want = np.stack([session.run(None, {"x": x})[0] for x in xs])
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict(xs), want, rtol=RTOL, atol=ATOL)


def test_a_zoo_model_round_trips(tmp_path):
    net = vmem.models.get("resnet_cifar", depth=8).init(seed=1)
    vmem.onnx.save(net, tmp_path / "r.onnx")
    back = vmem.onnx.load(tmp_path / "r.onnx")
    assert back.num_params() == net.num_params()
    x = np.random.default_rng(0).standard_normal((2, *net.input_shape)).astype(np.float32)
    with vmem.Trainer(net) as a, vmem.Trainer(back) as b:
        mine, again = a.predict(x), b.predict(x)
    np.testing.assert_allclose(again, mine, rtol=1e-5, atol=1e-6)
    theirs = ort.InferenceSession(str(tmp_path / "r.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(theirs, mine, rtol=RTOL, atol=ATOL)


def test_a_save_replaces_only_a_regular_file_and_a_refused_one_writes_nothing(tmp_path):
    net = _zoo_like()
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(OnnxError, match="is a folder; an ONNX model is written only to a regular file"):
        vmem.onnx.save(net, folder)
    path = tmp_path / "net.onnx"
    vmem.onnx.save(net, path)
    good = path.read_bytes()
    seq = vmem.models.get("nmt_small")  # its embedding and length mask have no ONNX form here
    with pytest.raises(OnnxError, match=r"layer '[\w.]+' \((Embedding|LengthMask|Split)\) has no ONNX form"):
        vmem.onnx.save(seq.init(), path)
    with pytest.raises(OnnxError, match="opset=12"):
        vmem.onnx.save(net, path, opset=12)
    assert path.read_bytes() == good  # the last good file, and no temporary left beside it
    assert sorted(os.listdir(tmp_path)) == ["folder", "net.onnx"]


def test_an_imported_network_trains_as_the_same_network_built_by_hand(tmp_path):
    """Weights moved in (conv filters to (K, kh, kw, C), the classifier's columns to the (H, W, C) order of
    vmem's flatten) give the hand-built network's training step bit for bit."""
    net = _zoo_like()
    vmem.onnx.save(net, tmp_path / "net.onnx")
    imported = vmem.onnx.load(tmp_path / "net.onnx")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 7, 4)
    assert sorted(imported.params) == sorted(net.params)  # the layers keep their names
    for model in (net, imported):
        with vmem.Trainer(model, optimizer=vmem.optim.SGD(lr=0.1, momentum=0.9), seed=0) as trainer:
            for _ in range(2):
                trainer.step(x, y)
            trainer.sync()
    for key, value in net.params.items():
        np.testing.assert_array_equal(imported.params[key], value, err_msg=key)


@pytest.mark.parametrize("how", ["expand", "baked"])
def test_a_class_token_joined_to_the_sequence_imports_and_trains(tmp_path, how):
    """ViT's class token as exporters write it: a (1, 1, D) parameter expanded to the batch (Expand by the
    input's shape: the TorchScript exporter) or already expanded at the example's batch (an initializer of
    (2, 1, D): the dynamo exporter), joined in front of the patch tokens. It becomes a :class:`vmem.nn.Tokens` the same for every sample, trained (its gradient summed over the
    batch) and written back to a model onnxruntime runs with the same outputs."""
    d = 4
    nodes = [helper.make_node("Reshape", ["x", "seq"], ["s"])]  # (N, 6, 4)
    if how == "expand":
        nodes += [
            helper.make_node("Shape", ["s"], ["shape"]),
            helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
            helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
            helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
            helper.make_node("Expand", ["cls", "target"], ["tokens"]),
        ]
        inits = {"cls": _normal(1, 1, d), "zero": np.int64(0), "zero1": np.array([0], np.int64)}
        inits["rest"] = np.array([1, d], np.int64)
    else:
        token = np.random.default_rng(5).standard_normal((1, 1, d)).astype(np.float32)
        inits = {"tokens": np.repeat(token, 2, axis=0)}
    nodes += [
        helper.make_node("Concat", ["tokens", "s"], ["joined"], axis=1),
        helper.make_node("ReduceMean", ["joined"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("Gemm", ["pooled", "w"], ["y"], transB=1),
    ]
    inits.update(seq=np.array([-1, 6, d], np.int64), w=_normal(3, d))
    model = _model(nodes, inits, shape=(6 * d,), opset=13, batch=2 if how == "baked" else "N")
    net = _check(model, batch=2)
    kinds = [layer.kind for layer in net.layers]
    assert kinds.count("tokens") == 1
    tokens = [k for k in net.params if k.endswith(".value")]
    before = {k: net.params[k].copy() for k in tokens}
    rng = np.random.default_rng(2)
    with vmem.Trainer(net, optimizer=vmem.optim.SGD(lr=0.5), dtype="float64") as trainer:
        trainer.step(rng.standard_normal((5, 6 * d)), rng.integers(0, 3, 5))  # batch 5: the tokens broadcast
        trainer.sync()
    assert all(not np.array_equal(before[k], net.params[k]) for k in tokens)
    sources = set(net.sources.values())
    assert ({"cls"} if how == "expand" else {"tokens"}) <= sources
    vmem.onnx.save(net, tmp_path / "m.onnx")
    _check(_rename_input(tmp_path / "m.onnx"), batch=4)

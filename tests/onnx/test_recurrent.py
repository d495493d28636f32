"""ONNX ``LSTM`` and ``GRU`` as models write them (the sequence first with the batch moved behind it, as PyTorch
exports a ``batch_first`` layer, or the batch first), unrolled into vmem's layers: onnxruntime's outputs, each
direction, the last state as an output, planned by Echo's recomputation; what vmem does not take refused by
name. PyTorch's own exports, trained one step against PyTorch's, are in the corpus (test_corpus.py)."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem.errors import OnnxError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

N, T, F, H = 3, 5, 4, 6
GATES = {"LSTM": 4, "GRU": 3}


def _model(
    op: str,
    *,
    layout: int = 0,
    last: bool = False,
    initial: float | None = None,
    opset: int = 17,
    lengths: bool = False,
    **attrs,
):
    """x (N, T, F) -> ``op`` -> its outputs as (N, T, H) (or its last state, (N, H)), with random weights;
    ``lengths``: each sample's length an input of the model (``lens``, int32 (N,): its ``sequence_lens``)."""
    rng = np.random.default_rng(0)
    g = GATES[op]
    d = 2 if attrs.get("direction") == "bidirectional" else 1
    inits = [
        numpy_helper.from_array((0.5 * rng.standard_normal((d, g * H, F))).astype(np.float32), "W"),
        numpy_helper.from_array((0.5 * rng.standard_normal((d, g * H, H))).astype(np.float32), "R"),
        numpy_helper.from_array((0.5 * rng.standard_normal((d, 2 * g * H))).astype(np.float32), "B"),
    ]
    inputs = ["xt" if layout == 0 else "x", "W", "R", "B", "lens" if lengths else ""]
    if initial is not None:
        shape = (1, N, H) if layout == 0 else (N, 1, H)
        inits.append(numpy_helper.from_array(np.full(shape, initial, np.float32), "h0"))
        inputs.append("h0")
    if op == "GRU":
        attrs.setdefault("linear_before_reset", 1)
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2])] if layout == 0 else []
    nodes.append(helper.make_node(op, inputs, ["Y", "Y_h"], hidden_size=H, layout=layout, **attrs))
    axes = "axes"
    inits.append(numpy_helper.from_array(np.array([1 if layout == 0 else 2], np.int64), axes))
    if d == 2:  # both directions' h side by side, as PyTorch's export of a bidirectional layer reads them
        inits.append(numpy_helper.from_array(np.array([0, 0, -1] if not last else [0, -1], np.int64), "flat"))
        out, perm = ("Y_h", [1, 0, 2]) if last else ("Y", [2, 0, 1, 3])
        if layout == 0:  # (T, 2, N, H) -> (N, T, 2, H); (2, N, H) -> (N, 2, H)
            nodes.append(helper.make_node("Transpose", [out], ["yt"], perm=perm))
            out = "yt"
        nodes.append(helper.make_node("Reshape", [out, "flat"], ["y"]))
    elif last:
        inits.append(numpy_helper.from_array(np.array([0 if layout == 0 else 1], np.int64), "hax"))
        nodes.append(helper.make_node("Squeeze", ["Y_h", "hax"], ["y"]))
    elif layout == 0:  # (T, 1, N, H) -> (T, N, H) -> (N, T, H), as PyTorch's export reads it
        nodes.append(helper.make_node("Squeeze", ["Y", axes], ["s"]))
        nodes.append(helper.make_node("Transpose", ["s"], ["y"], perm=[1, 0, 2]))
    else:  # (N, T, 1, H) -> (N, T, H)
        nodes.append(helper.make_node("Squeeze", ["Y", axes], ["y"]))
    graph = helper.make_graph(
        nodes,
        "rnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", T, F])]
        + ([helper.make_tensor_value_info("lens", TensorProto.INT32, ["N"])] if lengths else []),
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(model) -> vmem.Network:
    """The imported network's output against onnxruntime's (ONNX's reference implementation where the batch
    comes first: onnxruntime runs recurrent ops with the sequence first only)."""
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(1).standard_normal((N, T, F)).astype(np.float32)
    batch_first = any(a.name == "layout" and a.i == 1 for n in model.graph.node for a in n.attribute)
    if batch_first:
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    else:
        want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    net = vmem.onnx.load(model)
    with vmem.Trainer(net) as trainer:
        np.testing.assert_allclose(trainer.predict(x), want, rtol=1e-5, atol=1e-5)
    return net


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_a_recurrent_layer_gives_onnxruntimes_outputs(op, direction, layout):
    net = _check(_model(op, direction=direction, layout=layout))
    # the weights as PyTorch keeps them: each direction's W and R, and its bias B's two halves
    n = GATES[op] * H
    want = [[f"B[{k}, 0:{n}]", f"B[{k}, {n}:{2 * n}]", f"R[{k}]", f"W[{k}]"] for k in range(2)]
    d = 2 if direction == "bidirectional" else 1
    assert sorted(net.sources.values()) == sorted(sum(want[:d], []))
    name = op.lower()  # the node's name where it has one, else its op's
    for suffix in ("", "_reverse")[:d]:
        assert net.params[f"{name}.ih{suffix}.weight"].shape == (GATES[op] * H, F)
        assert net.params[f"{name}.hh{suffix}.weight"].shape == (GATES[op] * H, H)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_both_directions_last_states_import(op):
    _check(_model(op, direction="bidirectional", last=True))
    _check(_model(op, direction="bidirectional", last=True, layout=1))


def test_a_gru_resetting_before_its_recurrent_projection_imports():
    """``linear_before_reset=0`` (TensorFlow's GRU): the new gate reads ``(r * h) R_n``; vmem applies the one
    recurrent projection to ``r * h`` too and keeps its new gate's part."""
    _check(_model("GRU", linear_before_reset=0))
    _check(_model("GRU", linear_before_reset=0, direction="reverse", last=True))


def test_peepholes_import_as_trained_weights_on_the_cell():
    """An LSTM's peepholes (P: i, o, f) add ``p * c`` to their gates, each a weight the steps share."""
    rng = np.random.default_rng(3)
    model = _model("LSTM")
    node = next(n for n in model.graph.node if n.op_type == "LSTM")
    model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((1, 3 * H)).astype(np.float32), "P"))
    node.input.extend(["", "", "P"])  # initial_h, initial_c, P
    net = _check(model)
    assert sorted(v for v in net.sources.values() if v.startswith("P")) == sorted(
        f"P[0, {a}:{a + H}]" for a in (0, H, 2 * H)
    )


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_the_last_state_and_zero_initial_states_import(op):
    _check(_model(op, last=True, initial=0.0, opset=14))
    _check(_model(op, last=True, layout=1, opset=22))


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_an_imported_recurrence_is_recomputed_by_echo_bit_for_bit(op):
    """Echo recomputes the unrolled steps' gates as it does vmem's own NMT's, and the weights after two steps
    are those of keeping every buffer, bit for bit (recomputation is lossless)."""
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((8, T, F)).astype(np.float32), rng.integers(0, H, (8, T))
    echo = vmem.plan(vmem.onnx.load(_model(op)), 8, policy="echo")
    assert "recompute" in set(echo.plan.stash.values())
    weights = []
    for policy in ("layerwise", "echo"):
        net = vmem.onnx.load(_model(op))
        with vmem.Trainer(net, policy=policy, seed=0) as trainer:
            for _ in range(2):
                trainer.step(x, y)
        weights.append(net.params)
    for k in weights[0]:
        assert weights[0][k].tobytes() == weights[1][k].tobytes(), k


@pytest.mark.parametrize(
    "op, attrs, initial, match",
    [
        ("LSTM", {"direction": "sideways"}, None, "direction='sideways': one of forward, reverse and bidirectional"),
        ("LSTM", {"clip": 3.0}, None, "clip"),
        ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}, None, "activations="),
        ("LSTM", {"input_forget": 1}, None, "input_forget=1"),
        ("LSTM", {}, 0.5, "initial_h .* is not zeros"),
    ],
)
def test_what_vmem_does_not_take_is_refused_by_name(op, attrs, initial, match):
    with pytest.raises(OnnxError, match=match):
        vmem.onnx.load(_model(op, initial=initial, **attrs))


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("last", [False, True])
def test_sequence_lengths_given_as_an_input_stop_each_sample_at_its_last_step(op, direction, last):
    """``sequence_lens`` an input of the model: each sample's state stops at its last step (the reverse
    direction starts there), its outputs past it are zeros, as onnxruntime computes; the network trains
    (the masks' gradients, nn.StepMask, checked apart) and exports back with the same outputs."""
    import tempfile

    model = _model(op, direction=direction, last=last, lengths=True)
    x = np.random.default_rng(1).standard_normal((N, T, F)).astype(np.float32)
    lens = np.array([T, 2, 4], np.int32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "lens": lens})[0]
    net = vmem.onnx.load(model)
    with vmem.Trainer(net) as trainer:
        got = trainer.predict((x, lens.astype(np.int64)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        before = {k: v.copy() for k, v in net.params.items()}
        trainer.step((x, lens.astype(np.int64)), np.arange(N) % H if last else np.zeros((N, T), np.int64))
        trainer.sync()
    assert all(not np.array_equal(before[k], v) for k, v in net.params.items())  # every weight trained
    with tempfile.TemporaryDirectory() as folder:
        vmem.onnx.save(net, f"{folder}/back.onnx")
        back = ort.InferenceSession(f"{folder}/back.onnx")
        feeds = {i.name: v for i, v in zip(back.get_inputs(), (x, lens.astype(np.int64)))}
        with vmem.Trainer(net) as trainer:
            np.testing.assert_allclose(
                back.run(None, feeds)[0], trainer.predict((x, lens.astype(np.int64))), 1e-5, 1e-5
            )


def test_sequence_lengths_fixed_in_the_model_at_other_lengths_are_refused():
    model = _model("LSTM")
    model.graph.initializer.append(numpy_helper.from_array(np.array([T, 2, 4], np.int32), "fixed"))
    for node in model.graph.node:
        if node.op_type == "LSTM":
            node.input[4] = "fixed"
    with pytest.raises(OnnxError, match="sequence_lens fixed in the model"):
        vmem.onnx.load(model)

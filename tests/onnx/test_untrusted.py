"""An ONNX model is untrusted input: it reads no file it was not given a folder for, stays inside that
folder, and every failure is an OnnxError naming the model, the tensor and what was expected."""

from __future__ import annotations

import os

import numpy as np
import pytest

import vmem
from vmem.errors import OnnxError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10


def _model(external: str | None = None, *, opset: int = 13, raw: bytes | None = None, length: int | None = None):
    """x (N, 4) -> Gemm(W (3, 4), transB) -> (N, 3); W inline, or in an external file ``external``."""
    w = numpy_helper.from_array(W, "W")
    if raw is not None:
        w.raw_data = raw
    if external is not None:
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for key, value in (("location", external), ("offset", "0"), ("length", str(length or W.nbytes))):
            entry = w.external_data.add()
            entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W"], ["y"], transB=1, name="fc")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weights(net) -> np.ndarray:
    (value,) = [v for k, v in net.params.items() if k.endswith("weight")]
    return value


def test_bytes_and_modelprotos_read_no_file_without_base_dir(tmp_path, monkeypatch):
    """The defect: a model given as bytes whose initializer says location=".env" loaded ./.env as weights."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_bytes(W.tobytes())  # a secret of the right size, in the current folder
    model = _model(".env")
    for given, name in ((model.SerializeToString(), "<bytes>"), (model, "<ModelProto 'tiny'>")):
        with pytest.raises(OnnxError, match=f"{name}: initializer 'W' keeps its values in an external file.*base_dir="):
            vmem.onnx.load(given)
    net = vmem.onnx.load(model.SerializeToString(), base_dir=tmp_path)  # named: read from there
    np.testing.assert_array_equal(_weights(net), W)
    assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL  # the caller's proto untouched


def test_a_path_models_external_data_stays_in_its_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(W.tobytes())
    os.symlink(tmp_path / "secret.bin", folder / "link.bin")
    os.mkfifo(folder / "fifo.bin")
    (folder / "weights.bin").write_bytes(W.tobytes())
    cases = {
        "../secret.bin": "lies outside the model's folder",
        "link.bin": "lies outside the model's folder",  # a link leading out
        "fifo.bin": "is not a regular file",  # never opened for long
        str(tmp_path / "secret.bin"): "not a path relative to the model's folder",
    }
    for location, why in cases.items():
        path = folder / "m.onnx"
        path.write_bytes(_model(location).SerializeToString())
        with pytest.raises(OnnxError, match=f"m.onnx: initializer 'W'.*{why}"):
            vmem.onnx.load(path)
    path.write_bytes(_model("weights.bin").SerializeToString())
    np.testing.assert_array_equal(_weights(vmem.onnx.load(path)), W)
    path.write_bytes(_model("weights.bin", length=8).SerializeToString())
    with pytest.raises(OnnxError, match=r"external data is 8 bytes at offset 0; its shape \[3, 4\] needs 48"):
        vmem.onnx.load(path)
    (folder / "weights.bin").write_bytes(W.tobytes()[:20])
    path.write_bytes(_model("weights.bin").SerializeToString())
    with pytest.raises(OnnxError, match="holds 20 bytes; the tensor needs 48"):
        vmem.onnx.load(path)


def test_malformed_models_are_onnx_errors_naming_what(tmp_path):
    with pytest.raises(OnnxError, match="opset 1000000 is newer than any vmem knows"):
        vmem.onnx.load(_model(opset=1_000_000))
    with pytest.raises(
        OnnxError, match=r"<bytes>: initializer 'W': holds 16 bytes; its shape \[3, 4\] and type need 48"
    ):
        vmem.onnx.load(_model(raw=b"\0" * 16).SerializeToString())
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(OnnxError, match="empty.onnx: not a readable ONNX model \\(the file is empty\\)"):
        vmem.onnx.load(empty)
    for junk in (b"", b"\xff\xfe not protobuf", b"\x08\x07"):  # nothing, garbage, a message with no graph
        with pytest.raises(OnnxError, match="<bytes>: not a readable ONNX model"):
            vmem.onnx.load(junk)


def test_the_constants_a_model_computes_at_import_are_bounded_together(monkeypatch):
    """Each constant computed at import is capped (1 GiB), and so are all of them together (2 GiB): a model of
    a few hundred bytes with six 0.84 GiB ConstantOfShape nodes imported at 5.3 GB. Shown at a cap of 8 MiB:
    the third 3 MiB constant is refused, naming its node, before it is made."""
    from vmem.onnx import _builder, _fold, _load

    for module in (_builder, _fold, _load):
        monkeypatch.setattr(module, "_MOST_FOLDED_TOTAL", 8 << 20)
    n = 3 << 18  # 3 MiB of float32
    nodes, last = [], "x"
    for i in range(6):
        shape = numpy_helper.from_array(np.array([1, n], np.int64), f"s{i}")
        nodes.append(helper.make_node("Constant", [], [f"shape{i}"], value=shape))
        nodes.append(helper.make_node("ConstantOfShape", [f"shape{i}"], [f"c{i}"], name=f"fill{i}"))
        nodes.append(helper.make_node("Add", [last, f"c{i}"], [f"a{i}"]))
        last = f"a{i}"
    graph = helper.make_graph(
        nodes,
        "fills",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, ["N", n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxError, match=r"fill2.*all of a model's computed constants"):
        vmem.onnx.load(model)

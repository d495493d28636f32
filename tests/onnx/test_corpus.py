"""Models as PyTorch exports them (``tests/onnx/corpus``: made by ``tests/onnx/corpus/make.py`` with torch,
kept in the repository so that these tests need no torch): each imports, gives onnxruntime's output, trains
one SGD step equal to PyTorch's in float64, plans under auto on a simulated GPU, and exports back to a model
onnxruntime runs with the same outputs. Those vmem does not import yet are expected to fail (strictly: one
that starts to pass must be moved to the list of those that do)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

import vmem

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

CORPUS = Path(__file__).resolve().parent / "corpus"
#: how each model is exported: by the TorchScript exporter at opsets 14 and 17 (a symbolic batch) and at 17
#: without dynamic axes (the batch fixed at the example's), and with PyTorch's defaults (the dynamo exporter,
#: the batch fixed at the example's, weights in ``.onnx.data``)
EXPORTS = ("opset14", "opset17", "static17", "dynamo")
#: those whose batch is fixed at the example's (3): they train at another batch (8) too
FIXED = ("static17", "dynamo")
#: (model, export) pairs that import today; every other model of the corpus is expected to be refused
IMPORTS = {
    (name, export)
    for name in (
        "bert",
        "decoder",
        "encoder_bf_post_gelu",
        "encoder_bf_post_relu",
        "encoder_bf_pre_gelu",
        "encoder_bf_pre_relu",
        "encoder_tf_post_relu",
        "gru",
        "hf_bert",
        "hf_distilbert",
        "hf_gpt2",
        "lstm",
        "mha",
        "mha_weights",
        "sdpa",
        "tied_lm",
    )
    for export in EXPORTS
}
#: parameters vmem imports as constants
CONSTANTS: dict[str, set[str]] = {}
#: what is missing for the others
WHY: dict[str, str] = {}


def _cases() -> list:
    out = []
    for path in sorted(CORPUS.glob("*.npz")):
        for export in EXPORTS:
            name = path.stem
            marks = [] if (name, export) in IMPORTS else [pytest.mark.xfail(reason=WHY[name], strict=True)]
            out.append(pytest.param(name, export, marks=marks, id=f"{name}_{export}"))
    return out


def _data(name: str) -> dict:
    with np.load(CORPUS / f"{name}.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _inputs(data: dict, dtype: type = np.float32, prefix: str = "") -> tuple:
    xs = [data[k] for k in sorted(k for k in data if k.startswith(prefix + "x"))]
    return tuple(x.astype(dtype) if x.dtype.kind == "f" else x for x in xs)


def _feeds(session, xs: tuple) -> dict:
    return {i.name: x for i, x in zip(session.get_inputs(), xs)}


def _predict(net, xs: tuple):
    with vmem.Trainer(net) as trainer:
        return trainer.predict(xs if len(xs) > 1 else xs[0])


def test_the_corpus_covers_every_model_every_way():
    stems = {p.stem for p in CORPUS.glob("*.onnx")}
    names = {p.stem for p in CORPUS.glob("*.npz")}
    assert len(names) >= 10 and stems == {f"{n}_{e}" for n in names for e in EXPORTS}
    assert all((CORPUS / f"{n}_dynamo.onnx.data").is_file() for n in names)  # the dynamo exporter's weights


@pytest.mark.parametrize("name, export", _cases())
def test_a_pytorch_export_imports_and_trains_as_pytorch_does(name, export):
    path = CORPUS / f"{name}_{export}.onnx"
    data = _data(name)
    xs = _inputs(data)
    net = vmem.onnx.load(path)
    session = ort.InferenceSession(str(path))
    want = session.run(None, _feeds(session, xs))[0]
    np.testing.assert_allclose(_predict(net, xs), want, rtol=1e-4, atol=1e-5)

    # one SGD step in float64 against PyTorch's, every parameter found by what the export named it
    net = _trains_as_pytorch(name, path, data, json.loads(str(data[f"sources:{export.removeprefix('opset')}"])))

    # planned under auto on a simulated GPU, and exported back
    assert vmem.plan(net, 32, "sim:v100-16gb", "auto", memory="1GiB").fits
    with tempfile.TemporaryDirectory() as folder:
        vmem.onnx.save(net, f"{folder}/back.onnx")
        back = ort.InferenceSession(f"{folder}/back.onnx")
        kinds = {"tensor(int64)": np.int64, "tensor(float)": np.float32}
        feeds = {i.name: x.astype(kinds[i.type]) for i, x in zip(back.get_inputs(), xs)}
        np.testing.assert_allclose(back.run(None, feeds)[0], _predict(net, xs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, export", sorted((n, e) for n, e in IMPORTS if e in FIXED))
def test_an_export_at_the_example_batch_trains_at_batch_8_as_pytorch_does(name, export):
    """PyTorch's defaults (and an export that names no dynamic axes) fix the batch at the example's (3) in the
    export's shapes: vmem reads that batch as the input's, and the network trains at batch 8 as PyTorch's
    module does."""
    data = _data(name)
    _trains_as_pytorch(name, CORPUS / f"{name}_{export}.onnx", data, json.loads(str(data[f"sources:{export}"])), "b8:")


def _held(sources: dict, initializer: str) -> tuple[str, tuple[int, int] | None]:
    """The PyTorch parameter an imported weight's source holds, and which of its rows where a part: the export's
    initializer (``sources`` maps it, or a part of it, to the parameter), or ``name[a:b]``, rows of one
    (``net.sources``' way of naming a packed projection's part)."""
    import re

    name = sources.get(initializer)
    if name is None:
        part = re.fullmatch(r"(.*)\[(\d+):(\d+)\]", initializer)
        if part is None:
            return initializer, None
        name = f"{sources.get(part[1], part[1])}[{part[2]}:{part[3]}]"
    part = re.fullmatch(r"(.*)\[(\d+):(\d+)\]", name)
    return (name, None) if part is None else (part[1], (int(part[2]), int(part[3])))


def _trains_as_pytorch(name: str, path: Path, data: dict, sources: dict, prefix: str = "") -> vmem.Network:
    """The imported network after one SGD step in float64 on the batch under ``prefix``, checked against
    PyTorch's: the loss, and every parameter (found by the export's name for it) within 1e-9 of its scale."""
    net = vmem.onnx.load(path)
    with vmem.Trainer(net, optimizer=vmem.optim.SGD(lr=0.05, momentum=0.9), dtype="float64") as trainer:
        x64 = _inputs(data, np.float64, prefix)
        report = trainer.step(x64 if len(x64) > 1 else x64[0], data[prefix + "labels"])
        trainer.sync()
    assert report.loss == pytest.approx(float(data[prefix + "loss"]), rel=1e-9)
    params = {k[len(prefix + "param:") :]: v for k, v in data.items() if k.startswith(prefix + "param:")}
    held = {key: _held(sources, initializer) for key, initializer in net.sources.items()}
    assert {name for name, _ in held.values()} == set(params) - CONSTANTS.get(name, set())
    for key, (param, rows) in held.items():
        theirs = params[param] if rows is None else params[param][rows[0] : rows[1]]
        mine = net.params[key]
        if theirs.ndim == 2 and theirs.T.shape == mine.shape != theirs.shape:  # a MatMul's weight, transposed
            theirs = theirs.T
        elif theirs.ndim == 2 and theirs.shape[0] == theirs.shape[1]:  # square: held as the export stores it,
            theirs = min((theirs, theirs.T), key=lambda t: np.abs(mine - t).max())  # (GPT-2's Conv1D: (in, out))
        theirs = theirs.reshape(mine.shape)  # a position table added to (N, T, H): held (1, T, H)
        assert np.abs(mine - theirs).max() <= 1e-9 * np.abs(theirs).max(), key  # of the tensor's scale
    return net

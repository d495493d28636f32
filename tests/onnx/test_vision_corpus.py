"""Networks of timm's vision families as users export them (``tests/onnx/corpus/vision``, made by
``tests/onnx/corpus/make_vision.py`` with torch and timm, kept in the repository so that these tests need
neither): with PyTorch's defaults (the dynamo exporter, the batch fixed at 2, external weights) and with
``dynamo=False`` at opsets 14 and 17. Each that imports gives onnxruntime's output, trains one SGD step in
float64 equal to PyTorch's step of the network as exported (every weight within 1e-9 of its change; no
weight PyTorch changes left untrained), plans under auto and exports back to a model onnxruntime runs the
same. Those vmem does not import yet are expected to fail, each with its reason (strictly: one that starts
to pass must move to :data:`IMPORTS`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

import vmem

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

CORPUS = Path(__file__).resolve().parent / "corpus" / "vision"
EXPORTS = ("dynamo", "opset14", "opset17")
#: (model, export) pairs that import today
IMPORTS = {(m, e) for m in ("mobilenetv3", "efficientnet", "convnext", "vit", "deit") for e in EXPORTS}
#: the bound on each weight's distance from PyTorch's, as a fraction of its change, where it is not 1e-9:
#: PyTorch's hard-sigmoid multiplies its gradient by 1/6 rounded to float32 even in float64 (its kernel's
#: constant), 3e-8 from the exact 1/6 vmem's uses (its forward computes (x + 3) / 6 exactly); the TorchScript
#: exporter writes GELU (ConvNeXt's, ViT's, DeiT's) as erf(x / 1.4142135), sqrt(2) rounded to float32, which
#: vmem reads back as the exact GELU PyTorch's module computes (the reference runs the export's constant: up
#: to 6e-9 apart)
BOUND = {"mobilenetv3": 5e-8, "convnext": 1e-8, "vit": 1e-8, "deit": 1e-8}
#: why the others do not
WHY: dict[str, str] = {}


def _cases() -> list:
    out = []
    for path in sorted(CORPUS.glob("*.npz")):
        for export in EXPORTS:
            marks = [] if (path.stem, export) in IMPORTS else [pytest.mark.xfail(reason=WHY[path.stem], strict=True)]
            out.append(pytest.param(path.stem, export, marks=marks, id=f"{path.stem}-{export}"))
    return out


def _data(name: str) -> dict:
    with np.load(CORPUS / f"{name}.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _reference(data: dict, export: str) -> dict:
    """The export's step reference (``E:loss``, ``E:init:<initializer>``), following ``same_as``."""
    same = data.get(f"{export}:same_as")
    source = str(same) if same is not None else export
    prefix = f"{source}:"
    return {k[len(prefix) :]: v for k, v in data.items() if k.startswith(prefix)}


def _predict(net, x):
    with vmem.Trainer(net) as trainer:
        return trainer.predict(x)


def test_the_vision_corpus_holds_every_model_three_ways():
    names = {p.stem for p in CORPUS.glob("*.npz")}
    assert names >= {"mobilenetv3", "efficientnet", "convnext", "vit", "deit"}
    for name in names:
        assert {f"{name}_{e}.onnx" for e in EXPORTS} <= {p.name for p in CORPUS.iterdir()}
        assert (CORPUS / f"{name}_dynamo.onnx.data").is_file()  # the dynamo exporter's external weights


@pytest.mark.parametrize("name, export", _cases())
def test_a_timm_network_as_exported_imports_and_trains_as_pytorch_trains_it(name, export):
    path = CORPUS / f"{name}_{export}.onnx"
    data = _data(name)
    x = data["x0"].astype(np.float32)
    net = vmem.onnx.load(path)
    session = ort.InferenceSession(str(path))
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(_predict(net, x), want, rtol=1e-3, atol=1e-4)

    # one SGD step in float64 against PyTorch's of the network as exported (batch norm folded where it was)
    assert bool(data[f"{export}:has_step"])
    net = _trains_as_pytorch(name, path, data["x0"], data["labels"], _reference(data, export))

    # planned under auto on a simulated GPU, and exported back
    assert vmem.plan(net, 32, "sim:v100-16gb", "auto", memory="1GiB").fits
    with tempfile.TemporaryDirectory() as folder:
        vmem.onnx.save(net, f"{folder}/back.onnx")
        back = ort.InferenceSession(f"{folder}/back.onnx")
        np.testing.assert_allclose(
            back.run(None, {back.get_inputs()[0].name: x})[0], _predict(net, x), rtol=1e-4, atol=1e-5
        )


@pytest.mark.parametrize("name", sorted(m for m, e in IMPORTS if e == "dynamo"))
def test_a_network_exported_at_batch_2_trains_at_batch_8_as_pytorch_does(name):
    """The dynamo exporter fixes the batch at the example's (2) in the model's shapes and reshapes; vmem
    reads that batch as the input's, so the network trains at batch 8: one SGD step equal to PyTorch's at
    batch 8 (the export's nodes, its reshapes' batch read as the input's)."""
    data = _data(name)
    assert bool(data["dynamo:b8:has_step"])
    ref = {k[len("dynamo:b8:") :]: v for k, v in data.items() if k.startswith("dynamo:b8:")}
    _trains_as_pytorch(name, CORPUS / f"{name}_dynamo.onnx", data["x8"], data["labels8"], ref)


def _trains_as_pytorch(name: str, path: Path, x: np.ndarray, labels: np.ndarray, ref: dict) -> vmem.Network:
    """The imported network after one SGD step in float64 on ``x``, checked against PyTorch's (``ref``): the
    loss, every weight within its bound of its change, and every weight PyTorch changes trained."""
    from onnx import numpy_helper

    initial = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    net = vmem.onnx.load(path)
    imported = {k: np.array(v, np.float64) for k, v in net.params.items()}
    with vmem.Trainer(net, optimizer=vmem.optim.SGD(lr=0.05, momentum=0.9), dtype="float64") as trainer:
        report = trainer.step(x.astype(np.float64), labels)
        trainer.sync()
    assert report.loss == pytest.approx(float(ref["loss"]), rel=1e-9)
    trained = set()
    for key, initializer in net.sources.items():
        mine = net.params[key]
        laid = _layout(initial[initializer], imported[key])  # how vmem holds the initializer
        theirs, before = laid(ref[f"init:{initializer}"]), laid(initial[initializer])
        if _tiled(initial[initializer], imported[key]):  # one copy a sample: vmem's one token takes their changes
            theirs = before + (ref[f"init:{initializer}"] - initial[initializer]).sum(axis=0).reshape(before.shape)
        change = np.abs(theirs - before).max()
        assert np.abs(mine - theirs).max() <= BOUND.get(name, 1e-9) * change + 1e-13 * np.abs(theirs).max(), key
        trained.add(initializer)
    moved = {k[5:] for k, v in ref.items() if k.startswith("init:") and not np.array_equal(v, initial[k[5:]])}
    assert moved <= trained, f"weights PyTorch trains and vmem does not: {sorted(moved - trained)}"
    return net


def _tiled(initializer: np.ndarray, held: np.ndarray) -> bool:
    """Whether an initializer is one block repeated along its first axis that vmem holds once: the dynamo
    exporter folds a class token expanded to the example batch into such a constant (one copy a sample,
    each trained by its own sample where PyTorch runs the export; vmem's one token by them all, as the
    module's own token is)."""
    n = initializer.shape[0] if initializer.ndim else 1
    return n > 1 and held.size * n == initializer.size and bool(np.all(initializer == initializer[:1]))


def _layout(initializer: np.ndarray, held: np.ndarray):
    """How vmem holds an initializer as its parameter: as it is (reshaped), transposed (a MatMul's weight:
    ONNX's (in, out), vmem's Linear (out, in)) or as filters (ONNX's (K, C, kh, kw), vmem's (K, kh, kw, C)),
    told apart by the values the import gave it; a tiled one (:func:`_tiled`) as its first block."""
    if _tiled(initializer, held):
        return lambda a: a[:1].reshape(held.shape)
    ways = [lambda a: a.reshape(held.shape)]
    if initializer.ndim == 2:
        ways.append(lambda a: a.T.reshape(held.shape))
    if initializer.ndim == 4:
        ways.append(lambda a: a.transpose(0, 2, 3, 1).reshape(held.shape))
    for way in ways:
        if way(initializer).size == held.size and np.array_equal(way(initializer.astype(np.float64)), held):
            return way
    raise AssertionError(f"a parameter of shape {held.shape} holds none of the layouts of {initializer.shape}")

"""The onnx package's own model zoo in small (``onnx/backend/test/data/light``: AlexNet, DenseNet-121, Inception
v1 and v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512, as shipped): each imports and gives
onnxruntime's output (rtol 1e-3, atol 1e-5) on a random image. VGG-19's and the AlexNets' fully connected
weights are computed at import (ConstantOfShape), SqueezeNet ends in an opset-9 Softmax over (N, 1000, 1,
1), the AlexNets and Inception v1 normalize with LRN."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import vmem

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.stem for p in LIGHT.glob("light_*.onnx")) if LIGHT.is_dir() else []


def test_the_zoo_is_there():
    assert len(MODELS) >= 6, f"the onnx package ships no light models in {LIGHT}"


def _logits(path: str) -> bytes | str:
    """The model, or, where it ends in a Softmax, the model without it (its logits as the output)."""
    model = onnx.load(path)
    last = model.graph.node[-1]
    if last.op_type != "Softmax" or last.output[0] != model.graph.output[0].name:
        return path
    del model.graph.node[-1]
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info(last.input[0]))
    return model.SerializeToString()


@pytest.mark.parametrize("name", MODELS)
def test_a_light_zoo_model_imports_and_gives_onnxruntimes_output(name):
    """The outputs as onnxruntime gives them, to 1e-3 relative and 1e-5 of the largest in magnitude. A model
    that ends in a Softmax is compared by its logits: SqueezeNet's, with the zoo's random weights, are about
    6.8e9 in float32, where each side's own rounding decides which class takes all of the softmax (and on
    which side of zero the last ReLU's near-zero values fall)."""
    path = _logits(str(LIGHT / f"{name}.onnx"))
    net = vmem.onnx.load(path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    first = session.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in first.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = session.run(None, {first.name: x})[0]
    with vmem.Trainer(
        net, device="cpu", memory="3GiB", policy="baseline", seed=0
    ) as trainer:  # VGG-19: 1.65 GiB of weights and state
        got = np.asarray(trainer.predict(x, batch_size=shape[0])).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5 * max(1.0, float(np.abs(want).max())))

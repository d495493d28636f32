"""Models exported from PyTorch (where it is installed): ResNet-50 and VGG-16 as torchvision builds them,
exported by the TorchScript exporter (batch norm kept, and folded into the convolutions as an eval-mode
export does) and by the dynamo exporter (where onnxscript is installed), import with onnxruntime's outputs;
ResNet-50 has its 25,557,032 trainable parameters, plans as vmem's own ResNet-50 does, and one SGD step of
the imported network equals PyTorch's."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import vmem

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from .torch_models import VGG16, MobileNetV2, ResNet50  # noqa: E402

pytestmark = pytest.mark.slow


def _export(module, x, mode: str, opset: int = 17) -> bytes:
    """``mode``: kept (training-mode batch norm, nothing folded), folded (an eval-mode export) or dynamo."""
    module.eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "dynamo":
            pytest.importorskip("onnxscript")
            batch = torch.export.Dim("batch", min=1)
            torch.onnx.export(module, (x,), f, opset_version=opset, dynamo=True, dynamic_shapes=({0: batch},))
        else:
            extra = dict(training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False) if mode == "kept" else {}
            torch.onnx.export(
                module,
                (x,),
                f,
                opset_version=opset,
                dynamo=False,
                input_names=["x"],
                dynamic_axes={"x": {0: "N"}},
                **extra,
            )
    return f.getvalue()


def _same_as_onnxruntime(data: bytes, x: np.ndarray) -> vmem.Graph:
    net = vmem.onnx.load(data)
    session = ort.InferenceSession(data)
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    with vmem.Trainer(net, memory="4GiB") as trainer:
        got = trainer.predict(x)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
    return net


def _randomize_statistics(module) -> None:
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)


@pytest.mark.parametrize("mode", ["kept", "folded", "dynamo"])
def test_resnet50_imports_with_onnxruntime_outputs(mode):
    torch.manual_seed(0)
    module = ResNet50()
    _randomize_statistics(module)
    x = torch.randn(2, 3, 96, 96)
    net = _same_as_onnxruntime(_export(module, x, mode), x.numpy())
    if mode == "kept":
        assert net.num_params() == 25_557_032 == sum(p.numel() for p in module.parameters())
        assert net.sources["layer1.0.conv1.weight"] == "layer1.0.conv1.weight"


@pytest.mark.parametrize("mode", ["kept", "folded", "dynamo"])
def test_mobilenet_v2_imports_with_onnxruntime_outputs(mode):
    """Depthwise convolutions (groups = channels), ReLU6 (Clip), inverted residuals."""
    torch.manual_seed(0)
    module = MobileNetV2()
    _randomize_statistics(module)
    x = torch.randn(2, 3, 64, 64)
    net = _same_as_onnxruntime(_export(module, x, mode), x.numpy())
    if mode == "kept":
        assert net.num_params() == 3_504_872 == sum(p.numel() for p in module.parameters())
        assert sum(1 for layer in net.layers if getattr(layer, "groups", 1) > 1) == 17


@pytest.mark.parametrize("opset", [13, 17, 18])
def test_vgg16_imports_at_each_opset(opset):
    torch.manual_seed(0)
    module = VGG16(num_classes=10, image=64)  # its classifier reads a flattened 2x2 map: columns permuted
    x = torch.randn(2, 3, 64, 64)
    _same_as_onnxruntime(_export(module, x, "kept", opset), x.numpy())


def test_policies_plan_an_imported_resnet50_as_vmems_own():
    x = torch.randn(1, 3, 224, 224)
    imported = vmem.onnx.load(_export(ResNet50(), x, "kept"))
    own = vmem.models.get("resnet50")
    for policy in ("baseline", "vdnn-all", "vdnn-conv", "gist", "echo", "vdnn-dyn", "auto"):
        budget = {"memory": "3GiB"} if policy in ("echo", "vdnn-dyn", "auto") else {}
        a = vmem.plan(imported, 32, "sim:v100-16gb", policy, **budget)
        b = vmem.plan(own, 32, "sim:v100-16gb", policy, **budget)
        assert a.fits and b.fits
        assert a.peak_bytes == pytest.approx(b.peak_bytes, rel=0.01), policy


def test_one_sgd_step_of_an_imported_resnet50_equals_pytorchs():
    """In float64 on both sides: a freshly initialised ResNet-50 in training mode is so ill-conditioned that
    PyTorch's own float32 gradients differ from its float64 ones by up to 20-30% (at batch 4-8, 64-128
    pixels), so float32 could not tell a mistake from rounding. Parameters are compared by the names the
    export kept (``net.sources``), filters moved to vmem's (K, kh, kw, C)."""
    torch.manual_seed(0)
    module = ResNet50(num_classes=10)
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    net = vmem.onnx.load(_export(module, x, "kept"))
    module.double().train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(module(x.double()), y).backward()
    opt.step()
    with vmem.Trainer(net, optimizer=vmem.optim.SGD(lr=0.05, momentum=0.9), dtype="float64") as trainer:
        trainer.step(x.numpy().astype(np.float64), y.numpy())
        trainer.sync()
    _same_weights(net, module)


def test_one_sgd_step_of_an_imported_mobilenet_v2_equals_pytorchs():
    """Depthwise convolutions trained: in float64, as for ResNet-50; dropout off (the two would draw
    different masks)."""
    torch.manual_seed(0)
    module = MobileNetV2(num_classes=10)
    module.classifier[0].p = 0.0
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))  # batch norm over 16 values at the end
    net = vmem.onnx.load(_export(module, x, "kept"))
    module.double().train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(module(x.double()), y).backward()
    opt.step()
    with vmem.Trainer(net, optimizer=vmem.optim.SGD(lr=0.05, momentum=0.9), dtype="float64") as trainer:
        trainer.step(x.numpy().astype(np.float64), y.numpy())
        trainer.sync()
    _same_weights(net, module)


def _same_weights(net, module) -> None:
    """Every parameter and statistic equal to PyTorch's within 1e-4 relative (1e-8 absolute for those whose
    gradient cancels to nothing: a bias before batch norm), found by the name the export kept."""
    theirs = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    assert len(net.sources) == len([k for k in theirs if "num_batches" not in k])  # every weight and statistic
    for key, source in net.sources.items():
        want = theirs[source]
        want = want.transpose(0, 2, 3, 1) if want.ndim == 4 else want  # vmem's filters are (K, kh, kw, C)
        np.testing.assert_allclose(net.params[key], want, rtol=1e-4, atol=1e-8, err_msg=key)

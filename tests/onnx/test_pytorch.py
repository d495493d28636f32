"""Models exported from PyTorch (where it is installed): ResNet-50 and VGG-16 as torchvision builds them,
exported by the TorchScript exporter (batch norm kept, and folded into the convolutions as an eval-mode
export does) and by the dynamo exporter (where onnxscript is installed), import with onnxruntime's outputs;
ResNet-50 has its 25,557,032 trainable parameters, plans as vmem's own ResNet-50 does, and one SGD step of
the imported network equals PyTorch's."""

from __future__ import annotations

import io
import tempfile
import warnings

import numpy as np
import pytest

import vmem

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from .torch_models import VGG16, BertLike, MobileNetV2, ResNet50  # noqa: E402

pytestmark = pytest.mark.slow


def _export(module, x, mode: str, opset: int = 17) -> bytes:
    """``mode``: kept (training-mode batch norm, nothing folded), folded (an eval-mode export) or dynamo.
    ``x``: the input, or a tuple of them."""
    module.eval()
    xs = x if isinstance(x, tuple) else (x,)
    names = [f"x{i}" for i in range(len(xs))]
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "dynamo":
            pytest.importorskip("onnxscript")
            batch = torch.export.Dim("batch", min=1)
            shapes = tuple({0: batch} for _ in xs)
            torch.onnx.export(module, xs, f, opset_version=opset, dynamo=True, dynamic_shapes=shapes)
        else:
            extra = dict(training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False) if mode == "kept" else {}
            torch.onnx.export(
                module,
                xs,
                f,
                opset_version=opset,
                dynamo=False,
                input_names=names,
                dynamic_axes={name: {0: "N"} for name in names},
                **extra,
            )
    return f.getvalue()


def _same_as_onnxruntime(data: bytes, x) -> vmem.Graph:
    net = vmem.onnx.load(data)
    session = ort.InferenceSession(data)
    xs = x if isinstance(x, tuple) else (x,)
    want = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), xs)})[0]
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
@pytest.mark.parametrize(
    "make, size, params, grouped",
    [(ResNet50, 96, 25_557_032, 0), (MobileNetV2, 64, 3_504_872, 17)],  # MobileNetV2: depthwise, ReLU6
    ids=["resnet50", "mobilenet_v2"],
)
def test_a_model_imports_with_onnxruntime_outputs(make, size, params, grouped, mode):
    torch.manual_seed(0)
    module = make()
    _randomize_statistics(module)
    x = torch.randn(2, 3, size, size)
    net = _same_as_onnxruntime(_export(module, x, mode), x.numpy())
    if mode == "kept":  # every weight a parameter, named as the module names it
        assert net.num_params() == params == sum(p.numel() for p in module.parameters())
        assert sum(1 for layer in net.layers if getattr(layer, "groups", 1) > 1) == grouped
        first = "conv1.weight" if make is ResNet50 else "features.0.0.weight"
        assert net.sources[first] == first


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


def _one_sgd_step_matches(module, x, y, constants: tuple[str, ...] = ()) -> None:
    """One SGD step (momentum 0.9) of the imported network equals PyTorch's, both in float64 (``x`` an input
    or a tuple; float inputs in float64, integer ones as they are). ``constants``: PyTorch parameters the
    export turns into constants (vmem imports them as such)."""
    net = vmem.onnx.load(_export(module, x, "kept"))
    xs = x if isinstance(x, tuple) else (x,)
    module.double().train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(module(*(a.double() if a.is_floating_point() else a for a in xs)), y).backward()
    opt.step()
    arrays = tuple(a.numpy().astype(np.float64) if a.is_floating_point() else a.numpy() for a in xs)
    with vmem.Trainer(net, optimizer=vmem.optim.SGD(lr=0.05, momentum=0.9), dtype="float64") as trainer:
        trainer.step(arrays if len(arrays) > 1 else arrays[0], y.numpy())
        trainer.sync()
    _same_weights(net, module, constants)


def _same_weights(net, module, constants: tuple[str, ...] = ()) -> None:
    """Every parameter and statistic equal to PyTorch's within 1e-4 relative (1e-8 absolute for those whose
    gradient cancels to nothing: a bias before batch norm), found by the name the export kept."""
    theirs = {k: v.detach().numpy() for k, v in module.state_dict().items() if k not in constants}
    assert len(net.sources) == len([k for k in theirs if "num_batches" not in k])  # every weight and statistic
    for key, source in net.sources.items():
        want = theirs[source]
        want = want.transpose(0, 2, 3, 1) if want.ndim == 4 else want  # vmem's filters are (K, kh, kw, C)
        want = want.reshape(net.params[key].shape)  # a position table added to (N, T, H): held (1, T, H)
        np.testing.assert_allclose(net.params[key], want, rtol=1e-4, atol=1e-8, err_msg=key)


def test_one_sgd_step_of_an_imported_resnet50_equals_pytorchs():
    """In float64 on both sides: a freshly initialised ResNet-50 in training mode is so ill-conditioned that
    PyTorch's own float32 gradients differ from its float64 ones by up to 20-30% (at batch 4-8, 64-128
    pixels), so float32 could not tell a mistake from rounding. Parameters are compared by the names the
    export kept (``net.sources``)."""
    torch.manual_seed(0)
    _one_sgd_step_matches(ResNet50(num_classes=10), torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,)))


def test_one_sgd_step_of_an_imported_mobilenet_v2_equals_pytorchs():
    """Depthwise convolutions trained; dropout off (the two would draw different masks); batch norm over 16
    values at the end (4 images of 2x2)."""
    torch.manual_seed(0)
    module = MobileNetV2(num_classes=10)
    module.classifier[0].p = 0.0
    _one_sgd_step_matches(module, torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,)))


def _bert(seed: int = 0):
    """A BertLike whose layer norms are not all ones and zeros (as after training)."""
    torch.manual_seed(seed)
    module = BertLike()
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return module


def _bert_batch(n: int = 3):
    ids = torch.randint(0, 100, (n, 16))
    mask = torch.ones(n, 16, dtype=torch.long)
    mask[1, 9:] = 0  # padding in the second sequence
    return ids, mask


@pytest.mark.parametrize("mode", ["kept", "dynamo"])
def test_a_bert_like_encoder_imports_with_onnxruntime_outputs(mode):
    """Two inputs (token ids and a padding mask), embeddings, attention's 4-D (N, heads, T, d) tensors, GELU,
    layer norms; every linear layer's bias trainable (not a constant added after a MatMul)."""
    module = _bert()
    ids, mask = _bert_batch()
    net = _same_as_onnxruntime(_export(module, (ids, mask), mode), (ids.numpy(), mask.numpy()))
    kinds = [layer.kind for layer in net.layers]
    assert len(net.inputs) == 2 and "gelu" in kinds and "erf" not in kinds  # GELU fused into one layer
    with tempfile.TemporaryDirectory() as folder:  # and back: token ids an INT64 input, the same outputs
        vmem.onnx.save(net, f"{folder}/bert.onnx")
        session = ort.InferenceSession(f"{folder}/bert.onnx")
        assert [i.type for i in session.get_inputs()] == ["tensor(int64)", "tensor(float)"]
        feeds = dict(zip([i.name for i in session.get_inputs()], (ids.numpy(), mask.numpy().astype(np.float32))))
        with vmem.Trainer(net) as trainer:
            mine = trainer.predict((ids.numpy(), mask.numpy()))
        np.testing.assert_allclose(session.run(None, feeds)[0], mine, rtol=1e-3, atol=1e-5)
    if mode == "kept":  # the position table, read at positions 0..T-1, trains (a parameter added to the sequence)
        assert net.num_params() == sum(p.numel() for p in module.parameters())
        assert net.sources["layers.0.query.bias"] == "layers.0.query.bias"


def test_one_sgd_step_of_an_imported_bert_like_encoder_equals_pytorchs():
    _one_sgd_step_matches(_bert(), _bert_batch(4), torch.randint(0, 3, (4,)))


def test_merged_initializers_keep_their_parameters_names():
    """At initialisation every layer norm is ones and zeros; the exporter keeps one initializer and makes
    the others Identity copies named after their own parameters: each imports as that parameter."""
    torch.manual_seed(0)
    module = BertLike()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no layer shares a parameter
        net = vmem.onnx.load(_export(module, _bert_batch(), "kept"))
    assert sorted(net.sources.values()) == sorted(module.state_dict())

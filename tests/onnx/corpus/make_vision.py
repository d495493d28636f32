"""Regenerate the vision corpus (``tests/onnx/corpus/vision``): networks of timm's families (small
configurations, random weights, no download), exported as a PyTorch user exports them, so that the suite
checks the importer against what users bring without torch or timm installed.

Needs torch, torchvision, timm, onnx and onnxscript (torch 2.14.1 and torchvision 0.29.1 with timm 1.0.31
here); run from the repository root::

    python tests/onnx/corpus/make_vision.py            # every model
    python tests/onnx/corpus/make_vision.py --list     # their names

Each model ``NAME`` is exported three ways: ``NAME_dynamo.onnx`` (and ``NAME_dynamo.onnx.data``, its weights)
by ``torch.onnx.export(model, (x,), path)`` with PyTorch's defaults (the dynamo exporter: its default opset,
the batch fixed at the example's 2, batch norm folded into the convolutions), and ``NAME_opset14.onnx`` and
``NAME_opset17.onnx`` by the TorchScript exporter (``dynamo=False``) with a symbolic batch axis. ``NAME.npz``
holds the batch (``x0``), its labels (``labels``), the model's output on it in float64 (``out``), and per export
``E`` the reference of one SGD step (learning rate 0.05, momentum 0.9) of the network *as exported*, in
float64: every node of the export run by PyTorch's own operations with autograd (:func:`torch_of_onnx`), its
float initializers of more than one value the parameters (``E:loss``, ``E:init:<initializer>`` after the step; ``E:same_as``: the
export whose reference is the same). A network whose export holds an op the reference does not run has no
step reference (``E:has_step`` false; the importer refuses those anyway). ``x8``, ``labels8`` and
``dynamo:b8:...``: a batch of 8 and the same reference of the dynamo export (made at batch 2) on it, the
batch its reshapes hold read as the input's (and a class token it folded into one copy a sample read as
one). ``make_vision.py --references [NAME ...]`` makes the references again from the stored exports and
batches, with torch only.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent / "vision"
OPSETS = (14, 17)
CLASSES = 3
EXPORTS = ("dynamo", "opset14", "opset17")


def models() -> dict[str, tuple[Callable[[], torch.nn.Module], int]]:
    """Every model: (its constructor, its input's side)."""
    from timm.models.convnext import ConvNeXt
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.efficientnet import _gen_efficientnet
    from timm.models.mobilenetv3 import _gen_mobilenet_v3
    from timm.models.vision_transformer import VisionTransformer

    def mobilenetv3() -> torch.nn.Module:
        m = _gen_mobilenet_v3("mobilenetv3_small_050", 0.05, pretrained=False, num_classes=CLASSES)
        m.conv_head = torch.nn.Conv2d(m.conv_head.in_channels, 16, 1)  # the 1024-wide head made small
        m.classifier = torch.nn.Linear(16, CLASSES)
        return m

    def efficientnet() -> torch.nn.Module:
        m = _gen_efficientnet("efficientnet_b0", channel_multiplier=0.1, depth_multiplier=0.1, num_classes=CLASSES)
        m.conv_head = torch.nn.Conv2d(m.conv_head.in_channels, 16, 1, bias=False)  # 1280 wide: made small
        m.bn2 = type(m.bn2)(16)
        m.classifier = torch.nn.Linear(16, CLASSES)
        return m

    vit = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=CLASSES, mlp_ratio=2)
    return {
        "mobilenetv3": (mobilenetv3, 32),
        "efficientnet": (efficientnet, 32),
        "convnext": (lambda: ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 8, 16, 16), num_classes=CLASSES), 32),
        "vit": (lambda: VisionTransformer(**vit), 16),
        "deit": (lambda: VisionTransformerDistilled(**vit), 16),
    }


# -- the reference: an export's nodes run by PyTorch ------------------------------------------------------
def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pads(attrs: dict[str, Any]) -> tuple[int, int]:
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if pads[:2] != pads[2:]:
        raise NotImplementedError(f"asymmetric padding {pads}")
    return pads[0], pads[1]


def _hardsigmoid(x: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """PyTorch's own ``F.hardsigmoid`` where the node is its export (alpha the float32 of 1/6: PyTorch
    computes with 1/6 itself), else the node's formula."""
    if np.float32(alpha) == np.float32(1 / 6) and beta == 0.5:
        return F.hardsigmoid(x)
    return torch.clamp(alpha * x + beta, 0, 1)


def _run(op: str, attrs: dict[str, Any], xs: list[Any]) -> Any:
    if op == "Conv":
        w = xs[1]
        return F.conv2d(
            xs[0],
            w,
            xs[2] if len(xs) > 2 else None,
            stride=tuple(attrs.get("strides", [1, 1])),
            padding=_pads(attrs),
            dilation=tuple(attrs.get("dilations", [1, 1])),
            groups=int(attrs.get("group", 1)),
        )
    if op == "Gemm":
        a = xs[0].T if attrs.get("transA", 0) else xs[0]
        b = xs[1].T if attrs.get("transB", 0) else xs[1]
        y = attrs.get("alpha", 1.0) * (a @ b)
        return y + attrs.get("beta", 1.0) * xs[2] if len(xs) > 2 else y
    simple = {
        "Add": lambda: xs[0] + xs[1],
        "Sub": lambda: xs[0] - xs[1],
        "Mul": lambda: xs[0] * xs[1],
        "MatMul": lambda: xs[0] @ xs[1],
        "Relu": lambda: torch.relu(xs[0]),
        "Sigmoid": lambda: torch.sigmoid(xs[0]),
        "Erf": lambda: torch.erf(xs[0]),
        "Sqrt": lambda: torch.sqrt(xs[0]),
        "Pow": lambda: torch.pow(xs[0], xs[1]),
        "Identity": lambda: xs[0],
        "HardSwish": lambda: F.hardswish(xs[0]),
        "HardSigmoid": lambda: _hardsigmoid(xs[0], attrs.get("alpha", 0.2), attrs.get("beta", 0.5)),
        "GlobalAveragePool": lambda: xs[0].mean(dim=(2, 3), keepdim=True),
        "Flatten": lambda: xs[0].flatten(int(attrs.get("axis", 1))),
        "Transpose": lambda: xs[0].permute(*attrs["perm"]),
        "Gelu": lambda: F.gelu(xs[0], approximate=attrs.get("approximate", b"none").decode()),
    }
    if op in simple:
        return simple[op]()
    if op in _SHAPE_OPS:
        return _SHAPE_OPS[op](attrs, xs)
    if op == "ReduceMean":
        axes = attrs.get("axes") or [int(v) for v in xs[1].tolist()]
        return xs[0].mean(dim=tuple(axes), keepdim=bool(attrs.get("keepdims", 1)))
    if op == "Reshape":
        shape = [int(v) for v in xs[1].tolist()]
        batch = _BATCH[0]
        if shape and batch != _EXAMPLE and shape[0] > 0 and shape[0] % _EXAMPLE == 0:
            # the export's batch baked in: the first axis holds it (alone, or merged with the heads after it)
            shape[0] = shape[0] // _EXAMPLE * batch
        shape = [xs[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
        return xs[0].reshape(shape)
    if op == "LayerNormalization":
        axis = int(attrs.get("axis", -1))
        dims = xs[0].shape[axis:] if axis >= 0 else xs[0].shape[axis:]
        return F.layer_norm(xs[0], dims, xs[1], xs[2] if len(xs) > 2 else None, float(attrs.get("epsilon", 1e-5)))
    raise NotImplementedError(op)


def torch_of_onnx(model: Any) -> tuple[torch.nn.ParameterDict, Callable[[torch.Tensor], torch.Tensor]]:
    """The export as PyTorch runs it in float64: its float initializers as parameters (by name), and a
    function of the graph's input running every node with PyTorch's operations."""
    from onnx import numpy_helper

    graph = model.graph
    params, consts = torch.nn.ParameterDict(), {}
    for t in graph.initializer:
        value = numpy_helper.to_array(t)
        if value.dtype.kind == "f" and value.size > 1:  # a single value is a constant the exporter wrote
            # (attention's scale, a scalar): no module's parameter
            params[t.name.replace(".", "\x1f")] = torch.nn.Parameter(torch.tensor(value, dtype=torch.float64))
        else:
            consts[t.name] = torch.tensor(value)
    for node in graph.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = torch.tensor(numpy_helper.to_array(_attrs(node)["value"]))
    nodes = [n for n in graph.node if n.op_type != "Constant"]
    for n in nodes:  # every op runs here, or the export has no reference
        if n.op_type not in _OPS and n.op_type not in _SHAPE_OPS:
            raise NotImplementedError(n.op_type)

    def forward(x: torch.Tensor) -> torch.Tensor:
        _BATCH[0] = int(x.shape[0])
        values: dict[str, Any] = {graph.input[0].name: x, **consts}
        values.update({k.replace("\x1f", "."): v for k, v in params.items()})
        for n in nodes:
            out = _run(n.op_type, _attrs(n), [values[i] for i in n.input if i])
            for name, value in zip(n.output, out if isinstance(out, tuple) else (out,)):
                values[name] = value
        return values[graph.output[0].name]

    return params, forward


def _batched(xs: list[Any], axis: int) -> list[Any]:
    """A concatenation's inputs at the batch the reference runs at: an input the export made at its batch
    (a class token the exporter folded into one copy a sample, ``expand``) read as its first copy for every
    sample (as the module's own token is), where the batch is another."""
    batch = _BATCH[0]
    if axis % xs[0].ndim == 0 or batch == _EXAMPLE:
        return list(xs)
    return [t[:1].expand(batch, *t.shape[1:]) if t.shape[0] == _EXAMPLE else t for t in xs]


def _ints(v: Any) -> list[int]:
    return [int(a) for a in (v.tolist() if hasattr(v, "tolist") else v)]


def _strided(data: Any, idx: Any) -> Any:
    """``Tensor.as_strided`` as the dynamo exporter writes it (a Gather of the flattened tensor at
    ``arange(n).reshape(shape).transpose(perm)``, ``n`` its size at the export's batch), at the batch the
    reference runs at: the reshape's first axis the batch; None where ``idx`` is no such pattern."""
    import itertools

    index = idx.numpy()
    if data.ndim != 1 or index.ndim < 2 or data.numel() * _EXAMPLE != index.size * _BATCH[0]:
        return None
    flat = np.arange(index.size)
    for perm in itertools.permutations(range(index.ndim)):
        shape = [index.shape[perm.index(k)] for k in range(index.ndim)]
        if np.array_equal(flat.reshape(shape).transpose(perm), index):
            shape[0] = shape[0] // _EXAMPLE * _BATCH[0]
            return data.reshape(shape).permute(*perm)
    return None


def _gather(attrs: dict[str, Any], xs: list[Any]) -> Any:
    axis = int(attrs.get("axis", 0)) % xs[0].ndim
    if _BATCH[0] != _EXAMPLE and axis == 0 and (strided := _strided(xs[0], xs[1])) is not None:
        return strided
    idx = xs[1].long()
    idx = torch.where(idx < 0, idx + xs[0].shape[axis], idx)
    out = xs[0].index_select(axis, idx.reshape(-1))
    return out.reshape(xs[0].shape[:axis] + idx.shape + xs[0].shape[axis + 1 :])


def _slice(attrs: dict[str, Any], xs: list[Any]) -> Any:
    starts, ends = _ints(xs[1]), _ints(xs[2])
    axes = _ints(xs[3]) if len(xs) > 3 else list(range(len(starts)))
    steps = _ints(xs[4]) if len(xs) > 4 else [1] * len(starts)
    index = [slice(None)] * xs[0].ndim
    for a, lo, hi, st in zip(axes, starts, ends, steps):
        n = xs[0].shape[a]
        index[a] = slice(max(min(lo, n), -n), max(min(hi, n), -n - 1), st)
    return xs[0][tuple(index)]


def _split(attrs: dict[str, Any], xs: list[Any]) -> Any:
    axis = int(attrs.get("axis", 0))
    sizes = _ints(xs[1]) if len(xs) > 1 else list(attrs.get("split", []))
    if not sizes:
        n = int(attrs["num_outputs"])
        sizes = [xs[0].shape[axis] // n] * n
    return tuple(torch.split(xs[0], sizes, dim=axis))


def _cast(attrs: dict[str, Any], xs: list[Any]) -> Any:
    import onnx

    kind = onnx.helper.tensor_dtype_to_np_dtype(int(attrs["to"])).kind
    return xs[0].double() if kind == "f" else (xs[0].bool() if kind == "b" else xs[0].long())


def _div(attrs: dict[str, Any], xs: list[Any]) -> Any:
    if xs[0].is_floating_point() or xs[1].is_floating_point():
        return xs[0] / xs[1]
    return torch.div(xs[0], xs[1], rounding_mode="trunc")


#: shape computations and the moves of values ViT's exports hold
_SHAPE_OPS: dict[str, Callable[[dict[str, Any], list[Any]], Any]] = {
    "Shape": lambda a, xs: torch.tensor(list(xs[0].shape)[a.get("start", 0) : a.get("end")], dtype=torch.long),
    "ConstantOfShape": lambda a, xs: torch.full(
        _ints(xs[0]), float(np.asarray(_value(a)).reshape(-1)[0]) if "value" in a else 0.0, dtype=torch.float64
    ),
    "Where": lambda a, xs: torch.where(xs[0].bool(), xs[1], xs[2]),
    "Equal": lambda a, xs: torch.eq(xs[0], xs[1]),
    "Expand": lambda a, xs: xs[0].expand(*np.broadcast_shapes(tuple(xs[0].shape), tuple(_ints(xs[1])))),
    "Gather": _gather,
    "Slice": _slice,
    "Split": _split,
    "Cast": _cast,
    "Div": _div,
    "Unsqueeze": lambda a, xs: xs[0].reshape(_unsqueezed(xs[0].shape, _ints(xs[1]) if len(xs) > 1 else a["axes"])),
    "Squeeze": lambda a, xs: _squeezed(xs[0], _ints(xs[1]) if len(xs) > 1 else a.get("axes")),
    "Softmax": lambda a, xs: torch.softmax(xs[0], dim=int(a.get("axis", -1))),
    "Concat": lambda a, xs: torch.cat(_batched(xs, int(a["axis"])), dim=int(a["axis"])),
}


def _value(attrs: dict[str, Any]) -> Any:
    from onnx import numpy_helper

    return numpy_helper.to_array(attrs["value"])


def _unsqueezed(shape: Any, axes: list[int]) -> list[int]:
    out = list(shape)
    rank = len(out) + len(axes)
    for a in sorted(x % rank for x in axes):
        out.insert(a, 1)
    return out


def _squeezed(x: Any, axes: Any) -> Any:
    if axes is None:
        return x.squeeze()
    for a in sorted((int(v) % x.ndim for v in axes), reverse=True):
        x = x.squeeze(a)
    return x


#: the batch the models are exported at (the dynamo exporter bakes it into its reshapes)
_EXAMPLE = 2
#: the batch the reference runs at (set by each forward): where it is not the export's, reshapes scale it
_BATCH = [_EXAMPLE]
_OPS = {
    "Conv",
    "Gemm",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "MatMul",
    "Relu",
    "Sigmoid",
    "Erf",
    "Sqrt",
    "Pow",
    "Identity",
    "HardSwish",
    "HardSigmoid",
    "GlobalAveragePool",
    "Flatten",
    "Transpose",
    "Gelu",
    "ReduceMean",
    "Reshape",
    "LayerNormalization",
}


def _step(model: Any, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray] | None:
    """One SGD step of the export as PyTorch runs it (see :func:`torch_of_onnx`), or None where an op of the
    export is not one the reference runs."""
    try:
        params, forward = torch_of_onnx(model)
        opt = torch.optim.SGD(params.values(), lr=0.05, momentum=0.9)
        loss = F.cross_entropy(forward(torch.tensor(x, dtype=torch.float64)), torch.tensor(labels))
    except (NotImplementedError, RuntimeError, ValueError):  # an op it does not run, a batch the export fixed
        return None
    loss.backward()
    opt.step()
    out = {"loss": np.float64(loss.item())}
    out.update({f"init:{k.replace(chr(31), '.')}": v.detach().numpy() for k, v in params.items()})
    return out


# -- the exports ------------------------------------------------------------------------------------------
def _export(module: torch.nn.Module, x: torch.Tensor, how: str, path: Path) -> Any:
    import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "dynamo":
            torch.onnx.export(module, (x,), str(path))  # PyTorch's defaults, as a user writes it
            scrub(path)
        else:
            torch.onnx.export(
                module,
                (x,),
                str(path),
                dynamo=False,
                opset_version=int(how[len("opset") :]),
                input_names=["x0"],
                output_names=["out"],
                dynamic_axes={"x0": {0: "N"}, "out": {0: "N"}},
            )
    return onnx.load(str(path))


def scrub(path: Path) -> None:
    """Drop what the dynamo exporter records of the machine it ran on (each node's stack trace, with the
    paths of the installed packages) from the export at ``path``; its graph and weights stay as they are."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
    data = path.name + ".data"
    (path.parent / data).unlink(missing_ok=True)  # read in whole above; onnx refuses to write over it
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data)


def _equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def make(name: str, n: int = _EXAMPLE, larger: int = 8) -> None:
    """Write ``name``'s three exports and its reference data."""
    build, side = models()[name]
    torch.manual_seed(0)
    module = build().eval()
    with torch.no_grad():  # every parameter and statistic its own values, as after training
        noise = torch.Generator().manual_seed(3)
        for p in module.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=noise, dtype=p.dtype))
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, CLASSES, (n,), generator=torch.Generator().manual_seed(2)).numpy()
    HERE.mkdir(exist_ok=True)
    for how in EXPORTS:
        _export(module, x, how, HERE / f"{name}_{how}.onnx")
    with torch.no_grad():
        out = module.double()(x.double()).numpy()
    # the export made at batch 2 trained at batch 8 (its reshapes' batch read as the input's)
    x8 = torch.randn(larger, 3, side, side, generator=torch.Generator().manual_seed(4))
    labels8 = torch.randint(0, CLASSES, (larger,), generator=torch.Generator().manual_seed(5)).numpy()
    base = {"x0": x.numpy(), "labels": labels, "out": out, "x8": x8.numpy(), "labels8": labels8}
    np.savez_compressed(HERE / f"{name}.npz", **base, **_references(name, base))


def _references(name: str, base: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The step references of ``name``'s stored exports (see the module docstring) on ``base``'s batches."""
    import onnx

    arrays: dict[str, np.ndarray] = {}
    steps: dict[str, dict[str, np.ndarray]] = {}
    for how in EXPORTS:
        step = _step(onnx.load(str(HERE / f"{name}_{how}.onnx")), base["x0"], base["labels"])
        arrays[f"{how}:has_step"] = np.bool_(step is not None)
        same = next((k for k, v in steps.items() if step is not None and _equal(v, step)), None)
        if same is not None:  # the same graph at another opset: its reference is the other's
            arrays[f"{how}:same_as"] = np.array(same)
            continue
        if step is not None:
            steps[how] = step
            arrays.update({f"{how}:{k}": v for k, v in step.items()})
    step8 = _step(onnx.load(str(HERE / f"{name}_dynamo.onnx")), base["x8"], base["labels8"])
    arrays["dynamo:b8:has_step"] = np.bool_(step8 is not None)
    arrays.update({f"dynamo:b8:{k}": v for k, v in (step8 or {}).items()})
    arrays["exports"] = np.array(json.dumps(list(EXPORTS)))
    return arrays


#: the models, named without timm (which :func:`models` needs)
NAMES = ("mobilenetv3", "efficientnet", "convnext", "vit", "deit")


def references(name: str) -> None:
    """The step references of ``name`` made again from its stored exports and batches (torch only: no timm,
    no export), for a change of the reference itself (``make_vision.py --references [NAME ...]``)."""
    with np.load(HERE / f"{name}.npz", allow_pickle=False) as f:
        base = {k: f[k] for k in ("x0", "labels", "out", "x8", "labels8")}
    np.savez_compressed(HERE / f"{name}.npz", **base, **_references(name, base))


def main(argv: list[str] | None = None) -> int:
    from make import cli  # the corpus's other script, beside this one

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--references"]:
        for name in args[1:] or NAMES:
            references(name)
            print(f"{name}: references made again from {HERE}")
        return 0

    return cli(argv, __doc__ or "", list(models()), make)


if __name__ == "__main__":
    sys.exit(main())

"""How far one FP32 training step lands from the same step in float64: vmem against PyTorch.

The same network is built in PyTorch (``digits_vgg`` as vmem's zoo builds it: eight 3x3 convolutions with
batch norm at 16x16, two at 8x8; and ``resnet_cifar`` of depth 8, batch norm throughout), exported to ONNX
with training-mode batch norm and imported into vmem, so that both sides start from the same weights. Each
side then takes one SGD step (momentum 0.9) in float32 and one in float64 from those weights, on the same
batch (digits scaled to 16x16 for the VGG, normal noise for the ResNet). The error of a tensor is
``|change32 - change64| / |change64|`` over what the step changed in it; tensors whose float64 change is
below 1e-9 of the largest (a bias before batch norm, whose gradient cancels to nothing) are left out. The
float64 steps of the two sides agree to about 1e-13 (tests/onnx/test_pytorch.py).

Target (issue 59): vmem's worst tensor error at most twice PyTorch's, for each network at batch 32 and 256.

    python bench/fp32_accuracy.py [--batches 32,256] [--json]

Needs PyTorch and onnx (``pip install torch onnx``); PyTorch only as the reference.
"""

from __future__ import annotations

import argparse
import copy
import io
import sys
import warnings

import numpy as np

from _report import emit, table, verdict

import vmem

LR, MOMENTUM = 0.05, 0.9


def torch_digits_vgg(torch, width: int = 8, depth: int = 8):
    nn = torch.nn
    layers, c = [], 1
    for out in [width] * depth + ["pool"] + [2 * width] * 2:
        if out == "pool":
            layers.append(nn.MaxPool2d(2))
            continue
        layers += [nn.Conv2d(c, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
        c = out
    layers += [nn.MaxPool2d(2), nn.Flatten(), nn.Linear(c * 4 * 4, 10)]
    return nn.Sequential(*layers)


def torch_resnet_cifar8(torch):
    nn = torch.nn

    def conv_bn(cin, cout, stride=1):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)]

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(*conv_bn(cin, cout, stride), nn.ReLU(), *conv_bn(cout, cout))
            self.short = (
                None
                if stride == 1 and cin == cout
                else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            )

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.short is None else self.short(x)))

    return nn.Sequential(
        *conv_bn(3, 16),
        nn.ReLU(),
        Block(16, 16, 1),
        Block(16, 32, 2),
        Block(32, 64, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


#: the map each network flattens before its linear layer (C, H, W)
FLAT = {"digits_vgg": (16, 4, 4), "resnet_cifar8": (64, 1, 1)}


def export(torch, module, x) -> bytes:
    module.eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (x,),
            f,
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "N"}},
            training=torch.onnx.TrainingMode.PRESERVE,
            do_constant_folding=False,
        )
    return f.getvalue()


def torch_changes(torch, module, x: np.ndarray, y: np.ndarray, dtype) -> dict[str, np.ndarray]:
    m = copy.deepcopy(module).to(dtype).train()
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    torch.nn.functional.cross_entropy(m(torch.from_numpy(x).to(dtype)), torch.from_numpy(y)).backward()
    opt.step()
    return {k: (v.detach() - before[k]).double().numpy() for k, v in m.named_parameters()}


def vmem_changes(
    model: bytes, x: np.ndarray, y: np.ndarray, dtype: str, flat: tuple[int, int, int] | None = None
) -> dict[str, np.ndarray]:
    """What one step changed in each trained tensor, by PyTorch's names and in its layouts (filters KCRS; a
    linear layer after a flattened (C, H, W) map ``flat``, whose columns vmem orders (H, W, C), put back)."""
    net = vmem.onnx.load(model)
    with vmem.Trainer(net, optimizer=vmem.optim.SGD(lr=LR, momentum=MOMENTUM), dtype=dtype, seed=0) as t:
        before = {k: v.astype(np.float64) for k, v in t.net.params.items()}
        t.step(x.astype(dtype), y)
        t.sync()
    out = {}
    for key, source in net.sources.items():
        if key not in before or "running" in key:
            continue
        change = net.params[key].astype(np.float64) - before[key]
        if change.ndim == 4:  # filters KRSC -> KCRS
            change = change.transpose(0, 3, 1, 2)
        elif flat is not None and change.ndim == 2 and change.shape[1] == int(np.prod(flat)):
            c, h, w = flat
            change = change.reshape(-1, h, w, c).transpose(0, 3, 1, 2).reshape(change.shape)
        out[source] = change
    return out


def errors(low: dict[str, np.ndarray], high: dict[str, np.ndarray]) -> list[float]:
    largest = max(float(np.linalg.norm(v)) for v in high.values())
    return sorted(
        float(np.linalg.norm(low[k].reshape(high[k].shape) - high[k]) / np.linalg.norm(high[k]))
        for k in high
        if np.linalg.norm(high[k]) > 1e-9 * largest
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batches", default="32,256", help="batch sizes (default 32,256)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("bench/fp32_accuracy.py needs PyTorch as the reference: pip install torch onnx", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    train, _ = vmem.data.digits(image_size=16, channels=1)
    rng = np.random.default_rng(0)
    networks = {"digits_vgg": torch_digits_vgg(torch), "resnet_cifar8": torch_resnet_cifar8(torch)}
    rows, results, targets = [], {}, []
    for name, module in networks.items():
        for batch in (int(b) for b in args.batches.split(",")):
            if name == "digits_vgg":
                x, y = train.x[:batch].astype(np.float32), train.y[:batch].astype(np.int64)
            else:
                x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
                y = rng.integers(0, 10, batch).astype(np.int64)
            model = export(torch, module, torch.from_numpy(x[:2]))
            t64 = torch_changes(torch, module, x, y, torch.float64)
            theirs = errors(torch_changes(torch, module, x, y, torch.float32), t64)
            mine = errors(vmem_changes(model, x, y, "float32"), vmem_changes(model, x, y, "float64"))
            agree = max(errors(vmem_changes(model, x, y, "float64", FLAT[name]), t64))
            results[f"{name} b{batch}"] = {
                "vmem_worst": mine[-1],
                "vmem_median": mine[len(mine) // 2],
                "pytorch_worst": theirs[-1],
                "pytorch_median": theirs[len(theirs) // 2],
                "float64_sides_agree": agree,
            }
            rows.append(
                (
                    name,
                    batch,
                    f"{mine[-1]:.2e}",
                    f"{theirs[-1]:.2e}",
                    f"{mine[len(mine) // 2]:.2e}",
                    f"{theirs[len(theirs) // 2]:.2e}",
                    f"{agree:.1e}",
                )
            )
            targets.append(
                verdict(
                    f"{name} b{batch}: vmem's worst FP32 error / PyTorch's", mine[-1] / theirs[-1], 2.0, at_least=False
                )
            )
    print(
        table(
            ["network", "batch", "vmem worst", "PyTorch worst", "vmem median", "PyTorch median", "float64 sides"], rows
        )
    )
    return emit(
        {"bench": "fp32_accuracy", "torch": torch.__version__, "results": results, "targets": targets}, args.json
    )


if __name__ == "__main__":
    sys.exit(main())

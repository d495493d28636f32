"""PyTorch's side of bench/gpu.py: VGG-16 and ResNet-50 as torchvision builds them, its settings (defaults,
the algorithm search, AMP bf16 channels-last, TF32 off), a timed step and the largest batch in a budget. A
reference only: vmem never imports PyTorch."""

from __future__ import annotations

import time

import numpy as np
from _isolate import say

from vmem import parse_bytes
from vmem.policies.budget import largest_fitting


def torch_vgg16(torch, inplace: bool = True):
    """VGG-16 in PyTorch; ``inplace=False`` for checkpointing, which re-runs segments whose ReLU would
    otherwise overwrite a tensor autograd saved."""
    nn = torch.nn
    layers, c = [], 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=inplace)]
            c = v
    layers += [
        nn.Flatten(),
        nn.Linear(25088, 4096),
        nn.ReLU(inplace=inplace),
        nn.Linear(4096, 4096),
        nn.ReLU(inplace=inplace),
        nn.Linear(4096, 1000),
    ]
    return nn.Sequential(*layers)


def torch_resnet50(torch):
    """ResNet-50 in PyTorch as vmem's zoo builds it (torchvision's layout: the stride on the 3x3 convolution
    of a bottleneck, a projection where the shape changes)."""
    nn = torch.nn

    def conv_bn(cin, cout, k, stride=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, *([nn.ReLU(inplace=True)] if relu else []))

    class Bottleneck(nn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            cout = planes * 4
            self.body = nn.Sequential(
                conv_bn(cin, planes, 1), conv_bn(planes, planes, 3, stride), conv_bn(planes, cout, 1, relu=False)
            )
            self.short = None if stride == 1 and cin == cout else conv_bn(cin, cout, 1, stride, relu=False)

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.short is None else self.short(x)))

    layers, c = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)], 64
    for stage, (planes, n) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for i in range(n):
            layers.append(Bottleneck(c, planes, 2 if (i == 0 and stage > 0) else 1))
            c = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 1000)]
    return nn.Sequential(*layers)


#: the PyTorch models the bench compares, by vmem's zoo name
TORCH_MODELS = {"vgg16": torch_vgg16, "resnet50": torch_resnet50}


#: PyTorch in the settings its users train in (``--sections torch_settings``): its defaults as they are
#: (TF32 allowed for cuDNN's convolutions, matmuls exact, ``cudnn.benchmark`` off), the same with
#: ``cudnn.benchmark`` on (its own algorithm search, as vmem profiles its own), automatic mixed precision
#: in bf16 with channels-last tensors, and TF32 off on both (the exact FP32 the earlier runs compared);
#: the last two with the search on.
TORCH_SETTINGS = ("defaults", "defaults_benchmark", "amp_bf16", "tf32_off")


def torch_setup(setting: str = "tf32_off"):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default for matmuls
    torch.backends.cudnn.allow_tf32 = setting != "tf32_off"  # PyTorch allows TF32 in cuDNN by default
    torch.backends.cudnn.benchmark = setting != "defaults"  # off is PyTorch's default
    return torch


def torch_step(
    torch, model, opt, batch: int, mode: str = "plain", channels_last: bool = False, autocast: str | None = None
) -> float:
    """One step of PyTorch eager, the batch uploaded from pinned host memory inside the timed step (as a
    DataLoader with pin_memory gives it, and as vmem uploads its batch)."""
    x_host = torch.randn(batch, 3, 224, 224).pin_memory()
    y_host = torch.randint(0, 1000, (batch,)).pin_memory()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x, y = x_host.to("cuda", non_blocking=True), y_host.to("cuda", non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    opt.zero_grad(set_to_none=True)
    if mode == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            loss = torch.nn.functional.cross_entropy(model(x), y)
    elif mode == "checkpoint":
        from torch.utils.checkpoint import checkpoint_sequential

        loss = torch.nn.functional.cross_entropy(checkpoint_sequential(model, 6, x, use_reentrant=False), y)
    elif autocast:  # automatic mixed precision: the convolutions and matmuls in half, the loss in FP32
        with torch.autocast("cuda", dtype=getattr(torch, autocast)):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
    else:
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def task_torch_step(
    batch: int, steps: int, layout: str = "nchw", setting: str = "tf32_off", model: str = "vgg16"
) -> dict:
    """PyTorch eager's median step in ``layout``: ``nchw`` (its default) or ``channels_last`` (vmem's), in
    ``setting`` (:data:`TORCH_SETTINGS`; ``amp_bf16`` is channels last whatever ``layout`` says, as its
    users run it), each in a child of its own (cuDNN's search in channels last alone can take minutes)."""
    torch = torch_setup(setting)
    torch.manual_seed(0)
    model = TORCH_MODELS[model](torch).cuda()
    last = layout == "channels_last" or setting == "amp_bf16"
    if last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    autocast = "bfloat16" if setting == "amp_bf16" else None
    for _ in range(2):
        torch_step(torch, model, opt, batch, channels_last=last, autocast=autocast)
    times = [torch_step(torch, model, opt, batch, channels_last=last, autocast=autocast) for _ in range(steps)]
    say(f"pytorch eager {layout} ({setting}): steps {', '.join(f'{t * 1e3:.1f}' for t in times)} ms")
    return {"version": torch.__version__, "median": float(np.median(times)), "times": times, "setting": setting}


def task_torch_largest(mode: str, budget: str) -> dict:
    """The largest VGG-16 batch PyTorch trains in ``budget`` (its caching allocator held to it)."""
    torch = torch_setup()
    torch.backends.cudnn.benchmark = False  # a search per batch size tried would take minutes; cuDNN's heuristics
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(parse_bytes(budget) / total)
    model = torch_vgg16(torch, inplace=mode != "checkpoint").cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def fits(batch: int) -> bool:
        try:
            torch_step(torch, model, opt, batch, mode)
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()

    return {"largest": largest_fitting(fits, 4095)}

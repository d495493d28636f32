"""vmem: train deep networks in a GPU memory budget far below their naive need.

The runtime manages device memory layer by layer, offloads feature maps to pinned host memory on a
memory stream while compute runs, and compresses or recomputes what it stashes. It runs on a faithful
CPU device (the default), on simulated GPUs for planning, and on CUDA through CuPy.

    import vmem
    from vmem import nn
    net = vmem.models.get("vgg_cifar")
    dev = vmem.device("cpu", memory="512MiB")
    plan = vmem.plan(net, batch=64, device=dev, policy="baseline")
    trainer = vmem.Trainer(net, device=dev, policy="baseline", optimizer=vmem.optim.SGD(lr=0.05, momentum=0.9))
"""

from . import data, errors, models, nn, optim, policies, pool, streams
from . import device
from .graph import Graph, Network, Program, Sequential
from .planning import curve, largest_batch, plan
from .training import Trainer
from .units import format_bytes, parse_bytes
from .device.hostconv import with_host_catalog as _host_catalog
from .graph.program import set_default_catalog as _set_default_catalog

# a program as built offers the host's convolution algorithms (the CPU device's catalog): wired here, where
# every package is imported, so that the program (vmem.graph) imports no device
_set_default_catalog(_host_catalog)

__version__ = "0.1.0"

__all__ = [
    "device",
    "plan",
    "largest_batch",
    "curve",
    "Trainer",
    "Sequential",
    "Graph",
    "Network",
    "Program",
    "nn",
    "models",
    "optim",
    "policies",
    "pool",
    "streams",
    "data",
    "errors",
    "parse_bytes",
    "format_bytes",
    "onnx",
    "__version__",
]


def __getattr__(name: str):
    """``vmem.onnx`` (ONNX import and export) is loaded when first used."""
    if name == "onnx":
        import importlib

        return importlib.import_module(".onnx", __name__)
    raise AttributeError(f"module 'vmem' has no attribute {name!r}")

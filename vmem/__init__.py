"""vmem: train deep networks in a GPU memory budget far below their naive need.

The runtime manages device memory layer by layer, offloads feature maps to pinned host memory on a
memory stream while compute runs, and compresses or recomputes what it stashes. It runs on a faithful
CPU device (the default), on simulated GPUs for planning, and on CUDA through CuPy.
"""

from . import errors, pool, streams
from .device import device
from .units import format_bytes, parse_bytes

__version__ = "0.1.0"

__all__ = ["device", "errors", "pool", "streams", "parse_bytes", "format_bytes", "__version__"]

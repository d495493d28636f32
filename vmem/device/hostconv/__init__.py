"""The host's convolutions: the CPU device's convolution backend (:class:`HostConv`), its catalog of
algorithms (im2col, implicit GEMM, Winograd F(2x2, 3x3)) and their workspace; see :mod:`.backend` and :mod:`.catalog`."""

from .backend import HostConv
from .catalog import ALGORITHMS, algorithms, with_host_catalog, workspace_bytes

__all__ = ["ALGORITHMS", "HostConv", "algorithms", "with_host_catalog", "workspace_bytes"]

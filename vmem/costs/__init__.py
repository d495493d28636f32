"""How long each piece of a step takes: a roofline for simulated GPUs, measurements for a real device.

A cost model (:class:`CostModel`) answers ``op_seconds(op, pass_, algo)``, ``copy_seconds(nbytes,
direction)``, ``update_seconds(param_bytes)`` and ``misc_seconds(kind, nbytes)``; the replay runs a
schedule against it on the compute and memory streams' virtual clocks (:mod:`vmem.schedule.replay`).
"""

from .measured import Profiled, profile
from .model import AtBatch, CostModel
from .roofline import Roofline, geometry, with_cudnn_catalog

__all__ = ["CostModel", "AtBatch", "Roofline", "Profiled", "profile", "geometry", "with_cudnn_catalog"]

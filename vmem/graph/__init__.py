"""Networks and the Program policies read: ``Network -> build(batch) -> Program``."""

from ..nn.base import PASSES
from .network import Graph, Network, Node, Sequential
from .program import OpInfo, Program, TensorInfo, build_program

__all__ = ["Network", "Sequential", "Graph", "Node", "Program", "TensorInfo", "OpInfo", "build_program", "PASSES"]

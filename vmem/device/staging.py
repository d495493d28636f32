"""Float32 compute over low-precision storage (``fp16``/``bf16``): an op the device does not compute in
half precision itself reads its half-precision tensors through float32 copies and rounds each output once
back into its own dtype, as tensor cores accumulate in float32 and round once. The copies live at the end of
the op's workspace, so that the plan, the replay and the pool count them (:func:`with_float32_compute`); the
executor carves them there in :func:`staged` order.

The CPU device stages every such op. The CUDA device computes the kinds in :data:`CUDA_NATIVE` as they are
stored (cuDNN's convolutions in pseudo-half, the linear layers on cuBLAS, vmem's kernels, copies) and stages
the rest (batch norm, the loss: the float32 parts of mixed precision)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..graph.program import OpInfo, Program
from ..nn.base import physical
from ..precision import is_low

__all__ = ["COMPUTE", "CUDA_NATIVE", "copy_nbytes", "cpu_catalog", "staged", "staging_bytes", "with_float32_compute"]

COMPUTE = "float32"
_ALIGN = 64
#: The op kinds the CUDA device computes over fp16/bf16 storage without float32 copies: convolutions (cuDNN,
#: data in half, compute type FLOAT, tensor-op math), linear layers (cuBLAS, half operands, FP32
#: accumulation: :mod:`vmem.device.kernel_ops`), ReLU and max pooling (vmem's kernels: selections, exact),
#: sums of two maps and the copies (flatten, concat, pad, identity). Half-precision addition through FP32 rounds
#: as addition in half does (FP32 carries more than twice the digits plus two), so only the convolutions' and
#: linear layers' results differ from the staged way's (their weights are read in half, as under PyTorch's
#: autocast).
CUDA_NATIVE = frozenset({"conv", "linear", "relu", "maxpool", "add", "flatten", "concat", "pad", "identity"})


def staged(program: Program, op: OpInfo, pass_: str) -> list[tuple[str, int, tuple[int, ...]]]:
    """What a pass reads or writes through a float32 copy, in workspace order: (role, input index or -1,
    physical shape) with role ``"x"`` (an input), ``"y"`` (the output), ``"dy"`` or ``"dx"``."""
    if not op.staged:
        return []
    out_low = op.out_dtype != op.compute
    ins = [(j, physical(s)) for j, (s, d) in enumerate(zip(op.in_shapes, op.in_dtypes)) if d != op.compute]
    y_shape = physical(op.out_shape)
    if pass_ == "forward":
        return [("x", j, s) for j, s in ins] + ([("y", -1, y_shape)] if out_low else [])
    out = [("dy", -1, y_shape)] if out_low else []
    if op.reads_input:
        out += [("x", j, s) for j, s in ins]
    if op.reads_output and out_low:
        out.append(("y", -1, y_shape))
    return out + [("dx", j, s) for j, s in ins]


def copy_nbytes(shape: tuple[int, ...]) -> int:
    """Bytes a float32 copy of ``shape`` takes in the workspace (aligned to 64 bytes)."""
    n = int(np.prod(shape)) * np.dtype(COMPUTE).itemsize
    return -(-n // _ALIGN) * _ALIGN


def staging_bytes(program: Program, op: OpInfo, pass_: str) -> int:
    """Workspace bytes the float32 copies of a pass take (``"forward"`` or ``"backward"``)."""
    return sum(copy_nbytes(shape) for _, _, shape in staged(program, op, pass_))


def with_float32_compute(program: Program, catalog: Any = None, native: frozenset[str] = frozenset()) -> Program:
    """``program`` computed in float32 wherever an op stores a tensor in a narrower float, except ops of the
    kinds in ``native`` whose inputs and output share one dtype (the device computes them as they are
    stored): those ops marked
    (``OpInfo.compute``), their algorithms' workspace from ``catalog`` (a function of the program, sized for
    the dtype each op computes in) and every pass's workspace grown by its staging copies."""
    if not any(_dtypes_low(op) for op in program.ops):
        return catalog(program) if catalog is not None else program

    def mark(op: OpInfo) -> OpInfo:
        as_stored = op.kind in native and len({*op.in_dtypes, op.out_dtype}) == 1  # one dtype in and out
        return dataclasses.replace(op, compute=COMPUTE) if _dtypes_low(op) and not as_stored else op

    marked = dataclasses.replace(program, ops=[mark(op) for op in program.ops])
    if catalog is not None:
        marked = catalog(marked)
    ops = []
    for op in marked.ops:
        if op.staged:
            grow = {"forward": staging_bytes(marked, op, "forward")}
            grow["backward_data"] = grow["backward_filter"] = staging_bytes(marked, op, "backward")
            workspace = {p: {a: n + grow[p] for a, n in by_algo.items()} for p, by_algo in op.workspace.items()}
            op = dataclasses.replace(op, workspace=workspace)
        ops.append(op)
    return dataclasses.replace(marked, ops=ops)


def _dtypes_low(op: OpInfo) -> bool:
    return any(is_low(d) for d in (*op.in_dtypes, op.out_dtype))


def cpu_catalog(program: Program) -> Program:
    """The CPU device's view of ``program``: the host's convolution algorithms, computed in float32 over
    whatever the tensors are stored in."""
    from .hostconv import with_host_catalog

    return with_float32_compute(program, with_host_catalog)

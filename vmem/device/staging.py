"""Float32 compute over low-precision storage (the CPU device under ``fp16``/``bf16``): each op reads
its half-precision tensors through float32 copies and rounds each output once back into its own dtype,
as tensor cores accumulate in float32 and round once. The copies live at the end of the op's workspace,
so that the plan, the replay and the pool count them (:func:`with_float32_compute`); the executor carves
them there in :func:`staged` order."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..graph.program import OpInfo, Program
from ..nn.base import physical
from ..precision import is_low

__all__ = ["COMPUTE", "copy_nbytes", "cpu_catalog", "staged", "staging_bytes", "with_float32_compute"]

COMPUTE = "float32"
_ALIGN = 64


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


def with_float32_compute(program: Program, catalog: Any = None) -> Program:
    """``program`` computed in float32 wherever an op stores a tensor in a narrower float: those ops
    marked (``OpInfo.compute``), their algorithms' workspace from ``catalog`` (a function of the program,
    sized for float32) and every pass's workspace grown by its staging copies."""
    if not any(_dtypes_low(op) for op in program.ops):
        return catalog(program) if catalog is not None else program
    marked = dataclasses.replace(
        program, ops=[dataclasses.replace(op, compute=COMPUTE) if _dtypes_low(op) else op for op in program.ops]
    )
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

"""Fixed-point ranges from batch-norm statistics (a pure function of the Program).

A feature map that holds a batch norm's output (or a ReLU of it) has, per channel and over the batch, mean
``beta`` and standard deviation ``|gamma|``: training normalizes with the batch's own statistics. A
``fixed`` codec can take its per-channel range from there, ``beta +- sigmas * |gamma|`` (clamped at 0
after a ReLU), instead of a pass over the data for each channel's minimum and maximum; values outside
the range clamp to its ends. Plans record the choice per buffer (``Plan.ranges``); the executor reads
the batch norm's parameters when it encodes.
"""

from __future__ import annotations

import math
from typing import Any

from .. import codecs as _codecs
from ..graph import Program

__all__ = ["follows_batchnorm", "batchnorm_ranges", "check_sigmas"]


def follows_batchnorm(program: Program, b: int) -> tuple[str, bool] | None:
    """``(batch norm op name, relu)`` when buffer ``b`` (an owner tensor id, 4-D) holds that batch norm's
    output, or a ReLU of it (``relu`` true); else None."""
    tensors = program.tensors
    if len(tensors[b].shape) != 4:
        return None
    writers = [op for op in program.ops if tensors[op.output].buffer == b]
    if not writers:
        return None
    last, relu = writers[-1], False
    if last.kind == "relu":
        producer = tensors[last.inputs[0]].producer
        if producer is None:
            return None
        last, relu = program.ops[producer], True
    return (last.name, relu) if last.kind == "batchnorm" else None


def batchnorm_ranges(program: Program, codecs: dict[str, str], sigmas: float) -> dict[str, dict[str, Any]]:
    """``Plan.ranges`` for the buffers of ``codecs`` (name -> codec spec) whose codec takes a per-channel range
    (``fixed``) and that follow a batch norm; nothing when ``sigmas`` is 0."""
    if not sigmas:
        return {}
    ids = {t.name: t.id for t in program.tensors}
    out: dict[str, dict[str, Any]] = {}
    for name, spec in codecs.items():
        if not _codecs.get(spec).ranged:
            continue
        found = follows_batchnorm(program, ids[name])
        if found is not None:
            out[name] = {"batchnorm": found[0], "relu": found[1], "sigmas": float(sigmas)}
    return out


def check_sigmas(policy: str, sigmas: Any) -> None:
    if isinstance(sigmas, bool) or not isinstance(sigmas, (int, float)) or not math.isfinite(sigmas) or sigmas < 0:
        raise ValueError(f"policy {policy!r}: bn_sigmas={sigmas!r} must be a number >= 0 (0: ranges from the data)")

"""Analyses of a Program that policies and schedules share: who writes and reads each buffer, which
buffers hold sparse nonnegative values, and vDNN's prefetch points. Pure functions of the Program (and
of a plan's decisions where they take one): cheap to ask again, and the same for every caller.

Buffers are named by their owner tensor's id (``program.tensors[t].buffer``), ops by their index.
"""

from __future__ import annotations

from typing import Any

from .program import Program

__all__ = [
    "writers",
    "readers",
    "nonnegative_sparse",
    "prefetch_points",
    "prefetch_after",
    "RecomputeGraph",
    "needs_grad",
]


def writers(program: Program) -> dict[int, tuple[int, ...]]:
    """Per buffer: the ops that write it, in order (its producer, then in-place layers)."""
    return dict(program.buffer_writers)


def readers(program: Program) -> dict[int, dict[str, tuple[int, ...]]]:
    """Per buffer: the ops whose forward reads it (``"forward"``) and whose backward reads it
    (``"backward"``), each in op order."""
    out: dict[int, dict[str, list[int]]] = {}
    for op in program.ops:
        for t in dict.fromkeys(program.tensors[i].buffer for i in op.inputs):
            out.setdefault(t, {"forward": [], "backward": []})["forward"].append(op.index)
        for b in dict.fromkeys(program.backward_reads(op)):
            out.setdefault(b, {"forward": [], "backward": []})["backward"].append(op.index)
    return {b: {k: tuple(v) for k, v in uses.items()} for b, uses in out.items()}


def nonnegative_sparse(program: Program, b: int) -> bool:
    """Whether buffer ``b`` holds ReLU outputs: sparse (about half zeros, fewer after batch norm's zero mean
    only by chance) and nonnegative, what Gist's SSDC encodes. Not a max-pool of them: nonnegative but
    dense, a window's maximum being zero only where all its values are (a 2x2 window of half zeros: one in
    sixteen; measured on vgg_cifar trained on digits, its SSDC came out larger than the plan's 0.6)."""
    ops = [program.ops[i] for i in program.buffer_writers.get(b, ()) if program.ops[i].kind != "flatten"]
    return bool(ops) and ops[-1].kind == "relu"  # the last writer: the value that stays in the buffer


def prefetch_points(
    program: Program, offloaded: set[int], reads: dict[int, list[int]] | None = None
) -> dict[str, list[str]]:
    """For each op (by name), the offloaded buffers to prefetch when its backward starts (vDNN's rule).
    ``reads``: op -> buffers used at its backward, where rebuilds read more than the backward itself
    (see :func:`vmem.graph.backward.backward_uses`); default: what each backward reads."""
    ops, tensors = program.ops, program.tensors
    reads = reads or {}
    needs = {
        op.index: [b for b in dict.fromkeys(reads.get(op.index, program.backward_reads(op))) if b in offloaded]
        for op in ops
    }
    back: set[int] = set()
    points: dict[str, list[str]] = {}
    # look ahead from layer m: the nearest earlier layer j with a buffer not yet back, searching no
    # further than the nearest earlier convolution (included). Layers whose buffers are all back stay so
    # (back only grows), and m only decreases: a stack of the candidates keeps the search linear.
    conv_before, last = [-1] * len(ops), -1
    for op in ops:
        conv_before[op.index] = last
        if op.kind == "conv":
            last = op.index
    candidates = [op.index for op in ops if needs[op.index]]  # ascending
    for m in range(len(ops) - 1, -1, -1):
        batch = [b for b in needs[m] if b not in back]  # on demand: layer m cannot start without them
        back.update(batch)
        while candidates and (candidates[-1] >= m or all(b in back for b in needs[candidates[-1]])):
            candidates.pop()
        if candidates and candidates[-1] >= conv_before[m]:
            j = candidates[-1]
            pending = [b for b in needs[j] if b not in back]
            batch += pending
            back.update(pending)
        if batch:
            points[ops[m].name] = [tensors[b].name for b in batch]
    return points


def prefetch_after(program: Program, points: dict[str, list[str]], needs: list[bool]) -> dict[str, list[str]]:
    """``points`` (:func:`prefetch_points`) with each prefetch placed after every backward that does not read
    its buffer: at the start of its first reader's backward, so that the copy holds no block while the
    layers before run (their peaks exclude it), at the price of the reader waiting for the whole copy.
    ``needs``: per tensor, whether its gradient is computed (a layer's backward runs where its output's
    is)."""
    ops, tensors = program.ops, program.tensors
    order = [op.index for op in reversed(ops) if needs[op.output]]  # the backward walk
    first_reader: dict[int, int] = {}  # buffer -> the op whose backward reads it first
    for m in order:
        for buffer in program.backward_reads(ops[m]):
            first_reader.setdefault(buffer, m)
    by_tensor = {t.name: t.id for t in tensors}
    out: dict[str, list[str]] = {}
    for name, buffers in points.items():
        for tensor in buffers:
            reader = first_reader.get(by_tensor[tensor])
            out.setdefault(name if reader is None else ops[reader].name, []).append(tensor)
    return out


class RecomputeGraph:
    """What recomputation reads of a Program: per buffer its writers (``chains``) and the buffers its first
    writer reads (``sources``), sizes, what is stashed, which buffers only ``cheap`` ops write, and where
    backward first reads each stashed buffer (``first_read``: backward runs ops in reverse). ``cheap``: the
    indices of the ops cheap enough to run again (a policy's choice)."""

    def __init__(self, program: Program, cheap: set[int]):
        self.program = program
        self.chains = writers(program)
        tensors = program.tensors
        self.sources = {
            b: tuple(dict.fromkeys(tensors[t].buffer for t in program.ops[chain[0]].inputs))
            for b, chain in self.chains.items()
        }
        self.stashed = program.stashed_buffers()
        self.size = {t.id: t.nbytes for t in tensors if t.buffer == t.id}
        self.cheap = {b for b, chain in self.chains.items() if all(i in cheap for i in chain)}
        self.stashed_bytes = sum(self.size[b] for b in self.stashed)
        self.first_read: dict[
            int, int
        ] = {}  # stashed buffer -> its first backward reader (backward runs ops in reverse)
        for op in program.ops:
            for b in program.backward_reads(op):
                self.first_read[b] = op.index

    def name(self, b: int) -> str:
        """Buffer ``b``'s name (its owner tensor's)."""
        return self.program.tensors[b].name

    def reach(self, b: int, rebuildable: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """What a rebuild of ``b`` reads, through rebuildable temporaries: the stashed buffers it reaches that
        backward reads after ``b`` (rebuilt early, for ``b``), the temporaries it rebuilds on the way, and
        the other sources it keeps."""
        frontier, temps, kept = [], [], []
        stack, seen = list(self.sources[b]), set()
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            if s in self.stashed:
                if self.first_read[s] <= self.first_read[b]:  # rebuilt early, for b
                    frontier.append(s)
            elif s in self.chains and rebuildable(s):
                temps.append(s)
                stack.extend(self.sources[s])
            else:
                kept.append(s)
        return tuple(frontier), tuple(temps), tuple(kept)


def needs_grad(program: Program) -> list[bool]:
    """Per tensor: whether its gradient is computed (it leads to a trainable parameter)."""
    return list(program.derived("needs_grad", lambda: _needs_grad(program)))


def _needs_grad(program: Program) -> list[bool]:
    needs = [False] * len(program.tensors)
    for op in program.ops:
        has_params = any(s.trainable for s in op.params.values())
        needs[op.output] = has_params or any(needs[i] for i in op.inputs)
    return needs

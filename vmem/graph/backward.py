"""Which buffers the backward pass rebuilds, when, and from what: the walk the layer-wise lowering and the
policies share (an analysis of a Program under a plan's stash decisions: it knows nothing of schedules).

A plan marks a buffer ``"recompute"``: it is freed after its last forward use and rebuilt during backward,
just before the first backward that reads it (or the first rebuild that needs it as a source), by running
again the ops that write it (its producer, then any in-place layer over it) from the buffers the producer
reads. Each source must be live then: kept (``"keep"``, which a plan may also say of a buffer no backward
reads, to hold it as a source), prefetched after an offload, losslessly encoded (decoded on the way), or
itself marked ``"recompute"`` (rebuilt first, recursively). A rebuilt buffer lives until its last use, by a
backward or by a later rebuild. A source with no such decision makes the plan invalid (:class:`PlanError`).

:func:`backward_uses` is the walk, in backward order, without steps: per op, the rebuilds to run before its
backward and every buffer used at that point. Policies use it to place prefetches and to count what a
recompute plan holds; the lowering emits the same walk as steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..errors import PlanError
from .program import Program
from .analysis import writers

__all__ = ["Rebuild", "Uses", "decisions", "backward_uses", "check_sources"]


@dataclass(frozen=True)
class Rebuild:
    """Rebuild ``buffer`` (an owner tensor id) by running ``chain`` (op indices, producer first) again; the
    producer reads ``sources`` (owner tensor ids)."""

    buffer: int
    chain: tuple[int, ...]
    sources: tuple[int, ...]


@dataclass(frozen=True)
class Uses:
    """What happens before and at the backward of one op: ``rebuilds`` in order, then the backward reads
    ``reads`` (owner tensor ids)."""

    op: int
    rebuilds: tuple[Rebuild, ...]
    reads: tuple[int, ...]


def decisions(program: Program, stash: Mapping[str, str]) -> dict[int, str]:
    """Per buffer (owner tensor id): the plan's decision; stashed buffers it leaves out are kept."""
    by_name = {t.name: t.id for t in program.tensors}
    out = {b: "keep" for b in program.stashed_buffers()}
    for name, d in stash.items():
        if name not in by_name:
            raise PlanError(f"the plan names a buffer {name!r} that network {program.network!r} does not have")
        out[program.tensors[by_name[name]].buffer] = d
    return out


def backward_uses(
    program: Program, decided: Mapping[int, str], needs: list[bool], lossless: frozenset[int] | set[int] = frozenset()
) -> list[Uses]:
    """The backward walk (see the module docstring), one :class:`Uses` per op whose backward runs, in
    backward order. ``lossless``: encoded buffers whose decoding is exact (usable as sources)."""
    ops, tensors = program.ops, program.tensors
    chains = writers(program)
    rebuilt: set[int] = set()
    out = []

    def need(b: int, rebuilds: list[Rebuild], reader: str) -> None:
        d = decided.get(b)
        if d == "recompute":
            if b in rebuilt:
                return
            if b not in chains:
                raise PlanError(f"cannot recompute {tensors[b].name!r}: it is the network's input (keep it)")
            chain = chains[b]
            sources = tuple(dict.fromkeys(tensors[t].buffer for t in ops[chain[0]].inputs))
            for s in sources:
                need(s, rebuilds, f"the rebuild of {tensors[b].name!r}")
            rebuilt.add(b)
            rebuilds.append(Rebuild(b, chain, sources))
        elif d in ("keep", "offload") or (d == "encode" and (reader.startswith("the backward") or b in lossless)):
            return
        elif d == "encode":
            raise PlanError(
                f"{reader} needs {tensors[b].name!r}, which is encoded lossily: a rebuild needs the "
                "exact values (keep, offload or recompute it)"
            )
        else:
            raise PlanError(
                f"{reader} needs {tensors[b].name!r}, which is not live then: the plan neither keeps, "
                "offloads nor recomputes it"
            )

    for i in range(len(ops) - 1, -1, -1):
        if not needs[ops[i].output]:
            continue
        rebuilds: list[Rebuild] = []
        reads = tuple(program.backward_reads(ops[i]))
        for b in reads:
            need(b, rebuilds, f"the backward of {ops[i].name!r}")
        out.append(Uses(i, tuple(rebuilds), reads))
    return out


def check_sources(program: Program, decided: Mapping[int, str]) -> None:
    """Raise PlanError for a decision other than keep/offload/encode/recompute, or offload/encode of a
    buffer no backward reads."""
    stashed = program.stashed_buffers()
    for b, d in decided.items():
        if d not in ("keep", "offload", "encode", "recompute"):
            raise PlanError(
                f"unknown decision {d!r} for {program.tensors[b].name!r}; use keep, offload, encode or recompute"
            )
        if d in ("offload", "encode") and b not in stashed:
            raise PlanError(f"the plan {d}s {program.tensors[b].name!r}, which no backward reads")

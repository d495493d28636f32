"""What ``auto``'s stages share: the program read under a plan (:class:`_Info`: writers, what backward reads
first, the copies' timing), the ways to store a kept buffer and their estimated costs (:func:`savings`), the
link's share of the time before the peak (:class:`_Link`), and a plan with savings applied and its prefetches
refreshed."""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ... import codecs
from ...graph import Program
from ...graph.analysis import RecomputeGraph, nonnegative_sparse, prefetch_points
from ...graph.analysis import needs_grad
from ...graph.backward import backward_uses, decisions
from ..plan import Plan, Stash
from ..recompute import cheap_ops

if TYPE_CHECKING:
    from ...costs.model import CostModel

__all__ = ["codec_offloads", "savings"]


@dataclass(frozen=True)
class _Saving:
    """One way the descent may store a kept buffer: ``stash`` (its decision, and those of the temporaries
    rebuilt with it), ``codec``, what it costs (estimated ``seconds``), the bytes it ``saved`` at the peak
    and the bytes it sends over the link (``wire``)."""

    seconds: float
    saved: int
    name: str
    kind: str  # "encode" | "offload" | "recompute"
    stash: dict[str, Stash]
    codec: str | None
    wire: int = 0

    def rate(self) -> float:
        """Estimated seconds per byte saved: the descent takes the lowest first."""
        return self.seconds / self.saved


@dataclass(frozen=True)
class _Move:
    gain: float  # estimated seconds saved
    what: str  # a buffer's or pass's name
    note: str
    apply: Callable[[Plan], Plan]


def _offloaded(program: Program, plan: Plan) -> set[int]:
    by_name = {t.name: t.id for t in program.tensors}
    return {program.tensors[by_name[n]].buffer for n, d in plan.stash.items() if d == Stash.OFFLOAD}


def _reads(program: Program, plan: Plan) -> dict[int, list[int]]:
    """Per op: the buffers used at its backward, the sources of the rebuilds it runs included (where an
    offloaded buffer must be back), from the lowering's own walk of ``plan``'s decisions."""
    by_name = {t.name: t.id for t in program.tensors}
    lossless = {
        program.tensors[by_name[n]].buffer
        for n, d in plan.stash.items()
        if d == Stash.ENCODE
        and n in plan.codecs
        and codecs.get(plan.codecs[n]).lossless
        and not codecs.get(plan.codecs[n]).sign_only
    }
    walk = backward_uses(program, decisions(program, plan.stash), needs_grad(program), lossless)
    return {u.op: [s for r in u.rebuilds for s in r.sources] + list(u.reads) for u in walk}


def codec_offloads(costs: "CostModel | None") -> bool:
    """Whether offloading through a codec can save time under ``costs`` (its ``codec_offload``, true where
    it does not say): on a GPU the link moves the encoded bytes while the codec's kernel runs beside the
    copy engine; on the CPU device the link is a memory copy on the cores the ops use, and encoding costs
    them more than the bytes it saves."""
    return bool(getattr(costs, "codec_offload", True))


def savings(program: Program, plan: Plan, info: _Info, peak_at: str | None, live_only: bool = True) -> list[_Saving]:
    """Each way to store a kept buffer that is live at the peak (``live_only``; else any kept buffer):
    encoded losslessly, offloaded (raw or through zvc), recomputed; with its estimated seconds and the
    bytes it saves there."""
    phase, _, layer = (peak_at or "backward ").partition(" ")
    p = info.index.get(layer, len(program.ops))
    tensors, costs = program.tensors, info.costs
    out = []
    for b in sorted(info.graph.stashed):
        name = tensors[b].name
        if plan.stash.get(name, Stash.KEEP) != Stash.KEEP or b not in info.graph.first_read:
            continue
        if phase == "forward":
            live = info.last_forward.get(b, -1) < p
        else:  # backward (or a rebuild during it): not yet needed again
            live = info.graph.first_read[b] < p
        if live_only and not live:
            continue
        t = tensors[b]
        nbytes, shape, dtype = t.nbytes, tuple(t.shape), t.dtype
        sparse = nonnegative_sparse(program, b)
        for spec in ("binarize",) if program.sign_only(b) else ("ssdc",) if sparse else ():
            codec = codecs.get(spec)
            enc = codecs.stored_nbytes(codec, shape, plan.density, dtype)
            if enc < nbytes:
                work = costs.misc_seconds("encode", nbytes + enc)
                if not codec.sign_only:  # a sign-only encoding is read as it is
                    work += costs.misc_seconds("decode", nbytes + enc)
                out.append(_Saving(work, nbytes - enc, name, "encode", {name: Stash.ENCODE}, codec.spec))
        offload = {name: Stash.OFFLOAD}
        out.append(_Saving(info.exposed(b, nbytes), nbytes, name, "offload", offload, None, nbytes))
        if sparse and codec_offloads(costs):
            zvc = codecs.get("zvc")
            enc = codecs.stored_nbytes(zvc, shape, plan.density, dtype)
            work = costs.misc_seconds("encode", nbytes + enc) + costs.misc_seconds("decode", nbytes + enc)
            out.append(_Saving(work + info.exposed(b, enc), nbytes, name, "offload", offload, zvc.spec, enc))
        rebuild = info.rebuild(b, plan)
        if rebuild is not None:
            seconds, extra = rebuild
            decided = {**dict.fromkeys(extra, Stash.RECOMPUTE), name: Stash.RECOMPUTE}
            out.append(_Saving(seconds, nbytes, name, "recompute", decided, None))
    return out


class _Info:
    """What the descent's estimates read of a program under one plan's algorithms: the recompute graph
    (writers, sources, what is stashed and cheap, where backward first reads each buffer), op positions,
    where forward last reads each buffer, per-op seconds, and the windows an offload's copies can hide in."""

    def __init__(self, program: Program, costs: "CostModel", plan: Plan):
        self.program, self.costs = program, costs
        self.graph = RecomputeGraph(program, cheap_ops(program))
        ops = program.ops
        self.index = {op.name: op.index for op in ops}
        self.by_name = {t.name: t.id for t in program.tensors}
        self.last_forward: dict[int, int] = {}
        for op in ops:
            for t in op.inputs:
                self.last_forward[program.tensors[t].buffer] = op.index
        algos = plan.algos
        self.forward = [costs.op_seconds(op, "forward", algos.get(op.name, {}).get("forward")) for op in ops]
        self.backward: list[float] = []
        for op in ops:
            per = algos.get(op.name, {})
            if op.kind == "conv":
                seconds = costs.op_seconds(op, "backward_filter", per.get("backward_filter"))
                seconds += costs.op_seconds(op, "backward_data", per.get("backward_data"))
            else:
                seconds = costs.op_seconds(op, "backward", None)
            self.backward.append(seconds)
        self.after = [0.0] * (len(ops) + 1)  # forward seconds from op i on
        for i in range(len(ops) - 1, -1, -1):
            self.after[i] = self.after[i + 1] + self.forward[i]
        self.total_forward = self.after[0]
        self.next_conv = [len(ops) - 1] * len(ops)
        nxt = len(ops) - 1
        for i in range(len(ops) - 1, -1, -1):
            self.next_conv[i] = nxt
            if ops[i].kind == "conv":
                nxt = i

    def exposed(self, b: int, wire: int) -> float:
        """Estimated seconds an offload of ``b`` (``wire`` bytes each way) adds where the link is free (see
        :class:`_Link` for where it is not): what its prefetch cannot hide behind the backward of the layers
        from its prefetch point (vDNN's: the next convolution up) to its reader, and a hundredth of the
        copies (a busier link delays the rest)."""
        d, h = self.costs.copy_seconds(wire, "d2h"), self.costs.copy_seconds(wire, "h2d")
        j = self.graph.first_read[b]
        window = sum(self.backward[j + 1 : self.next_conv[j] + 1])
        return max(0.0, h - window) + 0.01 * (d + h)

    def held(self, plan: Plan, room: "dict[int, int] | None" = None) -> Plan:
        """``plan`` with each offload's block released only once its copy out is expected to have ended
        (``Plan.release``): the copies queued in forward order on the link, each starting when its buffer
        is last written; the block released after the first op whose forward ends after that. ``room``
        (per op, the bytes free while its forward runs: :meth:`room`) bounds what is held: a block is held
        only as far as each op it is held over has room for it, the earliest copies first."""
        program, tensors = self.program, self.program.tensors
        ends = [self.total_forward - self.after[i + 1] for i in range(len(program.ops))]
        free = None if room is None else dict(room)
        release, clock = {}, 0.0
        for start, took, name in self.copies_out(plan):
            b = self.by_name[name]
            clock = max(clock, start) + took
            first = self.last_forward.get(b, -1)
            j = min(bisect.bisect_left(ends, clock), len(ends) - 1)
            if free is not None:  # no further than the ops that have room for it
                nbytes, k = tensors[b].nbytes, first
                while k < j and free.get(k + 1, 0) >= nbytes:
                    k += 1
                for i in range(first + 1, k + 1):
                    free[i] -= nbytes
                j = k
            if j > first:
                release[name] = program.ops[j].name
        return dataclasses.replace(plan, release=release)

    def copies_out(self, plan: Plan) -> list[tuple[float, float, str]]:
        """``plan``'s copies to the host in the order they start: (forward seconds when its buffer is last
        written, seconds the copy takes of what crosses the link, the buffer's name)."""
        tensors, out = self.program.tensors, []
        for name, d in plan.stash.items():
            if d != Stash.OFFLOAD:
                continue
            b = self.by_name[name]
            t = tensors[b]
            wire = t.nbytes
            if name in plan.codecs:
                wire = codecs.stored_nbytes(codecs.get(plan.codecs[name]), tuple(t.shape), plan.density, t.dtype)
            out.append((self.written(b), self.costs.copy_seconds(wire, "d2h"), name))
        return sorted(out)

    def room(self, plan: Plan, result: Any, budget: int, savings: "Sequence[_Saving]" = ()) -> dict[int, int]:
        """Per op, the bytes free of ``budget`` while its forward runs, from ``result`` (``plan``'s replay:
        the most in use while each layer ran), the blocks ``plan`` holds there counted as free, and what
        ``savings`` (about to be made) free after their buffers' last forward readers."""
        peaks, tensors, n = result.layer_peaks, self.program.tensors, len(self.program.ops)
        delta = [0] * (n + 1)  # bytes freed from op i on, as a difference array
        for name, op_name in plan.release.items():
            b = self.by_name[name]
            delta[self.last_forward.get(b, -1) + 1] += tensors[b].nbytes
            delta[self.index[op_name] + 1] -= tensors[b].nbytes
        for saving in savings:
            delta[self.last_forward.get(self.by_name[saving.name], -1) + 1] += saving.saved
        out, freed = {}, 0
        for op in self.program.ops:
            freed += delta[op.index]
            out[op.index] = budget - peaks.get(op.name, budget) + freed
        return out

    def written(self, b: int) -> float:
        """Forward seconds until ``b`` is written for the last time (its copy out may start then)."""
        chains = self.graph.chains
        last = chains[b][-1] if b in chains else -1
        return self.total_forward - self.after[last + 1]

    def rebuild(self, b: int, plan: Plan, depth: int = 3) -> tuple[float, tuple[str, ...]] | None:
        """Seconds to rebuild ``b`` and the temporaries (buffers no backward reads) rebuilt with it; None
        where it cannot be rebuilt from what the plan holds (the network's input, a heavy temporary)."""
        g, tensors = self.graph, self.program.tensors
        if b not in g.chains or depth < 0:
            return None
        seconds = sum(self.forward[i] for i in g.chains[b])
        extra: list[str] = []
        for t in g.sources[b]:
            name = tensors[t].name
            decided = plan.stash.get(name)
            if t in g.stashed:
                if decided == Stash.ENCODE and not _lossless(plan.codecs.get(name)):
                    return None
                continue
            if decided in (Stash.KEEP, Stash.RECOMPUTE):
                continue
            if t not in g.cheap:  # a temporary only cheap ops write is rebuilt alongside
                return None
            inner = self.rebuild(t, plan, depth - 1)
            if inner is None:
                return None
            seconds += inner[0]
            extra += [name, *inner[1]]
        return seconds, tuple(extra)


class _Link:
    """The copies out to the host, in forward order on one link: an offload saves bytes at the peak only if
    its copy ends before the peak. ``admit`` takes an offload whose copy, queued with the plan's and those
    admitted before, still ends in time (and keeps every other one in time), while they fill at most
    ``share`` of the time before the peak."""

    def __init__(self, info: _Info, plan: Plan, peak_at: str | None, share: float):
        self.info = info
        phase, _, layer = (peak_at or "backward ").partition(" ")
        p = info.index.get(layer, len(info.forward))
        if phase == "forward":
            self.deadline = info.total_forward - info.after[p]
        else:  # the whole forward, and the backward of the layers after the peak's
            self.deadline = info.total_forward + sum(info.backward[p + 1 :])
        self.deadline *= share
        # (when it may start, seconds), by start
        self.queue: list[tuple[float, float]] = [(start, took) for start, took, _ in info.copies_out(plan)]
        self.busy = sum(took for _, took in self.queue)
        self._ended()

    def _ended(self) -> None:
        """``ends``: when each queued copy ends (the queue as it is)."""
        self.ends, end = [], 0.0
        for start, took in self.queue:
            end = max(end, start) + took
            self.ends.append(end)

    def admit(self, name: str, wire: int) -> bool:
        seconds = self.info.costs.copy_seconds(wire, "d2h")
        if self.busy + seconds > self.deadline:  # the link is not free that long (checked first: cheap)
            return False
        entry = (self.info.written(self.info.by_name[name]), seconds)
        queue, ends = self.queue, self.ends
        at = bisect.bisect(queue, entry)
        end = max(ends[at - 1] if at else 0.0, entry[0]) + entry[1]  # the copies before it end as they did
        for k in range(at, len(queue)):
            start, took = queue[k]
            end = max(end, start) + took
            if end == ends[k]:  # from here on the queue ends as it did without this copy
                end = ends[-1]
                break
        if end > self.deadline:
            return False
        queue.insert(at, entry)
        self.busy += seconds
        self._ended()
        return True


def _applied(plan: Plan, savings: list[_Saving]) -> Plan:
    """``plan`` with ``savings`` made (their prefetches not yet placed: :func:`_refreshed`)."""
    stash, codecs_ = dict(plan.stash), dict(plan.codecs)
    for saving in savings:
        stash.update(saving.stash)
        if saving.codec is None:
            codecs_.pop(saving.name, None)
        else:
            codecs_[saving.name] = saving.codec
    offloads = any(d == Stash.OFFLOAD for d in stash.values())
    return dataclasses.replace(
        plan, stash=stash, codecs=codecs_, sync=(plan.sync or "event") if offloads else plan.sync
    )


def _summary(plan: Plan) -> str:
    """What the plan does with its stashed buffers, counted: ``"keeps 12, offloads 3 (2 through zvc) ..."``."""
    parts = []
    for decision, verb in ((Stash.KEEP, "keeps"), (Stash.OFFLOAD, "offloads"), (Stash.ENCODE, "encodes")):
        names = [n for n, d in plan.stash.items() if d == decision]
        if names:
            through: dict[str, int] = {}
            for n in names:
                if n in plan.codecs:
                    through[plan.codecs[n]] = through.get(plan.codecs[n], 0) + 1
            detail = ", ".join(
                f"{k} through {c}" if decision == Stash.OFFLOAD else f"{k} as {c}" for c, k in sorted(through.items())
            )
            parts.append(f"{verb} {len(names)}" + (f" ({detail})" if detail else ""))
    rebuilt = sum(1 for d in plan.stash.values() if d == Stash.RECOMPUTE)
    if rebuilt:
        parts.append(f"recomputes {rebuilt}")
    return "it " + ", ".join(parts) + " buffers" if parts else "it keeps every buffer"


def _lossless(spec: str | None) -> bool:
    if spec is None:
        return False
    codec = codecs.get(spec)
    return codec.lossless and not codec.sign_only


def _refreshed(program: Program, plan: Plan) -> Plan:
    """``plan`` with its prefetch points placed again for its decisions (a rebuild may read an offloaded
    buffer earlier than its backward does)."""
    offloaded = _offloaded(program, plan)
    return dataclasses.replace(
        plan,
        prefetch=prefetch_points(program, offloaded, reads=_reads(program, plan)) if offloaded else {},
        sync=(plan.sync or "event") if offloaded else plan.sync,
    )

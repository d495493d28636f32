"""Recomputation policies: layer-wise allocation where some stashed feature maps are freed after forward and
rebuilt during backward (see :mod:`vmem.schedule.recompute` for the mechanism).

- ``mirror`` (Chen et al.'s "mirror" heuristic as MXNet implements it, ``MXNET_BACKWARD_DO_MIRROR``):
  recompute the output of every cheap op (element-wise, normalization, pooling, softmax, reshapes) but
  Concat and Dropout, keeping every ``step``-th of them (``MXNET_BACKWARD_MIRROR_STEP``, 100); keep the
  outputs of heavy ops (convolution, linear, batched matmul) that the rebuilds read. Rebuild chains are
  unbounded, as in MXNet: an LSTM's cell states come back all at once. ``mirror:depth=N`` bounds them
  as echo does (a variant, not Chen et al.'s heuristic).
- ``chen`` (Chen et al., sqrt(n) checkpoints): split the network at about sqrt(n) points where one buffer
  carries everything forward, keep those, recompute everything between them, heavy ops included.
- ``echo`` (Zheng et al., Echo, Algorithm 1): start from mirror's choice and keep a cheap op's output,
  together with every other op that reads the same source, wherever recomputing it holds more bytes (the
  sources it forces to stay) than it frees, estimated over the whole graph; never recompute a heavy op.
  The plan is then checked by replay against ``layerwise``: echo never peaks higher. ``plan.notes`` says
  per buffer why it was or was not recomputed.

An op is cheap when its forward costs at most ``CHEAP_FLOPS`` FLOPs per output value. Echo rebuilds at most
a few stashed buffers in a row (see :meth:`_Graph.close`); how many, it decides by replaying each of
``DEPTHS`` (a residual stream wants short chains, an LSTM longer ones).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..device.spec import DeviceSpec
from ..graph import Program
from ..graph.analysis import RecomputeGraph
from .base import Policy, register
from .plan import Plan, Stash

if TYPE_CHECKING:
    from .base import Oracle
    from ..costs.model import CostModel

__all__ = ["Mirror", "Chen", "Echo", "CHEAP_FLOPS", "cheap_ops"]

#: Forward FLOPs per output value up to which an op counts as cheap (batch norm 4, a 3x3 pool 9; a
#: convolution or a linear layer has 2 x its fan-in).
CHEAP_FLOPS = 32
#: How many stashed buffers an echo rebuild may chain (a residual stream keeps every depth+1-th block
#: output): echo replays each of DEPTHS and keeps the lowest peak; DEPTH without a replay.
DEPTHS = (1, 2, 3, 4)
DEPTH = 2
#: MXNet's mirror keeps every MIRROR_STEP-th candidate (``MXNET_BACKWARD_MIRROR_STEP``, default 100) ...
MIRROR_STEP = 100
#: ... and never mirrors these kinds among the cheap ones (MXNet: Concat, Dropout).
MIRROR_KEEPS = frozenset({"concat", "dropout"})


def cheap_ops(program: Program) -> set[int]:
    """Indices of the ops that are cheap to run again."""
    return {op.index for op in program.ops if op.flops <= CHEAP_FLOPS * max(math.prod(op.out_shape), 1)}


class _Graph(RecomputeGraph):
    """The recompute policies' decisions over :class:`~vmem.graph.analysis.RecomputeGraph`."""

    def __init__(self, program: Program):
        super().__init__(program, cheap_ops(program))

    def close(
        self, recompute: set[int], rebuildable: Any, depth: int | None = None, cache: dict[int, Any] | None = None
    ) -> dict[int, str]:
        """Decisions for stashed buffers (``recompute`` or keep) and every source their rebuilds need: a
        source that ``rebuildable(b)`` is recomputed too, any other is kept. ``cache``: :meth:`reach` per
        buffer, for repeated calls with the same ``rebuildable``.

        With ``depth``, a stashed buffer whose rebuild would first rebuild other stashed ones ``depth`` deep
        (a residual stream: each block's output rebuilt from the previous one's) is kept instead. A rebuilt
        buffer lives until its last use, so an unbounded chain would bring the whole stream back at once. A
        stashed source that backward reads before ``b`` is rebuilt for its own reader already, not for
        ``b``'s rebuild, and adds nothing to the chain (an LSTM's tanh(c) rebuilt from its cell state)."""
        return self.close_held(recompute, rebuildable, depth, cache)[0]

    def close_held(
        self, recompute: set[int], rebuildable: Any, depth: int | None = None, cache: dict[int, Any] | None = None
    ) -> tuple[dict[int, str], int]:
        """:meth:`close` and the bytes its decisions hold from forward to backward (every kept buffer)."""
        state: tuple[dict[int, str], int, dict[int, int]] = (
            dict.fromkeys(self.stashed, "keep"),
            self.stashed_bytes,
            {},
        )
        decided, held, _ = self._close(sorted(recompute), 0, state, (), rebuildable, depth, cache, None)
        return decided, held

    def _close(
        self,
        order: list[int],
        start: int,
        state: tuple[dict[int, str], int, dict[int, int]],
        skip: Any,
        rebuildable: Any,
        depth: int | None,
        cache: dict[int, Any] | None,
        every: int | None,
    ) -> tuple[dict[int, str], int, list[tuple[dict[int, str], int, dict[int, int]]]]:
        """The walk of :meth:`close_held` over ``order[start:]`` (forward order: sources first), but the
        buffers in ``skip``, from ``state`` (decisions, bytes held, each rebuilt buffer's chain depth; changed
        in place). With ``every``, copies of the state before each ``every``-th buffer of ``order``."""
        cache = {} if cache is None else cache
        decided, held, level = state
        size = self.size
        snapshots = []
        for i in range(start, len(order)):
            if every is not None and i % every == 0:
                snapshots.append((dict(decided), held, dict(level)))
            b = order[i]
            if b in skip:
                continue
            reached = cache.get(b)
            if reached is None:
                reached = cache[b] = self.reach(b, rebuildable)
            early, temps, kept = reached
            lv = 1 + max([level.get(s, 0) for s in early]) if early else 1
            if depth is not None and lv > depth:
                continue
            decided[b], level[b] = Stash.RECOMPUTE, lv
            held -= size[b]
            for s in temps:
                decided[s] = Stash.RECOMPUTE
            for s in kept:
                if s not in decided:
                    held += size[s]
                    decided[s] = "keep"
        return decided, held, snapshots

    #: the trials' walk resumes from a copy of the state taken before every this many buffers
    RESUME_EVERY = 64

    def trials(self, recompute: set[int], rebuildable: Any, depth: int | None, cache: dict[int, Any]) -> "_Trials":
        """The bytes :meth:`close_held` holds for ``recompute`` less a group, for many groups: each walk
        resumes where the group's first buffer comes (before it, nothing differs)."""
        return _Trials(self, recompute, rebuildable, depth, cache)


class _Trials:
    """:meth:`_Graph.trials`: ``held`` for the set, ``without(group)`` for the set less a group, ``remove``
    to take a group out of the set for good."""

    def __init__(self, g: "_Graph", recompute: set[int], rebuildable: Any, depth: int | None, cache: dict[int, Any]):
        self.g, self.rebuildable, self.depth, self.cache = g, rebuildable, depth, cache
        self.recompute = set(recompute)
        self._walk()

    def _walk(self) -> None:
        g = self.g
        self.order = sorted(self.recompute)
        start: tuple[dict[int, str], int, dict[int, int]] = (dict.fromkeys(g.stashed, "keep"), g.stashed_bytes, {})
        _, self.held, self.snapshots = g._close(
            self.order, 0, start, (), self.rebuildable, self.depth, self.cache, g.RESUME_EVERY
        )

    def without(self, group: set[int]) -> int:
        """The bytes held with ``group`` (a subset of the set) not recomputed."""
        first = bisect.bisect_left(self.order, min(group))
        k = first // self.g.RESUME_EVERY
        decided, held, level = self.snapshots[k]
        state = (dict(decided), held, dict(level))
        return self.g._close(
            self.order, k * self.g.RESUME_EVERY, state, group, self.rebuildable, self.depth, self.cache, None
        )[1]

    def remove(self, group: set[int]) -> None:
        self.recompute -= group
        self._walk()


def _plan(
    policy: "Policy",
    program: Program,
    device: DeviceSpec,
    costs: "CostModel | None",
    decided: dict[int, str],
    reason: str,
    notes: dict[str, str] | None = None,
) -> Plan:
    names = {b: program.tensors[b].name for b in decided}
    return policy.new_plan(
        program,
        device,
        costs,
        stash={names[b]: d for b, d in sorted(decided.items())},
        reason=reason,
        notes=notes or {},
    )


def _counts(decided: dict[int, str], stashed: set[int]) -> str:
    rec = sum(1 for b, d in decided.items() if d == "recompute" and b in stashed)
    return f"{rec} of {len(stashed)} stashed buffers recomputed"


@register
@dataclass(frozen=True)
class Mirror(Policy):
    """``mirror[:step=100][:depth=0][:algos=memory|performance]``: recompute every cheap op's output but every
    ``step``-th (0: none kept); ``depth``: at most that many stashed buffers rebuilt in a row (0: unbounded)."""

    name = "mirror"
    budget_free = True  # its decisions are the same at every capacity
    step: int = MIRROR_STEP
    depth: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("step", "depth"):
            v = getattr(self, key)
            if not isinstance(v, int) or v < 0 or (key == "step" and v == 1):
                raise ValueError(
                    f"policy 'mirror': {key}={v!r} must be a non-negative int"
                    + (" other than 1" if key == "step" else "")
                )

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        g = _Graph(program)
        mirrorable = {b for b in g.cheap if not any(program.ops[i].kind in MIRROR_KEEPS for i in g.chains[b])}
        # MXNet counts the candidates in forward order and keeps every step-th one
        candidates = sorted(b for b in g.stashed if b in mirrorable)
        recompute = {b for k, b in enumerate(candidates, 1) if not self.step or k % self.step}
        decided = g.close(recompute, lambda s: s in mirrorable, self.depth or None)
        return _plan(
            self, program, device, costs, decided, f"mirror: every cheap op's output; {_counts(decided, g.stashed)}"
        )


@register
@dataclass(frozen=True)
class Chen(Policy):
    """``chen[:segments=N]``: about sqrt(n) checkpoints (``segments=0``: sqrt of the number of ops)."""

    name = "chen"
    budget_free = True  # its decisions are the same at every capacity
    segments: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.segments, int) or self.segments < 0:
            raise ValueError(f"policy 'chen': segments={self.segments!r} must be a non-negative int")

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        g = _Graph(program)
        checkpoints = self.checkpoints(program, g)
        decided = g.close({b for b in g.stashed if b not in checkpoints}, lambda s: s not in checkpoints)
        return _plan(
            self,
            program,
            device,
            costs,
            decided,
            f"chen: {len(checkpoints)} checkpoints kept; {_counts(decided, g.stashed)}",
            {g.name(b): "checkpoint" for b in sorted(checkpoints)},
        )

    def checkpoints(self, program: Program, g: _Graph) -> set[int]:
        """Buffers that alone carry the forward pass at their point (a cut of one), every ~1/k of the bytes."""
        ops, tensors = program.ops, program.tensors
        last_read = {}
        for op in ops:
            for t in op.inputs:
                last_read[tensors[t].buffer] = op.index
        live: set[int] = set()
        cuts = []
        for op in ops:
            b = tensors[op.output].buffer
            live.add(b)
            live = {x for x in live if last_read.get(x, -1) > op.index}
            last = max(i for i in g.chains[b])
            if live == {b} and op.index == last:
                cuts.append(b)
        k = self.segments or max(1, round(math.sqrt(len(ops))))
        total = sum(g.size[b] for b in g.stashed)
        budget, acc, chosen = total / k, 0.0, set()
        for b in cuts:
            acc += g.size[b]
            if acc >= budget:
                chosen.add(b)
                acc = 0.0
        return chosen | set(program.input_tensors)


@register
@dataclass(frozen=True)
class Echo(Policy):
    """``echo[:algos=memory|performance]``: Echo's footprint-aware choice (see the module docstring)."""

    name = "echo"
    budget_free = True  # its decisions are the same at every capacity

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        g = _Graph(program)
        cache: dict[int, Any] = {}
        if oracle is None:
            return self._at_depth(g, device, costs, DEPTH, cache)
        # the depth limit trades chains against what they hold; replay tells which peaks lowest
        base = _plan(self, program, device, costs, {b: Stash.KEEP for b in g.stashed}, "")
        floor = oracle(base, memory=1 << 60).peak_bytes
        tried = []
        for depth in DEPTHS:
            plan = self._at_depth(g, device, costs, depth, cache)
            tried.append((oracle(plan, memory=1 << 60).peak_bytes, depth, plan))
        peak, depth, plan = min(tried, key=lambda t: (t[0], t[1]))
        peaks = ", ".join(f"{d}: {p}" for p, d, _ in tried)
        if peak > floor:
            return replace(
                base,
                reason=f"echo: recomputing would peak at {peak} bytes at best, above layer-wise "
                f"allocation's {floor}: nothing recomputed",
                notes={g.name(b): "kept: recomputing raised the peak" for b in g.stashed},
            )
        return replace(
            plan, reason=f"{plan.reason}; rebuild chains at most {depth} deep (replayed peak by depth: {peaks} bytes)"
        )

    def _at_depth(
        self, g: _Graph, device: DeviceSpec, costs: "CostModel | None", depth: int, cache: dict[int, Any]
    ) -> Plan:
        """Echo's Algorithm 1 with rebuild chains at most ``depth`` stashed buffers deep."""
        notes: dict[str, str] = {}

        def close(recompute: set[int]) -> tuple[dict[int, str], int]:
            return g.close_held(recompute, lambda s: s in g.cheap, depth, cache)

        start, held = close({b for b in g.stashed if b in g.cheap})
        recompute = {b for b in g.stashed if start[b] == "recompute"}
        trials = g.trials(recompute, lambda s: s in g.cheap, depth, cache)
        for group, why in self._groups(g, recompute):
            group = group & trials.recompute
            if not group:
                continue
            trial = trials.without(group)
            if trial <= held:
                trials.remove(group)
                for b in group:
                    notes[g.name(b)] = f"kept: {why} (holding it costs {trial - held:+d} bytes)"
                held = trial
        recompute = trials.recompute
        decided = close(recompute)[0]
        for b, d in decided.items():
            if d == "recompute":
                notes.setdefault(
                    g.name(b),
                    "recomputed: a cheap op whose sources stay live anyway"
                    if b in g.stashed
                    else "recomputed: a cheap source of a rebuild",
                )
            elif b not in g.stashed:
                notes.setdefault(g.name(b), "kept: a source of rebuilds")
            elif b not in g.cheap:
                notes.setdefault(g.name(b), "kept: not a cheap op's output")
            else:
                notes.setdefault(g.name(b), f"kept: its rebuild would chain more than {depth} rebuilt buffers")
        reason = f"echo: {_counts(decided, g.stashed)}; {held} bytes held from forward to backward"
        return _plan(self, g.program, device, costs, decided, reason, notes)

    @staticmethod
    def _groups(g: _Graph, recompute: set[int]) -> list[tuple[set[int], str]]:
        """Candidates to keep: for each source kept only for rebuilds, every recomputed buffer whose rebuild
        reads it (largest source first); then each recomputed buffer alone (largest first)."""
        needed_by: dict[int, set[int]] = {}
        for b in recompute:
            stack, seen = [b], set()
            while stack:
                x = stack.pop()
                for s in g.sources[x]:
                    if s in seen:
                        continue
                    seen.add(s)
                    if s in g.stashed:
                        continue
                    if s in g.chains and s in g.cheap:
                        stack.append(s)
                    else:
                        needed_by.setdefault(s, set()).add(b)
        groups = [
            (members, f"recomputing it would hold {g.name(s)!r} ({g.size[s]} bytes) as a source")
            for s, members in sorted(needed_by.items(), key=lambda kv: (-g.size[kv[0]], kv[0]))
        ]
        groups += [
            ({b}, "recomputing it frees no more than it holds")
            for b in sorted(recompute, key=lambda b: (-g.size[b], b))
        ]
        return groups

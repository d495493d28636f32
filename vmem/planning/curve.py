"""The memory/time curve of a network before anything runs: ``auto``'s plan at budgets from the least it trains
in to what keeping everything takes, each with its predicted step time and what it does (keeps, offloads and
through which codec, encodes, recomputes, splits, micro-batches), the named policies' points beside them.

The curve is the lower envelope of every plan tried: a point is kept only where it is predicted faster than
every point of less memory, so a larger budget is never predicted slower and a smaller one never needs more
memory (PyTorch's partitioner gives no such promise: its measured peak can rise as its budget falls). Budgets
start evenly spaced and are added halfway between two neighbours whose times differ by more than 5%, until
``most`` budgets are planned: denser where the time changes. Every figure is the planner's: exact memory (the
device pool's replay), the time of the device's cost model or profile."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TypedDict

from ..errors import BudgetTooSmall, PlanError
from ..units import format_bytes
from .budget import smallest_memory
from .network import plan_step
from .oracle import Replays
from .result import UNBOUNDED, PlanResult
from .target import Target

if TYPE_CHECKING:
    from ..costs.model import CostModel
    from ..device.base import Device
    from ..device.spec import DeviceSpec
    from ..graph import Network

__all__ = ["Curve", "CurvePoint", "curve", "NAMED"]

#: the named policies placed beside auto's curve
NAMED = ("baseline", "layerwise", "vdnn-conv", "vdnn-all", "echo", "gist")


class Techniques(TypedDict):
    """What a plan does (:func:`techniques`)."""

    stash: dict[str, int]
    codecs: dict[str, int]
    split: int
    microbatch: int
    chosen: str | None


@dataclass(frozen=True)
class CurvePoint:
    """One plan on the curve: the budget it was planned for, the memory it takes (its peak), its predicted
    step seconds, the policy that made it and what it does (:func:`techniques`)."""

    budget: int
    memory: int
    step_seconds: float
    policy: str
    techniques: Techniques
    #: measured on the device (``vmem plan --curve --measure``): the most any step took and the median step
    measured_peak: int | None = None
    measured_seconds: float | None = None
    #: where the measuring run's plan came out otherwise than the curve's, its peak (None: the same plan)
    replanned: int | None = None

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Curve:
    """A network's memory/time curve at one batch on one device (see the module docstring). ``points``:
    auto's lower envelope, memory rising and step time falling; ``named``: the named policies' plans, each
    at the least memory it trains in; ``floor``: the least memory auto trains in; ``keep_all``: the peak
    of auto's plan where memory is no object."""

    network: str
    batch: int
    device: str
    precision: str
    points: tuple[CurvePoint, ...]
    named: tuple[CurvePoint, ...]
    floor: int
    keep_all: int
    planned: int  # how many budgets were planned

    def to_dict(self) -> dict[str, object]:
        """Everything, as plain data (what ``vmem plan --curve --json`` prints)."""
        out = dataclasses.asdict(self)
        out["points"] = [p.to_dict() for p in self.points]
        out["named"] = [p.to_dict() for p in self.named]
        return out

    def table(self) -> str:
        """The curve as a table: memory, time, and what each point does."""
        head = f"{self.network} at batch {self.batch} on {self.device} ({self.precision})"
        every = (*self.points, *sorted(self.named, key=lambda q: q.memory))
        measured = any(p.measured_seconds is not None for p in every)
        rows = [
            f"{head}: auto trains in {format_bytes(self.floor)} to {format_bytes(self.keep_all)} "
            f"({len(self.points)} points of {self.planned} budgets planned)",
            f"{'memory':>12} {'step ms':>9}  "
            + (f"{'measured':>12} {'ms':>9} {'/pred':>6}  " if measured else "")
            + f"{'policy':<12} does",
        ]
        for p in every:
            got = ""
            if measured:
                got = (
                    f"{format_bytes(p.measured_peak):>12} {p.measured_seconds * 1e3:9.2f} "
                    f"{p.measured_seconds / p.step_seconds:6.3f}  "
                    if p.measured_seconds is not None and p.measured_peak is not None
                    else f"{'':>12} {'':>9} {'':>6}  "
                )
            again = f" (run as another plan: {format_bytes(p.replanned)})" if p.replanned is not None else ""
            rows.append(
                f"{format_bytes(p.memory):>12} {p.step_seconds * 1e3:9.2f}  {got}{p.policy:<12} "
                f"{describe(p.techniques)}{again}"
            )
        return "\n".join(rows)

    def plot(self, path: str) -> None:
        """The curve drawn (memory across, step time up; auto's points joined, the named policies' marked) into
        an image file at ``path`` (the ``plot`` extra: matplotlib)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:  # an optional extra
            raise ImportError("Curve.plot needs matplotlib: pip install 'vmem[plot]'") from exc
        fig, ax = plt.subplots(figsize=(7, 4.5))
        mib = 1 << 20
        ax.plot([p.memory / mib for p in self.points], [p.step_seconds * 1e3 for p in self.points], "o-", label="auto")
        for p in self.named:
            ax.plot(p.memory / mib, p.step_seconds * 1e3, "s")
            ax.annotate(p.policy, (p.memory / mib, p.step_seconds * 1e3), fontsize=8)
        ax.set_xlabel("memory (MiB)")
        ax.set_ylabel("predicted step time (ms)")
        ax.set_title(f"{self.network}, batch {self.batch}, {self.device} ({self.precision})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)

    def json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def techniques(result: PlanResult) -> Techniques:
    """What a plan does: its buffers by decision (keep, offload, encode, recompute), the codecs it offloads or
    encodes through, the convolutions whose backward it splits, its micro-batches."""
    p = result.plan
    stash = Counter(str(getattr(d, "value", d)) for d in p.stash.values())
    return {
        "stash": dict(sorted(stash.items())),
        "codecs": dict(sorted(Counter(p.codecs.values()).items())),
        "split": len(p.split),
        "microbatch": p.microbatch,
        "chosen": p.chosen,
    }


def describe(t: Techniques) -> str:
    """A point's techniques in a few words."""
    parts = [f"{n} {kind}" for kind, n in t["stash"].items() if kind != "keep" and n]
    if t["codecs"]:
        parts.append("via " + ", ".join(f"{c} x{n}" for c, n in t["codecs"].items()))
    if t["split"]:
        parts.append(f"{t['split']} split")
    if t["microbatch"] > 1:
        parts.append(f"{t['microbatch']} micro-batches")
    return "; ".join(parts) or "keeps everything"


def _point(result: PlanResult, budget: int, policy: str) -> CurvePoint | None:
    if not result.fits or result.step_seconds is None:
        return None
    return CurvePoint(budget, int(result.peak_bytes), float(result.step_seconds), policy, techniques(result))


def envelope(points: Iterable[CurvePoint]) -> tuple[CurvePoint, ...]:
    """The points each predicted faster than every point of less (or as much) memory: memory rising, time
    falling."""
    out: list[CurvePoint] = []
    for p in sorted(points, key=lambda q: (q.memory, q.step_seconds)):
        if not out or p.step_seconds < out[-1].step_seconds:
            if out and p.memory == out[-1].memory:
                out[-1] = p
            else:
                out.append(p)
    return tuple(out)


def curve(
    net: Network,
    batch: int,
    device: Device | DeviceSpec | Target | str = "sim:h100-sxm",
    *,
    precision: str = "fp32",
    points: int = 20,
    most: int = 40,
    named: Sequence[str] = NAMED,
    costs: CostModel | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Curve:
    """``net``'s memory/time curve at ``batch`` on ``device`` (a simulated GPU by default; the CPU device with
    ``costs``, a profile): ``auto`` planned at ``points`` budgets from its floor to keep-all, and more (up
    to ``most``) where the time changes; the named policies beside (see :class:`Curve`). ``progress(done,
    total)`` is called after each plan."""
    if not isinstance(points, int) or points < 2 or not isinstance(most, int) or most < points:
        raise ValueError(f"curve: points={points!r} must be an int >= 2 and most={most!r} at least that")
    target = Target.of(device)
    program = net.build(batch, precision=precision)
    costs = target.costs(costs)  # one cost model for every budget: the plans' replays are shared among them
    replays = Replays()

    def planned(policy: str, memory: int) -> PlanResult | None:
        try:
            return plan_step(
                lambda n: net.build(n, precision=precision),
                batch,
                target.with_memory(memory),
                policy,
                costs=costs,
                replays=replays,
            ).result
        except (BudgetTooSmall, PlanError):
            return None

    top_plan = planned("auto", UNBOUNDED)
    if top_plan is None or top_plan.step_seconds is None:
        raise PlanError(f"{net.name}: auto plans no step at batch {batch} on {target.spec.name}")
    keep_all = int(top_plan.peak_bytes)
    floor = smallest_memory(program, target, "auto") or keep_all
    floor = min(floor, keep_all)
    found: dict[int, CurvePoint] = {}
    total = [points]

    def at(budget: int) -> None:
        if budget in found:
            return
        result = planned("auto", budget)
        p = _point(result, budget, "auto") if result is not None else None
        if p is not None:
            found[budget] = p
        if progress is not None:
            progress(len(found), total[0])

    span = keep_all - floor
    for k in range(points):
        at(floor + span * k // (points - 1) if span else floor)
    while len(found) < most:  # halfway between neighbours whose times differ by more than 5%
        ordered = sorted(found)
        gaps = [
            (a, b)
            for a, b in zip(ordered, ordered[1:])
            if b - a > 1024 and abs(found[a].step_seconds - found[b].step_seconds) > 0.05 * found[b].step_seconds
        ]
        if not gaps:
            break
        total[0] = min(most, len(found) + len(gaps))
        for a, b in gaps[: most - len(found)]:
            at((a + b) // 2)
    named_points = []
    for policy in named:  # each at the least memory it trains in (what it is for), planned there
        least = smallest_memory(program, target, policy)
        result = planned(policy, least) if least is not None else None
        p = _point(result, int(least or 0), policy) if result is not None else None
        if p is not None:
            named_points.append(p)
    return Curve(
        network=net.name,
        batch=batch,
        device=target.spec.name,
        precision=precision,
        points=envelope(found.values()),
        named=tuple(named_points),
        floor=int(floor),
        keep_all=keep_all,
        planned=len(found),
    )

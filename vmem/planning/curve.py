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

import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import pickle
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence, TypedDict, Union

from ..errors import BudgetTooSmall, PlanError
from ..units import format_bytes
from .budget import largest_batch, smallest_memory
from .microbatch import splittable
from .network import plan_step
from .plan import floor_policy
from .oracle import Replays
from .result import UNBOUNDED, PlanResult
from .target import Target

if TYPE_CHECKING:
    from ..costs.model import CostModel
    from ..device.base import Device
    from ..device.spec import DeviceSpec
    from ..graph import Network

__all__ = ["Curve", "CurvePoint", "curve", "NAMED"]

#: the largest batch a curve looks for (:attr:`Curve.largest_batch`)
LARGEST = 1 << 16
#: the named policies placed beside auto's curve
NAMED = ("baseline", "layerwise", "vdnn-conv", "vdnn-all", "echo", "gist")


class Techniques(TypedDict):
    """What a plan does (:func:`techniques`)."""

    stash: dict[str, int]
    codecs: dict[str, int]
    split: int
    microbatch: int
    chosen: str | None
    #: per convolution pass, how many convolutions run each algorithm
    algos: dict[str, dict[str, int]]


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
    #: the plan's packed peak over the most bytes live at once (what placement costs; 1.0: nothing)
    packing: float | None = None

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
    #: the largest batch whose step fits the device's own capacity whole, under auto's leanest plan (every map
    #: offloaded but the ReLUs' signs, the leanest algorithms): larger batches train as micro-batches
    largest_batch: int | None = None
    capacity: int | None = None  # the device's own capacity, which largest_batch is for
    #: whether batches beyond it train as micro-batches (every layer per sample, or batch norm's sums)
    splittable: bool = False

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
            f"({len(self.points)} points of {self.planned} budgets planned)"
            + (
                f"; at its own {format_bytes(self.capacity)}, batches up to "
                f"{self.largest_batch}{' or more' if self.largest_batch >= LARGEST else ''} train whole"
                + (" (larger ones as micro-batches)" if self.splittable else "")
                if self.largest_batch is not None and self.capacity is not None
                else ""
            ),
            f"{'memory':>12} {'step ms':>9} {'packing':>7}  "
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
            packing = f"{p.packing:7.3f}" if p.packing is not None else f"{'-':>7}"
            rows.append(
                f"{format_bytes(p.memory):>12} {p.step_seconds * 1e3:9.2f} {packing}  {got}{p.policy:<12} "
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
        for p in self.points:  # each of auto's points labelled by what it does
            ax.annotate(
                short(p.techniques),
                (p.memory / mib, p.step_seconds * 1e3),
                xytext=(3, 4),
                textcoords="offset points",
                fontsize=7,
            )
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
    encodes through, the convolutions whose backward it splits, its micro-batches, its convolutions'
    algorithms (per pass, how many run each)."""
    p = result.plan
    stash = Counter(str(getattr(d, "value", d)) for d in p.stash.values())
    algos: dict[str, Counter[str]] = {}
    for per in p.algos.values():
        for pass_, algo in per.items():
            algos.setdefault(pass_, Counter())[algo] += 1
    return {
        "stash": dict(sorted(stash.items())),
        "codecs": dict(sorted(Counter(p.codecs.values()).items())),
        "split": len(p.split),
        "microbatch": p.microbatch,
        "chosen": p.chosen,
        "algos": {pass_: dict(sorted(c.items())) for pass_, c in sorted(algos.items())},
    }


def short(t: Techniques) -> str:
    """A point's techniques in a label: how many buffers it stores each way other than kept (``3off 2rec``)."""
    ways = {"offload": "off", "recompute": "rec", "encode": "enc"}
    parts = [f"{n}{ways.get(kind, kind)}" for kind, n in t["stash"].items() if kind != "keep" and n]
    if t["microbatch"] > 1:
        parts.append(f"x{t['microbatch']}")
    return " ".join(parts) or "keep"


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
    return CurvePoint(
        budget,
        int(result.peak_bytes),
        float(result.step_seconds),
        policy,
        techniques(result),
        packing=result.packing,
    )


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
    workers: int = 1,
) -> Curve:
    """``net``'s memory/time curve at ``batch`` on ``device`` (a simulated GPU by default; the CPU device with
    ``costs``, a profile): ``auto`` planned at ``points`` budgets from its floor to keep-all, and more (up
    to ``most``) where the time changes; the named policies beside (see :class:`Curve`). ``progress(done,
    total)`` is called after each plan. ``workers`` > 1: the budgets planned in that many processes (the
    same curve: each budget's plan is the one it has alone); where the network, device or costs cannot be
    sent to another process, in this one. The processes are spawned, so a script that asks for them calls
    this under ``if __name__ == "__main__":`` (as Python's own process pools need)."""
    if not isinstance(points, int) or points < 2 or not isinstance(most, int) or most < points:
        raise ValueError(f"curve: points={points!r} must be an int >= 2 and most={most!r} at least that")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"curve: workers={workers!r} must be a positive int")
    target = Target.of(device)
    costs = target.costs(costs)  # one cost model for every budget: the plans' replays are shared among them
    planner = _Planner(net, batch, target, precision, costs)
    top_plan = planner.planned("auto", UNBOUNDED)
    if top_plan is None or top_plan.step_seconds is None:
        raise PlanError(f"{net.name}: auto plans no step at batch {batch} on {target.spec.name}")
    keep_all = int(top_plan.peak_bytes)
    floor = min(planner.least("auto") or keep_all, keep_all)
    found: dict[int, CurvePoint] = {}
    total = [points + len(named) + 1]
    done = [0]
    with _pool(planner, workers) as run:

        def plan_all(tasks: Sequence[_Task]) -> list[_Done]:
            def step() -> None:
                done[0] += 1
                if progress is not None:
                    progress(done[0], total[0])

            return run(tasks, step)

        span = keep_all - floor
        budgets = sorted({floor + span * k // (points - 1) if span else floor for k in range(points)})
        # the named policies, each at the least memory it trains in (what it is for), planned beside
        first = plan_all(
            [("at", "auto", b) for b in budgets]
            + [("least", policy, None) for policy in named]
            + [("largest", "auto", None)]
        )
        named_points = [p for p in first[len(budgets) : -1] if isinstance(p, CurvePoint)]
        largest = first[-1] if isinstance(first[-1], int) else None
        found.update((b, p) for b, p in zip(budgets, first) if isinstance(p, CurvePoint))
        tried = set(budgets)  # a budget planned without a point is not planned again
        while len(found) < most:  # halfway between neighbours whose times differ by more than 5%
            ordered = sorted(found)
            halves = [
                (a + b) // 2
                for a, b in zip(ordered, ordered[1:])
                if b - a > 1024
                and abs(found[a].step_seconds - found[b].step_seconds) > 0.05 * found[b].step_seconds
                and (a + b) // 2 not in tried
            ][: most - len(found)]
            if not halves:
                break
            tried.update(halves)
            total[0] += len(halves)
            made = plan_all([("at", "auto", b) for b in halves])
            found.update((b, p) for b, p in zip(halves, made) if isinstance(p, CurvePoint))
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
        largest_batch=largest,
        capacity=target.spec.memory,
        splittable=splittable(planner.program),
    )


#: what a curve plans, each on its own (in a worker where there are several): (what, policy, budget), and what
#: it gives (a point, a batch, or None where the policy plans nothing there)
_Task = tuple[str, str, Union[int, None]]
_Done = Union[CurvePoint, int, None]


class _Planner:
    """One curve's planning: ``auto`` at a budget, a named policy at its least memory; the replays and
    decisions of every plan shared (:class:`~vmem.planning.oracle.Replays`)."""

    def __init__(self, net: Network, batch: int, target: Target, precision: str, costs: CostModel | None):
        self.net, self.batch, self.target, self.precision, self.costs = net, batch, target, precision, costs
        self.program = net.build(batch, precision=precision)
        self.replays = Replays()

    def __getstate__(self) -> dict:  # sent to a worker without what it learnt
        return {k: v for k, v in self.__dict__.items() if k not in ("program", "replays")}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["net"], state["batch"], state["target"], state["precision"], state["costs"])  # type: ignore[misc]

    def planned(self, policy: str, memory: int) -> PlanResult | None:
        try:
            return plan_step(
                lambda n: self.net.build(n, precision=self.precision),
                self.batch,
                self.target.with_memory(memory),
                policy,
                costs=self.costs,
                replays=self.replays,
            ).result
        except (BudgetTooSmall, PlanError):
            return None

    def least(self, policy: str) -> int | None:
        return smallest_memory(self.program, self.target, policy)

    def point(self, task: _Task) -> _Done:
        """``("at", policy, budget)``: the policy's plan at the budget (a :class:`CurvePoint`, or None where
        it plans none); ``("least", policy, None)``: the policy at its least memory; ``("largest", policy,
        None)``: the largest batch the policy's floor fits the device's own capacity with, whole."""
        what, policy, budget = task
        if what == "largest":
            return largest_batch(
                self.net, self.target, policy=floor_policy(policy), precision=self.precision, most=LARGEST
            )
        if what == "least":
            budget = self.least(policy)
        if budget is None:
            return None
        result = self.planned(policy, budget)
        return _point(result, int(budget), policy) if result is not None else None


_WORKER: _Planner | None = None


def _start_worker(planner: _Planner) -> None:
    global _WORKER
    _WORKER = planner


def _work(task: _Task) -> _Done:
    assert _WORKER is not None, "a curve worker runs tasks only once started"
    return _WORKER.point(task)


@contextlib.contextmanager
def _pool(planner: _Planner, workers: int) -> Iterator[Callable[..., list[_Done]]]:
    """A runner of tasks (``run(tasks, step)``, ``step()`` after each): in this process, or where ``workers`` > 1
    and the planner can be sent, in a pool of that many (spawned: this process may run threads)."""

    def here(tasks: Sequence[_Task], step: Callable[[], None]) -> list[_Done]:
        out = []
        for task in tasks:
            out.append(planner.point(task))
            step()
        return out

    if workers > 1 and getattr(planner.target.catalog, "__self__", None) is not None:
        workers = 1  # a Device's own catalog: the device (its pool, its streams) stays in this process
    if workers > 1:
        try:
            pickle.dumps(planner)
        except Exception:  # a profile holding a device, a catalog made in a function: planned here
            workers = 1
    if workers == 1:
        yield here
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, context, _start_worker, (planner,)) as pool:

        def there(tasks: Sequence[_Task], step: Callable[[], None]) -> list[_Done]:
            futures = [pool.submit(_work, task) for task in tasks]
            for future in concurrent.futures.as_completed(futures):
                future.result()
                step()
            return [f.result() for f in futures]

        yield there

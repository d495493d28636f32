"""``auto``'s descent: from the fastest plan, while it does not fit, the cheapest ways to store the buffers
live at the peak, by estimated seconds per byte saved (greedy) or by an integer program (SciPy's HiGHS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...device.spec import DeviceSpec
from ...errors import PlanError
from ...graph import Program
from ..plan import Allocation, Plan
from .estimates import _applied, _Info, _Link, _refreshed, _Saving, savings

if TYPE_CHECKING:
    from ..base import Oracle
    from .policy import Auto

__all__ = ["descend"]


def descend(
    auto: "Auto",
    program: Program,
    device: DeviceSpec,
    oracle: "Oracle",
    plan: Plan,
    info: _Info,
    share: float,
    gaps: list[float],
    solver: str = "greedy",
) -> Any:
    """From ``plan`` (layer-wise, fastest algorithms), while it does not fit: at the peak (the replay
    says where), take the savings with the least estimated seconds per byte saved there until they
    cover the excess, and replay (with ``solver="ilp"``, the least estimated seconds that cover it, by
    an integer program, each round's gap appended to ``gaps``; the greedy choice where that does not
    lower the peak). Copies out fill at most ``share`` of the time before the peak. The result where it
    fits; None where it does not, or a round does not lower the peak."""
    if plan.allocation != Allocation.LAYER:
        return None
    result = oracle(plan)
    # a round replays every op: fewer on large graphs, about 3 x REPLAY_OPS op-replays for a descent
    rounds = max(6, min(auto.DESCENT_ROUNDS, 3 * auto.REPLAY_OPS // max(len(program.ops), 1)))
    for _ in range(rounds):
        if result.fits:
            return result
        before = result.peak_bytes
        excess = result.peak_bytes - device.memory * (1 - auto.MARGIN)
        ways = sorted(
            (w for w in savings(program, plan, info, result.peak_at) if auto.admits(w.kind)), key=_Saving.rate
        )
        if not ways:
            return None
        for how in (solver, "greedy") if solver == "ilp" else (solver,):
            # where the program's choice does not lower the peak, the greedy one
            link = _Link(info, plan, result.peak_at, share)
            if how == "ilp":
                chosen, gap = _knapsack(ways, excess, link, auto.time_limit)
                gaps.append(gap)
            else:
                chosen = _greedy(ways, excess, link)
            if not chosen:
                continue
            try:
                candidate = _refreshed(program, _applied(plan, chosen))
                room = info.room(plan, result, int(device.memory * (1 - auto.MARGIN)), chosen)
                held = info.held(candidate, room)
                # its offloads held until their copies end; where that does not lower the peak and the
                # peak is in the forward (the held blocks raise it, or leave holes), released at once
                attempt = oracle(held)
                lowered = attempt.peak_bytes < before or attempt.fits
                if held.release and not lowered and (attempt.peak_at or "").startswith("forward"):
                    attempt = oracle(candidate)
            except (PlanError, ValueError):
                continue
            if attempt.peak_bytes < before or attempt.fits:
                break
        else:
            return None  # the savings did not lower the peak: the estimates no longer lead anywhere
        result, plan = attempt, attempt.plan
    return result if result.fits else None


def _greedy(savings: list[_Saving], excess: float, link: "_Link") -> list[_Saving]:
    """One round of the descent, greedily: the savings in order (of seconds per byte), one way per buffer,
    the offloads the link admits, until they save ``excess`` bytes."""
    chosen, freed, taken = [], 0, set()
    for saving in savings:
        if saving.name in taken or (saving.kind == "offload" and not link.admit(saving.name, saving.wire)):
            continue
        taken.add(saving.name)
        chosen.append(saving)
        freed += saving.saved
        if freed >= excess:
            break
    return chosen


def _knapsack(savings: list[_Saving], excess: float, link: "_Link", time_limit: float) -> tuple[list[_Saving], float]:
    """One round of the descent as an integer program (SciPy's HiGHS): the savings of least estimated
    seconds that save at least ``excess`` bytes, one way per buffer, the copies out within the link's
    free time, each of them ending before the peak. The savings chosen (none where no choice saves that
    much) and the solver's relative gap (0: proven optimal; inf: no solution within ``time_limit``)."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array
    except ImportError:
        raise PlanError("auto:solver=ilp needs SciPy (pip install 'vmem[plan]')") from None
    info = link.info
    usable = [
        s
        for s in savings
        if s.kind != "offload"
        or info.written(info.by_name[s.name]) + info.costs.copy_seconds(s.wire, "d2h") <= link.deadline
    ]
    if not usable or sum(s.saved for s in usable) < excess:
        return [], float("inf")
    names = {n: k for k, n in enumerate(dict.fromkeys(s.name for s in usable))}
    n = len(usable)
    one_way = csr_array(
        (np.ones(n), ([names[s.name] for s in usable], np.arange(n))), shape=(len(names), n)
    )  # at most one way per buffer
    saved = np.array([[float(s.saved) for s in usable]])
    copies = np.array([[info.costs.copy_seconds(s.wire, "d2h") if s.kind == "offload" else 0.0 for s in usable]])
    constraints = [
        LinearConstraint(one_way, 0, 1),
        LinearConstraint(saved, excess, np.inf),
        LinearConstraint(copies, 0, max(link.deadline - link.busy, 0.0)),
    ]
    result = milp(
        c=np.array([s.seconds for s in usable]),
        constraints=constraints,
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
        options={"time_limit": float(time_limit)},
    )
    if result.x is None:
        return [], float("inf")
    gap = float(getattr(result, "mip_gap", 0.0) or 0.0)
    return [s for s, x in zip(usable, result.x) if x > 0.5], gap

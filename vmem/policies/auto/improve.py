"""``auto``'s improvement stage: moves that mix the techniques (a buffer kept, offloaded instead of
recomputed, sent through zvc; a faster algorithm), ranked by estimated gain, each kept only where the
replayed plan still fits and is faster."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

from ... import codecs
from ...device.spec import DeviceSpec
from ...errors import PlanError
from ...graph import PASSES, Program
from ...graph.analysis import nonnegative_sparse, prefetch_points, writers
from ...units import format_bytes
from ..plan import Plan, Stash
from .estimates import _Info, _Move, _offloaded, _reads, codec_offloads

if TYPE_CHECKING:
    from ..base import Oracle
    from ...costs.model import CostModel
    from .policy import Auto

__all__ = ["improve", "moves"]


# -- the improvement stage -----------------------------------------------------------------------
def improve(
    auto: "Auto", program: Program, device: DeviceSpec, costs: "CostModel", oracle: "Oracle", best: Any, info: _Info
) -> tuple:
    """Try the moves in order of estimated gain, keeping those after which the plan still fits and is
    faster. A try that does not fit is not replayed again for its figures; the oracle places a try's
    blocks only as tightly as it must to fit (the predicted time hardly depends on the placement)."""
    plan, kept, trials = best.plan, 0, 0
    notes: dict[str, str] = {}
    budget = auto.trial_budget(program)
    for _ in range(3):  # passes over the moves, each ranked on the plan as it then is
        accepted = False
        for move in sorted(moves(program, plan, costs, auto.admits("offload")), key=lambda m: -m.gain):
            if trials >= budget:
                return plan, notes, kept, best
            trials += 1
            try:
                candidate = move.apply(plan)
                if plan.release or Stash.OFFLOAD not in plan.stash.values():
                    # the descent's plans hold offloaded blocks until their copies end; a named
                    # plan that offloads stays as its policy made it
                    candidate = info.held(candidate, info.room(plan, best, device.memory))
                result = oracle(candidate, unfit=False)  # None where it does not fit
            except (PlanError, ValueError):  # a mix the lowering cannot schedule: not a plan
                continue
            if result is not None and result.step_seconds < best.step_seconds * (1 - auto.GAIN):
                saved = best.step_seconds - result.step_seconds
                plan, best, kept, accepted = candidate, result, kept + 1, True
                notes[move.what] = f"{move.note} (saves {saved * 1e3:.3f} ms; the plan still fits)"
        if not accepted:
            break
    return plan, notes, kept, best


def moves(program: Program, plan: Plan, costs: "CostModel", offload: bool = True) -> list[_Move]:
    """The improvement's moves from ``plan`` (``offload``: those that send a buffer to the host too)."""
    tensors = program.tensors
    by_name = {t.name: t.id for t in tensors}
    chains = writers(program)
    ops = {op.name: op for op in program.ops}
    stashed = program.stashed_buffers()
    moves: list[_Move] = []

    def rebuild_seconds(b: int) -> float:
        return sum(
            costs.op_seconds(program.ops[i], "forward", plan.algos.get(program.ops[i].name, {}).get("forward"))
            for i in chains.get(b, ())
        )

    for name, decision in plan.stash.items():
        b = tensors[by_name[name]].buffer
        nbytes = tensors[b].nbytes
        if decision == Stash.RECOMPUTE:
            gain = rebuild_seconds(b)
            moves.append(_Move(gain, name, f"kept instead of recomputed ({format_bytes(nbytes)})", _keep(name)))
            if b in stashed and offload:
                moves.append(_Move(gain * 0.99, name, "offloaded instead of recomputed", _offload(program, name, None)))
        elif decision == Stash.OFFLOAD:
            copy = costs.copy_seconds(nbytes, "d2h") + costs.copy_seconds(nbytes, "h2d")
            moves.append(_Move(copy, name, f"kept instead of offloaded ({format_bytes(nbytes)})", _keep(name)))
            if offload and name not in plan.codecs and nonnegative_sparse(program, b) and codec_offloads(costs):
                moves.append(_Move(copy / 2, name, "offloaded through zvc", _offload(program, name, "zvc")))
        elif decision == Stash.ENCODE:
            work = costs.misc_seconds("encode", 2 * nbytes)
            moves.append(_Move(work, name, f"kept instead of encoded ({format_bytes(nbytes)})", _keep(name)))
    for op_name, per in plan.algos.items():
        op = ops.get(op_name)
        if op is None or not op.algorithms:
            continue
        for pass_ in PASSES:
            now = per.get(pass_)
            if now is None:
                continue
            t_now = costs.op_seconds(op, pass_, now)
            fastest = min(op.algorithms[pass_], key=lambda a: costs.op_seconds(op, pass_, a))
            gain = t_now - costs.op_seconds(op, pass_, fastest)
            if fastest != now and gain > 0:
                moves.append(
                    _Move(
                        gain,
                        f"{op_name}.{pass_}",
                        f"{pass_} with {fastest} instead of {now}",
                        _algo(op_name, pass_, fastest),
                    )
                )
    return moves


def _keep(name: str) -> Callable[[Plan], Plan]:
    def apply(plan: Plan) -> Plan:
        stash = {**plan.stash, name: Stash.KEEP}
        codecs_ = {k: v for k, v in plan.codecs.items() if k != name}
        prefetch = {op: [b for b in bs if b != name] for op, bs in plan.prefetch.items()}
        return dataclasses.replace(
            plan,
            stash=stash,
            codecs=codecs_,
            prefetch={op: bs for op, bs in prefetch.items() if bs},
            ranges={k: v for k, v in plan.ranges.items() if k != name},
            release={k: v for k, v in plan.release.items() if k != name},
        )

    return apply


def _offload(program: Program, name: str, codec: str | None) -> Callable[[Plan], Plan]:
    def apply(plan: Plan) -> Plan:
        stash = {**plan.stash, name: Stash.OFFLOAD}
        codecs_ = dict(plan.codecs)
        if codec is None:
            codecs_.pop(name, None)
        else:
            codecs_[name] = codecs.get(codec).spec
        candidate = dataclasses.replace(plan, stash=stash, codecs=codecs_, sync=plan.sync or "event")
        offloaded = _offloaded(program, candidate)
        return dataclasses.replace(
            candidate, prefetch=prefetch_points(program, offloaded, reads=_reads(program, candidate))
        )

    return apply


def _algo(op_name: str, pass_: str, algo: str) -> Callable[[Plan], Plan]:
    def apply(plan: Plan) -> Plan:
        algos = {op: dict(per) for op, per in plan.algos.items()}
        algos[op_name][pass_] = algo
        return dataclasses.replace(plan, algos=algos)

    return apply

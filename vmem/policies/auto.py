"""``auto``: one planner over every technique, for the device's budget.

Within the budget it looks for the plan with the least predicted step time, deciding per stashed buffer
keep, offload (raw or through a lossless codec), encode on the device or recompute, and per convolution
pass its algorithm. It searches in two stages, each candidate verified by the planner's replay through
the real pool (fragmentation included) and priced by the cost model (the roofline on a simulated GPU, the
measured profile on the CPU device):

1. **Portfolio.** Every named technique, each with the fastest algorithms and with the leanest: layer-wise
   allocation, vDNN's ``vdnn-conv`` and ``vdnn-all`` (both sync modes, raw and through zero-value
   compression), ``vdnn-dyn``, Gist's lossless encodings, and recomputation (``echo``, ``mirror``,
   ``chen``). The fastest that fits is the starting point, so ``auto`` fits wherever one of them does and is
   never slower than the fastest of them.
2. **Improvement.** Moves that mix the techniques, ranked by a cheap estimate of the time they save and
   tried in that order, each kept only where the replayed plan still fits and is faster: a recomputed
   buffer kept, or offloaded instead (the copy hides behind compute where recomputing it would not); an
   offloaded or encoded buffer kept; a raw offload sent through zero-value compression (for buffers of
   ReLU outputs); a convolution pass given a faster algorithm. ``trials`` bounds the replays (by default 160, fewer on graphs of more than 250 ops).

Lossless by default (the plan trains bitwise like ``baseline``). ``lossy=`` admits one lossy codec as well
(``fp16``, ``fp10``, ``fp8``, ``fixed8``, ``fixed4``, ``patch2``): Gist with it, and offloads through it.
The plan's ``chosen`` names the starting technique, its ``reason`` summarises, and ``notes`` says per
buffer or pass what each accepted move changed and what it saved.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from .. import codecs
from ..device.spec import DeviceSpec
from ..errors import BudgetTooSmall, PlanError
from ..graph import PASSES, Program
from ..graph.analysis import nonnegative_sparse, prefetch_points, writers
from ..schedule.gradients import needs_grad
from ..schedule.recompute import backward_uses, decisions
from ..units import format_bytes
from .base import Policy, get, option, register
from .plan import Allocation, Plan, Stash

__all__ = ["Auto", "PORTFOLIO"]

#: The named techniques auto starts from (lossless), each tried as it is: the floor (every map offloaded,
#: the leanest algorithms) first, since vdnn-dyn needs it to fit.
FLOOR = "vdnn-all:algos=memory,sync=layer"
PORTFOLIO = (
    FLOOR,
    "layerwise:algos=performance",
    "vdnn-conv:algos=performance,sync=event",
    "vdnn-conv:algos=performance,sync=layer",
    "vdnn-all:algos=performance,sync=event",
    "vdnn-all:algos=performance,sync=layer",
    "vdnn-conv:algos=performance,sync=event,codec=zvc",
    "vdnn-all:algos=performance,sync=event,codec=zvc",
    "vdnn-dyn",
    "gist:algos=performance",
    "echo:algos=performance",
    "mirror:algos=performance",
    "chen:algos=performance",
    "gist:algos=memory",
    "echo:algos=memory",
    "chen:algos=memory",
)
LOSSY = ("fp16", "fp10", "fp8", "fixed8", "fixed4", "patch2")


@dataclass(frozen=True)
class _Move:
    gain: float  # estimated seconds saved
    what: str  # a buffer's or pass's name
    note: str
    apply: Callable[[Plan], Plan]


@register
@dataclass(frozen=True)
class Auto(Policy):
    """``auto[:lossy=fp8|...,trials=64]``: the fastest plan that fits, over every technique (see the
    module docstring). Its ``algos`` option is not used: it chooses algorithms itself."""

    name = "auto"
    needs_profile = True
    lossy: str | None = option(None)
    trials: int | None = option(None)
    #: the least fraction of the step a move must save to be kept (less is within the cost model's error)
    GAIN: ClassVar[float] = 1e-4
    #: the default improvement stage's replays: at most MAX_TRIALS, about REPLAY_OPS ops replayed in all
    MAX_TRIALS: ClassVar[int] = 160
    REPLAY_OPS: ClassVar[int] = 40_000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lossy is not None and self.lossy not in LOSSY:
            raise ValueError(f"policy 'auto': lossy={self.lossy!r}; use one of {', '.join(LOSSY)}")
        if self.trials is not None and (
            isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 0
        ):
            raise ValueError(f"policy 'auto': trials={self.trials!r} must be a count (0: no improvement stage)")

    def trial_budget(self, program: Program) -> int:
        """Replays the improvement stage may spend: ``trials``, or by default :attr:`MAX_TRIALS`, fewer on
        large graphs (each replay walks every op): at least 8, about :attr:`REPLAY_OPS` op-replays in all."""
        if self.trials is not None:
            return self.trials
        return max(8, min(self.MAX_TRIALS, self.REPLAY_OPS // max(len(program.ops), 1)))

    @property
    def spec(self) -> str:
        options = ([f"lossy={self.lossy}"] if self.lossy is not None else []) + (
            [f"trials={self.trials}"] if self.trials is not None else []
        )
        return f"{self.name}:{','.join(options)}" if options else self.name

    def portfolio(self) -> list[str]:
        """The named plans auto starts from."""
        out = list(PORTFOLIO)
        if self.lossy is not None:
            gist = f"gist:dpr={self.lossy}" if self.lossy in codecs.FORMATS else f"gist:codec={self.lossy}"
            out += [f"{gist},algos=performance", f"vdnn-all:algos=performance,sync=event,codec={self.lossy}"]
        return out

    def decide(self, program: Program, device: DeviceSpec, costs: Any = None, oracle: Any = None) -> Plan:
        if oracle is None:
            raise PlanError("auto decides by replaying candidate plans: use vmem.plan or a Trainer")
        if costs is None:
            raise PlanError(
                "auto ranks plans by predicted step time: plan on a simulated GPU, or give costs= (a profile of "
                "the device, as a Trainer makes)"
            )
        started = time.perf_counter()

        def quick(candidate: Plan, memory: int | None = None) -> Any:
            """The oracle's answer, packing the arena as the planner does only where it can matter: a plan
            that fits with the sweeps fits; one whose live bytes alone exceed the capacity fits under no
            packing (and its figures do not depend on the packing)."""
            result = oracle(candidate, memory, packing="sweep")
            if result.fits or result.peak_bytes > (device.memory if memory is None else memory):
                return result
            return oracle(candidate, memory)

        fitting: list[tuple[float, str, Any]] = []
        tried, floor = 0, None
        choices = any(op.algorithms for op in program.ops)
        seen: set[str] = set()
        for spec in self.portfolio():
            if not choices and spec.replace("algos=memory", "algos=performance") in seen:
                continue  # no convolution: the same plan as with the fastest algorithms
            seen.add(spec)
            if spec == "vdnn-dyn" and not any(s == FLOOR for _, s, _ in fitting):
                continue  # vdnn-dyn needs its floor (vdnn-all, leanest algorithms) to fit
            try:
                # vdnn-dyn decides by fits and times alone: packed with the sweeps first, as the planner
                # packs where that does not fit, it decides the same, with fewer full packings
                plan = get(spec).decide(program, device, costs, quick if spec == "vdnn-dyn" else oracle)
            except BudgetTooSmall as exc:
                floor = floor or exc
                continue
            except PlanError:
                continue
            result = oracle(plan)
            tried += 1
            if result.fits and result.step_seconds is not None:
                fitting.append((result.step_seconds, spec, result))
        if not fitting:
            if floor is not None:
                raise floor
            get("vdnn-dyn").decide(program, device, costs, oracle)  # BudgetTooSmall: the least memory it needs
            raise PlanError(
                f"{program.network} at batch {program.batch} fits in {format_bytes(device.memory)} under none of "
                f"auto's techniques ({', '.join(self.portfolio())}); use a larger memory budget"
                + (" or a smaller batch." if program.batch > 1 else ".")
            )
        fitting.sort(key=lambda f: f[0])
        start_seconds, start_spec, best = fitting[0]
        plan, notes, moves_kept = best.plan, {}, 0
        if self.trial_budget(program) and plan.allocation == Allocation.LAYER:
            plan, notes, moves_kept, best = self._improve(program, device, costs, oracle, best)
        seconds = best.step_seconds
        reason = (
            f"auto: {len(fitting)} of {tried} named plans fit in {format_bytes(device.memory)}; the fastest, "
            f"{start_spec} ({start_seconds * 1e3:.2f} ms predicted), "
            + (
                f"improved by {moves_kept} move(s) to {seconds * 1e3:.2f} ms"
                if moves_kept
                else "could not be improved by the moves tried"
            )
            + f" ({time.perf_counter() - started:.1f} s of planning). {plan.reason}"
        )
        return dataclasses.replace(
            plan, policy=self.spec, reason=reason, chosen=start_spec, notes={**plan.notes, **notes}
        )

    # -- the improvement stage -----------------------------------------------------------------------
    def _improve(self, program: Program, device: DeviceSpec, costs: Any, oracle: Any, best: Any) -> tuple:
        """Try the moves in order of estimated gain, keeping those after which the plan still fits and is
        faster. A try first packs the arena with the sweeps only (faster; the predicted time does not depend
        on the packing, and a plan that fits so fits as the planner packs it); a faster plan that does not
        fit that way, but whose live bytes do, is packed again as the planner does."""
        plan, kept, trials = best.plan, 0, 0
        notes: dict[str, str] = {}
        budget = self.trial_budget(program)
        for _ in range(3):  # passes over the moves, each ranked on the plan as it then is
            accepted = False
            for move in sorted(self._moves(program, plan, costs), key=lambda m: -m.gain):
                if trials >= budget:
                    return plan, notes, kept, best
                trials += 1
                try:
                    candidate = move.apply(plan)
                    result = oracle(candidate, packing="sweep")
                    faster = result.step_seconds < best.step_seconds * (1 - self.GAIN)
                    if faster and not result.fits and result.peak_bytes <= device.memory:
                        result = oracle(candidate)  # the time does not depend on the packing; the fit may
                except (PlanError, ValueError):  # a mix the lowering cannot schedule: not a plan
                    continue
                if faster and result.fits:
                    saved = best.step_seconds - result.step_seconds
                    plan, best, kept, accepted = candidate, result, kept + 1, True
                    notes[move.what] = f"{move.note} (saves {saved * 1e3:.3f} ms; the plan still fits)"
            if not accepted:
                break
        return plan, notes, kept, best

    def _moves(self, program: Program, plan: Plan, costs: Any) -> list[_Move]:
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
                if b in stashed:
                    moves.append(
                        _Move(gain * 0.99, name, "offloaded instead of recomputed", _offload(program, name, None))
                    )
            elif decision == Stash.OFFLOAD:
                copy = costs.copy_seconds(nbytes, "d2h") + costs.copy_seconds(nbytes, "h2d")
                moves.append(_Move(copy, name, f"kept instead of offloaded ({format_bytes(nbytes)})", _keep(name)))
                if name not in plan.codecs and nonnegative_sparse(program, b):
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

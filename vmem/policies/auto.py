"""``auto``: one planner over every technique, for the device's budget.

Within the budget it looks for the plan with the least predicted step time, deciding per stashed buffer
keep, offload (raw or through a lossless codec), encode on the device or recompute, and per convolution
pass its algorithm. It gathers starting plans three ways, then improves the fastest that fits; every
candidate is verified by the planner's replay through the real pool (fragmentation included) and priced
by the cost model (the roofline on a simulated GPU, the measured profile on the CPU device):

1. **Portfolio.** Every named technique, each with the fastest algorithms and with the leanest: layer-wise
   allocation, vDNN's ``vdnn-conv`` and ``vdnn-all`` (both sync modes, raw and through zero-value
   compression), ``vdnn-dyn`` (without its keep search: the improvement's moves make the same choices,
   from whichever start is fastest), Gist's lossless encodings, and recomputation (``echo``, ``mirror``,
   ``chen``). So ``auto`` fits wherever one of them does and is never slower than the fastest of them
   (vdnn-dyn's search is left out on graphs of more than ``DYN_OPS`` ops: the descent covers its choices).
2. **Exhaustive**, on small graphs: where the stashed buffers' ways (below) make at most ``EXHAUSTIVE``
   plans, every one is replayed (its offloads held until their copies end, else released at once), so the
   start is exact there.
3. **Descent.** From the fastest plan (layer-wise, fastest algorithms), while it does not fit: the replay
   says where the peak is; of the kept buffers live there, take the ways to store them with the least
   estimated seconds per byte saved until they cover the excess, and replay again. The ways: recompute
   (from what the plan holds, cheap temporaries rebuilt with it: its producer's forward time), encode
   losslessly (ssdc, binarize: the kernels' time), offload raw or through zvc (what the prefetch cannot
   hide behind the backward ahead of its reader, while the copies out, queued in forward order, end
   before the peak). Each offloaded block is held until its copy is expected to end (``Plan.release``,
   :meth:`_Info.held`), as far as the forward has room for it, so that the forward never waits to reuse
   it; where that does not lower the peak, released at once. Held blocks cost the forward memory, so up
   to four descents run, the copies out given all, half, a quarter or none of the time before the peak
   (``LINK_SHARES``; the next only where the last fitted). ``solver=ilp`` adds
   descents whose rounds are integer programs (SciPy's HiGHS, ``time_limit`` seconds each): the least
   estimated seconds that save the excess.

Then the **improvement**: moves that mix the techniques, ranked by a cheap estimate of the time they save
and tried in that order, each kept only where the replayed plan still fits and is faster: a recomputed
buffer kept, or offloaded instead (the copy hides behind compute where recomputing it would not); an
offloaded or encoded buffer kept; a raw offload sent through zero-value compression (for buffers of ReLU
outputs); a convolution pass given a faster algorithm. ``trials`` bounds the replays (by default
``MAX_TRIALS``, fewer on graphs of more than ``REPLAY_OPS / MAX_TRIALS`` ops).

Lossless by default (the plan trains bitwise like ``baseline``). ``lossy=`` admits one lossy codec as well
(``fp16``, ``fp10``, ``fp8``, ``fixed8``, ``fixed4``, ``patch2``): Gist with it, and offloads through it.
The plan's ``chosen`` names the start, its ``reason`` summarises (what it keeps, offloads, encodes and
recomputes, counted), and ``notes`` says per buffer or pass what each accepted move changed and what it
saved. Where nothing fits it raises BudgetTooSmall with the leanest plan's least budget.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

from .. import codecs
from ..device.spec import DeviceSpec
from ..errors import BudgetTooSmall, PlanError
from ..graph import PASSES, Program
from ..graph.analysis import RecomputeGraph, nonnegative_sparse, prefetch_points, writers
from ..schedule.gradients import needs_grad
from ..schedule.recompute import backward_uses, decisions
from ..units import format_bytes
from .base import Policy, get, option, register
from .budget import least_memory
from .plan import Allocation, Plan, Stash
from .recompute import cheap_ops

__all__ = ["Auto", "PORTFOLIO", "NAMED"]

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
    "vdnn-dyn:keep=none",
    "gist:algos=performance",
    "echo:algos=performance",
    "mirror:algos=performance",
    "chen:algos=performance",
    "gist:algos=memory",
    "echo:algos=memory",
    "chen:algos=memory",
)
#: the named policies auto is measured against (bench/auto.py, its tests): the portfolio's, vdnn-dyn as it is
NAMED = tuple(s.replace(":keep=none", "") for s in PORTFOLIO)
LOSSY = ("fp16", "fp10", "fp8", "fixed8", "fixed4", "patch2")
#: how the descent picks each round's savings: by least seconds per byte, or by an integer program
SOLVERS = ("greedy", "ilp")
#: the start made by the descent: the fastest plan, made to fit by the cheapest savings per byte
FAST = "layerwise:algos=performance"
DESCENT = f"{FAST}, descended"
ILP_DESCENT = f"{FAST}, descended by integer programs"
EXHAUSTIVE = f"{FAST}, every choice tried"


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


@register
@dataclass(frozen=True)
class Auto(Policy):
    """``auto[:lossy=fp8|...,trials=64,solver=greedy|ilp,time_limit=10]``: the fastest plan that fits, over
    every technique (see the module docstring). Its ``algos`` option is not used: it chooses algorithms."""

    name = "auto"
    needs_profile = True
    chooses_algos = True
    lossy: str | None = option(None)
    trials: int | None = option(None)
    solver: str = option("greedy")
    time_limit: float = option(10.0)
    #: the most ops on which the portfolio runs vdnn-dyn's search
    DYN_OPS: ClassVar[int] = 2000
    #: the least fraction of the step a move must save to be kept (less is within the cost model's error)
    GAIN: ClassVar[float] = 1e-4
    #: the default improvement stage's replays: at most MAX_TRIALS, about REPLAY_OPS ops replayed in all
    MAX_TRIALS: ClassVar[int] = 128
    REPLAY_OPS: ClassVar[int] = 25_000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.solver not in SOLVERS:
            raise ValueError(f"policy 'auto': solver={self.solver!r}; use one of {', '.join(SOLVERS)}")
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float)) or self.time_limit <= 0:
            raise ValueError(f"policy 'auto': time_limit={self.time_limit!r} must be a positive number of seconds")
        if self.lossy is not None and self.lossy not in LOSSY:
            raise ValueError(f"policy 'auto': lossy={self.lossy!r}; use one of {', '.join(LOSSY)}")
        if self.trials is not None and (
            isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 0
        ):
            raise ValueError(f"policy 'auto': trials={self.trials!r} must be a count (0: no improvement stage)")

    def trial_budget(self, program: Program) -> int:
        """Replays the improvement stage may spend: ``trials``, or by default :attr:`MAX_TRIALS`, fewer on
        large graphs (each replay walks every op): at least 4, about :attr:`REPLAY_OPS` op-replays in all."""
        if self.trials is not None:
            return self.trials
        return max(4, min(self.MAX_TRIALS, self.REPLAY_OPS // max(len(program.ops), 1)))

    @property
    def spec(self) -> str:
        options = (
            ([f"lossy={self.lossy}"] if self.lossy is not None else [])
            + ([f"trials={self.trials}"] if self.trials is not None else [])
            + ([f"solver={self.solver}"] if self.solver != "greedy" else [])
            + ([f"time_limit={self.time_limit:g}"] if self.time_limit != 10.0 else [])
        )
        return f"{self.name}:{','.join(options)}" if options else self.name

    def portfolio(self, costs: Any = None) -> list[str]:
        """The named plans auto starts from (under ``costs``: offloads through a codec only where they can
        save time, see :func:`codec_offloads`)."""
        out = list(PORTFOLIO)
        if self.lossy is not None:
            gist = f"gist:dpr={self.lossy}" if self.lossy in codecs.FORMATS else f"gist:codec={self.lossy}"
            out += [f"{gist},algos=performance", f"vdnn-all:algos=performance,sync=event,codec={self.lossy}"]
        if not codec_offloads(costs):
            out = [spec for spec in out if not (spec.startswith("vdnn") and "codec=" in spec)]
        return out

    def decide(self, program: Program, device: DeviceSpec, costs: Any = None, oracle: Any = None) -> Plan:
        if oracle is None:
            raise PlanError("auto decides by replaying candidate plans: use vmem.plan or a Trainer")
        if costs is None:
            raise PlanError(
                "auto ranks plans by predicted step time: plan on a simulated GPU, or give costs= (a profile of "
                "the device, as a Trainer makes)"
            )

        fitting: list[tuple[float, str, Any]] = []
        tried, floor = 0, None
        replayed: dict[tuple, Any] = {}  # a plan's decisions -> its replay: techniques that decide alike
        choices = any(op.algorithms for op in program.ops)
        for spec in self.portfolio(costs):
            twin = spec.replace("algos=memory", "algos=performance")
            if spec != FLOOR and twin != spec and (not choices or any(s == twin for _, s, _ in fitting)):
                # no convolution: the same plan as with the fastest algorithms; or those fit, and with
                # nothing offloaded (the memory variants after the floor: gist, echo, chen) the leanest
                # algorithms cannot make the step faster
                continue
            if spec.startswith("vdnn-dyn") and (
                not any(s == FLOOR for _, s, _ in fitting) or len(program.ops) > self.DYN_OPS
            ):  # it needs its floor (vdnn-all, leanest algorithms) to fit; on a large graph its search
                continue  # (dozens of replays) costs more than the descent, which mixes what it chooses
            try:
                plan = get(spec).decide(program, device, costs, oracle)
            except BudgetTooSmall as exc:
                floor = floor or exc
                continue
            except PlanError:
                continue
            key = plan.decisions()
            if key not in replayed:  # on a network without convolutions vdnn-conv is layer-wise, and so on
                replayed[key] = oracle(plan)
                tried += 1
            result = replayed[key]
            if result.fits and result.step_seconds is not None:
                fitting.append((result.step_seconds, spec, result))
        fast = get(FAST).decide(program, device, costs)  # where the exhaustive search and the descents start
        info = _Info(program, costs, fast)
        exact = self._exhaustive(program, device, oracle, fast, info)
        if exact is not None:
            tried += 1
            fitting.append((exact.step_seconds, EXHAUSTIVE, exact))
        gaps: list[float] = []
        for solver in ("greedy", "ilp") if self.solver == "ilp" else ("greedy",):
            for share in self.LINK_SHARES:
                descended = self._descend(program, device, oracle, fast, info, share, gaps, solver)
                tried += 1
                if descended is None:
                    break  # where the copies may take the most time it did not fit: with less, neither
                fitting.append((descended.step_seconds, DESCENT if solver == "greedy" else ILP_DESCENT, descended))
        if not fitting:
            if floor is not None:
                raise floor
            self._refuse(program, device, costs, oracle)
            raise PlanError(
                f"{program.network} at batch {program.batch} fits in {format_bytes(device.memory)} under none of "
                f"auto's techniques ({', '.join(self.portfolio())}); use a larger memory budget"
                + (" or a smaller batch." if program.batch > 1 else ".")
            )
        fitting.sort(key=lambda f: f[0])
        start_seconds, start_spec, best = fitting[0]
        plan, notes, moves_kept = best.plan, {}, 0
        if self.trial_budget(program) and plan.allocation == Allocation.LAYER:
            plan, notes, moves_kept, best = self._improve(program, device, costs, oracle, best, info)
        seconds = best.step_seconds
        reason = (
            f"auto: {len({id(r) for _, _, r in fitting})} of {tried} starting plans fit in "
            f"{format_bytes(device.memory)}; the fastest, "
            f"{start_spec} ({start_seconds * 1e3:.2f} ms predicted), "
            + (
                f"improved by {moves_kept} move(s) to {seconds * 1e3:.2f} ms"
                if moves_kept
                else "could not be improved by the moves tried"
            )
            + (
                f"; {len(gaps)} descent rounds solved by HiGHS (the largest gap {max(gaps):.2%}), the fastest "
                f"such descent {_best(fitting, ILP_DESCENT)}, the greedy one {_best(fitting, DESCENT)}"
                if gaps
                else ""
            )
            + f"; {_summary(plan)}."
            + ("" if start_spec in (DESCENT, ILP_DESCENT, EXHAUSTIVE) else f" {start_spec}: {plan.reason}")
        )
        return dataclasses.replace(
            plan, policy=self.spec, reason=reason, chosen=start_spec, notes={**plan.notes, **notes}
        )

    #: the refusal's least budget is found to this fraction of the leanest plan's peak
    LEAST_TOLERANCE: ClassVar[float] = 1e-3

    def _refuse(self, program: Program, device: DeviceSpec, costs: Any, oracle: Any) -> None:
        """Raise BudgetTooSmall with the least budget the leanest plan (every feature map offloaded, the
        leanest algorithms) fits in: to the byte, or on a graph of more than ``DYN_OPS`` ops (each try
        replays the whole step) to :attr:`LEAST_TOLERANCE`."""
        lean = get(FLOOR).decide(program, device, costs)
        result = oracle(lean)
        if result.fits:
            return
        tolerance = self.LEAST_TOLERANCE if len(program.ops) > self.DYN_OPS else 0.0
        least = least_memory(  # the oracle lowers the plan once; each capacity tried is one replay
            lambda memory: oracle(lean, memory, unfit=False) is not None, result.peak_bytes, tolerance=tolerance
        )
        least = least if least is not None else 4 * result.peak_bytes
        raise BudgetTooSmall(
            f"{program.network} at batch {program.batch} fits in {format_bytes(device.memory)} under none of auto's "
            f"plans; the leanest ({FLOOR}: every feature map offloaded, memory-optimal algorithms) needs at least "
            f"{format_bytes(least)} ({least} bytes{f', to {tolerance:.1%}' if tolerance else ''}). Use a larger "
            "memory budget" + (" or a smaller batch." if program.batch > 1 else "."),
            least,
        )

    # -- exact, on small graphs ------------------------------------------------------------------------
    #: the most plans the exhaustive search replays (a graph with more combinations is not searched so)
    EXHAUSTIVE: ClassVar[int] = 2048

    def choices(self, program: Program, costs: Any, plan: Plan, info: "_Info | None" = None) -> dict[str, list]:
        """Per stashed buffer, every way the descent and the exhaustive search may store it: kept (None)
        and each :class:`_Saving` that applies (``info``: the program read under ``plan``'s algorithms)."""
        info = info or _Info(program, costs, plan)
        out: dict[str, list[_Saving | None]] = {program.tensors[b].name: [None] for b in program.stashed_buffers()}
        for saving in self._savings(program, plan, info, None, live_only=False):
            out[saving.name].append(saving)
        return out

    def _exhaustive(self, program: Program, device: DeviceSpec, oracle: Any, plan: Plan, info: "_Info") -> Any:
        """Where the buffers' choices from ``plan`` (layer-wise, fastest algorithms) make at most
        :attr:`EXHAUSTIVE` plans: the fastest of them that fits, every one replayed (None if none fits, or
        there are more)."""
        if plan.allocation != Allocation.LAYER:
            return None
        options = self.choices(program, info.costs, plan, info)
        if math.prod(len(v) for v in options.values()) > self.EXHAUSTIVE:
            return None
        best = None
        for combo in itertools.product(*options.values()):
            try:
                candidate = _refreshed(program, _applied(plan, [c for c in combo if c is not None]))
                for tried in (info.held(candidate), candidate) if candidate.prefetch else (candidate,):
                    # each offload held until its copy ends, else (where that does not fit) released at once
                    result = oracle(tried)
                    if result.fits:
                        break
            except (PlanError, ValueError):  # a mix the lowering cannot schedule
                continue
            if result.fits and (best is None or result.step_seconds < best.step_seconds):
                best = result
        return best

    # -- the descent -----------------------------------------------------------------------------------
    #: rounds of the descent (each one replay), and the margin each round aims below the budget
    DESCENT_ROUNDS: ClassVar[int] = 24
    MARGIN: ClassVar[float] = 0.02

    #: the descents' shares of the time before the peak the copies out may fill (0: no offloads): where the
    #: forward allocates where an offloaded buffer was before its copy ends, it waits for it
    LINK_SHARES: ClassVar[tuple[float, ...]] = (1.0, 0.5, 0.25, 0.0)

    def _descend(
        self,
        program: Program,
        device: DeviceSpec,
        oracle: Any,
        plan: Plan,
        info: "_Info",
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
        rounds = max(6, min(self.DESCENT_ROUNDS, 3 * self.REPLAY_OPS // max(len(program.ops), 1)))
        for _ in range(rounds):
            if result.fits:
                return result
            before = result.peak_bytes
            excess = result.peak_bytes - device.memory * (1 - self.MARGIN)
            savings = sorted(self._savings(program, plan, info, result.peak_at), key=_Saving.rate)
            if not savings:
                return None
            for how in (solver, "greedy") if solver == "ilp" else (solver,):
                # where the program's choice does not lower the peak, the greedy one
                link = _Link(info, plan, result.peak_at, share)
                if how == "ilp":
                    chosen, gap = _knapsack(savings, excess, link, self.time_limit)
                    gaps.append(gap)
                else:
                    chosen = _greedy(savings, excess, link)
                if not chosen:
                    continue
                try:
                    candidate = _refreshed(program, _applied(plan, chosen))
                    room = info.room(plan, result, int(device.memory * (1 - self.MARGIN)), chosen)
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

    def _savings(
        self, program: Program, plan: Plan, info: "_Info", peak_at: str | None, live_only: bool = True
    ) -> list["_Saving"]:
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

    # -- the improvement stage -----------------------------------------------------------------------
    def _improve(
        self, program: Program, device: DeviceSpec, costs: Any, oracle: Any, best: Any, info: "_Info"
    ) -> tuple:
        """Try the moves in order of estimated gain, keeping those after which the plan still fits and is
        faster. A try that does not fit is not replayed again for its figures; the oracle places a try's
        blocks only as tightly as it must to fit (the predicted time hardly depends on the placement)."""
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
                    if plan.release or Stash.OFFLOAD not in plan.stash.values():
                        # the descent's plans hold offloaded blocks until their copies end; a named
                        # plan that offloads stays as its policy made it
                        candidate = info.held(candidate, info.room(plan, best, device.memory))
                    result = oracle(candidate, unfit=False)  # None where it does not fit
                except (PlanError, ValueError):  # a mix the lowering cannot schedule: not a plan
                    continue
                if result is not None and result.step_seconds < best.step_seconds * (1 - self.GAIN):
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
                if name not in plan.codecs and nonnegative_sparse(program, b) and codec_offloads(costs):
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
            release={k: v for k, v in plan.release.items() if k != name},
        )

    return apply


def codec_offloads(costs: Any) -> bool:
    """Whether offloading through a codec can save time under ``costs`` (its ``codec_offload``, true where
    it does not say): on a GPU the link moves the encoded bytes while the codec's kernel runs beside the
    copy engine; on the CPU device the link is a memory copy on the cores the ops use, and encoding costs
    them more than the bytes it saves."""
    return bool(getattr(costs, "codec_offload", True))


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


class _Info:
    """What the descent's estimates read of a program under one plan's algorithms: the recompute graph
    (writers, sources, what is stashed and cheap, where backward first reads each buffer), op positions,
    where forward last reads each buffer, per-op seconds, and the windows an offload's copies can hide in."""

    def __init__(self, program: Program, costs: Any, plan: Plan):
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
        self.backward = []
        for op in ops:
            per = algos.get(op.name, {})
            if op.kind == "conv":
                t = costs.op_seconds(op, "backward_filter", per.get("backward_filter"))
                t += costs.op_seconds(op, "backward_data", per.get("backward_data"))
            else:
                t = costs.op_seconds(op, "backward", None)
            self.backward.append(t)
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

    def admit(self, name: str, wire: int) -> bool:
        seconds = self.info.costs.copy_seconds(wire, "d2h")
        if self.busy + seconds > self.deadline:  # the link is not free that long (checked first: cheap)
            return False
        entry = (self.info.written(self.info.by_name[name]), seconds)
        at = bisect.bisect(self.queue, entry)
        end = 0.0
        for start, took in (*self.queue[:at], entry, *self.queue[at:]):
            end = max(end, start) + took
        if end > self.deadline:
            return False
        self.queue.insert(at, entry)
        self.busy += seconds
        return True


def _best(fitting: list[tuple[float, str, Any]], start: str) -> str:
    """The least predicted step among the fitting starts named ``start``, in ms ("none fits" if none)."""
    seconds = [t for t, s, _ in fitting if s == start]
    return f"{min(seconds) * 1e3:.2f} ms" if seconds else "none fits"


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

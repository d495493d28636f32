"""The ``auto`` policy: its options, the named plans it starts from, and how its stages (the portfolio, the
exhaustive search, the descents, the improvement) combine into one plan (see :mod:`vmem.policies.auto`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ... import codecs
from ...device.spec import DeviceSpec
from ...errors import BudgetTooSmall, DoesNotFit, PlanError
from ...graph import Program
from ...units import format_bytes
from ..base import Policy, decide, get, option, register
from ..budget import least_memory
from ..plan import Allocation, Plan
from . import descent, exhaustive, improve
from .estimates import _Info, _Saving, _summary, codec_offloads, savings

if TYPE_CHECKING:
    from ..base import Oracle
    from ...costs.model import CostModel

__all__ = [
    "Auto",
    "FLOOR",
    "LEANEST",
    "PORTFOLIO",
    "NAMED",
    "LOSSY",
    "SOLVERS",
    "FAST",
    "DESCENT",
    "ILP_DESCENT",
    "EXHAUSTIVE",
]

#: The named techniques auto starts from (lossless), each tried as it is: the floor (every map offloaded but
#: those only a ReLU's backward reads, kept as bits; the leanest algorithms; each prefetch one layer ahead of
#: its reader) first, since vdnn-dyn needs it to fit.
FLOOR = "vdnn-all:algos=memory,sync=layer,relu=bits,prefetch=after"
#: The last resort, tried where nothing else fits: the floor with the sign bits a split convolution keeps for a
#: later ReLU sent to the host (their copies cost time, so no other plan is made from it).
LEANEST = f"{FLOOR},signs=host"
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
#: (the floor as the paper has it: vDNN offloads every map, ReLU outputs too, and prefetches ahead)
NAMED = tuple("vdnn-all:algos=memory,sync=layer" if s == FLOOR else s.replace(":keep=none", "") for s in PORTFOLIO)
LOSSY = ("fp16", "fp10", "fp8", "fixed8", "fixed4", "patch2")
#: how the descent picks each round's savings: by least seconds per byte, or by an integer program
SOLVERS = ("greedy", "ilp")
#: the start made by the descent: the fastest plan, made to fit by the cheapest savings per byte
FAST = "layerwise:algos=performance"
DESCENT = f"{FAST}, descended"
ILP_DESCENT = f"{FAST}, descended by integer programs"
EXHAUSTIVE = f"{FAST}, every choice tried"
#: with ``offload=off``, the plans whose least peak bounds what auto can reach (for its refusal)
OFFLOAD_OFF_FLOORS = ("chen:algos=memory", "echo:algos=memory", "gist:algos=memory")


@register
@dataclass(frozen=True)
class Auto(Policy):
    """``auto[:lossy=fp8|...,offload=on|off,trials=64,solver=greedy|ilp,time_limit=10,split=on|off,microbatch=on|off]``: the fastest plan that fits, over
    every technique (see the module docstring). Its ``algos`` option is not used: it chooses algorithms."""

    name = "auto"
    needs_profile = True
    chooses_algos = True
    needs_budget = True
    floor = "vdnn-all:algos=memory,relu=bits,prefetch=after,signs=host,split=on"  # a bound: recomputing may need less
    #: every plan auto starts from runs its convolutions' backward split (see Policy): never more memory,
    #: the same results, one more step a convolution
    split: str = option("on")
    #: a batch that fits under none of its plans runs as micro-batches (see Policy)
    microbatch: str = option("on")
    lossy: str | None = option(None)
    #: ``off``: keep, encode and recompute only, nothing sent to the host (where the link is busy, as with
    #: data parallel over PCIe, or host memory is scarce)
    offload: str = option("on")
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
        if isinstance(self.offload, bool):  # a spec string's on/off reads as a bool
            object.__setattr__(self, "offload", "on" if self.offload else "off")
        if self.offload not in ("on", "off"):
            raise ValueError(f"policy 'auto': offload={self.offload!r}; use 'on' or 'off'")
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
            + ([f"offload={self.offload}"] if self.offload != "on" else [])
            + ([f"trials={self.trials}"] if self.trials is not None else [])
            + ([f"solver={self.solver}"] if self.solver != "greedy" else [])
            + ([f"time_limit={self.time_limit:g}"] if self.time_limit != 10.0 else [])
            + ([f"split={self.split}"] if self.split != "on" else [])
            + ([f"microbatch={self.microbatch}"] if self.microbatch != "on" else [])
        )
        return f"{self.name}:{','.join(options)}" if options else self.name

    def portfolio(self, costs: "CostModel | None" = None) -> list[str]:
        """The named plans auto starts from (under ``costs``: offloads through a codec only where they can
        save time, see :func:`codec_offloads`)."""
        out = list(PORTFOLIO)
        if self.lossy is not None:
            gist = f"gist:dpr={self.lossy}" if self.lossy in codecs.FORMATS else f"gist:codec={self.lossy}"
            out += [f"{gist},algos=performance", f"vdnn-all:algos=performance,sync=event,codec={self.lossy}"]
        if not codec_offloads(costs):
            out = [spec for spec in out if not (spec.startswith("vdnn") and "codec=" in spec)]
        if self.offload == "off":
            out = [spec for spec in out if not spec.startswith("vdnn")]
        return out

    def admits(self, kind: str) -> bool:
        """Whether a way of storing a buffer (``"keep"``, ``"encode"``, ``"offload"``, ``"recompute"``) is one
        this policy may choose (``offload=off``: no offloads)."""
        return kind != "offload" or self.offload == "on"

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        if oracle is None:
            raise PlanError("auto decides by replaying candidate plans: use vmem.plan or a Trainer")
        if costs is None:
            raise PlanError(
                "auto ranks plans by predicted step time: plan on a simulated GPU, or give costs= (a profile of "
                "the device, as a Trainer makes)"
            )

        fitting, tried, floor = self._starts(program, device, costs, oracle)
        fast = get(FAST, split=self.split).decide(
            program, device, costs
        )  # where the exhaustive search and the descents start
        info = _Info(program, costs, fast)
        exact = exhaustive.search(self, program, device, oracle, fast, info)
        if exact is not None:
            tried += 1
            fitting.append((exact.step_seconds, EXHAUSTIVE, exact))
        gaps: list[float] = []
        for solver in ("greedy", "ilp") if self.solver == "ilp" else ("greedy",):
            for share in self.LINK_SHARES if self.offload == "on" else (0.0,):
                descended = descent.descend(self, program, device, oracle, fast, info, share, gaps, solver)
                tried += 1
                if descended is None:
                    break  # where the copies may take the most time it did not fit: with less, neither
                fitting.append((descended.step_seconds, DESCENT if solver == "greedy" else ILP_DESCENT, descended))
        if not fitting and self.offload == "on":  # the last resort: the floor with its signs on the host
            lean = get(LEANEST, split=self.split).decide(program, device, costs)
            result = oracle(lean)  # (the oracle places a plan with signs on the host thoroughly)
            tried += 1
            if result.fits and result.step_seconds is not None:
                fitting.append((result.step_seconds, LEANEST, result))
        if not fitting:
            if floor is not None:
                raise floor
            self._refuse(program, device, costs, oracle)
            raise DoesNotFit(
                f"{program.network} at batch {program.batch} fits in {format_bytes(device.memory)} under none of "
                f"auto's techniques ({', '.join(self.portfolio())}); use a larger memory budget"
                + (" or a smaller batch." if program.batch > 1 else ".")
            )
        fitting.sort(key=lambda f: f[0])
        start_seconds, start_spec, best = fitting[0]
        plan, notes, moves_kept = best.plan, {}, 0
        if self.trial_budget(program) and plan.allocation == Allocation.LAYER:
            plan, notes, moves_kept, best = improve.improve(self, program, device, costs, oracle, best, info)
        if plan.split:  # each split costs a step (a launch): kept only where the plan needs it to fit
            whole = oracle(dataclasses.replace(plan, split=()), unfit=False)
            if whole is not None and whole.step_seconds is not None and whole.step_seconds <= best.step_seconds:
                plan, best = whole.plan, whole
        if plan.signs:  # bits on the host cost a copy each way: kept only where the plan needs them to fit
            kept = oracle(dataclasses.replace(plan, signs=()), unfit=False)
            if kept is not None and kept.step_seconds is not None and kept.step_seconds <= best.step_seconds:
                plan, best = kept.plan, kept
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

    def _starts(
        self, program: Program, device: DeviceSpec, costs: "CostModel", oracle: "Oracle"
    ) -> tuple[list[tuple[float, str, Any]], int, BudgetTooSmall | None]:
        """The portfolio's plans that fit (predicted seconds, spec, replay), how many were replayed, and the
        first refusal met (its least budget, for auto's own)."""
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
                plan = decide(get(spec, split=self.split), program, device, costs, oracle)
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
        return fitting, tried, floor

    #: the refusal's least budget is found to this fraction of the leanest plan's peak
    LEAST_TOLERANCE: ClassVar[float] = 1e-3

    def _refuse(self, program: Program, device: DeviceSpec, costs: "CostModel | None", oracle: "Oracle") -> None:
        """Raise BudgetTooSmall with the least budget the leanest plan (every feature map offloaded, the
        leanest algorithms) fits in: to the byte, or on a graph of more than ``DYN_OPS`` ops (each try
        replays the whole step) to :attr:`LEAST_TOLERANCE`."""
        if self.offload == "off":  # the leanest of the plans that send nothing to the host
            leans = [get(s, split=self.split).decide(program, device, costs) for s in OFFLOAD_OFF_FLOORS]
            results = [oracle(p) for p in leans]
            result, lean = min(zip(results, leans), key=lambda r: r[0].peak_bytes)
        else:
            lean = get(LEANEST, split=self.split).decide(program, device, costs)
            result = oracle(lean)
        if result.fits:
            return
        tolerance = self.LEAST_TOLERANCE if len(program.ops) > self.DYN_OPS else 0.0
        least = least_memory(  # the oracle lowers the plan once; each capacity tried is one replay
            lambda memory: oracle(lean, memory, unfit=False) is not None,
            result.peak_bytes,
            tolerance=tolerance,
        )
        least = least if least is not None else 4 * result.peak_bytes
        leanest = (
            f"{lean.policy}: nothing offloaded"
            if self.offload == "off"
            else f"{LEANEST}: every feature map offloaded but the ReLUs' signs, memory-optimal algorithms"
        )
        raise BudgetTooSmall(
            f"{program.network} at batch {program.batch} fits in {format_bytes(device.memory)} under none of "
            f"auto's plans{' that send nothing to the host (offload=off)' if self.offload == 'off' else ''}; the "
            f"leanest ({leanest}) needs at least "
            f"{format_bytes(least)} ({least} bytes{f', to {tolerance:.1%}' if tolerance else ''}). Use a larger "
            "memory budget" + (" or a smaller batch." if program.batch > 1 else "."),
            least,
        )

    # -- exact, on small graphs ------------------------------------------------------------------------
    #: the most plans the exhaustive search replays (a graph with more combinations is not searched so)
    EXHAUSTIVE: ClassVar[int] = 2048

    def choices(self, program: Program, costs: "CostModel", plan: Plan, info: "_Info | None" = None) -> dict[str, list]:
        """Per stashed buffer, every way the descent and the exhaustive search may store it: kept (None)
        and each :class:`_Saving` that applies (``info``: the program read under ``plan``'s algorithms)."""
        info = info or _Info(program, costs, plan)
        out: dict[str, list[_Saving | None]] = {program.tensors[b].name: [None] for b in program.stashed_buffers()}
        for saving in savings(program, plan, info, None, live_only=False):
            if self.admits(saving.kind):
                out[saving.name].append(saving)
        return out

    # -- the descent -----------------------------------------------------------------------------------
    #: rounds of the descent (each one replay), and the margin each round aims below the budget
    DESCENT_ROUNDS: ClassVar[int] = 24
    MARGIN: ClassVar[float] = 0.02

    #: the descents' shares of the time before the peak the copies out may fill (0: no offloads): where the
    #: forward allocates where an offloaded buffer was before its copy ends, it waits for it
    LINK_SHARES: ClassVar[tuple[float, ...]] = (1.0, 0.5, 0.25, 0.0)


def _best(fitting: list[tuple[float, str, Any]], start: str) -> str:
    """The least predicted step among the fitting starts named ``start``, in ms ("none fits" if none)."""
    seconds = [t for t, s, _ in fitting if s == start]
    return f"{min(seconds) * 1e3:.2f} ms" if seconds else "none fits"

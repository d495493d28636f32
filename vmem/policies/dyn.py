"""vDNN's dynamic policy: profile, then pick the fastest configuration that fits the memory budget.

The procedure of Rhu et al. (2016), section III-C, with feasibility decided by replaying each candidate
plan through the pool (the planner's ``oracle``), never by trial training:

1. ``vdnn-all`` with memory-optimal algorithms must fit; if it does not, nothing will: PlanError with the
   least memory the network needs.
2. ``layerwise`` (vDNN's layer-wise allocation, nothing offloaded) with the fastest algorithms, if it fits.
3. ``vdnn-conv``, then ``vdnn-all``, with the fastest algorithms.
4. A greedy pass, under ``vdnn-conv`` then ``vdnn-all``: starting from the fastest algorithms, downgrade
   the layers that overflow (those during whose pass the replayed pool holds more than the budget, less
   room for fragmentation) toward less workspace, the pass with the most workspace first, one at a time,
   each verified by replay, until the plan fits; where no overflowing layer has a leaner algorithm left,
   the pass with the most workspace anywhere. (Where even every pass's leanest algorithm leaves more bytes
   in use at once than the budget, no downgrade can fit: one replay says so.)
5. ``vdnn-all`` with memory-optimal algorithms (step 1's plan).

The steps use vDNN's ``sync=layer``. With ``sync=auto`` (the default) the chosen plan is then replayed
with ``sync=event`` (a buffer released when its copy's event completes, not by a compute stream that
waits for it) and taken that way where it fits and is faster.

Then, beyond the paper, it chooses what to offload (``keep=auto``, the default; ``keep=none`` stops at
the procedure's plan): where the chosen plan offloads and its replay stalls, each offloaded buffer, the
largest first, is tried on the device instead (kept, not copied out and back), and kept where the plan
still fits and the step is faster by at least :attr:`VdnnDyn.KEEP_GAIN` of it. Where the copies of the
first layers' maps outrun their compute, a buffer kept is a copy fewer in the backlog that holds compute
back. The search runs while the stall is at least :attr:`VdnnDyn.KEEP_STALL` of the step, for at most
:attr:`VdnnDyn.KEEP_TRIALS` replays, and stops after :attr:`VdnnDyn.KEEP_PATIENCE` in a row that gained
nothing.

The plan records the step that chose it (``plan.step``), the configuration (``plan.chosen``) and why
(``plan.reason``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..device.spec import DeviceSpec
from ..errors import BudgetTooSmall, PlanError
from ..graph import PASSES, Program
from ..spec import with_options
from ..units import format_bytes
from .base import Policy, downgrade, get, option, register
from .plan import Plan, Stash
from ..graph.analysis import prefetch_points
from .vdnn import SYNC_MODES

if TYPE_CHECKING:
    from .base import Oracle
    from ..costs.model import CostModel

__all__ = ["VdnnDyn"]


@register
@dataclass(frozen=True)
class VdnnDyn(Policy):
    """``vdnn-dyn[:sync=auto|layer|event]``: the fastest of baseline, vdnn-conv and vdnn-all (with algorithm
    downgrades) that fits. Its ``algos`` option is not used: it chooses algorithms itself. ``sync=auto``
    (the default) follows the procedure with vDNN's ``sync=layer``, then takes the chosen plan with
    ``sync=event`` instead where replay says that fits and is faster; ``layer`` or ``event`` pins it.
    ``keep=auto`` (the default) then keeps on the device the offloaded buffers whose transfers cost more
    time than they save memory for (see the module docstring); ``keep=none`` offloads what the chosen
    static policy offloads."""

    name = "vdnn-dyn"
    needs_profile = True
    needs_budget = True
    floor = "vdnn-all:algos=memory"  # every map offloaded, the leanest algorithms: the least of its choices
    chooses_algos = True
    sync: str = "auto"
    max_trials: int = 200
    keep: str = option("auto")
    #: replays the keep search may spend, and how many in a row may gain nothing before it stops
    KEEP_TRIALS: ClassVar[int] = 32
    KEEP_PATIENCE: ClassVar[int] = 8
    #: the stall, as a fraction of the step, below which the keep search does not start (or stops): all
    #: it can save, and not worth the replays (each a whole step) or the memory kept
    KEEP_STALL: ClassVar[float] = 0.05
    #: the least fraction of the step a buffer kept must save (less is within the cost model's error)
    KEEP_GAIN: ClassVar[float] = 0.001

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sync not in SYNC_MODES + ("auto",):
            raise ValueError(f"policy {self.name!r}: sync={self.sync!r}; use one of auto, {', '.join(SYNC_MODES)}")
        if self.keep not in ("auto", "none"):
            raise ValueError(
                f"policy {self.name!r}: keep={self.keep!r}; use auto (keep offloaded buffers on the "
                "device where that is faster and still fits) or none"
            )

    @property
    def procedure_sync(self) -> str:
        """The sync mode the five steps use (``auto``: vDNN's)."""
        return "layer" if self.sync == "auto" else self.sync

    @property
    def spec(self) -> str:
        options = (
            [f"sync={self.sync}"]
            + ([f"max_trials={self.max_trials}"] if self.max_trials != 200 else [])
            + ([f"keep={self.keep}"] if self.keep != "auto" else [])
        )
        return f"{self.name}:{','.join(options)}"

    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        if oracle is None:
            raise PlanError("vdnn-dyn decides by replaying candidate plans: use vmem.plan or a Trainer")

        def candidate(name: str, algos: str) -> Any:
            spec = name if name in ("baseline", "layerwise") else f"{name}:sync={self.procedure_sync}"
            return oracle(get(spec, algos=algos, split=self.split).decide(program, device, costs))

        budget = format_bytes(device.memory)
        floor = candidate("vdnn-all", "memory")
        if not floor.fits:
            least = self._least_memory(floor.plan, floor.peak_bytes, oracle)
            raise BudgetTooSmall(
                f"{program.network} at batch {program.batch} needs at least {format_bytes(least)} ({least} bytes) "
                f"of device memory, with every feature map offloaded and memory-optimal algorithms; the device "
                f"has {budget}. Use a larger memory budget" + (" or a smaller batch." if program.batch > 1 else "."),
                least,
            )
        best = candidate("layerwise", "performance")
        if best.fits:
            return self._chose(
                program,
                best,
                2,
                f"layer-wise allocation with the fastest algorithms fits in {budget} without offloading",
            )
        for name in ("vdnn-conv", "vdnn-all"):
            plan = candidate(name, "performance")
            if plan.fits:
                return self._chose(
                    program,
                    plan,
                    3,
                    f"{name} with the fastest algorithms fits in {budget}; "
                    "layer-wise allocation without offloading does not",
                    oracle,
                )
        for name in ("vdnn-conv", "vdnn-all"):
            plan = self._greedy(program, device, costs, oracle, name)
            if plan is not None:
                downgraded = sum(
                    1
                    for op, per in plan.plan.algos.items()
                    for p in PASSES
                    if per.get(p) != self._fastest(program, costs).get(op, {}).get(p)
                )
                return self._chose(
                    program,
                    plan,
                    4,
                    f"{name} fits in {budget} once {downgraded} convolution passes use algorithms with less workspace",
                    oracle,
                )
        return self._chose(program, floor, 5, f"only vdnn-all with memory-optimal algorithms fits in {budget}", oracle)

    @staticmethod
    def _least_memory(floor: Plan, peak: int, oracle: "Oracle") -> int:
        """The smallest capacity, to the pool's alignment (256 bytes), at which ``floor`` fits: its peak
        plus what packing its blocks costs (see :func:`vmem.planning.least_memory`)."""
        from .budget import least_memory

        least = least_memory(lambda memory: oracle(floor, memory=memory).fits, peak, 256)
        return least if least is not None else 4 * peak

    # -- step 4 ------------------------------------------------------------------------------------
    def _fastest(self, program: Program, costs: "CostModel | None") -> dict[str, dict[str, str]]:
        return self.choose_algos(program, costs, algos="performance")

    def _greedy(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None", oracle: "Oracle", name: str
    ) -> Any:
        """Downgrade the overflowing layers' passes, one at a time, until the plan fits; the fitting
        candidate's figures (a PlanResult), or None (:func:`vmem.policies.base.downgrade`)."""
        base = get(f"{name}:sync={self.procedure_sync}", algos="performance", split=self.split).decide(
            program, device, costs
        )
        return downgrade(program, base, device, costs, oracle, self.max_trials)

    def _keep_resident(self, program: Program, candidate: Any, oracle: "Oracle") -> tuple[Any, str]:
        """``candidate`` with the offloaded buffers kept on the device where that fits and is faster (see the
        module docstring), and a clause for the reason ("" if none is kept)."""
        start = candidate
        plan = candidate.plan
        ids = {program.tensors[b].name: b for b in program.stashed_buffers()}
        order = sorted(
            (n for n, how in plan.stash.items() if how == "offload"), key=lambda n: (-program.tensors[ids[n]].nbytes, n)
        )
        kept: list[str] = []
        trials = idle = 0
        for name in order:
            if (
                trials >= self.KEEP_TRIALS
                or idle >= self.KEEP_PATIENCE
                or candidate.stall_seconds < self.KEEP_STALL * candidate.step_seconds
            ):
                break
            stash = dict(plan.stash, **{name: Stash.KEEP})
            offloaded = {ids[n] for n, how in stash.items() if how == "offload"}
            trial = replace(
                plan,
                stash=stash,
                prefetch=prefetch_points(program, offloaded),
                codecs={n: c for n, c in plan.codecs.items() if n != name},
            )
            result = oracle(trial)
            trials += 1
            if result.fits and result.step_seconds < candidate.step_seconds * (1 - self.KEEP_GAIN):
                candidate, plan, idle = result, trial, 0
                kept.append(name)
            else:
                idle += 1
        if not kept:
            return start, ""
        nbytes = sum(program.tensors[ids[n]].nbytes for n in kept)
        return candidate, (
            f"; keeping {len(kept)} of its {len(order)} offloaded buffers on the device "
            f"({format_bytes(nbytes)}: {', '.join(kept)}) still fits and takes "
            f"{candidate.step_seconds:.3f} s instead of {start.step_seconds:.3f} s"
        )

    def _chose(self, program: Program, candidate: Any, step: int, reason: str, oracle: "Oracle | None" = None) -> Plan:
        if (
            oracle is not None
            and self.sync == "auto"
            and candidate.plan.sync == "layer"
            and candidate.step_seconds is not None
        ):  # without a cost model there is no faster
            plan = candidate.plan
            event = oracle(replace(plan, sync="event", policy=with_options(plan.policy, sync="event")))
            if event.fits and event.step_seconds < candidate.step_seconds:
                reason += (
                    f"; releasing on the copies' events (sync=event) also fits and takes "
                    f"{event.step_seconds:.3f} s instead of {candidate.step_seconds:.3f} s"
                )
                candidate = event
        chosen = candidate.plan.policy
        if oracle is not None and self.keep == "auto" and candidate.step_seconds is not None:
            candidate, kept = self._keep_resident(program, candidate, oracle)
            if kept:
                reason += kept
        return replace(
            candidate.plan,
            policy=self.spec,
            chosen=chosen,
            step=step,
            reason=f"vdnn-dyn step {step}: {reason} (chose {chosen})",
        )

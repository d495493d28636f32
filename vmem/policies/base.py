"""Policies are frozen, validated decisions: they read a Program and a device spec and return a Plan.

A policy never touches streams, pools or data. Every policy is named by a spec string,
``"name:key=value,key=value"`` (``"baseline:algos=memory"``), accepted wherever ``policy=`` is: by
:func:`vmem.plan`, :class:`vmem.Trainer` and the command line.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..device.spec import DeviceSpec
from ..spec import parse_spec
from ..graph import Program
from ..graph.analysis import needs_grad
from .plan import Allocation, Plan

if TYPE_CHECKING:
    from ..costs.model import CostModel

__all__ = ["Policy", "parse_spec", "register", "get", "names", "option", "decide", "downgrade", "fit_algorithms"]

ALGOS = ("fit", "memory", "performance")
_REGISTRY: dict[str, type["Policy"]] = {}


def option(default: Any) -> Any:
    """A policy field left out of its spec string while it has its default value."""
    return dataclasses.field(default=default, metadata={"elide_default": True})


def register(cls: type["Policy"]) -> type["Policy"]:
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    """Names of every policy."""
    return sorted(_REGISTRY)


def get(spec: "str | Policy", **overrides: Any) -> "Policy":
    """A validated policy from a spec string (or a Policy, optionally with fields overridden)."""
    if isinstance(spec, Policy):
        return dataclasses.replace(spec, **overrides) if overrides else spec
    name, options = parse_spec(spec)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; available: {', '.join(names())}")
    options.update(overrides)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(
            f"policy {name!r} has no option {', '.join(map(repr, unknown))}; its options are "
            f"{', '.join(sorted(fields)) or 'none'}"
        )
    return cls(**options)


def decide(
    policy: "Policy",
    program: Program,
    device: DeviceSpec,
    costs: "CostModel | None" = None,
    oracle: "Oracle | None" = None,
) -> Plan:
    """``policy.decide(program, device, costs, oracle)``; where the policy is :attr:`~Policy.budget_free` and
    the oracle keeps what is the same at every capacity (``oracle.once``: the planner's, whose oracles of a
    curve's budgets share it), decided once per choice of algorithms at that capacity, the plan's header
    given this capacity."""
    once = getattr(oracle, "once", None)  # an oracle of the Protocol alone (a test's) keeps nothing
    if once is None or not policy.budget_free:
        return policy.decide(program, device, costs, oracle)
    algos = policy.choose_algos(program, costs, capacity=device.memory)  # what new_plan picks at this capacity
    key = ("decide", policy.spec, tuple(sorted((op, tuple(sorted(per.items()))) for op, per in algos.items())))
    plan = once(key, lambda: policy.decide(program, device, costs, oracle))
    return plan if plan.capacity == device.memory else dataclasses.replace(plan, capacity=device.memory)


def split_convolutions(program: Program) -> tuple[str, ...]:
    """The convolutions whose backward a split (``Plan.split``) can run as two steps: those whose input needs
    a gradient (the lowering frees the input between them only where nothing later reads it)."""
    needs = needs_grad(program)
    return tuple(op.name for op in program.ops if op.kind == "conv" and needs[op.inputs[0]])


class Oracle(Protocol):
    """What a policy that searches asks about a candidate plan (the planner's
    :class:`vmem.planning.Oracle`): ``candidate`` lowered and replayed at ``memory`` (the device's where not
    given); its figures (``.fits``, ``.peak_bytes``, ``.step_seconds``, ...), or with ``unfit=False`` None
    where it does not fit."""

    def __call__(
        self, candidate: Plan, memory: int | None = None, packing: str = "auto", unfit: bool = True
    ) -> Any: ...


@dataclass(frozen=True)
class Policy(ABC):
    """Base of every policy. ``algos``: convolution algorithms, ``"fit"`` (the default: the fastest with
    which the plan fits the device, see :func:`fit_algorithms`), ``"memory"`` (least workspace) or
    ``"performance"`` (fastest). ``split``: ``"on"`` runs each convolution's backward as two steps,
    backward-filter then backward-data, the input freed between them where nothing later reads it
    (``Plan.split``: lossless, and free on cuDNN, whose passes are separate calls already); ``"off"`` (the
    named policies' default: the papers' one backward step). ``microbatch``: ``"on"`` lets the planner run a
    step that does not fit as micro-batches of the batch, one after the other, their weight gradients
    added (only for networks whose every layer treats each sample on its own: no batch norm); ``"off"``
    (the named policies' default)."""

    name: ClassVar[str] = "policy"
    #: whether the policy decides by measured time, so a Trainer profiles the device before planning
    needs_profile: ClassVar[bool] = False
    #: whether the policy chooses its convolution algorithms itself (its ``algos`` option is not used)
    chooses_algos: ClassVar[bool] = False
    #: whether the policy is made for a budget below what the baseline needs (``vmem train`` then gives it one
    #: by default: ``--memory auto``)
    needs_budget: ClassVar[bool] = False
    #: where the policy chooses among others: the spec of the one whose plan is the least it can need (its
    #: smallest budget, a refusal's remedy); None: itself
    floor: ClassVar[str | None] = None
    #: whether its decisions are the same at every capacity but for what :meth:`new_plan` reads of it (the
    #: capacity in the header, the algorithms that fit it): a planner weighing one program at many
    #: capacities (a curve's budgets) then decides it once per choice of algorithms (:func:`decide`)
    budget_free: ClassVar[bool] = False
    algos: str = "fit"
    split: str = option("off")
    microbatch: str = option("off")

    def __post_init__(self) -> None:
        if self.algos not in ALGOS:
            raise ValueError(f"policy {self.name!r}: algos={self.algos!r}; use one of {', '.join(ALGOS)}")
        for switch in ("split", "microbatch"):
            value = getattr(self, switch)
            if isinstance(value, bool):  # a spec string's on/off reads as a bool
                object.__setattr__(self, switch, "on" if value else "off")
            if getattr(self, switch) not in ("on", "off"):
                raise ValueError(f"policy {self.name!r}: {switch}={value!r}; use on or off")

    @property
    def spec(self) -> str:
        """The spec string that rebuilds this policy."""
        options = ",".join(
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if not (f.metadata.get("elide_default") and getattr(self, f.name) == f.default)
        )
        return f"{self.name}:{options}" if options else self.name

    @abstractmethod
    def decide(
        self, program: Program, device: DeviceSpec, costs: "CostModel | None" = None, oracle: "Oracle | None" = None
    ) -> Plan:
        """Return the Plan for ``program`` on ``device`` (pure: no pool, no stream, no data).

        ``costs`` (a :class:`vmem.costs.CostModel`, or None) ranks algorithms by time; ``oracle(plan)``,
        supplied by the planner, replays a candidate plan and returns its figures (a PlanResult: ``.fits``,
        ``.peak_bytes``, ...; only policies that search, such as vdnn-dyn, use it)."""

    def new_plan(
        self,
        program: Program,
        device: DeviceSpec,
        costs: "CostModel | None" = None,
        *,
        allocation: str = Allocation.LAYER,
        **decided: Any,
    ) -> Plan:
        """A plan of this policy for ``program`` on ``device``: the header every policy's plan has (the policy,
        network, batch, device and capacity, ``allocation``, the algorithms :meth:`choose_algos` picks under
        ``costs``), with the policy's own ``decided`` fields (``stash``, ``reason``, ...)."""
        return Plan(
            policy=self.spec,
            network=program.network,
            batch=program.batch,
            device=device.name,
            capacity=device.memory,
            allocation=allocation,
            algos=self.choose_algos(program, costs, capacity=device.memory),
            split=split_convolutions(program) if self.split == "on" else (),
            **decided,
        )

    def choose_algos(
        self, program: Program, costs: "CostModel | None" = None, algos: str | None = None, capacity: int | None = None
    ) -> dict[str, dict[str, str]]:
        """Per op with a choice of algorithms: the one per pass that ``algos`` (default: this policy's)
        asks for. ``memory``: least workspace (ties: the faster). ``performance`` (and ``fit``, which the
        planner then downgrades where the plan does not fit: :func:`fit_algorithms`): the fastest by
        ``costs`` when given, else the catalog's first, among the algorithms whose single-layer footprint
        (the layer's inputs, output, weights and the workspace) fits ``capacity``: what cuDNN's own search
        on that device could return (the least-workspace algorithm if none fits)."""
        which = algos or self.algos
        chosen: dict[str, dict[str, str]] = {}
        for op in program.ops:
            if not op.algorithms:
                continue
            per_pass = {}
            room = None if capacity is None else capacity - layer_bytes(program, op)
            for pass_, candidates in op.algorithms.items():

                def speed(a: str) -> float:
                    return costs.op_seconds(op, pass_, a) if costs is not None else candidates.index(a)

                lean = min(candidates, key=lambda a: (op.workspace[pass_][a], speed(a)))
                if which in ("performance", "fit"):
                    fitting = [a for a in candidates if room is None or op.workspace[pass_][a] <= room] or [lean]
                    per_pass[pass_] = min(fitting, key=lambda a: (speed(a), op.workspace[pass_][a]))
                else:
                    per_pass[pass_] = lean
            chosen[op.name] = per_pass
        return chosen


def layer_bytes(program: Program, op: Any) -> int:
    """Bytes one layer touches besides its workspace: its inputs, its output and its weights."""
    ins = sum(program.tensors[t].nbytes for t in op.inputs)
    weights = sum(math.prod(s.shape) for s in op.params.values()) * program.precision.itemsize("parameters")
    return ins + program.tensors[op.output].nbytes + weights


def downgrade(
    program: Program, plan: Plan, device: DeviceSpec, costs: "CostModel | None", oracle: "Oracle", max_trials: int = 200
) -> Any:
    """vDNN-dyn's greedy pass over ``plan``'s algorithms: while its replay does not fit, the pass with the
    most workspace among the layers that overflow (during whose pass the pool holds more than the
    budget, less room for fragmentation; where none has a leaner algorithm left, among all layers) takes
    its fastest leaner algorithm, one at a time, each verified by ``oracle``. The fitting candidate's
    figures (a PlanResult), or None where none fits within ``max_trials`` replays (at once where the plan
    with every pass at its leanest holds more bytes at once than the device has: then none can fit)."""
    algos = {op: dict(per) for op, per in plan.algos.items()}
    ops = {op.name: op for op in program.ops if op.algorithms and op.name in algos}
    limit = device.memory - max(1 << 20, device.memory // 64)  # room for fragmentation

    def speed(op: Any, pass_: str, a: str) -> float:
        return costs.op_seconds(op, pass_, a) if costs is not None else op.algorithms[pass_].index(a)

    def downgrades(names: Any) -> list[tuple[int, str, str, str]]:
        """(workspace, op, pass, the fastest leaner algorithm) of every pass that has a leaner one."""
        out = []
        for op_name in names:
            op = ops[op_name]
            for pass_, now in algos[op_name].items():
                ws = op.workspace[pass_][now]
                leaner = [a for a in op.algorithms[pass_] if op.workspace[pass_][a] < ws]
                if leaner:
                    best = min(leaner, key=lambda a: (speed(op, pass_, a), op.workspace[pass_][a]))
                    out.append((ws, op_name, pass_, best))
        return out

    result = oracle(plan)
    if not result.fits:
        # every pass at its leanest: where even that holds more at once than the device has, no downgrade
        # fits (a leaner algorithm only shrinks its pass's workspace): one replay, not one per pass
        leanest = {
            name: {p: min(ops[name].algorithms[p], key=lambda a: ops[name].workspace[p][a]) for p in per}
            for name, per in algos.items()
            if name in ops
        }
        lean = oracle(dataclasses.replace(plan, algos={**plan.algos, **leanest}))
        if not lean.fits and lean.peak_bytes > device.memory:
            return None
    for _ in range(max_trials):
        if result.fits:
            return result
        over = [n for n, peak in result.layer_peaks.items() if n in ops and peak > limit]
        options = downgrades(over) or downgrades(ops)
        if not options:
            return None
        _, op_name, pass_, algo = max(options)
        algos[op_name][pass_] = algo
        plan = dataclasses.replace(plan, algos={op: dict(per) for op, per in algos.items()})
        result = oracle(plan)
    return result if result.fits else None


def fit_algorithms(
    policy: "Policy", program: Program, device: DeviceSpec, costs: "CostModel | None", oracle: "Oracle", plan: Plan
) -> Plan:
    """``plan`` (made by ``policy`` with the fastest algorithms) with the fastest algorithms that fit the
    device, where ``policy.algos`` is ``"fit"``: as it is where it fits (or without an ``oracle`` to
    replay it); else downgraded pass by pass (:func:`downgrade`); else, where nothing fits, with the
    least-workspace algorithms (the least the policy can need)."""
    if policy.algos != "fit" or policy.chooses_algos or oracle is None or not plan.algos:
        return plan
    lean = policy.choose_algos(program, costs, algos="memory")
    if lean == plan.algos:  # the fastest are the leanest: nothing to downgrade, no replay needed
        return plan
    fitted = downgrade(program, plan, device, costs, oracle)
    if fitted is None:
        return dataclasses.replace(
            plan, algos=lean, reason=f"{plan.reason}; the least-workspace algorithms (no faster ones fit)".lstrip("; ")
        )
    if fitted.plan.algos == plan.algos:
        return plan
    changed = sum(1 for op, per in plan.algos.items() for p, a in per.items() if fitted.plan.algos[op][p] != a)
    return dataclasses.replace(
        fitted.plan,
        reason=f"{plan.reason}; {changed} convolution passes use leaner algorithms to fit".lstrip("; "),
    )

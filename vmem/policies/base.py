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
from typing import Any, ClassVar

from ..device.spec import DeviceSpec
from ..spec import parse_spec
from ..graph import Program
from .plan import Plan

__all__ = ["Policy", "parse_spec", "register", "get", "names", "option"]

ALGOS = ("memory", "performance")
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


@dataclass(frozen=True)
class Policy(ABC):
    """Base of every policy. ``algos``: convolution algorithms, ``"memory"`` (least workspace) or
    ``"performance"`` (fastest)."""

    name: ClassVar[str] = "policy"
    #: whether the policy decides by measured time, so a Trainer profiles the device before planning
    needs_profile: ClassVar[bool] = False
    algos: str = "memory"

    def __post_init__(self) -> None:
        if self.algos not in ALGOS:
            raise ValueError(f"policy {self.name!r}: algos={self.algos!r}; use one of {', '.join(ALGOS)}")

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
    def decide(self, program: Program, device: DeviceSpec, costs: Any = None, oracle: Any = None) -> Plan:
        """Return the Plan for ``program`` on ``device`` (pure: no pool, no stream, no data).

        ``costs`` (a :class:`vmem.costs.CostModel`, or None) ranks algorithms by time; ``oracle(plan)``,
        supplied by the planner, replays a candidate plan and returns its figures (a PlanResult: ``.fits``,
        ``.peak_bytes``, ...; only policies that search, such as vdnn-dyn, use it)."""

    def choose_algos(
        self, program: Program, costs: Any = None, algos: str | None = None, capacity: int | None = None
    ) -> dict[str, dict[str, str]]:
        """Per op with a choice of algorithms: the one per pass that ``algos`` (default: this policy's)
        asks for. ``memory``: least workspace (ties: the faster). ``performance``: the fastest by
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
                if which == "performance":
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

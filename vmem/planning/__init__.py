"""Planning: ``vmem.plan`` and what it is made of.

A plan is made for a :class:`Target` (a device's spec, pool alignment and convolution catalog, read once from a
Device, a DeviceSpec or a name): a policy decides (asking an :class:`Oracle` about candidates where it searches),
the decisions are lowered to a Schedule and replayed on a simulated device of the target's capacity
(:mod:`.result`: the same pool code the executor uses, so the peak includes alignment and fragmentation
exactly; with a cost model the replay also predicts step time, stalls and the time-weighted average). On top:
budgets (:mod:`.budget`: the smallest memory a policy trains in, the largest batch), reports (:mod:`.report`).
"""

from ..policies.budget import least_memory
from . import advice, profiles
from .budget import fraction_budget, largest_batch, smallest_memory
from .curve import Curve, CurvePoint, curve
from .oracle import Oracle
from .network import PlannedStep, plan, plan_step
from .plan import floor_policy, needs_budget, plan_program, rank_plan
from .report import layer_table, paper_accounting
from .result import UNBOUNDED, PlanResult, Problem, evaluate, replay_fitting, replay_if_fits, validate
from .target import Target

__all__ = [
    "advice",
    "profiles",
    "plan",
    "plan_step",
    "PlannedStep",
    "largest_batch",
    "curve",
    "Curve",
    "CurvePoint",
    "plan_program",
    "rank_plan",
    "evaluate",
    "replay_fitting",
    "replay_if_fits",
    "floor_policy",
    "needs_budget",
    "least_memory",
    "smallest_memory",
    "fraction_budget",
    "Target",
    "Oracle",
    "UNBOUNDED",
    "PlanResult",
    "Problem",
    "validate",
    "layer_table",
    "paper_accounting",
]

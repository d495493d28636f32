"""vmem.planning.validate: what is wrong with a plan, reported, never raised."""

from __future__ import annotations

import dataclasses

import vmem
from vmem import policies
from vmem.device.specs import get as get_spec
from vmem.planning import Problem, validate


def _setup():
    program = vmem.models.get("vgg_cifar", image_size=16).build(8)
    spec = get_spec("titan-x")
    return program, spec


def test_a_plan_that_runs_and_fits_has_no_problem():
    program, spec = _setup()
    plan = policies.get("vdnn-all").decide(program, spec, None)
    assert validate(program, plan) == [] and validate(program, plan, spec) == []


def test_a_plan_that_needs_what_it_drops_is_invalid_and_says_why():
    program, spec = _setup()
    plan = policies.get("layerwise").decide(program, spec, None)
    first = program.tensors[program.input].name
    bad = dataclasses.replace(plan, stash={**plan.stash, first: "recompute"})
    (problem,) = validate(program, bad, spec)
    assert problem.kind == "invalid" and first in problem.message


def test_a_plan_that_does_not_fit_says_its_peak_and_the_capacity():
    program, spec = _setup()
    small = dataclasses.replace(spec, memory=1 << 20)
    plan = policies.get("baseline").decide(program, small, None)
    problems = validate(program, plan, small)
    assert problems == [Problem("does not fit", problems[0].message)]
    assert "1.00 MiB" in problems[0].message


def test_policies_say_whether_they_are_made_for_a_budget_and_what_their_least_plan_is():
    """Traits, not tests of names: vdnn-dyn and auto want a budget (``vmem train`` gives them half the
    baseline's by default) and choose among others, so their least plan is vdnn-all's with the leanest
    algorithms; every other policy's least plan is its own."""
    from vmem.planning import floor_policy

    for name in vmem.policies.names():
        pol = vmem.policies.get(name)
        chooses = name in ("vdnn-dyn", "auto")
        assert pol.needs_budget is chooses and (pol.floor is not None) is chooses, name
        floor = floor_policy(name)
        leanest = {
            "vdnn-dyn": "vdnn-all:algos=memory",
            "auto": "vdnn-all:algos=memory,relu=bits,prefetch=after,signs=host,split=on",
        }
        want = vmem.policies.get(leanest[name]) if chooses else vmem.policies.get(name, algos="memory")
        assert floor.spec == want.spec, name

"""What a curve's budgets share (:class:`vmem.planning.oracle.Replays`): a placement's replay is the same at every
capacity that holds its top, so a plan asked again at another budget is neither lowered nor replayed, and
the curve equals its budgets planned one by one, bit for bit."""

from __future__ import annotations

import dataclasses

import pytest

import vmem
from vmem import policies
from vmem.device.sim import SimDevice
from vmem.planning.oracle import Oracle, Replays
from vmem.planning.result import UNBOUNDED, replay_if_fits
from vmem.planning.target import Target
from vmem.schedule.lower import lower
from vmem.schedule.replay import replay

POLICIES = ("baseline", "vdnn-all:sync=event", "vdnn-conv:codec=zvc", "echo", "gist", "chen")


@pytest.mark.parametrize("model", ["vgg_cifar", "resnet_cifar"])
def test_a_placements_replay_is_the_same_at_every_capacity_holding_its_top(model):
    target = Target.of("sim:h100-sxm")
    program = target.view(vmem.models.get(model).build(32))
    costs = target.costs()
    for spec in POLICIES:
        plan = policies.get(spec).decide(program, target.spec, costs)
        loose = lower(program, plan, ("momentum",), 256, "auto", UNBOUNDED)
        top = loose.placed_top
        assert top is not None and loose.live_bytes is not None and loose.live_bytes <= top
        unbounded = replay(loose, SimDevice(dataclasses.replace(target.spec, memory=UNBOUNDED)), costs)
        for capacity in (top, top + 4096, 3 * top):
            got = replay_if_fits(loose, dataclasses.replace(target.spec, memory=capacity), 256, costs)
            assert got == unbounded, (spec, capacity)
        assert replay_if_fits(loose, dataclasses.replace(target.spec, memory=loose.live_bytes - 256), 256) is None


def test_an_oracle_sharing_replays_answers_as_one_that_does_not():
    """At capacities above, at and below each plan's top and live bytes, fitting or not, asked in any order."""
    target = Target.of("sim:h100-sxm")
    program = target.view(vmem.models.get("vgg_cifar").build(32))
    costs = target.costs()
    replays = Replays()
    shared = Oracle(program, target.spec, costs=costs, replays=replays)
    for spec in POLICIES:
        plan = policies.get(spec).decide(program, target.spec, costs)
        peak = Oracle(program, target.spec, costs=costs)(plan, memory=UNBOUNDED).peak_bytes
        for memory in (UNBOUNDED, peak * 2, peak, peak - 256, peak * 3 // 4, peak // 3, peak):
            for unfit in (True, False):
                fresh = Oracle(program, target.spec, costs=costs)(plan, memory, unfit=unfit)
                got = shared(plan, memory, unfit=unfit)
                assert (got is None) == (fresh is None), (spec, memory, unfit)
                if got is not None:
                    assert got.figures == fresh.figures, (spec, memory, unfit)
    assert replays.hits > 0 and replays.misses > 0


def test_a_curve_equals_its_budgets_planned_one_by_one():
    """Every point of the curve (planned with shared replays and decisions) is the plan ``vmem.plan`` makes at
    its budget alone: the same peak, predicted time and techniques; the named policies' points too."""
    net = vmem.models.get("vgg_cifar")
    c = vmem.curve(net, 32, "sim:h100-sxm", points=8, most=10)
    for p in c.points:
        alone = vmem.plan(net, 32, "sim:h100-sxm", "auto", memory=p.budget, oversubscribe=True)
        assert (alone.peak_bytes, alone.step_seconds, alone.plan.chosen) == (
            p.memory,
            p.step_seconds,
            p.techniques["chosen"],
        )
    for p in c.named:
        alone = vmem.plan(net, 32, "sim:h100-sxm", p.policy, memory=p.budget, oversubscribe=True)
        assert (alone.peak_bytes, alone.step_seconds) == (p.memory, p.step_seconds), p.policy


def test_a_budget_free_policy_is_decided_once_per_choice_of_algorithms():
    target = Target.of("sim:h100-sxm")
    program = target.view(vmem.models.get("vgg_cifar").build(32))
    costs = target.costs()
    replays = Replays()
    echo = policies.get("echo:algos=performance")
    calls = []
    decide = type(echo).decide

    def counted(self, *args, **kwargs):
        calls.append(1)
        return decide(self, *args, **kwargs)

    type(echo).decide = counted
    try:
        plans = []
        for memory in (1 << 34, 1 << 33, 1 << 32):
            spec = dataclasses.replace(target.spec, memory=memory)
            oracle = Oracle(program, spec, costs=costs, replays=replays)
            plans.append(policies.base.decide(echo, program, spec, costs, oracle))
    finally:
        type(echo).decide = decide
    assert len(calls) == 1
    assert [p.capacity for p in plans] == [1 << 34, 1 << 33, 1 << 32]
    spec = dataclasses.replace(target.spec, memory=1 << 32)
    alone = echo.decide(program, spec, costs, Oracle(program, spec, costs=costs))
    assert plans[-1].decisions() == alone.decisions() and plans[-1] == alone
    assert not policies.get("vdnn-dyn").budget_free and not policies.get("auto").budget_free

"""The planner's oracle (what a policy that replays candidates is given): figures as ``evaluate`` gives
them, None for a plan that does not fit where the policy asks for no figures of those, and a plan asked
again at another capacity replayed, not lowered again, unless its placement was the quick one."""

from __future__ import annotations

import dataclasses

import vmem
from vmem.planning import UNBOUNDED, evaluate

SIM = "sim:v100-16gb"


class Probe(vmem.policies.Policy):
    """Asks the oracle about a fixed policy's plan at the capacities given, keeps the answers, and returns
    the plan."""

    name = "probe"

    def __init__(self, inner, asks):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "asks", asks)
        object.__setattr__(self, "answers", [])

    def decide(self, program, device, costs=None, oracle=None):
        plan = vmem.policies.get(self.inner).decide(program, device, costs)
        for memory, unfit in self.asks:
            self.answers.append((program, device, costs, oracle(plan, memory, unfit=unfit)))
        return plan


def test_the_oracle_answers_as_evaluate_and_none_where_no_figures_are_wanted():
    net = vmem.models.get("resnet_cifar", depth=8)
    peak = vmem.plan(net, 64, SIM, "vdnn-all", memory="1TiB", oversubscribe=True).peak_bytes
    asks = [(peak // 2, False), (peak // 2, True), (4 * peak, False), (peak // 2, False), (4 * peak, True)]
    probe = Probe("vdnn-all", asks)
    vmem.plan(net, 64, SIM, probe, memory=4 * peak)
    (program, device, costs, small), (_, _, _, unfit), (_, _, _, big), (_, _, _, again), (_, _, _, last) = probe.answers
    plan = big.plan
    assert small is None and again is None, "below its live bytes no placement fits: no figures asked, none made"
    assert not unfit.fits and unfit.peak_bytes == peak  # asked for them: the replay without a capacity
    for answer, memory in ((big, 4 * peak), (last, 4 * peak)):
        expected = evaluate(program, dataclasses.replace(device, memory=memory), plan, costs=costs, rows=False)[0]
        assert answer.fits and answer.figures == expected.figures
    # the placement made for a small capacity is the sweeps' (nothing fits it); at one that holds the live
    # bytes the plan is placed again as the planner places it: the same figures as a fresh evaluation
    unbounded = evaluate(program, dataclasses.replace(device, memory=UNBOUNDED), plan, costs=costs)[0]
    assert unbounded.peak_bytes == peak


def test_two_plans_with_the_same_decisions_are_one_plan_to_the_lowering():
    program = vmem.models.get("transformer", layers=1, seq_len=8, dim=32, heads=2, ffn=64, vocab=50).build(2)
    device = vmem.device(SIM).spec
    conv = vmem.policies.get("vdnn-conv:algos=performance").decide(program, device)
    layerwise = vmem.policies.get("layerwise:algos=performance").decide(program, device)
    assert conv.policy != layerwise.policy
    assert conv.decisions() == layerwise.decisions(), "no convolution: vdnn-conv offloads nothing"
    offloading = vmem.policies.get("vdnn-all:sync=layer").decide(program, device)
    assert offloading.decisions() != dataclasses.replace(offloading, sync="event").decisions()
    assert layerwise.decisions() == dataclasses.replace(layerwise, sync="event", reason="why").decisions()
    assert hash(offloading.decisions()) == hash(dataclasses.replace(offloading, notes={"a": "b"}).decisions())

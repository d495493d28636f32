"""``auto``: the fastest plan that fits over every technique, never slower than a named policy, lossless."""

from __future__ import annotations

import re

import numpy as np
import pytest

import vmem
from vmem.errors import BudgetTooSmall, PlanError
from vmem.policies.auto import DESCENT, EXHAUSTIVE, NAMED, PORTFOLIO, Auto
from vmem.policies.plan import Stash
from tests.lossless import weights_under

SIM = "sim:v100-16gb"


AUTO = "auto:trials=24"  # fewer replays than the default: the same search, cut short


@pytest.fixture(scope="module")
def resnet():
    net = vmem.models.get("resnet_cifar", depth=20)
    return net, vmem.plan(net, 128, SIM, "layerwise:algos=memory", memory="1TiB", oversubscribe=True).peak_bytes


def _named_times(net, memory):
    """The predicted step of each named policy of auto's portfolio that fits ``memory``."""
    named = []
    for spec in NAMED:
        try:
            r = vmem.plan(net, 128, SIM, spec, memory=memory)
        except PlanError:
            continue
        if r.fits:
            named.append(r.step_seconds)
    return named


@pytest.mark.parametrize("fraction", [0.45, 0.8])
def test_auto_fits_wherever_a_named_policy_does_and_is_never_slower(resnet, fraction):
    net, peak = resnet
    memory = int(peak * fraction)
    named = _named_times(net, memory)
    assert named, "the budget should leave some named policy fitting"
    auto = vmem.plan(net, 128, SIM, AUTO, memory=memory)
    assert auto.fits and auto.peak_bytes <= memory
    assert auto.step_seconds <= min(named) * (1 + 1e-12)
    assert auto.plan.chosen in (*PORTFOLIO, DESCENT) and auto.reason.startswith("auto: ")


def test_the_descent_mixes_techniques_and_beats_every_named_policy_where_none_is_right(resnet):
    """At half the layer-wise peak no named policy is near the fastest plan: the descent from it (the
    cheapest seconds per byte saved at the replayed peak) mixes recomputation with encodings or offloads."""
    net, peak = resnet
    memory = int(peak * 0.5)
    named = _named_times(net, memory)
    auto = vmem.plan(net, 128, SIM, AUTO, memory=memory)
    assert auto.plan.chosen == DESCENT and auto.fits
    assert auto.step_seconds < min(named) * 0.99
    kinds = {str(d) for d in auto.plan.stash.values()}
    assert "recompute" in kinds and len(kinds - {"keep"}) >= 2, kinds


class Fixed(vmem.policies.Policy):
    """A policy that returns a plan given to it (the replay of a plan as it is)."""

    name = "fixed"

    def __init__(self, plan):
        object.__setattr__(self, "plan", plan)

    def decide(self, program, device, costs=None, oracle=None):
        return self.plan


def test_the_descent_holds_an_offloaded_block_until_its_copy_is_expected_to_end(resnet):
    """Released right after its last reader, an offloaded block's memory is reused while its copy still
    runs, and the forward waits for the copy; the descent's plans name a later release (Plan.release)."""
    import dataclasses

    net, peak = resnet
    memory = int(peak * 0.6)
    auto = vmem.plan(net, 128, SIM, AUTO, memory=memory)
    offloaded = {n for n, d in auto.plan.stash.items() if d == "offload"}
    assert auto.plan.release and set(auto.plan.release) <= offloaded
    eager = vmem.plan(net, 128, SIM, Fixed(dataclasses.replace(auto.plan, release={})), memory=memory)
    assert auto.stall_seconds < 0.2 * eager.stall_seconds and auto.step_seconds < 0.95 * eager.step_seconds


def test_the_moves_auto_keeps_are_explained_per_buffer_or_pass(resnet):
    net, peak = resnet
    auto = vmem.plan(net, 128, SIM, AUTO, memory=int(peak * 0.6))
    moved = {k: v for k, v in auto.plan.notes.items() if "saved" in v or "saves" in v}
    improved = "improved by" in auto.reason
    assert improved and improved == bool(moved)
    for what, note in moved.items():
        assert "instead of" in note or "through zvc" in note, (what, note)


def test_auto_on_the_cpu_device_is_lossless_and_runs_at_its_planned_peak():
    """Against baseline with the same convolution algorithms (each algorithm rounds its own way)."""
    import dataclasses

    x = np.random.default_rng(0).standard_normal((32, 1, 16, 16)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 10, 32)
    make = lambda: vmem.models.get("digits_vgg")  # noqa: E731
    need = vmem.plan(make(), 32, "cpu", "baseline").peak_bytes
    net, dev = make(), vmem.device("cpu", memory=need // 2, poison=True)
    try:
        with vmem.Trainer(net, device=dev, policy="auto", seed=0) as t:
            for _ in range(3):
                report = t.step(x, y)
                assert np.isfinite(report.loss) and report.peak_bytes == t.plans[32].peak_bytes
            chosen = t.plans[32].plan
    finally:
        dev.close()
    assert any(d != "keep" for d in chosen.stash.values())  # half the baseline's need: it had to do something

    class SameAlgos(vmem.policies.Policy):
        name = "baseline-with-auto-algos"

        def decide(self, program, device, costs=None, oracle=None):
            plan = vmem.policies.get("baseline").decide(program, device, costs)
            return dataclasses.replace(plan, algos=chosen.algos)

    base = next(iter(weights_under(make, (SameAlgos(),), x, y, memory=2 * need).values()))
    assert all(np.array_equal(base[k], net.params[k]) for k in base)


def test_auto_needs_a_cost_model_and_names_its_options():
    net = vmem.models.get("digits_cnn")
    with pytest.raises(PlanError, match="auto ranks plans by predicted step time"):
        vmem.plan(net, 8, "cpu", "auto", memory="64MiB")
    with pytest.raises(ValueError, match="lossy='fp9'"):
        vmem.policies.get("auto:lossy=fp9")
    with pytest.raises(ValueError, match="trials=-1"):
        vmem.policies.get("auto:trials=-1")
    assert vmem.policies.get("auto:lossy=fp8").portfolio()[-1].endswith("codec=fp8")


def test_a_budget_nothing_fits_is_refused_with_the_least_memory(resnet):
    net, peak = resnet
    with pytest.raises(BudgetTooSmall) as info:  # whole batches (as micro-batches, batch norm's included, it fits)
        vmem.plan(net, 128, SIM, f"{AUTO},microbatch=off", memory=int(peak * 0.05))
    least = info.value.least
    assert least > peak * 0.05 and "under none of auto's plans" in str(info.value)
    from vmem.policies.auto import LEANEST

    lean = f"{LEANEST},split=on"  # auto's leanest plan fits in what the refusal names, not less
    assert vmem.plan(net, 128, SIM, lean, memory=least).fits
    assert not vmem.plan(net, 128, SIM, lean, memory=least - 256).fits


def test_auto_is_the_default_wherever_a_budget_is_given():
    import argparse

    from vmem.cli.options import policy_spec

    assert policy_spec(argparse.Namespace(policy=None, memory="64MiB", algos=None)) == "auto"
    assert policy_spec(argparse.Namespace(policy=None, memory=None, algos="memory")) == "baseline:algos=memory"
    assert policy_spec(argparse.Namespace(policy="echo", memory="64MiB", algos=None)) == "echo"
    with vmem.Trainer(vmem.models.get("digits_cnn")) as t:
        assert t.policy.name == "baseline" and not t.profiling
    with vmem.Trainer(vmem.models.get("digits_cnn"), memory="64MiB") as t:
        assert t.policy.name == "auto" and t.profiling  # auto decides by measured time


def _small_net():
    from vmem import nn

    return vmem.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(4),
        nn.Flatten(),
        nn.Linear(16 * 8 * 8, 10),
        input_shape=(3, 32, 32),
    )


def test_on_a_small_graph_auto_equals_an_exhaustive_search_over_every_buffers_choices(monkeypatch):
    """Five stashed buffers, each kept, offloaded (raw or through zvc), encoded (ssdc, binarize) or
    recomputed, fastest algorithms: every combination lowered and replayed here, by the planner's oracle
    (what auto weighs its candidates by: the blocks placed as tightly as the budget needs; the planner's
    final figures place them as tightly as they can, which may time a plan's waits a little otherwise)."""
    import dataclasses
    import itertools

    from vmem.costs import Roofline, with_cudnn_catalog
    from vmem.graph.analysis import nonnegative_sparse, prefetch_points
    from vmem.planning import Oracle, Target
    from vmem.policies.auto.estimates import _Info
    from vmem.graph.analysis import needs_grad
    from vmem.graph.backward import backward_uses, decisions

    net, batch = _small_net(), 256
    memory = int(
        vmem.plan(net, batch, SIM, "layerwise:algos=memory", memory="1TiB", oversubscribe=True).peak_bytes * 0.8
    )
    auto = vmem.plan(net, batch, SIM, "auto", memory=memory)
    spec = dataclasses.replace(Target.of(SIM).spec, memory=memory)
    program = with_cudnn_catalog(net.build(batch), spec.arch)
    costs = Roofline(spec)
    # every convolution's backward split, as auto's plans have it
    base = vmem.policies.get("layerwise:algos=performance,split=on").decide(program, spec, costs)
    options = {}
    for b in sorted(program.stashed_buffers()):
        name = program.tensors[b].name
        ways = [("keep", None), ("offload", None)]
        if nonnegative_sparse(program, b):
            ways += [("offload", "zvc"), ("encode", "binarize" if program.sign_only(b) else "ssdc")]
        if b in program.buffer_writers:
            ways.append(("recompute", None))
        options[name] = ways
    assert len(options) == 5
    oracle = Oracle(program, spec, costs=costs)
    info = _Info(program, costs, base)  # each offload also tried held until its copy ends (Plan.release)
    best, tried = None, 0
    for combo in itertools.product(*options.values()):
        stash = {n: d for n, (d, _) in zip(options, combo)}
        codecs = {n: c for n, (_, c) in zip(options, combo) if c is not None}
        offloaded = {
            program.tensors[b].buffer
            for b in range(len(program.tensors))
            if stash.get(program.tensors[b].name) == "offload"
        }
        tried += 1
        try:  # a rebuild that reads a binarized buffer cannot be carried out
            walk = backward_uses(program, decisions(program, stash), needs_grad(program))
        except PlanError:
            continue
        reads = {u.op: [s for r in u.rebuilds for s in r.sources] + list(u.reads) for u in walk}
        plan = dataclasses.replace(
            base,
            stash=stash,
            codecs=codecs,
            sync="event" if offloaded else None,
            prefetch=prefetch_points(program, offloaded, reads=reads) if offloaded else {},
        )
        for variant in (plan, info.held(plan)) if offloaded else (plan,):
            result = oracle(variant)
            if result.fits and (best is None or result.step_seconds < best):
                best = result.step_seconds
    assert tried == 2 * 5**3 * 3 and best is not None  # the input: kept or offloaded; the max-pool: not sparse
    weighed = oracle(dataclasses.replace(auto.plan, policy="auto"))
    assert auto.fits and weighed.step_seconds == pytest.approx(best, rel=1e-12)
    assert auto.plan.chosen == EXHAUSTIVE
    monkeypatch.setattr(Auto, "EXHAUSTIVE", 0)  # the descent alone comes within 1% (here: binarize conv3,
    again = vmem.plan(net, batch, SIM, "auto", memory=memory).plan  # the best plan that holds no offload)
    assert best <= oracle(dataclasses.replace(again, policy="auto")).step_seconds <= best * 1.01


def test_the_integer_program_adds_descents_and_says_how_they_compare(resnet):
    """solver=ilp: descents whose rounds HiGHS solves (each the least estimated seconds that save the
    excess), beside the greedy ones; the reason gives both descents' best times."""
    pytest.importorskip("scipy")
    net, peak = resnet
    memory = int(peak * 0.6)
    fast = vmem.plan(net, 128, SIM, AUTO, memory=memory)
    ilp = vmem.plan(net, 128, SIM, f"{AUTO},solver=ilp,time_limit=5", memory=memory)
    assert ilp.fits and ilp.plan.policy == "auto:trials=24,solver=ilp,time_limit=5"
    assert abs(ilp.step_seconds / fast.step_seconds - 1) <= 0.05  # each improved from its own fastest start
    found = re.search(r"the fastest such descent ([\d.]+) ms, the greedy one ([\d.]+) ms", ilp.reason)
    assert found and "solved by HiGHS (the largest gap" in ilp.reason, ilp.reason
    assert abs(float(found[1]) / float(found[2]) - 1) <= 0.05  # they agree here


def test_auto_names_a_bad_solver_or_time_limit():
    with pytest.raises(ValueError, match="solver='cplex'"):
        vmem.policies.get("auto:solver=cplex")
    with pytest.raises(ValueError, match="time_limit=0"):
        vmem.policies.get("auto:time_limit=0")
    assert vmem.policies.get("auto:solver=ilp").spec == "auto:solver=ilp"


def test_auto_offloads_through_a_codec_only_where_that_can_save_time():
    """A GPU's codec runs beside its copy engine; on the CPU device the link is a memory copy on the cores
    the ops use, so compressing before it only costs them (measured: zvc runs at a third of a copy)."""
    from vmem.costs import Profiled
    from vmem.costs.roofline import Roofline

    gpu = Roofline(vmem.device("sim:v100-16gb").spec)
    cpu = Profiled({}, 10.0, 10.0)
    assert any("codec=" in s for s in Auto().portfolio(gpu))
    assert not any("codec=" in s and s.startswith("vdnn") for s in Auto().portfolio(cpu))
    assert any(s.startswith("gist") for s in vmem.policies.get("auto:lossy=fp8").portfolio(cpu))  # encodings stay
    net = vmem.models.get("digits_vgg")
    need = vmem.plan(net, 32, "cpu", "baseline").peak_bytes
    with vmem.Trainer(net, memory=need // 2, policy="auto", seed=0) as trainer:
        plan = trainer.plan(32)
    assert all(plan.plan.stash.get(n) is not Stash.OFFLOAD for n in plan.plan.codecs)


def test_a_budget_above_a_simulated_cards_memory_is_refused_unless_oversubscribed():
    """As ``vmem plan --memory`` refuses it: 1 TB on a 12 GiB Titan X was planned, and said to fit."""
    net = vmem.models.get("vgg16")
    with pytest.raises(ValueError, match=r"memory='1TB' is more than titan-x's 12.00 GiB.*oversubscribe=True"):
        vmem.plan(net, 8, "sim:titan-x", memory="1TB")
    assert vmem.plan(net, 8, "sim:titan-x", memory="1TB", oversubscribe=True).fits


@pytest.mark.parametrize("fraction", [0.6, 0.35])
def test_auto_offload_off_keeps_encodes_and_recomputes_only(resnet, fraction):
    """``offload=off``: nothing is sent to the host, it still fits where a keep/encode/recompute plan does,
    and it is never slower there than the named policies that send nothing (gist, echo, mirror, chen)."""
    net, peak = resnet
    memory = int(peak * fraction)
    plan = vmem.plan(net, 128, SIM, f"{AUTO},offload=off", memory=memory)
    assert plan.fits and plan.policy == "auto:offload=off,trials=24"
    assert Stash.OFFLOAD not in plan.stash.values() and not plan.prefetch
    assert not plan.chosen.startswith("vdnn")
    named = [vmem.plan(net, 128, SIM, s, memory=memory) for s in NAMED if not s.startswith("vdnn")]
    assert all(plan.step_seconds <= r.step_seconds * (1 + 1e-9) for r in named if r.fits)


def test_auto_offload_off_is_refused_with_the_least_memory_of_its_own_plans(resnet):
    net, peak = resnet
    with pytest.raises(BudgetTooSmall, match=r"that send nothing to the host \(offload=off\)") as info:
        vmem.plan(net, 128, SIM, f"{AUTO},offload=off,microbatch=off", memory=int(peak * 0.05))
    lean = re.search(r"the leanest \((\S+): nothing offloaded\)", str(info.value))[1]
    assert vmem.plan(net, 128, SIM, f"{lean},split=on", memory=info.value.least).fits
    with pytest.raises(ValueError, match="offload='sometimes'"):
        vmem.policies.get("auto:offload=sometimes")
    assert vmem.policies.get("auto:offload=off").spec == "auto:offload=off"

"""Policies are frozen, validated and named by spec strings; plans are plain data."""

from __future__ import annotations

import dataclasses
import json

import pytest

import vmem
from vmem import policies


def test_spec_strings():
    p = policies.get("baseline:algos=performance")
    assert p.algos == "performance" and p.spec == "baseline:algos=performance"
    assert policies.get(p.spec) == p
    assert policies.get(p, algos="memory").algos == "memory"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.algos = "memory"
    assert "baseline" in policies.names()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("baseline:algos=fast", "algos='fast'"),
        ("baseline:speed=1", "no option 'speed'"),
        ("baseline:algos", "must be key=value"),
        ("", "expected a policy name"),
        ("magic", "unknown policy 'magic'"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        policies.get(spec)


def test_memory_and_performance_algorithms():
    net = vmem.models.get("vgg_cifar")
    mem = vmem.plan(net, 32, policy="baseline:algos=memory", memory="2GiB")
    perf = vmem.plan(net, 32, policy="baseline:algos=performance", memory="2GiB")
    assert set(mem.algos["conv2"].values()) == {"implicit"}
    assert set(perf.algos["conv2"].values()) == {"winograd"}  # the catalog's first, without a profile
    assert set(perf.algos["conv1"].values()) == {"im2col"}  # 3 input channels: no winograd offered
    assert mem.by_category["workspace"]["peak"] < perf.by_category["workspace"]["peak"]
    assert mem.peak_bytes < perf.peak_bytes
    assert mem.by_category["feature_maps"] == perf.by_category["feature_maps"]


def test_by_default_the_fastest_algorithms_with_which_the_plan_fits():
    """``algos=fit`` (every policy's default): the fastest where they fit; a budget between the leanest and
    the fastest plan's peaks takes the fastest for what fits and downgrades the rest, each replayed; the
    leanest where nothing fits (the plan is then reported as not fitting)."""
    net = vmem.models.get("vgg_cifar")
    mem = vmem.plan(net, 32, policy="layerwise:algos=memory", memory="2GiB")
    perf = vmem.plan(net, 32, policy="layerwise:algos=performance", memory="2GiB")
    assert vmem.policies.get("layerwise").algos == "fit"
    roomy = vmem.plan(net, 32, policy="layerwise", memory="2GiB")
    assert roomy.algos == perf.algos
    between = (mem.peak_bytes + perf.peak_bytes) // 2
    tight = vmem.plan(net, 32, policy="layerwise", memory=between)
    assert tight.fits and tight.peak_bytes <= between
    assert tight.algos != perf.algos and tight.algos != mem.algos  # some passes downgraded, not all
    assert "leaner algorithms to fit" in tight.plan.reason
    short = vmem.plan(net, 32, policy="layerwise", memory=mem.peak_bytes // 2)
    assert not short.fits and short.algos == mem.algos


def test_a_plan_is_plain_data_and_gives_figures_even_when_it_does_not_fit():
    net = vmem.models.get("vgg16")
    plan = vmem.plan(net, batch=256, device="cpu", memory="12GB")
    assert not plan.fits and plan.peak_bytes > 12e9
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["peak_bytes"] == plan.peak_bytes
    assert "DOES NOT FIT" in plan.table()
    assert plan.average_bytes == pytest.approx(plan.peak_bytes)


def test_decisions_are_enums_that_read_as_their_values():
    from vmem.policies import Allocation, Stash

    net = vmem.models.get("vgg_cifar", image_size=16)
    plan = vmem.plan(net, 8, policy="vdnn-all")
    assert plan.allocation is Allocation.LAYER and set(plan.stash.values()) <= set(Stash)
    assert Stash.OFFLOAD in plan.stash.values() and "offload" in plan.stash.values()
    assert plan.to_dict()["stash"] and all(type(v) is str for v in plan.to_dict()["stash"].values())
    assert f"{Stash.RECOMPUTE}" == "recompute"


def test_an_unknown_decision_is_refused_naming_the_buffer():
    from vmem.errors import PlanError
    from vmem.policies import Plan

    with pytest.raises(PlanError, match="buffer 'conv1': stash decision 'swap'"):
        Plan(policy="mine", network="n", batch=1, device="cpu", capacity=1, allocation="layer", stash={"conv1": "swap"})
    with pytest.raises(PlanError, match="allocation 'global'"):
        Plan(policy="mine", network="n", batch=1, device="cpu", capacity=1, allocation="global")

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

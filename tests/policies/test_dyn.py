"""vdnn-dyn: each of its five steps, forced with chosen budgets on a simulated Titan X."""

from __future__ import annotations

import pytest

import vmem
from vmem.errors import PlanError

GB = 10**9


def least(policy: str) -> int:
    """The smallest budget, to the pool's alignment, at which a static policy's plan fits (bisected from its
    peak, as vdnn-dyn's refusal does)."""
    from vmem.policies.budget import least_memory

    net = vmem.models.get("vgg16")
    peak = vmem.plan(net, 128, "sim:titan-x", policy, memory="1000GB", oversubscribe=True).peak_bytes
    return least_memory(lambda memory: vmem.plan(net, 128, "sim:titan-x", policy, memory=memory).fits, peak)


@pytest.fixture(scope="module")
def peaks():
    return {
        p: least(p)
        for p in (
            "layerwise:algos=performance",
            "vdnn-conv:algos=performance",
            "vdnn-all:algos=performance",
            "vdnn-all:algos=memory",
        )
    }


def dyn(memory, policy="vdnn-dyn:sync=layer,keep=none"):
    """vDNN's procedure as the paper runs it (the default, sync=auto, may then release on events, and
    keep=auto may then keep some offloaded buffers on the device)."""
    return vmem.plan(vmem.models.get("vgg16"), 128, "sim:titan-x", policy, memory=memory)


def test_step_2_layer_wise_allocation_without_offload_when_it_fits(peaks):
    """vDNN's second step is its own layer-wise allocator with nothing offloaded (not the network-wide
    baseline): it saves memory even where nothing is offloaded, at the oracle's speed."""
    plan = dyn(peaks["layerwise:algos=performance"])
    assert (plan.step, plan.chosen) == (2, "layerwise:algos=performance")
    assert plan.fits and plan.step_seconds == pytest.approx(plan.baseline_step_seconds)
    baseline = vmem.plan(
        vmem.models.get("vgg16"), 128, "sim:titan-x", "baseline:algos=performance", memory="1000GB", oversubscribe=True
    )
    assert plan.peak_bytes < baseline.peak_bytes


def test_step_3_vdnn_conv_then_vdnn_all_with_the_fastest_algorithms(peaks):
    plan = dyn(peaks["vdnn-conv:algos=performance"])
    assert (plan.step, plan.chosen) == (3, "vdnn-conv:algos=performance,sync=layer")
    assert peaks["vdnn-all:algos=performance"] < peaks["vdnn-conv:algos=performance"]
    plan = dyn(peaks["vdnn-all:algos=performance"])
    assert (plan.step, plan.chosen) == (3, "vdnn-all:algos=performance,sync=layer")
    assert "without offloading does not" in plan.reason


def test_step_4_downgrades_algorithms_only_as_far_as_needed(peaks):
    budget = (peaks["vdnn-all:algos=performance"] + peaks["vdnn-all:algos=memory"]) // 2
    plan = dyn(budget)
    assert plan.step == 4 and plan.fits and plan.peak_bytes <= budget
    fastest = dyn(peaks["vdnn-all:algos=performance"])
    memory_optimal = vmem.plan(vmem.models.get("vgg16"), 128, "sim:titan-x", "vdnn-all:algos=memory", memory=budget)
    assert memory_optimal.step_seconds > plan.step_seconds >= fastest.step_seconds
    assert "less workspace" in plan.reason


def test_step_5_memory_optimal_when_the_search_finds_nothing(peaks):
    plan = dyn(peaks["vdnn-all:algos=memory"], policy="vdnn-dyn:sync=layer,max_trials=0,keep=none")
    assert (plan.step, plan.chosen) == (5, "vdnn-all:algos=memory,sync=layer")


@pytest.mark.parametrize("key", ["vdnn-conv:algos=performance", "vdnn-all:algos=performance"])
def test_auto_sync_takes_event_release_only_where_it_fits_and_is_faster(peaks, key):
    layer = dyn(peaks[key])
    auto = dyn(peaks[key], policy="vdnn-dyn:keep=none")
    assert auto.fits and auto.step == layer.step and auto.step_seconds <= layer.step_seconds
    if auto.chosen.endswith("sync=event"):
        assert auto.step_seconds < layer.step_seconds and "sync=event" in auto.reason
        assert auto.chosen == layer.chosen.replace("sync=layer", "sync=event")
    else:
        assert auto.chosen == layer.chosen
    with pytest.raises(ValueError, match="sync='often'.*auto, layer, event"):
        vmem.policies.get("vdnn-dyn:sync=often")


def test_keep_auto_keeps_offloaded_buffers_on_the_device_only_where_it_fits_and_is_faster():
    """VGG-16 at 256 in a Titan X: vdnn-all's copies of the first layers' maps outrun their compute; keeping
    some buffers on the device (room the peak elsewhere leaves) shortens the backlog that stalls compute."""
    net = vmem.models.get("vgg16")
    none = vmem.plan(net, 256, "sim:titan-x", "vdnn-dyn:keep=none")
    auto = vmem.plan(net, 256, "sim:titan-x", "vdnn-dyn")
    assert auto.policy == "vdnn-dyn:sync=auto" and none.policy == "vdnn-dyn:sync=auto,keep=none"
    assert auto.fits and auto.peak_bytes <= 12 * 2**30 and auto.step == none.step
    assert auto.step_seconds < none.step_seconds and auto.stall_seconds < none.stall_seconds
    kept = [b for b, how in auto.stash.items() if how == "keep" and none.stash[b] == "offload"]
    assert kept and "keeping" in auto.reason and all(b in auto.reason for b in kept)
    assert not any(b in names for names in auto.prefetch.values() for b in kept)  # nothing to bring back
    assert auto.offloaded_bytes < none.offloaded_bytes
    assert {b for b, how in auto.stash.items() if how == "offload"} | set(kept) == {
        b for b, how in none.stash.items() if how == "offload"
    }


def test_keep_is_checked_and_a_plan_without_offloads_is_left_alone(peaks):
    with pytest.raises(ValueError, match="keep='some'.*auto .* or none"):
        vmem.policies.get("vdnn-dyn:keep=some")
    plan = dyn(peaks["layerwise:algos=performance"], policy="vdnn-dyn")
    assert plan.step == 2 and "keeping" not in plan.reason


def test_step_1_below_the_minimum_is_a_plan_error_stating_it(peaks):
    with pytest.raises(PlanError, match=f"needs at least .*\\({peaks['vdnn-all:algos=memory']} bytes\\)"):
        dyn(peaks["vdnn-all:algos=memory"] - (256 << 20))


def test_a_budget_below_the_minimum_fails_before_training():
    net = vmem.models.get("vgg_cifar")
    import numpy as np

    with vmem.Trainer(net, memory="40MiB", policy="vdnn-dyn", seed=0) as trainer:
        with pytest.raises(PlanError, match="needs at least"):
            trainer.step(np.zeros((64, 3, 32, 32), np.float32), np.zeros(64, int))
        assert trainer.steps_done == 0


def test_least_memory_with_a_tolerance_stops_within_it_and_always_fits():
    from vmem.policies.budget import least_memory

    true = 1_000_000_000 + 12_345  # fits at and above this
    calls = []

    def fits(memory):
        calls.append(memory)
        return memory >= true

    exact = least_memory(fits, peak=900_000_000, alignment=256)
    exact_calls = len(calls)
    calls.clear()
    rough = least_memory(fits, peak=900_000_000, alignment=256, tolerance=1e-3)
    assert exact == -(-true // 256) * 256
    assert exact <= rough <= exact + 1e-3 * 900_000_000 + 256 and fits(rough)
    assert len(calls) < exact_calls - 5
